import json

from click.testing import CliRunner

import sim
from knowledge.cli import main


def simnet(home, *args):
    return CliRunner().invoke(main, ["--home", str(home), *args])


def test_create_advance_fork_replay_and_status(tmp_path, region, world_entities):
    (tmp_path / "region.xml").write_text(region)
    (tmp_path / "walker.xml").write_text(world_entities[0].mjcf)
    (tmp_path / "crate.xml").write_text(world_entities[1].mjcf)
    home = tmp_path / "site"
    made = simnet(
        home,
        "world",
        "create",
        "cell",
        "--shard",
        f"west={tmp_path / 'region.xml'}",
        "--shard",
        f"east={tmp_path / 'region.xml'}",
        "--entity",
        f"walker1={tmp_path / 'walker.xml'}@west",
        "--entity",
        f"crate={tmp_path / 'crate.xml'}@east:0,1,0",
        "--checkpoint-every",
        "100",
    )
    assert made.exit_code == 0, made.output
    assert (home / "worlds" / "cell.db").exists() and "shards east, west" in made.output
    advanced = simnet(home, "world", "advance", "cell", "250", "--backend", "process")
    assert advanced.exit_code == 0 and "west at tick 250" in advanced.output
    fork = simnet(
        home, "world", "fork", "cell", "west", "--at", "120", "--label", "before the slip"
    )
    assert fork.exit_code == 0
    status = json.loads(simnet(home, "world", "status", "cell", "--json").output)
    assert status["shards"]["west"]["tick"] == 250 and status["shards"]["west"]["checkpoints"] == 3
    assert status["shards"]["east"]["entities"] == ["crate"]
    assert status["branches"] == [
        {
            "id": fork.output.strip(),
            "shard": "west",
            "base_tick": 120,
            "head": 120,
            "label": "before the slip",
        }
    ]
    human = simnet(home, "world", "status", "cell")
    assert "tick       250" in human.output and "before the slip" in human.output
    replay = simnet(home, "world", "replay", "cell", "west", "0", "250", "--json")
    assert replay.exit_code == 0 and json.loads(replay.output)["checked"] == [100, 200]
    with sim.World.open(home / "worlds" / "cell.db", backend="inline") as world:
        assert json.loads(replay.output)["state_sha256"] == world.snapshot("west").state_sha256
    assert simnet(home, "world", "status").output.strip() == "cell"
    refused = simnet(home, "world", "prune", "cell", "--before", "210")
    assert refused.exit_code == 1 and "fork before tick 200" in refused.output
    assert simnet(home, "world", "drop", "cell", fork.output.strip()).exit_code == 0
    pruned = simnet(home, "world", "prune", "cell", "--before", "210", "--shard", "west")
    assert pruned.exit_code == 0 and pruned.output.strip() == "west: history from tick 200"
    status = json.loads(simnet(home, "world", "status", "cell", "--json").output)
    assert status["branches"] == [] and status["shards"]["west"]["history_from"] == 200
    assert (
        status["shards"]["east"]["history_from"] == 0
        and status["shards"]["west"]["checkpoints"] == 1
    )


def test_bad_input_is_reported_not_raised(tmp_path, region):
    home = tmp_path / "site"
    assert "no world 'nowhere'" in simnet(home, "world", "status", "nowhere").output
    (tmp_path / "region.xml").write_text(region)
    bad = simnet(
        home,
        "world",
        "create",
        "w",
        "--shard",
        f"west={tmp_path / 'region.xml'}",
        "--entity",
        "walker1=missing.xml@west",
    )
    assert bad.exit_code == 2 and "NAME=FILE@SHARD" in bad.output
    simnet(home, "world", "create", "w", "--shard", f"west={tmp_path / 'region.xml'}")
    beyond = simnet(home, "world", "replay", "w", "west", "0", "10")
    assert beyond.exit_code == 1 and "cannot replay 0..10" in beyond.output
    again = simnet(home, "world", "create", "w", "--shard", f"west={tmp_path / 'region.xml'}")
    assert again.exit_code == 1 and "already exists" in again.output


def test_bad_names_scene_files_and_labels_are_bad_parameters(tmp_path, region):
    home = tmp_path / "site"
    (tmp_path / "region.xml").write_text(region)
    for args in (
        ("status", "../evil"),
        ("advance", "a b", "10"),
        ("create", "../evil", "--shard", f"west={tmp_path / 'region.xml'}"),
    ):
        bad = simnet(home, "world", *args)
        assert bad.exit_code == 2 and "Invalid value for NAME: world name" in bad.output, bad.output
    assert not (home / "worlds").exists()
    (tmp_path / "latin1.xml").write_bytes(region.replace("region", "r\u00e9gion").encode("latin-1"))
    bad = simnet(home, "world", "create", "w", "--shard", f"west={tmp_path / 'latin1.xml'}")
    assert (
        bad.exit_code == 2 and "--shard" in bad.output and "can't decode byte 0xe9" in bad.output
    ), bad.output
    assert not (home / "worlds").exists()
    assert (
        simnet(home, "world", "create", "w", "--shard", f"west={tmp_path / 'region.xml'}").exit_code
        == 0
    )
    bad = simnet(
        home, "world", "fork", "w", "west", "--at", "0", "--label", "caf\udcff"
    )  # how $'caf\xff' arrives
    assert bad.exit_code == 2 and "--label" in bad.output and "is not UTF-8 text" in bad.output, (
        bad.output
    )
    assert json.loads(simnet(home, "world", "status", "w", "--json").output)["branches"] == []


def test_evaluate_with_the_ray_backend(ray_session, tmp_path):
    result = simnet(
        tmp_path,
        "evaluate",
        "walker_forward_good",
        "--task",
        "walker_forward",
        "--branches",
        "8",
        "--workers",
        "2",
        "--backend",
        "ray",
        "--json",
    )
    assert result.exit_code == 0, result.output
    local = simnet(
        tmp_path,
        "evaluate",
        "walker_forward_good",
        "--task",
        "walker_forward",
        "--branches",
        "8",
        "--json",
    )
    assert json.loads(result.output)["outcomes"] == json.loads(local.output)["outcomes"]


def test_a_world_whose_folder_cannot_be_made_is_one_line(tmp_path, region):
    (tmp_path / "region.xml").write_text(region)
    (tmp_path / "a-file").write_text("not a folder")
    home = tmp_path / "a-file" / "site"
    made = simnet(home, "world", "create", "cell", "--shard", f"west={tmp_path / 'region.xml'}")
    assert (made.exit_code, made.output) == (
        1,
        f"Error: cannot create the folder {home / 'worlds'} for world 'cell': Not a directory\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "region.xml"]


BOMB = '<asset><hfield name="bomb" nrow="20000" ncol="20000" size="1 1 1 0.1"/></asset>'


def test_a_scene_or_entity_over_the_scene_budget_is_refused_with_nothing_created(
    tmp_path, region, world_entities
):
    """A 20,000 x 20,000 heightfield (3 GiB) in a shard's scene or an entity's file is compiled
    first in a child process under the budget, as a task's scene is: refused, naming the file's
    role and the budget, and no world is made."""
    (tmp_path / "region.xml").write_text(region)
    (tmp_path / "huge.xml").write_text(region.replace("<worldbody>", BOMB + "<worldbody>", 1))
    crate = world_entities[1].mjcf
    (tmp_path / "crate.xml").write_text(crate)
    (tmp_path / "huge_crate.xml").write_text(crate.replace("<worldbody>", BOMB + "<worldbody>", 1))
    home = tmp_path / "site"
    for shard, entity, role in (
        ("huge.xml", "crate.xml", "shard west: its scene"),
        ("region.xml", "huge_crate.xml", "entity crate: its model"),
    ):
        made = simnet(
            home, "world", "create", "cell", "--shard", f"west={tmp_path / shard}",
            "--entity", f"crate={tmp_path / entity}@west", "--max-scene-mb", "512",
        )  # fmt: skip
        assert made.exit_code == 1, made.output
        assert role in made.output and "512 MiB" in made.output, made.output
        assert not (home / "worlds" / "cell.db").exists()
    fits = simnet(home, "world", "create", "cell", "--shard", f"west={tmp_path / 'region.xml'}")
    assert fits.exit_code == 0, fits.output

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

import knowledge
import sim
from knowledge import SiteHome
from knowledge.cli import main
from sim import EntryPointRef, load_skill, load_task
from sim.cli import evaluate_command, reproduce_command


def test_evaluate_prints_a_summary_and_writes_the_record(tmp_path):
    runner = CliRunner()
    record = tmp_path / "record.json"
    result = runner.invoke(
        evaluate_command,
        [
            "walker_forward_degraded",
            "--task",
            "walker_forward",
            "--branches",
            "16",
            "--seed",
            "3",
            "--record",
            str(record),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("walker_forward: ") and "/16 succeeded" in result.output
    data = json.loads(record.read_text())
    assert data["layout"]["branches"] == 16 and data["sampler"]["seed"] == 3
    assert data["policy"]["skill_hash"] == load_skill("walker_forward_degraded").hash
    again = runner.invoke(reproduce_command, [str(record), "walker_forward_degraded", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["exact"] is True
    other = runner.invoke(reproduce_command, [str(record), "walker_forward_good"])
    assert other.exit_code != 0  # the record names another skill


def test_evaluate_with_sprt_and_json(tmp_path):
    task_file = tmp_path / "task.json"
    from sim import load_task

    task_file.write_text(json.dumps(load_task("arm_reach").replace(horizon=60).to_json()))
    result = CliRunner().invoke(
        evaluate_command,
        [
            "arm_reach_good",
            "--task",
            str(task_file),
            "--branches",
            "64",
            "--wave",
            "8",
            "--sprt",
            "0.5",
            "0.9",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["sequential"]["decision"] == "accept" and len(record["outcomes"]["branch"]) < 64


def test_certify_takes_the_validators_sampler(tmp_path):
    """A validator chooses the randomization: `certify --sampler` records what its file randomizes
    (a task file has no shipped sampler, so without one only the start state is randomized), and
    the certificate verifies by re-running with it."""
    home = tmp_path / "site"
    sampler = tmp_path / "gains.json"
    terms = [{"target": "actuator@joint/*/gain", "op": "scale", "dist": "uniform", "low": 0.8}]
    sampler.write_text(json.dumps({"terms": [{**terms[0], "high": 1.2}]}))

    def simnet(*args):
        return CliRunner().invoke(main, ["--home", str(home), *args])

    assert simnet("init", "--name", "site").exit_code == 0
    assert simnet("publish", "arm_reach_good", "--name", "good", "--task", "reach").exit_code == 0
    args = ("certify", "good", "--task", "arm_reach", "--branches", "8", "--json")
    certified = simnet(*args, "--sampler", str(sampler))
    assert certified.exit_code == 0, certified.output
    record = json.loads(certified.output)
    assert record["randomized"] == ["gain", "initial_state", "pose"]
    shipped = json.loads(simnet(*args).output)  # the task's shipped sampler: damping too
    assert "damping" in shipped["randomized"]
    verified = simnet("verify", record["certificate"], "--json")
    assert verified.exit_code == 0 and json.loads(verified.output)["verdict"] == "valid"


def test_unknown_names_are_usage_errors():
    result = CliRunner().invoke(evaluate_command, ["backflip", "--task", "arm_reach"])
    assert result.exit_code == 2 and "neither a shipped skill" in result.output


def test_publish_certify_and_verify_a_skill_by_its_name(tmp_path):
    """The site's simulator commands through the real entry point: a skill is named by its name or
    an id prefix; `verify` takes a certificate id prefix or a skill (all its certificates)."""
    home = tmp_path / "site"

    def simnet(*args):
        return CliRunner().invoke(main, ["--home", str(home), *args])

    assert simnet("init", "--name", "site").exit_code == 0
    published = simnet("publish", "arm_reach_good", "--name", "reach-good", "--task", "reach")
    assert published.exit_code == 0 and "published reach-good: " in published.output
    skill_id = published.output.split(": ")[1].strip()
    certified = simnet("certify", "reach-good", "--task", "arm_reach", "--branches", "16")
    assert certified.exit_code == 0, certified.output
    assert f"certified {skill_id[:16]}" in certified.output
    certificate = next(
        line.split()[1] for line in certified.output.splitlines() if line.startswith("certificate ")
    )
    by_id = simnet("verify", certificate[:10], "--json")
    assert by_id.exit_code == 0 and json.loads(by_id.output) == {
        "certificate": certificate,
        "valid": True,
        "verdict": "valid",
        "detail": "all branch outcomes match",
    }
    by_skill = simnet("verify", "reach-good")
    assert by_skill.exit_code == 0
    assert by_skill.output.startswith(f"{certificate[:16]} valid: ")
    typo = simnet("certify", "reach-godo", "--task", "arm_reach")
    assert typo.exit_code != 0 and "skills here: reach-good" in typo.output
    published_only = simnet(
        "publish",
        "arm_reach_degraded",
        "--name",
        "reach-bad",
        "--task",
        "x",
        "--for-task",
        "arm_reach",
    )
    assert published_only.exit_code == 0
    with knowledge.SiteHome(home).open_readonly() as kb:  # bound to the task, which travels too
        (bound,) = [s for s in kb.skills.list() if s.name == "reach-bad"]
        assert bound.tasks == (load_task("arm_reach").hash,) and bound.tasks[0] in kb.tasks
    uncertified = simnet("verify", "reach-bad")
    assert uncertified.exit_code != 0 and "no certificates" in uncertified.output


def test_publishing_a_skill_that_names_an_entry_point_is_a_usage_error(tmp_path, installed_policy):
    """Only MLP skills publish (their weights become a blob); an entry point's factory is code."""
    ref = EntryPointRef("stand_still", "fleetctl", "1.2.0")
    key = knowledge.Identity.generate()
    key.save(tmp_path / SiteHome.KEY_FILE)
    with knowledge.open(tmp_path / SiteHome.STORE_FILE, key) as kb:
        skill = kb.skills.publish("stand-still", "walk", policy=ref.to_json())
    result = CliRunner().invoke(
        main, ["--home", str(tmp_path), "publish", skill.id[:12], "--name", "x", "--task", "walk"]
    )
    assert result.exit_code == 2 and "only MLP skills" in result.output, result.output


def test_certify_with_a_probe_and_refine_then_publish_a_new_version(tmp_path):
    home = tmp_path / "site"

    def simnet(*args):
        return CliRunner().invoke(main, ["--home", str(home), *args])

    assert simnet("init", "--name", "site").exit_code == 0
    simnet(
        "publish",
        "arm_reach_degraded",
        "--name",
        "reach-bad",
        "--task",
        "reach",
        "--for-task",
        "arm_reach",
    )
    certified = simnet(
        "certify",
        "reach-bad",
        "--task",
        "arm_reach",
        "--branches",
        "16",
        "--probe-budget",
        "64",
        "--json",
    )
    assert certified.exit_code == 0, certified.output
    assert 0.0 <= json.loads(certified.output)["probe_failure_rate"] <= 1.0
    refined = simnet(
        "refine",
        "reach-bad",
        "--task",
        "arm_reach",
        "--episodes",
        "8",
        "--candidates",
        "8",
        "--publish",
        "reach-refined",
    )
    assert refined.exit_code == 0, refined.output
    assert "alone" in refined.output and "refined (8 episodes)" in refined.output
    with knowledge.SiteHome(home).open_readonly() as kb:
        (new,) = [s for s in kb.skills.list() if s.name == "reach-refined"]
        (old,) = [s for s in kb.skills.list() if s.name == "reach-bad"]
        assert new.parents == (old.id,) and new.tasks == old.tasks


def test_a_mesh_task_file_certifies_and_a_site_without_its_files_cannot_verify(
    tmp_path, mesh_robot
):
    """A task definition file whose scene loads meshes: `publish --for-task` and `certify --task`
    carry its files by hash; `verify` is valid where they are and exits 3, "cannot verify here",
    at a site that has the certificate and the weights but not the files."""
    robot = mesh_robot(tmp_path / "robot")
    task_file = tmp_path / "robot" / "still.json"
    task_file.write_text(json.dumps(_mesh_definition(robot.read_text())))
    skill_file = tmp_path / "still.json"
    _still(obs_dim=4, act_dim=2).save(skill_file)

    def simnet(home, *args):
        return CliRunner().invoke(main, ["--home", str(tmp_path / home), *args])

    assert simnet("site", "init", "--name", "site").exit_code == 0
    published = simnet(
        "site", "publish", str(skill_file), "--name", "still", "--task", "hold", "--for-task",
        str(task_file),
    )  # fmt: skip
    assert published.exit_code == 0, published.output
    certified = simnet("site", "certify", "still", "--task", str(task_file), "--branches", "8")
    assert certified.exit_code == 0, certified.output
    certificate = certified.output.split("certificate ")[1].split()[0]
    valid = simnet("site", "verify", certificate, "--json")
    assert valid.exit_code == 0 and json.loads(valid.output)["verdict"] == "valid", valid.output

    assert simnet("bare", "init", "--name", "bare").exit_code == 0
    site, bare = SiteHome(tmp_path / "site"), SiteHome(tmp_path / "bare")
    policy = knowledge.TrustPolicy.load(bare.path / "trust.toml")
    with site.open_readonly() as kb:
        key = kb.policy.device_of or knowledge.Identity.load(site.path / "site.key").public_key
        envelopes = kb.envelopes_since({}, limit=100_000)
        (skill,) = kb.skills.list()
        weights = kb.blobs.get(skill.policy["weights"])
        (task_hash,) = kb.tasks.list()
        assets = kb.tasks.assets(task_hash)
    (bare.path / "trust.toml").write_text(policy.with_root(key).to_toml())
    with bare.open_writer() as kb:
        kb.ingest(envelopes)
        kb.blobs.put(weights)
    unverified = simnet("bare", "verify", certificate)
    assert unverified.exit_code == 3, unverified.output
    name = sorted(assets)[0]
    assert unverified.output.startswith(
        f"{certificate[:16]} UNVERIFIED: cannot verify here: asset {name!r} ({assets[name]})"
    )
    with site.open_readonly() as kb:
        (cert,) = kb.certificates.for_skill(skill.id)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(cert.evaluation))
    rerun = simnet("site", "reproduce", str(record), str(skill_file))  # the site's store has them
    assert rerun.exit_code == 0 and rerun.output.startswith("reproduces"), rerun.output
    lacking = simnet("bare", "reproduce", str(record), str(skill_file))
    assert lacking.exit_code == 3 and f"cannot re-run here: asset {name!r}" in lacking.output


def test_certify_and_refine_check_a_task_file_under_the_sites_scene_budget(tmp_path):
    """`certify --task FILE` and `refine --task FILE` compile the file's scene first in a child
    process, with a wave of their simulations, under the site's max_scene_mb (validator.toml) or
    --max-scene-mb: at 4 MiB, eight simulations of the arm do not fit (they take over 24), and
    nothing is certified; the option raises it. They compiled any file in their own process."""
    home = tmp_path / "site"
    task_file = tmp_path / "reach.json"
    task_file.write_text(json.dumps(load_task("arm_reach").to_json()))

    def simnet(*args):
        return CliRunner().invoke(main, ["--home", str(home), *args])

    assert simnet("init", "--name", "site").exit_code == 0
    assert simnet("publish", "arm_reach_good", "--name", "good", "--task", "reach").exit_code == 0
    (home / "validator.toml").write_text("max_scene_mb = 4\n")
    limit = "does not fit in this site's budget of 4 MiB and 60 s (--max-scene-mb"
    certify = ("certify", "good", "--task", str(task_file), "--branches", "8")
    refused = simnet(*certify)
    assert refused.exit_code == 1, refused.output
    assert f"Error: task arm_reach: its scene with 8 simulations {limit}" in refused.output
    refine = simnet("refine", "good", "--task", str(task_file), "--episodes", "8")
    # refine holds its episodes and their candidates (32 each) at once
    assert refine.exit_code == 1 and "its scene with 264 simulations" in refine.output
    with knowledge.SiteHome(home).open_readonly() as kb:
        (skill,) = kb.skills.list()
        assert kb.certificates.for_skill(skill.id) == []
    certified = simnet(*certify, "--max-scene-mb", "1024")
    assert certified.exit_code == 0 and "certified " in certified.output, certified.output


def test_verify_and_reproduce_refuse_a_record_whose_layout_asks_too_much(tmp_path):
    """A re-run keeps a record's layout, which the record's writer chose: `layout.wave`
    simulations stepped at once (the scene was checked with min(wave, branches) of them, the
    batch made with all of them: a wave of 10^9 asked for hundreds of GB), and `layout.branches`
    branches (10^12 of them listed every wave's index before running one). Now a wave over this
    site's max(branches, 64) is "cannot verify here" (exit 3), and a record holding fewer outcomes
    than its branches with no sequential test that decided is inconsistent (exit 1)."""
    home = tmp_path / "site"
    good, task = load_skill("arm_reach_good"), load_task("arm_reach").replace(horizon=20)

    def simnet(*args):
        return CliRunner().invoke(main, ["--home", str(home), *args])

    assert simnet("init", "--name", "site").exit_code == 0
    with SiteHome(home).open_writer() as kb:
        skill = sim.publish_skill(kb, good, "good", "reach", tasks=[task])
        record = sim.evaluate(task, good, branches=16, progress=False).to_record()
        wide = {**record, "layout": {**record["layout"], "wave": 10**9}}
        long = {**record, "layout": {**record["layout"], "branches": 10**12}}
        certificates = {  # signed as a peer's validator would: its own claims, not checked
            name: kb.certificates.add(
                skill.id,
                branches=16,
                successes=record["summary"]["successes"],
                confidence=record["summary"]["confidence"],
                randomized=sim.randomized(record),
                evaluation=hostile,
            ).id
            for name, hostile in (("wide", wide), ("long", long))
        }
    for name, hostile in (("wide", wide), ("long", long)):
        (tmp_path / f"{name}.json").write_text(json.dumps(hostile))
    over = "its evaluation record's layout.wave asks for 1,000,000,000 simulations stepped at once"
    limit = "over this site's budget of 128 (its branches in validator.toml, or 64 if more)"

    verified = simnet("verify", certificates["wide"])
    assert verified.exit_code == 3, verified.output
    assert f"UNVERIFIED: cannot verify here: {over}, {limit}" in verified.output
    rerun = simnet("reproduce", str(tmp_path / "wide.json"), "arm_reach_good")
    assert rerun.exit_code == 3 and f"cannot re-run here: {over}, {limit}" in rerun.output

    inconsistent = "record field 'layout.branches': is 1,000,000,000,000, but the record holds 16"
    verified = simnet("verify", certificates["long"])
    assert verified.exit_code == 1, verified.output
    assert f"NOT VALID: the evaluation record is inconsistent: {inconsistent}" in verified.output
    rerun = simnet("reproduce", str(tmp_path / "long.json"), "arm_reach_good")
    assert rerun.exit_code == 1 and f"Error: {inconsistent}" in rerun.output, rerun.output

    (home / "validator.toml").write_text("branches = 1000\n")  # the limit follows branches
    assert "over this site's budget of 1,000 (" in simnet("verify", certificates["wide"]).output


def _still(obs_dim: int, act_dim: int):
    from sim import Policy

    return Policy.linear(np.zeros((act_dim, obs_dim)), np.zeros(act_dim), {"note": "motors off"})


def _mesh_definition(scene: str) -> dict:
    return {
        "format": "simnet.task/1",
        "name": "meshbot_still",
        "embodiment": "meshbot",
        "scene": scene,
        "keyframe": None,
        "init": [
            {"target": "joint/shoulder/qpos", "op": "add", "dist": "normal", "mean": 0, "std": 0.1}
        ],
        "observation": [
            {"term": "qpos", "joints": ["shoulder", "elbow"]},
            {"term": "qvel", "joints": ["shoulder", "elbow"]},
        ],
        "action": {"mode": "absolute"},
        "reward": [],
        "success": {"when": "end", "all": [{"term": "alive", "above": 0}]},
        "failure": [],
        "horizon": 5,
        "control_substeps": 2,
    }


def test_publish_for_a_urdf_body_with_the_urdf_readers_options(tmp_path):
    """`simnet publish --urdf` takes the URDF reader's flags: the scope is the body they read."""
    robots = Path(__file__).parents[1] / "assets" / "robots"
    home = tmp_path / "site"

    def simnet(*args):
        return CliRunner().invoke(main, ["--home", str(home), *args])

    assert simnet("init", "--name", "site").exit_code == 0
    dog, arm = str(robots / "quadruped12.urdf"), str(robots / "arm7.xml")
    common = ["arm_reach_good", "--task", "reach", "--mjcf", arm, "--urdf", dog]
    assert simnet("publish", *common, "--name", "floating").exit_code == 0
    fixed = simnet("publish", *common, "--name", "fixed", "--fixed-base", "--balance-inertia")
    assert fixed.exit_code == 0, fixed.output
    with knowledge.SiteHome(home).open_readonly() as kb:
        scopes = {
            s.name: [knowledge.Embodiment.from_dict(e) for e in s.embodiments]
            for s in kb.skills.list()
        }
    assert [b.floating_base for b in scopes["floating"]] == [False, True]
    assert [b.floating_base for b in scopes["fixed"]] == [False, False]
    misplaced = simnet(
        "publish", "arm_reach_good", "--name", "x", "--task", "reach", "--fixed-base"
    )
    assert misplaced.exit_code == 2 and "applies to a URDF file" in misplaced.output

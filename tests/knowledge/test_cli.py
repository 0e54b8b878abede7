"""The knowledge commands of `simnet` (skills list/show/query), run through click on a real
store."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import knowledge
from knowledge import SiteHome
from knowledge.cli import COMMANDS, ENCODER_COMMANDS, main

ROBOTS = Path(__file__).parents[1] / "assets" / "robots"


@pytest.fixture
def home(tmp_path):
    """A site directory with three skills for three bodies; one certified, one revoked."""
    with knowledge.open(tmp_path / SiteHome.STORE_FILE, knowledge.Identity.generate()) as kb:
        ids = {}
        for name in ("arm7.xml", "quadruped.xml", "humanoid_small.xml"):
            body = knowledge.Embodiment.from_mjcf(ROBOTS / name)
            ids[name] = kb.skills.publish(
                f"skill-{name}", "pick" if "arm" in name else "walk", embodiments=[body.to_dict()]
            ).id
        kb.certificates.add(ids["arm7.xml"], branches=128, successes=128)
        kb.revoke(ids["quadruped.xml"], "falls over")
    # typed-in certificates count only where the policy says so (sim.certify makes real ones)
    (tmp_path / SiteHome.POLICY_FILE).write_text("[activation]\nrerunnable_only = false\n")
    return tmp_path, ids


def run(home_dir: Path, *args: str):
    result = CliRunner().invoke(main, ["--home", str(home_dir), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_skills_list_human_and_json(home):
    path, ids = home
    rows = json.loads(run(path, "skills", "list", "--json"))
    assert {r["id"] for r in rows} == set(ids.values())
    states = {r["name"]: (r["active"], r["revoked"]) for r in rows}
    assert states["skill-arm7.xml"] == (True, False) and states["skill-quadruped.xml"] == (
        False,
        True,
    )
    assert [r["name"] for r in json.loads(run(path, "skills", "list", "--active", "--json"))] == [
        "skill-arm7.xml"
    ]
    assert "revoked" in run(path, "skills", "list", "--task", "walk")


def test_skills_show_by_prefix(home):
    path, ids = home
    data = json.loads(run(path, "skills", "show", ids["arm7.xml"][:10], "--json"))
    assert data["active"] is True and len(data["certificates"]) == 1
    result = CliRunner().invoke(main, ["--home", str(path), "skills", "show", ""])
    assert result.exit_code != 0 and "give more of the id" in result.output


def test_skills_query_ranks_the_same_body_first(home):
    path, ids = home
    rows = json.loads(
        run(path, "skills", "query", "--mjcf", str(ROBOTS / "arm7.xml"), "--all", "--json")
    )
    assert rows[0]["id"] == ids["arm7.xml"] and rows[0]["distance"] == pytest.approx(0.0, abs=1e-6)
    assert [r["distance"] for r in rows] == sorted(r["distance"] for r in rows)
    active = json.loads(run(path, "skills", "query", "--urdf", str(ROBOTS / "arm6.urdf"), "--json"))
    assert [r["id"] for r in active] == [
        ids["arm7.xml"]
    ]  # the revoked and uncertified ones never come back


def test_a_query_for_a_body_without_actuators_says_it_ranks_as_passive(home, tmp_path):
    """A file that declares no drives and gives no joint armature (which would say a geared motor
    is there) is a passive chain as read, nearest passive chains: the query says so, and why, in
    words only."""
    path, _ids = home
    chain = tmp_path / "chain.xml"
    chain.write_text(
        '<mujoco><worldbody><body name="a"><joint axis="0 0 1"/><geom size="0.05"/>'
        '<body name="b" pos="0 0 0.3"><joint axis="0 1 0"/><geom size="0.05"/></body>'
        "</body></worldbody></mujoco>"
    )
    human = run(path, "skills", "query", "--mjcf", str(chain), "--all")
    assert "no actuators" in human and "passive body" in human
    assert "no actuators" not in run(path, "skills", "query", "--mjcf", str(ROBOTS / "arm7.xml"))
    json.loads(run(path, "skills", "query", "--mjcf", str(chain), "--all", "--json"))


def test_skills_query_needs_exactly_one_model(home):
    path, _ids = home
    result = CliRunner().invoke(main, ["--home", str(path), "skills", "query"])
    assert result.exit_code != 0 and "exactly one of --mjcf or --urdf" in result.output


def test_missing_store_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "nowhere"), "skills", "list"])
    assert result.exit_code != 0 and "simnet init" in result.output


@pytest.mark.parametrize(
    "table, name",
    [(COMMANDS, name) for name in COMMANDS]
    + [(ENCODER_COMMANDS, name) for name in ENCODER_COMMANDS],
)
def test_every_command_in_the_table_loads_and_its_summary_is_its_own(table, name):
    """`simnet --help` prints the table's summaries: they must say what the commands themselves
    say."""
    group = main if table is COMMANDS else main.get_command(click.Context(main), "encoder")
    command = group.get_command(click.Context(group), name)
    assert isinstance(command, click.Command)
    assert command.get_short_help_str(1000) == table[name][1]


def test_help_imports_no_other_package():
    """Listing the commands costs no import of the simulator, the server or the heavy libraries."""
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom knowledge.cli import main\n"
        "result = CliRunner().invoke(main, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in ('sim', 'federation', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]"]
    assert "encoder" in CliRunner().invoke(main, ["--help"]).output


def test_an_unknown_command_says_which_exist():
    result = CliRunner().invoke(main, ["sycn"])
    assert result.exit_code == 2 and "No such command 'sycn'" in result.output


def test_a_typo_says_which_skills_exist(home):
    path, ids = home
    result = CliRunner().invoke(main, ["--home", str(path), "skills", "show", "zz"])
    assert result.exit_code == 1
    assert "0 skills match 'zz'; skills here:" in result.output
    assert f"skill-arm7.xml ({ids['arm7.xml'][:12]})" in result.output


def test_a_skill_is_found_by_its_name_too(home):
    path, ids = home
    shown = json.loads(run(path, "skills", "show", "skill-quadruped.xml", "--json"))
    assert shown["skill"]["id"] == ids["quadruped.xml"]


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"simnet, version {version('simnet-fleet')}\n"


# --- disks that refuse writes: one line, never a traceback ---------------------------------------


@pytest.fixture
def site(tmp_path):
    """A site's directory with its key and one skill."""
    home = SiteHome(tmp_path / "site")
    home.path.mkdir()
    identity = knowledge.Identity.generate()
    identity.save(home.key)
    with knowledge.open(home.store, identity) as kb:
        skill = kb.skills.publish("walk", "walk")
    return home, skill


@pytest.mark.parametrize("part", ["file", "folder"])
def test_a_read_only_site_is_listed_and_a_write_to_it_is_one_line(site, read_only, part):
    home, skill = site
    read_only(home.store if part == "file" else home.path)
    listed = CliRunner().invoke(main, ["--home", str(home.path), "skills", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [row["name"] for row in json.loads(listed.output)] == ["walk"]
    refused = CliRunner().invoke(main, ["--home", str(home.path), "revoke", skill.id])
    which = f"the file {home.store}" if part == "file" else f"its folder {home.path}"
    assert (refused.exit_code, refused.output) == (
        1,
        f"Error: cannot write the store {home.store}: {which} is read-only "
        "(it can still be opened read-only)\n",
    )


FULL_SITE = """
import os, subprocess, sys
from pathlib import Path
import knowledge
disk = Path(sys.argv[1])
home = knowledge.SiteHome(disk / "site")
home.path.mkdir()
identity = knowledge.Identity.generate()
identity.save(home.key)
with knowledge.open(home.store, identity) as kb:
    skill = kb.skills.publish("walk", "walk")
fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT)
try:
    while True:  # fill the disk
        os.write(fd, bytes(4096))
except OSError:
    os.close(fd)
simnet = [sys.executable, "-c", "from knowledge.cli import run; run()", "--home", str(home.path)]
for args in (["revoke", skill.id], ["skills", "list", "--json"]):
    done = subprocess.run(simnet + args, capture_output=True, text=True)
    print(repr((done.returncode, done.stdout, done.stderr)))
"""


def test_a_write_to_a_site_on_a_full_disk_is_one_line_and_reads_go_on(small_disk):
    done = small_disk(FULL_SITE)
    assert done.returncode == 0, done.stderr
    refused, listed = (ast.literal_eval(line) for line in done.stdout.splitlines())
    code, out, err = refused
    assert (code, out) == (1, "") and len(err.splitlines()) == 1, refused
    assert err.startswith("Error: cannot open the store ") and "the disk is full" in err
    assert "Free space on the disk and retry" in err
    code, out, err = listed
    assert code == 0 and [row["name"] for row in json.loads(out)] == ["walk"], listed


def test_a_file_the_system_refuses_is_one_line_naming_it(tmp_path, read_only):
    """Outside the store too (here `simnet init` in a read-only folder): no traceback."""
    read_only(tmp_path)
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "site"), "init", "--name", "s"])
    assert (result.exit_code, result.output) == (
        1,
        f"Error: {tmp_path / 'site'}: Permission denied\n",
    )


# -- the URDF reader's options ---------------------------------------------------------------------


@pytest.fixture
def urdf_site(tmp_path):
    """A site with skills for the 12-dof quadruped URDF as it floats and welded (fixed), for the
    mesh arm URDF, and for the arm whose inertias needed balancing."""
    urdf = knowledge.Embodiment.from_urdf
    bodies = {
        "dog-floating": urdf(ROBOTS / "quadruped12.urdf"),
        "dog-fixed": urdf(ROBOTS / "quadruped12.urdf", floating_base=False),
        "meshbot": urdf(ROBOTS / "meshbot_description" / "urdf" / "meshbot.urdf"),
        "balanced": urdf(ROBOTS / "unbalanced_inertia.urdf", balance_inertia=True),
    }
    with knowledge.open(tmp_path / SiteHome.STORE_FILE, knowledge.Identity.generate()) as kb:
        for name, body in bodies.items():
            kb.skills.publish(name, "walk", embodiments=[body.to_dict()])
    return tmp_path


def nearest(home_dir: Path, *args: str) -> tuple[str, float]:
    rows = json.loads(run(home_dir, "skills", "query", "--all", "--json", *args))
    return rows[0]["name"], rows[0]["distance"]


def test_floating_or_fixed_base_from_the_command_line(urdf_site):
    dog = str(ROBOTS / "quadruped12.urdf")
    assert nearest(urdf_site, "--urdf", dog) == ("dog-floating", pytest.approx(0.0, abs=1e-6))
    assert nearest(urdf_site, "--urdf", dog, "--floating-base")[0] == "dog-floating"
    assert nearest(urdf_site, "--urdf", dog, "--fixed-base") == (
        "dog-fixed",
        pytest.approx(0.0, abs=1e-6),
    )


def test_package_path_finds_a_moved_urdfs_meshes(urdf_site, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere" / "meshbot.urdf"
    moved.parent.mkdir()
    moved.write_text((ROBOTS / "meshbot_description" / "urdf" / "meshbot.urdf").read_text())
    monkeypatch.delenv("ROS_PACKAGE_PATH", raising=False)
    lost = CliRunner().invoke(
        main, ["--home", str(urdf_site), "skills", "query", "--urdf", str(moved)]
    )
    assert lost.exit_code == 1 and "no package 'meshbot_description'" in lost.output
    assert "Traceback" not in lost.output
    found = nearest(urdf_site, "--urdf", str(moved), "--package-path", str(ROBOTS))
    assert found == ("meshbot", pytest.approx(0.0, abs=1e-6))
    repeated = ["--package-path", str(tmp_path), "--package-path", str(ROBOTS)]
    assert nearest(urdf_site, "--urdf", str(moved), *repeated)[0] == "meshbot"


def test_balance_inertia_from_the_command_line(urdf_site):
    path = str(ROBOTS / "unbalanced_inertia.urdf")
    refused = CliRunner().invoke(
        main, ["--home", str(urdf_site), "skills", "query", "--urdf", path]
    )
    assert refused.exit_code == 1 and "--balance-inertia" in refused.output
    found = nearest(urdf_site, "--urdf", path, "--balance-inertia")
    assert found == ("balanced", pytest.approx(0.0, abs=1e-6))


def test_urdf_options_without_a_urdf_are_a_usage_error(urdf_site):
    result = CliRunner().invoke(
        main,
        [
            "--home",
            str(urdf_site),
            "skills",
            "query",
            "--mjcf",
            str(ROBOTS / "arm7.xml"),
            "--fixed-base",
            "--balance-inertia",
        ],
    )
    assert result.exit_code == 2
    assert "--floating-base/--fixed-base, --balance-inertia apply to a URDF file" in result.output


def test_a_query_from_the_command_line_reads_the_descriptor_cache(urdf_site):
    """Two `simnet skills query` runs with unchanged files: the second reads the site's cache."""
    dog = str(ROBOTS / "quadruped12.urdf")
    assert nearest(urdf_site, "--urdf", dog, "--fixed-base")[0] == "dog-fixed"
    (entry,) = Path(f"{urdf_site / SiteHome.STORE_FILE}.embodiments").glob("*.json")
    written = entry.stat()
    assert nearest(urdf_site, "--urdf", dog, "--fixed-base")[0] == "dog-fixed"
    again = entry.stat()  # a miss would have written the entry anew (a new file, renamed over)
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)

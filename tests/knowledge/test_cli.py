"""The knowledge commands of `simnet` (skills list/show/query), run through click on a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import knowledge
from knowledge.cli import STORE_FILE, main

ROBOTS = Path(__file__).parents[1] / "assets" / "robots"


@pytest.fixture
def home(tmp_path):
    """A site directory with three skills for three bodies; one certified, one revoked."""
    with knowledge.open(tmp_path / STORE_FILE, knowledge.Identity.generate()) as kb:
        ids = {}
        for name in ("arm7.xml", "quadruped.xml", "humanoid_small.xml"):
            body = knowledge.Embodiment.from_mjcf(ROBOTS / name)
            ids[name] = kb.skills.publish(
                f"skill-{name}", "pick" if "arm" in name else "walk", embodiments=[body.to_dict()]
            ).id
        kb.certificates.add(ids["arm7.xml"], branches=128, successes=128)
        kb.revoke(ids["quadruped.xml"], "falls over")
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


def test_skills_query_needs_exactly_one_model(home):
    path, _ids = home
    result = CliRunner().invoke(main, ["--home", str(path), "skills", "query"])
    assert result.exit_code != 0 and "exactly one of --mjcf or --urdf" in result.output


def test_missing_store_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "nowhere"), "skills", "list"])
    assert result.exit_code != 0 and "simnet init" in result.output

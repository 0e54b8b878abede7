"""Every program in examples/ runs to the end and prints what it claims, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_example(name: str, tmp_path: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    return result.stdout


def test_fleet_demo(tmp_path):
    """`python3 dev.py demo` runs this."""
    out = run_example("fleet_demo.py", tmp_path)
    assert "site-b's validator fetched the weights, evaluated 128 branches and certified it" in out
    assert "they reproduced (0 disputes)" in out
    assert "the skill is active at every site" in out
    assert "active=True; its weights fetched from site-c match: True" in out
    assert "the robot at site-c syncs: active there now: False" in out
    for site in ("site-a", "site-b", "site-c"):  # one certificate, made by the simulator
        assert f"{site}: skills 1, active 0, certificates 1, revocations 1" in out
    assert "certificates typed in by hand: 0" in out


def test_two_sites(tmp_path):
    out = run_example("two_sites.py", tmp_path)
    assert "active at site A before any certificate: False" in out
    assert "site B evaluated it on arm_reach: 64/64 branches succeeded" in out
    assert "active at site A now: True" in out
    assert "site A revoked it; active at A: False" in out
    assert "all three hold identical knowledge: True" in out


def test_query_by_embodiment(tmp_path):
    out = run_example("query_by_embodiment.py", tmp_path)
    assert "new robot: Embodiment('arm6'" in out
    every, active = out.split("every skill, nearest body first")[1].split("active reach skills")
    rows = {line.split()[2]: line for line in every.splitlines() if line[:2].strip().isdigit()}
    assert len(rows) == 8
    assert rows["reach-good"].endswith("active") and " 96 " in rows["reach-good"]
    assert rows["reach-degraded"].endswith("revoked")
    for uncertified in ("pick-mug-side-grasp", "trot-flat-ground", "dock-to-charger"):
        assert rows[uncertified].endswith("0 of 1 required validator sites certify it")
    found = [line.split()[2] for line in active.splitlines() if line[:2].strip().isdigit()]
    assert found == ["reach-good"]


def test_certify_and_activate(tmp_path):
    out = run_example("certify_and_activate.py", tmp_path)
    assert "reach-good       active=True" in out and "reach-degraded   active=False" in out
    assert "valid=True" in out


def test_world_twin(tmp_path):
    run_example("world_twin.py", tmp_path)

"""mypy (configured in pyproject.toml) passes over the packages, and a user's program against their
public API passes `mypy --strict`: `py.typed` ships, so what the annotations say is part of the API.

One mypy run checks both (the packages' own relaxations are per-module settings, so the user's file
gets all of --strict). Its cache is .cache/mypy: a cold run takes about a minute, a rerun seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
USER_CODE = Path("tests", "typecheck", "user_code.py")  # not collected: it only has to type-check


def test_packages_and_a_users_code_type_check():
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--cache-dir",
        str(ROOT / ".cache" / "mypy"),
    ]
    result = subprocess.run(
        [*command, "knowledge", "federation", "sim", str(USER_CODE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""mypy (configured in pyproject.toml) passes over the packages, and a user's program against their
public API passes `mypy --strict`: `py.typed` ships, so what the annotations say is part of the API.

The README's Python blocks, joined in order into one program, are checked the same way: a reader who
copies them into a typed project gets no errors. One mypy run checks all of it (the packages' own
relaxations are per-module settings, so the user's files get all of --strict). Its cache is
.cache/mypy: a cold run takes about a minute, a rerun seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
USER_CODE = Path("tests", "typecheck", "user_code.py")  # not collected: it only has to type-check


def test_packages_a_users_code_and_the_readme_type_check():
    readme = ROOT / ".cache" / "typecheck" / "readme_snippets.py"
    readme.parent.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "README.md").read_text()
    readme.write_text("\n".join(re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)))
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--cache-dir",
        str(ROOT / ".cache" / "mypy"),
    ]
    result = subprocess.run(
        [*command, "knowledge", "federation", "sim", str(USER_CODE), str(readme)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr

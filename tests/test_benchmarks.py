"""The benchmark scripts stay runnable: no test runs them whole (they measure, for minutes), so a
script that no longer imports, or whose inputs the library has come to refuse, would go unseen."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    """The script as a module (its own imports find its siblings, as when it runs); sys.path is
    restored after, whatever the script added to it."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            f"benchmark_{name}", BENCHMARKS / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("*.py")))
def test_every_benchmark_imports_and_has_a_main(name):
    assert callable(getattr(_load(name), "main", None))


def test_the_retrieval_benchmark_reads_every_test_robot():
    """It once stopped at a test URDF whose inertias MuJoCo refuses (read balanced, as the
    refusal says)."""
    retrieval = _load("retrieval")
    robots = retrieval.ROBOTS
    files = [p for p in robots.glob("*.xml") if "defaults" not in p.name] + list(
        robots.glob("*.urdf")
    )
    bodies = retrieval.bodies()
    assert len(bodies) == len(list(retrieval.GYM.glob("*.xml"))) + len(files)


def test_the_transfer_benchmark_prints_none_where_nothing_was_measured():
    """A quick run once held out no posture target with a skill that succeeds: its recall@5 was
    NaN, which json.dumps prints and strict JSON readers refuse."""
    transfer = _load("transfer")
    empty = transfer.EncoderReport("features 6", (), 5, 0.8)
    line = transfer.figures("", {"features": empty}, ("posture",))
    assert line == dict.fromkeys(
        [
            "spearman_features",
            "recall_at_5_features",
            "posture_spearman_features",
            "posture_recall_at_5_features",
        ]
    )

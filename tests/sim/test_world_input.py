"""What a world accepts: anything `mutate_event` lets through applies on every replay; the rest is
refused."""

import math

import numpy as np
import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import sim
from sim import Event, Mutation
from sim._templates import cached_template
from sim.world._engine import Engine, initial_checkpoint
from sim.world._entities import compose
from sim.world._world_input import check_text, check_tick, mutate_event

TARGETS = [
    "actuator/walker1/hhip/ctrl",
    "joint/walker1/rootz/qvel",
    "body/walker1/torso/mass",
    "option/gravity",
    "joint/crate/~joint0/qpos",
    "body/walker1/tors/mass",
    "geom/walker1/nothing/size",
]
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
PLAUSIBLE = st.sampled_from([1, 1, 3]).flatmap(  # a width that fits one of the targets
    lambda n: st.lists(st.floats(-2, 2), min_size=n, max_size=n).map(tuple)
)


@pytest.fixture(scope="module")
def template(region, world_entities):
    """The walker and the crate (a free joint: a quaternion in its qpos) on one floor."""
    return cached_template(compose(region, world_entities))


@settings(max_examples=600, deadline=None)
@given(
    target=st.sampled_from(TARGETS),
    op=st.sampled_from(["set", "add", "scale", "set", "add", "clamp"]),
    value=st.one_of(PLAUSIBLE, PLAUSIBLE, st.lists(VALUES, max_size=8).map(tuple), VALUES),
)
def test_an_event_it_accepts_is_stored_and_applied_again_from_its_bytes(
    template, target, op, value
):
    """The property behind "refused before it is logged": whatever passes the check survives
    encoding and decoding and applies in an engine (or is rejected there as a MutationError, the
    same way every time)."""
    try:
        logged = mutate_event(template, 0, [Mutation(target, op, value)], "p")
    except sim.MutationError:
        event("refused")
        return
    event("accepted")
    stored = orjson.loads(
        orjson.dumps(logged, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    )
    engine = Engine.restore(initial_checkpoint(template), template.xml, 1000)
    engine.advance(1, [Event(1, *stored)], lambda checkpoint: None)  # raises nothing
    assert engine.tick == 1 and all(math.isfinite(v) for v in engine.row)


def test_ticks_and_text_are_checked_for_what_they_are():
    assert check_tick("at", 5) == 5 and check_text("label", "café") == "café"
    for tick in (-1, 1.0, True, "5", 2**62 + 1, None):
        with pytest.raises(sim.HistoryError, match="at must be an integer tick"):
            check_tick("at", tick)
    for text, error in (
        (None, "must be a string"),
        (b"x", "must be a string"),
        ("\ud800", "valid Unicode"),
    ):
        with pytest.raises(ValueError, match=error):
            check_text("label", text)


def test_numpy_values_are_logged_as_floats(template):
    for value in ((np.float32(0.5),), np.array([0.5]), (np.int64(2),)):
        (change,) = mutate_event(
            template, 0, [Mutation("actuator/walker1/hhip/ctrl", "set", value)], "p"
        )[3]["mutations"]
        assert [type(v) for v in change["value"]] == [float]
    for value in ((np.bool_(True),), "5", (True,)):
        with pytest.raises(sim.MutationError, match="finite numbers"):
            mutate_event(template, 0, [Mutation("actuator/walker1/hhip/ctrl", "set", value)], "p")

import numpy as np
import pytest

from sim import Event, Mutation, Patch, ReplayTemplateError, Template
from sim.world._engine import Engine, initial_checkpoint, load_template
from sim.world._entities import compose


@pytest.fixture
def template(region, world_entities):
    return Template(compose(region, world_entities))


def _events():
    """Controls every 25 ticks, a mass change and a push, as a worker receives them (seq follows
    tick)."""

    def mutate(tick, target, op, value):
        return (
            tick,
            target.split("/")[1],
            "mutate",
            {"mutations": [Mutation(target, op, value).to_json()]},
            "test",
        )

    out = [
        mutate(25 * k, "actuator/walker1/hhip/ctrl", "set", (0.4 * np.sin(k),)) for k in range(8)
    ]
    out += [
        mutate(110, "body/walker1/torso/mass", "scale", (1.5,)),
        mutate(110, "joint/crate/~joint0/qvel", "set", (0.5, 0, 0, 0, 0, 0)),
    ]
    out.sort(key=lambda e: e[0])
    return [Event(seq, *e) for seq, e in enumerate(out, start=1)]


def _fresh(template, every=50):
    return Engine.restore(initial_checkpoint(template), template.xml, every)


def test_the_same_events_give_the_same_state_however_the_steps_are_split(template):
    whole, crossed = _fresh(template), []
    whole.advance(300, _events(), crossed.append)
    parts, sent = _fresh(template), 0
    for stop in (7, 110, 111, 250, 300):  # events at a stop tick are applied on arrival there
        batch = [e for e in _events() if sent < e.seq and e.tick <= stop]
        parts.advance(stop, batch, lambda c: None)
        sent = max([sent] + [e.seq for e in batch])
    assert whole.row.tobytes() == parts.row.tobytes()
    assert [c.tick for c in crossed] == [50, 100, 150, 200, 250, 300]


def test_a_checkpoint_restores_the_live_state_bit_for_bit(template):
    live, crossed = _fresh(template), []
    live.advance(300, _events(), crossed.append)
    at150 = next(c for c in crossed if c.tick == 150)
    assert at150.patch == [Mutation("body/walker1/torso/mass", "scale", (1.5,)).to_json()]
    restored = Engine.restore(at150, template.xml, 50)
    restored.advance(300, [e for e in _events() if e.tick >= 150], lambda c: None)
    assert restored.row.tobytes() == live.row.tobytes()
    assert restored.checkpoint() == live.checkpoint()


def test_a_mutation_that_cannot_apply_is_rejected_and_changes_nothing(template):
    half = [
        Mutation("actuator/walker1/hhip/ctrl", "set", (0.7,)),
        Mutation("body/walker1/torso/mass", "scale", (2.0,)),
        Mutation("body/walker1/torso/mass", "add", (-100.0,)),
    ]  # the last one rejects the whole event
    bad = Event(1, 10, "walker1", "mutate", {"mutations": [m.to_json() for m in half]}, "t")
    gone = bad._replace(
        seq=2, change={"mutations": [Mutation("body/walker2/torso/mass", "set", (1.0,)).to_json()]}
    )
    a, b = _fresh(template), _fresh(template)
    a.advance(60, [bad, gone], lambda c: None)
    b.advance(60, [], lambda c: None)
    assert [seq for seq, _ in a.rejected] == [1, 2] and "must stay > 0" in a.rejected[0][1]
    assert a.row.tobytes() == b.row.tobytes() and a.patch == Patch()


def test_an_entity_leaves_and_comes_back_with_its_state(region, world_entities, template):
    engine = _fresh(template)
    engine.advance(120, [e for e in _events() if e.tick <= 120], lambda c: None)
    before, row = engine.entity_state("walker1"), engine.row
    assert before["patch"] == [Mutation("body/walker1/torso/mass", "scale", (1.5,)).to_json()]
    crate_only = Template(compose(region, world_entities[1:]))
    leave = Event(
        20,
        120,
        "walker1",
        "leave",
        {
            "entity": "walker1",
            "template": crate_only.source_hash,
            "model_hash": crate_only.model_hash,
            "xml": crate_only.xml,
        },
        "t",
    )
    enter = Event(
        21,
        120,
        "walker1",
        "enter",
        {
            "entity": "walker1",
            "template": template.source_hash,
            "model_hash": template.model_hash,
            "xml": template.xml,
            "state": before["state"],
            "patch": before["patch"],
        },
        "t",
    )
    engine.advance(120, [leave], lambda c: None)
    assert engine.template.model.nu == 0 and engine.patch == Patch()
    engine.advance(120, [enter], lambda c: None)
    assert engine.row.tobytes() == row.tobytes() and engine.entity_state("walker1") == before


def test_history_does_not_replay_on_a_template_that_compiles_differently(template):
    with pytest.raises(ReplayTemplateError, match="another MuJoCo build"):
        load_template(template.xml, "0" * 64)
    checkpoint = initial_checkpoint(template)
    with pytest.raises(ReplayTemplateError):
        Engine.restore(
            checkpoint.__class__(**{**checkpoint.to_json(), "model_hash": "f" * 64}),
            template.xml,
            50,
        )

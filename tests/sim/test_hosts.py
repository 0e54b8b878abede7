"""Shard hosts: a shard's engines by key, in whatever process they are in."""

import pytest

from sim import Event, Mutation, Template
from sim.world._engine import initial_checkpoint
from sim.world._entities import compose
from sim.world._hosts import ShardHost


@pytest.fixture(scope="module")
def template(region, world_entities):
    return Template(compose(region, world_entities))


def _load_args(template):
    return (initial_checkpoint(template).to_json(), template.xml, 50, 0, [])


def _ctrl(seq, tick, value):
    return Event(
        seq,
        tick,
        "walker1",
        "mutate",
        {"mutations": [Mutation("actuator/walker1/hhip/ctrl", "set", (value,)).to_json()]},
        "t",
    )


def test_a_host_keeps_engines_apart_and_reports_what_it_crossed(template):
    host = ShardHost()
    host.load("", *_load_args(template))
    host.load("b", *_load_args(template))
    report = host.advance("", 120, [_ctrl(1, 0, 0.5)])
    assert report["tick"] == 120 and [c["tick"] for c in report["checkpoints"]] == [50, 100]
    assert report["template"] == template.source_hash and report["rejected"] == []
    host.advance("b", 120, [])
    assert host.state("")["state"] != host.state("b")["state"]
    again = host.replay("", *_load_args(template)[:3], 120, [_ctrl(1, 0, 0.5)])
    assert again["state"] == host.state("") and again["checkpoints"] == report["checkpoints"]
    host.drop("b")
    assert set(host.engines) == {""}

"""Forks, counterfactual replays and migrations: new histories that never disturb the canonical
one."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim import Intervention, Mutation
from sim.world import _branches
from sim.world._entities import named_state
from sim.world._worldstore import WorldStore

SHARDS = ("west", "east")


def _mutation(kind, value):
    return {
        "ctrl": Mutation("actuator/walker1/hhip/ctrl", "set", (value,)),
        "mass": Mutation("body/walker1/torso/mass", "scale", (1.0 + abs(value),)),
        "push": Mutation("joint/crate/~joint0/qvel", "set", (value, 0.0, 1.0, 0.0, 0.0, 0.0)),
    }[kind]


def _walker_state(snapshot):
    return named_state(snapshot.template.model, snapshot.state, "walker1/")


def _log(world, shard):
    """A shard's events, without the (random) migration ids."""
    return [
        {**e.to_json(), "change": {k: v for k, v in e.change.items() if k != "migration"}}
        for e in world.events(shard)
    ]


values = st.floats(-1.0, 1.0, allow_nan=False)
kinds = st.sampled_from(["ctrl", "mass", "push"])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), kinds, values),
        st.tuples(st.just("advance"), st.integers(1, 60)),
        st.tuples(st.just("migrate")),
        st.tuples(st.just("fork"), st.sampled_from(SHARDS), st.floats(0, 1)),
        st.tuples(st.just("branch apply"), st.integers(0, 9), kinds, values),
        st.tuples(st.just("branch advance"), st.integers(0, 9), st.integers(1, 60)),
        st.tuples(st.just("counterfactual"), st.floats(0, 1), st.floats(0, 1), kinds, values),
    ),
    max_size=14,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_forks_never_change_the_canonical_world(region, world_entities, ops):
    """Whatever is done to branches, the canonical world ends exactly as one that only saw its own
    operations; and every branch, rebuilt from the store after reopening, is exactly where it
    was."""
    with tempfile.TemporaryDirectory() as tmp:
        make = lambda name: sim.World.create(
            Path(tmp) / name,
            dict.fromkeys(SHARDS, region),
            world_entities,
            checkpoint_every=50,
            backend="inline",
        )
        world, reference = make("w.db"), make("ref.db")
        branches = []
        for op in ops:
            walker_at = world.entities()["walker1"]
            if op[0] in ("apply", "advance", "migrate"):
                for w in (world, reference):
                    if op[0] == "apply":
                        target = walker_at if op[1] != "push" else world.entities()["crate"]
                        w.apply(target, _mutation(op[1], op[2]))
                    elif op[0] == "advance":
                        w.advance(op[1])
                    else:
                        w.migrate("walker1", "east" if walker_at == "west" else "west")
            elif op[0] == "fork":
                branches.append(world.fork(op[1], int(op[2] * world.head(op[1]))))
            elif op[0] == "counterfactual":
                head = world.head(walker_at)
                start, stop = sorted((int(op[1] * head), int(op[2] * head)))
                if start < stop and op[3] != "push":
                    try:
                        replay = world.replay(
                            walker_at,
                            start,
                            stop,
                            interventions=[Intervention(start, _mutation(op[3], op[4]))],
                        )
                    except sim.MutationError:
                        continue  # the walker was not in that shard yet at `start`
                    branches.append(replay.branch)
            elif branches:
                branch = branches[op[1] % len(branches)]
                if op[0] == "branch advance":
                    branch.advance(op[2])
                elif branch.shard == walker_at or op[2] == "push":
                    try:
                        branch.apply(_mutation(op[2], op[3]))
                    except sim.MutationError:
                        pass  # the entity is not in that shard at the branch's point in time
        for shard in SHARDS:
            assert world.snapshot(shard).same_state(reference.snapshot(shard))
            assert _log(world, shard) == _log(reference, shard)
        before = [(b.id, b.snapshot()) for b in branches]
        world.close()
        reference.close()
        again = sim.World.open(Path(tmp) / "w.db", backend="inline")
        for branch_id, snapshot in before:
            assert again.branch(branch_id).snapshot().same_state(snapshot)
        again.close()


@pytest.fixture
def world(tmp_path, region, world_entities):
    world = sim.World.create(
        tmp_path / "w.db", dict.fromkeys(SHARDS, region), world_entities, checkpoint_every=50
    )
    for k in range(6):
        world.apply("west", _mutation("ctrl", 0.4 * (-1) ** k))
        world.advance(25)
    yield world
    world.close()


def test_a_counterfactual_replay_is_a_branch_of_the_recorded_events_plus_the_interventions(world):
    push = Mutation("joint/walker1/rootz/qvel", "set", (1.5,))
    replay = world.replay("west", 40, 150, interventions=[Intervention(60, push)])
    assert not replay.exact and replay.branch.base_tick == 40 and replay.branch.head == 150
    assert [e.tick for e in replay.branch.events()] == [
        50,
        60,
        75,
        100,
        125,
    ]  # recorded ones, and the push
    assert "canonical #3" in replay.branch.events()[0].provenance
    by_hand = world.fork("west", 40)
    for event in replay.branch.events():
        by_hand.apply([Mutation.from_json(m) for m in event.change["mutations"]], at=event.tick)
    by_hand.advance(110)
    assert by_hand.snapshot().same_state(replay.snapshot)
    assert not replay.snapshot.same_state(world.replay("west", 40, 150).snapshot)
    assert len(world.branches("west")) == 2 and world.head("west") == 150
    for at in (60.5, 20, 150):
        with pytest.raises(sim.HistoryError, match="integer tick|outside the replay"):
            world.replay("west", 40, 150, interventions=[Intervention(at, push)])
    for interventions, error in (
        ([push], "sim.Intervention objects"),
        ([Intervention(60, push, provenance="\ud800")], "valid Unicode text"),
        ([Intervention(60, push, provenance=object())], "must be a string"),
    ):
        with pytest.raises(ValueError, match=error):
            world.replay("west", 40, 150, interventions=interventions)
    for label, error in ((True, "label must be a string"), ("caf\udcff", "valid Unicode text")):
        with pytest.raises(
            ValueError, match=error
        ):  # a non-text label failed its own checksum ever after
            world.fork("west", 40, label=label)
    assert len(world.branches("west")) == 2  # a refused replay or fork makes no branch


def test_a_migrated_entity_keeps_its_state_and_mutations(world):
    world.apply("west", Mutation("body/walker1/torso/mass", "scale", (1.25,)))
    before = _walker_state(world.snapshot("west"))
    migration = world.migrate("walker1", "east", provenance="left the cell")
    assert world.entities() == {"crate": "east", "walker1": "east"}
    assert (migration.left.kind, migration.entered.kind, migration.entered.provenance) == (
        "leave",
        "enter",
        "left the cell",
    )
    east = world.snapshot("east")
    assert (
        _walker_state(east) == before
        and east.patch.mutations[-1].target == "body/walker1/torso/mass"
    )
    assert world.snapshot("west").template.model.nu == 0
    world.apply("east", _mutation("ctrl", 0.2))  # its controls now go to the other shard
    with pytest.raises(sim.MutationError, match="walker1/hhip"):
        world.apply("west", _mutation("ctrl", 0.2))
    with pytest.raises(sim.UnknownEntityError, match="no entity 'walker2'"):
        world.migrate("walker2", "west")
    with pytest.raises(sim.UnknownShardError):
        world.migrate("walker1", "north")
    with pytest.raises(sim.WorldError, match="already in shard 'east'"):
        world.migrate("walker1", "east")
    for entity, provenance in ((["walker1"], "x"), ("walker1", 5)):
        with pytest.raises((sim.UnknownEntityError, ValueError)):
            world.migrate(entity, "west", provenance=provenance)
    assert world.entities() == {"crate": "east", "walker1": "east"}
    world.advance(100)
    assert world.replay("east", 0, world.head("east")).exact


def _kill(world, *shards):
    for shard in shards:
        os.kill(world.worker_pid(shard), signal.SIGKILL)


def _check_exactly_once(world, moved, before):
    """The walker is in exactly one shard, with the state it had; each log holds its leave/enter at
    most once."""
    where = "east" if moved else "west"
    assert world.entities()["walker1"] == where
    kinds = {s: [e.kind for e in world.events(s) if e.kind != "mutate"] for s in SHARDS}
    assert kinds == ({"west": ["leave"], "east": ["enter"]} if moved else {"west": [], "east": []})
    for shard in SHARDS:
        names = world.snapshot(shard).template.names("joint")
        assert ("walker1/hhip" in names) == (shard == where)
    assert _walker_state(world.snapshot(where)) == before


def _wrap(monkeypatch, name, before=None, after=None):
    real = getattr(_branches, name)

    def wrapped(*args, **kwargs):
        if before:
            before()
        result = real(*args, **kwargs)
        if after:
            after()
        return result

    monkeypatch.setattr(_branches, name, wrapped)


@pytest.mark.parametrize(
    "fault",
    [
        "source dies while read",
        "target dies before commit",
        "commit fails half-way",
        "both die before delivery",
    ],
)
def test_migration_happens_exactly_once_under_faults(world, monkeypatch, fault):
    before = _walker_state(world.snapshot("west"))
    if fault == "source dies while read":
        _wrap(monkeypatch, "read_handoff", before=lambda: _kill(world, "west"))
    elif fault == "target dies before commit":
        _wrap(monkeypatch, "commit_migration", before=lambda: _kill(world, "east"))
    elif fault == "both die before delivery":
        _wrap(monkeypatch, "deliver", before=lambda: _kill(world, "west", "east"))
    else:

        def broken(self, data):
            raise OSError("disk full")

        monkeypatch.setattr(WorldStore, "add_migration", broken)
        with pytest.raises(OSError, match="disk full"):
            world.migrate("walker1", "east")
        _check_exactly_once(world, False, before)
        monkeypatch.undo()
    world.migrate("walker1", "east")
    _check_exactly_once(world, True, before)
    assert (
        world.recoveries
        == {
            "source dies while read": 1,
            "target dies before commit": 1,
            "commit fails half-way": 0,
            "both die before delivery": 2,
        }[fault]
    )


CRASH = """
import os, signal, sys, sim
from sim.world import _branches
if __name__ == "__main__":
    real = _branches.commit_migration
    def crash(*args):
        if {after!r}:
            real(*args)
        os.kill(os.getpid(), signal.SIGKILL)
    _branches.commit_migration = crash
    sim.World.open({path!r}).migrate("walker1", "east")
"""


@pytest.mark.parametrize("after", [False, True], ids=["before the commit", "after the commit"])
def test_a_coordinator_killed_mid_migration_leaves_it_done_or_not_done(world, tmp_path, after):
    before = _walker_state(world.snapshot("west"))
    world.close()
    script = tmp_path / "crash.py"
    script.write_text(CRASH.format(after=after, path=str(tmp_path / "w.db")))
    assert subprocess.run([sys.executable, str(script)]).returncode == -signal.SIGKILL
    reopened = sim.World.open(tmp_path / "w.db")
    try:
        _check_exactly_once(reopened, after, before)
        if not after:
            reopened.migrate("walker1", "east")
            _check_exactly_once(reopened, True, before)
    finally:
        reopened.close()


def test_numpy_ticks_and_a_branch_deleted_in_a_batch_leave_a_world_that_opens(world, tmp_path):
    push = Mutation("joint/walker1/rootz/qvel", "set", (np.float32(1.5),))
    replay = world.replay(
        "west", np.int64(40), np.int64(150), interventions=[Intervention(np.int64(60), push)]
    )
    assert [type(e.tick) for e in replay.branch.events()] == [int] * 5
    doomed = world.fork("west", 100)
    with world.batch():  # its events were still in memory when it went
        world.apply("west", _mutation("ctrl", 0.3))
        doomed.apply(_mutation("ctrl", 0.1))
        doomed.delete()
    world.close()
    reopened = sim.World.open(world.path, backend="inline")
    assert [b.id for b in reopened.branches()] == [replay.branch.id] and len(
        reopened.events("west")
    ) == 7
    assert reopened.status()["branches"][0]["head"] == 150
    reopened.close()


def test_pruned_history_is_gone_and_the_world_goes_on_exactly(
    world, tmp_path, region, world_entities
):
    reference = sim.World.create(
        tmp_path / "ref.db",
        dict.fromkeys(SHARDS, region),
        world_entities,
        checkpoint_every=50,
        backend="inline",
    )
    for k in range(6):
        reference.apply("west", _mutation("ctrl", 0.4 * (-1) ** k))
        reference.advance(25)
    branch = world.fork("west", 60)
    with pytest.raises(sim.HistoryError, match=r"branches \['[0-9a-f]+'\] fork before tick 100"):
        world.prune(120)
    branch.delete()
    assert world.branches() == [] and world.prune(120) == {"west": 100, "east": 100}
    assert world.status()["shards"]["west"]["history_from"] == 100
    with pytest.raises(sim.HistoryError, match="history for ticks 100..150: cannot fork at 99"):
        world.fork("west", 99)
    assert world.replay("west", 100, 150).exact and world.prune(80) == {"west": 100, "east": 100}
    assert [e.tick for e in world.events("west")] == [100, 125]
    assert [e.tick for e in world.events("west", first_tick=101, last_tick=125)] == [125]
    world.close()
    world = sim.World.open(
        tmp_path / "w.db", backend="inline"
    )  # rebuilt from the kept checkpoint and log
    for w in (world, reference):
        w.apply("west", _mutation("mass", 0.5))
        w.advance(30)
    assert all(world.snapshot(s).same_state(reference.snapshot(s)) for s in SHARDS)
    reference.close()
    world.close()

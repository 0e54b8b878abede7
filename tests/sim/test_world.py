"""The canonical world: input refused, corrupt or foreign history, failed commits, coordinators
killed mid-run. What every backend must do alike (reopen, replay, evaluate, lose a worker) is in
test_world_backends."""

import contextlib
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

import sim
import sim.world._world
from sim import Mutation
from sim.world._worldstore import WorldStore


def _same(a, b):
    return all(a.snapshot(s).same_state(b.snapshot(s)) for s in ("west", "east"))


def _events(world, shard="west"):
    return [e.to_json() for e in world.events(shard)]


def test_bad_input_is_refused_before_anything_is_logged(make_world, drive, gait):
    world = make_world(backend="inline")
    drive(world, 100)
    with pytest.raises(sim.HistoryError, match="fork at 50 to change the past"):
        world.apply("west", gait(50), at=50)
    with pytest.raises(sim.MutationError, match="no body named 'walker1/tors'"):
        world.apply("west", Mutation("body/walker1/tors/mass", "set", (2.0,)))
    with pytest.raises(sim.MutationError, match="must stay > 0"):
        world.apply("west", Mutation("body/walker1/torso/mass", "set", (0.0,)))
    for bad in ((float("nan"),), (float("inf"),), ("1.0",), (True,), (10**400,), 1.0, None):
        with pytest.raises(sim.MutationError, match="finite numbers"):
            world.apply("west", Mutation("actuator/walker1/hhip/ctrl", "set", bad))
    with pytest.raises(
        sim.MutationError, match="op must be one of"
    ):  # once logged, it would fail every advance
        world.apply("west", Mutation("actuator/walker1/hhip/ctrl", "clamp", (1.0,)))
    for at in (
        150.5,
        "150",
        True,
        -1,
        2**63,
    ):  # a float tick, once logged, would fail every advance
        with pytest.raises(sim.HistoryError, match="at must be an integer tick"):
            world.apply("west", gait(150), at=at)
    with pytest.raises(ValueError, match="provenance must be a string"):
        world.apply("west", gait(150), provenance=None)
    for steps in (True, 1.5, -1):
        with pytest.raises(ValueError, match="steps must be a non-negative integer"):
            world.advance(steps)
    with pytest.raises(sim.HistoryError, match="would pass tick"):
        world.advance(2**63)
    with pytest.raises(sim.MutationError, match="are sim.Mutation objects"):
        world.apply("west", [{"target": "actuator/walker1/hhip/ctrl", "op": "set", "value": [1.0]}])
    with pytest.raises(ValueError, match="provenance must be valid Unicode text"):
        world.apply("west", gait(100), provenance="half a surrogate \ud800")
    with pytest.raises(
        sim.HistoryError, match="at most 1000000 ticks ahead"
    ):  # it would hold the shard back
        world.apply("west", gait(100), at=10**15)
    for mutations in (None, 5, [Mutation(["body"], "set", (1.0,))]):
        with pytest.raises(sim.MutationError, match="sim.Mutation"):
            world.apply("west", mutations)
    with pytest.raises(sim.UnknownShardError):
        world.apply(["west"], gait(100))
    with pytest.raises(sim.UnknownShardError, match="no shard 'north'"):
        world.snapshot("north")
    with pytest.raises(sim.HistoryError, match="first_tick must be an integer tick"):
        world.events("west", first_tick=2**70)
    with pytest.raises(sim.HistoryError, match="ticks 0..100: cannot fork at 101"):
        world.fork("west", 101)
    with pytest.raises(sim.HistoryError, match="cannot replay 20..150"):
        world.replay("west", 20, 150)
    with pytest.raises(sim.UnknownShardError, match="no shard 'north'"):
        world.advance(10, ["north"])
    assert len(world.events("west")) == 5 and world.head("west") == 100
    assert world.advance(10, ["west", "west"]) == {
        "west": 110
    }  # nothing refused was logged; a shard named twice
    assert world.snapshot("west").tick == 110  # advances once
    event = world.apply("west", gait(120), at=np.int64(120))  # numpy's integers are integers
    assert type(event.tick) is int and world.advance(np.int64(20), ["west"]) == {"west": 130}
    assert {type(v) for m in event.change["mutations"] for v in m["value"]} == {
        float
    }  # not np.float64
    assert (
        world.fork("west", np.int64(125)).base_tick == 125
        and world.replay("west", np.int64(0), 130).exact
    )


def test_corrupt_history_is_found_by_checksum_and_changes_nothing(make_world, tmp_path, drive):
    world = make_world("w", backend="inline")
    drive(world, 240)
    world.close()

    def rows():
        with contextlib.closing(sqlite3.connect(tmp_path / "w.db")) as db:
            return [
                db.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()
                for table in ("logs", "segments", "checkpoints")
            ]

    with sqlite3.connect(tmp_path / "w.db") as db:
        db.execute(
            "UPDATE checkpoints SET state = zeroblob(length(state)) "
            "WHERE shard = 'west' AND tick = 200"
        )
    corrupt = rows()
    with pytest.raises(sim.CorruptCheckpointError, match="tick 200 fails its checksum"):
        sim.World.open(tmp_path / "w.db", backend="inline")
    with sqlite3.connect(tmp_path / "w.db") as db:
        db.execute(
            "UPDATE segments SET events = replace(events, '0.', '9.') "
            "WHERE shard = 'west' AND first_seq = 12"
        )
    with pytest.raises(
        sim.CorruptLogError, match=r"events 12..12 \(ticks 220..220\) fails its checksum"
    ):
        sim.World.open(tmp_path / "w.db", backend="inline")
    logs, segments, checkpoints = rows()  # nothing was written by the failed opens
    assert logs == corrupt[0] and checkpoints == corrupt[2] and len(segments) == len(corrupt[1])


def test_a_shard_that_fails_to_start_an_advance_does_not_cost_the_others_theirs(
    make_world, tmp_path, gait
):
    world = make_world("w", backend="inline")
    world.apply("west", gait(15), at=15)
    world.apply("west", gait(16), at=16)
    world.close()
    with sqlite3.connect(
        tmp_path / "w.db"
    ) as db:  # west's event fails its checksum when the advance reads it
        db.execute(
            "UPDATE segments SET events = replace(events, '0.', '9.') "
            "WHERE shard = 'west' AND first_seq = 1"
        )
    world = sim.World.open(tmp_path / "w.db", backend="inline")
    with pytest.raises(sim.CorruptLogError):
        world.advance(20)
    assert (
        world.head("east") == 20 and world.snapshot("east").tick == 20
    )  # east's advance was committed
    world.advance(5, ["east"])
    assert world.head("east") == world.snapshot("east").tick == 25
    world.apply("east", Mutation("joint/crate/~joint0/qvel", "set", (1.0, 0, 0, 0, 0, 0)))
    world.close()
    with sim.World.open(
        tmp_path / "w.db", backend="inline"
    ) as reopened:  # read from the file, a numpy tick works
        assert [
            e.tick for e in reopened.events("east", first_tick=np.int64(0), last_tick=np.int64(25))
        ] == [25]


def test_history_from_another_build_is_not_replayed(make_world, tmp_path, drive):
    world = make_world("w", backend="inline")
    drive(world, 120)
    world.close()
    store = WorldStore(
        tmp_path / "w.db", create=False
    )  # as if another MuJoCo build had compiled the template
    forged = "f" * 64
    with store.transaction():
        template, patch, state = store._db.execute(
            "SELECT template, patch, state FROM checkpoints WHERE shard = 'west' AND tick = 100"
        ).fetchone()
        checksum = store._checksum(
            "checkpoint",
            "west",
            "",
            100,
            template,
            forged,
            patch,
            hashlib.sha256(state).hexdigest(),
        )
        store._db.execute(
            "UPDATE checkpoints SET model_hash = ?, checksum = ? "
            "WHERE shard = 'west' AND tick = 100",
            (forged, checksum),
        )
    store.close()
    with pytest.raises(
        sim.ReplayTemplateError, match="cannot replay exactly"
    ):  # raised in the worker process
        sim.World.open(tmp_path / "w.db")


CHILD = """
import sys, sim
sys.path.insert(0, {tests!r})
from conftest import gait_at as gait
if __name__ == "__main__":
    world = sim.World.open({path!r}, backend="process")
    with open({workers!r}, "w") as out:
        out.write(" ".join(str(world.worker_pid(shard)) for shard in world.shards))
    while True:
        tick = world.head("west")
        # ten events and the advance over them, one commit: acknowledged when it ends
        if {batched!r}:
            with world.batch():
                for at in range(tick, tick + 200, 20):
                    world.apply("west", gait(at), provenance=f"gait@{{at}}", at=at)
                world.advance(200)
            print("acked", tick + 180, flush=True)
        else:
            world.apply("west", gait(tick), provenance=f"gait@{{tick}}")
            print("acked", tick, flush=True)
            world.advance(20)
"""


def _alive(pid):
    """A process that exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("batched", [False, True], ids=["one commit per event", "group commits"])
def test_a_killed_coordinator_loses_nothing_it_acknowledged(make_world, tmp_path, batched, drive):
    world = make_world("w")
    drive(world, 100)
    world.close()
    script = tmp_path / "child.py"
    script.write_text(
        CHILD.format(
            tests=os.path.dirname(__file__),
            path=str(tmp_path / "w.db"),
            batched=batched,
            workers=str(tmp_path / "workers"),
        )
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    acked = []
    for line in child.stdout:
        acked.append(int(line.split()[1]))
        if len(acked) == 60:
            break
    workers = [int(pid) for pid in (tmp_path / "workers").read_text().split()]
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = (
        time.monotonic() + 10
    )  # its shard workers exit with it, not linger holding torch and MuJoCo
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)
    assert (
        tmp_path / "w.db-redo"
    ).stat().st_size > 0  # acknowledged commits not yet folded into the tables
    world = sim.World.open(tmp_path / "w.db")
    logged = {int(e.provenance.split("@")[1]) for e in world.events("west")}
    assert set(acked) <= logged and world.head("west") >= acked[-1]
    reference = make_world("ref", backend="inline")
    for event in world.events("west"):
        reference.apply(
            "west",
            [Mutation.from_json(m) for m in event.change["mutations"]],
            provenance=event.provenance,
            at=event.tick,
        )
    reference.advance(world.head("west"))
    assert _same(world, reference)


def test_a_world_that_cannot_be_made_leaves_no_file_and_one_that_is_no_world_is_not_touched(
    tmp_path, region, world_entities
):
    shards = {"west": region, "east": region}
    for kwargs, error in (
        ({"backend": "bogus"}, "backend must be one of"),
        ({"name": ["w"]}, "name must be a string"),
        ({"checkpoint_every": True}, "checkpoint_every must be a positive integer"),
    ):
        with pytest.raises(ValueError, match=error):
            sim.World.create(tmp_path / "w.db", shards, world_entities, **kwargs)
    with pytest.raises(ValueError, match="scene of shard 'east' must be MJCF text"):
        sim.World.create(tmp_path / "w.db", {"west": region, "east": None}, world_entities)
    with pytest.raises(ValueError, match="sim.Entity objects"):
        sim.World.create(tmp_path / "w.db", shards, [e.to_json() for e in world_entities])
    assert list(tmp_path.iterdir()) == []
    with sim.World.create(
        tmp_path / "w.db", shards, (e for e in world_entities), backend="inline"
    ) as world:
        assert world.entities() == {
            "crate": "east",
            "walker1": "west",
        }  # a generator of entities is not spent early
    other = tmp_path / "other.db"  # another program's database is refused as it was found
    with contextlib.closing(sqlite3.connect(other)) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.commit()
    before = other.read_bytes()
    with pytest.raises(sim.CorruptWorldError, match="holds no world"):
        sim.World.open(other)
    assert other.read_bytes() == before and not (tmp_path / "other.db-wal").exists()


def test_a_world_in_a_folder_that_does_not_exist_is_refused_naming_the_folder(
    tmp_path, region, world_entities, monkeypatch
):
    """As sqlite3 does, World.create makes no folders: WorldError naming the folder, before the
    scenes are compiled; nothing is created."""
    compiled = []
    monkeypatch.setattr(sim.world._world, "cached_template", lambda *a: compiled.append(a) or None)
    (tmp_path / "a-file").write_text("not a folder")
    for folder, what in (
        (tmp_path / "no" / "such", "does not exist"),
        (tmp_path / "a-file", "is not a folder"),
    ):
        path = folder / "w.db"
        with pytest.raises(sim.WorldError) as raised:
            sim.World.create(path, {"west": region}, backend="inline")
        assert str(raised.value) == (
            f"cannot create the world {path}: the folder {folder} {what}; create it first"
        )
    assert compiled == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    with pytest.raises(sim.WorldError, match="the folder .* does not exist"):  # below the World
        WorldStore(tmp_path / "no" / "w.db", create=True)


def test_a_batch_that_rolls_back_takes_its_migration_with_it(make_world):
    world = make_world(backend="inline")
    with pytest.raises(sim.MutationError), world.batch():
        world.migrate("crate", "west")
        world.apply("west", Mutation("actuator/walker1/hhip/ctrl", "clamp", (1.0,)))
    assert world.entities() == {"crate": "east", "walker1": "west"}
    with pytest.raises(sim.WorldError, match="already in shard 'east'"):
        world.migrate("crate", "east")
    world.migrate("crate", "west")
    assert (
        world.entities() == {"crate": "west", "walker1": "west"}
        and len(world.status()["shards"]) == 2
    )


def test_an_advance_whose_commit_fails_leaves_no_event_applied_twice(make_world, monkeypatch):
    world, reference = (
        make_world("w", backend="inline", every=15),
        make_world("ref", backend="inline", every=15),
    )
    push = Mutation(
        "joint/crate/~joint0/qvel", "add", (0.5, 0, 0, 0, 0, 0)
    )  # applied twice, it would show
    for each in (world, reference):
        each.advance(10, ["east"])
        each.apply("east", push, at=20)

    def full(
        meta, blobs
    ):  # a fault: the disk refuses the advance's commit, after the engine applied the event at 20
        raise sim.WorldError("disk full (injected)")

    monkeypatch.setattr(world._shards.store._redo, "append", full)
    with pytest.raises(sim.WorldError, match="injected"):
        world.advance(10, ["east"])
    monkeypatch.undo()
    assert world.head("east") == 10
    world.advance(15, ["east"])
    reference.advance(15, ["east"])
    assert world.snapshot("east").same_state(reference.snapshot("east"))
    assert world.replay("east", 0, 25).snapshot.same_state(world.snapshot("east"))

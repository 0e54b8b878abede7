"""The files under the store: transactions, the redo file and its folding, failures of the disk."""

import base64
import errno
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from knowledge import StoreFullError
from sim import CorruptLogError, CorruptWorldError, WorldError, WorldFullError, WorldLockedError
from sim.world._redo import RedoFile
from sim.world._worldrows import Checkpoint
from sim.world._worldstore import WorldStore


def test_one_process_at_a_time_and_files_that_are_no_world(store, tmp_path):
    with pytest.raises(WorldLockedError, match="open in another process"):
        WorldStore(store.path, create=False)
    with pytest.raises(WorldError, match="already exists"):
        WorldStore(store.path, create=True)
    with pytest.raises(WorldError, match="holds no world"):
        WorldStore(tmp_path / "none.db", create=False)
    for earlier in (
        "simnet.world/2",
        "simnet.world/4",
    ):  # a world of an earlier format is refused, not misread
        old = tmp_path / f"{earlier[-1]}.db"
        with sqlite3.connect(old) as db:
            db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("INSERT INTO meta VALUES ('format', ?)", (earlier,))
        with pytest.raises(CorruptWorldError, match=f"unknown world format '{earlier}'"):
            WorldStore(old, create=False)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(CorruptWorldError, match="not a readable world"):
        WorldStore(junk, create=False)


def test_a_commit_the_disk_refuses_keeps_nothing_and_the_log_goes_on(store):
    with store.transaction():  # a twin's commit: into the redo file
        store.append("west", "", [(15, "", "mutate", {}, "kept")])
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # a full disk, as SQLite sees it
    with (
        pytest.raises(
            WorldFullError, match="could not write .*full.*nothing of this commit was kept"
        ) as raised,
        store.transaction(),
    ):
        store.set_head("west", "", 50)
        store.append(
            "west", "", [(t, "", "mutate", {"pad": "x" * 3000}, "big") for t in range(20, 60)]
        )
        store.set_meta(
            "note", "a setting: this commit goes through SQLite, folding the redo file in"
        )
    assert isinstance(raised.value, StoreFullError)  # as a knowledge base's full disk
    assert (
        store._redo.size > 0
    )  # the fold was rolled back with it: the record waits in the redo file
    assert (
        store.last_event("west", "") == (7, 15) and store.log("west", "").head == 0
    )  # (a read folds it in)
    store._db.execute("PRAGMA max_page_count = 1000000")  # space again
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "after")])
    store.close()
    store = WorldStore(store.path, create=False)  # the chain runs on from what was kept
    assert [e.seq for e in store.events("west", "")] == [1, 2, 3, 4, 5, 6, 7, 8]
    store.close()


def test_a_redo_record_the_disk_refuses_keeps_nothing_and_the_log_goes_on(store, monkeypatch):
    size, pwrite = store._redo.size, os.pwrite

    def full(fd, data, offset):  # a fault: half the record reaches the file, then the disk is full
        pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with (
        pytest.raises(
            WorldFullError, match="could not be written .*No space left.*nothing of it was kept"
        ),
        store.transaction(),
    ):
        store.append("west", "", [(20, "", "mutate", {}, "lost")])
        store.set_head("west", "", 30)
    assert (
        os.path.getsize(store._redo.path) == size == store._redo.size
    )  # no torn record before the next one
    assert store.last_event("west", "") == (6, 12) and store.log("west", "").head == 0
    monkeypatch.undo()
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "after")])
    store.close()
    store = WorldStore(store.path, create=False)
    assert [e.provenance for e in store.events("west", "", first_tick=13)] == ["after"]
    store.close()


def _as_killed(store):
    """Close a store as a killed process leaves its files: the redo file not folded in."""
    store._redo.unfolded = False
    store.close()


def _segments(path):
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT first_seq, last_seq, head FROM segments ORDER BY first_seq"
        ).fetchall()


def test_a_twins_commits_wait_in_the_redo_file_until_folded(store, monkeypatch):
    monkeypatch.setattr("sim.world._worldfiles.FOLD_BYTES", 1000)
    before = _segments(store.path)
    for tick in (20, 30):  # small commits: into the redo file, one record each
        with store.transaction():
            store.append("west", "", [(tick, "", "mutate", {"i": tick}, "")])
            store.set_head("west", "", tick + 1)
    assert _segments(store.path) == before and 0 < store._redo.size < 1000
    with store.transaction():  # a commit that takes the file past the size
        store.append("west", "", [(40, "", "mutate", {"pad": "x" * 1000}, "")])
    assert _segments(store.path) == before and store._redo.size > 1000
    with store.transaction():  # the next goes through SQLite, with the file folded in first
        store.set_head("west", "", 50)
    assert (
        _segments(store.path)[-3:] == [(7, 7, 21), (8, 8, 31), (9, 9, 31)] and store._redo.size == 0
    )
    store.close()
    store = WorldStore(store.path, create=False)
    assert [e.tick for e in store.events("west", "", first_tick=13)] == [20, 30, 40]
    assert store.log("west", "").head == 50
    store.close()


def test_a_fold_whose_file_could_not_be_emptied_is_not_folded_twice(store, monkeypatch):
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "once")])
        store.put_checkpoints("west", "", [Checkpoint(20, "t" * 64, "m" * 64, [], b"\x03" * 16)])

    def fail(
        fd, length
    ):  # a fault: the process dies between the fold's commit and emptying the file
        raise OSError("killed")

    monkeypatch.setattr(os, "ftruncate", fail)
    store.fold()
    monkeypatch.undo()
    assert store._redo.size > 0 and _segments(store.path)[-1] == (7, 7, 0)
    with store.transaction():  # numbered on from the folded one
        store.append("west", "", [(21, "", "mutate", {}, "after")])
    _as_killed(store)
    store = WorldStore(store.path, create=False)
    assert [e.provenance for e in store.events("west", "", first_tick=13)] == ["once", "after"]
    assert store.checkpoint("west", "", 20).state == b"\x03" * 16 and store._redo.size == 0
    store.close()


def test_a_corrupt_redo_file_is_refused_and_nothing_is_changed(store):
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "x")])
    with store.transaction():
        store.append("west", "", [(21, "", "mutate", {}, "y")])
    _as_killed(store)  # two records not folded
    redo = store.path.parent / "w.db-redo"
    data = bytearray(redo.read_bytes())
    data[60] ^= 1  # in the first record's payload
    redo.write_bytes(bytes(data))
    tables = _segments(store.path)
    with pytest.raises(
        CorruptLogError, match="w.db-redo: the commit at byte .* fails its checksum"
    ):
        WorldStore(store.path, create=False)
    assert redo.read_bytes() == data and _segments(store.path) == tables


def test_commits_an_older_simnet_left_in_the_redo_file_are_folded_in(store, monkeypatch, format_1):
    """Redo format 1 (rows as JSON, states in base64) is read, so such a world opens."""
    taken = []
    take = store._take_pending
    monkeypatch.setattr(store, "_take_pending", lambda: taken.append(take()) or ([], [], []))
    with store.transaction():  # the rows of a twin's commit, which an older simnet wrote...
        store.append("west", "", [(20, "", "mutate", {"v": [0.5]}, "older")])
        store.set_head("west", "", 20)
        store.put_checkpoints("west", "", [Checkpoint(20, "t" * 64, "m" * 64, [], b"\x02" * 16)])
    monkeypatch.undo()
    (segments, heads, checkpoints), number = taken[0], store._redo.last + 1
    _as_killed(store)
    rows = {  # ...as its record, and died before folding it in
        "segments": [(*row[:7], row[7].decode(), row[8]) for row in segments],
        "heads": heads,
        "checkpoints": [
            (*row[:6], base64.b64encode(row[6]).decode(), row[7]) for row in checkpoints
        ],
    }
    with open(store.path.parent / "w.db-redo", "ab") as redo:
        redo.write(format_1(store.id, number, rows))
    reopened = WorldStore(store.path, create=False)
    assert [e.provenance for e in reopened.events("west", "", first_tick=13)] == ["older"]
    assert reopened.log("west", "").head == 20 and reopened._redo.size == 0
    assert reopened.checkpoint("west", "", 20).state == b"\x02" * 16
    reopened.close()


def test_a_redo_record_whose_blobs_do_not_match_its_rows_is_refused(store):
    folded = store._redo.folded
    _as_killed(store)
    redo = RedoFile(store.path.parent / "w.db-redo", store.id, fsync=False, folded=folded)
    redo.append([[["west", "", 7, 7, 20, 20, 20, "c" * 64]], [], []])  # a segment, no events
    redo.close()
    with pytest.raises(CorruptWorldError, match=r"w.db-redo: commit \d+ holds 0 blobs, not 1"):
        WorldStore(store.path, create=False)


def test_a_missing_redo_record_is_a_gap(store):
    for tick in (20, 21):
        with store.transaction():
            store.append("west", "", [(tick, "", "mutate", {}, "")])
    folded = store._redo.folded
    _as_killed(store)
    redo = RedoFile(store.path.parent / "w.db-redo", store.id, fsync=False, folded=folded)
    second = redo.unfolded_records()[1]
    redo.folded_to(second.n - 1)  # the first record gone
    redo.append(second.meta, second.blobs)
    redo.close()
    with pytest.raises(
        CorruptLogError, match=rf"commit {second.n - 1} is missing \(found {second.n}\)"
    ):
        WorldStore(store.path, create=False)


def test_a_fold_the_disk_refuses_fails_its_transaction_even_if_the_error_is_caught(store):
    for tick in (20, 21, 22):  # acknowledged commits: redo records
        with store.transaction():
            store.append("west", "", [(tick, "", "mutate", {}, f"acked{tick}")])
            store.set_head("west", "", tick)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(
        f"PRAGMA max_page_count = {pages + 3}"
    )  # room for the fold, not for the big event
    with pytest.raises(WorldError, match="nothing of this commit was kept: it failed earlier"):
        with store.transaction():
            store.append("west", "", [(30, "", "mutate", {"pad": "x" * 50000}, "big")])
            with pytest.raises(
                WorldError, match="could not write .*full"
            ):  # a read folds and writes: full
                store.count_checkpoints("west", "")
            with pytest.raises(WorldError, match="already failed"):  # no stale reads from here on
                store.events("west", "")
    store._db.execute("PRAGMA max_page_count = 1000000")
    assert store._redo.size > 0 and store._redo.unfolded  # the records wait for a fold that commits
    assert [e.provenance for e in store.events("west", "", first_tick=20)] == [
        "acked20",
        "acked21",
        "acked22",
    ]
    store.close()
    store = WorldStore(store.path, create=False)
    assert store.last_event("west", "") == (9, 22) and store.log("west", "").head == 22
    store.close()


def test_a_redo_file_that_cannot_be_read_fails_the_transaction_that_folds_it(store, monkeypatch):
    with store.transaction():
        store.set_head("west", "", 10)  # acknowledged: a redo record
    monkeypatch.setattr(
        store._redo, "unfolded_records", lambda: (_ for _ in ()).throw(WorldError("unreadable"))
    )
    with pytest.raises(WorldError, match="nothing of this commit was kept"), store.transaction():
        with pytest.raises(WorldError, match="unreadable"):
            store.set_meta("note", 1)
        with pytest.raises(WorldError, match="already failed"):  # not the stale head in the tables
            store.checkpoint("west", "", 10)
        store.set_head("west", "", 20)
    monkeypatch.undo()
    assert store.log("west", "").head == 10
    store.close()
    store = WorldStore(store.path, create=False)
    assert store.log("west", "").head == 10
    store.close()


def test_a_full_disk_on_a_read_that_folds_is_a_write_error_not_corruption(store):
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {"pad": "x" * 9000}, "kept")])
    store._db.execute(
        f"PRAGMA max_page_count = {store._db.execute('PRAGMA page_count').fetchone()[0]}"
    )
    with (
        pytest.raises(WorldFullError, match="could not write .*full") as raised,
        store.transaction(),
    ):
        store.checkpoint("west", "", 20)
    assert not isinstance(raised.value, CorruptWorldError)
    store._db.execute("PRAGMA max_page_count = 1000000")
    assert [e.provenance for e in store.events("west", "", first_tick=20)] == ["kept"]
    store.close()


def test_a_leftover_redo_file_stops_a_create_and_a_failed_create_leaves_no_file(
    tmp_path, monkeypatch
):
    (tmp_path / "w.db-redo").write_bytes(b"commits of a world whose file is gone")
    with pytest.raises(WorldError, match="w.db-redo is in the way"):
        WorldStore(tmp_path / "w.db", create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db-redo"]

    def unopenable(path, *args, **kwargs):  # a fault after the SQLite file was made
        raise WorldError(f"{path} cannot be opened (injected)")

    monkeypatch.setattr("sim.world._worldfiles.RedoFile", unopenable)
    with pytest.raises(WorldError, match="x.db-redo cannot be opened"):
        WorldStore(tmp_path / "x.db", create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db-redo"]


def test_a_write_that_fails_inside_a_transaction_fails_it_even_if_caught(store):
    store._db.execute(
        f"PRAGMA max_page_count = {store._db.execute('PRAGMA page_count').fetchone()[0]}"
    )
    with (
        pytest.raises(WorldError, match="nothing of this commit was kept: it failed earlier"),
        store.transaction(),
    ):
        store.append("west", "", [(20, "", "mutate", {}, "with it")])
        with pytest.raises(
            WorldError, match="could not write .*full"
        ):  # the store's error, not SQLite's
            store.put_template("<mujoco/>" + " " * 20000, "m" * 64)
        store.set_head("west", "", 30)
    store._db.execute("PRAGMA max_page_count = 1000000")
    assert store.last_event("west", "") == (6, 12) and store.log("west", "").head == 0


def test_a_fold_interrupted_after_its_commit_is_not_folded_again(store, monkeypatch):
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "once")])

    def interrupted(last):  # Ctrl-C between the fold's commit and the redo file learning of it
        raise KeyboardInterrupt

    monkeypatch.setattr(store._redo, "folded_to", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.fold()
    monkeypatch.undo()
    with store.transaction():
        store.append("west", "", [(21, "", "mutate", {}, "after")])
    store.fold()  # the SQLite file says the first record is in: only the second goes in now
    assert [e.provenance for e in store.events("west", "", first_tick=13)] == ["once", "after"]
    store.close()
    store = WorldStore(store.path, create=False)
    assert [e.provenance for e in store.events("west", "", first_tick=13)] == ["once", "after"]
    store.close()


def test_a_commit_interrupted_after_its_record_is_written_is_folded_before_its_log_is_read(
    store, monkeypatch
):
    real = store._redo.append

    def interrupted(meta, blobs):  # Ctrl-C just after the record reached the file
        real(meta, blobs)
        raise KeyboardInterrupt

    monkeypatch.setattr(store._redo, "append", interrupted)
    with pytest.raises(KeyboardInterrupt), store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "kept")])
    monkeypatch.undo()
    assert store.last_event("west", "") == (
        7,
        20,
    )  # read back from the file: no seq handed out twice
    with store.transaction():
        assert store.append("west", "", [(21, "", "mutate", {}, "next")])[0].seq == 8
    store.close()
    store = WorldStore(store.path, create=False)
    assert [e.provenance for e in store.events("west", "", first_tick=13)] == ["kept", "next"]
    store.close()


def test_an_empty_leftover_redo_file_does_not_stop_a_create(tmp_path):
    (tmp_path / "w.db-redo").touch()  # left by a create that died before writing anything
    WorldStore(tmp_path / "w.db", create=True).close()


STORE_CHILD = """
import sys
import sim.world._worldfiles
from sim.world._worldstore import WorldStore
sim.world._worldfiles.FOLD_BYTES = 2000  # folds every few commits, so kills land in folds too
store = WorldStore({path!r}, create=False)
tick = store.last_event("west", "")[1] + 1
while True:
    with store.transaction():
        store.append("west", "", [(tick, "", "mutate", {{"pad": "x" * (tick % 300)}}, "acked")])
        store.set_head("west", "", tick)
        if tick % 7 == 0:
            store.set_meta("note", tick)  # through SQLite, the redo file folded in first
    print(tick, flush=True)
    tick += 1
"""


def _killed_writer(child_source: str, path, tmp_path, seed: int) -> list[int]:
    """Run a child writing to the store at `path` until it has acknowledged some commits, SIGKILL
    it at some moment of its next ones, and return every tick it acknowledged before it died."""
    script = tmp_path / "child.py"
    script.write_text(child_source.format(path=str(path)))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked = [int(child.stdout.readline()) for _ in range(100 + 50 * seed)]
    time.sleep(random.Random(seed).uniform(0, 0.05))
    child.send_signal(signal.SIGKILL)
    acked += [int(line) for line in child.stdout.read().split()]
    child.wait()
    return acked


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_store_killed_at_any_moment_keeps_every_commit_it_acknowledged(store, tmp_path, seed):
    store.close()
    acked = _killed_writer(STORE_CHILD, store.path, tmp_path, seed)
    reopened = WorldStore(store.path, create=False)
    events = reopened.events("west", "", first_tick=13)
    ticks = [e.tick for e in events]
    assert (
        ticks[: len(acked)] == acked and len(ticks) <= len(acked) + 1
    )  # in order, once each; maybe one more
    assert [e.seq for e in events] == list(range(7, 7 + len(events)))
    assert reopened.log("west", "").head == ticks[-1]
    reopened.close()


CHECKPOINT_CHILD = """
import sys
import sim.world._worldfiles
from sim.world._worldrows import Checkpoint
from sim.world._worldstore import WorldStore
sim.world._worldfiles.FOLD_BYTES = 4000  # folds every few commits, so kills land in folds too
store = WorldStore({path!r}, create=False)
tick = store.last_event("west", "")[1] + 1
while True:
    with store.transaction():  # raw blobs in each record: the events' text and a state
        store.append("west", "", [(tick, "", "mutate", {{"quote": '"' * (tick % 50)}}, "acked")])
        state = tick.to_bytes(8, "little") * (1 + tick % 40)
        store.put_checkpoints("west", "", [Checkpoint(tick, "t" * 64, "m" * 64, [], state)])
        store.set_head("west", "", tick)
    print(tick, flush=True)
    tick += 1
"""


@pytest.mark.parametrize("seed", [4, 5])
def test_a_store_killed_while_writing_raw_blobs_keeps_every_commit_exactly(store, tmp_path, seed):
    store.close()
    acked = _killed_writer(CHECKPOINT_CHILD, store.path, tmp_path, seed)
    reopened = WorldStore(store.path, create=False)
    events = reopened.events("west", "", first_tick=13)
    assert [e.tick for e in events][: len(acked)] == acked and len(events) <= len(acked) + 1
    assert all(e.change == {"quote": '"' * (e.tick % 50)} for e in events)
    kept = reopened.checkpoints("west", "", 13, events[-1].tick)
    assert [c.tick for c in kept] == [e.tick for e in events]
    assert all(c.state == c.tick.to_bytes(8, "little") * (1 + c.tick % 40) for c in kept)
    reopened.close()

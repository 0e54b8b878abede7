import errno
import itertools
import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import CorruptCheckpointError, CorruptLogError, CorruptWorldError, WorldError, WorldLockedError
from sim._redo import RedoFile
from sim._worldstore import Checkpoint, Log, WorldStore


@pytest.fixture
def store(tmp_path):
    store = WorldStore(tmp_path / "w.db", create=True)
    with store.transaction():
        store.add_log(Log("west", "", 0, 0, "canonical"))
        store.put_checkpoints("west", "", [Checkpoint(10, "t" * 64, "m" * 64, [], b"\x01" * 16)])
    for ticks in ((0, 0), (5, 9, 9), (12,)):  # one commit each: segments of events 1..2, 3..5 and 6
        with store.transaction():
            store.append("west", "", [(t, "walker1", "mutate", {"target": "x", "op": "set", "value": [t]}, "test")
                                      for t in ticks])
    store.close()  # reopened, it reads the file: what a later session would see
    store = WorldStore(tmp_path / "w.db", create=False)
    yield store
    store.close()


def _sql(store, statement, *args):
    with sqlite3.connect(store.path) as db:
        db.execute(statement, args)


def test_events_read_back_in_order_and_by_tick(store):
    events = store.events("west", "")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6] and [e.tick for e in events] == [0, 0, 5, 9, 9, 12]
    assert [e.seq for e in store.events("west", "", first_tick=5, last_tick=9)] == [3, 4, 5]
    assert [e.seq for e in store.events("west", "", after_seq=4)] == [5, 6]
    assert store.last_seq("west", "", 9) == 5 and store.last_event("west", "") == (6, 12)
    assert store.checkpoint("west", "", 11).state == b"\x01" * 16 and store.checkpoint("west", "", 9) is None


def test_an_event_that_cannot_be_stored_is_refused_alone(store):
    with store.transaction():
        with pytest.raises(WorldError, match="event at tick 20 cannot be stored: Integer exceeds 64-bit range"):
            store.append("west", "", [(20, "", "mutate", {"value": [2**70]}, "huge")])
        with pytest.raises(WorldError, match="cannot be stored"):
            store.append("west", "", [(20, "", "mutate", {1: "a key that is no string"}, "bad")])
        assert store.append("west", "", [(20, "", "mutate", {"value": [1]}, "fine")])[0].seq == 7
    assert [e.provenance for e in store.events("west", "", first_tick=20)] == ["fine"]


def test_ticks_never_go_back_along_a_log(store):
    with pytest.raises(WorldError, match="tick 11 after tick 12"), store.transaction():
        store.append("west", "", [(11, "", "mutate", {}, "late")])
    assert store.last_event("west", "") == (6, 12)  # rolled back
    with store.transaction():
        assert store.append("west", "", [(12, "", "mutate", {}, "on time")])[0].seq == 7


def test_a_changed_segment_fails_its_checksum(store):
    _sql(store, "UPDATE segments SET events = replace(events, '9', '8') WHERE first_seq = 3")
    assert [e.seq for e in store.events("west", "", last_tick=4)] == [1, 2]  # the segment before is intact
    with pytest.raises(CorruptLogError, match=r"events 3..5 \(ticks 5..9\) fails its checksum"):
        store.events("west", "", first_tick=5)


def test_a_dropped_segment_breaks_the_chain(store):
    _sql(store, "DELETE FROM segments WHERE first_seq = 3")
    with pytest.raises(CorruptLogError, match=r"lacks events 3..5"):
        store.events("west", "")
    with pytest.raises(CorruptLogError, match=r"lacks events 3..5"):  # 6 no longer follows what is before it
        store.events("west", "", first_tick=12)


def test_segments_are_capped_and_a_transaction_reads_its_own_events(tmp_path):
    store = WorldStore(tmp_path / "w.db", create=True)
    with store.transaction():
        store.add_log(Log("west", "", 0, 0, "canonical"))
        store.append("west", "", [(t // 2, "", "mutate", {"i": t}, "") for t in range(600)])
        assert store.last_seq("west", "", 100) == 202  # read before the commit: written first
        store.append("west", "", [(300, "", "mutate", {"i": 600}, "")])
    with pytest.raises(RuntimeError), store.transaction():
        store.append("west", "", [(301, "", "mutate", {"i": 601}, "")])
        raise RuntimeError("rolled back")
    store.close()
    store = WorldStore(tmp_path / "w.db", create=False)
    sizes = [n for (n,) in store._db.execute("SELECT last_seq - first_seq + 1 FROM segments ORDER BY first_seq")]
    assert sizes == [256, 256, 88, 1] and store.last_event("west", "") == (601, 300)
    assert [e.change["i"] for e in store.events("west", "", first_tick=127, last_tick=128)] == [254, 255, 256, 257]
    assert [e.seq for e in store.events("west", "", after_seq=598)] == [599, 600, 601]
    store.close()


def test_a_changed_checkpoint_fails_its_checksum(store):
    _sql(store, "UPDATE checkpoints SET state = ? WHERE tick = 10", b"\x02" * 16)
    with pytest.raises(CorruptCheckpointError, match="tick 10 fails its checksum"):
        store.checkpoint("west", "", 10)


def test_heads_templates_and_settings_are_checked_too(store):
    with store.transaction():
        store.set_meta("checkpoint_every", 100)
        store.put_template("<mujoco/>", "m" * 64)
        store.add_shard("west", "<mujoco/>")
    source = store.put_template("<mujoco/>", "m" * 64)
    store.close()  # what a session reads from the file, not what it wrote
    _sql(store, "UPDATE logs SET head = 99")
    store = WorldStore(store.path, create=False)
    with pytest.raises(CorruptLogError, match="head of log west/canonical"):
        store.log("west", "")
    _sql(store, "UPDATE templates SET model_hash = ?", "x" * 64)
    with pytest.raises(CorruptWorldError, match="fails its checksum"):
        store.template(source)
    _sql(store, "UPDATE meta SET value = '1' WHERE key = 'checkpoint_every'")
    with pytest.raises(CorruptWorldError, match="checkpoint_every"):
        store.meta("checkpoint_every")
    _sql(store, "UPDATE shards SET scene = '<mujoco></mujoco>'")
    with pytest.raises(CorruptWorldError, match="scene of shard 'west'"):
        store.shards()
    store.close()


def test_one_process_at_a_time_and_files_that_are_no_world(store, tmp_path):
    with pytest.raises(WorldLockedError, match="open in another process"):
        WorldStore(store.path, create=False)
    with pytest.raises(WorldError, match="already exists"):
        WorldStore(store.path, create=True)
    with pytest.raises(WorldError, match="holds no world"):
        WorldStore(tmp_path / "none.db", create=False)
    old = tmp_path / "old.db"  # a world of an earlier format is refused, not misread
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('format', 'simnet.world/2')")
    with pytest.raises(CorruptWorldError, match="unknown world format 'simnet.world/2'"):
        WorldStore(old, create=False)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(CorruptWorldError, match="not a readable world"):
        WorldStore(junk, create=False)


def test_pruning_keeps_the_chain_anchored_and_the_head(store):
    with store.transaction():
        store.prune("west", "", 10)  # before the checkpoint at 10: segments 1..2 and 3..5 end earlier
    store.close()
    store = WorldStore(store.path, create=False)
    log = store.log("west", "")
    assert (log.base_tick, log.anchor_seq, log.anchor_tick) == (10, 5, 9)
    assert [e.seq for e in store.events("west", "")] == [6] and store.last_event("west", "") == (6, 12)
    assert store.last_seq("west", "", 11) == 5 and store.checkpoint("west", "", 11).tick == 10
    with store.transaction():
        store.prune("west", "", 13)  # every segment gone: head and chain continue from the anchor
    with store.transaction():
        (event,) = store.append("west", "", [(20, "", "mutate", {}, "after")])
    store.close()
    store = WorldStore(store.path, create=False)
    assert event.seq == 7 and [e.seq for e in store.events("west", "")] == [7]
    store.close()
    _sql(store, "UPDATE logs SET anchor = 'x'")
    store = WorldStore(store.path, create=False)
    with pytest.raises(CorruptLogError, match="head of log"):
        store.events("west", "")
    store.close()


def test_a_head_rides_in_the_segment_its_commit_writes(store):
    def head_on_file():
        store.close()
        reopened = WorldStore(store.path, create=False)
        try:
            return reopened.log("west", "").head
        finally:
            reopened.close()

    with store.transaction():  # events and an advance: the new head is in the new segment, the row keeps its own
        store.append("west", "", [(15, "", "mutate", {}, "x")])
        store.set_head("west", "", 20)
    store.fold()  # from the redo file into the tables
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT head FROM logs").fetchall() == [(0,)]
        assert db.execute("SELECT head FROM segments WHERE first_seq = 7").fetchall() == [(20,)]
    assert head_on_file() == 20
    store = WorldStore(store.path, create=False)
    with store.transaction():  # an advance alone: the row
        store.set_head("west", "", 30)
    with pytest.raises(RuntimeError), store.transaction():
        store.set_head("west", "", 40)
        raise RuntimeError("rolled back")
    assert store.log("west", "").head == 30 and head_on_file() == 30
    _sql(store, "UPDATE segments SET head = 99 WHERE first_seq = 7")  # a head later than the row's, forged
    store = WorldStore(store.path, create=False)
    with pytest.raises(CorruptLogError, match=r"events 7..7 \(ticks 15..15\) fails its checksum"):
        store.log("west", "")
    store.close()


def test_a_commit_the_disk_refuses_keeps_nothing_and_the_log_goes_on(store):
    with store.transaction():  # a twin's commit: into the redo file
        store.append("west", "", [(15, "", "mutate", {}, "kept")])
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # a full disk, as SQLite sees it
    with pytest.raises(WorldError, match="could not write .*full.*nothing of this commit was kept"), store.transaction():
        store.set_head("west", "", 50)
        store.append("west", "", [(t, "", "mutate", {"pad": "x" * 3000}, "big") for t in range(20, 60)])
        store.set_meta("note", "a setting: this commit goes through SQLite, folding the redo file in")
    assert store._redo.size > 0  # the fold was rolled back with it: the record waits in the redo file
    assert store.last_event("west", "") == (7, 15) and store.log("west", "").head == 0  # (a read folds it in)
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
        pwrite(fd, data[:len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(WorldError, match="could not be written .*No space left.*nothing of it was kept"), \
            store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "lost")])
        store.set_head("west", "", 30)
    assert os.path.getsize(store._redo.path) == size == store._redo.size  # no torn record before the next one
    assert store.last_event("west", "") == (6, 12) and store.log("west", "").head == 0
    monkeypatch.undo()
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "after")])
    store.close()
    store = WorldStore(store.path, create=False)
    assert [e.provenance for e in store.events("west", "", first_tick=13)] == ["after"]
    store.close()


changes = st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-2**63, 2**63 - 1),
                                                         st.floats(allow_nan=False, allow_infinity=False),
                                                         st.text(max_size=8), st.lists(st.floats(-1, 1), max_size=3)),
                          max_size=3)
commits = st.lists(st.tuples(st.sampled_from(["west", "east"]),
                             st.lists(st.tuples(st.integers(0, 3), changes), min_size=0, max_size=300),
                             st.sampled_from(["none", "before", "after", "rolled back"])), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=commits, query=st.tuples(st.integers(0, 400), st.integers(0, 400), st.integers(0, 900)),
       prune_at=st.integers(0, 400), reopen=st.sampled_from(["no", "closed", "killed"]))
def test_segments_read_back_what_was_appended_however_it_was_committed(tmp_path_factory, commits, query, prune_at,
                                                                         reopen):
    """A model of two logs (lists) and their heads against the store: any commits, each to one log, moving its
    head before or after its events are read back (or not at all, or rolled back), any range read, pruning,
    reopening (after a close, or as a killed process leaves the files: the redo file not folded in)."""
    path = tmp_path_factory.mktemp("w") / "w.db"
    store = WorldStore(path, create=True)
    with store.transaction():
        for shard in ("west", "east"):
            store.add_log(Log(shard, "", 0, 0, "canonical"))
    models, ticks, heads = {"west": [], "east": []}, {"west": 0, "east": 0}, {"west": 0, "east": 0}
    for shard, commit, moves in commits:
        model = models[shard]
        if moves == "rolled back":  # events and a head that never happened: the caches forget everything
            with pytest.raises(RuntimeError), store.transaction():
                store.set_head(shard, "", heads[shard] + 1000)
                at = list(itertools.accumulate((step for step, _ in commit), initial=ticks[shard]))[1:]
                store.append(shard, "", [(t, "", "mutate", change, "p") for t, (_, change) in zip(at, commit)])
                raise RuntimeError("rolled back")
            assert {s: store.log(s, "").head for s in heads} == heads  # read back from the files
            continue
        with store.transaction():
            if moves == "before":  # a head the segment written below carries
                heads[shard] += 7
                store.set_head(shard, "", heads[shard])
            for step, change in commit:
                ticks[shard] += step
                model.append((len(model) + 1, ticks[shard], "", "mutate", change, "p"))
                store.append(shard, "", [model[-1][1:]])
            if moves == "after":  # a read from the file writes the segment first: this head goes to the log's row
                store.last_seq(shard, "", ticks[shard])
                heads[shard] += 7
                store.set_head(shard, "", heads[shard])
    if reopen != "no":
        _as_killed(store) if reopen == "killed" else store.close()
        store = WorldStore(path, create=False)
    first, last, after = min(query[:2]), max(query[:2]), query[2]
    for shard, model in models.items():
        assert store.log(shard, "").head == heads[shard]
        expected = [e for e in model if first <= e[1] <= last and e[0] > after]
        assert [tuple(e) for e in store.events(shard, "", first_tick=first, last_tick=last, after_seq=after)] == expected
        assert store.last_seq(shard, "", last) == max([e[0] for e in model if e[1] <= last], default=0)
    with store.transaction():
        store.prune("west", "", prune_at)
    model = models["west"]
    kept = [tuple(e) for e in store.events("west", "", first_tick=prune_at)]
    assert kept == [e for e in model if e[1] >= prune_at] and store.last_event("west", "") == (
        (model[-1][0], model[-1][1]) if model else (0, 0))
    store.close()
    store = WorldStore(path, create=False)
    assert {s: store.log(s, "").head for s in heads} == heads  # pruning kept west's, in the row or a kept segment
    assert [tuple(e) for e in store.events("east", "")] == models["east"]
    store.close()


def _as_killed(store):
    """Close a store as a killed process leaves its files: the redo file not folded in."""
    store._redo.unfolded = False
    store.close()


def _segments(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT first_seq, last_seq, head FROM segments ORDER BY first_seq").fetchall()


def test_a_twins_commits_wait_in_the_redo_file_until_folded(store, monkeypatch):
    monkeypatch.setattr("sim._worldstore.FOLD_BYTES", 1000)
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
    assert _segments(store.path)[-3:] == [(7, 7, 21), (8, 8, 31), (9, 9, 31)] and store._redo.size == 0
    store.close()
    store = WorldStore(store.path, create=False)
    assert [e.tick for e in store.events("west", "", first_tick=13)] == [20, 30, 40]
    assert store.log("west", "").head == 50
    store.close()


def test_a_fold_whose_file_could_not_be_emptied_is_not_folded_twice(store, monkeypatch):
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {}, "once")])
        store.put_checkpoints("west", "", [Checkpoint(20, "t" * 64, "m" * 64, [], b"\x03" * 16)])

    def fail(fd, length):  # a fault: the process dies between the fold's commit and emptying the file
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
    data[-5] ^= 1  # in the last record's payload
    redo.write_bytes(bytes(data))
    tables = _segments(store.path)
    with pytest.raises(CorruptLogError, match="w.db-redo: the commit at byte .* fails its checksum"):
        WorldStore(store.path, create=False)
    assert redo.read_bytes() == data and _segments(store.path) == tables


def test_a_missing_redo_record_is_a_gap(store):
    for tick in (20, 21):
        with store.transaction():
            store.append("west", "", [(tick, "", "mutate", {}, "")])
    folded = store._redo.folded
    _as_killed(store)
    redo = RedoFile(store.path.parent / "w.db-redo", store.id, fsync=False, folded=folded)
    second = redo.unfolded_records()[1]
    redo.folded_to(second["n"] - 1)  # the first record gone
    redo.append({key: value for key, value in second.items() if key != "n"})
    redo.close()
    with pytest.raises(CorruptLogError, match=rf"commit {second['n'] - 1} is missing \(found {second['n']}\)"):
        WorldStore(store.path, create=False)


def test_a_fold_the_disk_refuses_fails_its_transaction_even_if_the_error_is_caught(store):
    for tick in (20, 21, 22):  # acknowledged commits: redo records
        with store.transaction():
            store.append("west", "", [(tick, "", "mutate", {}, f"acked{tick}")])
            store.set_head("west", "", tick)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 3}")  # room for the fold, not for the big event
    with pytest.raises(WorldError, match="nothing of this commit was kept: it failed earlier"):
        with store.transaction():
            store.append("west", "", [(30, "", "mutate", {"pad": "x" * 50000}, "big")])
            with pytest.raises(WorldError, match="could not write .*full"):  # a read folds and writes: full
                store.count_checkpoints("west", "")
            with pytest.raises(WorldError, match="already failed"):  # no stale reads from here on
                store.events("west", "")
    store._db.execute("PRAGMA max_page_count = 1000000")
    assert store._redo.size > 0 and store._redo.unfolded  # the records wait for a fold that commits
    assert [e.provenance for e in store.events("west", "", first_tick=20)] == ["acked20", "acked21", "acked22"]
    store.close()
    store = WorldStore(store.path, create=False)
    assert store.last_event("west", "") == (9, 22) and store.log("west", "").head == 22
    store.close()


def test_a_redo_file_that_cannot_be_read_fails_the_transaction_that_folds_it(store, monkeypatch):
    with store.transaction():
        store.set_head("west", "", 10)  # acknowledged: a redo record
    monkeypatch.setattr(store._redo, "unfolded_records", lambda: (_ for _ in ()).throw(WorldError("unreadable")))
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


def test_ticks_and_heads_that_sqlite_cannot_hold_are_refused_before_they_are_logged(store):
    with store.transaction():
        with pytest.raises(WorldError, match=r"tick 9223372036854775808 is not an int in 0..2\*\*63-1"):
            store.append("west", "", [(2**63, "", "mutate", {}, "")])
        with pytest.raises(WorldError, match=r"head -1 is not an int"):
            store.set_head("west", "", -1)
        store.set_head("west", "", 2**63 - 1)
    store.close()
    store = WorldStore(store.path, create=False)
    assert store.log("west", "").head == 2**63 - 1
    store.close()


def test_a_full_disk_on_a_read_that_folds_is_a_write_error_not_corruption(store):
    with store.transaction():
        store.append("west", "", [(20, "", "mutate", {"pad": "x" * 9000}, "kept")])
    store._db.execute(f"PRAGMA max_page_count = {store._db.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(WorldError, match="could not write .*full") as raised, store.transaction():
        store.checkpoint("west", "", 20)
    assert not isinstance(raised.value, CorruptWorldError)
    store._db.execute("PRAGMA max_page_count = 1000000")
    assert [e.provenance for e in store.events("west", "", first_tick=20)] == ["kept"]
    store.close()


def test_a_leftover_redo_file_stops_a_create_and_a_failed_create_leaves_no_file(tmp_path, monkeypatch):
    (tmp_path / "w.db-redo").write_bytes(b"commits of a world whose file is gone")
    with pytest.raises(WorldError, match="w.db-redo is in the way"):
        WorldStore(tmp_path / "w.db", create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db-redo"]

    def unopenable(path, *args, **kwargs):  # a fault after the SQLite file was made
        raise WorldError(f"{path} cannot be opened (injected)")
    monkeypatch.setattr("sim._worldstore.RedoFile", unopenable)
    with pytest.raises(WorldError, match="x.db-redo cannot be opened"):
        WorldStore(tmp_path / "x.db", create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db-redo"]

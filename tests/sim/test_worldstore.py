"""The store's rows: logs, segments, heads, checkpoints, settings, and what a changed row does."""

import itertools
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import CorruptCheckpointError, CorruptLogError, CorruptWorldError, WorldError
from sim.world._worldrows import Log
from sim.world._worldstore import WorldStore


def _sql(store, statement, *args):
    with sqlite3.connect(store.path) as db:
        db.execute(statement, args)


def test_events_read_back_in_order_and_by_tick(store):
    events = store.events("west", "")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6] and [e.tick for e in events] == [
        0,
        0,
        5,
        9,
        9,
        12,
    ]
    assert [e.seq for e in store.events("west", "", first_tick=5, last_tick=9)] == [3, 4, 5]
    assert [e.seq for e in store.events("west", "", after_seq=4)] == [5, 6]
    assert store.last_seq("west", "", 9) == 5 and store.last_event("west", "") == (6, 12)
    assert (
        store.checkpoint("west", "", 11).state == b"\x01" * 16
        and store.checkpoint("west", "", 9) is None
    )


def test_an_event_that_cannot_be_stored_is_refused_alone(store):
    with store.transaction():
        with pytest.raises(
            WorldError, match="event at tick 20 cannot be stored: Integer exceeds 64-bit range"
        ):
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
    assert [e.seq for e in store.events("west", "", last_tick=4)] == [
        1,
        2,
    ]  # the segment before is intact
    with pytest.raises(CorruptLogError, match=r"events 3..5 \(ticks 5..9\) fails its checksum"):
        store.events("west", "", first_tick=5)


def test_a_dropped_segment_breaks_the_chain(store):
    _sql(store, "DELETE FROM segments WHERE first_seq = 3")
    with pytest.raises(CorruptLogError, match=r"lacks events 3..5"):
        store.events("west", "")
    with pytest.raises(
        CorruptLogError, match=r"lacks events 3..5"
    ):  # 6 no longer follows what is before it
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
    sizes = [
        n
        for (n,) in store._db.execute(
            "SELECT last_seq - first_seq + 1 FROM segments ORDER BY first_seq"
        )
    ]
    assert sizes == [256, 256, 88, 1] and store.last_event("west", "") == (601, 300)
    assert [e.change["i"] for e in store.events("west", "", first_tick=127, last_tick=128)] == [
        254,
        255,
        256,
        257,
    ]
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
    with pytest.raises(CorruptLogError, match="row of log west/canonical"):
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


def test_pruning_keeps_the_chain_anchored_and_the_head(store):
    with store.transaction():
        store.prune(
            "west", "", 10
        )  # before the checkpoint at 10: segments 1..2 and 3..5 end earlier
    store.close()
    store = WorldStore(store.path, create=False)
    log = store.log("west", "")
    assert (log.base_tick, log.anchor_seq, log.anchor_tick) == (10, 5, 9)
    assert [e.seq for e in store.events("west", "")] == [6] and store.last_event("west", "") == (
        6,
        12,
    )
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
    with pytest.raises(CorruptLogError, match="row of log"):
        store.events("west", "")
    store.close()


def test_a_logs_row_holds_its_head_and_newest_segment_so_a_dropped_newest_segment_is_found(store):
    def head_on_file():
        store.close()
        reopened = WorldStore(store.path, create=False)
        try:
            return reopened.log("west", "").head
        finally:
            reopened.close()

    with (
        store.transaction()
    ):  # events and an advance: the row gets the new head and the new segment's checksum
        store.append("west", "", [(15, "", "mutate", {}, "x")])
        store.set_head("west", "", 20)
    store.fold()  # from the redo file into the tables
    with sqlite3.connect(store.path) as db:
        ((newest,),) = db.execute("SELECT checksum FROM segments WHERE first_seq = 7").fetchall()
        assert db.execute("SELECT head, tip FROM logs").fetchall() == [(20, newest)]
    assert head_on_file() == 20
    store = WorldStore(store.path, create=False)
    with store.transaction():  # an advance alone
        store.set_head("west", "", 30)
    with pytest.raises(RuntimeError), store.transaction():
        store.set_head("west", "", 40)
        raise RuntimeError("rolled back")
    assert store.log("west", "").head == 30 and head_on_file() == 30
    _sql(
        store, "DELETE FROM segments WHERE first_seq = 7"
    )  # the newest segment, dropped: the rest still chains
    store = WorldStore(store.path, create=False)
    with pytest.raises(
        CorruptLogError, match="its newest segment is missing, or is not the one its row records"
    ):
        store.log("west", "")
    store.close()


changes = st.dictionaries(
    st.text(max_size=5),
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
        st.lists(st.floats(-1, 1), max_size=3),
    ),
    max_size=3,
)
commits = st.lists(
    st.tuples(
        st.sampled_from(["west", "east"]),
        st.lists(st.tuples(st.integers(0, 3), changes), min_size=0, max_size=300),
        st.sampled_from(["none", "before", "after", "rolled back"]),
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    commits=commits,
    query=st.tuples(st.integers(0, 400), st.integers(0, 400), st.integers(0, 900)),
    prune_at=st.integers(0, 400),
    reopen=st.sampled_from(["no", "closed", "killed"]),
)
def test_segments_read_back_what_was_appended_however_it_was_committed(
    tmp_path_factory, commits, query, prune_at, reopen
):
    """A model of two logs (lists) and their heads against the store: any commits, each to one log,
    moving its head before or after its events are read back (or not at all, or rolled back), any
    range read, pruning, reopening (after a close, or as a killed process leaves the files: the redo
    file not folded in)."""
    path = tmp_path_factory.mktemp("w") / "w.db"
    store = WorldStore(path, create=True)
    with store.transaction():
        for shard in ("west", "east"):
            store.add_log(Log(shard, "", 0, 0, "canonical"))
    models, ticks, heads = {"west": [], "east": []}, {"west": 0, "east": 0}, {"west": 0, "east": 0}
    for shard, commit, moves in commits:
        model = models[shard]
        if (
            moves == "rolled back"
        ):  # events and a head that never happened: the caches forget everything
            with pytest.raises(RuntimeError), store.transaction():
                store.set_head(shard, "", heads[shard] + 1000)
                at = list(itertools.accumulate((step for step, _ in commit), initial=ticks[shard]))[
                    1:
                ]
                store.append(
                    shard,
                    "",
                    [
                        (t, "", "mutate", change, "p")
                        for t, (_, change) in zip(at, commit, strict=True)
                    ],
                )
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
            if (
                moves == "after"
            ):  # a read from the file writes the segment first: this head goes to the log's row
                store.last_seq(shard, "", ticks[shard])
                heads[shard] += 7
                store.set_head(shard, "", heads[shard])
    if reopen != "no":
        if reopen == "killed":  # as a killed process leaves the files: the redo file not folded in
            store._redo.unfolded = False
        store.close()
        store = WorldStore(path, create=False)
    first, last, after = min(query[:2]), max(query[:2]), query[2]
    for shard, model in models.items():
        assert store.log(shard, "").head == heads[shard]
        expected = [e for e in model if first <= e[1] <= last and e[0] > after]
        read = store.events(shard, "", first_tick=first, last_tick=last, after_seq=after)
        assert [tuple(e) for e in read] == expected
        assert store.last_seq(shard, "", last) == max(
            [e[0] for e in model if e[1] <= last], default=0
        )
    with store.transaction():
        store.prune("west", "", prune_at)
    model = models["west"]
    kept = [tuple(e) for e in store.events("west", "", first_tick=prune_at)]
    assert kept == [e for e in model if e[1] >= prune_at] and store.last_event("west", "") == (
        (model[-1][0], model[-1][1]) if model else (0, 0)
    )
    store.close()
    store = WorldStore(path, create=False)
    assert {
        s: store.log(s, "").head for s in heads
    } == heads  # pruning kept west's, in the row or a kept segment
    assert [tuple(e) for e in store.events("east", "")] == models["east"]
    store.close()


def test_ticks_and_heads_that_sqlite_cannot_hold_are_refused_before_they_are_logged(store):
    with store.transaction():
        with pytest.raises(
            WorldError, match=r"tick 9223372036854775808 is not an int in 0..2\*\*63-1"
        ):
            store.append("west", "", [(2**63, "", "mutate", {}, "")])
        with pytest.raises(WorldError, match=r"head -1 is not an int"):
            store.set_head("west", "", -1)
        store.set_head("west", "", 2**63 - 1)
    store.close()
    store = WorldStore(store.path, create=False)
    assert store.log("west", "").head == 2**63 - 1
    store.close()


def test_an_empty_append_keeps_the_head_moved_beside_it(store):
    with store.transaction():
        store.set_head("west", "", 50)
        assert store.append("west", "", []) == []
    store.close()
    store = WorldStore(store.path, create=False)
    assert store.log("west", "").head == 50
    store.close()

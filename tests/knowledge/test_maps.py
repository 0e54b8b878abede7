"""Tests for knowledge._maps: kb.maps[name], per-cell and batched (tiled) writes, on real stores.

The property at the end is the equivalence the tiles must keep: writers interleaving batches, single
observations and tombstones, replicas receiving their envelopes in random orders and pages, and
every replica showing, per cell, exactly what the per-cell rule gives over the observations it
holds (each writer's newest, then the highest (confidence, hlc, author key)).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import HybridClock, Identity, RecordError, TrustPolicy
from knowledge._records import record_limits


def identity(i: int) -> Identity:
    return Identity.from_seed(bytes([i + 1]) * 32, new=True)


@pytest.fixture
def kb():
    with knowledge.open(":memory:", identity(0)) as opened:
        yield opened


def test_observe_many_writes_tiles_that_get_cells_and_region_read(kb):
    floor = kb.maps["floor"]
    hlc = floor.observe_many([(0, 0), (0, 1), (100, -3)], ["a", {"b": 1}, None], [0.5, 0.6, 0.7])
    assert hlc > 0
    assert floor.get((0, 1)).value == {"b": 1} and floor.get("0,1").hlc == hlc
    assert floor.get((100, -3)).value is None and not floor.get((100, -3)).deleted
    assert list(floor.cells()) == ["0,0", "0,1", "100,-3"]
    found = floor.region((0, -5), (101, 1))
    assert sorted(map(tuple, found.cells.tolist())) == [(0, 0), (100, -3)]
    assert set(found.authors) == {kb.identity.public_key_hex}
    assert kb.maps.names() == ["floor"]
    assert floor.observe_many([], [], []) == 0


def test_a_palette_names_values_by_index_and_tombstones_hide_cells(kb):
    floor = kb.maps["floor"]
    cells = np.array([(x, y) for x in range(70) for y in range(70)])  # over four tiles
    codes = (cells[:, 0] % 3).astype(np.int32)
    floor.observe_many(cells, codes, 0.5, palette=["wall", "floor", {"door": True}])
    assert floor.get((4, 9)).value == "floor" and floor.get((5, 0)).value == {"door": True}
    floor.delete_many(cells[:100], 0.9)
    assert floor.get((0, 5)).deleted and floor.get((0, 5)).value is None
    assert len(floor.cells()) == 4900 - 100 and len(floor.cells(include_deleted=True)) == 4900
    assert len(floor.region((0, 0), (70, 70))) == 4800
    assert len(floor.region((0, 0), (70, 70), include_deleted=True)) == 4900


def test_a_writers_newest_observation_of_a_cell_counts_however_it_wrote_it(kb):
    floor = kb.maps["floor"]
    floor.observe((3, 4), "by a cell record", 0.9)
    floor.observe_many([(3, 4)], ["by a tile"], 0.2)
    assert floor.get((3, 4)).value == "by a tile"  # newer, although less confident
    floor.observe((3, 4), "by a cell record again", 0.1)
    assert floor.get((3, 4)).value == "by a cell record again"
    floor.observe_many([(3, 5)], ["other"], 0.2)  # the tile is rewritten: (3, 4) keeps its time
    assert floor.get((3, 4)).value == "by a cell record again"


def test_a_bad_batch_writes_nothing(kb):
    floor = kb.maps["floor"]
    with pytest.raises(RecordError, match="finite number"):
        floor.observe_many([(0, 0), (1, 1)], ["a", "b"], [0.5, float("nan")])
    with pytest.raises(RecordError, match="refused by peers"):  # the second tile is too large
        floor.observe_many([(0, 0), (64, 0)], ["fine", "x" * 300_000], 0.5)
    assert kb.heads() == {} and floor.cells() == {}


def test_a_large_batch_travels_in_envelopes_within_the_limit_and_a_batch_block_in_one(kb):
    floor = kb.maps["floor"]
    rng = np.random.default_rng(1)
    cells = np.array([(x, y) for x in range(512) for y in range(512)])
    floor.observe_many(cells, rng.integers(0, 1000, len(cells)), rng.uniform(0, 1, len(cells)))
    envelopes = kb.envelopes_since({})
    assert len(envelopes) > 1
    assert all(len(e) <= kb.limits.max_envelope_bytes for e in envelopes)
    with kb.batch():
        floor.observe_many([(0, 0)], ["a"], 1.0)
        floor.observe_many([(0, 1), (1000, 0)], ["b", "c"], 1.0)
        floor.observe((0, 2), "d", 1.0)
    assert len(kb.envelopes_since({})) == len(envelopes) + 1
    assert [floor.get((0, y)).value for y in range(3)] == ["a", "b", "d"]


def test_a_cell_named_with_a_semicolon_is_a_named_cell_wherever_it_arrives(tmp_path):
    """'5;6' is a name, not two cells: written between coordinate cells and ingested envelope by
    envelope, it neither raises nor stops the envelopes after it (a review found both)."""
    a = knowledge.open(tmp_path / "a.db", identity(0))
    b = knowledge.open(
        tmp_path / "b.db", identity(1), policy=TrustPolicy().with_root(identity(0).public_key)
    )
    floor = a.maps["floor"]
    for cell in [(1, 2), "5;6", "3,4;5,6", (7, 8)]:
        floor.observe(cell, "seen", 0.5)
    for envelope in a.envelopes_since(b.heads()):
        report = b.ingest([envelope])
        assert not report.rejected and not report.record_issues
    assert b.snapshot()["cells"] == a.snapshot()["cells"]
    assert sorted(map(str, b.maps["floor"].cells())) == sorted(map(str, floor.cells()))
    assert len(floor.cells()) == 4
    a.close()
    b.close()


def test_tiles_replicate_and_reopen_from_snapshots_and_from_a_replay(tmp_path):
    a = knowledge.open(tmp_path / "a.db", identity(0))
    b = knowledge.open(
        tmp_path / "b.db", identity(1), policy=TrustPolicy().with_root(identity(0).public_key)
    )
    floor = a.maps["floor"]
    floor.observe((1, 1), "legacy", 0.5)
    floor.observe("door", "named", 0.5)
    floor.observe_many([(1, 2), (-70, 3)], ["x", "y"], 0.5)
    report = b.ingest(a.envelopes_since(b.heads()))
    assert not report.rejected and not report.record_issues
    expected = a.snapshot()
    assert b.snapshot()["cells"] == expected["cells"] and len(expected["cells"]) == 4
    a.close()
    b.close()
    with knowledge.open(tmp_path / "a.db", identity(0)) as again:
        assert again._replica.views_snapshotted is not None  # from its snapshots
        assert again.snapshot() == expected
        found = again.maps["floor"].region((-100, 0), (100, 10))
        assert sorted(found.cells.tolist()) == [[-70, 3], [1, 1], [1, 2]]
    store = knowledge._store.Store(tmp_path / "a.db")
    with store.transaction():
        store.delete_snapshots()
    store.close()
    with knowledge.open(tmp_path / "a.db", identity(0)) as replayed:
        assert replayed.snapshot() == expected


def test_a_store_of_per_cell_records_opens_merges_and_replicates_with_tiles(tmp_path):
    """What stores written before tiles hold stays: their cell records merge with tiles."""
    old = knowledge.open(tmp_path / "old.db", identity(0))
    for x in range(100):
        old.maps["floor"].observe((x, 0), "old", 0.5)
    old.close()
    with knowledge.open(tmp_path / "old.db", identity(0)) as kb:
        floor = kb.maps["floor"]
        assert len(floor.region((0, 0), (100, 1))) == 100
        floor.observe_many([(x, 0) for x in range(50)], ["new"] * 50, 0.1)
        assert [floor.get((x, 0)).value for x in (0, 49, 50, 99)] == ["new", "new", "old", "old"]
        policy = TrustPolicy().with_root(identity(0).public_key)
        with knowledge.open(tmp_path / "new.db", identity(1), policy=policy) as peer:
            peer.ingest(kb.envelopes_since(peer.heads()))
            assert peer.snapshot()["cells"] == kb.snapshot()["cells"]


def test_tiles_count_only_from_writers_with_the_publish_role(tmp_path):
    device = identity(5)
    with knowledge.open(":memory:", identity(0)) as site:
        site.delegate(device.public_key, ["validate"])
        robot = knowledge.open(
            ":memory:", device, policy=TrustPolicy().for_device_of(site.identity.public_key)
        )
        robot.ingest(site.envelopes_since(robot.heads()))
        robot.learn_site_heads(site.heads())
        with pytest.raises(knowledge.NotAuthorizedError):
            robot.maps["floor"].observe_many([(0, 0)], ["x"], 0.5)
        robot.close()


# --- equivalence with the per-cell rule ------------------------------------------------------

WRITERS = 3
CELLS = [(0, 0), (0, 1), (0, 64), (-1, 0), (63, 63), (64, 64)]  # over four tiles
VALUES = [None, 0, "wall", {"label": "door"}]
confidence = st.sampled_from([0.0, 0.5, 1.0])  # ties are common: the time and the key decide
op = st.one_of(
    st.tuples(
        st.just("many"),
        st.integers(0, WRITERS - 1),
        st.lists(
            st.tuples(st.sampled_from(CELLS), st.sampled_from(VALUES)), min_size=1, max_size=5
        ),
        confidence,
    ),
    st.tuples(
        st.just("delete_many"),
        st.integers(0, WRITERS - 1),
        st.lists(st.sampled_from(CELLS), min_size=1, max_size=3),
        confidence,
    ),
    st.tuples(
        st.just("one"),
        st.integers(0, WRITERS - 1),
        st.sampled_from(CELLS),
        st.sampled_from(VALUES),
        confidence,
    ),
    st.tuples(st.just("delete"), st.integers(0, WRITERS - 1), st.sampled_from(CELLS), confidence),
    st.tuples(
        st.just("sync"),
        st.integers(0, WRITERS),  # the last one is a replica that only receives
        st.integers(0, WRITERS),
        st.integers(1, 3),
    ),
    st.just(("tick",)),
)


def _expected(log, heads: dict[str, int]) -> dict[str, tuple]:
    """Per cell: the per-cell rule over the observations whose envelopes a replica holds."""
    newest: dict[tuple[str, str], tuple] = {}
    for author, seq, cell, value, conf, hlc, deleted in log:
        if seq <= heads.get(author, 0):
            mine = newest.get((author, cell))
            if mine is None or hlc > mine[3]:
                newest[(author, cell)] = (author, value, conf, hlc, deleted)
    best: dict[str, tuple] = {}
    for (_author, cell), (author, value, conf, hlc, deleted) in newest.items():
        if cell not in best or (conf, hlc, bytes.fromhex(author)) > (
            best[cell][1],
            best[cell][2],
            bytes.fromhex(best[cell][3]),
        ):
            best[cell] = (None if deleted else value, conf, hlc, author, deleted)
    return best


def _shown(kb) -> dict[str, tuple]:
    floor = kb.maps["floor"]
    cells = {
        name: (o.value, o.confidence, o.hlc, o.author, o.deleted)
        for name, o in floor.cells(include_deleted=True).items()
    }
    found = floor.region((-100, -100), (100, 100), include_deleted=True)
    assert {found.observation(i).cell: found.observation(i) for i in range(len(found))} == {
        name: floor.get(name) for name in cells
    }
    return cells


@settings(max_examples=int(os.environ.get("SIMNET_MAP_EXAMPLES", "60")), deadline=None)
@given(st.lists(op, max_size=30))
def test_replicas_show_the_per_cell_rule_over_what_they_hold(ops):
    now = [1_700_000_000_000]
    ids = [identity(i) for i in range(WRITERS + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        kbs = []
        for i, me in enumerate(ids):
            policy = TrustPolicy()
            for other in ids[:WRITERS]:
                if other is not me:
                    policy = policy.with_root(other.public_key)
            clock = HybridClock(physical_ms=lambda: now[0])  # shared and slow: times tie
            path = Path(tmp) / "replica.db" if i == WRITERS else ":memory:"  # it reopens
            kbs.append(knowledge.open(path, me, policy=policy, clock=clock))
        log: list[tuple] = []
        try:
            for operation in ops:
                _run(operation, kbs, log, now)
            for kb in kbs:
                heads = {a: h.seq for a, h in kb.heads().items()}
                assert _shown(kb) == _expected(log, heads)
            for kb in kbs[1:]:  # everything everywhere: every replica the same
                _pull(kbs[0], kb, 10**6)
                _pull(kb, kbs[0], 10**6)
            for kb in kbs:
                _pull(kbs[0], kb, 10**6)
                assert _shown(kb) == _expected(log, {a: 10**9 for a in kb.heads()})
            expected = _shown(kbs[-1])
            kbs[-1].close()
            kbs[-1] = knowledge.open(Path(tmp) / "replica.db", ids[-1])  # from snapshots
            assert _shown(kbs[-1]) == expected
        finally:
            for kb in kbs:
                kb.close()


def _pull(source, sink, limit: int) -> None:
    while True:
        page = source.envelopes_since(sink.heads(), limit=limit)
        report = sink.ingest(page)
        assert not report.rejected and not report.record_issues, report
        if not report.accepted or limit < 10**6:
            return


def _run(operation, kbs, log, now) -> None:
    kind = operation[0]
    if kind == "tick":
        now[0] += 1
        return
    if kind == "sync":
        _pull(kbs[operation[1]], kbs[operation[2]], operation[3])
        return
    kb = kbs[operation[1]]
    floor, author = kb.maps["floor"], kb.identity.public_key_hex
    if kind == "many":
        cells = [c for c, _v in operation[2]]
        hlc = floor.observe_many(cells, [v for _c, v in operation[2]], operation[3])
        last = dict(zip(cells, (v for _c, v in operation[2]), strict=True))  # the last wins
        entries = [(c, v, False) for c, v in last.items()]
    elif kind == "delete_many":
        hlc = floor.delete_many(operation[2], operation[3])
        entries = [(c, None, True) for c in set(operation[2])]
    elif kind == "one":
        hlc = floor.observe(operation[2], operation[3], operation[4])
        entries = [(operation[2], operation[3], False)]
    else:
        hlc = floor.delete(operation[2], operation[3])
        entries = [(operation[2], None, True)]
    seq = kb.heads()[author].seq
    conf = operation[-1]
    for cell, value, deleted in entries:
        log.append((author, seq, ",".join(map(str, cell)), value, conf, hlc, deleted))


def test_the_record_a_batch_writes_is_within_every_records_limits(kb):
    kb.maps["floor"].observe_many([(0, 0)], [{"label": "x"}], 0.5)
    ((key, text),) = [
        (k, v)
        for k, v in kb._replica.feeds[kb.identity.public_key].items()
        if k.startswith("tile/")
    ]
    assert key == "tile/floor/0,0" and record_limits(text) is None
    assert json.loads(text)["values"] == [{"label": "x"}]


def test_a_writer_of_tiles_counts_as_writing_the_map_for_private_map_rules(tmp_path):
    with knowledge.open(tmp_path / "a.db", identity(0)) as kb:
        kb.maps["secret"].observe_many([(0, 0)], ["x"], 0.5)
        assert kb.authors_writing(["secret"]) == {kb.identity.public_key}
    with knowledge.open(tmp_path / "a.db", identity(0)) as kb:  # from its snapshot too
        assert kb.authors_writing(["secret"]) == {kb.identity.public_key}

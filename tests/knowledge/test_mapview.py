"""Unit tests for knowledge._mapview: the merged view of semantic maps against the per-cell rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import Identity
from knowledge._mapview import MapViews
from knowledge._records import (
    ParsedKey,
    RecordType,
    cell_key,
    make_key,
    plain_cell,
    record_text,
)
from knowledge._recordtext import PlainCells
from knowledge._tiles import ROW, cells_of, decode, encode, locate

AUTHORS = [Identity.from_seed(bytes([i]) * 32).public_key for i in (1, 2, 3)]
# cells on both sides of tile borders, in 2 and 3 dimensions
CELLS = [(0, 0), (0, 63), (0, 64), (-1, 0), (-1, -1), (63, 63), (5, 5, 5), (-1, 16, 0)]
VALUES = [None, 1, "wall", "door", {"label": "door"}]


def tile_of(entries: dict[tuple[int, ...], tuple[float, int, object, bool]]):
    """A decoded tile record holding `entries` ({cell: (confidence, hlc, value, deleted)}, all in
    one tile), through the record codec."""
    texts = [json.dumps(v, separators=(",", ":")) for v in VALUES]
    rows = np.zeros(len(entries), ROW)
    for i, (cell, (conf, hlc, value, deleted)) in enumerate(sorted(entries.items())):
        rows[i] = (locate(cell)[1], conf, hlc, 0 if deleted else VALUES.index(value), deleted, 0)
    rows = rows[np.argsort(rows["idx"])]
    top = max([0] + [e[1] for e in entries.values()])
    return decode(json.loads(encode(rows, texts, top)))


def tile_key(cell) -> ParsedKey:
    tile = ",".join(map(str, locate(cell)[0]))
    return ParsedKey(RecordType.TILE, "m", tile)


def cell_record(conf, hlc, value, deleted) -> dict:
    return json.loads(
        record_text(
            {
                "v": 1,
                "hlc": hlc,
                "confidence": conf,
                "value": None if deleted else value,
                "deleted": deleted,
            }
        )
    )


entry = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0]),
    st.integers(1, 4),
    st.sampled_from(VALUES),
    st.booleans(),
)
operation = st.one_of(
    st.tuples(
        st.just("tile"),
        st.integers(0, 2),
        st.sampled_from(CELLS),
        st.dictionaries(st.sampled_from(CELLS), entry, max_size=5),
    ),
    st.tuples(st.just("cell"), st.integers(0, 2), st.sampled_from(CELLS + ["door"]), entry),
    st.tuples(st.just("uncell"), st.integers(0, 2), st.sampled_from(CELLS + ["door"])),
    st.tuples(st.just("flush")),
)


class Model:
    """Each author's current tile records and cell records, and the per-cell rule over them."""

    def __init__(self) -> None:
        self.tiles: dict[tuple[int, tuple], dict] = {}  # (author, tile) -> {cell: entry}
        self.cells: dict[tuple[int, object], tuple] = {}  # (author, cell) -> entry

    def expected(self, cell) -> tuple[bytes, tuple] | None:
        best = None
        for a, author in enumerate(AUTHORS):
            mine = []  # (hlc, kind, entry): the newest; at equal times the tile's
            if isinstance(cell, tuple):
                tiled = self.tiles.get((a, locate(cell)[0]), {}).get(cell)
                if tiled is not None:
                    mine.append((tiled[1], 1, tiled))
            own = self.cells.get((a, cell))
            if own is not None:
                mine.append((own[1], 0, own))
            if mine:
                conf, hlc, value, deleted = max(mine, key=lambda m: m[:2])[2]
                candidate = ((conf, hlc, author), (None if deleted else value, conf, hlc, deleted))
                best = max(best, candidate, key=lambda c: c[0]) if best else candidate
        return None if best is None else (best[0][2], best[1])


def apply(views: MapViews, model: Model, op) -> None:
    kind = op[0]
    if kind == "tile":
        _kind, a, anchor, entries = op
        tile = locate(anchor)[0]
        mine = {c: e for c, e in entries.items() if len(c) == len(anchor) and locate(c)[0] == tile}
        model.tiles[(a, tile)] = mine
        views.put(AUTHORS[a], tile_key(anchor), tile_of(mine))
    elif kind == "cell":
        _kind, a, cell, e = op
        model.cells[(a, cell)] = e
        name = cell_key(cell)
        views.put(AUTHORS[a], ParsedKey(RecordType.CELL, "m", name), cell_record(*e))
    elif kind == "uncell":
        _kind, a, cell = op
        model.cells.pop((a, cell), None)
        views.put(AUTHORS[a], ParsedKey(RecordType.CELL, "m", cell_key(cell)), None)
    else:
        views.flush()


def shown(views: MapViews, cell):
    found = views.cell("m", cell_key(cell))
    if found is None:
        return None
    author, rec = found
    return author, (rec["value"], rec["confidence"], rec["hlc"], rec["deleted"])


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=25), st.randoms(use_true_random=False))
def test_the_view_shows_the_per_cell_rule_whatever_the_order(ops, rnd):
    views, model = MapViews(), Model()
    for op in ops:
        apply(views, model, op)
    views.flush()
    for cell in CELLS + ["door"]:
        assert shown(views, cell) == model.expected(cell), cell
    # the same final records, put in another order, show the same
    again = MapViews()
    puts = [("tile", a, _anchor(t), e) for (a, t), e in model.tiles.items()]
    puts += [("cell", a, c, e) for (a, c), e in model.cells.items()]
    rnd.shuffle(puts)
    scratch = Model()
    for op in puts:
        apply(again, scratch, op)
    again.flush()
    for cell in CELLS + ["door"]:
        assert shown(again, cell) == shown(views, cell)
    restored = MapViews.restore(views.export())
    for cell in CELLS + ["door"]:
        assert shown(restored, cell) == shown(views, cell)


def _anchor(tile: tuple) -> tuple:
    """A cell of `tile`."""
    return tuple(int(c) for c in cells_of(tile, np.array([0]))[0])


def test_a_tile_record_replaces_the_authors_previous_one_and_removing_it_falls_back():
    views = MapViews()
    a, b = AUTHORS[:2]
    views.put(a, tile_key((0, 0)), tile_of({(0, 0): (0.9, 1, "wall", False)}))
    views.put(b, tile_key((0, 0)), tile_of({(0, 0): (0.5, 2, "door", False)}))
    views.flush()
    assert shown(views, (0, 0)) == (a, ("wall", 0.9, 1, False))
    views.put(a, tile_key((0, 0)), tile_of({(0, 1): (0.9, 3, "wall", False)}))  # (0, 0) gone
    views.flush()
    assert shown(views, (0, 0)) == (b, ("door", 0.5, 2, False))
    views.put(b, tile_key((0, 0)), None)
    views.flush()
    assert shown(views, (0, 0)) is None and views.cells("m") == ["0,1"]


def test_an_authors_newest_write_counts_whether_a_tile_or_a_cell_record():
    views = MapViews()
    a, b = AUTHORS[:2]
    views.put(a, ParsedKey(RecordType.CELL, "m", "0,0"), cell_record(1.0, 1, "old", False))
    views.put(b, tile_key((0, 0)), tile_of({(0, 0): (0.5, 2, "wall", False)}))
    views.put(a, tile_key((0, 0)), tile_of({(0, 0): (0.1, 3, "door", False)}))
    views.flush()
    assert shown(views, (0, 0)) == (b, ("wall", 0.5, 2, False))  # a's 1.0 is an older write
    views.put(a, ParsedKey(RecordType.CELL, "m", "0,0"), cell_record(0.9, 4, 1, False))
    views.flush()
    assert shown(views, (0, 0)) == (a, (1, 0.9, 4, False))


def test_cells_named_otherwise_are_per_cell_records_of_their_own():
    views = MapViews()
    a = AUTHORS[0]
    views.put(a, ParsedKey(RecordType.CELL, "m", "12,07"), cell_record(0.5, 1, "named", False))
    views.put(a, tile_key((12, 7)), tile_of({(12, 7): (0.5, 1, "wall", False)}))
    views.flush()
    assert views.cell("m", "12,07")[1]["value"] == "named"
    assert views.cell("m", "12,7")[1]["value"] == "wall"
    assert views.cells("m") == ["12,07", "12,7"]
    assert views.region("m", (0, 0), (64, 64), include_deleted=False).values.tolist() == ["wall"]


def test_drop_removes_everything_an_author_wrote():
    views = MapViews()
    a, b = AUTHORS[:2]
    views.put(a, tile_key((0, 0)), tile_of({(0, 0): (0.9, 1, "wall", False)}))
    views.put(a, ParsedKey(RecordType.CELL, "m", "door"), cell_record(0.9, 1, 1, False))
    views.put(b, ParsedKey(RecordType.CELL, "n", "0,0"), cell_record(0.9, 1, 1, False))
    views.flush()
    views.drop(a)
    assert views.map_names() == ["n"] and views.cell("m", "0,0") is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-130, 130), st.integers(-130, 130), st.booleans()),
        min_size=1,
        max_size=300,
    ),
    st.tuples(st.integers(-140, 140), st.integers(-140, 140)),
    st.tuples(st.integers(0, 280), st.integers(0, 280)),
    st.booleans(),
)
def test_a_region_holds_exactly_the_cells_in_its_box(cells, lo, size, include_deleted):
    views = MapViews()
    by_tile: dict[tuple, dict] = {}
    for x, y, deleted in cells:
        by_tile.setdefault(locate((x, y))[0], {})[(x, y)] = (0.5, 1, "wall", deleted)
    for entries in by_tile.values():
        views.put(AUTHORS[0], tile_key(next(iter(entries))), tile_of(entries))
    views.flush()
    hi = (lo[0] + size[0], lo[1] + size[1])
    found = views.region("m", lo, hi, include_deleted=include_deleted)
    expected = {
        (x, y)
        for x, y, deleted in {(c[0], c[1], e[3]) for t in by_tile.values() for c, e in t.items()}
        if lo[0] <= x < hi[0] and lo[1] <= y < hi[1] and (include_deleted or not deleted)
    }
    assert sorted(map(tuple, found.cells.tolist())) == sorted(expected)
    assert len(found) == len(expected) == len(found.values) == len(found.deleted)
    assert found.authors == ((AUTHORS[0].hex(),) if expected else ())
    for i in range(len(found)):
        obs = found.observation(i)
        assert (obs.value is None) == obs.deleted and obs.author == AUTHORS[0].hex()


def test_a_full_tile_region_and_other_dimensions():
    views = MapViews()
    full = {(x, y): (1.0, 7, 1, False) for x in range(64) for y in range(64)}
    views.put(AUTHORS[1], tile_key((0, 0)), tile_of(full))
    views.put(AUTHORS[1], tile_key((5, 5, 5)), tile_of({(5, 5, 5): (1.0, 7, 1, True)}))
    views.put(AUTHORS[1], tile_key((9,)), tile_of({(9,): (1.0, 7, 1, False)}))
    views.flush()
    assert len(views.region("m", (10, 20), (30, 25), include_deleted=False)) == 100
    assert len(views.region("m", (0, 0), (10**6, 10**6), include_deleted=False)) == 4096
    assert len(views.region("m", (0, 0, 0), (6, 6, 6), include_deleted=False)) == 0
    assert len(views.region("m", (0, 0, 0), (6, 6, 6), include_deleted=True)) == 1
    assert views.region("m", (9,), (10,), include_deleted=False).cells.tolist() == [[9]]
    assert len(views.region("m", (5, 5), (5, 9), include_deleted=True)) == 0  # an empty box
    assert len(views.region("nothing", (0, 0), (1, 1), include_deleted=True)) == 0
    with pytest.raises(ValueError, match="1 to 3 integer coordinates"):
        views.region("m", (0, 0), (1, 1, 1), include_deleted=True)


def test_admit_keeps_good_tiles_for_the_views_and_names_the_first_bad_one():
    views = MapViews()
    author = AUTHORS[0]
    tile = tile_of({(0, 0): (0.5, 1, "wall", False)})
    good = encode(tile.rows, tile.texts, 1)
    key = make_key(RecordType.TILE, "m", "0,0")
    assert views.admit(author, {key: good, "cell/m/1,1": "{}", "tile/m/1,0": None}) is None
    assert views.take_prepared(author, key, good) is not None
    assert views.take_prepared(author, key, good) is None  # handed over once
    bad = json.loads(good)
    bad["cells"] = "!!"
    assert views.admit(author, {key: record_text(bad)})[0] == "invalid_tile"
    assert views.admit(author, {"tile/m/x": good})[0] == "invalid_tile"
    assert views.admit(author, {key: "[1]"})[0] == "invalid_tile"
    newer = dict(json.loads(good), v=2, cells="anything")
    assert views.admit(author, {key: record_text(newer)}) is None  # kept, forwarded, not shown


def test_nbytes_counts_the_columns_once():
    views = MapViews()
    full = {(x, y): (1.0, 7, 1, False) for x in range(64) for y in range(64)}
    views.put(AUTHORS[0], tile_key((0, 0)), tile_of(full))
    views.flush()
    assert 4096 * ROW.itemsize < views.nbytes() < 4096 * ROW.itemsize + 2000


def _state(views: MapViews) -> tuple:
    """What a view shows and keeps, comparable: its maps' values, codes, named cells and rows."""
    views.flush()
    out = []
    for name, m in sorted(views.maps.items()):
        rows = {
            k: (t.merged.tolist(), sorted((s, r.tolist()) for s, r in t.sources.items()))
            for k, t in m.tiles.items()
        }
        out.append((name, m.values, m.codes, m.named, rows, views.observations(name)))
    return views.authors, out


plain_entry = st.tuples(
    st.sampled_from(CELLS + ["door", "7", "1,2,3"]),
    st.sampled_from([0.0, 0.25, 1.0]),
    st.integers(0, 2**64 - 1),
    st.sampled_from(VALUES + [True, 2.5, {"occupied": False}, "{" * 70]),
    st.booleans() | st.none(),  # None: a record without "deleted"
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(plain_entry, min_size=1, max_size=12), min_size=1, max_size=3))
def test_cells_put_from_ingests_columns_are_the_cells_put_from_their_records(batches):
    by_records, by_columns = MapViews(), MapViews()
    for i, batch in enumerate(batches):
        unique = list({str(cell): e for cell, *e in batch}.items())  # one change a cell per put
        texts = []
        for _cell, (conf, hlc, value, deleted) in unique:
            record = {"v": 1, "hlc": hlc, "confidence": conf, "value": value}
            if deleted is not None:
                record["deleted"] = deleted
            texts.append(record_text(record))
        names = [",".join(map(str, c)) if isinstance(c, tuple) else c for c, _e in unique]
        entries = [
            (n, json.loads(t), plain_cell(json.loads(t))) for n, t in zip(names, texts, strict=True)
        ]
        plain = PlainCells()
        assert plain.read(texts) is not None
        by_records.put_cells(AUTHORS[i % 2], "m", entries)
        by_columns.put_plain(AUTHORS[i % 2], "m", names, [plain.at[t] for t in texts], plain)
    assert _state(by_records) == _state(by_columns)

"""Tests of knowledge._cellrows: per-cell records as tile rows, a batch at a time.

Property tests hold the batched reading of cell names to `locate(cell_coords(name))` cell by cell,
and the fold of pending changes to the rule "per cell, the last change wins; a removal takes the
row out".
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge._cellrows import by_tile, fold, locate_all, rows_of
from knowledge._records import COORD_MAX, COORD_MIN
from knowledge._tiles import ROW, cell_coords, locate

coordinate = st.integers(COORD_MIN, COORD_MAX) | st.integers(-70, 70)
names = st.lists(coordinate, min_size=1, max_size=3).map(lambda c: ",".join(map(str, c)))
odd_names = st.sampled_from(
    ["door-3", "01,2", "-0", "+1", "1,2,3,4", "", str(COORD_MAX + 1), "5;6", "3,4;5,6", "1;"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(names | odd_names, min_size=1, max_size=20))
def test_locate_all_reads_names_as_cell_by_cell(cells):
    one_by_one = [cell_coords(c) for c in cells]
    located = locate_all(cells)
    if any(c is None for c in one_by_one) or len({len(c) for c in one_by_one if c}) > 1:
        assert located is None
        return
    assert located is not None
    tiles, index = located
    expected = [locate(c) for c in one_by_one if c is not None]
    assert [tuple(t) for t in tiles.tolist()] == [t for t, _i in expected]
    assert index.tolist() == [i for _t, i in expected]


def _record(conf: float, hlc: int, value: object, deleted: bool = False) -> dict:
    return {"confidence": conf, "hlc": hlc, "value": value, "deleted": deleted, "v": 1}


change = st.tuples(
    st.integers(0, 20),  # the cell's index in its tile
    st.none() | st.tuples(st.floats(0, 1), st.integers(0, 2**64 - 1), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(change, min_size=1, max_size=8), min_size=1, max_size=4))
def test_fold_keeps_the_last_change_of_each_cell(batches):
    codes: dict[object, int] = {}
    state: dict[int, tuple] = {}
    old = np.empty(0, ROW)
    for batch in batches:
        entries = [
            (None if c is None else _record(c[0], c[1], i % 3, c[2]), None) for i, c in batch
        ]
        part = rows_of(
            np.array([i for i, _c in batch]),
            entries,
            lambda v: codes.setdefault(v, len(codes) + 1),
            7,
        )
        old = fold(old, [part])
        for (index, c), (content, _p) in zip(batch, entries, strict=True):
            if c is None:
                state.pop(index, None)
            else:
                code = 0 if c[2] else codes[content["value"]]
                state[index] = (index, c[0], c[1], code, int(c[2]), 7)
    assert [tuple(r) for r in old.tolist()] == [state[i] for i in sorted(state)]


def test_changes_split_by_tile_keep_their_order():
    tiles = np.array([[0, 1], [2, 3], [0, 1]])
    entries = [(_record(0.5, n, "x"), None) for n in range(3)]
    rows, present = rows_of(np.array([5, 6, 7]), entries, lambda v: 1, 0)
    parts = dict(by_tile(tiles, (rows, present)))
    assert parts[(0, 1)][0]["hlc"].tolist() == [0, 2] and parts[(2, 3)][0]["idx"].tolist() == [6]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2), st.integers(-2, 2)), min_size=1, max_size=30))
def test_changes_split_by_tile_are_each_tiles_changes_in_order(at):
    tiles = np.array(at)
    entries = [(_record(0.5, n, "x"), None) for n in range(len(at))]
    changes = rows_of(np.arange(len(at)), entries, lambda v: 1, 0)
    expected: dict[tuple, list[int]] = {}
    for n, tile in enumerate(at):
        expected.setdefault(tile, []).append(n)
    parts = by_tile(tiles, changes)
    assert [tile for tile, _part in parts] == sorted(expected)
    assert {tile: rows["hlc"].tolist() for tile, (rows, _p) in parts} == expected

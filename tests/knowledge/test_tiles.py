"""Unit tests for knowledge._tiles: tile geometry, a writer's batches and the tile record codec."""

from __future__ import annotations

import base64
import json
import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import RecordError
from knowledge._records import COORD_MAX, COORD_MIN, TILE_CELLS, cell_key, record_limits
from knowledge._tiles import (
    EDGE,
    PACKED_BYTES,
    ROW,
    TileError,
    batch,
    build,
    cell_coords,
    cells_of,
    decode,
    limits,
    locate,
)

coordinate = st.integers(COORD_MIN, COORD_MAX)


# --- geometry -----------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.lists(coordinate, min_size=1, max_size=3))
def test_a_cell_lies_in_one_tile_at_one_index(coords):
    coords = tuple(coords)
    assert cell_coords(cell_key(coords)) == coords
    tile, index = locate(coords)
    assert 0 <= index < TILE_CELLS
    assert all(
        t * EDGE[len(coords)] <= c < (t + 1) * EDGE[len(coords)]
        for t, c in zip(tile, coords, strict=True)
    )
    assert tuple(cells_of(tile, np.array([index]))[0]) == coords


@pytest.mark.parametrize(
    "name", ["12,07", "+1,2", "1, 2", "-0", "1,2,3,4", "door", "", "1,,2", str(2**31), "0x10"]
)
def test_only_integer_tuples_as_cell_key_writes_them_are_coordinates(name):
    assert cell_coords(name) is None


def test_tiles_are_4096_cells_in_1_2_or_3_dimensions():
    assert {d: e**d for d, e in EDGE.items()} == {1: 4096, 2: 4096, 3: 4096}
    assert locate((-1, 0)) == ((-1, 0), 63 * 64)
    assert locate((64, 65)) == ((1, 1), 1)
    assert locate((-1, -1, -1)) == ((-1, -1, -1), 4095)


# --- batches ------------------------------------------------------------------------------------


def test_a_batch_groups_by_tile_and_the_last_observation_of_a_cell_wins():
    cells = [(0, 0), (64, 0), (0, 1), (0, 0), (-1, 5)]
    found = batch(cells, ["a", "b", "c", "d", "e"], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert found is not None
    parts = {tile: rows for tile, rows in found.parts()}
    assert set(parts) == {(0, 0), (1, 0), (-1, 0)}
    first = parts[(0, 0)]
    assert first["idx"].tolist() == [0, 1]
    assert [found.texts[c] for c in first["code"]] == ['"d"', '"c"']
    assert first["conf"].tolist() == [0.4, 0.3]
    assert batch([], [], []) is None


def test_a_batch_takes_values_as_objects_a_palette_or_an_array():
    cells = np.array([(0, 0), (0, 1), (0, 2)])
    label = {"label": "wall"}
    by_objects = batch(cells, [label, {"label": "wall"}, None], 0.5)
    by_palette = batch(cells, [1, 1, 0], 0.5, palette=[None, label])
    by_array = batch(cells, np.array([3, 3, 4]), 0.5)
    assert by_objects and by_palette and by_array
    for found in (by_objects, by_palette):
        assert [found.texts[c] for c in found.rows["code"]] == [
            '{"label":"wall"}',
            '{"label":"wall"}',
            "null",
        ]
    assert [by_array.texts[c] for c in by_array.rows["code"]] == ["3", "3", "4"]


@pytest.mark.parametrize(
    ("cells", "values", "confidences", "palette", "message"),
    [
        ([(0.5, 1)], [1], 0.5, None, "integers"),
        ([[1, 2, 3, 4]], [1], 0.5, None, "d from 1 to 3"),
        ([1, 2], [1, 2], 0.5, None, "n x d"),
        ([(2**31, 0)], [1], 0.5, None, "32-bit"),
        ([(0, 0), (0, 1)], [1, 2], [0.5, math.nan], None, "nan (of cell 1)"),
        ([(0, 0)], [1], math.inf, None, "inf"),
        ([(0, 0)], [1], 1.5, None, "finite number in [0, 1]"),
        ([(0, 0)], [1], [0.5, 0.5], None, "one number or 1 numbers"),
        ([(0, 0)], [1, 2], 0.5, None, "sequence of 1 JSON values"),
        ([(0, 0)], "a", 0.5, None, "sequence of 1 JSON values"),
        ([(0, 0)], [{1, 2}], 0.5, None, "not JSON-serializable"),
        ([(0, 0)], [math.nan], 0.5, None, "not JSON-serializable"),
        ([(0, 0)], [2], 0.5, ["a", "b"], "outside the palette of 2"),
        ([(0, 0)], ["a"], 0.5, ["a"], "integer indices"),
    ],
)
def test_a_bad_batch_says_what_is_wrong(cells, values, confidences, palette, message):
    with pytest.raises(RecordError) as info:
        batch(cells, values, confidences, palette=palette)
    assert message in str(info.value)


# --- the record codec ---------------------------------------------------------------------------

observations = st.lists(
    st.tuples(
        st.integers(0, TILE_CELLS - 1),
        st.floats(0, 1),
        st.integers(0, 2**64 - 1),
        st.sampled_from([None, 0, "wall", {"label": "door"}, [1.5, 2]]),
        st.booleans(),
    ),
    max_size=40,
)


def _part(obs, texts):
    rows = np.zeros(len(obs), ROW)
    for i, (index, conf, _hlc, value, deleted) in enumerate(obs):
        rows[i] = (
            index,
            conf,
            0,
            texts.index(json.dumps(value, separators=(",", ":"))),
            deleted,
            0,
        )
    rows = rows[np.argsort(rows["idx"], kind="stable")]
    return rows[np.append(rows["idx"][1:] != rows["idx"][:-1], True)] if len(rows) else rows


TEXTS = ["null", "0", '"wall"', '{"label":"door"}', "[1.5,2]"]


def _cells(tile):
    """{index: (confidence, hlc, value, deleted)} of a decoded tile."""
    values = [json.loads(t) for t in tile.texts]
    return {
        int(r["idx"]): (
            float(r["conf"]),
            int(r["hlc"]),
            None if r["deleted"] else values[r["code"]],
            bool(r["deleted"]),
        )
        for r in tile.rows
    }


@settings(max_examples=200)
@given(observations, observations, st.integers(1, 2**63))
def test_a_rebuilt_tile_holds_the_newest_observation_of_each_cell_and_decodes_as_built(
    first, second, hlc
):
    text, old = build(None, _part(first, TEXTS), TEXTS, hlc)
    assert _cells(decode(json.loads(text))) == _cells(old)
    text, new = build(old, _part(second, TEXTS), TEXTS, hlc + 1)
    decoded = decode(json.loads(text))
    assert _cells(decoded) == _cells(new)
    expected = {i: (c, hlc, None if d else v, d) for i, c, _h, v, d in first}
    expected.update({i: (c, hlc + 1, None if d else v, d) for i, c, _h, v, d in second})
    assert _cells(decoded) == expected
    live = {json.dumps(v, separators=(",", ":")) for _c, _h, v, d in expected.values() if not d}
    assert set(decoded.texts) == live  # values no cell holds any more are dropped
    assert json.loads(text)["hlc"] == hlc + 1 and json.loads(text)["n"] == len(expected)


def _record(rows, palette=("x",), hlc=100, **overrides):
    packed = b"".join(rows[c].tobytes() for c in ("idx", "hlc", "code", "deleted"))
    record = {
        "v": 1,
        "hlc": hlc,
        "n": len(rows),
        "cells": base64.b64encode(zlib.compress(packed)).decode(),
        "confidence": base64.b64encode(rows["conf"].tobytes()).decode(),
        "values": list(palette),
    }
    record.update(overrides)
    return record


def _rows(*cells):
    """Rows of (index, confidence, hlc, code, deleted)."""
    rows = np.zeros(len(cells), ROW)
    for i, cell in enumerate(cells):
        rows[i] = (*cell, 0)
    return rows


GOOD = _rows((0, 0.5, 10, 0, 0), (7, 1.0, 100, 0, 0), (9, 0.0, 0, 0, 1))


def test_a_good_record_decodes():
    tile = decode(_record(GOOD))
    assert tile.rows["idx"].tolist() == [0, 7, 9] and tile.texts == ['"x"'] and tile.values == ["x"]


@pytest.mark.parametrize(
    ("record", "reason", "message"),
    [
        (_record(GOOD, n=TILE_CELLS + 1), "oversized_tile", "at most 4096 cells"),
        (_record(GOOD, n=-1), "invalid_tile", "count of cells"),
        (_record(GOOD, cells="not base64!"), "invalid_tile", "no base64"),
        (_record(GOOD, cells=base64.b64encode(b"not zlib").decode()), "invalid_tile", "zlib"),
        (_record(GOOD, n=2), "invalid_tile", "holds 24 bytes, not 2 float64"),
        (_record(GOOD, n=4), "invalid_tile", "holds 24 bytes, not 4 float64"),
        (_record(GOOD, confidence="AAAAAAAAAAA="), "invalid_tile", "holds 8 bytes, not 3"),
        (_record(GOOD, confidence="%%%"), "invalid_tile", "'confidence' is no base64"),
        (_record(GOOD, confidence=None), "invalid_tile", "'confidence' (strings)"),
        (_record(GOOD, values={}), "invalid_tile", "'values' (a list)"),
        (_record(_rows((0, 0.5, 1, 0, 0), (4096, 0.5, 1, 0, 0))), "invalid_tile", "outside"),
        (_record(_rows((5, 0.5, 1, 0, 0), (5, 0.5, 1, 0, 0))), "invalid_tile", "increasing"),
        (_record(_rows((5, 0.5, 1, 0, 0), (4, 0.5, 1, 0, 0))), "invalid_tile", "increasing"),
        (_record(_rows((5, math.nan, 1, 0, 0))), "invalid_tile", "confidence nan"),
        (_record(_rows((5, math.inf, 1, 0, 0))), "invalid_tile", "confidence inf"),
        (_record(_rows((5, -0.5, 1, 0, 0))), "invalid_tile", "finite number in [0, 1]"),
        (_record(_rows((5, 0.5, 101, 0, 0))), "record_clock_ahead", "claims time 101"),
        (_record(_rows((5, 0.5, 1, 0, 2))), "invalid_tile", "deleted flag"),
        (_record(_rows((5, 0.5, 1, 1, 0))), "invalid_tile", "value index"),
        (_record(_rows((5, 0.5, 1, 0, 0)), palette=[]), "invalid_tile", "value index"),
        (_record(_rows((5, 0.5, 1, 1, 1)), palette=["x", "y"]), "invalid_tile", "tombstone"),
    ],
)
def test_a_bad_record_is_refused_with_its_reason(record, reason, message):
    with pytest.raises(TileError) as info:
        decode(record)
    assert info.value.reason == reason
    assert message in str(info.value)
    assert isinstance(info.value, RecordError)


def test_a_record_that_inflates_beyond_its_cells_is_refused_without_inflating_it():
    bomb = base64.b64encode(zlib.compress(b"\0" * (64 << 20))).decode()
    with pytest.raises(TileError) as info:
        decode(_record(GOOD, cells=bomb))
    assert f"where 3 cells take {3 * PACKED_BYTES}" in str(info.value)
    assert f"{3 * PACKED_BYTES + 1}+" in str(info.value)  # it stopped one byte past the cells


def test_columns_shorter_than_the_count_are_refused():
    record = _record(GOOD)
    short = _record(GOOD[:2])
    with pytest.raises(TileError, match="holds 30 bytes of columns where 3 cells take 45"):
        decode(dict(record, cells=short["cells"]))


def test_trailing_bytes_after_the_compressed_columns_are_refused():
    record = _record(GOOD)
    record["cells"] = base64.b64encode(base64.b64decode(record["cells"]) + b"x").decode()
    with pytest.raises(TileError, match="where 3 cells take"):
        decode(record)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x" * 300_000, "exceeds 262144"),
        (10**50, "more than 40 digits"),
        (json.loads("[" * 63 + "]" * 63), "nests 65 deep"),
    ],
)
def test_a_built_tile_is_held_to_every_records_limits(value, message):
    found = batch([(0, 0)], [value], 0.5)
    assert found is not None
    text, tile = build(None, found.rows, found.texts, 1)
    refusal = limits(text, tile)
    assert refusal is not None and message in refusal
    assert record_limits(text) is not None  # what a receiver finds too


def test_a_built_tile_within_the_limits_passes_them():
    found = batch([(0, 0)], [json.loads("[" * 62 + "]" * 62)], 0.5)
    text, tile = build(None, found.rows, found.texts, 1)
    assert limits(text, tile) is None and record_limits(text) is None

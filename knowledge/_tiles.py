"""Map tiles: how a writer's observations of many cells travel as one record.

Cells with integer coordinates (1 to 3 of them, each a 32-bit signed integer) fall in tiles of 4096
cells: 4096 on a line, 64 x 64 in a plane, 16 x 16 x 16 in a volume. A writer's tile record,
``tile/<map>/<t0>[,<t1>[,<t2>]]``, holds that writer's newest observation of every cell of the tile
it has observed, tombstones included, and replaces the writer's previous version of the tile: one
record per writer and tile where per-cell records took one per writer and cell.

The record is JSON: ``{"cells": C, "confidence": F, "hlc": H, "n": N, "v": 1, "values": [...]}``.
``values`` lists the tile's distinct cell values (any JSON); ``C`` is the base64 of the
zlib-compressed concatenation of four little-endian columns of N entries each (they compress: a
batch shares its time, cells run in order, values repeat), and ``F`` the base64 of the
confidences, N little-endian float64 (a sensor's confidences do not compress: zlib would spend
most of a write's time on them):

    index      u16  the cell's row-major index within the tile, strictly increasing, < 4096
    hlc        u64  the time of that observation, at most H (H is at most the envelope's time)
    value      u32  an index into ``values``; 0 for a tombstone
    deleted    u8   1 for a tombstone, else 0
    confidence f64  finite, in [0, 1] (in ``F``)

A writer stamps one time on a batch of observations; cells it does not observe again keep theirs.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._canonical import canonical_json
from ._errors import RecordError
from ._records import COORD_MAX, COORD_MIN, MAX_RECORD_BYTES, TILE_CELLS, record_limits
from ._records import TILE_EDGE as EDGE

# One row per cell, as the merged view holds them too (`author`: the view's index of the writer).
ROW = np.dtype(
    [
        ("idx", "<u2"),
        ("conf", "<f8"),
        ("hlc", "<u8"),
        ("code", "<u4"),
        ("deleted", "u1"),
        ("author", "<u4"),
    ]
)
_VOID = np.dtype((np.void, ROW.itemsize))
_WIDTHS = {"idx": 2, "hlc": 8, "code": 4, "deleted": 1}  # the columns of `cells`, in order
PACKED_BYTES = sum(_WIDTHS.values())  # 15 a cell
_INTEGERS = re.compile(r"(?:0|-?[1-9][0-9]{0,9})(?:,(?:0|-?[1-9][0-9]{0,9})){0,2}")


class TileError(RecordError):
    """A tile record receivers refuse; `reason` is the ingest rejection reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class Tile(NamedTuple):
    """A decoded tile: its rows (sorted by index, `code` into `texts`) and the canonical JSON of
    each value."""

    rows: np.ndarray
    texts: list[str]
    values: list[Any] | None  # the values themselves, when they came parsed


def pick(rows: np.ndarray, which: Any) -> np.ndarray:
    """`rows[which]` (a mask, indices or a slice) through a view as opaque bytes: numpy copies
    structured rows field by field otherwise, ten times slower."""
    return rows.view(_VOID)[which].view(ROW)


def join(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The rows of `parts`, one after the other (as `pick`, without copying field by field)."""
    if not parts:
        return np.empty(0, ROW)
    return np.concatenate([p.view(_VOID) for p in parts]).view(ROW)


def block(rows: np.ndarray, ndim: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The rows of a full tile (every cell, in index order) whose coordinates within the tile lie
    in [lo, hi): a slice of the rows seen as a block."""
    whole = rows.view(_VOID).reshape((EDGE[ndim],) * ndim)
    return whole[tuple(map(slice, lo, hi))].ravel().view(ROW)


# --- geometry ---------------------------------------------------------------------------------


def cell_coords(name: str) -> tuple[int, ...] | None:
    """The coordinates of a cell named as `cell_key` names an integer tuple ("12,-7"), if it has 1
    to 3 within 32 bits; None for any other name (such cells are not tiled)."""
    if not _INTEGERS.fullmatch(name):  # each as `str` writes it: no "+1", "01", "-0" or " 1"
        return None
    coords = tuple(map(int, name.split(",")))
    return coords if COORD_MIN <= min(coords) and max(coords) <= COORD_MAX else None


def tile_coords(name: str) -> tuple[int, ...]:
    """The coordinates of a tile named in a key `parse_key` read ("3,-1")."""
    return tuple(int(p) for p in name.split(","))


def locate(coords: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """(the tile holding a cell, the cell's index within it)."""
    edge = EDGE[len(coords)]
    if len(coords) == 2:  # the common case, spelled out
        (t0, c0), (t1, c1) = divmod(coords[0], edge), divmod(coords[1], edge)
        return (t0, t1), c0 * edge + c1
    index = 0
    for c in coords:
        index = index * edge + c % edge
    return tuple(c // edge for c in coords), index


def local_coords(index: np.ndarray, ndim: int) -> np.ndarray:
    """The coordinates (k x ndim, int64) within their tile of the cells at `index`."""
    edge = EDGE[ndim]
    out = np.empty((len(index), ndim), np.int64)
    rest = index.astype(np.int64)
    for axis in reversed(range(ndim)):
        out[:, axis] = rest % edge
        rest //= edge
    return out


def cells_of(tile: tuple[int, ...], index: np.ndarray) -> np.ndarray:
    """The coordinates (k x d, int64) of the cells at `index` within `tile`."""
    return local_coords(index, len(tile)) + np.array(tile, np.int64) * EDGE[len(tile)]


# --- a writer's batch -------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Observations of many cells, checked, grouped by tile and deduplicated (the last wins)."""

    tiles: list[tuple[int, ...]]
    bounds: np.ndarray  # rows[bounds[i]:bounds[i + 1]] fall in tiles[i]
    rows: np.ndarray  # ROW, `code` into `texts`, `hlc` unset
    texts: list[str]

    def parts(self) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
        for i, tile in enumerate(self.tiles):
            yield tile, self.rows[self.bounds[i] : self.bounds[i + 1]]


def batch(
    cells: Any,
    values: Any,
    confidences: Any,
    *,
    palette: Sequence[Any] | None = None,
    deleted: bool = False,
) -> Batch | None:
    """Check and group a batch of observations (None if it holds no cell); RecordError names the
    first thing wrong."""
    coords = np.asarray(cells)
    if coords.size == 0:
        return None
    if coords.ndim != 2 or coords.shape[1] not in EDGE or coords.dtype.kind not in "iu":
        raise RecordError(
            "cells must be an n x d array of integers, d from 1 to 3 "
            f"(not {coords.dtype} of shape {coords.shape})"
        )
    if coords.min() < COORD_MIN or coords.max() > COORD_MAX:
        raise RecordError("cell coordinates must be 32-bit signed integers")
    n, ndim = coords.shape
    conf = _confidences(confidences, n)
    codes, texts = (np.zeros(n, np.uint32), []) if deleted else _codes(values, n, palette)
    coords = coords.astype(np.int64)
    edge = EDGE[ndim]
    tiles = coords // edge
    index = np.zeros(n, np.int64)
    for axis in range(ndim):
        index = index * edge + (coords[:, axis] - tiles[:, axis] * edge)
    order = np.lexsort((index, *(tiles[:, a] for a in reversed(range(ndim)))))  # stable
    tiles, index = tiles[order], index[order]
    new_tile = np.any(tiles[1:] != tiles[:-1], axis=1)
    last = np.append((index[1:] != index[:-1]) | new_tile, True)  # the last write of a cell wins
    order, tiles, index = order[last], tiles[last], index[last]
    rows = np.zeros(len(order), ROW)
    rows["idx"], rows["conf"], rows["code"] = index, conf[order], codes[order]
    rows["deleted"] = deleted
    starts = np.flatnonzero(np.append(True, np.any(tiles[1:] != tiles[:-1], axis=1)))
    return Batch(
        [tuple(int(c) for c in tiles[s]) for s in starts], np.append(starts, len(rows)), rows, texts
    )


def _confidences(confidences: Any, n: int) -> np.ndarray:
    try:
        conf = np.broadcast_to(np.asarray(confidences, dtype=np.float64), (n,))
    except (TypeError, ValueError):
        raise RecordError(f"confidences must be one number or {n} numbers") from None
    bad = np.flatnonzero(~(np.isfinite(conf) & (conf >= 0) & (conf <= 1)))
    if len(bad):
        raise RecordError(
            f"confidence {conf[bad[0]]} (of cell {bad[0]}) is not a finite number in [0, 1]"
        )
    return conf


def _codes(values: Any, n: int, palette: Sequence[Any] | None) -> tuple[np.ndarray, list[str]]:
    """Each cell's value as an index into the canonical JSON texts of the distinct values."""
    if palette is not None:
        texts = [canonical_json(v).decode() for v in palette]
        codes = np.asarray(values)
        if codes.shape != (n,) or codes.dtype.kind not in "iu":
            raise RecordError(f"with a palette, values are {n} integer indices into it")
        if n and (codes.min() < 0 or codes.max() >= len(texts)):
            raise RecordError(f"a value index lies outside the palette of {len(texts)} values")
        return codes.astype(np.uint32), texts
    if isinstance(values, np.ndarray) and values.dtype.kind in "biufU" and values.shape == (n,):
        distinct, inverse = np.unique(values, return_inverse=True)
        return inverse.astype(np.uint32), [canonical_json(v).decode() for v in distinct.tolist()]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
        raise RecordError(f"values must be a sequence of {n} JSON values, one per cell")
    seen: dict[int, int] = {}  # id -> code: a batch usually repeats a few value objects
    index: dict[str, int] = {}
    out = []
    for value in values:
        code = seen.get(id(value))
        if code is None:
            code = index.setdefault(canonical_json(value).decode(), len(index))
            seen[id(value)] = code
        out.append(code)
    return np.array(out, np.uint32), list(index)


def build(old: Tile | None, part: np.ndarray, texts: list[str], hlc: int) -> tuple[str, Tile]:
    """A writer's tile after observing `part` (rows of one tile, `code` into `texts`) at `hlc`:
    its record text and what it decodes to."""
    part = part.copy()
    part["hlc"] = hlc
    if old is not None:
        known = {t: i for i, t in enumerate(old.texts)}
        remap = np.array([known.setdefault(t, len(known)) for t in texts], np.uint32)
        if len(remap):
            part["code"] = remap[part["code"]]
        kept = pick(old.rows, ~np.isin(old.rows["idx"], part["idx"], assume_unique=True))
        rows = join([kept, part])
        rows = pick(rows, np.argsort(rows["idx"], kind="stable"))
        texts = list(known)
    else:
        rows = part
    live = rows["deleted"] == 0
    used, inverse = np.unique(rows["code"][live], return_inverse=True)
    rows["code"][live] = inverse
    rows["code"][~live] = 0
    palette = [texts[i] for i in used.tolist()]
    return encode(rows, palette, hlc), Tile(rows, palette, None)


def encode(rows: np.ndarray, texts: list[str], hlc: int) -> str:
    """The record text of a tile (canonical JSON: its keys are in order)."""
    packed = b"".join(rows[c].tobytes() for c in _WIDTHS)
    cells = base64.b64encode(zlib.compress(packed, 1)).decode("ascii")
    conf = base64.b64encode(rows["conf"].tobytes()).decode("ascii")
    return (
        f'{{"cells":"{cells}","confidence":"{conf}","hlc":{hlc},"n":{len(rows)},"v":1,'
        f'"values":[{",".join(texts)}]}}'
    )


def limits(text: str, tile: Tile) -> str | None:
    """`record_limits` of a tile record `build` made: only its values can break them (nesting,
    long numbers, surrogates; they nest in the record as in this text) or its size."""
    refusal = record_limits('{"values":[' + ",".join(tile.texts) + "]}")
    size = len(text.encode())
    return refusal or (
        f"record of {size} bytes exceeds {MAX_RECORD_BYTES}" if size > MAX_RECORD_BYTES else None
    )


# --- a receiver's check -----------------------------------------------------------------------


def decode(record: dict[str, Any]) -> Tile:
    """A tile record's rows, checked as every receiver checks them; TileError says what is wrong.

    `record` has passed the checks every record passes (`check_record`: JSON, limits, `v`, `hlc`).
    """
    n, hlc, values = record.get("n"), record["hlc"], record.get("values")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise TileError("invalid_tile", f"field 'n' must be a count of cells, not {n!r:.40}")
    if n > TILE_CELLS:
        raise TileError("oversized_tile", f"a tile holds at most {TILE_CELLS} cells, not {n}")
    cells, conf = record.get("cells"), record.get("confidence")
    if not isinstance(cells, str) or not isinstance(conf, str) or not isinstance(values, list):
        raise TileError(
            "invalid_tile", "fields 'cells', 'confidence' (strings) and 'values' (a list) needed"
        )
    try:
        confidence = base64.b64decode(conf, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TileError("invalid_tile", f"field 'confidence' is no base64: {exc}") from None
    if len(confidence) != 8 * n:
        raise TileError(
            "invalid_tile", f"field 'confidence' holds {len(confidence)} bytes, not {n} float64"
        )
    try:
        packed = base64.b64decode(cells, validate=True)
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, n * PACKED_BYTES + 1)
    except (binascii.Error, zlib.error, ValueError) as exc:
        raise TileError("invalid_tile", f"field 'cells' is no base64 of zlib data: {exc}") from None
    if len(raw) != n * PACKED_BYTES or not inflate.eof or inflate.unused_data:
        raise TileError(
            "invalid_tile",
            f"field 'cells' holds {len(raw)}{'+' if not inflate.eof else ''} bytes of columns "
            f"where {n} cells take {n * PACKED_BYTES}",
        )
    rows = np.zeros(n, ROW)
    at = 0
    for column, width in _WIDTHS.items():
        rows[column] = np.frombuffer(raw, ROW[column], n, at)
        at += n * width
    rows["conf"] = np.frombuffer(confidence, "<f8", n)
    _check_rows(rows, hlc, len(values))
    return Tile(rows, [canonical_json(v).decode() for v in values], values)


def _check_rows(rows: np.ndarray, hlc: int, values: int) -> None:
    index, conf, deleted = rows["idx"], rows["conf"], rows["deleted"]
    if len(rows) and index.max() >= TILE_CELLS:
        raise TileError(
            "invalid_tile",
            f"cell index {index.max()} lies outside the tile (its cells are 0..{TILE_CELLS - 1})",
        )
    if np.any(index[1:] <= index[:-1]):
        raise TileError("invalid_tile", "cell indices are not strictly increasing")
    bad = np.flatnonzero(~(np.isfinite(conf) & (conf >= 0) & (conf <= 1)))
    if len(bad):
        raise TileError(
            "invalid_tile",
            f"cell {index[bad[0]]} has confidence {conf[bad[0]]}: not a finite number in [0, 1]",
        )
    if len(rows) and int(rows["hlc"].max()) > hlc:
        raise TileError(
            "record_clock_ahead",
            f"a cell claims time {int(rows['hlc'].max())}, later than its tile record's {hlc}",
        )
    if np.any(deleted > 1):
        raise TileError("invalid_tile", "a cell's deleted flag is neither 0 nor 1")
    live = deleted == 0
    if np.any(rows["code"][live] >= values) or np.any(rows["code"][~live] != 0):
        raise TileError(
            "invalid_tile",
            f"a cell's value index lies outside the tile's {values} values "
            "(or a tombstone's is not 0)",
        )

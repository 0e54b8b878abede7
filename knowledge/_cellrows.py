"""Per-cell map records of integer cells as tile rows, many at a time.

The merged map view holds a writer's per-cell records (``cell/<map>/<x,y>``) of cells with 1 to 3
integer coordinates as rows of the tiles those cells fall in (see `_mapview`). A bulk ingest brings
thousands at once: `locate_all` reads a batch's cell names in one pass, `rows_of` builds their rows
as columns, and `fold` takes a tile's pending changes into its rows once, at the view's next flush:
the last change of each cell wins, and a removal takes the cell's row out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from ._records import COORD_MAX, COORD_MIN, MAX_CELL_CHARS, is_map_name
from ._records import TILE_EDGE as EDGE
from ._recordtext import PlainCells
from ._tiles import ROW, join, pick

# A cell record, and what `plain_cell` read of it (if it did): None for a removed record.
Entry = tuple[dict[str, Any] | None, tuple[float, int, bool, Any] | None]
# Changes of a tile not yet folded: rows, and whether each is present (False: the record is gone).
Changes = tuple[np.ndarray, np.ndarray]

_INT = r"(?:0|-?[1-9][0-9]{0,9})"  # an integer as `str` writes it (as `_tiles.cell_coords` reads)
_GRIDS = {
    d: re.compile(f"{_INT}(?:,{_INT}){{{d - 1}}}(?:;{_INT}(?:,{_INT}){{{d - 1}}})*") for d in EDGE
}


def locate_all(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(tiles, n x d, and index within its tile, n) of cells all named by the same number d of
    integer coordinates within 32 bits, as `_tiles.locate(cell_coords(name))` gives them one by
    one; None if any name is not such (the caller goes cell by cell)."""
    if not names:
        return None
    d = names[0].count(",") + 1
    joined = ";".join(names)
    if d not in _GRIDS or joined.count(";") != len(names) - 1 or not _GRIDS[d].fullmatch(joined):
        return None  # (a ';' inside a name, "5;6", would read as two cells)
    # the grid holds only integers as `str` writes them, all n x d of them: numpy reads them in C
    coords = np.fromstring(joined.replace(";", ","), np.int64, sep=",").reshape(-1, d)
    if coords.min() < COORD_MIN or coords.max() > COORD_MAX:
        return None
    edge = EDGE[d]
    tiles, local = np.divmod(coords, edge)
    index = local[:, 0]
    for axis in range(1, d):
        index = index * edge + local[:, axis]
    return tiles, index


def one_map(keys: list[str]) -> tuple[str, list[str]] | None:
    """(map name, cell names) of `keys` if all are cell keys of one valid map with cell names of a
    valid length (as `_records.parse_key` reads them), else None."""
    if not keys or not keys[0].startswith("cell/"):
        return None
    name = keys[0][5:].partition("/")[0]
    prefix = f"cell/{name}/"
    if not is_map_name(name):
        return None
    if not all(map(str.startswith, keys, repeat(prefix))):
        return None
    cells = [key[len(prefix) :] for key in keys]
    return (
        (name, cells)
        if 0 < min(map(len, cells)) <= max(map(len, cells)) <= MAX_CELL_CHARS
        else None
    )


def plain_rows(
    index: np.ndarray,
    at: list[int],
    plain: PlainCells,
    code_of_text: Callable[[str], int],
    author: int,
) -> Changes:
    """`rows_of` for cells whose records ingest read into `plain`, at its rows `at`; values coded
    by `code_of_text` their JSON text, not for tombstones (their values are not interned)."""
    rows = np.zeros(len(at), ROW)
    rows["idx"], rows["author"] = index, author
    rows["conf"] = list(map(plain.conf.__getitem__, at))
    rows["hlc"] = np.array(list(map(plain.hlc.__getitem__, at)), np.uint64)
    rows["deleted"] = deleted = list(map(plain.deleted.__getitem__, at))
    texts = map(plain.values.__getitem__, at)
    rows["code"] = [0 if gone else code_of_text(t) for t, gone in zip(texts, deleted, strict=True)]
    return rows, np.ones(len(at), bool)


def rows_of(
    index: np.ndarray, entries: Sequence[Entry], code_of: Callable[[Any], int], author: int
) -> Changes:
    """The rows of cells at `index` (within their tiles) holding `entries`, values coded by
    `code_of`, and which of them are present."""
    n = len(entries)
    rows = np.zeros(n, ROW)
    rows["idx"], rows["author"] = index, author
    present = np.fromiter((content is not None for content, _ in entries), bool, n)
    fields = [plain or read(content) for content, plain in entries if content is not None]
    if fields:
        conf, hlc, deleted, values = zip(*fields, strict=True)
        at = slice(None) if len(fields) == n else np.flatnonzero(present)
        rows["conf"][at] = np.array(conf, np.float64)
        rows["hlc"][at] = np.array(hlc, np.uint64)
        rows["deleted"][at] = deleted
        rows["code"][at] = [
            0 if gone else code_of(v) for gone, v in zip(deleted, values, strict=True)
        ]
    return rows, present


def read(content: dict[str, Any]) -> tuple[float, int, bool, Any]:
    """(confidence, hlc, deleted, value) of a checked cell record."""
    return (
        float(content["confidence"]),
        content["hlc"],
        bool(content.get("deleted", False)),
        content["value"],
    )


def by_tile(tiles: np.ndarray, changes: Changes) -> list[tuple[tuple[int, ...], Changes]]:
    """`changes` (one row per row of `tiles`) split by tile."""
    if (tiles == tiles[0]).all():
        return [(tuple(tiles[0].tolist()), changes)]
    order = np.lexsort(tiles.T[::-1])  # by tile, stable: each tile's changes keep their order
    ordered = tiles[order]
    starts = np.flatnonzero(np.append(True, (ordered[1:] != ordered[:-1]).any(axis=1)))
    rows, present = changes
    return [
        (tuple(ordered[start].tolist()), (pick(rows, part), present[part]))
        for start, part in zip(starts.tolist(), np.split(order, starts[1:]), strict=True)
    ]


def fold(old: np.ndarray, pending: Sequence[Changes]) -> np.ndarray:
    """A tile's rows `old` (sorted by index) with the `pending` changes taken in, in order: per
    cell, the last change wins; sorted by index."""
    new = join([rows for rows, _present in pending])
    present = np.concatenate([p for _rows, p in pending])
    order = np.argsort(new["idx"], kind="stable")
    ordered = new["idx"][order]
    last = order[np.append(ordered[1:] != ordered[:-1], True)]  # each cell's last change
    kept = pick(old, ~np.isin(old["idx"], new["idx"][last]))
    rows = join([kept, pick(new, last[present[last]])])
    return pick(rows, np.argsort(rows["idx"], kind="stable"))

"""The merged view of the semantic maps: per cell, the winning observation over every writer.

Per cell, each writer's current observation is its newest one (the highest time among its tile
record's entry and its per-cell record, if it has both; at equal times the tile's), and the cell
shows the writer observation with the highest (confidence, hlc, author key), tombstones included:
the rule per-cell records always had, so tiles and the per-cell records written before them merge
as one.

Cells with 1 to 3 integer coordinates live in columns (numpy rows of `_tiles.ROW`, 27 bytes a
cell), one set per tile: each writer's rows (from its tile record, and from its per-cell records
there) and the merged winners, which are the writer's own rows where one writer alone observed the
tile. Values are interned per map (`_mapstate`), so a row holds a 4-byte code. Cells named
otherwise ("door-3") keep their per-cell records. What changed is merged once per `flush`, tile by
tile.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from ._cellrows import Changes, Entry, by_tile, fold, locate_all, plain_rows, rows_of
from ._errors import RecordError
from ._mapstate import MapState, Source, TileRows
from ._models import MapRegion
from ._records import TILE_CELLS, FutureVersion, ParsedKey, RecordType, check_record, parse_key
from ._records import TILE_EDGE as EDGE
from ._recordtext import PlainCells
from ._tiles import (
    ROW,
    Tile,
    TileError,
    block,
    cell_coords,
    cells_of,
    decode,
    join,
    local_coords,
    locate,
    pick,
    tile_coords,
)

_LEGACY, _TILED = 0, 1  # the kinds of a writer's rows in a tile: from cell/ records, from its tile


def _last_per_cell(rows: np.ndarray) -> np.ndarray:
    """Of rows sorted by cell index (then ascending preference), the last of each cell."""
    index = rows["idx"]
    return pick(rows, np.append(index[1:] != index[:-1], True)) if len(rows) else rows


def _apart(rows: np.ndarray) -> pickle.PickleBuffer:
    """Rows as a buffer a snapshot keeps out of its pickle (loaded where it lies)."""
    return pickle.PickleBuffer(rows.data)


def _names(tile: tuple[int, ...], index: np.ndarray) -> list[str]:
    """The names ("x,y") of the cells at these indexes of a tile."""
    return [",".join(map(str, c)) for c in cells_of(tile, index).tolist()]


def _best(by_author: dict[bytes, dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
    """The winning (author, record) of a named cell's per-cell records."""
    return max(by_author.items(), key=lambda item: (item[1]["confidence"], item[1]["hlc"], item[0]))


class MapViews:
    """Every semantic map of a replica; `Views` hands it map records and asks it about cells."""

    def __init__(self) -> None:
        self.maps: dict[str, MapState] = {}
        self.authors: list[bytes] = []
        self._author_ids: dict[bytes, int] = {}
        # tiles decoded before the views see them (by ingest's check, by the writer): (author, key)
        # -> (record text, tile); the views take the tile instead of decoding the text again
        self.prepared: dict[tuple[bytes, str], tuple[str, Tile]] = {}
        # per-cell records' changes to fold into the writers' rows at the next flush
        self._legacy: dict[tuple[str, tuple[int, ...], int], list[Changes]] = {}
        self._touched: set[tuple[str, tuple[int, ...]]] = set()

    def _author(self, author: bytes) -> int:
        aid = self._author_ids.get(author)
        if aid is None:
            aid = self._author_ids[author] = len(self.authors)
            self.authors.append(author)
        return aid

    def _map(self, name: str) -> MapState:
        found = self.maps.get(name)
        if found is None:
            found = self.maps[name] = MapState()
        return found

    # --- changes --------------------------------------------------------------------------------
    def admit(self, author: bytes, changes: Mapping[str, str | None]) -> tuple[str, str] | None:
        """(reason, detail) if a tile record among an envelope's `changes` (strings within the
        record limits) is one every receiver refuses, else None; the tiles decoded are kept for the
        views (`take_prepared`).

        A tile record of a newer schema version is let through (kept, forwarded, not shown)."""
        if not any(map(str.startswith, changes, repeat("tile/"))):
            return None  # (a bulk write of cells: at one go)
        for key, text in changes.items():
            if text is None or not key.startswith("tile/"):
                continue
            try:
                parsed = parse_key(key)
                assert parsed is not None  # "tile" is a type this version knows
                # ingest held every string of the update to the record limits before applying it
                tile = decode(check_record(parsed, text, author.hex(), within_limits=True))
            except FutureVersion:
                continue
            except TileError as exc:
                return exc.reason, f"{key}: {exc}"
            except RecordError as exc:
                return "invalid_tile", f"{key}: {exc}"
            self.prepared[(author, key)] = (text, tile)
        return None

    def take_prepared(self, author: bytes, key: str, text: str) -> Tile | None:
        """The tile decoded from exactly this text before, if any (it is handed over once)."""
        found = self.prepared.pop((author, key), None)
        return found[1] if found is not None and found[0] == text else None

    def put(self, author: bytes, key: ParsedKey, content: Tile | dict[str, Any] | None) -> None:
        """Set (or with None, remove) `author`'s tile record or cell record under `key`; merged at
        the next `flush`."""
        aid = self._author(author)
        m = self._map(key.name)
        assert key.cell is not None  # cell and tile keys always name one
        if key.type is RecordType.TILE:
            tile = tile_coords(key.cell)
            self._touched.add((key.name, tile))
            sources = m.tiles.setdefault(tile, TileRows()).sources
            if content is None:
                sources.pop((aid, _TILED), None)
            else:
                assert isinstance(content, Tile)
                sources[(aid, _TILED)] = self._rows(m, content, aid)
            return
        assert not isinstance(content, Tile)
        self.put_cells(author, key.name, [(key.cell, content, None)])

    def put_cells(
        self,
        author: bytes,
        map_name: str,
        cells: Sequence[tuple[str, dict[str, Any] | None, tuple[float, int, bool, Any] | None]],
    ) -> None:
        """`put` for many (cell name, record or None, its `plain_cell` if the caller has it) of
        one map, at one go."""
        aid = self._author(author)
        m = self._map(map_name)
        located = locate_all([cell for cell, _content, _plain in cells])
        if located is not None:
            tiles, index = located
            rows = rows_of(index, [(c, p) for _, c, p in cells], m.code_of, aid)
            self._pend(map_name, aid, by_tile(tiles, rows))
            return
        grouped: dict[tuple[int, ...], tuple[list[int], list[Entry]]] = {}
        for cell, content, plain in cells:  # names of several kinds: one by one
            coords = cell_coords(cell)
            if coords is None:
                self._put_named(m, author, cell, content)
                continue
            tile, at = locate(coords)
            indexes, entries = grouped.setdefault(tile, ([], []))
            indexes.append(at)
            entries.append((content, plain))
        for tile, (indexes, entries) in grouped.items():
            part = rows_of(np.array(indexes, np.int64), entries, m.code_of, aid)
            self._pend(map_name, aid, [(tile, part)])

    def put_plain(
        self, author: bytes, map_name: str, cells: list[str], at: list[int], plain: PlainCells
    ) -> None:
        """`put_cells` for cells whose records ingest read into `plain` (at its rows `at`): their
        rows made from its columns, no record parsed (unless a cell is named otherwise)."""
        located, m = locate_all(cells), self._map(map_name)
        if located is None:  # names of several kinds: as `put_cells` takes them
            entries = [(cell, plain.record(row), None) for cell, row in zip(cells, at, strict=True)]
            self.put_cells(author, map_name, entries)
            return
        aid = self._author(author)
        tiles, index = located
        rows = plain_rows(index, at, plain, m.code_of_text, aid)
        self._pend(map_name, aid, by_tile(tiles, rows))

    def _pend(
        self, map_name: str, aid: int, parts: Iterable[tuple[tuple[int, ...], Changes]]
    ) -> None:
        """Queue per-cell records' changes, by tile, to fold at the next flush."""
        for tile, part in parts:
            self._legacy.setdefault((map_name, tile, aid), []).append(part)
            self._touched.add((map_name, tile))

    @staticmethod
    def _put_named(m: MapState, author: bytes, cell: str, content: dict[str, Any] | None) -> None:
        by_author = m.named.setdefault(cell, {})
        if content is None:
            by_author.pop(author, None)
            if not by_author:
                del m.named[cell]
        else:
            by_author[author] = content

    def _rows(self, m: MapState, tile: Tile, aid: int) -> np.ndarray:
        """A decoded tile's rows with this map's value codes and the author's id."""
        lut = np.zeros(max(len(tile.texts), 1), np.uint32)
        for i, text in enumerate(tile.texts):
            code = m.codes.get(text)
            if code is None:  # a value new to this map: the tile's own, or parsed from its text
                code = m.intern(text, json.loads(text) if tile.values is None else tile.values[i])
            lut[i] = code
        rows = tile.rows.copy()
        rows["code"] = np.where(rows["deleted"] == 0, lut[rows["code"]], 0)
        rows["author"] = aid
        return rows

    def drop(self, author: bytes) -> None:
        """Remove everything `author` wrote (its feed is folded in again next)."""
        aid = self._author_ids.get(author)
        if aid is None:
            return
        self.flush()
        for name, m in self.maps.items():
            for tile_key, tile in m.tiles.items():
                for source in [s for s in tile.sources if s[0] == aid]:
                    del tile.sources[source]
                    self._touched.add((name, tile_key))
            for cell in [c for c, by_author in m.named.items() if author in by_author]:
                self._put_named(m, author, cell, None)
        self.flush()

    def flush(self) -> None:
        """Merge every tile changed since the last flush."""
        for (name, tile_key, aid), pending in self._legacy.items():
            sources = self.maps[name].tiles.setdefault(tile_key, TileRows()).sources
            rows = fold(sources.get((aid, _LEGACY), np.empty(0, ROW)), pending)
            if len(rows):
                sources[(aid, _LEGACY)] = rows
            else:
                sources.pop((aid, _LEGACY), None)
        self._legacy.clear()
        for name, tile_key in self._touched:
            m = self.maps[name]
            tile = m.tiles[tile_key]
            for source in [s for s, rows in tile.sources.items() if not len(rows)]:
                del tile.sources[source]
            if tile.sources:
                tile.merged = self._merge(tile.sources)
            else:
                del m.tiles[tile_key]
        self._touched.clear()
        for name in [n for n, m in self.maps.items() if not m.tiles and not m.named]:
            del self.maps[name]

    def _merge(self, sources: dict[Source, np.ndarray]) -> np.ndarray:
        """Per cell: each writer's newest row, then the highest (confidence, hlc, author key)."""
        if len(sources) == 1:
            return next(iter(sources.values()))
        by_author: dict[int, list[tuple[int, np.ndarray]]] = defaultdict(list)
        for (aid, kind), rows in sources.items():
            by_author[aid].append((kind, rows))
        parts = []
        for kinds in by_author.values():
            if len(kinds) == 1:
                parts.append(kinds[0][1])
                continue
            both = join([rows for _kind, rows in kinds])
            tiled = np.repeat([k for k, _rows in kinds], [len(rows) for _kind, rows in kinds])
            newest = np.lexsort([tiled, both["hlc"], both["idx"]])  # at equal times, the tile's
            parts.append(_last_per_cell(pick(both, newest)))
        rows = join(parts)
        ranked = sorted(by_author, key=lambda aid: self.authors[aid])
        rank = np.zeros(max(ranked) + 1, np.int64)
        rank[ranked] = np.arange(len(ranked))
        order = np.lexsort([rank[rows["author"]], rows["hlc"], rows["conf"], rows["idx"]])
        return _last_per_cell(pick(rows, order))

    # --- reads ----------------------------------------------------------------------------------
    def cell(self, map_name: str, cell: str) -> tuple[bytes, dict[str, Any]] | None:
        """(author, {value, confidence, hlc, deleted}) of a cell's winning observation, or None."""
        m = self.maps.get(map_name)
        if m is None:
            return None
        coords = cell_coords(cell)
        if coords is None:
            by_author = m.named.get(cell)
            return _best(by_author) if by_author else None
        tile_key, index = locate(coords)
        tile = m.tiles.get(tile_key)
        if tile is None:
            return None
        rows = tile.merged
        at = int(np.searchsorted(rows["idx"], index))
        if at == len(rows) or rows["idx"][at] != index:
            return None
        row = rows[at]
        return self.authors[int(row["author"])], {
            "value": m.values[int(row["code"])],
            "confidence": float(row["conf"]),
            "hlc": int(row["hlc"]),
            "deleted": bool(row["deleted"]),
        }

    def cells(self, map_name: str) -> list[str]:
        """The names of every cell of a map that holds an observation (tombstones too), sorted."""
        m = self.maps.get(map_name)
        if m is None:
            return []
        names = list(m.named)
        for tile_key, tile in m.tiles.items():
            names += _names(tile_key, tile.merged["idx"])
        return sorted(names)

    def map_names(self) -> list[str]:
        return sorted(self.maps)

    def observations(self, map_name: str) -> list[tuple[str, bytes, Any, float, int, bool]]:
        """(cell, author, value, confidence, hlc, deleted) of every cell's winning observation."""
        m = self.maps.get(map_name)
        if m is None:
            return []
        out = []
        for cell, by_author in m.named.items():
            author, rec = _best(by_author)
            deleted = rec.get("deleted", False)  # a record may leave it out (see `plain_cell`)
            out.append((cell, author, rec["value"], rec["confidence"], rec["hlc"], deleted))
        for tile_key, tile in m.tiles.items():
            rows = tile.merged
            out += zip(
                _names(tile_key, rows["idx"]),
                [self.authors[a] for a in rows["author"].tolist()],
                [m.values[c] for c in rows["code"].tolist()],
                rows["conf"].tolist(),
                rows["hlc"].tolist(),
                (rows["deleted"] != 0).tolist(),
                strict=True,
            )
        return out

    def region(
        self, map_name: str, lo: Iterable[int], hi: Iterable[int], *, include_deleted: bool
    ) -> MapRegion:
        """The winning observations of the cells c with lo <= c < hi, per coordinate."""
        low, high = np.asarray(tuple(lo), np.int64), np.asarray(tuple(hi), np.int64)
        ndim = len(low)
        if ndim not in EDGE or high.shape != low.shape:
            raise ValueError("a region is bounded by two points of 1 to 3 integer coordinates")
        m = self.maps.get(map_name)
        chosen = []
        if m is not None and np.all(high > low):
            chosen = self._inside(m, low, high, include_deleted)
        rows = join([r for _k, r in chosen])
        origins = np.array([k for k, _r in chosen], np.int64).reshape(-1, ndim) * EDGE[ndim]
        cells = np.repeat(origins, [len(r) for _k, r in chosen], axis=0)
        cells += local_coords(rows["idx"], ndim)
        present = np.flatnonzero(np.bincount(rows["author"]))  # the authors, without sorting
        lut = np.zeros(len(self.authors), np.uint32)
        lut[present] = np.arange(len(present))
        palette = m.palette() if m is not None else np.empty(0, dtype=object)
        return MapRegion(
            map=map_name,
            cells=cells,
            values=palette[rows["code"]],
            confidence=rows["conf"].copy(),
            hlc=rows["hlc"].copy(),
            author=lut[rows["author"]],
            authors=tuple(self.authors[a].hex() for a in present.tolist()),
            deleted=rows["deleted"].astype(bool),
        )

    def _inside(
        self, m: MapState, low: np.ndarray, high: np.ndarray, include_deleted: bool
    ) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """(tile, its rows in the box [low, high)) of every tile of `m` the box meets."""
        ndim = len(low)
        edge = EDGE[ndim]
        first, last = low // edge, (high - 1) // edge
        ranges = [range(int(f), int(e) + 1) for f, e in zip(first, last, strict=True)]
        if math.prod(len(r) for r in ranges) <= len(m.tiles):
            keys: Iterable[tuple[int, ...]] = itertools.product(*ranges)
        else:  # a box larger than the map: look at the tiles there are
            keys = [k for k in m.tiles if len(k) == ndim]
        out = []
        stride = edge ** (ndim - 1)  # cells of one step along the first axis
        for key in keys:
            tile = m.tiles.get(key)
            if tile is None:
                continue
            origin = np.array(key, np.int64) * edge
            a, b = np.maximum(low - origin, 0), np.minimum(high - origin, edge)
            if np.any(b <= a):
                continue
            rows = tile.merged
            if len(rows) == TILE_CELLS:  # every cell observed: the box is a slice
                rows = block(rows, ndim, a, b)
                keep = None if include_deleted else rows["deleted"] == 0
            else:
                start, stop = np.searchsorted(rows["idx"], [a[0] * stride, b[0] * stride])
                rows = rows[start:stop]  # the rows within the box along the first axis
                local = local_coords(rows["idx"], ndim)[:, 1:]
                keep = np.all((local >= a[1:]) & (local < b[1:]), axis=1)
                if not include_deleted:
                    keep &= rows["deleted"] == 0
            out.append((key, rows if keep is None or keep.all() else pick(rows, keep)))
        return out

    def nbytes(self) -> int:
        """The bytes this view's columns and values take (what a map costs in memory)."""
        arrays: dict[int, int] = {}
        overhead = 0
        for m in self.maps.values():
            overhead += sum(len(t) + 80 for t in m.codes) + 64 * len(m.values)
            for tile in m.tiles.values():
                overhead += 400  # the tile, its dict of sources and its key
                for rows in (*tile.sources.values(), tile.merged):
                    arrays[id(rows)] = rows.nbytes + 112
        return sum(arrays.values()) + overhead

    # --- snapshots ------------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """Builtin values only (a snapshot's reader builds nothing else); the rows as buffers that
        a snapshot keeps out of its pickle (`_snapshot`)."""
        self.flush()
        maps = {}
        for name, m in self.maps.items():
            tiles = {}
            for key, tile in m.tiles.items():
                sources = {s: _apart(rows) for s, rows in tile.sources.items()}
                shared = any(tile.merged is rows for rows in tile.sources.values())
                tiles[key] = (sources, None if shared else _apart(tile.merged))
            maps[name] = {"values": m.values, "codes": m.codes, "named": m.named, "tiles": tiles}
        return {"authors": list(self.authors), "maps": maps}

    @classmethod
    def restore(cls, state: dict[str, Any]) -> MapViews:
        """What `export` gave; KeyError, TypeError or ValueError if it is not that."""
        views = cls()
        for author in state["authors"]:
            views._author(author)
        for name, saved in state["maps"].items():
            m = views.maps[name] = MapState()
            m.values, m.codes, m.named = list(saved["values"]), dict(saved["codes"]), saved["named"]
            for key, (sources, merged) in saved["tiles"].items():
                tile = m.tiles[tuple(key)] = TileRows()
                tile.sources = {s: np.frombuffer(b, ROW) for s, b in sources.items()}
                if merged is None:
                    (tile.merged,) = tile.sources.values()
                else:
                    tile.merged = np.frombuffer(merged, ROW)
        return views

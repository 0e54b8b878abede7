"""Semantic maps: kb.maps[name] (see `_mapview` for how cells merge, `_tiles` for tiles)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _tiles
from ._errors import RecordError
from ._models import MapRegion, Observation
from ._records import (
    RecordType,
    Role,
    cell_key,
    check_map_name,
    check_record,
    make_key,
    parse_key,
)
from ._replica import Replica


class SemanticMap:
    """One named semantic map: per cell, the observation with the highest (confidence, hlc,
    author), tombstones included.

    `observe` and `delete` write one record per cell; `observe_many` and `delete_many` write
    tiles of cells (one record per tile a writer touched: building scale); both merge per cell.
    """

    def __init__(self, replica: Replica, name: str) -> None:
        self._replica = replica
        self.name = check_map_name(name)

    def observe(self, cell: str | tuple[int, ...], value: Any, confidence: float) -> int:
        """Record what this writer sees in `cell` (any JSON value) with a confidence in [0, 1];
        returns the time stamped on it."""
        return self._put(cell, value, confidence, deleted=False)

    def delete(self, cell: str | tuple[int, ...], confidence: float) -> int:
        """A tombstone: this writer, with `confidence`, says the cell is now empty."""
        return self._put(cell, None, confidence, deleted=True)

    def _put(
        self, cell: str | tuple[int, ...], value: Any, confidence: float, *, deleted: bool
    ) -> int:
        replica = self._replica
        replica.require(Role.PUBLISH)
        key = cell_key(cell)
        hlc = replica.now()
        record = {"v": 1, "hlc": hlc, "value": value, "confidence": confidence, "deleted": deleted}
        replica.put_record(RecordType.CELL, self.name, record, key)
        return hlc

    def observe_many(
        self, cells: Any, values: Any, confidences: Any, *, palette: Sequence[Any] | None = None
    ) -> int:
        """Record many observations in tiles: `cells` is an n x d array of integer coordinates (d
        from 1 to 3, each a 32-bit integer), `values` n JSON values (or, with a `palette` of JSON
        values, n indices into it), `confidences` one number in [0, 1] or n of them.

        The batch shares one time, which this returns (0 for no cell); a cell given twice takes its
        last observation. Each tile the batch touches becomes this writer's new tile record, in as
        many envelopes as they need (inside `kb.batch()`, in the batch's one envelope, which must
        stay within the envelope limit), each durable when written. RecordError names the first
        bad input and writes nothing.
        """
        return self._put_many(_tiles.batch(cells, values, confidences, palette=palette))

    def delete_many(self, cells: Any, confidences: Any) -> int:
        """Tombstones for many cells (as `observe_many`)."""
        return self._put_many(_tiles.batch(cells, None, confidences, deleted=True))

    def _put_many(self, batch: _tiles.Batch | None) -> int:
        replica = self._replica
        own = replica.require(Role.PUBLISH).public_key
        if batch is None:
            return 0
        budget = replica.limits.max_envelope_bytes * 7 // 8  # room for the keys and the envelope
        with replica.lock:
            hlc = replica.now()
            tiles = []
            for tile, part in batch.parts():  # every tile made and checked before any is written
                key = make_key(RecordType.TILE, self.name, ",".join(map(str, tile)))
                text, built = _tiles.build(self._own_tile(own, key), part, batch.texts, hlc)
                refusal = _tiles.limits(text, built)
                if refusal is not None:
                    raise RecordError(f"tile {key} would be refused by peers: {refusal}")
                tiles.append((key, text, built))
            chunk: dict[str, str | None] = {}
            size = 0
            for key, text, built in tiles:
                if chunk and size + len(text) > budget and replica.pending is None:
                    replica.write(chunk)
                    chunk, size = {}, 0
                replica.views.maps.prepared[(own, key)] = (text, built)  # the views take it
                chunk[key] = text
                size += len(text)
            replica.write(chunk)
        return hlc

    def _own_tile(self, own: bytes, key: str) -> _tiles.Tile | None:
        """This writer's current tile under `key` (a write pending in a batch first), if any."""
        replica = self._replica
        text = replica.pending.get(key) if replica.pending is not None else None
        if text is None:
            feed = replica.feeds.get(own)
            text = feed.get(key) if feed is not None else None
        if text is None:
            return None
        prepared = replica.views.maps.prepared.get((own, key))
        if prepared is not None and prepared[0] == text:
            return prepared[1]
        parsed = parse_key(key)
        assert parsed is not None
        return _tiles.decode(check_record(parsed, text, own.hex()))

    def get(self, cell: str | tuple[int, ...]) -> Observation | None:
        """The winning observation of a cell (a tombstone shows as deleted=True), or None if never
        seen."""
        key = cell_key(cell)
        with self._replica.lock:
            best = self._replica.views.cell(self.name, key)
        if best is None:
            return None
        author, rec = best
        return Observation(
            self.name,
            key,
            rec["value"],
            rec["confidence"],
            rec["hlc"],
            author.hex(),
            rec.get("deleted", False),
        )

    def cells(self, *, include_deleted: bool = False) -> dict[str, Observation]:
        """Every cell's winning observation, by cell name in sorted order (for large maps,
        `region` answers in columns)."""
        with self._replica.lock:
            found = self._replica.views.maps.observations(self.name)
        return {
            cell: Observation(self.name, cell, value, conf, hlc, author.hex(), deleted)
            for cell, author, value, conf, hlc, deleted in sorted(found, key=lambda o: o[0])
            if include_deleted or not deleted
        }

    def region(
        self, lo: Sequence[int], hi: Sequence[int], *, include_deleted: bool = False
    ) -> MapRegion:
        """The winning observations of the cells c with lo <= c < hi in every coordinate (cells
        with integer coordinates, however written), as columns."""
        with self._replica.lock:
            return self._replica.views.maps.region(
                self.name, lo, hi, include_deleted=include_deleted
            )


class Maps:
    """kb.maps[name] gives a SemanticMap; iterating gives the names of maps that hold cells."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def __getitem__(self, name: str) -> SemanticMap:
        return SemanticMap(self._replica, name)

    def names(self) -> list[str]:
        with self._replica.lock:
            return self._replica.views.map_names()

"""One map's state in the merged view (`_mapview`), and how its values are interned.

A map's cells live in numpy rows (`_tiles.ROW`), one set per tile, and a row holds its value as a
4-byte code: the map interns each distinct value once, keyed by its canonical JSON, and keeps the
values by code (`palette` as an object array, for `region`). Canonical JSON is dear on the path of
every cell written, so a value parsed from a record is looked up by its repr and a value given as
JSON text by that text first; each of those caches is capped and starts over when full, which
costs a recomputation, never a second code for one value.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ._canonical import canonical_json
from ._tiles import ROW

_NULL = "null"  # code 0 of every map: a tombstone's value
_MAX_SEEN = 1 << 16  # values a map remembers by their repr, and by their text, before starting over

Source = tuple[int, int]  # (author id, kind)


class MapState:
    """One map: its tiles' rows, its values interned (code 0 is a tombstone's), its cells named
    otherwise (per-cell records by author)."""

    __slots__ = ("tiles", "codes", "values", "named", "_palette", "_seen", "_seen_text")

    def __init__(self) -> None:
        self.tiles: dict[tuple[int, ...], TileRows] = {}
        self.codes: dict[str, int] = {_NULL: 0}  # a value's canonical JSON -> its code
        self.values: list[Any] = [None]
        self.named: dict[str, dict[bytes, dict[str, Any]]] = {}  # non-coordinate cells
        self._palette: np.ndarray | None = None
        self._seen: dict[str, int] = {}  # a parsed value's repr -> its code
        self._seen_text: dict[str, int] = {}  # a value's JSON text -> its code

    def code_of(self, value: Any) -> int:
        """The code of a value parsed from a record's JSON. Of such values (dicts, lists, strings,
        numbers, booleans, None), equal reprs mean equal values, and a repr costs a fraction of
        the canonical JSON that `codes` is keyed by."""
        seen = repr(value)
        code = self._seen.get(seen)
        if code is None:
            if len(self._seen) >= _MAX_SEEN:
                self._seen.clear()
            code = self._seen[seen] = self.intern(canonical_json(value).decode(), value)
        return code

    def code_of_text(self, text: str) -> int:
        """The code of a value given as its JSON text (a bulk write's cell, `plain_rows`): equal
        texts are equal values, so a text is parsed once."""
        code = self._seen_text.get(text)
        if code is None:
            if len(self._seen_text) >= _MAX_SEEN:
                self._seen_text.clear()
            code = self._seen_text[text] = self.code_of(json.loads(text))
        return code

    def intern(self, text: str, value: Any) -> int:
        code = self.codes.get(text)
        if code is None:
            code = self.codes[text] = len(self.values)
            self.values.append(value)
        return code

    def palette(self) -> np.ndarray:
        """The values as an object array, indexed by code."""
        if self._palette is None or len(self._palette) != len(self.values):
            palette = np.empty(len(self.values), dtype=object)
            for i, value in enumerate(self.values):
                palette[i] = value
            self._palette = palette
        return self._palette


class TileRows:
    """A tile's rows: each source's (a writer's tile record, or its per-cell records there), and
    the merged winners (a source's very array where it is the only one)."""

    __slots__ = ("sources", "merged")

    def __init__(self) -> None:
        self.sources: dict[Source, np.ndarray] = {}
        self.merged: np.ndarray = np.empty(0, ROW)

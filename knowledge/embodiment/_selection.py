"""A standing filter over a `SkillIndex`: the skill ids a search may return, as a bitmap over the
index's id numbers, which FAISS reads directly (`IDSelectorBitmap`), so that filtering costs no
Python per query.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import faiss
import numpy as np


class Numbering(Protocol):
    """What a selection reads of its index (`SkillIndex`): the id number of each skill id, never
    reused, and the lock that guards them."""

    _lock: threading.RLock
    _numbers: dict[str, int]
    _names: list[str]

    def _number(self, skill_id: str) -> int: ...


class Selection:
    """The skill ids a search may return, held as a bitmap over the index's id numbers.

    Build one with `SkillIndex.select` for each standing filter (active skills, one task family,
    ...) and keep it up to date with `add`/`discard`: a search then filters at no per-query Python
    cost. Ids that the index does not hold yet may be selected; they become searchable when they are
    added.
    """

    def __init__(self, index: Numbering, bits: np.ndarray) -> None:
        self._index = index
        self._bits = bits
        self._count = int(np.count_nonzero(bits))
        self._packed: np.ndarray | None = None

    def add(self, skill_id: str) -> None:
        with self._index._lock:
            number = self._index._number(skill_id)
            self._grow(number + 1)
            if not self._bits[number]:
                self._bits[number] = True
                self._count += 1
                self._packed = None

    def discard(self, skill_id: str) -> None:
        with self._index._lock:
            number = self._index._numbers.get(skill_id)
            if number is not None and number < len(self._bits) and self._bits[number]:
                self._bits[number] = False
                self._count -= 1
                self._packed = None

    def __contains__(self, skill_id: object) -> bool:
        number = self._index._numbers.get(skill_id) if isinstance(skill_id, str) else None
        return number is not None and number < len(self._bits) and bool(self._bits[number])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        names = self._index._names
        return iter([names[number] for number in np.flatnonzero(self._bits)])

    def __and__(self, other: Selection) -> Selection:
        return self._combine(other, np.logical_and)

    def __or__(self, other: Selection) -> Selection:
        return self._combine(other, np.logical_or)

    def __sub__(self, other: Selection) -> Selection:
        return self._combine(other, lambda a, b: a & ~b)

    def _combine(
        self, other: Selection, op: Callable[[np.ndarray, np.ndarray], np.ndarray]
    ) -> Selection:
        if other._index is not self._index:
            raise ValueError("selections of different indexes cannot be combined")
        with self._index._lock:
            size = max(
                len(self._index._names), len(self._bits), len(other._bits)
            )  # `_grow` may overshoot
            return Selection(self._index, op(self._padded(size), other._padded(size)))

    def _grow(self, size: int) -> None:
        if size > len(self._bits):
            self._bits = self._padded(max(size, 2 * len(self._bits)))

    def _padded(self, size: int) -> np.ndarray:
        bits = np.zeros(max(size, len(self._bits)), bool)
        bits[: len(self._bits)] = self._bits
        return bits

    def _selector(self) -> faiss.IDSelector:
        """A FAISS bitmap selector over the packed bits, valid while the selection is unchanged (the
        index lock, held by searches and by `add`/`discard`, sees to that)."""
        if self._packed is None:
            self._packed = np.packbits(self._bits, bitorder="little")
        return faiss.IDSelectorBitmap(self._packed.size, faiss.swig_ptr(self._packed))

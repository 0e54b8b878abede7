"""Nearest-neighbour search over skill embeddings on FAISS, kept in step with a changing set of
skills.

The index knows skills only by string id and vector. It is exact (`IndexIDMap2` over a flat index)
up to `approximate_above` vectors, and IVF beyond, because IVF, unlike HNSW, removes vectors in
place and keeps its recall under filters. Every skill id gets an id number (int64) that is never
reused, so a `Selection` (a bitmap of allowed numbers) stays valid while skills come and go.

A saved index is a cache tagged with its `EmbeddingSpace`: `SkillIndex.load` gives None when the
file is missing, stale (another encoder or version) or damaged, and the caller rebuilds it from its
skills.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import struct
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Literal, NamedTuple, cast

import faiss
import numpy as np
from numpy.typing import ArrayLike

from ._encoders import EmbeddingSpace
from ._selection import Selection

log = logging.getLogger(__name__)

APPROXIMATE_ABOVE = 200_000
"""Default size above which the index turns approximate: a flat scan of 200k x 32-d takes ~0.5 ms on
one core."""
TARGET_RECALL = 0.99
"""Recall@10 that the IVF probe count is calibrated to reach, on queries between stored vectors."""
_MAGIC = b"SIMNETIX"
_FORMAT = 1
_OVERFETCH_LIMIT = 1024
"""Most candidates fetched unfiltered for a filtered search; sparser filters go to FAISS's own
selector."""

IndexKind = Literal["exact", "ivf"]


class Hit(NamedTuple):
    """One search result: smaller distance is nearer (L2 distance, or 1 - cosine similarity)."""

    skill_id: str
    distance: float


Allowed = Selection | Collection[str] | Callable[[str], bool]
"""A filter: a `Selection`, a collection of skill ids, or a predicate on skill ids."""


class SkillIndex:
    """Skill ids and their embeddings in one `EmbeddingSpace`; add, remove, search, save.

    Thread-safe: one lock orders all calls (FAISS may not search while the index changes).
    """

    def __init__(
        self, space: EmbeddingSpace, *, approximate_above: int = APPROXIMATE_ABOVE
    ) -> None:
        self.space = space
        self.approximate_above = approximate_above
        self._lock = threading.RLock()
        self._numbers: dict[str, int] = {}
        self._names: list[str] = []
        self._live = np.zeros(0, bool)
        self._count = 0
        self._faiss: faiss.Index = self._exact_index()
        self._nprobe = 0
        self._trained_on = 0
        self._recall = 1.0

    @property
    def _ivf(self) -> faiss.IndexIVF:
        """The index of an "ivf" kind: FAISS hands out the concrete class, its stubs say `Index`."""
        return cast(faiss.IndexIVF, self._faiss)

    # -- state -------------------------------------------------------------------------------------

    @property
    def kind(self) -> IndexKind:
        return "ivf" if self._nprobe else "exact"

    @property
    def recall(self) -> float:
        """Recall@10 measured when the approximate index was last calibrated; 1.0 when exact."""
        return self._recall

    def __len__(self) -> int:
        return self._count

    def __contains__(self, skill_id: object) -> bool:
        number = self._numbers.get(skill_id) if isinstance(skill_id, str) else None
        return number is not None and bool(self._live[number])

    def ids(self) -> list[str]:
        with self._lock:
            return [self._names[number] for number in np.flatnonzero(self._live)]

    def vectors(self, skill_ids: Sequence[str]) -> np.ndarray:
        """The held vectors of these skills, shape (n, dim), as stored (unit length for cosine);
        KeyError for a skill not held."""
        with self._lock:
            missing = [s for s in skill_ids if s not in self]
            if missing:
                raise KeyError(f"not in the index: {', '.join(missing[:3])}")
            numbers = np.array([self._numbers[s] for s in skill_ids], np.int64)
            return self._faiss.reconstruct_batch(numbers).reshape(len(numbers), self.space.dim)

    def select(self, skill_ids: Iterable[str] = ()) -> Selection:
        """A `Selection` of these skill ids, for filtered searches."""
        with self._lock:
            numbers = [self._number(skill_id) for skill_id in skill_ids]
            bits = np.zeros(len(self._names), bool)
            bits[numbers] = True
            return Selection(self, bits)

    # -- changes -----------------------------------------------------------------------------------

    def add(self, skill_ids: Sequence[str], vectors: ArrayLike) -> None:
        """Add skills with their vectors (shape (n, dim)); a skill already held gets its new
        vector."""
        ids = list(skill_ids)
        matrix = self._matrix(vectors)
        if len(ids) != len(matrix):
            raise ValueError(f"{len(ids)} skill ids but {len(matrix)} vectors")
        if len(set(ids)) != len(ids):
            raise ValueError("skill ids repeat within one add")
        with self._lock:
            numbers = np.array([self._number(skill_id) for skill_id in ids], np.int64)
            replaced = numbers[self._live[numbers]]
            if len(replaced):
                self._faiss.remove_ids(faiss.IDSelectorArray(replaced))
            self._faiss.add_with_ids(matrix, numbers)
            self._live[numbers] = True
            self._count += len(numbers) - len(replaced)
            self._restructure()

    def remove(self, skill_ids: Iterable[str]) -> int:
        """Remove skills (for example on revocation); returns how many the index held."""
        with self._lock:
            numbers = {
                self._numbers[s]
                for s in skill_ids
                if s in self._numbers and self._live[self._numbers[s]]
            }
            if not numbers:
                return 0
            held = np.fromiter(numbers, np.int64, len(numbers))
            self._faiss.remove_ids(faiss.IDSelectorArray(held))
            self._live[held] = False
            self._count -= len(held)
            self._restructure()
            return len(held)

    def rebuild(self) -> None:
        """Rebuild from the held vectors: choose exact or IVF by size, retrain and recalibrate
        IVF."""
        with self._lock:
            numbers = np.flatnonzero(self._live).astype(np.int64)
            vectors = self._faiss.reconstruct_batch(numbers)
            if len(numbers) > self.approximate_above:
                self._build_ivf(numbers, vectors)
            else:
                self._faiss, self._nprobe, self._trained_on, self._recall = (
                    self._exact_index(),
                    0,
                    0,
                    1.0,
                )
                self._faiss.add_with_ids(vectors, numbers)

    def _restructure(self) -> None:
        """Switch to IVF above the threshold, back to exact below half of it, retrain IVF after
        doubling."""
        if self.kind == "exact":
            if self._count > self.approximate_above:
                self.rebuild()
        elif self._count < self.approximate_above // 2 or self._count > 2 * self._trained_on:
            self.rebuild()

    # -- search ------------------------------------------------------------------------------------

    def search(self, query: ArrayLike, k: int = 10, *, allowed: Allowed | None = None) -> list[Hit]:
        """The `k` nearest skills to one vector, nearest first, among `allowed` skills when
        given."""
        matrix = self._matrix(np.asarray(query, np.float32).reshape(1, -1))
        with self._lock:
            threads = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(
                1
            )  # one query: OpenMP threads only add overhead (per calling thread)
            try:
                distances, numbers = self._search(matrix, k, allowed)
            finally:
                faiss.omp_set_num_threads(threads)
            return self._hits(distances[0], numbers[0])

    def search_many(
        self, queries: ArrayLike, k: int = 10, *, allowed: Allowed | None = None
    ) -> list[list[Hit]]:
        """`search` for each row of `queries` (shape (n, dim)), with FAISS threads across
        queries."""
        matrix = self._matrix(queries)
        with self._lock:
            distances, numbers = self._search(matrix, k, allowed)
            return [self._hits(d, n) for d, n in zip(distances, numbers, strict=True)]

    def _search(
        self, queries: np.ndarray, k: int, allowed: Allowed | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if self._count == 0:
            return _nothing(len(queries), k)
        if allowed is None:
            k = min(k, self._count)
            distances, numbers = self._faiss.search(queries, k)
            return self._probe_all_if_short(queries, k, distances, numbers, None)
        if isinstance(allowed, Selection):
            if allowed._index is not self:
                raise ValueError("this selection belongs to another index")
            return self._search_selection(queries, k, allowed)
        if isinstance(allowed, str):
            raise TypeError("allowed must be a collection of skill ids, not one string")
        if callable(allowed):
            return self._search_predicate(queries, k, allowed)
        known = [self._numbers[s] for s in allowed if s in self._numbers]
        bits = np.zeros(len(self._names), bool)
        bits[known] = True
        return self._search_selection(queries, k, Selection(self, bits))

    def _search_selection(
        self, queries: np.ndarray, k: int, selection: Selection
    ) -> tuple[np.ndarray, np.ndarray]:
        """Over-fetch unfiltered and keep allowed ids when the selection is dense (FAISS's own
        selector slows a flat scan ~2-3x); query with the selector for rows that come back short,
        and for sparse selections. On an exact index both paths give the exact answer."""
        fraction = min(1.0, len(selection) / self._count) if len(selection) else 0.0
        out_d, out_n = _nothing(len(queries), k)
        if fraction == 0.0:
            return out_d, out_n
        fetch = min(self._count, math.ceil(2 * k / fraction) + 16)
        selection._grow(len(self._names))
        bits = selection._bits
        short = list(range(len(queries)))
        if fetch <= _OVERFETCH_LIMIT:
            distances, numbers = self._faiss.search(queries, fetch)
            keep = bits[numbers] & (numbers >= 0)
            complete = self.kind == "exact" and fetch == self._count
            short = []
            for row in range(len(queries)):
                found = np.flatnonzero(keep[row])[:k]
                if len(found) < k and not complete:
                    short.append(row)
                out_d[row, : len(found)] = distances[row, found]
                out_n[row, : len(found)] = numbers[row, found]
        if short:
            selector = selection._selector()
            if self.kind == "exact":
                # FAISS's SearchParameters take their fields as keywords (not in its stubs)
                params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
            else:
                nprobe = min(self._ivf.nlist, math.ceil(self._nprobe / fraction))
                params = faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)  # type: ignore[call-arg]
            distances, numbers = self._faiss.search(queries[short], k, params=params)
            out_d[short], out_n[short] = self._probe_all_if_short(
                queries[short], k, distances, numbers, selector
            )
        return out_d, out_n

    def _probe_all_if_short(
        self,
        queries: np.ndarray,
        k: int,
        distances: np.ndarray,
        numbers: np.ndarray,
        selector: faiss.IDSelector | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """IVF rows that came back with fewer than k skills may have probed too few lists: probe
        them all, so a search returns k skills whenever k (allowed) skills are held."""
        short = np.flatnonzero((numbers < 0).any(axis=1))
        if self.kind == "exact" or not len(short) or self._nprobe >= self._ivf.nlist:
            return distances, numbers
        params = faiss.SearchParametersIVF(nprobe=self._ivf.nlist)  # type: ignore[call-arg]
        if selector is not None:
            params.sel = selector
        distances[short], numbers[short] = self._faiss.search(queries[short], k, params=params)
        return distances, numbers

    def _search_predicate(
        self, queries: np.ndarray, k: int, allowed: Callable[[str], bool]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Test the predicate on candidates nearest first, fetching four times more until k pass; if
        the whole index is fetched without k passing, fall back to a selection of every passing
        skill."""
        verdicts: dict[int, bool] = {}

        def passes(number: int) -> bool:
            if number not in verdicts:
                verdicts[number] = bool(allowed(self._names[number]))
            return verdicts[number]

        out_d, out_n = _nothing(len(queries), k)
        pending, fetch = list(range(len(queries))), min(4 * k, self._count)
        while pending:
            distances, numbers = self._faiss.search(queries[pending], fetch)
            still = []
            for row, dist, nums in zip(pending, distances, numbers, strict=True):
                found = [i for i, n in enumerate(nums) if n >= 0 and passes(int(n))][:k]
                out_d[row, : len(found)], out_n[row, : len(found)] = dist[found], nums[found]
                if len(found) < k:
                    still.append(row)
            if not still or (self.kind == "exact" and fetch == self._count):
                break
            if fetch == self._count:
                everyone = self.select(s for s in self.ids() if passes(self._numbers[s]))
                out_d[still], out_n[still] = self._search_selection(queries[still], k, everyone)
                break
            pending, fetch = still, min(4 * fetch, self._count)
        return out_d, out_n

    def _hits(self, distances: np.ndarray, numbers: np.ndarray) -> list[Hit]:
        found = numbers >= 0
        if self.space.metric == "l2":
            values = np.sqrt(np.maximum(distances[found], 0.0))
        else:
            values = 1.0 - distances[found]
        return [
            Hit(self._names[n], d)
            for n, d in zip(numbers[found].tolist(), values.tolist(), strict=True)
        ]

    # -- persistence -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to `path` atomically, tagged with its embedding space."""
        with self._lock:
            header = {
                "format": _FORMAT,
                "space": [self.space.name, self.space.version, self.space.dim, self.space.metric],
                "nprobe": self._nprobe,
                "trained_on": self._trained_on,
                "recall": self._recall,
                "names": self._names,
                "live": base64.b64encode(
                    np.packbits(self._live[: len(self._names)]).tobytes()
                ).decode(),
            }
            blob = json.dumps(header, separators=(",", ":")).encode()
            body = faiss.serialize_index(self._faiss)
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(temporary, "wb") as out:
            out.write(_MAGIC + struct.pack("<Q", len(blob)) + blob)
            out.write(body.tobytes())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        space: EmbeddingSpace,
        *,
        approximate_above: int = APPROXIMATE_ABOVE,
    ) -> SkillIndex | None:
        """The index saved at `path`, or None when it is missing, from another embedding space (the
        encoder changed) or unreadable: the index is a cache, so the caller then rebuilds it from
        the skills."""
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("skill index %s is unreadable (%s); rebuild it", path, exc)
            return None
        try:
            if data[:8] != _MAGIC:
                raise ValueError("not a skill index file")
            (size,) = struct.unpack("<Q", data[8:16])
            header = json.loads(data[16 : 16 + size])
            if header["format"] != _FORMAT:
                raise ValueError(f"format {header['format']} is not {_FORMAT}")
            if EmbeddingSpace(*header["space"]) != space:
                log.info(
                    "skill index %s was built for %s, not %s; rebuild it",
                    path,
                    header["space"],
                    space,
                )
                return None
            index = cls(space, approximate_above=approximate_above)
            index._faiss = faiss.deserialize_index(
                np.frombuffer(data, np.uint8, offset=16 + size).copy()
            )
            index._names = [str(name) for name in header["names"]]
            index._numbers = {name: number for number, name in enumerate(index._names)}
            live = np.unpackbits(np.frombuffer(base64.b64decode(header["live"]), np.uint8))[
                : len(index._names)
            ]
            index._live = live.astype(bool)
            index._count = int(live.sum())
            index._nprobe, index._trained_on = int(header["nprobe"]), int(header["trained_on"])
            index._recall = float(header["recall"])
            held = (index._faiss.ntotal, index._faiss.d, len(index._numbers))
            if held != (index._count, space.dim, len(index._names)):
                raise ValueError("the vectors do not match the skill ids")
            if index._nprobe:
                index._ivf.nprobe = index._nprobe
            return index
        except Exception as exc:  # any damage to a cache file means: rebuild it
            log.warning("skill index %s is damaged (%s); rebuild it", path, exc)
            return None

    # -- internals ---------------------------------------------------------------------------------

    def _number(self, skill_id: str) -> int:
        number = self._numbers.get(skill_id)
        if number is None:
            if not isinstance(skill_id, str) or not skill_id:
                raise ValueError(f"skill ids are non-empty strings, got {skill_id!r}")
            number = len(self._names)
            self._numbers[skill_id] = number
            self._names.append(skill_id)
            if number >= len(self._live):
                live = np.zeros(max(1024, 2 * len(self._live)), bool)
                live[: len(self._live)] = self._live
                self._live = live
        return number

    def _matrix(self, vectors: ArrayLike) -> np.ndarray:
        matrix = np.array(vectors, np.float32, order="C", ndmin=2)
        if matrix.ndim != 2 or matrix.shape[1] != self.space.dim:
            raise ValueError(f"vectors must have shape (n, {self.space.dim}), got {matrix.shape}")
        if not np.isfinite(matrix).all():
            raise ValueError("vectors must be finite")
        if self.space.metric == "cosine":
            faiss.normalize_L2(matrix)
        return matrix

    def _metric(self) -> int:
        return faiss.METRIC_L2 if self.space.metric == "l2" else faiss.METRIC_INNER_PRODUCT

    def _exact_index(self) -> faiss.Index:
        return faiss.index_factory(self.space.dim, "IDMap2,Flat", self._metric())

    def _build_ivf(self, numbers: np.ndarray, vectors: np.ndarray) -> None:
        """Train IVF with about 4 sqrt(n) lists, then find the fewest probes that reach
        `TARGET_RECALL`."""
        n = len(numbers)
        nlist = max(
            1, min(int(4 * math.sqrt(n)), n // 39)
        )  # FAISS wants >= 39 training points per list
        rng = np.random.default_rng(0)
        index = cast(
            faiss.IndexIVF, faiss.index_factory(self.space.dim, f"IVF{nlist},Flat", self._metric())
        )
        index.cp.min_points_per_centroid = (
            1  # small indexes (in tests) train on few points, knowingly
        )
        index.train(vectors[rng.choice(n, min(n, 64 * nlist), replace=False)])
        # reconstruct and remove by id (FAISS's stubs lack DirectMap)
        index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
        index.add_with_ids(vectors, numbers)
        # calibration queries: points on segments between stored vectors, where new bodies tend to
        # fall
        starts, ends = vectors[rng.integers(n, size=200)], vectors[rng.integers(n, size=200)]
        queries = self._matrix(starts + rng.random((200, 1), np.float32) * (ends - starts))
        k = min(10, n)
        truth, _ = faiss.knn(queries, vectors, k, metric=self._metric())
        nprobe = 1
        while True:
            index.nprobe = nprobe
            found, _ = index.search(queries, k)
            recall = recall_at_k(found, truth, self.space.metric)
            if recall >= TARGET_RECALL or nprobe >= nlist:
                break
            nprobe = min(2 * nprobe, nlist)
        self._faiss, self._nprobe, self._trained_on, self._recall = index, nprobe, n, recall
        log.info(
            "skill index: IVF over %d vectors, %d lists, nprobe %d, recall@%d %.3f",
            n,
            nlist,
            nprobe,
            k,
            recall,
        )


def _nothing(rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Search output with no skill found, in FAISS's layout (id -1 pads missing results)."""
    return np.full((rows, k), np.inf, np.float32), np.full((rows, k), -1, np.int64)


def recall_at_k(found: np.ndarray, truth: np.ndarray, metric: Literal["l2", "cosine"]) -> float:
    """Tie-aware recall: the share of returned distances (rows of FAISS output) no worse than the
    k-th true distance. Many skills share one embodiment, so equal vectors are common and ids would
    under-count."""
    if truth.size == 0:
        return 1.0
    kth = truth[:, -1:]
    if metric == "l2":
        good = found <= kth + 1e-5 * np.maximum(np.abs(kth), 1.0)
    else:
        good = found >= kth - 1e-5
    return float(good.mean())

"""Skills found by embodiment: a FAISS index that follows a knowledge base's skill library.

The scope convention: each entry of a skill record's `embodiments` list is an
`Embodiment.to_dict()`. Entries that are not valid descriptors (an older `{"fingerprint": ...}` tag,
a peer's malformed data), and bodies the encoder cannot encode (numbers no robot has), are skipped,
and a skill with no valid entry cannot be found by embodiment.

The index holds one vector per skill and distinct scope body, named "<skill id>/<position in the
list>"; a query ranks a skill by its nearest body. Withdrawn skills leave the index. Revoked and
inactive ones stay, so that `active_only=False` can show them with their state, and standing
`Selection`s (active skills, a task family, a certificate strength) filter inside the search. Skill
records are immutable, so the index's contents depend only on which skills are present and on the
encoder: after a reopen, a saved index is brought up to date by comparing skill ids, without
encoding again what it holds.

An encoder with a guard (`Encoder.guard`) ranks by `guarded` distances, which are never below its
own: the search fetches the nearest entries by its own distance until the k-th best guarded
distance is no farther than the last fetched, so the result is what ranking every entry would give.
The entries' vectors in the guard's space are read from the guard's own index, kept and saved like
any other.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._canonical import canonical_json
from .._errors import EmbodimentError
from .._models import CertificateSummary, QueryResult, Skill
from .._records import RecordType
from .._store import MEMORY
from ..stats import wilson_lower_bound
from ._cache import DescriptorCache
from ._descriptors import Embodiment
from ._encoders import EmbeddingSpace, Encoder, FeatureEncoder
from ._index import Hit, SkillIndex
from ._selection import Selection

if TYPE_CHECKING:
    from .._replica import Replica

log = logging.getLogger(__name__)

EmbodimentInput = Embodiment | str | os.PathLike[str]
"""An `Embodiment`, a path to an MJCF or URDF file (URDF by its `.urdf` or `.xacro` suffix), or MJCF
text."""

SAVE_FRACTION = 0.01
"""Save the index once the vectors added or removed since the last save reach this share of it: a
reopen then encodes at most that many bodies again, and a busy site does not rewrite a large file on
every query."""
_MAX_FILTERS = 32
"""Standing selections kept (LRU): task families and certificate strengths come from queries and
peers."""
_MAX_BODIES = 65_536
"""Distinct scope descriptors whose vectors are cached: skills of one fleet share a few bodies."""
_START = (-1, 0)
"""A views position no views have: the first sync reads every skill."""

_URDF_SUFFIXES = (".urdf", ".xacro")
Filter = tuple[str, Any]
"""("active", None), ("task", family) or ("branches", minimum)."""


@dataclass(frozen=True, slots=True)
class _Guard:
    """A query's guard: the encoder whose `guarded` rule ranks, the query body's vector in its
    guard's space, and the guard's own index of the skills (kept and saved like any other), where
    the skills' vectors in that space are read."""

    encoder: Encoder
    vector: np.ndarray
    library: _Library


@dataclass(slots=True)
class _State:
    """What the filters need to know of a present (not withdrawn) skill."""

    task: str
    entries: tuple[str, ...]
    active: bool
    branches: int


def _passes(state: _State, key: Filter) -> bool:
    kind, value = key
    if kind == "active":
        return state.active
    if kind == "task":
        return state.task == value
    return state.branches >= value


class Retrieval:
    """The engine behind `kb.skills.query`: one `_Library` per embedding space that queries have
    used."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica
        self._libraries: dict[EmbeddingSpace, _Library] = {}
        self.descriptors = DescriptorCache(descriptor_cache_path(replica.store.path))

    def query(
        self,
        embodiment: EmbodimentInput,
        *,
        task: str | None,
        k: int,
        active_only: bool,
        min_certified_branches: int,
        encoder: Encoder | None,
    ) -> list[QueryResult]:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if min_certified_branches < 0:
            raise ValueError(f"min_certified_branches must be >= 0, got {min_certified_branches}")
        encoder = encoder or FeatureEncoder()
        body = as_embodiment(embodiment, self.descriptors)  # compiling a file needs no lock
        vector, ood = encoder.assess(body)
        guard_vector = None
        if ood is not None and ood > 1.0 and encoder.fallback is not None:
            encoder = encoder.fallback  # out of the learned encoder's depth: rank by the fallback
            vector = encoder.encode(body)
        elif encoder.guard is not None:
            guard_vector = encoder.guard.encode(body)
        filters: list[Filter] = [("active", None)] if active_only else []
        filters += [("task", task)] if task is not None else []
        filters += [("branches", min_certified_branches)] if min_certified_branches else []
        with self._replica.lock:
            guard = None
            if guard_vector is not None and encoder.guard is not None:
                guard = _Guard(encoder, guard_vector, self._library(encoder.guard))
                guard.library.follow()
            results = self._library(encoder).query(vector, k, filters, guard)
        return [replace(r, ood=ood, ranked_by=encoder.name) for r in results]

    def _library(self, encoder: Encoder) -> _Library:
        library = self._libraries.get(encoder.space)
        if library is None:
            library = self._libraries[encoder.space] = _Library(self._replica, encoder)
        return library

    def describe(
        self,
        path: str | os.PathLike[str],
        *,
        urdf: bool | None,
        floating_base: bool | None,
        package_path: Iterable[str | os.PathLike[str]] | None,
        balance_inertia: bool,
    ) -> Embodiment:
        """`Skills.describe`: only options that differ from the defaults join the cache key, so
        that asking with the defaults spelled out is the same entry as a query by path."""
        path = Path(path)
        if urdf is None:
            urdf = path.suffix.lower() in _URDF_SUFFIXES
        options: dict[str, Any] = {}
        if package_path:
            options["package_path"] = [str(Path(p).resolve()) for p in package_path]
        if balance_inertia:
            options["balance_inertia"] = True
        if options and not urdf:
            raise EmbodimentError(
                f"{path}: it is read as MJCF, and {', '.join(sorted(options))}: options of the "
                "URDF reader, do not apply"
            )
        if floating_base is not None:
            options["floating_base"] = bool(floating_base)
        return self.descriptors.read(path, urdf=urdf, **options)

    def flush(self) -> None:
        """Save every index with unsaved changes (on close), so the next open need not re-encode."""
        with self._replica.lock:
            for library in self._libraries.values():
                library.save()


def as_embodiment(embodiment: EmbodimentInput, cache: DescriptorCache | None = None) -> Embodiment:
    """Read a query's body (a file through `cache`, when given); EmbodimentError names the file
    or the input and the problem."""
    if isinstance(embodiment, Embodiment):
        return embodiment
    if isinstance(embodiment, str) and embodiment.lstrip().startswith("<"):
        return Embodiment.from_mjcf(embodiment)
    if isinstance(embodiment, (str, os.PathLike)):
        path = Path(embodiment)
        urdf = path.suffix.lower() in _URDF_SUFFIXES
        if cache is not None:
            return cache.read(path, urdf=urdf)
        return Embodiment.from_urdf(path) if urdf else Embodiment.from_mjcf(path)
    raise EmbodimentError(
        "a query's embodiment is an Embodiment, a path to MJCF or URDF, or MJCF text; "
        f"got {type(embodiment).__name__}"
    )


def index_path(store_path: str, encoder: Encoder) -> Path | None:
    """Where an encoder's index of a store is saved: beside it, named by the encoder; None in
    memory."""
    if store_path == MEMORY:
        return None
    return Path(f"{store_path}.{re.sub(r'[^A-Za-z0-9_.-]', '_', encoder.name)}.index")


def descriptor_cache_path(store_path: str) -> Path | None:
    """Where a store's query bodies are cached (`_cache`): beside it; None in memory."""
    return None if store_path == MEMORY else Path(f"{store_path}.embodiments")


def certificate_summary(replica: Replica, skill_id: str) -> CertificateSummary:
    """Count, total branches and best Wilson lower bound (at the policy's confidence) of a skill's
    certificates, as the views show them (from writers trusted to validate). Call with the lock
    held."""
    confidence = replica.policy.activation.confidence
    certificates = [record for _id, record in replica.views.certificates(skill_id)]
    return CertificateSummary(
        count=len(certificates),
        branches=sum(c["branches"] for c in certificates),
        best_lower_bound=max(
            (wilson_lower_bound(c["successes"], c["branches"], confidence) for c in certificates),
            default=0.0,
        ),
    )


class _Library:
    """One encoder's index of one replica's skills, with standing filters. Call with the lock
    held."""

    def __init__(self, replica: Replica, encoder: Encoder) -> None:
        self._replica = replica
        self._encoder = encoder
        self._path = index_path(replica.store.path, encoder)
        loaded = SkillIndex.load(self._path, encoder.space) if self._path is not None else None
        self._index = loaded or SkillIndex(encoder.space)
        self._skills: dict[str, _State] = {}
        self._filters: OrderedDict[Filter, Selection] = OrderedDict()
        self._bodies: dict[
            bytes, tuple[str, np.ndarray] | None
        ] = {}  # descriptor hash -> (fingerprint, vector)
        self._position = _START
        self._unsaved = 0

    def query(
        self, vector: np.ndarray, k: int, filters: list[Filter], guard: _Guard | None = None
    ) -> list[QueryResult]:
        self.follow()
        results = self._search(vector, k, filters, guard)
        if not all(self._admits(result, filters) for result in results):
            # the views log missed a change (it must not): the filters are a cache, so start over
            log.warning("skill index filters were stale; rebuilding them from the knowledge base")
            self._resync()
            results = self._search(vector, k, filters, guard)
        return results

    # -- following the skill library ---------------------------------------------------------------

    def follow(self) -> None:
        """Bring the index up to date with the skill library."""
        changed, position = self._replica.views.skill_changes(self._position)
        if changed is None:
            self._resync()
        else:
            self._apply(changed)
        self._position = position
        if self._unsaved and self._unsaved >= SAVE_FRACTION * len(self._index):
            self.save()

    def save(self) -> None:
        if self._path is None or not self._unsaved:
            return
        try:
            self._index.save(self._path)
        except OSError as exc:
            log.warning(
                "cannot save the skill index to %s (%s); it is rebuilt when needed", self._path, exc
            )
        self._unsaved = 0

    def _resync(self) -> None:
        """Compare the index with every present skill: drop what left, add what is missing,
        refilter."""
        views = self._replica.views
        position = views.skill_changes(_START)[1]  # before reading, kept once all is done
        held: dict[str, list[str]] = defaultdict(list)
        for entry in self._index.ids():
            held[entry.partition("/")[0]].append(entry)
        present = {str(s) for s in views.indexes(RecordType.SKILL) if not views.withdrawn(str(s))}
        self._unsaved += self._index.remove(
            e for s, entries in held.items() if s not in present for e in entries
        )
        known = {s: tuple(held.get(s, ())) for s in present if s in held or self._has_no_scope(s)}
        missing = [s for s in present if s not in known]
        known.update(self._add(missing))
        self._skills = {s: self._state(s, entries) for s, entries in known.items()}
        self._filters.clear()
        self._position = position  # failure above leaves the next query to resync again

    def _has_no_scope(self, skill_id: str) -> bool:
        """Known to have no valid scope entry (the entries of every other known skill are in the
        index)."""
        state = self._skills.get(skill_id)
        return state is not None and not state.entries

    def _apply(self, changed: set[str]) -> None:
        views = self._replica.views
        added = []
        for skill_id in changed:
            if views.skill(skill_id) is None or views.withdrawn(skill_id):
                old = self._skills.pop(skill_id, None)
                if old is not None:
                    self._unsaved += self._index.remove(old.entries)
                    self._refilter(old.entries, None)
            elif skill_id in self._skills:
                state = self._skills[skill_id] = self._state(
                    skill_id, self._skills[skill_id].entries
                )
                self._refilter(state.entries, state)
            else:
                added.append(skill_id)
        for skill_id, entries in self._add(added).items():
            state = self._skills[skill_id] = self._state(skill_id, entries)
            self._refilter(entries, state)

    def _state(self, skill_id: str, entries: tuple[str, ...]) -> _State:
        record = self._replica.views.skill(skill_id)
        assert record is not None
        branches = sum(c["branches"] for _id, c in self._replica.views.certificates(skill_id))
        return _State(record["task"], entries, self._replica.activation(skill_id).active, branches)

    def _refilter(self, entries: Iterable[str], state: _State | None) -> None:
        for key, selection in self._filters.items():
            keep = state is not None and _passes(state, key)
            for entry in entries:
                selection.add(entry) if keep else selection.discard(entry)

    def _add(self, skill_ids: list[str]) -> dict[str, tuple[str, ...]]:
        """Encode the scopes of new skills (each distinct descriptor once) and add them; their entry
        names."""
        views = self._replica.views
        if len(self._bodies) > _MAX_BODIES:
            self._bodies.clear()
        scopes = {s: views.skill(s).get("embodiments", []) for s in skill_ids}  # type: ignore[union-attr]
        keyed = {s: [_descriptor_key(scope) for scope in entries] for s, entries in scopes.items()}
        fresh: dict[bytes, Embodiment] = {}
        for skill_id, entries in scopes.items():
            for key, scope in zip(keyed[skill_id], entries, strict=True):
                if key in self._bodies or key in fresh:
                    continue
                try:
                    fresh[key] = Embodiment.from_dict(scope)
                except EmbodimentError as exc:
                    log.debug("skill %s…: scope skipped: %s", skill_id[:16], exc)
                    self._bodies[key] = None
        vectors = self._encode(list(fresh.values()))
        for (key, body), vector in zip(fresh.items(), vectors, strict=True):
            self._bodies[key] = None if vector is None else (body.fingerprint, vector)
        names: list[str] = []
        rows: list[np.ndarray] = []
        out = {}
        for skill_id in skill_ids:
            found: dict[str, str] = {}  # fingerprint -> entry name: one vector per distinct body
            for position, key in enumerate(keyed[skill_id]):
                held = self._bodies[key]
                if held is not None and held[0] not in found:
                    found[held[0]] = f"{skill_id}/{position}"
                    rows.append(held[1])
            names += found.values()
            out[skill_id] = tuple(found.values())
        if names:
            self._index.add(names, np.stack(rows))
            self._unsaved += len(names)
        return out

    def _encode(self, bodies: list[Embodiment]) -> list[np.ndarray | None]:
        """Each body's vector; None where the encoder fails on it or gives numbers that are not
        finite. A peer's scope can pass the descriptor's checks with numbers no robot has (a
        negative damping, which the learned encoder takes a logarithm of): it is skipped like an
        invalid descriptor, and fails no query of anyone else's skills."""
        try:
            vectors: list[np.ndarray | None] = list(self._encoder.encode_many(bodies))
        except Exception:  # noqa: BLE001 - one of them: encode each alone to find it
            vectors = [self._encode_alone(body) for body in bodies]
        return [v if v is not None and np.isfinite(v).all() else None for v in vectors]

    def _encode_alone(self, body: Embodiment) -> np.ndarray | None:
        try:
            return self._encoder.encode(body)
        except Exception as exc:  # noqa: BLE001 - a peer's numbers; see `_encode`
            log.warning(
                "a skill's scope body %s… cannot be encoded by %s (%s: %s): skipped",
                body.fingerprint[:16],
                self._encoder.name,
                type(exc).__name__,
                exc,
            )
            return None

    # -- searching ---------------------------------------------------------------------------------

    def _selection(self, key: Filter) -> Selection:
        selection = self._filters.pop(key, None)
        if selection is None:
            selection = self._index.select(
                e for s in self._skills.values() if _passes(s, key) for e in s.entries
            )
        self._filters[key] = selection  # most recently used last
        while len(self._filters) > _MAX_FILTERS:
            self._filters.popitem(last=False)
        return selection

    def _search(
        self, vector: np.ndarray, k: int, filters: list[Filter], guard: _Guard | None
    ) -> list[QueryResult]:
        """The k nearest skills: fetch entries nearest first until k distinct skills show up and,
        with a guard, until no entry left unfetched can rank among them."""
        allowed = (
            reduce(lambda a, b: a & b, [self._selection(key) for key in filters])
            if filters
            else None
        )
        available = len(allowed) if allowed is not None else len(self._index)
        fetch = k
        while True:
            hits = self._index.search(vector, fetch, allowed=allowed)
            own = np.array([hit.distance for hit in hits])
            ranks = own
            if guard is not None and hits:
                ranks = guard.encoder.guarded(own, self._guard_distances(hits, guard))
            nearest: dict[str, tuple[float, int]] = {}
            for hit, rank in zip(hits, ranks.tolist(), strict=True):
                skill_id, _, position = hit.skill_id.partition("/")
                if skill_id not in nearest or rank < nearest[skill_id][0]:
                    nearest[skill_id] = (rank, int(position))
            ranked = sorted(nearest.items(), key=lambda item: item[1][0])
            # an entry not fetched is no nearer by the encoder's distance than the last fetched,
            # and guarding never brings it nearer
            settled = len(ranked) >= k and (guard is None or ranked[k - 1][1][0] <= own[-1])
            if settled or fetch >= available:
                break
            fetch = min(4 * fetch, available)
        return [self._result(s, d, p) for s, (d, p) in ranked[:k]]

    def _guard_distances(self, hits: list[Hit], guard: _Guard) -> np.ndarray:
        """Each hit's body's distance to the query in the guard's space, read from the guard's
        index; 0 (the guard says nothing) for a body the guard could not encode."""
        index = guard.library._index
        names = [hit.skill_id for hit in hits]
        held = np.array([name in index for name in names])
        distances = np.zeros(len(names))
        if held.any():
            vectors = index.vectors([n for n, h in zip(names, held, strict=True) if h])
            query = guard.vector.astype(np.float32)[None]
            if index.space.metric == "cosine":
                query = query / max(float(np.linalg.norm(query)), 1e-12)
                distances[held] = 1.0 - vectors @ query[0]
            else:
                distances[held] = np.linalg.norm(vectors - query, axis=1)
        return distances

    def _result(self, skill_id: str, distance: float, position: int) -> QueryResult:
        record = self._replica.views.skill(skill_id)
        assert record is not None
        return QueryResult(
            distance=distance,
            skill=Skill.from_record(skill_id, record),
            activation=self._replica.activation(skill_id),
            certificates=certificate_summary(self._replica, skill_id),
            scope=position,
        )

    def _admits(self, result: QueryResult, filters: list[Filter]) -> bool:
        """Whether a result passes the filters by its fresh state (never by the cached one)."""
        if self._replica.views.withdrawn(result.skill.id):
            return False
        state = _State(
            result.skill.task, (), result.activation.active, result.certificates.branches
        )
        return all(_passes(state, key) for key in filters)


def _descriptor_key(scope: Any) -> bytes:
    return hashlib.sha256(canonical_json(scope)).digest()

"""Patches (E = T + Δ): explicit, ordered mutation lists, the seeded samplers that produce them, and
their application to a `mujoco.batch.Batch`.

Sampling and application are separate: sampling is a pure function of (spec, seed, stream, branch),
computed from SHA-256 counters so that it does not depend on numpy's generator versions; applying a
patch consumes no randomness, so a recorded patch replays exactly.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from mujoco import batch as mjbatch

from knowledge import content_hash

from ._errors import MutationError, SamplerSpecError, SpecError
from ._numbers import is_number
from ._templates import BY_JOINT, Slot, Template, split_target

SpecErrorType = Callable[[str, str], SpecError]
"""A SpecError subclass that knows its kind, called with a field and a detail: SamplerSpecError,
TaskDefinitionError."""

OPS = ("set", "add", "scale")
_KINDS = ("body", "geom", "joint", "actuator", BY_JOINT)
_DISTS = {"uniform": ("low", "high"), "normal": ("mean", "std"), "constant": ("value",)}


@dataclass(frozen=True)
class Mutation:
    """One explicit edit: `target` ("body/link3/mass"), `op` (set, add, scale) and its `value`s."""

    target: str
    op: str
    value: tuple[float, ...]

    def to_json(self) -> dict:
        return {"target": self.target, "op": self.op, "value": list(self.value)}

    @classmethod
    def from_json(cls, data: object) -> Mutation:
        if not isinstance(data, dict) or set(data) != {"target", "op", "value"}:
            raise MutationError(str(data)[:60], "a mutation is {'target', 'op', 'value'}")
        target, op, value = data["target"], data["op"], data["value"]
        values = value if isinstance(value, list) else [value]
        if (
            not isinstance(target, str)
            or op not in OPS
            or not values
            or not all(map(is_number, values))
        ):
            raise MutationError(
                str(target),
                f"op must be one of {OPS} and value finite number(s), got {op!r}, {value!r}",
            )
        return cls(target, op, tuple(float(v) for v in values))


@dataclass(frozen=True)
class Patch:
    """A branch's difference from its template: mutations applied in order."""

    mutations: tuple[Mutation, ...] = ()

    def to_json(self) -> list:
        return [m.to_json() for m in self.mutations]

    @classmethod
    def from_json(cls, data: object) -> Patch:
        if not isinstance(data, list):
            raise MutationError("<patch>", "a patch is a list of mutations")
        return cls(tuple(Mutation.from_json(m) for m in data))

    def __add__(self, other: Patch) -> Patch:
        return Patch(self.mutations + other.mutations)


def patches_digest(patches: Iterable[Patch]) -> str:
    """One hash over a sequence of patches: recorded so a replay can show it sampled the same
    ones."""
    return content_hash([p.to_json() for p in patches])


@dataclass(frozen=True)
class SamplerTerm:
    """Draw one mutation per target matching `target` (fnmatch wildcards in the name part).

    `dist` is "uniform" (low, high), "normal" (mean, std) or "constant" (value). One draw is
    broadcast over a vector target unless `per_component`; a parameter given as a list (one entry
    per component, as for a target box) implies `per_component`.
    """

    target: str
    op: str
    dist: str
    params: tuple[float | tuple[float, ...], ...]
    per_component: bool = False

    def to_json(self) -> dict:
        params = [list(p) if isinstance(p, tuple) else p for p in self.params]
        out = {
            "target": self.target,
            "op": self.op,
            "dist": self.dist,
            **dict(zip(_DISTS[self.dist], params, strict=True)),
        }
        if self.per_component:
            out["per_component"] = True
        return out

    @classmethod
    def from_json(
        cls, data: object, where: str = "terms[0]", error: SpecErrorType = SamplerSpecError
    ) -> SamplerTerm:
        def fail(field: str, detail: str) -> SpecError:
            return error(f"{where}.{field}" if field else where, detail)

        if not isinstance(data, dict):
            raise fail("", "a sampler term is an object")
        dist = data.get("dist")
        if not isinstance(dist, str) or dist not in _DISTS:
            raise fail("dist", f"must be one of {sorted(_DISTS)}, got {dist!r}")
        allowed = {"target", "op", "dist", "per_component", *_DISTS[dist]}
        extra = sorted(set(data) - allowed)
        if extra:
            raise fail(extra[0], f"unknown key; a {dist} term has {sorted(allowed)}")
        if not isinstance(data.get("target"), str):
            raise fail("target", "must be a string such as 'body/link*/mass'")
        if data.get("op") not in OPS:
            raise fail("op", f"must be one of {OPS}, got {data.get('op')!r}")
        params: list[float | tuple[float, ...]] = []
        for key in _DISTS[dist]:
            value = data.get(key)
            if isinstance(value, list) and value and all(map(is_number, value)):
                params.append(tuple(float(v) for v in value))
            elif is_number(value):
                params.append(float(value))
            else:
                raise fail(
                    key, f"must be a finite number or a non-empty list of them, got {value!r}"
                )
        sizes = {len(p) for p in params if isinstance(p, tuple)}
        if len(sizes) > 1:
            raise fail(_DISTS[dist][-1], "list parameters must have the same length")
        low, high = (np.broadcast_to(p, max(sizes | {1})) for p in (params + params)[:2])
        if dist == "uniform" and np.any(low > high):
            raise fail("high", "must be >= low")
        if dist == "normal" and np.any(high < 0):
            raise fail("std", "must be >= 0")
        per_component = data.get("per_component", bool(sizes))
        if not isinstance(per_component, bool) or (sizes and not per_component):
            raise fail("per_component", "must be true or false (true when a parameter is a list)")
        return cls(data["target"], data["op"], dist, tuple(params), per_component)


@dataclass(frozen=True)
class Sampler:
    """A declarative, JSON-serializable distribution over patches, with its seed."""

    terms: tuple[SamplerTerm, ...] = ()
    seed: int = 0

    def to_json(self) -> dict:
        return {"seed": self.seed, "terms": [t.to_json() for t in self.terms]}

    @classmethod
    def from_json(cls, data: object) -> Sampler:
        if not isinstance(data, dict) or set(data) - {"seed", "terms"}:
            raise SamplerSpecError("", "a sampler spec is {'seed': int, 'terms': [...]}")
        seed = data.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise SamplerSpecError("seed", f"must be a non-negative integer, got {seed!r}")
        terms = data.get("terms", [])
        if not isinstance(terms, list):
            raise SamplerSpecError("terms", "must be a list")
        return cls(
            tuple(SamplerTerm.from_json(t, f"terms[{i}]") for i, t in enumerate(terms)), seed
        )

    def sample(self, template: Template, branch: int, stream: str = "dynamics") -> Patch:
        return sample_terms(self.terms, template, self.seed, branch, 1, stream)[0]

    def sample_many(
        self, template: Template, first: int, count: int, stream: str = "dynamics"
    ) -> list[Patch]:
        """The patches of branches first .. first+count-1, drawn together (the same as one by
        one)."""
        return sample_terms(self.terms, template, self.seed, first, count, stream)


def expand_targets(
    term: SamplerTerm, template: Template, where: str, error: SpecErrorType = SamplerSpecError
) -> tuple[str, ...]:
    """The concrete targets a term's pattern matches, in template id order, checked against the
    term."""
    targets = _matching(term.target, template)
    if not targets:
        kind = term.target.split("/")[0]
        detail = (
            f"unknown kind {kind!r}"
            if kind not in _KINDS
            else f"{term.target!r} matches nothing in the template"
        )
        raise error(f"{where}.target", detail)
    for target in targets:
        try:
            slot = template.slot(target)
        except MutationError as exc:
            raise error(f"{where}.target", exc.detail) from exc
        if slot.quaternion and term.op != "set":
            raise error(f"{where}.op", f"{target} holds a quaternion: only 'set' applies")
        for key, param in zip(_DISTS[term.dist], term.params, strict=True):
            if isinstance(param, tuple) and len(param) != slot.size:
                raise error(
                    f"{where}.{key}",
                    f"{target} has {slot.size} components, the list has {len(param)}",
                )
    return targets


@functools.lru_cache(maxsize=4096)
def _matching(pattern: str, template: Template) -> tuple[str, ...]:
    """Targets named by a pattern: wildcards in the name part match the template's object names
    (for "actuator@joint", the names of the joints an actuator drives)."""
    parts = split_target(pattern)
    if parts is None or not any(ch in parts[1] for ch in "*?["):
        return (pattern,)
    kind, names, attr = parts
    if kind not in _KINDS:
        return ()
    candidates = template.driven_joints() if kind == BY_JOINT else template.names(kind)
    return tuple(f"{kind}/{n}/{attr}" for n in candidates if fnmatch.fnmatchcase(n, names))


def _uniforms(
    seed: int, stream: str, term: int, target: str, first: int, count: int, width: int
) -> np.ndarray:
    """U[0, 1) draws for branches first .. first+count-1, `width` each: Philox4x64 (a counter-based
    generator whose raw stream is fixed) keyed by SHA-256 of where the draws are used, with branch b
    owning counters [b * blocks, (b + 1) * blocks). Any branch's draws are computed without the
    others'."""
    digest = hashlib.sha256(f"simnet.sampler/2|{seed}|{stream}|{term}|{target}".encode()).digest()
    key = np.frombuffer(digest[:16], dtype=">u8").astype(np.uint64)
    blocks = -(-width // 4)
    raw = np.random.Philox(key=key, counter=first * blocks).random_raw(count * blocks * 4)
    return ((raw >> np.uint64(11)) * 2.0**-53).reshape(count, blocks * 4)[:, :width]


def _draw(term: SamplerTerm, u: np.ndarray) -> np.ndarray:
    """(count, size) values from (count, 2 * size) uniforms."""
    size = u.shape[1] // 2
    first, *rest = (np.broadcast_to(np.asarray(p, dtype=np.float64), (size,)) for p in term.params)
    if term.dist == "constant":
        return np.broadcast_to(first, (len(u), size))
    if term.dist == "uniform":
        return first + (rest[0] - first) * u[:, 0::2]
    # normal: Box–Muller on pairs of uniforms
    return first + rest[0] * np.sqrt(-2.0 * np.log1p(-u[:, 0::2])) * np.cos(
        2.0 * np.pi * u[:, 1::2]
    )


class Draws:
    """Sampled patches of consecutive branches as columns: per mutation position, its target, op
    and a (branches, width) array of values. Sampled patches all have the same targets in the same
    order, so a batch applies them column by column, without a `Mutation` per branch and value
    (what `Patch` lists cost to build and to regroup is most of a wave's setup)."""

    def __init__(self, count: int, columns: Sequence[tuple[str, str, np.ndarray]]) -> None:
        self.count = count
        self.columns = tuple(columns)

    def __len__(self) -> int:
        return self.count

    def __add__(self, other: Draws) -> Draws:
        """Each branch's mutations followed by its mutations in `other` (as `Patch.__add__`)."""
        if other.count != self.count:
            raise ValueError(f"draws of {self.count} and {other.count} branches do not add up")
        return Draws(self.count, self.columns + other.columns)

    def __getitem__(self, rows: slice) -> Draws:
        """The draws of a slice of these branches (as a list of patches slices)."""
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"draws are sliced by a contiguous slice, not {rows!r}")
        start, stop, _ = rows.indices(self.count)
        return Draws(max(stop - start, 0), [(t, op, v[start:stop]) for t, op, v in self.columns])

    def patches(self) -> list[Patch]:
        """As one `Patch` per branch."""
        mutations: list[list[Mutation]] = [[] for _ in range(self.count)]
        for target, op, values in self.columns:
            for row, value in zip(mutations, values.tolist(), strict=True):
                row.append(Mutation(target, op, tuple(value)))
        return [Patch(tuple(row)) for row in mutations]


def sample_draws(
    terms: Sequence[SamplerTerm],
    template: Template,
    seed: int,
    first: int,
    count: int,
    stream: str,
    error: SpecErrorType = SamplerSpecError,
) -> Draws:
    """The draws of branches first .. first+count-1; each branch's a pure function of the terms,
    seed, stream and its own branch index."""
    columns = []
    for i, term in enumerate(terms):
        for target in expand_targets(term, template, f"terms[{i}]", error):
            size = template.slot(target).size if term.per_component else 1
            values = _draw(term, _uniforms(seed, stream, i, target, first, count, 2 * size))
            columns.append((target, term.op, np.ascontiguousarray(values, dtype=np.float64)))
    return Draws(count, columns)


def sample_terms(
    terms: Sequence[SamplerTerm],
    template: Template,
    seed: int,
    first: int,
    count: int,
    stream: str,
    error: SpecErrorType = SamplerSpecError,
) -> list[Patch]:
    """`sample_draws` as one `Patch` per branch."""
    return sample_draws(terms, template, seed, first, count, stream, error).patches()


def _checked(
    slot: Slot, target: str, op: str, old: np.ndarray, value: np.ndarray, branches: np.ndarray
) -> np.ndarray:
    """New values for a group of simulations, (n, size), or a MutationError naming the first bad
    branch."""

    def fail(rows: np.ndarray, detail: str) -> MutationError:
        return MutationError(target, detail, int(branches[np.flatnonzero(rows)[0]]))

    everyone = np.ones(len(branches), bool)
    if value.shape[1] not in (1, slot.size):
        raise fail(everyone, f"needs 1 or {slot.size} values, got {value.shape[1]}")
    if op not in OPS:
        raise fail(everyone, f"unknown op {op!r}; ops are {OPS}")
    if slot.quaternion:
        if op != "set" or value.shape[1] != slot.size:
            raise fail(everyone, f"holds a quaternion: only 'set' with {slot.size} values")
        norm = np.sqrt(np.sum(value[:, -4:] ** 2, axis=1))
        if np.any(np.abs(norm - 1.0) > 1e-9):
            raise fail(np.abs(norm - 1.0) > 1e-9, "the quaternion part must have unit norm")
    new = (
        np.broadcast_to(value, old.shape)
        if op == "set"
        else old + value
        if op == "add"
        else old * value
    )
    bad = ~np.isfinite(new).all(axis=1)
    if bad.any():
        raise fail(bad, "the result is not finite")
    low = new.min(axis=1)
    bad = (
        low <= 0
        if slot.domain == "positive"
        else low < 0
        if slot.domain == "nonnegative"
        else ~everyone
    )
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        bound = "> 0" if slot.domain == "positive" else ">= 0"
        raise fail(bad, f"must stay {bound}, would be {new[row].tolist()}")
    return new


def _groups(
    template: Template,
    patches: Sequence[Patch | None] | Draws,
    branches: Sequence[int],
    state: bool,
) -> Iterator[tuple[Slot, str, str, np.ndarray, np.ndarray]]:
    """Mutations in application order, vectorized: position by position along the patches, one group
    per (target, op, width) holding its simulations and their values. Each simulation has one
    mutation per position, so the groups of a position touch disjoint simulations. (`Draws` are
    such groups already: one per column, every simulation in it.)"""
    if isinstance(patches, Draws):
        everyone = np.arange(patches.count)
        for target, op, column in patches.columns:
            slot = _slot(template, target, branches, 0)
            if slot.state == state:
                yield slot, target, op, everyone, column
        return
    longest = max((len(p.mutations) for p in patches if p is not None), default=0)
    for position in range(longest):
        groups: dict[tuple[str, str, int], tuple[list[int], list[tuple[float, ...]]]] = {}
        for sim, patch in enumerate(patches):
            if patch is not None and position < len(patch.mutations):
                m = patch.mutations[position]
                sims, values = groups.setdefault((m.target, m.op, len(m.value)), ([], []))
                sims.append(sim)
                values.append(m.value)
        for (target, op, _), (sims, values) in groups.items():
            slot = _slot(template, target, branches, sims[0])
            if slot.state == state:
                yield slot, target, op, np.array(sims), np.array(values, dtype=np.float64)


def _slot(template: Template, target: str, branches: Sequence[int], sim: int) -> Slot:
    """A target's slot, or a MutationError naming the branch of simulation `sim` that asked."""
    try:
        return template.slot(target)
    except MutationError as exc:
        raise MutationError(exc.target, exc.detail, branches[sim]) from None


def apply_model_patches(
    batch: mjbatch.Batch,
    template: Template,
    patches: Sequence[Patch | None] | Draws,
    branches: Sequence[int],
) -> None:
    """Write each simulation's model mutations into expanded fields, then recompute derived
    constants (mj_setConst) for exactly the simulations whose patches touched fields it reads."""
    ids = np.asarray(branches)
    needs_setconst = np.zeros(batch.nsim, bool)
    for slot, target, op, sims, values in _groups(template, patches, branches, state=False):
        rows = batch.expand(slot.field).reshape(batch.nsim, -1)
        cells = slice(slot.start, slot.start + slot.size)
        rows[sims, cells] = _checked(slot, target, op, rows[sims, cells], values, ids[sims])
        for field, cell, sign in slot.coupled:  # a servo's bias repeats its gain: the same edit
            twin = batch.expand(field).reshape(batch.nsim, -1)
            given = values if op == "scale" else sign * values
            twin_slot = Slot(target, field, cell, 1, False, False, "any")
            twin[sims, cell : cell + 1] = _checked(
                twin_slot, target, op, twin[sims, cell : cell + 1], given, ids[sims]
            )
        needs_setconst[sims] |= slot.setconst
    if needs_setconst.any():
        try:
            batch.set_const(np.flatnonzero(needs_setconst).astype(np.int32))
        except mjbatch.SimulationError as exc:
            sim = int(exc.ids[0])
            detail = f"mj_setConst failed: {batch.error(sim)}"
            raise MutationError("<derived constants>", detail, branches[sim]) from exc


def apply_state_patches(
    batch: mjbatch.Batch,
    template: Template,
    patches: Sequence[Patch | None] | Draws,
    branches: Sequence[int],
) -> None:
    """Write each simulation's initial-state mutations (after reset, before the first forward)."""
    ids = np.asarray(branches)
    for slot, target, op, sims, values in _groups(template, patches, branches, state=True):
        rows = batch.bind(slot.field)
        cells = slice(slot.start, slot.start + slot.size)
        rows[sims, cells] = _checked(slot, target, op, rows[sims, cells], values, ids[sims])

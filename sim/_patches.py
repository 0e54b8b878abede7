"""Patches (E = T + Δ): explicit, ordered mutation lists, the seeded samplers that produce them, and
their application to a `mujoco.batch.Batch`.

Sampling and application are separate: sampling is a pure function of (spec, seed, stream, branch),
computed from SHA-256 counters so that it does not depend on numpy's generator versions; applying a
patch consumes no randomness, so a recorded patch replays exactly.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from mujoco import batch as mjbatch

from ._canon import content_hash, is_number
from ._errors import MutationError, SamplerSpecError, SpecError
from ._templates import Slot, Template

OPS = ("set", "add", "scale")
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
    def from_json(cls, data: object) -> "Mutation":
        if not isinstance(data, dict) or set(data) != {"target", "op", "value"}:
            raise MutationError(str(data)[:60], "a mutation is {'target', 'op', 'value'}")
        target, op, value = data["target"], data["op"], data["value"]
        values = value if isinstance(value, list) else [value]
        if not isinstance(target, str) or op not in OPS or not values or not all(map(is_number, values)):
            raise MutationError(str(target), f"op must be one of {OPS} and value finite number(s), got {op!r}, {value!r}")
        return cls(target, op, tuple(float(v) for v in values))


@dataclass(frozen=True)
class Patch:
    """A branch's difference from its template: mutations applied in order."""

    mutations: tuple[Mutation, ...] = ()

    def to_json(self) -> list:
        return [m.to_json() for m in self.mutations]

    @classmethod
    def from_json(cls, data: object) -> "Patch":
        if not isinstance(data, list):
            raise MutationError("<patch>", "a patch is a list of mutations")
        return cls(tuple(Mutation.from_json(m) for m in data))

    def __add__(self, other: "Patch") -> "Patch":
        return Patch(self.mutations + other.mutations)


def patches_digest(patches: Iterable[Patch]) -> str:
    """One hash over a sequence of patches: recorded so a replay can show it sampled the same ones."""
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
        out = {"target": self.target, "op": self.op, "dist": self.dist, **dict(zip(_DISTS[self.dist], params))}
        if self.per_component:
            out["per_component"] = True
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "terms[0]", error: type[SpecError] = SamplerSpecError) -> "SamplerTerm":
        def fail(field: str, detail: str) -> SpecError:
            return error(f"{where}.{field}" if field else where, detail)

        if not isinstance(data, dict):
            raise fail("", "a sampler term is an object")
        dist = data.get("dist")
        if dist not in _DISTS:
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
                raise fail(key, f"must be a finite number or a non-empty list of them, got {value!r}")
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
    def from_json(cls, data: object) -> "Sampler":
        if not isinstance(data, dict) or set(data) - {"seed", "terms"}:
            raise SamplerSpecError("", "a sampler spec is {'seed': int, 'terms': [...]}")
        seed = data.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise SamplerSpecError("seed", f"must be a non-negative integer, got {seed!r}")
        terms = data.get("terms", [])
        if not isinstance(terms, list):
            raise SamplerSpecError("terms", "must be a list")
        return cls(tuple(SamplerTerm.from_json(t, f"terms[{i}]") for i, t in enumerate(terms)), seed)

    def sample(self, template: Template, branch: int, stream: str = "dynamics") -> Patch:
        return sample_terms(self.terms, template, self.seed, branch, stream)


def expand_targets(term: SamplerTerm, template: Template, where: str,
                   error: type[SpecError] = SamplerSpecError) -> list[str]:
    """The concrete targets a term's pattern matches, in template id order."""
    parts = term.target.split("/")
    if len(parts) == 3 and any(ch in parts[1] for ch in "*?["):
        kind, pattern, attr = parts
        if kind not in ("body", "geom", "joint", "actuator"):
            raise error(f"{where}.target", f"unknown kind {kind!r}")
        targets = [f"{kind}/{n}/{attr}" for n in template.names(kind) if fnmatch.fnmatchcase(n, pattern)]
        if not targets:
            raise error(f"{where}.target", f"{term.target!r} matches nothing in the template")
    else:
        targets = [term.target]
    for target in targets:
        try:
            slot = template.slot(target)
        except MutationError as exc:
            raise error(f"{where}.target", exc.detail) from exc
        if slot.quaternion and term.op != "set":
            raise error(f"{where}.op", f"{target} holds a quaternion: only 'set' applies")
        for key, param in zip(_DISTS[term.dist], term.params):
            if isinstance(param, tuple) and len(param) != slot.size:
                raise error(f"{where}.{key}", f"{target} has {slot.size} components, the list has {len(param)}")
    return targets


def _uniforms(seed: int, stream: str, branch: int, term: int, target: str, count: int) -> list[float]:
    """`count` independent U[0, 1) draws keyed by where they are used (SHA-256 as a counter RNG)."""
    out = []
    for k in range(count):
        key = f"simnet.sampler/1|{seed}|{stream}|{branch}|{term}|{target}|{k}".encode()
        out.append((int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 11) * 2.0**-53)
    return out


def _draw(term: SamplerTerm, u: list[float]) -> list[float]:
    count = len(u) // 2
    first, *rest = (p if isinstance(p, tuple) else (p,) * count for p in term.params)
    if term.dist == "constant":
        return list(first)
    second = rest[0]
    if term.dist == "uniform":
        return [lo + (hi - lo) * a for lo, hi, a in zip(first, second, u[::2])]
    # normal: Box–Muller on pairs of uniforms
    return [mean + std * math.sqrt(-2.0 * math.log(1.0 - a)) * math.cos(2.0 * math.pi * b)
            for mean, std, a, b in zip(first, second, u[::2], u[1::2])]


def sample_terms(terms: Sequence[SamplerTerm], template: Template, seed: int, branch: int, stream: str,
                 error: type[SpecError] = SamplerSpecError) -> Patch:
    """The patch of one branch: a pure function of the terms, seed, stream and branch index."""
    mutations = []
    for i, term in enumerate(terms):
        for target in expand_targets(term, template, f"terms[{i}]", error):
            count = template.slot(target).size if term.per_component else 1
            values = _draw(term, _uniforms(seed, stream, branch, i, target, 2 * count))
            mutations.append(Mutation(target, term.op, tuple(values)))
    return Patch(tuple(mutations))


def _combine(op: str, old: np.ndarray, value: np.ndarray) -> np.ndarray:
    return value if op == "set" else old + value if op == "add" else old * value


def _checked(slot: Slot, mutation: Mutation, old: np.ndarray, branch: int) -> np.ndarray:
    """The new values of a slot, or a MutationError naming the branch."""
    value = np.asarray(mutation.value, dtype=np.float64)
    if value.size not in (1, slot.size):
        raise MutationError(mutation.target, f"needs 1 or {slot.size} values, got {value.size}", branch)
    if mutation.op not in OPS:
        raise MutationError(mutation.target, f"unknown op {mutation.op!r}; ops are {OPS}", branch)
    if slot.quaternion:
        if mutation.op != "set" or value.size != slot.size:
            raise MutationError(mutation.target, f"holds a quaternion: only 'set' with {slot.size} values", branch)
        if abs(np.linalg.norm(value[-4:]) - 1.0) > 1e-9:
            raise MutationError(mutation.target, "the quaternion part must have unit norm", branch)
    new = _combine(mutation.op, old, value)
    if not np.all(np.isfinite(new)):
        raise MutationError(mutation.target, "the result is not finite", branch)
    if slot.domain == "positive" and np.any(new <= 0):
        raise MutationError(mutation.target, f"must stay > 0, would be {new.tolist()}", branch)
    if slot.domain == "nonnegative" and np.any(new < 0):
        raise MutationError(mutation.target, f"must stay >= 0, would be {new.tolist()}", branch)
    return new


def apply_model_patches(batch: mjbatch.Batch, template: Template, patches: Sequence[Patch | None],
                        branches: Sequence[int]) -> None:
    """Write each simulation's model mutations into expanded fields, then recompute derived constants
    (mj_setConst) for exactly the simulations whose patches touched fields it reads."""
    needs_setconst = []
    for sim, (patch, branch) in enumerate(zip(patches, branches)):
        touched = False
        for mutation in patch.mutations if patch else ():
            slot = _slot(template, mutation, branch)
            if slot.state:
                continue
            row = batch.expand(slot.field).reshape(batch.nsim, -1)[sim]
            cells = slice(slot.start, slot.start + slot.size)
            row[cells] = _checked(slot, mutation, row[cells], branch)
            touched |= slot.setconst
        if touched:
            needs_setconst.append(sim)
    if needs_setconst:
        try:
            batch.set_const(np.asarray(needs_setconst, np.int32))
        except mjbatch.SimulationError as exc:
            sim = int(exc.ids[0])
            raise MutationError("<derived constants>", f"mj_setConst failed: {batch.error(sim)}", branches[sim]) from exc


def apply_state_patches(batch: mjbatch.Batch, template: Template, patches: Sequence[Patch | None],
                        branches: Sequence[int]) -> None:
    """Write each simulation's initial-state mutations (after reset, before the first forward)."""
    for sim, (patch, branch) in enumerate(zip(patches, branches)):
        for mutation in patch.mutations if patch else ():
            slot = _slot(template, mutation, branch)
            if not slot.state:
                continue
            row = batch.bind(slot.field)[sim]
            cells = slice(slot.start, slot.start + slot.size)
            row[cells] = _checked(slot, mutation, row[cells], branch)


def _slot(template: Template, mutation: Mutation, branch: int) -> Slot:
    try:
        return template.slot(mutation.target)
    except MutationError as exc:
        raise MutationError(exc.target, exc.detail, branch) from None

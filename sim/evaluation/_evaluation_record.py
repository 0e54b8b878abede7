"""Evaluations and their records: the result of `evaluate`, and the deterministic JSON with
everything needed to re-run it (`sim.reproduce` re-runs one and says whether it matches).

A record (format "simnet.sim.evaluation/1") is a JSON object with exactly these keys:

    task            {hash, name, embodiment, definition}:
                    hash = sha256(canonical JSON of definition)
    template        {source_hash: sha256 of the scene MJCF, model_hash: sha256 of the compiled MJB}
    policy          {kind: "mlp", skill_hash, architecture, weights_sha256}
                    | {kind: "entry_point", group, name, distribution, version}
                    | {kind: "torch", class, state_sha256[, architecture]}
                    | {kind: "callable", class}
    sampler         {seed, terms: [...]}: the dynamics randomization (the task holds its init terms)
    patches_digest  sha256 over the patches of the simulated branches, in branch order
    layout          {branches (requested: n unless a sequential test decided), wave, order}:
                    the batch layout of physics and policy calls (a wave is `wave` rows, however
                    few branches; a re-run keeps it, so a site bounds it: sim/validation's
                    `rerun_wave`)
    settings        {policy_threads, mjtNum}
    sequential      null | {p0, p1, alpha, beta, decision, decided_at}
    outcomes        parallel lists over simulated branches 0..n-1: branch, success (0/1),
                    total_reward, steps, reason
    summary         {successes, n, success_rate, mean_return, confidence, wilson_lower,
                     clopper_pearson_lower}: follows from outcomes (checked)
    environment     {mujoco, patch_semantics, numpy, torch, python, simnet, platform: {system,
                     machine, byteorder, cpu_features}}

An evaluation that started from a world snapshot (`evaluate(..., start=snapshot)`) has format
"simnet.sim.evaluation/2" and one more key:

    start           {world: {name, id}, shard, branch, tick, time, events, template: {source_hash,
                     model_hash}, patch, state, state_sha256}: the site's world at virtual time
                    `time` (tick `tick`, after `events` events of its log), exactly: the shard's
                    model patch and its mjSTATE_INTEGRATION row; the scene is the task's

Floats are finite and written in shortest round-trip form; `record_hash` is the sha256 of the
canonical encoding (sorted keys, no whitespace). No timestamps: signing adds those.
"""

from __future__ import annotations

import math
import platform
import sys
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

import knowledge
from knowledge import canonical_json, content_hash
from knowledge.stats import SPRT, clopper_pearson_lower, wilson_lower_bound

from .._errors import EvaluationRecordError
from .._numbers import is_number
from .._patches import Sampler, patches_digest
from .._snapshot import Snapshot
from .._tasks import Task
from ._rollout import BranchOutcome, branch_patches

FORMAT = "simnet.sim.evaluation/1"
FORMAT_FROM_WORLD = "simnet.sim.evaluation/2"
LAYOUT = "branch b runs in wave b // wave, row b % wave; the policy sees all wave rows per call"
_KEYS = {
    "format",
    "task",
    "template",
    "policy",
    "sampler",
    "patches_digest",
    "layout",
    "settings",
    "sequential",
    "outcomes",
    "summary",
    "environment",
}


PATCH_SEMANTICS = 2
"""What a sampler's targets mean, versioned apart from the release: 2 since a servo's `gain` scales
its stiffness (bias and gain together), not only its gain term. Records of another semantics are
compared statistically, never bit for bit (a spot check would dispute honest ones)."""


def environment() -> dict:
    """What must be equal for outcomes to be bit-identical: library versions, what sampler targets
    mean (`PATCH_SEMANTICS`) and platform."""
    import torch  # here, not at import: only what runs a policy needs torch

    return {
        "mujoco": mujoco.__version__,
        "patch_semantics": PATCH_SEMANTICS,
        "numpy": np.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "simnet": knowledge.__version__,
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "byteorder": sys.byteorder,
            "cpu_features": _cpu_features(),
        },
    }


_SIMD = ("sse4_2", "avx", "avx2", "fma", "avx512f", "asimd", "sve")


def _cpu_features() -> list[str]:
    """The vector extensions that can change floating-point results between machines of one arch."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(
                (
                    line.split(":", 1)[1].split()
                    for line in info
                    if line.startswith(("flags", "Features"))
                ),
                [],
            )
    except OSError:
        return [platform.processor()] if platform.processor() else []
    return [f for f in _SIMD if f in flags]


@dataclass(frozen=True)
class Evaluation:
    """The outcome of `evaluate`: per-branch outcomes in branch order, and what produced them."""

    task: Task
    policy: dict
    sampler: Sampler
    branches: int  # requested (the SPRT truncation point when sequential)
    wave: int
    outcomes: tuple[BranchOutcome, ...]
    confidence: float = 0.95
    sprt: SPRT | None = None
    decision: str | None = None  # SPRT: "accept", "reject" or "undecided"
    decided_at: int | None = None  # SPRT: how many outcomes (in branch order) the decision used
    start: Snapshot | None = None  # the world snapshot every branch started from, if not a reset

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def successes(self) -> int:
        return sum(o.success for o in self.outcomes)

    @property
    def success_rate(self) -> float:
        return self.successes / self.n

    @property
    def mean_return(self) -> float:
        return math.fsum(o.total_reward for o in self.outcomes) / self.n

    @property
    def wilson_lower(self) -> float:
        return wilson_lower_bound(self.successes, self.n, self.confidence)

    @property
    def clopper_pearson_lower(self) -> float:
        return clopper_pearson_lower(self.successes, self.n, self.confidence)

    @property
    def patches_digest(self) -> str:
        return patches_digest(branch_patches(self.task, self.sampler, 0, self.n))

    def to_record(self) -> dict:
        """A deterministic, JSON-safe record of this evaluation: the body of a certificate."""
        return evaluation_record(self)


def evaluation_record(ev: Evaluation) -> dict:
    outcomes = ev.outcomes
    record = {
        "format": FORMAT,
        "task": {
            "hash": ev.task.hash,
            "name": ev.task.name,
            "embodiment": ev.task.embodiment,
            "definition": ev.task.to_json(),
        },
        "template": {
            "source_hash": ev.task.template.source_hash,
            "model_hash": ev.task.template.model_hash,
        },
        "policy": ev.policy,
        "sampler": ev.sampler.to_json(),
        "patches_digest": ev.patches_digest,
        "layout": {"branches": ev.branches, "wave": ev.wave, "order": LAYOUT},
        # what outcomes depend on besides the inputs above; physics threads and workers are not
        "settings": {"policy_threads": 1, "mjtNum": str(np.dtype(mujoco.MJTNUM_DTYPE))},
        "sequential": None
        if ev.sprt is None
        else {**ev.sprt.to_json(), "decision": ev.decision, "decided_at": ev.decided_at},
        "outcomes": {
            "branch": [o.branch for o in outcomes],
            "success": [int(o.success) for o in outcomes],
            "total_reward": [o.total_reward for o in outcomes],
            "steps": [o.steps for o in outcomes],
            "reason": [o.reason for o in outcomes],
        },
        "summary": _summary(ev.successes, ev.n, ev.mean_return, ev.confidence),
        "environment": environment(),
    }
    if ev.start is not None:
        record["format"] = FORMAT_FROM_WORLD
        record["start"] = ev.start.to_json()
    canonical_json(record)  # JSON-safe, or fail here rather than at signing
    return record


def _summary(successes: int, n: int, mean_return: float, confidence: float) -> dict:
    return {
        "successes": successes,
        "n": n,
        "success_rate": successes / n,
        "mean_return": mean_return,
        "confidence": confidence,
        "wilson_lower": wilson_lower_bound(successes, n, confidence),
        "clopper_pearson_lower": clopper_pearson_lower(successes, n, confidence),
    }


def record_hash(record: dict) -> str:
    """The content address of a record (sha256 of its canonical JSON)."""
    return content_hash(record)


def outcomes_of(record: dict) -> tuple[BranchOutcome, ...]:
    """The per-branch outcomes a record holds, checked for shape and consistency."""
    check_record(record)
    o = record["outcomes"]
    return tuple(
        BranchOutcome(b, bool(s), float(r), int(k), str(why))
        for b, s, r, k, why in zip(
            o["branch"], o["success"], o["total_reward"], o["steps"], o["reason"], strict=True
        )
    )


def check_record(record: Any) -> None:
    """Structure, self-consistency and content hashes; raises EvaluationRecordError on the first
    problem."""

    def need(ok: bool, field: str, detail: str) -> None:
        if not ok:
            raise EvaluationRecordError(f"record field {field!r}: {detail}")

    need(isinstance(record, dict), "", "a record is a JSON object")
    need(
        record.get("format") in (FORMAT, FORMAT_FROM_WORLD),
        "format",
        f"must be {FORMAT!r} or {FORMAT_FROM_WORLD!r}",
    )
    keys = _KEYS | {"start"} if record["format"] == FORMAT_FROM_WORLD else _KEYS
    need(set(record) == keys, "", f"keys must be exactly {sorted(keys)}")
    need(keys == _KEYS or isinstance(record["start"], dict), "start", "must be an object")
    task = record["task"]
    need(
        isinstance(task, dict) and isinstance(task.get("definition"), dict),
        "task.definition",
        "missing",
    )
    need(
        content_hash(task["definition"]) == task.get("hash"),
        "task.hash",
        "does not match the definition",
    )
    o = record["outcomes"]
    columns = ("branch", "success", "total_reward", "steps", "reason")
    need(
        isinstance(o, dict)
        and set(o) == set(columns)
        and all(isinstance(o[c], list) for c in columns),
        "outcomes",
        f"must hold the lists {columns}",
    )
    n = len(o["branch"])
    need(
        n >= 1 and all(len(o[c]) == n for c in columns),
        "outcomes",
        "lists must be non-empty and of equal length",
    )
    need(o["branch"] == list(range(n)), "outcomes.branch", "must be 0 .. n-1 in order")
    need(
        all(s in (0, 1) and not isinstance(s, bool) for s in o["success"]),
        "outcomes.success",
        "must be 0 or 1",
    )
    need(all(map(is_number, o["total_reward"])), "outcomes.total_reward", "must be finite numbers")
    layout = record["layout"]
    need(
        isinstance(layout, dict)
        and isinstance(layout.get("wave"), int)
        and isinstance(layout.get("branches"), int)
        and 1 <= n <= layout["branches"]
        and layout["wave"] >= 1,
        "layout",
        "must give wave and branches >= n",
    )
    sequential = record["sequential"]
    decided = isinstance(sequential, dict) and sequential.get("decision") in ("accept", "reject")
    need(
        decided or n == layout["branches"],
        "layout.branches",
        f"is {layout['branches']:,}, but the record holds {n:,} outcomes: only a sequential test "
        "that decided stops an evaluation before all its branches",
    )
    summary = record["summary"]
    need(
        isinstance(summary, dict)
        and is_number(summary.get("confidence"))
        and 0 < summary["confidence"] < 1,
        "summary.confidence",
        "must be in (0, 1)",
    )
    successes = sum(o["success"])
    mean_return = math.fsum(o["total_reward"]) / n
    expected = _summary(successes, n, mean_return, summary["confidence"])
    need(set(summary) == set(expected), "summary", f"keys must be {sorted(expected)}")
    for key, value in expected.items():
        # the bounds go through log/exp, which may differ in the last bit on another platform's libm
        close = (
            key.endswith("_lower") and is_number(summary[key]) and abs(summary[key] - value) <= 1e-9
        )
        need(summary[key] == value or close, f"summary.{key}", "does not follow from the outcomes")

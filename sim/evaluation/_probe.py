"""Adversarial probing: search the sampler's space for a region where a skill fails.

Random branches estimate how often a skill fails on average; a skill that fails only where masses
are light and the target is far reaches a certificate anyway. `probe` searches instead, by the
cross-entropy method over the uniform terms of the sampler and of the task's initial state: every
such term is one coordinate in [0, 1] (its low to its high; a term with per-component bounds, one
coordinate per component), a candidate is a point (one branch with exactly those values), and each
round keeps the worst candidates (failures first, then the lowest return) and refits a normal
distribution to them. The region it reports is the box two standard deviations around the last
mean, as a task and sampler of their own (those terms narrowed to the box): re-running
`evaluate(probe.task, policy, sampler=probe.sampler, branches=probe.branches)` replays the
measurement of its failure rate exactly. Terms that are not uniform keep their distribution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._errors import EvaluationRecordError, MissingAssetError, SimError
from .._patches import Patch, Sampler, SamplerTerm, sample_terms
from .._tasks import Task
from ._evaluate import evaluate, single_threaded_torch
from ._rollout import BranchOutcome, PolicyCaller, run_wave

FORMAT = "simnet.sim.probe/1"
_WAVE = 64


@dataclass(frozen=True)
class _Coordinate:
    dynamics: bool  # a sampler term (else one of the task's initial-state terms)
    term: int
    component: int | None  # for a term with per-component bounds


@dataclass(frozen=True)
class Probe:
    """The worst region a probe found, and how often the skill fails there."""

    task: Task  # the task with its initial-state terms narrowed to the region
    sampler: Sampler  # the sampler with its terms narrowed to the region
    box: tuple[tuple[float, float], ...]  # the region in the unit coordinates of the search
    branches: int  # fresh branches drawn in the region to measure its failure rate
    failures: int
    budget: int  # rollouts used in all: the search and the measurement
    rounds: int

    @property
    def failure_rate(self) -> float:
        return self.failures / self.branches

    def to_record(self) -> dict[str, Any]:
        """What a certificate records of the probe: enough to replay the region's measurement."""
        return {
            "format": FORMAT,
            "method": "cross-entropy",
            "budget": self.budget,
            "rounds": self.rounds,
            "branches": self.branches,
            "failures": self.failures,
            "failure_rate": self.failure_rate,
            "region": {
                "task_hash": self.task.hash,
                "init": self.task.definition.get("init", []),
                "sampler": self.sampler.to_json(),
                "box": [list(b) for b in self.box],
            },
        }


def probe(
    task: Task,
    policy: Any,
    *,
    sampler: Sampler,
    budget: int = 512,
    rounds: int = 4,
    elite: float = 0.2,
    measure: int | None = None,
    seed: int = 0,
    threads: int = 0,
) -> Probe:
    """Spend `budget` rollouts looking for where `policy` fails: `rounds` rounds of the search,
    then `measure` (default a quarter of the budget) fresh branches in the region found."""
    coordinates = _coordinates(task, sampler)
    if not coordinates:
        raise ValueError("nothing to search: neither the sampler nor the task has a uniform term")
    measure = measure if measure is not None else max(1, budget // 4)
    per_round = (budget - measure) // rounds
    if per_round < 2:
        raise ValueError(f"a budget of {budget} leaves too few rollouts for {rounds} rounds")
    rng = np.random.default_rng(seed)
    mean, spread = np.full(len(coordinates), 0.5), np.full(len(coordinates), 0.5)
    caller = PolicyCaller(policy, task)
    for _ in range(rounds):
        points = np.clip(rng.normal(mean, spread, (per_round, len(coordinates))), 0.0, 1.0)
        outcomes = _run(task, caller, sampler, coordinates, points, threads)
        worst = sorted(
            range(per_round), key=lambda i: (outcomes[i].success, outcomes[i].total_reward)
        )
        chosen = points[worst[: max(2, math.ceil(elite * per_round))]]
        mean, spread = chosen.mean(axis=0), chosen.std(axis=0) + 0.02
    box = tuple(
        (float(max(0.0, m - 2 * s)), float(min(1.0, m + 2 * s)))
        for m, s in zip(mean, spread, strict=True)
    )
    region_task, region_sampler = _region(task, sampler, coordinates, box, seed)
    found = evaluate(
        region_task,
        policy,
        branches=measure,
        sampler=region_sampler,
        threads=threads,
        progress=False,
    )
    return Probe(
        region_task,
        region_sampler,
        box,
        found.n,
        found.n - found.successes,
        per_round * rounds + found.n,
        rounds,
    )


def replay_probe(
    probe_record: dict[str, Any],
    evaluation: dict[str, Any],
    policy: Any,
    *,
    assets: Mapping[str, bytes] | None = None,
    threads: int = 0,
) -> str | None:
    """Re-run the measurement of a certificate's probe region (on the task its evaluation ran, its
    scene compiled from `assets`, with the region's initial-state terms and sampler): None if it
    gives the recorded failures, else what differs. EvaluationRecordError if the probe cannot be
    read."""
    try:
        region = probe_record["region"]
        task = Task(evaluation["task"]["definition"], assets).replace(init=region["init"])
        sampler = Sampler.from_json(region["sampler"])
        branches, failures = probe_record["branches"], probe_record["failures"]
        counts = (branches, failures)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            raise ValueError(f"branches and failures are integers, not {counts!r}")
        if not 0 <= failures <= branches or branches < 1:
            raise ValueError(f"need 0 <= failures <= branches and branches >= 1, not {counts!r}")
    except MissingAssetError:
        raise
    except (SimError, KeyError, TypeError, ValueError) as exc:
        raise EvaluationRecordError(f"the certificate's probe cannot be replayed: {exc}") from exc
    if task.hash != region.get("task_hash"):
        return "the probe's region is not a region of the task the certificate evaluated"
    again = evaluate(
        task, policy, branches=branches, sampler=sampler, threads=threads, progress=False
    )
    found = again.n - again.successes
    if found != failures:
        return f"the probe's region fails {found} of {branches} branches here, not {failures}"
    return None


def _coordinates(task: Task, sampler: Sampler) -> list[_Coordinate]:
    out = []
    for dynamics, terms in ((True, sampler.terms), (False, task.init_terms)):
        for i, term in enumerate(terms):
            if term.dist != "uniform":
                continue
            low = term.params[0]
            components = range(len(low)) if isinstance(low, tuple) else [None]
            out += [_Coordinate(dynamics, i, c) for c in components]
    return out


def _narrowed(
    terms: tuple[SamplerTerm, ...],
    coordinates: list[_Coordinate],
    dynamics: bool,
    lows: np.ndarray,
    highs: np.ndarray,
) -> tuple[SamplerTerm, ...]:
    """`terms`, each searched coordinate narrowed to [lows, highs] (in unit coordinates)."""
    bounds: dict[int, tuple[list[float], list[float]]] = {}
    for k, c in enumerate(coordinates):
        if c.dynamics != dynamics:
            continue
        term = terms[c.term]
        low, high = (np.atleast_1d(np.asarray(p, dtype=np.float64)) for p in term.params)
        new_low, new_high = bounds.setdefault(c.term, (list(low), list(high)))
        j = c.component or 0
        new_low[j] = float(low[j] + (high[j] - low[j]) * lows[k])
        new_high[j] = float(low[j] + (high[j] - low[j]) * highs[k])
    out = list(terms)
    for i, (low_list, high_list) in bounds.items():
        per = isinstance(terms[i].params[0], tuple)
        params = (tuple(low_list), tuple(high_list)) if per else (low_list[0], high_list[0])
        out[i] = replace(terms[i], params=params)
    return tuple(out)


def _region(
    task: Task,
    sampler: Sampler,
    coordinates: list[_Coordinate],
    box: tuple[tuple[float, float], ...],
    seed: int,
) -> tuple[Task, Sampler]:
    lows, highs = np.array([b[0] for b in box]), np.array([b[1] for b in box])
    init = _narrowed(task.init_terms, coordinates, False, lows, highs)
    dynamics = _narrowed(sampler.terms, coordinates, True, lows, highs)
    return task.replace(init=[t.to_json() for t in init]), Sampler(dynamics, seed)


def _run(
    task: Task,
    caller: PolicyCaller,
    sampler: Sampler,
    coordinates: list[_Coordinate],
    points: np.ndarray,
    threads: int,
) -> list[BranchOutcome]:
    """One branch per point, with exactly the point's values, in waves."""
    patches = []
    for point in points:
        init = _narrowed(task.init_terms, coordinates, False, point, point)
        dynamics = _narrowed(sampler.terms, coordinates, True, point, point)
        template = task.template
        patches.append(
            Patch(
                sample_terms(dynamics, template, sampler.seed, 0, 1, "dynamics")[0].mutations
                + sample_terms(init, template, sampler.seed, 0, 1, "init")[0].mutations
            )
        )
    outcomes: list[BranchOutcome] = []
    with single_threaded_torch():
        for start in range(0, len(patches), _WAVE):
            chunk = patches[start : start + _WAVE]
            outcomes += run_wave(
                task, caller, sampler, 0, len(chunk), len(chunk), threads, patches=chunk
            )
    return outcomes

"""Closed-loop evaluation of a policy over N randomized branches, with bounds, SPRT and pairing."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from knowledge.stats import SPRT, mcnemar_p

from .._mlp import describe_policy, policy_from_payload, policy_payload
from .._patches import Sampler
from .._snapshot import Snapshot, check_start
from .._tasks import Task
from ._evaluation_record import Evaluation
from ._executors import make_pool
from ._rollout import BranchOutcome, PolicyCaller, run_wave

DEFAULT_WAVE = 64


@dataclass(frozen=True)
class Comparison:
    """A candidate and an incumbent evaluated on the same branches (same patches, same layout)."""

    candidate: Evaluation
    incumbent: Evaluation

    def _pairs(self) -> list[tuple[bool, bool]]:
        return [
            (c.success, i.success)
            for c, i in zip(self.candidate.outcomes, self.incumbent.outcomes, strict=True)
        ]

    @property
    def both_succeed(self) -> int:
        return sum(c and i for c, i in self._pairs())

    @property
    def candidate_only(self) -> int:
        return sum(c and not i for c, i in self._pairs())

    @property
    def incumbent_only(self) -> int:
        return sum(i and not c for c, i in self._pairs())

    @property
    def both_fail(self) -> int:
        return sum(not c and not i for c, i in self._pairs())

    @property
    def rate_difference(self) -> float:
        return (self.candidate_only - self.incumbent_only) / self.candidate.n

    @property
    def mcnemar_p(self) -> float:
        """Two-sided exact test that the two success rates differ, from the discordant branches."""
        return mcnemar_p(self.candidate_only, self.incumbent_only)

    @property
    def return_difference(self) -> float:
        """Mean over branches of candidate return minus incumbent return."""
        diffs = [
            c.total_reward - i.total_reward
            for c, i in zip(self.candidate.outcomes, self.incumbent.outcomes, strict=True)
        ]
        return math.fsum(diffs) / len(diffs)

    def to_record(self) -> dict:
        return {
            "format": "simnet.sim.comparison/1",
            "candidate": self.candidate.to_record(),
            "incumbent": self.incumbent.to_record(),
            "paired": {
                "both_succeed": self.both_succeed,
                "candidate_only": self.candidate_only,
                "incumbent_only": self.incumbent_only,
                "both_fail": self.both_fail,
                "mcnemar_p": self.mcnemar_p,
                "rate_difference": self.rate_difference,
                "return_difference": self.return_difference,
            },
        }


def evaluate(
    task: Task,
    policy: Any,
    *,
    branches: int,
    sampler: Sampler | None = None,
    wave: int | None = None,
    threads: int = 0,
    workers: int = 1,
    sprt: SPRT | None = None,
    confidence: float = 0.95,
    progress: bool | None = None,
    start: Snapshot | None = None,
    backend: str = "process",
    on_progress: Callable[[int, int], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> Evaluation:
    """Roll `policy` out closed loop in `branches` branches of `task` under `sampler`'s patches.

    `policy` is a Policy, an EntryPointRef, a torch module or a callable mapping a (wave, obs_dim)
    float64 array to (wave, act_dim) actions. Branches run in waves of `wave` (default 64) on
    `threads` physics threads (0: all CPUs), in `workers` processes, or with backend="ray" in
    `workers` Ray actors (each runs whole waves); none of these change the outcomes. With `sprt`,
    waves stop once the test decides. With `start` (a world `Snapshot`; the task must run on its
    template, see `Snapshot.task`), every branch starts from that state instead of a reset.
    `on_progress(done, branches)` is called after each wave (a service's progress; an exception it
    raises stops the run), `on_step()` after each control step of a wave run in this process (not
    in worker processes or Ray actors): a service's stop check, which a slow scene's wave would
    otherwise keep waiting for its end.
    Raises on bad input or a failing policy: a failed run yields no result.
    """
    if not isinstance(branches, int) or branches < 1:
        raise ValueError(f"branches must be a positive integer, got {branches!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    sampler = sampler or Sampler()
    wave = min(branches, DEFAULT_WAVE) if wave is None else wave
    if not isinstance(wave, int) or wave < 1:
        raise ValueError(f"wave must be a positive integer, got {wave!r}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if backend not in ("process", "ray"):
        raise ValueError(f"backend must be 'process' or 'ray', got {backend!r}")
    if start is not None:
        check_start(task, start)
    description = describe_policy(policy)
    caller = PolicyCaller(policy, task)  # checks dimensions before anything runs
    nwaves = -(-branches // wave)
    bar = tqdm(
        total=nwaves * task.horizon,
        desc=f"evaluate {task.name}",
        unit="step",
        disable=_quiet(progress),
    )
    outcomes: list[BranchOutcome] = []
    decision = decided_at = None
    setup = (
        task.to_json(),
        dict(task.assets),
        policy_payload(policy) if workers > 1 or backend == "ray" else None,
        sampler.to_json(),
        wave,
        branches,
        threads or 1,
        start.to_json() if start else None,
    )

    def step_done() -> None:
        bar.update(1)
        if on_step is not None:
            on_step()

    with bar, single_threaded_torch(), _executor(setup, workers, backend) as waves:
        for round_ in _rounds(nwaves, workers if sprt else nwaves):
            if waves is None:
                results: Iterable[list[BranchOutcome]] = (
                    run_wave(
                        task,
                        caller,
                        sampler,
                        i,
                        wave,
                        branches,
                        threads,
                        step_done,
                        start=start,
                    )
                    for i in round_
                )
            else:
                results = waves(round_)
            for done, result in enumerate(results, start=round_[0] + 1):
                outcomes += result
                bar.update(done * task.horizon - bar.n)  # waves that ended early count in full
                if on_progress is not None:
                    on_progress(len(outcomes), branches)
            if sprt is not None:
                decision, decided_at = sprt.decide([o.success for o in outcomes])
                if decision != "undecided":
                    # keep whole waves up to the deciding one, however many ran at once
                    del outcomes[-(-decided_at // wave) * wave :]
                    break
    return Evaluation(
        task,
        description,
        sampler,
        branches,
        wave,
        tuple(outcomes),
        confidence,
        sprt,
        decision,
        decided_at,
        start,
    )


def compare(
    task: Task,
    candidate: Any,
    incumbent: Any,
    *,
    branches: int,
    sampler: Sampler | None = None,
    wave: int | None = None,
    threads: int = 0,
    workers: int = 1,
    confidence: float = 0.95,
    progress: bool | None = None,
) -> Comparison:
    """Evaluate a candidate against the incumbent skill on the same branches, paired."""
    common: dict[str, Any] = dict(
        branches=branches,
        sampler=sampler,
        wave=wave,
        threads=threads,
        workers=workers,
        confidence=confidence,
        progress=progress,
    )
    return Comparison(evaluate(task, candidate, **common), evaluate(task, incumbent, **common))


def _quiet(progress: bool | None) -> bool | None:
    """tqdm's `disable`: None shows the bar only on a terminal."""
    return None if progress is None else not progress


def _rounds(nwaves: int, size: int) -> Iterator[list[int]]:
    for start in range(0, nwaves, size):
        yield list(range(start, min(start + size, nwaves)))


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """Policy calls on one intra-op thread: the same float result for a row at any machine load."""
    import torch  # here, not at import: `import sim` does not import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ---- workers (processes or Ray actors): each holds the task and policy once, runs whole waves ----


@contextlib.contextmanager
def _executor(
    setup: tuple, workers: int, backend: str
) -> Iterator[Callable[[list[int]], Iterable] | None]:
    """None (run here), or a function running a round of waves in workers, results in wave order."""
    if backend == "process" and workers == 1:
        yield None
        return
    with make_pool(backend, workers, WaveWorker, setup) as pool:
        yield lambda indices: pool.map("wave", indices)


class WaveWorker:
    """What a worker process (or actor) holds for one evaluation: it runs waves of its branches."""

    def __init__(
        self,
        task_json: dict,
        assets: dict[str, bytes],
        payload: tuple,
        sampler_json: dict,
        wave: int,
        branches: int,
        threads: int,
        start: dict | None,
    ) -> None:
        import torch

        torch.set_num_threads(1)
        self.task = Task(task_json, assets)
        self.caller = PolicyCaller(policy_from_payload(payload), self.task)
        self.sampler = Sampler.from_json(sampler_json)
        self.size, self.branches, self.threads = wave, branches, threads
        self.start = Snapshot.from_json(start, self.task.template) if start else None

    def wave(self, index: int) -> list[BranchOutcome]:
        return run_wave(
            self.task,
            self.caller,
            self.sampler,
            index,
            self.size,
            self.branches,
            self.threads,
            start=self.start,
        )

"""A validator's jobs and their order: by priority, writers taking turns within each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Job:
    kind: str  # "evaluate" or "spot_check"
    skill: str
    name: str
    certificate: str | None = None
    why: str = ""  # why it is where it is in the queue
    writer: str = ""  # who wrote the skill or certificate: writers take turns

    @property
    def key(self) -> str:
        return self.certificate or self.skill


@dataclass
class Trouble:
    """A job that failed or waits: why, how often, and when to try again."""

    job: Job
    reason: str
    attempts: int
    retry_at: float | None  # None: given up
    waiting: bool = False  # for something that may arrive (weights, a task definition)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self.job),
            "reason": self.reason,
            "attempts": self.attempts,
            "retry_at": self.retry_at,
        }


class Ranked(NamedTuple):
    priority: tuple[int, int]  # requested, spot check, evaluation; then this site's uses
    writer: str  # who wrote the skill or certificate
    hlc: int  # the writer's own timestamp: orders only its own jobs
    job: Job


def taking_turns(ranked: Iterable[Ranked], served: Counter[str]) -> list[Job]:
    """Jobs by priority; within one, writers take turns, each with its oldest job first, a writer
    whose jobs this validator ran (`served`) further back by as many turns. A writer chooses its
    timestamps and how much it publishes: ordering by timestamp alone would let one date its jobs
    early, or publish many, and starve every other writer's."""
    turns: Counter[tuple[tuple[int, int], str]] = Counter()
    keyed = []
    for r in sorted(ranked, key=lambda r: (r.priority, r.hlc, r.job.key)):
        turn = served[r.writer] + turns[r.priority, r.writer]
        turns[r.priority, r.writer] += 1
        keyed.append(((r.priority, turn, r.hlc, r.job.key), r.job))
    return [job for _, job in sorted(keyed, key=lambda item: item[0])]

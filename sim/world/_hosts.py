"""Shard hosts: what runs where a shard lives.

`ShardHost` holds a shard's engines (canonical, branches, replays) by key, in whatever process it is
in; `host_worker` puts one in an executor's worker (this process, a worker process, a Ray actor).
Every call ships a whole unit of work and returns its result; a worker that dies raises
`WorkerLost`, and the world rebuilds it from its checkpoint and log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from knowledge.stats import SPRT

from .._mlp import policy_from_payload
from .._patches import Sampler
from .._snapshot import Snapshot
from .._tasks import Task
from ..evaluation._evaluate import evaluate
from ..evaluation._executors import Worker, make_worker
from ._engine import Engine
from ._segments import Event
from ._worldrows import Checkpoint


class ShardHost:
    """A shard's engines by key ("" the canonical shard, else a branch or replay id)."""

    def __init__(self) -> None:
        self.engines: dict[str, Engine] = {}

    def pid(self) -> int:
        return os.getpid()

    def load(
        self, key: str, checkpoint: Mapping, xml: str, every: int, to: int, events: Sequence[Event]
    ) -> dict:
        """Restore a checkpoint and re-execute `events` up to tick `to`; returns the checkpoints
        crossed."""
        engine = Engine.restore(Checkpoint(**checkpoint), xml, every)
        crossed: list[Checkpoint] = []
        engine.advance(to, events, crossed.append)
        self.engines[key] = engine
        return self._report(engine, crossed, 0)

    def advance(self, key: str, to: int, events: Sequence[Event]) -> dict:
        engine = self.engines[key]
        crossed: list[Checkpoint] = []
        rejected = len(engine.rejected)
        engine.advance(to, events, crossed.append)
        return self._report(engine, crossed, rejected)

    @staticmethod
    def _report(engine: Engine, crossed: list[Checkpoint], rejected: int) -> dict:
        return {
            "tick": engine.tick,
            "template": engine.template.source_hash,
            "checkpoints": [c.to_json() for c in crossed],
            "rejected": engine.rejected[rejected:],
        }

    def replay(
        self, key: str, checkpoint: Mapping, xml: str, every: int, to: int, events: Sequence[Event]
    ) -> dict:
        """Re-execute history in a scratch engine: the checkpoints crossed and the state at `to`."""
        engine = Engine.restore(Checkpoint(**checkpoint), xml, every)
        crossed: list[Checkpoint] = []
        engine.advance(to, events, crossed.append)
        return {"checkpoints": [c.to_json() for c in crossed], "state": self._state(engine)}

    def state(self, key: str) -> dict:
        """The engine's current state: tick, template, patch and state row."""
        return self._state(self.engines[key])

    @staticmethod
    def _state(engine: Engine) -> dict:
        return {
            "tick": engine.tick,
            "template": engine.template.source_hash,
            "model_hash": engine.template.model_hash,
            "patch": engine.patch.to_json(),
            "state": engine.batch.state[0].tobytes(),
        }

    def entity_state(self, key: str, entity: str) -> dict:
        return self.engines[key].entity_state(entity)

    def drop(self, key: str) -> None:
        self.engines.pop(key, None)

    def evaluate(self, key: str, where: Mapping[str, Any], spec: Mapping[str, Any]) -> dict:
        """A whole evaluation from the engine's current state, run here."""
        engine = self.engines[key]
        start = Snapshot(
            where["world"],
            where["world_id"],
            where["shard"],
            where["branch"],
            engine.tick,
            where["events"],
            engine.template,
            engine.patch,
            engine.batch.state[0],
        )
        task = Task(spec["task"])
        result = evaluate(
            task,
            policy_from_payload(spec["policy"]),
            branches=spec["branches"],
            sampler=Sampler.from_json(spec["sampler"]),
            wave=spec["wave"],
            threads=spec["threads"],
            sprt=SPRT.from_json(spec["sprt"]) if spec["sprt"] else None,
            confidence=spec["confidence"],
            progress=False,
            start=start,
        )
        return {
            "outcomes": result.outcomes,
            "decision": result.decision,
            "decided_at": result.decided_at,
            "start": start.to_json(),
        }


def host_worker(backend: str) -> Worker:
    """A worker holding a fresh `ShardHost`: in this process, a worker process or a Ray actor."""
    return make_worker(backend, ShardHost)

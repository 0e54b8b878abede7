"""Shard workers: what runs where a shard lives, and the three ways to run it.

`ShardHost` holds a shard's engines (canonical, branches, replays) by key, in whatever process it is
in. A `Worker` runs one host: `inline` in this process, `process` (the default) in a worker process
forked from the evaluation workers' preloaded forkserver, or `ray` as a Ray actor. Every call ships
a whole unit of work and returns its result; a worker that dies raises `WorkerLost`, and the world
rebuilds it from its checkpoint and log.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ._engine import Engine
from ._evaluate import evaluate, policy_from_payload, process_pool
from ._patches import Sampler
from ._snapshot import Snapshot
from ._stats import SPRT
from ._tasks import Task
from ._worldstore import Checkpoint

BACKENDS = ("process", "ray", "inline")


class WorkerLost(Exception):
    """The worker died during a call (internal: the world rebuilds it)."""


def raising(error: BaseException) -> Callable[[], Any]:
    """A waiter for a call that failed before it could be waited on: it raises the call's error."""

    def wait() -> Any:
        raise error

    return wait


class ShardHost:
    """A shard's engines by key ("" the canonical shard, else a branch or replay id)."""

    def __init__(self) -> None:
        self.engines: dict[str, Engine] = {}

    def pid(self) -> int:
        return os.getpid()

    def load(
        self, key: str, checkpoint: Mapping, xml: str, every: int, to: int, events: list[dict]
    ) -> dict:
        """Restore a checkpoint and re-execute `events` up to tick `to`; returns the checkpoints crossed."""
        engine = Engine.restore(Checkpoint(**checkpoint), xml, every)
        crossed: list[Checkpoint] = []
        engine.advance(to, events, crossed.append)
        self.engines[key] = engine
        return self._report(engine, crossed, 0)

    def advance(self, key: str, to: int, events: list[dict]) -> dict:
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
        self, key: str, checkpoint: Mapping, xml: str, every: int, to: int, events: list[dict]
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


class Worker(abc.ABC):
    """One shard host somewhere (in this process, a worker process, a Ray actor); `call` returns a
    function that waits for the result."""

    @property
    def pid(self) -> int | None:
        """The worker's process id (its start is awaited here, so workers start in parallel)."""
        return self._pid()

    @abc.abstractmethod
    def call(self, method: str, *args: Any) -> Callable[[], Any]: ...

    @abc.abstractmethod
    def restart(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class InlineWorker(Worker):
    """The host in this process: no isolation, no parallelism, no transport."""

    def __init__(self) -> None:
        self.host = ShardHost()
        self._pid = os.getpid

    def call(self, method: str, *args: Any) -> Callable[[], Any]:
        """Runs the method now, but raises its error on wait, as the other workers do: the world's cleanup
        after a failed call runs there."""
        try:
            result = getattr(self.host, method)(*args)
        except Exception as exc:  # noqa: BLE001 - raised by the waiter
            return raising(exc)
        return lambda: result

    def restart(self) -> None:
        self.host = ShardHost()

    def close(self) -> None:
        self.host.engines.clear()


_HOST: ShardHost | None = None


def _host_call(method: str, args: tuple) -> Any:
    global _HOST
    if _HOST is None:
        _HOST = ShardHost()
    return getattr(_HOST, method)(*args)


class ProcessWorker(Worker):
    """The host in a process of its own (a one-process pool from the preloaded forkserver)."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._pool = process_pool(1)
        self._pid = self._pool.submit(os.getpid).result

    def call(self, method: str, *args: Any) -> Callable[[], Any]:
        try:
            future = self._pool.submit(_host_call, method, args)
        except BrokenProcessPool as exc:
            raise WorkerLost(str(exc)) from exc

        def result() -> Any:
            try:
                return future.result()
            except BrokenProcessPool as exc:
                raise WorkerLost(str(exc)) from exc

        return result

    def restart(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._start()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayWorker(Worker):
    """The host in a Ray actor from the session's pool."""

    def __init__(self) -> None:
        from . import _ray

        self._ray = _ray
        self._lost = _ray.lost_errors()
        self._start()

    def _start(self) -> None:
        self.actor = self._ray.acquire()
        ref = self.actor.pid.remote()
        self._pid = lambda: self._wait(ref)

    def _wait(self, ref: Any) -> Any:
        try:
            return self._ray.ray_module().get(ref)
        except self._lost as exc:
            raise WorkerLost(str(exc)) from exc

    def call(self, method: str, *args: Any) -> Callable[[], Any]:
        ref = self.actor.call.remote(method, args)
        return lambda: self._wait(ref)

    def restart(self) -> None:
        self._start()

    def close(self) -> None:
        self._ray.release(self.actor)


def make_worker(backend: str) -> Worker:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return {"process": ProcessWorker, "ray": RayWorker, "inline": InlineWorker}[backend]()

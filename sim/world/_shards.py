"""A world's shards: the store, the worker hosting each shard's engines, and what they were sent.

The store is the truth; workers are caches of it. Every mutation is appended to its shard's log
(durable) before any worker applies it; a worker reports checkpoints as it crosses them, and the
new head and those checkpoints commit together. A worker that dies is rebuilt from the last
checkpoint plus the log, and the result is bit-identical because the engine is deterministic.
`World` composes one `Shards` and hands it to branches, replays and migrations: it is everything
those operations use, under one lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from knowledge.stats import SPRT

from .._errors import (
    HistoryError,
    MutationError,
    UnknownEntityError,
    UnknownShardError,
    WorkerLostError,
    WorldError,
)
from .._mlp import describe_policy, policy_payload
from .._numbers import is_number
from .._patches import Mutation, Patch, Sampler
from .._snapshot import Snapshot, check_start, on_template
from .._tasks import Task
from .._templates import Template, cached_template
from ..evaluation._evaluation_record import Evaluation
from ..evaluation._executors import WorkerLost, raising
from ._entities import Entity
from ._hosts import host_worker
from ._segments import Event
from ._world_input import MAX_AHEAD, MAX_TICK, as_int, check_text, check_tick, mutate_event
from ._worldrows import Checkpoint, Log
from ._worldstore import CANONICAL, WorldStore

log = logging.getLogger(__name__)
_RETRIES = 3


class Shards:
    """The shards of one open world, each engine keyed by (shard, branch id; "" the canonical one).

    Callers hold `lock` around anything that reads and then writes. `head`, `events`, `snapshot`,
    `apply`, `delete` and `evaluate` take it themselves; the other methods expect it held.
    """

    def __init__(self, store: WorldStore, backend: str) -> None:
        self.store = store
        self.lock = threading.RLock()
        self.id = store.id
        self.name: str = store.meta("name")
        self.checkpoint_every: int = store.meta("checkpoint_every")
        self.recoveries = 0  # workers rebuilt from checkpoint and log since opening
        self.scenes: dict[str, str] = store.shards()
        self.entities = {e["name"]: Entity.from_json(e) for e in store.entities()}
        self._delivered: dict[str, dict[str, int]] = {s: {} for s in self.scenes}  # last seq sent
        self._current: dict[tuple[str, str], str] = {}  # (shard, key) -> template source hash
        self._templates: dict[str, Template] = {}
        self._workers = {}
        try:
            for shard in self.scenes:
                self._workers[shard] = host_worker(backend)
            loads = [(s, self._load(s, CANONICAL)) for s in self.scenes]  # started together
            for shard, wait in loads:
                try:
                    wait()
                except WorkerLost as exc:
                    self._recover(shard, exc)
                    self.call(shard, CANONICAL, "state", lambda: ())()  # loads it, retrying
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        self.store.close()

    @property
    def names(self) -> list[str]:
        return sorted(self.scenes)

    def worker_pid(self, shard: str) -> int | None:
        return self._workers[shard].pid

    def rollback(self) -> None:
        """After a rolled-back transaction: workers may have run what it held, so rebuild them from
        the store, and re-read the entities (migrations too)."""
        for shard in self.scenes:
            self._delivered[shard].clear()
        self._current.clear()
        self.entities = {e["name"]: Entity.from_json(e) for e in self.store.entities()}

    # ---- reading ----

    def log(self, shard: str, key: str) -> Log:
        if not isinstance(shard, str) or shard not in self.scenes:
            raise UnknownShardError(
                f"world {self.name!r} has no shard {shard!r}; shards are {self.names}"
            )
        try:
            return self.store.log(shard, key)
        except KeyError:
            raise UnknownShardError(f"shard {shard!r} has no branch {key!r}") from None

    def head(self, shard: str, key: str) -> int:
        with self.lock:
            return self.log(shard, key).head

    def events(
        self, shard: str, key: str, first_tick: int = 0, last_tick: int | None = None
    ) -> list[Event]:
        first_tick = check_tick("first_tick", first_tick)
        if last_tick is not None:
            last_tick = check_tick("last_tick", last_tick)
        with self.lock:
            self.log(shard, key)
            return self.store.events(shard, key, first_tick=first_tick, last_tick=last_tick)

    def template(self, shard: str, key: str) -> Template:
        """The template engine `key` of `shard` runs on now."""
        source = self._current.get((shard, key))
        if source is None:
            self._ensure(shard, key)
            source = self._current[shard, key]
        if source not in self._templates:
            self._templates[source] = cached_template(self.store.template(source)[0])
        return self._templates[source]

    def switched(self, shard: str, key: str, source_hash: str) -> None:
        """A committed template switch (a migration): the engine runs on `source_hash` from now."""
        self._current[shard, key] = source_hash

    def snapshot(self, shard: str, key: str) -> Snapshot:
        with self.lock:
            self.log(shard, key)
            self.wait_all([(shard, self.advance(shard, key, 0))])
            state = self.call(shard, key, "state", lambda: ())()
            xml, _ = self.store.template(state["template"])
            return Snapshot(
                self.name,
                self.id,
                shard,
                key or None,
                state["tick"],
                self._delivered[shard].get(key, 0),
                cached_template(xml),
                Patch.from_json(state["patch"]),
                np.frombuffer(state["state"], dtype=np.float64),
            )

    # ---- writing ----

    def apply(
        self,
        shard: str,
        key: str,
        mutations: Mutation | Iterable[Mutation],
        provenance: str,
        at: int | None,
    ) -> Event:
        try:
            batch = (mutations,) if isinstance(mutations, Mutation) else tuple(mutations)
        except TypeError:
            raise MutationError(
                str(mutations)[:60], "an event's mutations are a sim.Mutation or a list of them"
            ) from None
        if not batch:
            raise ValueError("an event needs at least one mutation")
        check_text("provenance", provenance)
        with self.lock:
            head = self.log(shard, key).head
            _, last = self.store.last_event(shard, key)
            # an int in range (the usual case) as is; anything else through the full check
            if at is None:
                tick = head
            elif type(at) is int and 0 <= at <= MAX_TICK:
                tick = at
            else:
                tick = check_tick("at", at)
            if tick < head or tick < last or tick > head + MAX_AHEAD:
                _refuse_tick(shard, key, head, last, tick)
            event = mutate_event(self.template(shard, key), tick, batch, provenance)
            with self.store.transaction():
                return self.store.append(shard, key, (event,))[0]

    def advance(self, shard: str, key: str, steps: int) -> Callable[[], Any]:
        """Issue an `advance` of engine `key` by `steps` ticks (0: apply the events logged at its
        head); the function returned waits for it and commits it."""
        return self.call(shard, key, "advance", self._flush_args(shard, key, steps))

    def wait_all(self, calls: list[tuple[str, Callable[[], Any]]]) -> None:
        """Wait for calls issued on several shards at once; every one is waited for (and an advance
        committed) even if another fails, then the first failure is raised."""
        failure: BaseException | None = None
        for _shard, wait in calls:
            try:
                wait()
            except Exception as exc:  # noqa: BLE001 - raised below, after the others are settled
                failure = failure or exc
        if failure is not None:
            raise failure

    def delete(self, shard: str, key: str) -> None:
        """Drop a branch: its engine, its log and its checkpoints."""
        with self.lock:
            self.log(shard, key)
            self.unload(shard, key)
            with self.store.transaction():
                self.store.delete_log(shard, key)
            self._current.pop((shard, key), None)

    def unload(self, shard: str, key: str) -> None:
        """Free an engine in the worker; it is rebuilt from the store when used again."""
        if self._delivered[shard].pop(key, None) is not None:
            self._workers[shard].call("drop", key)()

    def wire(self, events: Sequence[Event]) -> list[Event]:
        """Events as a worker applies them: template switches carry their MJCF (`change["xml"]`)."""
        return [
            event._replace(
                change={**event.change, "xml": self.store.template(event.change["template"])[0]}
            )
            if event.kind in ("leave", "enter")
            else event
            for event in events
        ]

    # ---- evaluating ----

    def evaluate(
        self,
        shard: str,
        task: Task,
        policy: Any,
        *,
        branches: int,
        sampler: Sampler | None = None,
        entity: str | None = None,
        wave: int | None = None,
        threads: int = 1,
        sprt: SPRT | None = None,
        confidence: float = 0.95,
        branch: str = CANONICAL,
    ) -> Evaluation:
        """`World.evaluate`: it runs inside the shard's worker, from the engine's state."""
        for name, value in (("branches", branches), ("threads", threads)):
            if (as_int(value) or 0) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        branches, threads = int(branches), int(threads)  # integers (numpy's too), checked above
        if not is_number(confidence) or not 0 < confidence < 1:
            raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
        for name, arg, kind in (
            ("task", task, Task),
            ("sampler", sampler, Sampler),
            ("sprt", sprt, SPRT),
        ):
            if not isinstance(arg, kind) and (name == "task" or arg is not None):
                raise ValueError(
                    f"{name} must be a sim.{kind.__name__}{'' if name == 'task' else ' or None'}, "
                    f"got {type(arg).__name__}"
                )
        with self.lock:
            self.log(shard, branch)
            template = self.template(shard, branch)
            sampler = sampler or Sampler()
            if entity is not None:
                if entity not in self.entities:
                    raise UnknownEntityError(f"world {self.name!r} has no entity {entity!r}")
                if self.entities[entity].shard != shard:
                    raise UnknownEntityError(
                        f"entity {entity!r} is in shard {self.entities[entity].shard!r}, "
                        f"not {shard!r}"
                    )
                sampler = Snapshot.sampler(sampler, entity)
            task = on_template(task, template, entity)
            wave = min(branches, 64) if wave is None else wave
            spec = {
                "task": task.to_json(),
                "policy": policy_payload(policy),
                "sampler": sampler.to_json(),
                "branches": branches,
                "wave": wave,
                "threads": threads,
                "confidence": confidence,
                "sprt": sprt.to_json() if sprt else None,
            }
            self.wait_all([(shard, self.advance(shard, branch, 0))])
            where = self._where(shard, branch)
            report = self.call(shard, branch, "evaluate", lambda: (where(), spec))()
            start = Snapshot.from_json(report["start"], template.xml)
            check_start(task, start)
            return Evaluation(
                task,
                describe_policy(policy),
                sampler,
                branches,
                wave,
                tuple(report["outcomes"]),
                confidence,
                sprt,
                report["decision"],
                report["decided_at"],
                start,
            )

    def _where(self, shard: str, key: str) -> Callable[[], dict]:
        return lambda: {
            "world": self.name,
            "world_id": self.id,
            "shard": shard,
            "branch": key or None,
            "events": self._delivered[shard].get(key, 0),
        }

    # ---- calls on workers ----

    def call(
        self, shard: str, key: str, method: str, args: Callable[[], tuple], *, load: bool = True
    ) -> Callable[[], Any]:
        """Issue `method` on engine `key` of `shard`'s worker now (loading it first, with `load`);
        the returned function waits for it. A worker that dies is rebuilt from checkpoint and log
        and the call issued again; an `advance` is committed (checkpoints and head together) when
        it returns."""

        def issue() -> Callable[[], Any]:
            for _ in range(_RETRIES):
                try:
                    if load:
                        self._ensure(shard, key)
                    call_args = args()
                    return self._finisher(
                        shard,
                        key,
                        method,
                        call_args,
                        self._workers[shard].call(method, key, *call_args),
                    )
                except WorkerLost as exc:
                    self._recover(shard, exc)
            raise WorkerLostError(f"the worker of shard {shard!r} died {_RETRIES} times in a row")

        try:
            pending = issue()
        except Exception as exc:  # noqa: BLE001 - raised on wait, after calls already issued on other shards
            pending = raising(exc)

        def wait() -> Any:
            nonlocal pending
            for _ in range(_RETRIES):
                try:
                    return pending()
                except WorkerLost as exc:
                    self._recover(shard, exc)
                    pending = issue()
            raise WorkerLostError(f"the worker of shard {shard!r} died {_RETRIES} times in a row")

        return wait

    def _flush_args(self, shard: str, key: str, steps: int) -> Callable[[], tuple]:
        """Arguments of an `advance` by `steps`, computed when (re)issued: the events not yet sent
        (none of them is before the head: those were sent as the engine passed their ticks)."""

        def args() -> tuple:
            head = self.log(shard, key).head
            if head + steps > MAX_TICK:
                raise HistoryError(
                    f"shard {shard!r} is at tick {head}: {steps} more would pass tick {MAX_TICK}"
                )
            events = self.store.events(
                shard,
                key,
                first_tick=head,
                last_tick=head + steps,
                after_seq=self._delivered[shard][key],
            )
            return head + steps, self.wire(events)

        return args

    def _finisher(
        self, shard: str, key: str, method: str, args: tuple, waiter: Callable[[], Any]
    ) -> Callable[[], Any]:
        def finish() -> Any:
            try:
                report = waiter()
                if method == "advance":
                    if report["tick"] != args[0]:  # never expected: the head would be out of step
                        reached = report["tick"]
                        raise WorldError(
                            f"shard {shard!r}: the engine reached tick {reached}, not {args[0]}"
                        )
                    self._commit(shard, key, args[0], args[1], report)
            except WorkerLost:
                raise
            except BaseException:
                # the engine may be half-way, or past what the store kept: rebuild it on next use
                self._delivered[shard].pop(key, None)
                raise
            return report

        return finish

    def _commit(self, shard: str, key: str, to: int, sent: list[Event], report: Mapping) -> None:
        with self.store.transaction():
            if report["checkpoints"]:
                self.store.put_checkpoints(
                    shard, key, [Checkpoint(**c) for c in report["checkpoints"]]
                )
            if to != self.log(shard, key).head:
                self.store.set_head(shard, key, to)
        if sent:
            self._delivered[shard][key] = sent[-1].seq
        self._current[shard, key] = report["template"]
        for seq, why in report["rejected"]:
            log.warning(
                "shard %s%s: event %d was rejected: %s",
                shard,
                f" branch {key}" if key else "",
                seq,
                why,
            )

    def _ensure(self, shard: str, key: str) -> None:
        if key not in self._delivered[shard]:
            self._load(shard, key)()

    def _load(self, shard: str, key: str) -> Callable[[], None]:
        """Load engine `key` into `shard`'s worker: its checkpoint plus its log up to its head."""
        head = self.log(shard, key)
        checkpoint, events = self._history(shard, key, head)
        xml, _ = self.store.template(checkpoint.template)
        waiter = self._workers[shard].call(
            "load",
            key,
            checkpoint.to_json(),
            xml,
            self.checkpoint_every,
            head.head,
            self.wire(events),
        )

        def finish() -> None:
            self._current[shard, key] = waiter()["template"]
            self._delivered[shard][key] = self.store.last_seq(shard, key, head.head)

        return finish

    def _history(self, shard: str, key: str, head: Log) -> tuple[Checkpoint, list[Event]]:
        """The checkpoint an engine restarts from and the events to re-execute up to its head."""
        own = self.store.checkpoint(shard, key, head.head)
        if own is not None:
            return own, self.store.events(shard, key, first_tick=own.tick, last_tick=head.head)
        # a branch without checkpoints yet: the canonical one at its base, and the canonical events
        base = self.store.checkpoint(shard, CANONICAL, head.base_tick)
        assert base is not None  # pruning keeps the checkpoints branches start from
        before = self.store.events(
            shard, CANONICAL, first_tick=base.tick, last_tick=head.base_tick - 1
        )
        return base, before + self.store.events(shard, key, last_tick=head.head)

    def _recover(self, shard: str, exc: BaseException) -> None:
        log.warning(
            "the worker of shard %s died (%s); rebuilding it from checkpoint and log", shard, exc
        )
        self.recoveries += 1
        self._delivered[shard].clear()
        self._workers[shard].restart()


def _refuse_tick(shard: str, key: str, head: int, last: int, tick: int) -> NoReturn:
    """HistoryError for an event at a tick its log cannot take (off the path of every event)."""
    where = f"shard {shard!r}{' branch ' + key if key else ''}"
    if tick < head or tick < last:
        raise HistoryError(
            f"{where} is at tick {head} (last event at {last}): events cannot go to tick "
            f"{tick}; fork at {tick} to change the past"
        )
    # it would hold back every later event until then
    raise HistoryError(
        f"{where} is at tick {head}: an event can be scheduled at most {MAX_AHEAD} "
        f"ticks ahead, not at {tick}"
    )

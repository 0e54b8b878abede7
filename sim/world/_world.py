"""Persistent, sharded worlds: a site's digital twin that remembers, forks cheaply and replays exactly.

The store is the truth; workers are caches of it. Every mutation is appended to its shard's log
(durable) before any worker applies it; a worker reports checkpoints as it crosses them, and the
new head and those checkpoints commit together. A worker that dies, or a world reopened after a
crash, is rebuilt from the last checkpoint plus the log, and the result is bit-identical because the
engine is deterministic. Only this process writes the store, so a migration between shards is one
SQLite transaction: the entity leaves one log and enters the other, or neither.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from ._canon import is_number
from ._entities import Entity, check_name, compose
from ._errors import (
    HistoryError,
    MutationError,
    UnknownEntityError,
    UnknownShardError,
    WorkerLostError,
    WorldError,
)
from ._evaluate import Evaluation, policy_payload
from ._hosts import WorkerLost, make_worker, raising
from ._patches import Mutation, Patch, Sampler
from ._policies import describe_policy
from ._segments import Event
from ._snapshot import Snapshot, check_start, on_template
from ._stats import SPRT
from ._tasks import Task
from ._templates import Template, cached_template
from ._world_input import (
    MAX_AHEAD,
    MAX_TICK,
    as_int,
    check_steps,
    check_text,
    check_tick,
    mutate_event,
)
from ._worldstore import CANONICAL, Checkpoint, Log, WorldStore

if TYPE_CHECKING:  # _branches imports this module
    from ._branches import Branch, Replay

log = logging.getLogger(__name__)
_RETRIES = 3
_INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION


@dataclass(frozen=True)
class Intervention:
    """A counterfactual change for `World.replay`: `mutation` at tick `at`."""

    at: int
    mutation: Mutation
    provenance: str = "intervention"


@dataclass(frozen=True)
class Migration:
    """A committed handoff: `entity` left `source` (event `left`) and entered `target` (event `entered`)."""

    id: str
    entity: str
    source: str
    target: str
    left: Event
    entered: Event


class World:
    """A world of shards, each in its own worker (`backend` "process", "ray" or "inline").

    Ticks are physics steps of a shard. Use `World.create` or `World.open`, and close it (or use
    it as a context manager). Thread-safe: calls are serialized.
    """

    def __init__(self, store: WorldStore, backend: str) -> None:
        self._store = store
        self._lock = threading.RLock()
        self.id = store.id
        self.name: str = store.meta("name")
        self.checkpoint_every: int = store.meta("checkpoint_every")
        self.backend = backend
        self.recoveries = 0  # workers rebuilt from checkpoint and log since opening
        self._scenes = store.shards()
        self._entities = {e["name"]: Entity.from_json(e) for e in store.entities()}
        self._delivered: dict[str, dict[str, int]] = {
            s: {} for s in self._scenes
        }  # engines loaded: last seq sent
        self._current: dict[tuple[str, str], str] = {}  # (shard, key) -> template source hash
        self._templates: dict[str, Template] = {}
        self._workers = {}
        try:
            for shard in self._scenes:
                self._workers[shard] = make_worker(backend)
            for shard, wait in [
                (s, self._load(s, CANONICAL)) for s in self._scenes
            ]:  # started together
                try:
                    wait()
                except WorkerLost as exc:
                    self._recover(shard, exc)
                    self._call(shard, CANONICAL, "state", lambda: ())()  # loads it, retrying
        except BaseException:
            self.close()
            raise

    # ---- creating and opening ----

    @classmethod
    def create(
        cls,
        path: str | Path,
        shards: Mapping[str, str],
        entities: Sequence[Entity] = (),
        *,
        name: str | None = None,
        checkpoint_every: int = 1000,
        backend: str = "process",
        fsync: bool = False,
    ) -> World:
        """A new world at `path` (an SQLite file; `<path>-redo` beside it holds recent commits): `shards`
        maps shard names to scene MJCF, each entity starts in its `shard`. Checkpoints every
        `checkpoint_every` ticks; `fsync` makes every commit survive power loss, not only a killed process."""
        if not isinstance(shards, Mapping) or not shards:
            raise ValueError(
                "a world needs at least one shard: a mapping of shard names to scene MJCF"
            )
        every = as_int(checkpoint_every)
        if every is None or every < 1:
            raise ValueError(
                f"checkpoint_every must be a positive integer, got {checkpoint_every!r}"
            )
        checkpoint_every = every
        if name is not None:
            check_text("name", name)
        for shard, scene in shards.items():
            check_name("shard", shard)
            if not isinstance(scene, str):
                raise ValueError(
                    f"the scene of shard {shard!r} must be MJCF text, got {type(scene).__name__}"
                )
        entities = list(entities)  # a generator would be spent by the checks below
        if not all(isinstance(e, Entity) for e in entities):
            raise ValueError("entities must be sim.Entity objects")
        names = [e.name for e in entities]
        if len(set(names)) != len(names):
            raise ValueError(f"entity names must be unique, got {sorted(names)}")
        for e in entities:
            if e.shard not in shards:
                raise UnknownShardError(
                    f"entity {e.name!r} is placed in shard {e.shard!r}; shards are {sorted(shards)}"
                )
        templates = {
            s: cached_template(compose(scene, [e for e in entities if e.shard == s]))
            for s, scene in shards.items()
        }
        store = WorldStore(path, create=True, fsync=fsync)
        try:
            with store.transaction():
                store.set_meta("name", name or Path(path).stem)
                store.set_meta("checkpoint_every", checkpoint_every)
                for shard, scene in shards.items():
                    store.add_shard(shard, scene)
                    template = templates[shard]
                    store.put_template(template.xml, template.model_hash)
                    store.add_log(Log(shard, CANONICAL, 0, 0, "canonical"))
                    store.put_checkpoints(shard, CANONICAL, [_initial_checkpoint(template)])
                for e in entities:
                    store.put_entity(e.to_json())
            return cls(store, backend)
        except BaseException:
            store.discard()
            raise

    @classmethod
    def open(cls, path: str | Path, *, backend: str = "process") -> World:
        """Reopen a world: every shard resumes exactly where it stopped (last checkpoint plus log)."""
        return cls(WorldStore(path, create=False), backend)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        self._store.close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading ----

    @property
    def shards(self) -> list[str]:
        return sorted(self._scenes)

    def entities(self) -> dict[str, str]:
        """Entity name -> the shard it is in."""
        return {name: e.shard for name, e in sorted(self._entities.items())}

    def head(self, shard: str, branch: str = CANONICAL) -> int:
        """The tick a shard's canonical log (or a branch) has reached."""
        with self._lock:
            return self._log(shard, branch).head

    def events(
        self,
        shard: str,
        branch: str = CANONICAL,
        *,
        first_tick: int = 0,
        last_tick: int | None = None,
    ) -> list[Event]:
        """A shard's canonical log (or a branch's own), verified; only the events of ticks
        first_tick..last_tick (both included) if given: a twin's whole log can be long."""
        first_tick = check_tick("first_tick", first_tick)
        if last_tick is not None:
            last_tick = check_tick("last_tick", last_tick)
        with self._lock:
            self._log(shard, branch)
            return self._store.events(shard, branch, first_tick=first_tick, last_tick=last_tick)

    def status(self) -> dict:
        with self._lock:
            shards = {}
            for shard in self.shards:
                head = self.head(shard)
                template = self._template(shard, CANONICAL)
                shards[shard] = {
                    "tick": head,
                    "time": head * float(template.model.opt.timestep),
                    "history_from": self._log(shard, CANONICAL).base_tick,
                    "entities": [n for n, s in self.entities().items() if s == shard],
                    "events": self._store.last_event(shard, CANONICAL)[0],
                    "checkpoints": self._store.count_checkpoints(shard, CANONICAL),
                    "template": template.source_hash,
                    "worker_pid": self._workers[shard].pid,
                }
            branches = [
                {
                    "id": b.branch,
                    "shard": b.shard,
                    "base_tick": b.base_tick,
                    "head": b.head,
                    "label": b.label,
                }
                for b in self._store.logs()
            ]
            return {
                "name": self.name,
                "id": self.id,
                "path": str(self._store.path),
                "backend": self.backend,
                "checkpoint_every": self.checkpoint_every,
                "shards": shards,
                "branches": branches,
                "migrations": len(self._store.migrations()),
                "recoveries": self.recoveries,
            }

    def worker_pid(self, shard: str) -> int | None:
        """The process id of a shard's worker (None if the backend cannot say)."""
        with self._lock:
            self._log(shard, CANONICAL)
            return self._workers[shard].pid

    # ---- writing ----

    def apply(
        self,
        shard: str,
        mutations: Mutation | Iterable[Mutation],
        *,
        provenance: str = "api",
        at: int | None = None,
    ) -> Event:
        """Log one event of `shard`: `mutations` applied together (all or none) at tick `at` (default: its
        head; never before its head or its last event). It is durable when this returns (or when the
        enclosing `batch()` ends) and takes effect as the shard reaches `at`."""
        return self._apply(shard, CANONICAL, mutations, provenance, at)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: what the block logs (events, advances, forks) becomes durable together when it
        ends, or none of it if it raises. For streams of small events: one commit instead of one each."""
        with self._lock:
            try:
                with self._store.transaction():
                    yield
            except BaseException:
                for shard in (
                    self._scenes
                ):  # workers may have run what was rolled back: rebuild from the store
                    self._delivered[shard].clear()
                self._current.clear()
                self._entities = {
                    e["name"]: Entity.from_json(e) for e in self._store.entities()
                }  # migrations too
                raise

    def advance(self, steps: int, shards: Sequence[str] | None = None) -> dict[str, int]:
        """Step every shard (or `shards`) `steps` ticks, in parallel across workers; returns the heads."""
        steps = check_steps(steps)
        with self._lock:
            targets = (
                list(dict.fromkeys(shards)) if shards is not None else self.shards
            )  # each once
            for shard in targets:
                self._log(shard, CANONICAL)
            self._wait_all(
                [
                    (s, self._call(s, CANONICAL, "advance", self._flush_args(s, CANONICAL, steps)))
                    for s in targets
                ]
            )
            return {s: self.head(s) for s in targets}

    def snapshot(self, shard: str) -> Snapshot:
        """The shard's current state (at its head, every event logged so far applied)."""
        return self._snapshot(shard, CANONICAL)

    def fork(self, shard: str, at: int, *, label: str = "") -> Branch:
        """A branch of `shard` from tick `at` (the state on arrival at `at`, before that tick's events):
        a checkpoint reference plus a log of its own. Nothing done to it touches the canonical world."""
        from ._branches import fork

        return fork(self, shard, at, label)

    def branch(self, branch_id: str) -> Branch:
        """A branch made earlier (also in an earlier session)."""
        from ._branches import Branch

        found = [b for b in self._store.logs() if b.branch == branch_id]
        if not found:
            raise UnknownShardError(f"world {self.name!r} has no branch {branch_id!r}")
        return Branch(self, found[0].shard, branch_id)

    def branches(self, shard: str | None = None) -> list[Branch]:
        from ._branches import Branch

        return [Branch(self, b.shard, b.branch) for b in self._store.logs(shard)]

    def replay(
        self, shard: str, start: int, stop: int, *, interventions: Sequence[Intervention] = ()
    ) -> Replay:
        """Re-execute `shard` from its last checkpoint at or before `start` to `stop`. Without
        interventions, every checkpoint crossed is compared with the recorded one (`Replay.exact`);
        with them, the canonical events of [start, stop) and the interventions make a new branch."""
        from ._branches import replay

        return replay(self, shard, start, stop, interventions)

    def prune(self, before: int, shards: Sequence[str] | None = None) -> dict[str, int]:
        """Retention: forget each shard's canonical history before its last checkpoint at or before tick
        `before` (events, checkpoints); forks and replays start there from then on. Returns the ticks the
        shards' histories now start at. Refused (HistoryError) while a branch forks from earlier: delete it."""
        from ._branches import prune

        return prune(self, before, shards)

    def migrate(self, entity: str, to: str, *, provenance: str = "migration") -> Migration:
        """Move an entity to shard `to`, with its state and its mutations, exactly once."""
        from ._branches import migrate

        return migrate(self, entity, to, provenance)

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
        """Evaluate `policy` from the shard's current state (or a branch's), inside the shard's worker.

        With `entity`, `task` and `sampler` name that entity's objects ("torso" -> "walker1/torso")."""
        for name, value in (("branches", branches), ("threads", threads)):
            if (as_int(value) or 0) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        branches, threads = as_int(branches), as_int(threads)
        if not is_number(confidence) or not 0 < confidence < 1:
            raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
        for name, value, kind in (
            ("task", task, Task),
            ("sampler", sampler, Sampler),
            ("sprt", sprt, SPRT),
        ):
            if not isinstance(value, kind) and (name == "task" or value is not None):
                raise ValueError(
                    f"{name} must be a sim.{kind.__name__}{'' if name == 'task' else ' or None'}, "
                    f"got {type(value).__name__}"
                )
        with self._lock:
            self._log(shard, branch)
            template = self._template(shard, branch)
            sampler = sampler or Sampler()
            if entity is not None:
                if entity not in self._entities:
                    raise UnknownEntityError(f"world {self.name!r} has no entity {entity!r}")
                if self._entities[entity].shard != shard:
                    raise UnknownEntityError(
                        f"entity {entity!r} is in shard {self._entities[entity].shard!r}, "
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
            self._wait_all(
                [(shard, self._call(shard, branch, "advance", self._flush_args(shard, branch, 0)))]
            )
            where = self._where(shard, branch)
            report = self._call(shard, branch, "evaluate", lambda: (where(), spec))()
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

    # ---- internals shared with branches ----

    def _log(self, shard: str, branch: str) -> Log:
        if not isinstance(shard, str) or shard not in self._scenes:
            raise UnknownShardError(
                f"world {self.name!r} has no shard {shard!r}; shards are {self.shards}"
            )
        try:
            return self._store.log(shard, branch)
        except KeyError:
            raise UnknownShardError(f"shard {shard!r} has no branch {branch!r}") from None

    def _template(self, shard: str, key: str) -> Template:
        if (shard, key) not in self._current:
            self._ensure(shard, key)
        source = self._current[shard, key]
        if source not in self._templates:
            self._templates[source] = cached_template(self._store.template(source)[0])
        return self._templates[source]

    def _where(self, shard: str, key: str) -> Callable[[], dict]:
        return lambda: {
            "world": self.name,
            "world_id": self.id,
            "shard": shard,
            "branch": key or None,
            "events": self._delivered[shard].get(key, 0),
        }

    def _apply(
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
        with self._lock:
            head = self._log(shard, key).head
            _, last = self._store.last_event(shard, key)
            tick = head if at is None else check_tick("at", at)
            if tick < head or tick < last:
                raise HistoryError(
                    f"shard {shard!r}{' branch ' + key if key else ''} is at tick {head} (last event "
                    f"at {last}): events cannot go to tick {tick}; fork at {tick} to change the past"
                )
            if (
                tick > head + MAX_AHEAD
            ):  # it would hold back every later event until the shard got there
                raise HistoryError(
                    f"shard {shard!r}{' branch ' + key if key else ''} is at tick {head}: an event "
                    f"can be scheduled at most {MAX_AHEAD} ticks ahead, not at {tick}"
                )
            event = mutate_event(self._template(shard, key), tick, batch, provenance)
            with self._store.transaction():
                return self._store.append(shard, key, (event,))[0]

    def _snapshot(self, shard: str, key: str) -> Snapshot:
        with self._lock:
            self._log(shard, key)
            self._wait_all(
                [(shard, self._call(shard, key, "advance", self._flush_args(shard, key, 0)))]
            )
            state = self._call(shard, key, "state", lambda: ())()
            xml, _ = self._store.template(state["template"])
            where = self._where(shard, key)()
            return Snapshot(
                self.name,
                self.id,
                shard,
                key or None,
                state["tick"],
                where["events"],
                cached_template(xml),
                Patch.from_json(state["patch"]),
                np.frombuffer(state["state"], dtype=np.float64),
            )

    def _flush_args(self, shard: str, key: str, steps: int) -> Callable[[], tuple]:
        """Arguments of an `advance` by `steps`, computed when (re)issued: the events not yet sent (none of
        them is before the head: those were sent as the engine passed their ticks)."""

        def args() -> tuple:
            head = self._log(shard, key).head
            if head + steps > MAX_TICK:
                raise HistoryError(
                    f"shard {shard!r} is at tick {head}: {steps} more would pass tick {MAX_TICK}"
                )
            events = self._store.events(
                shard,
                key,
                first_tick=head,
                last_tick=head + steps,
                after_seq=self._delivered[shard][key],
            )
            return head + steps, self._wire(events)

        return args

    def _wait_all(self, calls: list[tuple[str, Callable[[], Any]]]) -> None:
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

    def _wire(self, events: Sequence[Event]) -> list[Event]:
        """Events as a worker applies them: template switches carry their MJCF (in `change["xml"]`)."""
        return [
            event._replace(
                change={**event.change, "xml": self._store.template(event.change["template"])[0]}
            )
            if event.kind in ("leave", "enter")
            else event
            for event in events
        ]

    def _call(
        self, shard: str, key: str, method: str, args: Callable[[], tuple], *, load: bool = True
    ) -> Callable[[], Any]:
        """Issue `method` on engine `key` of `shard`'s worker now (loading it first, with `load`); the
        returned function waits for it. A worker that dies is rebuilt from checkpoint and log and the
        call issued again; an `advance` is committed (checkpoints and head together) when it returns."""

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

    def _finisher(
        self, shard: str, key: str, method: str, args: tuple, waiter: Callable[[], Any]
    ) -> Callable[[], Any]:
        def finish() -> Any:
            try:
                report = waiter()
                if method == "advance":
                    if (
                        report["tick"] != args[0]
                    ):  # never expected; committing it would put the head out of step
                        raise WorldError(
                            f"shard {shard!r}: the engine reached tick {report['tick']}, not {args[0]}"
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
        with self._store.transaction():
            self._store.put_checkpoints(
                shard, key, [Checkpoint(**c) for c in report["checkpoints"]]
            )
            if to != self._log(shard, key).head:
                self._store.set_head(shard, key, to)
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
        head = self._log(shard, key)
        checkpoint, events = self._history(shard, key, head)
        xml, _ = self._store.template(checkpoint.template)
        waiter = self._workers[shard].call(
            "load",
            key,
            checkpoint.to_json(),
            xml,
            self.checkpoint_every,
            head.head,
            self._wire(events),
        )

        def finish() -> None:
            self._current[shard, key] = waiter()["template"]
            self._delivered[shard][key] = self._store.last_seq(shard, key, head.head)

        return finish

    def _history(self, shard: str, key: str, head: Log) -> tuple[Checkpoint, list[Event]]:
        """The checkpoint an engine restarts from and the events to re-execute up to its head."""
        own = self._store.checkpoint(shard, key, head.head)
        if own is not None:
            return own, self._store.events(shard, key, first_tick=own.tick, last_tick=head.head)
        base = self._store.checkpoint(
            shard, CANONICAL, head.base_tick
        )  # a branch without checkpoints yet
        before = self._store.events(
            shard, CANONICAL, first_tick=base.tick, last_tick=head.base_tick - 1
        )
        return base, before + self._store.events(shard, key, last_tick=head.head)

    def _unload(self, shard: str, key: str) -> None:
        """Free an engine in the worker; it is rebuilt from the store when used again."""
        if self._delivered[shard].pop(key, None) is not None:
            self._workers[shard].call("drop", key)()

    def _recover(self, shard: str, exc: BaseException) -> None:
        log.warning(
            "the worker of shard %s died (%s); rebuilding it from checkpoint and log", shard, exc
        )
        self.recoveries += 1
        self._delivered[shard].clear()
        self._workers[shard].restart()


def _initial_checkpoint(template: Template) -> Checkpoint:
    data = mujoco.MjData(template.model)
    row = np.empty(mujoco.mj_stateSize(template.model, _INTEGRATION))
    mujoco.mj_getState(template.model, data, row, _INTEGRATION)
    return Checkpoint(0, template.source_hash, template.model_hash, [], row.tobytes())

"""Persistent, sharded worlds: a site's digital twin that remembers, forks cheaply and replays
exactly.

`World` is the public face: creating and opening a world's store, and the operations on it. What
they run on, the store and the shards' workers, is a `Shards` (see `_shards`); a world reopened
after a crash is rebuilt from the last checkpoint plus the log, bit for bit, as a dead worker is.
Only this process writes the store, so a migration between shards is one SQLite transaction: the
entity leaves one log and enters the other, or neither (see `_branches`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from knowledge.stats import SPRT

from .._errors import UnknownShardError
from .._patches import Mutation, Sampler
from .._snapshot import Snapshot
from .._tasks import Task
from .._templates import cached_template
from ..evaluation._evaluation_record import Evaluation
from . import _branches
from ._branches import Branch, Intervention, Migration, Replay
from ._engine import initial_checkpoint
from ._entities import Entity, check_name, compose
from ._segments import Event
from ._shards import Shards
from ._world_input import as_int, check_steps, check_text
from ._worldfiles import check_folder
from ._worldrows import Log
from ._worldstore import CANONICAL, WorldStore


class World:
    """A world of shards, each in its own worker (`backend` "process", "ray" or "inline").

    Ticks are physics steps of a shard. Use `World.create` or `World.open`, and close it (or use
    it as a context manager). Thread-safe: calls are serialized.
    """

    def __init__(self, store: WorldStore, backend: str) -> None:
        self._shards = Shards(store, backend)
        self.id = store.id
        self.path = store.path
        self.name = self._shards.name
        self.checkpoint_every = self._shards.checkpoint_every
        self.backend = backend

    @property
    def recoveries(self) -> int:
        """Workers rebuilt from checkpoint and log since opening."""
        return self._shards.recoveries

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
        """A new world at `path` (an SQLite file; `<path>-redo` beside it holds recent commits):
        `shards` maps shard names to scene MJCF, each entity starts in its `shard`. Checkpoints
        every `checkpoint_every` ticks; `fsync` makes every commit survive power loss, not only a
        killed process. The folder must exist (WorldError naming it if not: as with SQLite,
        nothing is created but the world's own files)."""
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
        check_folder(Path(path))  # before the scenes are compiled: that takes a while
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
                    store.put_checkpoints(shard, CANONICAL, [initial_checkpoint(template)])
                for e in entities:
                    store.put_entity(e.to_json())
            return cls(store, backend)
        except BaseException:
            store.discard()
            raise

    @classmethod
    def open(cls, path: str | Path, *, backend: str = "process") -> World:
        """Reopen a world: every shard resumes exactly where it stopped (last checkpoint plus
        log)."""
        return cls(WorldStore(path, create=False), backend)

    def close(self) -> None:
        self._shards.close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading ----

    @property
    def shards(self) -> list[str]:
        return self._shards.names

    def entities(self) -> dict[str, str]:
        """Entity name -> the shard it is in."""
        return {name: e.shard for name, e in sorted(self._shards.entities.items())}

    def head(self, shard: str, branch: str = CANONICAL) -> int:
        """The tick a shard's canonical log (or a branch) has reached."""
        return self._shards.head(shard, branch)

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
        return self._shards.events(shard, branch, first_tick, last_tick)

    def status(self) -> dict:
        shards, store = self._shards, self._shards.store
        with shards.lock:
            status = {}
            for shard in self.shards:
                head = self.head(shard)
                template = shards.template(shard, CANONICAL)
                status[shard] = {
                    "tick": head,
                    "time": head * float(template.model.opt.timestep),
                    "history_from": shards.log(shard, CANONICAL).base_tick,
                    "entities": [n for n, s in self.entities().items() if s == shard],
                    "events": store.last_event(shard, CANONICAL)[0],
                    "checkpoints": store.count_checkpoints(shard, CANONICAL),
                    "template": template.source_hash,
                    "worker_pid": shards.worker_pid(shard),
                }
            branches = [
                {
                    "id": b.branch,
                    "shard": b.shard,
                    "base_tick": b.base_tick,
                    "head": b.head,
                    "label": b.label,
                }
                for b in store.logs()
            ]
            return {
                "name": self.name,
                "id": self.id,
                "path": str(store.path),
                "backend": self.backend,
                "checkpoint_every": self.checkpoint_every,
                "shards": status,
                "branches": branches,
                "migrations": len(store.migrations()),
                "recoveries": self.recoveries,
            }

    def worker_pid(self, shard: str) -> int | None:
        """The process id of a shard's worker (None if the backend cannot say)."""
        with self._shards.lock:
            self._shards.log(shard, CANONICAL)
            return self._shards.worker_pid(shard)

    # ---- writing ----

    def apply(
        self,
        shard: str,
        mutations: Mutation | Iterable[Mutation],
        *,
        provenance: str = "api",
        at: int | None = None,
    ) -> Event:
        """Log one event of `shard`: `mutations` applied together (all or none) at tick `at`
        (default: its head; never before its head or its last event). It is durable when this
        returns (or when the enclosing `batch()` ends) and takes effect as the shard reaches
        `at`."""
        return self._shards.apply(shard, CANONICAL, mutations, provenance, at)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: what the block logs (events, advances, forks) becomes durable together when
        it ends, or none of it if it raises. For streams of small events: one commit instead of one
        each."""
        with self._shards.lock:
            try:
                with self._shards.store.transaction():
                    yield
            except BaseException:
                self._shards.rollback()
                raise

    def advance(self, steps: int, shards: Sequence[str] | None = None) -> dict[str, int]:
        """Step every shard (or `shards`) `steps` ticks, in parallel across workers; returns the
        heads."""
        steps = check_steps(steps)
        with self._shards.lock:
            # each once
            targets = list(dict.fromkeys(shards)) if shards is not None else self.shards
            for shard in targets:
                self._shards.log(shard, CANONICAL)
            self._shards.wait_all([(s, self._shards.advance(s, CANONICAL, steps)) for s in targets])
            return {s: self.head(s) for s in targets}

    def snapshot(self, shard: str) -> Snapshot:
        """The shard's current state (at its head, every event logged so far applied)."""
        return self._shards.snapshot(shard, CANONICAL)

    def fork(self, shard: str, at: int, *, label: str = "") -> Branch:
        """A branch of `shard` from tick `at` (the state on arrival at `at`, before that tick's
        events): a checkpoint reference plus a log of its own. Nothing done to it touches the
        canonical world."""
        return _branches.fork(self._shards, shard, at, label)

    def branch(self, branch_id: str) -> Branch:
        """A branch made earlier (also in an earlier session)."""
        found = [b for b in self._shards.store.logs() if b.branch == branch_id]
        if not found:
            raise UnknownShardError(f"world {self.name!r} has no branch {branch_id!r}")
        return Branch(self._shards, found[0].shard, branch_id)

    def branches(self, shard: str | None = None) -> list[Branch]:
        return [Branch(self._shards, b.shard, b.branch) for b in self._shards.store.logs(shard)]

    def replay(
        self, shard: str, start: int, stop: int, *, interventions: Sequence[Intervention] = ()
    ) -> Replay:
        """Re-execute `shard` from its last checkpoint at or before `start` to `stop`. Without
        interventions, every checkpoint crossed is compared with the recorded one (`Replay.exact`);
        with them, the canonical events of [start, stop) and the interventions make a new branch."""
        return _branches.replay(self._shards, shard, start, stop, interventions)

    def prune(self, before: int, shards: Sequence[str] | None = None) -> dict[str, int]:
        """Retention: forget each shard's canonical history before its last checkpoint at or before
        tick `before` (events, checkpoints); forks and replays start there from then on. Returns the
        ticks the shards' histories now start at. Refused (HistoryError) while a branch forks from
        earlier: delete it."""
        return _branches.prune(self._shards, before, shards)

    def migrate(self, entity: str, to: str, *, provenance: str = "migration") -> Migration:
        """Move an entity to shard `to`, with its state and its mutations, exactly once."""
        return _branches.migrate(self._shards, entity, to, provenance)

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
        """Evaluate `policy` from the shard's current state (or a branch's), inside the shard's
        worker.

        With `entity`, `task` and `sampler` name that entity's objects ("torso" ->
        "walker1/torso")."""
        return self._shards.evaluate(
            shard,
            task,
            policy,
            branches=branches,
            sampler=sampler,
            entity=entity,
            wave=wave,
            threads=threads,
            sprt=sprt,
            confidence=confidence,
            branch=branch,
        )

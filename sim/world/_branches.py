"""Branches, replays and migrations: the operations of a world that make new histories.

A branch is a checkpoint reference (a shard and a tick) plus a log of its own; its engine lives in
the shard's worker beside the canonical one and is rebuilt like it. A replay re-executes recorded
history and compares it with the checkpoints recorded on the way; with interventions it becomes a
counterfactual branch. A migration reads the entity's state from its shard, then commits its leave
and enter events in one transaction: a worker that dies before the commit leaves the entity where
it was, one that dies after it is rebuilt from a log that holds both events.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._errors import HistoryError, UnknownEntityError, WorldError
from .._patches import Mutation, Patch
from .._snapshot import Snapshot
from .._templates import Template, cached_template
from ..evaluation._evaluation_record import Evaluation
from ._entities import Entity, compose
from ._segments import Event
from ._shards import Shards
from ._world_input import as_int, check_steps, check_text, check_tick, mutate_event
from ._worldrows import Checkpoint, Log
from ._worldstore import CANONICAL


@dataclass(frozen=True)
class Intervention:
    """A counterfactual change for `World.replay`: `mutation` at tick `at`."""

    at: int
    mutation: Mutation
    provenance: str = "intervention"


@dataclass(frozen=True)
class Migration:
    """A committed handoff: `entity` left `source` (event `left`) and entered `target` (event
    `entered`)."""

    id: str
    entity: str
    source: str
    target: str
    left: Event
    entered: Event


class Branch:
    """A fork of one shard: it starts as the shard was at `base_tick` and lives on its own log."""

    def __init__(self, shards: Shards, shard: str, branch_id: str) -> None:
        self._shards = shards
        self.shard = shard
        self.id = branch_id

    def __repr__(self) -> str:
        return f"Branch({self.shard!r}, {self.id!r}, base_tick={self.base_tick}, head={self.head})"

    @property
    def base_tick(self) -> int:
        # a read may fold the redo file in: not in the middle of another thread's batch
        with self._shards.lock:
            return self._shards.log(self.shard, self.id).base_tick

    @property
    def head(self) -> int:
        return self._shards.head(self.shard, self.id)

    @property
    def label(self) -> str:
        with self._shards.lock:
            return self._shards.log(self.shard, self.id).label

    def apply(
        self,
        mutations: Mutation | Sequence[Mutation],
        *,
        provenance: str = "api",
        at: int | None = None,
    ) -> Event:
        """Log an event on this branch only (at its head by default), as `World.apply`."""
        return self._shards.apply(self.shard, self.id, mutations, provenance, at)

    def advance(self, steps: int) -> int:
        """Step the branch; returns its new head."""
        steps = check_steps(steps)
        with self._shards.lock:
            self._shards.wait_all([(self.shard, self._shards.advance(self.shard, self.id, steps))])
            return self.head

    def snapshot(self) -> Snapshot:
        return self._shards.snapshot(self.shard, self.id)

    def events(self, *, first_tick: int = 0, last_tick: int | None = None) -> list[Event]:
        return self._shards.events(self.shard, self.id, first_tick, last_tick)

    def evaluate(self, task: Any, policy: Any, **options: Any) -> Evaluation:
        """`World.evaluate` from this branch's current state, inside the shard's worker."""
        return self._shards.evaluate(self.shard, task, policy, branch=self.id, **options)

    def delete(self) -> None:
        """Drop the branch: its engine, its log and its checkpoints. The canonical world is
        untouched."""
        self._shards.delete(self.shard, self.id)


@dataclass(frozen=True)
class Replay:
    """A re-execution of `shard` up to tick `stop`: the `snapshot` on arrival there; which recorded
    checkpoints it crossed (`checked`) and which of those it did not reproduce bit for bit; with
    interventions, the counterfactual `branch` instead."""

    shard: str
    start: int
    stop: int
    snapshot: Snapshot
    branch: Branch | None
    checked: tuple[int, ...]
    mismatched: tuple[int, ...]

    @property
    def exact(self) -> bool:
        return self.branch is None and not self.mismatched


def fork(shards: Shards, shard: str, at: int, label: str) -> Branch:
    check_text("label", label)
    with shards.lock:
        log = shards.log(shard, CANONICAL)
        tick = as_int(at)
        if tick is None or not log.base_tick <= tick <= log.head:
            raise HistoryError(
                f"shard {shard!r} has history for ticks {log.base_tick}..{log.head}: "
                f"cannot fork at {at!r}"
            )
        at = tick
        branch_id = uuid.uuid4().hex[:16]
        with shards.store.transaction():
            shards.store.add_log(Log(shard, branch_id, at, at, label))
        return Branch(shards, shard, branch_id)


def replay(
    shards: Shards, shard: str, start: int, stop: int, interventions: Sequence[Intervention]
) -> Replay:
    with shards.lock:
        log = shards.log(shard, CANONICAL)
        first, last = as_int(start), as_int(stop)
        if first is None or last is None or not log.base_tick <= first <= last <= log.head:
            raise HistoryError(
                f"shard {shard!r} has history for ticks {log.base_tick}..{log.head}: "
                f"cannot replay {start!r}..{stop!r}"
            )
        start, stop = first, last
        store = shards.store
        interventions = tuple(interventions)
        if interventions:
            template = _template_at(shards, shard, start)
            added = []
            for iv in interventions:
                if not isinstance(iv, Intervention):
                    raise ValueError(f"interventions are sim.Intervention objects, got {iv!r}")
                at = check_tick("an intervention's tick", iv.at)
                if not start <= at < stop:
                    raise HistoryError(
                        f"an intervention at tick {at} is outside the replay [{start}, {stop})"
                    )
                added.append(
                    mutate_event(
                        template,
                        at,
                        [iv.mutation],
                        check_text("an intervention's provenance", iv.provenance),
                    )
                )
            rows = [
                (e.tick, e.entity, e.kind, e.change, f"{e.provenance} (canonical #{e.seq})")
                for e in store.events(shard, CANONICAL, first_tick=start, last_tick=stop - 1)
            ]
            rows += added
            rows.sort(key=lambda row: row[0])  # stable: at one tick, the recorded events come first
            with store.transaction():  # the branch and its events, or neither
                branch = fork(
                    shards,
                    shard,
                    start,
                    f"replay {start}..{stop} with {len(interventions)} intervention(s)",
                )
                store.append(shard, branch.id, rows)
            branch.advance(stop - start)
            snapshot = branch.snapshot()
            shards.unload(shard, branch.id)
            return Replay(shard, start, stop, snapshot, branch, (), ())
        checkpoint = store.checkpoint(shard, CANONICAL, start)
        assert checkpoint is not None  # `start` was checked against the recorded history
        events = store.events(shard, CANONICAL, first_tick=checkpoint.tick, last_tick=stop - 1)
        xml, _ = store.template(checkpoint.template)
        args = (checkpoint.to_json(), xml, shards.checkpoint_every, stop, shards.wire(events))
        report = shards.call(shard, "", "replay", lambda: args, load=False)()
        recorded = {
            c.tick: c for c in store.checkpoints(shard, CANONICAL, checkpoint.tick + 1, stop)
        }
        crossed = [Checkpoint(**c) for c in report["checkpoints"]]
        checked = tuple(c.tick for c in crossed if c.tick in recorded)
        mismatched = tuple(c.tick for c in crossed if c.tick in recorded and c != recorded[c.tick])
        state = report["state"]
        snapshot = Snapshot(
            shards.name,
            shards.id,
            shard,
            None,
            stop,
            store.last_seq(shard, CANONICAL, stop - 1),
            cached_template(store.template(state["template"])[0]),
            Patch.from_json(state["patch"]),
            np.frombuffer(state["state"], dtype=np.float64),
        )
        return Replay(shard, start, stop, snapshot, None, checked, mismatched)


def _template_at(shards: Shards, shard: str, tick: int) -> Template:
    """The canonical template of `shard` on arrival at `tick`."""
    store = shards.store
    checkpoint = store.checkpoint(shard, CANONICAL, tick)
    assert checkpoint is not None  # one is kept at or before every tick of the history
    switches = [
        e
        for e in store.events(shard, CANONICAL, first_tick=checkpoint.tick, last_tick=tick - 1)
        if e.kind in ("leave", "enter")
    ]
    source = switches[-1].change["template"] if switches else checkpoint.template
    return cached_template(store.template(source)[0])


def prune(shards: Shards, before: int, names: Sequence[str] | None) -> dict[str, int]:
    tick = as_int(before)
    if tick is None or tick < 0:
        raise ValueError(f"before must be a non-negative tick, got {before!r}")
    before = tick
    with shards.lock:
        targets = list(names) if names is not None else shards.names
        starts = {}
        for shard in targets:
            log = shards.log(shard, CANONICAL)
            # a checkpoint at the base always exists: the first one, or the one the last pruning
            # kept
            kept = shards.store.checkpoint(
                shard, CANONICAL, min(max(before, log.base_tick), log.head)
            )
            assert kept is not None
            starts[shard] = kept.tick
            older = [b.branch for b in shards.store.logs(shard) if b.base_tick < starts[shard]]
            if older:
                raise HistoryError(
                    f"shard {shard!r}: branches {older} fork before tick {starts[shard]}; "
                    "delete them before pruning there"
                )
        with shards.store.transaction():
            for shard, start in starts.items():
                if start > shards.log(shard, CANONICAL).base_tick:
                    shards.store.prune(shard, CANONICAL, start)
        return starts


# ---- migration: read, commit (the one atomic step), deliver ----


def migrate(shards: Shards, entity: str, to: str, provenance: str) -> Migration:
    check_text("provenance", provenance)
    with shards.lock:
        found = shards.entities.get(entity) if isinstance(entity, str) else None
        if found is None:
            raise UnknownEntityError(
                f"world {shards.name!r} has no entity {entity!r}; entities are "
                f"{sorted(shards.entities)}"
            )
        shards.log(to, CANONICAL)
        if found.shard == to:
            raise WorldError(f"entity {entity!r} is already in shard {to!r}")
        source = found.shard
        for shard in (source, to):
            head = shards.head(shard, CANONICAL)
            _, last = shards.store.last_event(shard, CANONICAL)
            if last > head:
                raise HistoryError(
                    f"shard {shard!r} has events scheduled up to tick {last}, "
                    f"past its head {head}: advance past them before migrating"
                )
        handoff = read_handoff(shards, source, entity)
        moved = replace(found, shard=to)
        others = [e for e in shards.entities.values() if e.name != entity]
        templates = (
            cached_template(
                compose(shards.scenes[source], [e for e in others if e.shard == source])
            ),
            cached_template(
                compose(shards.scenes[to], [e for e in others if e.shard == to] + [moved])
            ),
        )
        migration = commit_migration(shards, moved, source, templates, handoff, provenance)
        shards.entities[entity] = moved
        deliver(shards, (source, to))
        return migration


def read_handoff(shards: Shards, shard: str, entity: str) -> dict:
    """The entity's state at the shard's head, every event logged so far applied (reads only)."""
    shards.wait_all([(shard, shards.advance(shard, CANONICAL, 0))])
    return shards.call(shard, CANONICAL, "entity_state", lambda: (entity,))()


def commit_migration(
    shards: Shards,
    moved: Entity,
    source: str,
    templates: tuple[Template, Template],
    handoff: dict,
    provenance: str,
) -> Migration:
    store, ident = shards.store, uuid.uuid4().hex[:16]
    leaving, entering = templates
    with store.transaction():
        for template in templates:
            store.put_template(template.xml, template.model_hash)
        common = {"entity": moved.name, "migration": ident}
        (left,) = store.append(
            source,
            CANONICAL,
            [
                (
                    shards.head(source, CANONICAL),
                    moved.name,
                    "leave",
                    {**common, "template": leaving.source_hash, "model_hash": leaving.model_hash},
                    provenance,
                )
            ],
        )
        (entered,) = store.append(
            moved.shard,
            CANONICAL,
            [
                (
                    shards.head(moved.shard, CANONICAL),
                    moved.name,
                    "enter",
                    {
                        **common,
                        "template": entering.source_hash,
                        "model_hash": entering.model_hash,
                        "state": handoff["state"],
                        "patch": handoff["patch"],
                        "from": source,
                    },
                    provenance,
                )
            ],
        )
        store.put_entity(moved.to_json())
        store.add_migration(
            {
                "id": ident,
                "entity": moved.name,
                "source": source,
                "target": moved.shard,
                "left": left.seq,
                "entered": entered.seq,
            }
        )
    shards.switched(source, CANONICAL, leaving.source_hash)
    shards.switched(moved.shard, CANONICAL, entering.source_hash)
    return Migration(ident, moved.name, source, moved.shard, left, entered)


def deliver(shards: Shards, names: Sequence[str]) -> None:
    """Apply committed events at the shards' heads now (they would be at their next call anyway)."""
    shards.wait_all([(s, shards.advance(s, CANONICAL, 0)) for s in names])

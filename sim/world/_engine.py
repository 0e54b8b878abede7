"""A shard's simulation: the deterministic core that the canonical world, branches and replays
share.

An engine holds a template, its model patch and one mjSTATE_INTEGRATION row, stepped by a
one-simulation `mujoco.batch.Batch`. Applying a log is a pure function of where it starts: the same
checkpoint and events give the same row bit for bit, whether run live, after a crash, in a fork or
on another backend. Ticks are physics steps; the state "at tick t" is the state on arrival at t,
before t's events, and that is what a checkpoint at t holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from .._errors import MutationError, ReplayTemplateError, WorldError
from .._patches import Mutation, Patch, apply_model_patches, apply_state_patches
from .._snapshot import apply_stepwise
from .._templates import Template, cached_template
from ._entities import entity_patch, moved_row, named_state
from ._segments import Event
from ._worldrows import Checkpoint

log = logging.getLogger(__name__)
_INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION


def load_template(xml: str, model_hash: str) -> Template:
    """The template a history was recorded on, or ReplayTemplateError if it compiles differently
    here."""
    template = cached_template(xml)
    if template.model_hash != model_hash:
        raise ReplayTemplateError(
            f"template {template.source_hash[:12]} was recorded as compiled model "
            f"{model_hash[:12]}, it compiles to {template.model_hash[:12]} here "
            "(another MuJoCo build?): its history cannot replay exactly"
        )
    return template


class Engine:
    """One shard's (or one branch's) simulation; `every` is the checkpoint interval in ticks."""

    def __init__(
        self, template: Template, patch: Patch, state: np.ndarray, tick: int, every: int
    ) -> None:
        self.tick = tick
        self.every = every
        self.rejected: list[tuple[int, str]] = []  # (seq, why) of events that could not apply
        self._load(template, patch, np.asarray(state, dtype=np.float64))

    @classmethod
    def restore(cls, checkpoint: Checkpoint, xml: str, every: int) -> Engine:
        template = load_template(xml, checkpoint.model_hash)
        return cls(
            template,
            Patch.from_json(checkpoint.patch),
            np.frombuffer(checkpoint.state),
            checkpoint.tick,
            every,
        )

    def _load(self, template: Template, patch: Patch, row: np.ndarray) -> None:
        self.template = template
        self.patch = patch
        self.batch = mjbatch.Batch(template.model, 1, 1)
        apply_stepwise(self.batch, template, patch, [0])
        self.batch.state[0] = row

    @property
    def row(self) -> np.ndarray:
        return self.batch.state[0].copy()

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(
            self.tick,
            self.template.source_hash,
            self.template.model_hash,
            self.patch.to_json(),
            self.batch.state[0].tobytes(),
        )

    def advance(
        self, to: int, events: Sequence[Event], on_checkpoint: Callable[[Checkpoint], None]
    ) -> None:
        """Apply `events` (template switches carry their MJCF in `change["xml"]`) at their ticks and
        step to tick `to`, handing over a checkpoint on arrival at every multiple of `every`."""
        for event in events:
            if not self.tick <= event.tick <= to:
                raise WorldError(
                    f"event {event.seq} at tick {event.tick} outside [{self.tick}, {to}]"
                )
            self._step_to(event.tick, on_checkpoint)
            self.apply(event)
        self._step_to(to, on_checkpoint)

    def _step_to(self, tick: int, on_checkpoint: Callable[[Checkpoint], None]) -> None:
        while self.tick < tick:
            stop = min(tick, (self.tick // self.every + 1) * self.every)
            try:
                self.batch.step(nstep=stop - self.tick)
            except mjbatch.SimulationError as exc:
                raise WorldError(
                    f"MuJoCo failed between ticks {self.tick} and {stop}: {self.batch.error(0)}"
                ) from exc
            self.tick = stop
            if stop % self.every == 0:
                on_checkpoint(self.checkpoint())

    def apply(self, event: Event) -> None:
        kind, change = event.kind, event.change
        if kind == "mutate":
            self._mutate([Mutation.from_json(m) for m in change["mutations"]], event.seq)
        elif kind == "leave":
            _, rest = entity_patch(self.patch, change["entity"])
            new = load_template(change["xml"], change["model_hash"])
            self._load(new, rest, moved_row(self.template.model, self.row, new.model))
        elif kind == "enter":
            new = load_template(change["xml"], change["model_hash"])
            row = moved_row(self.template.model, self.row, new.model, change["state"])
            self._load(new, self.patch + Patch.from_json(change["patch"]), row)
        else:
            raise WorldError(f"event {event.seq}: unknown kind {kind!r}")

    def _mutate(self, mutations: list[Mutation], seq: int) -> None:
        """Apply an event's mutations, all or none: one that cannot apply here (its values would
        leave the field's domain, its entity has left) rejects the event, the same way on every
        replay."""
        row, patch = self.row, self.patch
        try:
            for mutation in mutations:
                self._set(mutation)
        except MutationError as exc:
            self._load(self.template, patch, row)
            self.rejected.append((seq, str(exc)))
            log.warning("event %d (tick %d) rejected: %s", seq, self.tick, exc)

    def _set(self, mutation: Mutation) -> None:
        slot = self.template.slot(mutation.target)
        if (
            slot.state
            and mutation.op == "set"
            and not slot.quaternion
            and len(mutation.value) in (1, slot.size)
        ):
            # the common case, controls: a plain write into the state row (what the general path
            # computes)
            self.batch.bind(slot.field)[0, slot.start : slot.start + slot.size] = mutation.value
        elif slot.state:
            apply_state_patches(self.batch, self.template, [Patch((mutation,))], [0])
        else:
            apply_model_patches(self.batch, self.template, [Patch((mutation,))], [0])
            self.patch = self.patch + Patch((mutation,))

    def entity_state(self, entity: str) -> dict:
        """What an entity takes along when it leaves: the state of its elements and its
        mutations."""
        prefix = f"{entity}/"
        mine, _ = entity_patch(self.patch, entity)
        return {
            "state": named_state(self.template.model, self.row, prefix),
            "patch": mine.to_json(),
        }


def initial_checkpoint(template: Template) -> Checkpoint:
    """Tick 0 of a new shard: the template's state at rest, no model patch."""
    data = mujoco.MjData(template.model)
    row = np.empty(mujoco.mj_stateSize(template.model, _INTEGRATION))
    mujoco.mj_getState(template.model, data, row, _INTEGRATION)
    return Checkpoint(0, template.source_hash, template.model_hash, [], row.tobytes())

"""A shard's state at one tick as data, and evaluations that start from it instead of a keyframe.

A snapshot is the shard's template, its model patch (the world's mutations of masses, frictions, ...
in the order they happened) and its mjSTATE_INTEGRATION row (which includes the warm start, so that
stepping on from it is exact). Evaluation branches start from it: the snapshot's patch applied
mutation by mutation, exactly as the shard applied it, then each branch's own patch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from knowledge import sha256_hex

from ._errors import EvaluationRecordError, IncompatibleTemplateError
from ._patches import Patch, Sampler, SamplerTerm, apply_model_patches
from ._tasks import Task
from ._templates import Template, cached_template, split_target

_INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION


@dataclass(frozen=True, eq=False)
class Snapshot:
    """A shard's state at `tick`: what `World.snapshot`, `Branch.snapshot` and `Replay` return.

    `events` is how many events of its log (the canonical one, or the branch's own) had been
    applied. `state` is a read-only float64 mjSTATE_INTEGRATION row of `template`'s model.
    """

    world: str
    world_id: str
    shard: str
    branch: str | None
    tick: int
    events: int
    template: Template
    patch: Patch
    state: np.ndarray

    def __post_init__(self) -> None:
        state = np.array(self.state, dtype=np.float64)
        state.flags.writeable = False
        object.__setattr__(self, "state", state)

    @property
    def time(self) -> float:
        """Virtual time in seconds (the row's mjSTATE_TIME)."""
        return float(self.state[0])

    @property
    def state_sha256(self) -> str:
        return sha256_hex(self.state.tobytes())

    def same_state(self, other: Snapshot) -> bool:
        """Bit-identical template, patch and state row."""
        return (
            self.template.model_hash == other.template.model_hash
            and self.patch == other.patch
            and self.state.tobytes() == other.state.tobytes()
        )

    def to_json(self) -> dict:
        """Where an evaluation started, exactly: the body of a record's "start" (the scene is the
        task's)."""
        return {
            "world": {"name": self.world, "id": self.world_id},
            "shard": self.shard,
            "branch": self.branch,
            "tick": self.tick,
            "time": self.time,
            "events": self.events,
            "template": {
                "source_hash": self.template.source_hash,
                "model_hash": self.template.model_hash,
            },
            "patch": self.patch.to_json(),
            "state": self.state.tolist(),
            "state_sha256": self.state_sha256,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], scene: str | Template) -> Snapshot:
        """A snapshot from `to_json` and the scene it was taken on (its text, or its template: a
        task's, which carries the files it loads); EvaluationRecordError if they disagree."""
        try:
            template = scene if isinstance(scene, Template) else cached_template(scene)
            snapshot = cls(
                data["world"]["name"],
                data["world"]["id"],
                data["shard"],
                data["branch"],
                int(data["tick"]),
                int(data["events"]),
                template,
                Patch.from_json(data["patch"]),
                np.array(data["state"], dtype=np.float64),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationRecordError(f"record field 'start' is malformed: {exc}") from exc
        if data["template"].get("source_hash") != template.source_hash:
            raise EvaluationRecordError(
                "record field 'start.template.source_hash' does not match the task's scene"
            )
        if snapshot.state_sha256 != data.get("state_sha256"):
            raise EvaluationRecordError(
                "record field 'start.state_sha256' does not match its state"
            )
        return snapshot

    def task(self, task: Task, entity: str | None = None) -> Task:
        """`task` played from this snapshot: its scene becomes the shard's template and, with
        `entity`, the objects it names become that entity's ("torso" -> "walker1/torso")."""
        return on_template(task, self.template, entity)

    @staticmethod
    def sampler(sampler: Sampler, entity: str) -> Sampler:
        """`sampler` randomizing `entity`'s objects ("body/*/mass" -> "body/walker1/*/mass")."""
        terms = [_scope_term(t.to_json(), entity) for t in sampler.terms]
        return Sampler(tuple(SamplerTerm.from_json(t) for t in terms), sampler.seed)


def on_template(task: Task, template: Template, entity: str | None) -> Task:
    """`task` on a world shard's template, naming `entity`'s objects if given; no keyframe (the
    world's state replaces it), no assets (the world's scene replaces the task's: a world does not
    carry files yet, so its scene must load none)."""
    data = copy.deepcopy(task.to_json())
    data.pop("assets", None)
    if entity:
        for key in ("observation", "reward", "failure", "init"):
            data[key] = [_scope_term(t, entity) for t in data.get(key, [])]
        data["success"]["all"] = [_scope_term(t, entity) for t in data["success"]["all"]]
    return Task({**data, "scene": template.xml, "keyframe": None})


def _scope_term(term: dict, entity: str) -> dict:
    out = dict(term)
    for key in ("site", "from", "to", "body"):
        if isinstance(out.get(key), str):
            out[key] = f"{entity}/{out[key]}"
    if isinstance(out.get("joints"), list):
        out["joints"] = [f"{entity}/{j}" for j in out["joints"]]
    parts = split_target(out["target"]) if isinstance(out.get("target"), str) else None
    if parts is not None and parts[0] != "option":
        out["target"] = f"{parts[0]}/{entity}/{parts[1]}/{parts[2]}"
    return out


def apply_stepwise(
    batch: mjbatch.Batch, template: Template, patch: Patch, branches: Sequence[int]
) -> None:
    """A shard's model patch on the first len(branches) simulations, one mutation at a time as the
    shard applied it (each with its derived constants), so that the model is the shard's bit for
    bit."""
    for mutation in patch.mutations:
        apply_model_patches(batch, template, [Patch((mutation,))] * len(branches), branches)


def check_start(task: Task, snapshot: Snapshot) -> None:
    """IncompatibleTemplateError unless `task` runs on the snapshot's template, with its state
    layout."""
    if task.template.source_hash != snapshot.template.source_hash:
        raise IncompatibleTemplateError(
            f"task {task.name!r} runs on scene {task.template.source_hash[:12]}, "
            f"the snapshot of shard {snapshot.shard!r} on template "
            f"{snapshot.template.source_hash[:12]}: use snapshot.task(task, entity)"
        )
    size = mujoco.mj_stateSize(task.template.model, _INTEGRATION)
    if size != len(snapshot.state):
        raise IncompatibleTemplateError(
            f"the snapshot's state row has {len(snapshot.state)} values; the "
            f"template's has {size} (another MuJoCo build?)"
        )

"""The transfer dataset: skills made for source bodies, evaluated by branch evaluation on target
bodies.

Each body gets a native skill per task family, computed on that body alone (`_skills`: an inverse-
kinematics reach map or a corrected posture map, sent to servos as targets or closed by the policy
as a PD law for motors). A skill drives another body of its family through `retarget` (slots
matched: same joint role, nearest limb, then nearest side; parts the source has no counterpart for
hold still). Every cell of a success matrix is one `evaluate` of the retargeted skill on the
target's task under the family's dynamics randomization, all sources of a target on the same
branches (paired); `sources=k` measures each target with its own skill and k others drawn for it.
Targets run in `workers` processes; the outcomes do not depend on how many.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from knowledge import TransferDataset

from .._mlp import Policy
from .._mlp_spec import MLPSpec
from .._patches import Sampler
from ..evaluation._evaluate import evaluate
from ..evaluation._evaluation_record import environment
from ..evaluation._executors import process_pool
from ._robot import Robot, Slot
from ._skills import posture_skill, reach_skill

_LEGGED = [
    {"target": "geom/*/friction", "op": "scale", "dist": "uniform", "low": 0.8, "high": 1.2},
    *(
        {"target": f"body/{part}/mass", "op": "scale", "dist": "uniform", "low": 0.9, "high": 1.1}
        for part in ("torso", "*thigh*", "*shin*")
    ),
]
SAMPLERS = {
    "reach": [
        {"target": "body/link*/mass", "op": "scale", "dist": "uniform", "low": 0.8, "high": 1.2},
        {"target": "joint/j*/damping", "op": "scale", "dist": "uniform", "low": 0.7, "high": 1.3},
        {"target": "joint/j*/armature", "op": "scale", "dist": "uniform", "low": 0.7, "high": 1.3},
    ],
    "posture": _LEGGED,
}
"""Dynamics randomization per task family, for every transfer evaluation."""


def sampler(family: str, seed: int) -> Sampler:
    return Sampler.from_json({"seed": seed, "terms": SAMPLERS[family]})


@dataclass(frozen=True)
class NativeSkill:
    """A body's own skill for one task family."""

    robot: Robot
    family: str
    skill: Policy


def observation_slots(robot: Robot, family: str) -> list[tuple[str, Slot | int]]:
    """What each entry of the task's observation is, in order (see `Robot.task`)."""
    joints: list[tuple[str, Slot | int]] = [
        (kind, slot) for kind in ("qpos", "qvel") for slot in robot.slots
    ]
    if family == "posture":
        return joints + [(end, axis) for end in ("front", "back") for axis in range(3)]
    return joints + [("delta", axis) for axis in range(3)]


def _match(wanted: tuple[str, Slot | int], offered: Sequence[tuple[str, Slot | int]]) -> int | None:
    """Index of the offered entry that stands for `wanted`: same kind and joint, nearest limb, then
    nearest side."""
    kind, slot = wanted
    if not isinstance(slot, Slot):
        return next((i for i, entry in enumerate(offered) if entry == wanted), None)
    same = [
        i
        for i, (k, s) in enumerate(offered)
        if k == kind and isinstance(s, Slot) and s.joint == slot.joint
    ]

    def far(i: int) -> tuple[float, float, int]:
        other: Slot = offered[i][1]  # type: ignore[assignment]
        return abs(other.limb - slot.limb), abs(other.side - slot.side), i

    return min(same, key=far) if same else None


def retarget(skill: Policy, source: Robot, target: Robot, family: str) -> Policy:
    """`skill`, made for `source`, rewired to `target`'s observation and actuators through their
    slots.

    Inputs the source does not have read nothing (zero weight); actuators with no counterpart
    command zero. Between bodies with the same interface this returns the skill unchanged.
    """
    if family not in source.tasks or family not in target.tasks:
        raise ValueError(f"a {family} skill needs two bodies with {family} tasks")
    source_obs = observation_slots(source, family)
    obs = [_match(entry, source_obs) for entry in observation_slots(target, family)]
    act = [_match(("act", slot), [("act", s) for s in source.slots]) for slot in target.slots]
    if obs == list(range(len(source_obs))) and act == list(range(len(source.slots))):
        return skill
    tensors = {name: t.numpy() for name, t in skill.module().state_dict().items()}
    last = f"layers.{len(skill.spec.hidden)}"

    def gather(name: str, picks: list[int | None], fill: float, axis: int) -> None:
        values = tensors[name]
        shape = list(values.shape)
        shape[axis] = len(picks)
        out = np.full(shape, fill)
        for i, pick in enumerate(picks):
            if pick is not None:
                np.moveaxis(out, axis, 0)[i] = np.moveaxis(values, axis, 0)[pick]
        tensors[name] = out

    gather("layers.0.weight", obs, 0.0, 1)
    gather("obs_mean", obs, 0.0, 0)
    gather("obs_std", obs, 1.0, 0)
    for name, fill in (
        (f"{last}.weight", 0.0),
        (f"{last}.bias", 0.0),
        ("act_offset", 0.0),
        ("act_scale", 1.0),
    ):
        gather(name, act, fill, 0)
    spec = MLPSpec(
        len(obs),
        len(act),
        skill.spec.hidden,
        skill.spec.activation,
        skill.spec.output_activation,
        skill.spec.dtype,
    )
    return Policy.from_tensors(spec, tensors, {**skill.metadata, "retargeted_to": target.name})


def native_skill(robot: Robot, family: str) -> NativeSkill:
    """The body's own skill for a task family (see the module doc for how each is made)."""
    return NativeSkill(
        robot, family, reach_skill(robot) if family == "reach" else posture_skill(robot)
    )


def _measure_row(
    target: Robot, family: str, sources: list[tuple[int, NativeSkill]], branches: int, seed: int
) -> list[tuple[int, int]]:
    """Successes of every source skill on one target, all on the same branches."""
    task = target.task(family)
    return [
        (
            i,
            evaluate(
                task,
                retarget(source.skill, source.robot, target, family),
                branches=branches,
                threads=1,
                sampler=sampler(family, seed),
                progress=False,
            ).successes,
        )
        for i, source in sources
    ]


def _pool(
    workers: int, function: Callable, jobs: list[tuple], label: str, progress: bool | None
) -> Iterator:
    """`function(*job)` for every job, in order, in `workers` processes (in this one when 1)."""
    with tqdm(
        total=len(jobs), desc=label, disable=None if progress is None else not progress
    ) as bar:
        if workers == 1:
            for job in jobs:
                yield function(*job)
                bar.update(1)
            return
        with process_pool(workers, _one_torch_thread, ()) as pool:
            for result in pool.map(function, *zip(*jobs, strict=True)):
                yield result
                bar.update(1)


def _one_torch_thread() -> None:
    """A worker's policy calls on one intra-op thread (as `single_threaded_torch`)."""
    import torch

    torch.set_num_threads(1)


def _sources(
    natives: list[tuple[int, NativeSkill]], target: Robot, count: int | None, seed: int
) -> list[tuple[int, NativeSkill]]:
    """The target's own skill and `count` others drawn for it (all when None or fewer)."""
    own = [pair for pair in natives if pair[1].robot.name == target.name]
    others = [pair for pair in natives if pair[1].robot.name != target.name]
    if count is None or len(others) <= count:
        return natives
    digest = hashlib.sha256(f"{seed}:{target.name}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
    picked = sorted(rng.choice(len(others), count, replace=False))
    return sorted(own + [others[i] for i in picked], key=lambda pair: pair[0])


def transfer_dataset(
    robots: Sequence[Robot],
    *,
    branches: int = 16,
    workers: int = 1,
    seed: int = 0,
    progress: bool | None = None,
    sources: int | None = None,
) -> TransferDataset:
    """Make every body's native skills, then evaluate each on every body with that task (itself
    included), or with `sources`, on its own body and `sources` others drawn for it (seeded by
    `seed` and its name): a large population's matrix in a fraction of the time.

    Worker processes need the caller under `if __name__ == "__main__":` (as `evaluate` does).
    """
    if branches < 1 or workers < 1:
        raise ValueError(f"branches and workers must be >= 1, got {branches} and {workers}")
    if sources is not None and sources < 1:
        raise ValueError(f"sources must be >= 1, got {sources}")
    names = [r.name for r in robots]
    if len(set(names)) != len(names):
        raise ValueError(
            f"robot names must be distinct: {sorted(n for n in set(names) if names.count(n) > 1)}"
        )
    pairs = [(r, family) for r in robots for family in r.tasks]
    natives = list(_pool(workers, native_skill, pairs, "native skills", progress))
    jobs = [
        (
            target,
            family,
            _sources(
                [(i, s) for i, s in enumerate(natives) if s.family == family], target, sources, seed
            ),
            branches,
            seed,
        )
        for target, family in pairs
    ]
    bodies = {r.name: r.embodiment() for r in robots}
    outcomes = []
    for (target, family), row in zip(
        pairs, _pool(workers, _measure_row, jobs, "transfer", progress), strict=True
    ):
        outcomes += [
            (bodies[natives[s].robot.name], bodies[target.name], family, k, branches)
            for s, k in row
        ]
    meta = {
        "generator": "sim.transfer_dataset",
        "branches": branches,
        "seed": seed,
        "sources_per_target": sources,
        "robots": [
            {
                "name": r.name,
                "kind": r.kind,
                "morphology": r.morphology,
                "class": CLASSES[r.morphology],
                "source": r.source,
            }
            for r in robots
        ],
        "samplers": SAMPLERS,
        "environment": environment(),
    }
    return TransferDataset.from_outcomes(outcomes, meta)


CLASSES = {
    "arm": "arm",
    "industrial arm": "arm",
    "two-armed torso": "arm",
    "mobile manipulator": "mobile manipulator",
    "planar legged": "planar legged",
    "quadruped": "quadruped",
    "humanoid": "humanoid",
}
"""The class each morphology counts as for `train_encoder(classes=...)`: the kinds of robot a
user tells apart (an arm is an arm however many of them a torso carries)."""


def body_classes(datasets: Sequence[TransferDataset]) -> dict[str, str]:
    """Each robot's class (`CLASSES`) by name, as `transfer_dataset` recorded it in the datasets'
    meta (`TransferDataset.classes`), or for older files from its morphology (files from before
    morphologies were recorded held arms and planar legged bodies only: their kind says which)."""
    classes = {}
    for data in datasets:
        for robot in data.meta.get("robots", []):
            morphology = (
                robot.get("morphology") or {"arm": "arm", "legged": "planar legged"}[robot["kind"]]
            )
            classes[robot["name"]] = robot.get("class") or CLASSES[morphology]
    return classes

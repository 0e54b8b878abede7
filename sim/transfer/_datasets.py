"""The transfer dataset: skills made for source bodies, evaluated by branch evaluation on target
bodies.

Each body gets a native skill per task family, computed on that body alone and expressed as
data (a linear `MLPSpec`, hidden=()):

- reach (arms): an open-loop inverse-kinematics map. Goals are sampled in the task's box around the
  home tool position and solved by damped least squares on the body's own model; a linear map from
  goal offset to joint angles is fitted to the solutions (least squares). It moves the joints once,
  with no feedback on the tool: on another arm it works as far as that arm's kinematics and gear
  agree.
- posture (legged): an open-loop map from the goal heights of the torso's two ends to joint angles.
  Goals are sampled in the task's range; each is solved by the body's own leg geometry (torso pitch
  and height from the goal, then two-link inverse kinematics per leg, feet staying where they
  stand), then corrected on the body's own model: the pose is held with its actuators until it
  settles, and what it missed (sag under gravity, feet slipping) corrects the aim it is solved for
  by Broyden's method, the best of five tries kept. A linear map from goal to angles is fitted to
  the corrected solutions (least squares). On another body it works as far as that body's legs
  (lengths, knee direction, limits), gear, stiffness and masses agree.

A skill drives another body of its kind through `retarget` (slots matched: same joint index, nearest
limb). Every cell of a success matrix is one `evaluate` of the retargeted skill on the target's task
under the family's dynamics randomization, all sources of a target on the same branches (paired).
Targets run in `workers` processes; the outcomes do not depend on how many.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import mujoco
import numpy as np
import torch
from tqdm.auto import tqdm

from knowledge import TransferDataset

from .._mlp import MLPSpec, Policy
from .._patches import Sampler
from ..evaluation._evaluate import evaluate
from ..evaluation._evaluation_record import environment
from ..evaluation._executors import process_pool
from ._bodies import POSTURE_RANGE, Robot, Slot

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
    """Index of the offered entry that stands for `wanted`: same kind and joint, nearest limb."""
    kind, slot = wanted
    if not isinstance(slot, Slot):
        return next((i for i, entry in enumerate(offered) if entry == wanted), None)
    same = [
        i
        for i, (k, s) in enumerate(offered)
        if k == kind and isinstance(s, Slot) and s.joint == slot.joint
    ]
    return min(same, key=lambda i: (abs(offered[i][1].limb - slot.limb), i)) if same else None  # type: ignore[union-attr]


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


def _linear_skill(weight: np.ndarray, bias: np.ndarray, note: str) -> Policy:
    act_dim, obs_dim = weight.shape
    spec = MLPSpec(obs_dim, act_dim, (), "tanh", None)
    return Policy.from_tensors(
        spec,
        {
            "layers.0.weight": weight,
            "layers.0.bias": bias,
            "obs_mean": np.zeros(obs_dim),
            "obs_std": np.ones(obs_dim),
            "act_offset": np.zeros(act_dim),
            "act_scale": np.ones(act_dim),
        },
        {"note": note},
    )


def reach_skill(robot: Robot, samples: int = 200) -> Policy:
    """Fit the linear inverse-kinematics map of an arm over its task's goal box (see the module
    doc)."""
    task = robot.task("reach")
    model = task.template.model
    data = mujoco.MjData(model)
    home = np.array(robot.home)
    address = np.array([model.joint(j).qposadr[0] for j in robot.joints])
    dofs = np.array([model.joint(j).dofadr[0] for j in robot.joints])
    box = task.definition["init"][0]  # the goal's offsets from the home tool position
    offsets = np.random.default_rng(0).uniform(box["low"], box["high"], (samples, 3))
    tool, jac = model.site("ee").id, np.zeros((3, model.nv))
    solutions = []
    for offset in offsets:
        data.qpos[address] = home
        mujoco.mj_kinematics(model, data)
        goal = data.site_xpos[tool] + offset
        for _ in range(30):
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, jac, None, tool)
            columns = jac[:, dofs]
            error = goal - data.site_xpos[tool]
            data.qpos[address] += columns.T @ np.linalg.solve(
                columns @ columns.T + 0.05**2 * np.eye(3), error
            )
        solutions.append(data.qpos[address] - home)
    ik = np.linalg.lstsq(offsets, np.array(solutions), rcond=None)[0].T  # (joints, 3)
    gear, n = np.array(robot.gear), len(robot.joints)
    weight = np.zeros((n, task.obs_dim))
    weight[:, 2 * n :] = gear[:, None] * ik
    return _linear_skill(weight, gear * home, f"linear inverse kinematics of {robot.name}")


def _leg_pose(model: mujoco.MjModel, robot: Robot, aim: np.ndarray) -> np.ndarray:
    """Joint angles that put the torso's ends `aim[:2]` (front, back) above where they start and the
    torso `aim[2]` ahead of where it starts, every foot staying where it stands: the torso's pitch
    and height from the aim, then each leg's own two-link inverse kinematics, its knee bent the way
    its range allows."""
    front, back = model.site("front").pos[0], model.site("back").pos[0]
    pitch = math.asin(float(np.clip((aim[1] - aim[0]) / (front - back), -1, 1)))
    centre = model.body("torso").pos[2] + aim[0] + front * math.sin(pitch)
    angles = np.zeros(len(robot.joints))
    for hip, knee in _legs(robot):
        thigh, shin = (model.joint(robot.joints[k]).bodyid[0] for k in (hip, knee))
        foot = next(g for g in range(model.ngeom) if model.geom_bodyid[g] == shin)
        upper, lower = (
            float(np.linalg.norm(model.body_pos[shin])),
            2 * float(model.geom_size[foot, 1]),
        )
        x = model.body_pos[thigh][0]
        reach = np.array(
            [
                x * math.cos(pitch) - x + aim[2],  # foot behind the hip by this much
                centre - x * math.sin(pitch) - model.geom_size[foot, 0],
            ]
        )
        span = min(float(np.linalg.norm(reach)), upper + lower - 1e-6)
        lean = math.acos(np.clip((upper**2 + span**2 - lower**2) / (2 * upper * span), -1, 1))
        bend = math.asin(np.clip(upper * math.sin(lean) / lower, -1, 1))
        low, high = model.jnt_range[model.joint(robot.joints[knee]).id]
        sign = 1.0 if -low > high else -1.0  # the knee bends the way its range is wider
        direction = math.atan2(reach[0], reach[1])
        angles[hip], angles[knee] = direction + sign * lean - pitch, -sign * (lean + bend)
    return angles


def _legs(robot: Robot) -> list[tuple[int, int]]:
    """(hip, knee) actuator indices of each leg."""
    knees = {s.limb: k for k, s in enumerate(robot.slots) if s.joint == 1}
    return [(k, knees[s.limb]) for k, s in enumerate(robot.slots) if s.joint == 0]


def posture_skill(robot: Robot, samples: int = 32, corrections: int = 4) -> Policy:
    """Fit the linear map from goal heights to joint angles of a legged body (see the module doc).

    Each sampled goal is solved by `_leg_pose`, then corrected on the body's own model by Broyden's
    method: the pose is held with the body's actuators until it settles, and what it missed (height
    of each end, the torso's drift forward) moves the aim it is solved for; the best aim found is
    kept. So the skill offsets its own sag under gravity and the slip of its feet.
    """
    task = robot.task("posture")
    model = task.template.model
    data = mujoco.MjData(model)
    gear = np.array(robot.gear)
    ends = [model.site(end).id for end in ("front", "back")]
    homes = np.array([model.site(f"home_{end}").pos for end in ("front", "back")])
    steps = task.definition["horizon"] * task.definition["control_substeps"]

    def settle(aim: np.ndarray) -> np.ndarray:
        """Where the pose solved for `aim` takes the torso: (front height, back height, forward
        drift)."""
        mujoco.mj_resetData(model, data)
        data.ctrl[:] = gear * _leg_pose(model, robot, aim)
        mujoco.mj_step(model, data, nstep=steps)
        moved = data.site_xpos[ends] - homes
        return np.array([moved[0, 2], moved[1, 2], moved[:, 0].mean()])

    low, high = np.array(POSTURE_RANGE) * robot.size
    goals = np.random.default_rng(0).uniform(low, high, (samples, 2))
    poses = []
    for goal in goals:
        want = np.array([*goal, 0.0])
        aim, jacobian = want.copy(), np.eye(3)
        reached = settle(aim)
        best = (np.linalg.norm(want - reached), aim)
        for _ in range(corrections):
            step = np.linalg.lstsq(jacobian, want - reached, rcond=None)[0]
            aim = aim + step
            moved, reached = -reached, settle(aim)
            moved += reached
            jacobian += np.outer(moved - jacobian @ step, step) / max(step @ step, 1e-12)
            best = min(best, (np.linalg.norm(want - reached), aim), key=lambda pair: pair[0])
        poses.append(_leg_pose(model, robot, best[1]))
    fit = np.linalg.lstsq(np.column_stack([goals, np.ones(samples)]), np.array(poses), rcond=None)[
        0
    ]  # (3, joints)
    n = len(robot.joints)
    weight = np.zeros((n, task.obs_dim))
    weight[:, 2 * n + 2], weight[:, 2 * n + 5] = (
        gear * fit[0],
        gear * fit[1],
    )  # the z of each goal offset
    return _linear_skill(
        weight, gear * fit[2], f"posture map of {robot.name}, corrected on its own model"
    )


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
        with process_pool(workers, torch.set_num_threads, (1,)) as pool:
            for result in pool.map(function, *zip(*jobs, strict=True)):
                yield result
                bar.update(1)


def transfer_dataset(
    robots: Sequence[Robot],
    *,
    branches: int = 16,
    workers: int = 1,
    seed: int = 0,
    progress: bool | None = None,
) -> TransferDataset:
    """Make every body's native skills, then evaluate each on every body with that task (itself
    included).

    Worker processes need the caller under `if __name__ == "__main__":` (as `evaluate` does).
    """
    if branches < 1 or workers < 1:
        raise ValueError(f"branches and workers must be >= 1, got {branches} and {workers}")
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
            [(i, s) for i, s in enumerate(natives) if s.family == family],
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
        "robots": [{"name": r.name, "kind": r.kind, "source": r.source} for r in robots],
        "samplers": SAMPLERS,
        "environment": environment(),
    }
    return TransferDataset.from_outcomes(outcomes, meta)

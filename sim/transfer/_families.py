"""The transfer experiments' task families, as task definitions for any `Robot`: "reach" (bring an
arm's tool to a goal near where it starts) and "posture" (bring a standing body's torso ends to goal
heights below where they start, and hold them), with the markers their scenes carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import mujoco

from .._tasks import Task


class Robot(Protocol):
    """What a task definition reads of a `_robot.Robot` (which builds its tasks from here)."""

    @property
    def name(self) -> str: ...
    @property
    def scene(self) -> str: ...
    @property
    def joints(self) -> tuple[str, ...]: ...
    @property
    def slots(self) -> Sequence[_Slot]: ...
    @property
    def size(self) -> float: ...
    @property
    def keyframe(self) -> str | None: ...


class _Slot(Protocol):
    @property
    def joint(self) -> int: ...


_BOX = (0.12, 0.12, 0.1)
"""Half-extents of the reach goals around the home tool position, in units of the arm's reach."""
REACH_TOLERANCE = 0.05
"""A reach succeeds when the tool ends within this fraction of the arm's reach from the goal."""
POSTURE_RANGE = (-0.15, -0.03)
"""Goal heights of the torso's ends, each drawn in this range from where it starts, in leg
lengths."""
POSTURE_TOLERANCE = 0.05
"""A posture succeeds when both ends of the torso end within this fraction of the leg length of
their goals."""


def reach_task(robot: Robot) -> Task:
    joints = list(robot.joints)
    box = [b * robot.size for b in _BOX]
    return Task(
        {
            "format": "simnet.task/1",
            "name": f"reach-{robot.name}",
            "embodiment": robot.name,
            "scene": robot.scene,
            "keyframe": robot.keyframe,
            "init": [
                {
                    "target": "body/target/pos",
                    "op": "add",
                    "dist": "uniform",
                    "low": [-b for b in box],
                    "high": box,
                },
                {
                    "target": "joint/j*/qpos",
                    "op": "add",
                    "dist": "normal",
                    "mean": 0.0,
                    "std": 0.02,
                },
            ],
            "observation": [
                {"term": "qpos", "joints": joints},
                {"term": "qvel", "joints": joints},
                {"term": "site_delta", "from": "home", "to": "target"},
            ],
            "action": {"mode": "absolute"},
            "reward": [{"term": "site_distance", "from": "ee", "to": "target", "weight": -1.0}],
            "success": {
                "when": "end",
                "all": [
                    {
                        "term": "site_distance",
                        "from": "ee",
                        "to": "target",
                        "below": REACH_TOLERANCE * robot.size,
                    }
                ],
            },
            "failure": [],
            "horizon": 30,
            "control_substeps": 10,
        }
    )


def posture_task(robot: Robot) -> Task:
    joints = list(robot.joints)
    model = mujoco.MjModel.from_xml_string(robot.scene)
    height = float(model.body("torso").pos[2])
    low, high = (round(z * robot.size, 6) for z in POSTURE_RANGE)
    ends = ("front", "back")
    tied = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "goal") >= 0
    goals = ["goal"] if tied else [f"goal_{end}" for end in ends]
    # a 3D body's skills close their PD loops at 200 Hz; a planar body's servos need 50 Hz
    floating = model.njnt > 0 and model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE
    horizon, substeps = (300, 1) if floating else (75, 4)
    return Task(
        {
            "format": "simnet.task/1",
            "name": f"posture-{robot.name}",
            "embodiment": robot.name,
            "scene": robot.scene,
            "keyframe": robot.keyframe,
            "init": [
                *(
                    {
                        "target": f"body/{goal}/pos",
                        "op": "add",
                        "dist": "uniform",
                        "low": [0, 0, low],
                        "high": [0, 0, high],
                    }
                    for goal in goals
                ),
                *(
                    {
                        "target": f"joint/{j}/qpos",
                        "op": "add",
                        "dist": "normal",
                        "mean": 0.0,
                        "std": 0.03,
                    }
                    for j, slot in zip(joints, robot.slots, strict=True)
                    if slot.joint == 0
                ),
            ],
            "observation": [
                {"term": "qpos", "joints": joints},
                {"term": "qvel", "joints": joints},
                *(
                    {"term": "site_delta", "from": f"home_{end}", "to": f"goal_{end}"}
                    for end in ends
                ),
            ],
            "action": {"mode": "absolute"},
            "reward": [
                {"term": "site_distance", "from": end, "to": f"goal_{end}", "weight": -1.0}
                for end in ends
            ],
            "success": {
                "when": "end",
                "all": [
                    {
                        "term": "site_distance",
                        "from": end,
                        "to": f"goal_{end}",
                        "below": round(POSTURE_TOLERANCE * robot.size, 6),
                    }
                    for end in ends
                ],
            },
            "failure": [
                {"term": "body_upright", "body": "torso", "below": 0.5},
                {"term": "body_height", "body": "torso", "below": round(0.4 * height, 6)},
            ],
            "horizon": horizon,
            "control_substeps": substeps,
        }
    )


def posture_markers(scene: str, *, tied: bool = False) -> str:
    """The legged scene plus what its posture task reads: sites at the torso's ends, where they are
    at the start ("home_*", fixed) and where they should go ("goal_*", bodies the task moves; with
    `tied`, both sites on one body "goal", so that the ends go down together: a biped's crouch)."""
    spec = mujoco.MjSpec.from_string(scene)
    model = spec.compile()
    half, height = float(model.geom("torso").size[1]), float(model.body("torso").pos[2])
    torso = spec.body("torso")
    common = spec.worldbody.add_body(name="goal", pos=[0, 0, height]) if tied else None
    for end, x in (("front", half), ("back", -half)):
        torso.add_site(name=end, pos=[x, 0, 0], size=[0.015, 0, 0])
        spec.worldbody.add_site(
            name=f"home_{end}", pos=[x, 0, height], size=[0.01, 0, 0], rgba=[1, 1, 1, 0.3]
        )
        if common is not None:
            common.add_site(
                name=f"goal_{end}", pos=[x, 0, 0], size=[0.02, 0, 0], rgba=[0, 1, 0, 0.6]
            )
            continue
        goal = spec.worldbody.add_body(name=f"goal_{end}", pos=[x, 0, height])
        goal.add_site(name=f"goal_{end}", size=[0.02, 0, 0], rgba=[0, 1, 0, 0.6])
    return spec.to_xml()


def reach_markers(scene: str) -> str:
    """An arm's scene plus what its reach task reads: a fixed site "home" where the tool site "ee"
    is at qpos 0, and a body "target" with its site there, which the task moves."""
    spec = mujoco.MjSpec.from_string(scene)
    model = spec.compile()
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    tool = data.site("ee").xpos.copy()
    spec.worldbody.add_site(name="home", pos=tool, size=[0.01, 0, 0], rgba=[1, 1, 1, 0.3])
    target = spec.worldbody.add_body(name="target", pos=tool)
    target.add_site(name="target", size=[0.025, 0, 0], rgba=[0, 1, 0, 0.6])
    return spec.to_xml()

"""Writing procedural robot bodies as MJCF: a tree of parts, joints and geoms, actuators of the
kinds vendors ship, a scene with a floor, and the roles (`Slot`) that let skills move between
bodies.

A `Slot`'s joint is a role: arm joints count from the base (0-6) as in `_bodies`; leg joints are
0 hip pitch, 1 knee, 2 hip roll, 3 ankle pitch, 4 hip yaw, 5 ankle roll, so that a planar body's
posture drives a quadruped's pitch joints; roles from `HELD` on (a second arm, a waist, a head,
wheels, fingers, a lift, a humanoid's arms) are parts only bodies that have them have skills for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import mujoco
import numpy as np

from ._robot import Kind, Robot, Slot, _f

HELD = 100
"""Slot roles from here on are parts that only bodies with the same part have skills for."""
SECOND_ARM, WAIST, HEAD, WHEEL, FINGER, LIFT, BODY_ARM = (HELD + 20 * k for k in range(7))
_G = 9.81


@dataclass
class _Part:
    """A body being written: its frame, joints, geoms and sites, and its children."""

    name: str
    pos: Sequence[float]
    quat: Sequence[float] | np.ndarray | None = None
    inner: str = ""
    children: list[_Part] = field(default_factory=list)
    attrs: str = ""

    def xml(self) -> str:
        quat = f' quat="{_f(self.quat)}"' if self.quat is not None else ""
        kids = "".join(child.xml() for child in self.children)
        return (
            f'<body name="{self.name}" pos="{_f(self.pos)}"{quat}{self.attrs}>'
            f"{self.inner}{kids}</body>"
        )


@dataclass
class _Drive:
    """An actuated joint: its name, slot, effort (N m or N) and range (None: continuous)."""

    joint: str
    slot: Slot
    effort: float
    range: tuple[float, float] | None


def _procedural_robot(
    name: str,
    family: Kind,
    scene: str,
    drives: list[_Drive],
    actuation: tuple[str, float],
    size: float,
    morphology: str,
) -> Robot:
    """A generated body as a `Robot`: its drives' joints and slots, their gear (a motor's; servos
    1), home at zeros, and its seed in the description."""
    kind, gear = actuation
    return Robot(
        name,
        family,
        scene,
        tuple(d.joint for d in drives),
        tuple(d.slot for d in drives),
        tuple(gear if kind == "motor" else 1.0 for _ in drives),
        size,
        (0.0,) * len(drives),
        None,
        f"procedural {morphology}, seed {name.rsplit('-', 1)[1]}",
        morphology,
    )


def _joint(
    name: str,
    axis: str,
    bounds: tuple[float, float] | None,
    damping: float,
    armature: float,
    kind: str = "hinge",
) -> str:
    limits = f' range="{bounds[0]:.6g} {bounds[1]:.6g}"' if bounds else ' limited="false"'
    return (
        f'<joint name="{name}" type="{kind}" axis="{axis}"{limits} damping="{damping:.6g}" '
        f'armature="{armature:.6g}"/>'
    )


def _capsule(start: Sequence[float], end: Sequence[float], radius: float, mass: float) -> str:
    return (
        f'<geom type="capsule" fromto="{_f(start)} {_f(end)}" size="{radius:.6g}" '
        f'mass="{mass:.6g}"/>'
    )


def _actuation(rng: np.random.Generator, motor_share: float = 0.75) -> tuple[str, float]:
    """Motors or position servos, and a motor's gear: mostly 1 (torque as a URDF's effort), else
    10-150 with controls near +-1 (gymnasium's and dm_control's style)."""
    if rng.uniform() >= motor_share:
        return "position", 1.0
    return "motor", 1.0 if rng.uniform() < 0.6 else float(10 ** rng.uniform(1.0, 2.2))


def _actuators(drives: list[_Drive], kind: str, gear: float, stiffness: float) -> str:
    """Motors (torque over `gear`, controls limited to the effort), or position servos (gear 1,
    `stiffness` times the effort per radian, forces limited to it); wheels get velocity servos."""
    out = []
    for d in drives:
        span = f"{-d.effort:.6g} {d.effort:.6g}"
        if d.slot.joint in range(WHEEL, WHEEL + 20):
            out.append(
                f'<velocity name="{d.joint}" joint="{d.joint}" kv="{d.effort:.6g}" '
                f'ctrlrange="-10 10" forcerange="{span}"/>'
            )
        elif kind == "motor":
            out.append(
                f'<motor name="{d.joint}" joint="{d.joint}" gear="{gear:.6g}" '
                f'ctrlrange="{-d.effort / gear:.6g} {d.effort / gear:.6g}"/>'
            )
        else:
            low, high = d.range or (-math.pi, math.pi)
            kp = stiffness * d.effort
            out.append(
                f'<position name="{d.joint}" joint="{d.joint}" kp="{kp:.6g}" kv="{0.05 * kp:.6g}" '
                f'ctrlrange="{low:.6g} {high:.6g}" forcerange="{span}"/>'
            )
    return "".join(out)


def _scene(name: str, timestep: float, world: str, actuators: str) -> str:
    return f"""<mujoco model="{name}">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{timestep}" integrator="implicitfast"/>
  <default><geom contype="0" conaffinity="0" rgba="0.7 0.7 0.75 1"/></default>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <geom name="floor" type="plane" size="4 4 0.1" contype="1" conaffinity="1"
      friction="1 0.05 0.001" rgba="0.3 0.35 0.4 1"/>
    {world}
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>"""


def _lowest(world: str) -> float:
    """The lowest point of the colliding geoms of `world` (bodies at their qpos 0 frames)."""
    model = mujoco.MjModel.from_xml_string(
        f'<mujoco><compiler angle="radian" autolimits="true"/><worldbody>{world}'
        "</worldbody></mujoco>"
    )
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    low = math.inf
    for g in np.flatnonzero(model.geom_contype):
        centre, size = data.geom_xpos[g], model.geom_size[g]
        if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_BOX:
            signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)])
            low = min(
                low, centre[2] + (data.geom_xmat[g].reshape(3, 3) @ (signs * size).T)[2].min()
            )
        else:  # spheres; wheels are cylinders on their side
            low = min(low, centre[2] - size[0])
    return low


def _knot(radius: float, mass: float) -> str:
    """A joint housing: a small sphere that gives a body between two joints its mass."""
    return f'<geom type="sphere" size="{radius:.6g}" mass="{mass:.6g}"/>'


def _contact(
    name: str,
    kind: str,
    size: Sequence[float],
    mass: float,
    pos: Sequence[float] = (0, 0, 0),
    extra: str = ' friction="0.9 0.05 0.001"',
) -> str:
    """A geom that touches the floor (feet, wheels, casters)."""
    return (
        f'<geom name="{name}" type="{kind}" size="{_f(size)}" pos="{_f(pos)}" mass="{mass:.6g}" '
        f'contype="1" conaffinity="1"{extra}/>'
    )

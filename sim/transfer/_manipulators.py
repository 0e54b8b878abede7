"""Procedural manipulators shaped like real ones: 6-7 dof arms of vendors' patterns (UR, Panda,
iiwa, xArm, a wrist-roll 7-dof) with real masses, gear and motors, some with a continuous wrist
roll, some with a gripper; two-armed torsos; wheeled mobile manipulators with a lift, one or two
arms and swivel casters, from a seed, with the "reach" task's markers. The first arm reaches; every
other driven joint holds (its skills are PD laws for motors, `_skills`; wheels brake).

Real files have joints nothing drives (a gripper's mimic finger, an underactuated hand's distal
phalanges, casters), light links of grams with the damping vendors write, and continuous joints;
an encoder trained without them read most vendor arms as out of distribution. So some of these
bodies have them: unactuated joints are in the scene but not among the robot's joints, and move
only as the driven ones and gravity move them.
"""

from __future__ import annotations

import math
from itertools import pairwise

import mujoco
import numpy as np

from ._building import (
    _G,
    FINGER,
    HEAD,
    HELD,
    LIFT,
    SECOND_ARM,
    WAIST,
    WHEEL,
    _actuation,
    _actuators,
    _capsule,
    _contact,
    _Drive,
    _joint,
    _knot,
    _lowest,
    _Part,
    _procedural_robot,
    _scene,
)
from ._families import reach_markers
from ._robot import Robot, Slot, _conditioning, _f, _quat

_FRICTIONLESS = ' condim="1" priority="1" friction="0"'
"""A caster's contact: it carries the base and never steers it."""
# arm patterns: joint axes, per link (sideways, along) offsets to the next joint as fractions of
# the reach (the last one to the tool), the base's height, home bends of the pitch joints
_ARMS = (
    (
        "zyyyzy",
        ((0.14, 0), (-0.12, 0.43), (0, 0.39), (0.09, 0), (0, 0.1), (0.08, 0)),
        0.09,
        (0, 0.5, 1.3, 0.6, 0, 0.5),
    ),  # UR: shoulder and wrist offsets
    (
        "zyzyzyz",
        ((0, 0), (0, 0.32), (0.08, 0), (-0.08, 0.38), (0, 0), (0.09, 0), (0, 0.2)),
        0.33,
        (0, 0.4, 0, 1.6, 0, 1.2, 0),
    ),  # Panda: elbow offset
    (
        "zyzyzyz",
        ((0, 0), (0, 0.42), (0, 0), (0, 0.4), (0, 0), (0, 0.18), (0, 0.05)),
        0.36,
        (0, 0.5, 0, 1.3, 0, 0.9, 0),
    ),  # KUKA iiwa
    (
        "zyyzyz",
        ((0, 0), (0.05, 0.3), (0.08, 0.34), (0, 0), (0.08, 0), (0, 0.15)),
        0.27,
        (0, 0.3, 1.2, 0, 1.0, 0),
    ),  # xArm6 / Jaco
    (
        "zyyzyzz",
        ((0, 0), (0, 0.35), (0, 0.3), (0, 0.1), (0, 0.1), (0, 0.08), (0, 0.07)),
        0.2,
        (0, 0.5, 1.2, 0, 0.8, 0, 0),
    ),  # 7-dof with a wrist roll
)


def _arm(
    prefix: str,
    rng: np.random.Generator,
    reach: float,
    mass: float,
    role: int = 0,
    tool: bool = True,
) -> tuple[_Part, list[_Drive], str]:
    """An industrial arm's chain on its base (a pattern of `_ARMS`), gravity-compensated, with a
    tool site "ee" when `tool`; its drives' roles count from `role`. Returns (chain, drives,
    axes)."""
    axes, links, base_height, bends = _ARMS[int(rng.integers(len(_ARMS)))]
    n = len(axes)
    scale = np.exp(rng.normal(0.0, 0.1, (n, 2)))
    offsets = [
        (side * reach * s, along * reach * a)
        for (side, along), (s, a) in zip(links, scale, strict=True)
    ]
    weights = np.array([1.0, 1.0, 0.8, 0.5, 0.35, 0.25, 0.2][:n]) * rng.uniform(0.8, 1.25, n)
    masses = mass * weights / weights.sum()
    damping, armature = rng.uniform(0.0, 2.0, n), rng.uniform(0.0, 0.3, n) * mass / 20
    home = np.array(bends) * (np.array([a == "y" for a in axes])) + rng.normal(0, 0.1, n) * (
        np.array([a == "y" for a in axes])
    )
    unit = {"x": "1 0 0", "y": "0 1 0", "z": "0 0 1"}
    parts, drives = [], []
    radius = 0.05 * reach
    beyond = np.cumsum(masses[::-1])[::-1]
    rolls = axes[-1] == "z" and rng.uniform() < 0.4  # a wrist roll with no stops
    for k in range(n):
        pos = (0, 0, base_height * reach) if k == 0 else (0, *offsets[k - 1])
        side, along = offsets[k]
        width = rng.uniform(2.0, 3.0)
        bounds = None if rolls and k == n - 1 else (-width, width)
        parts.append(
            _Part(
                f"{prefix}{k + 1}",
                pos,
                _quat(axes[k], float(home[k])),
                _joint(
                    f"{prefix}{k + 1}" if prefix != "link" else f"j{k + 1}",
                    unit[axes[k]],
                    bounds,
                    float(damping[k]),
                    float(armature[k]),
                )
                + _capsule(
                    (0, 0, 0),
                    (0, side, along) if (side or along) else (0, 0, 0.3 * radius),
                    radius * (1 - 0.5 * k / n),
                    float(masses[k]),
                ),
                attrs=' gravcomp="1"',
            )
        )
        margin = math.exp(rng.uniform(math.log(1.3), math.log(10.0)))  # vendors' efforts vary
        effort = _G * float(beyond[k]) * reach * (1 - k / n) * margin + 2.0
        joint = f"{prefix}{k + 1}" if prefix != "link" else f"j{k + 1}"
        drives.append(_Drive(joint, Slot(0.0, role + k), effort, bounds))
    if tool:
        parts[-1].inner += f'<site name="ee" pos="0 {_f(offsets[-1])}" size="0.02"/>'
    for outer, inner in zip(reversed(parts[:-1]), reversed(parts[1:]), strict=True):
        outer.children.insert(0, inner)
    return parts[0], drives, axes


def _gripper(
    tip: _Part, prefix: str, reach: float, drives: list[_Drive], rng: np.random.Generator
) -> None:
    """A gripper on an arm's last link, held still by reach skills, in one of three styles vendors
    ship: two driven slide fingers (a Panda's hand); one driven slide finger and its mirror
    unactuated (a mimic joint, which a robot file leaves without an actuator); or two hinged
    fingers of two or three phalanges, the first driven and the rest unactuated (an underactuated
    hand). Fingers weigh tens of grams, damped as vendors write it (0.01-1)."""
    style = int(rng.integers(3))
    for k, side in enumerate((1, -1)):
        damping = float(np.exp(rng.uniform(math.log(0.01), math.log(1.0))))
        mass = float(np.exp(rng.uniform(math.log(0.01), math.log(0.08))))
        name = f"{prefix}finger{k}"
        if style < 2:
            tip.children.append(
                _Part(
                    name,
                    (0, 0, 0.04 * reach),
                    None,
                    _joint(name, f"0 {side} 0", (0.0, 0.04), damping, 1e-4, "slide")
                    + _capsule((0, 0, 0), (0, 0, 0.05 * reach), 0.01 * reach, mass),
                )
            )
            if style == 0 or k == 0:
                drives.append(_Drive(name, Slot(0.0, FINGER + k), 20.0, (0.0, 0.04)))
            continue
        phalanges = int(rng.integers(2, 4))
        length = 0.06 * reach / phalanges
        chain = [
            _Part(
                f"{name}_{p}",
                (0, 0.02 * reach * side, 0.04 * reach) if p == 0 else (0, 0, length),
                None,
                _joint(f"{name}_{p}", f"{side} 0 0", (0.0, 1.2), damping, 1e-4)
                + _capsule((0, 0, 0), (0, 0, length), 0.008 * reach, mass / phalanges),
            )
            for p in range(phalanges)
        ]
        for outer, inner in pairwise(chain):
            outer.children.append(inner)
        tip.children.append(chain[0])
        effort = float(np.exp(rng.uniform(math.log(0.5), math.log(10.0))))
        drives.append(_Drive(f"{name}_0", Slot(0.0, FINGER + k), effort, (0.0, 1.2)))


def _last(part: _Part) -> _Part:
    while part.children:
        part = part.children[0]
    return part


def _reaching(
    name: str,
    world: str,
    drives: list[_Drive],
    actuation: tuple[str, float],
    rng: np.random.Generator,
    morphology: str,
) -> Robot | None:
    """A body whose first arm reaches: actuated, its home posture checked for conditioning, with
    the reach task's markers; None if the home posture is near singular."""
    kind, gear = actuation
    scene = _scene(name, 0.004, world, _actuators(drives, kind, gear, rng.uniform(2, 6)))
    if _conditioning(scene, [d.joint for d in drives if d.slot.joint < HELD]) < 0.15:
        return None
    model = mujoco.MjModel.from_xml_string(scene)
    arm = [model.joint(d.joint).id for d in drives if d.slot.joint < HELD]
    reach = _reach(model, arm)
    return _procedural_robot(
        name, "arm", reach_markers(scene), drives, actuation, reach, morphology
    )


def _reach(model: mujoco.MjModel, arm: list[int]) -> float:
    """The arm's reach: the distance from its first joint to the tool, summed link by link."""
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    points = [data.xanchor[j] for j in arm] + [data.site("ee").xpos]
    return float(sum(np.linalg.norm(b - a) for a, b in pairwise(points)))


def industrial_arm(seed: int) -> Robot:
    """A 6-7 dof arm of a vendor's pattern (UR, Panda, iiwa, xArm, a wrist-roll 7-dof) on a fixed
    base: 0.45-1.8 m, 1.5-200 kg, mostly torque-driven, most with a two-finger gripper."""
    for attempt in range(20):
        rng = np.random.default_rng([seed, 5, attempt])
        reach = float(np.exp(rng.uniform(math.log(0.45), math.log(1.8))))
        mass = 20 * (reach / 0.9) ** 2 * float(np.exp(rng.uniform(math.log(0.3), math.log(2.5))))
        chain, drives, _ = _arm("link", rng, reach, mass)
        if rng.uniform() < 0.6:
            _gripper(_last(chain), "", reach, drives, rng)
        base = _Part(
            "base",
            (0, 0, 0),
            None,
            f'<geom type="cylinder" size="{0.07 * reach:.6g} 0.03" mass="{0.2 * mass:.6g}"/>',
            [chain],
        )
        robot = _reaching(
            f"industrial-arm-{seed}",
            base.xml(),
            drives,
            _actuation(rng, 0.7),
            rng,
            "industrial arm",
        )
        if robot is not None:
            return robot
    raise RuntimeError(f"no well-conditioned home posture for industrial arm {seed}")


def two_armed(seed: int) -> Robot:
    """A torso on a fixed pedestal with two 6-7 dof arms (Baxter, YuMi), maybe a waist and a head;
    the right arm reaches."""
    for attempt in range(20):
        rng = np.random.default_rng([seed, 6, attempt])
        reach = float(np.exp(rng.uniform(math.log(0.5), math.log(1.1))))
        mass = 15 * (reach / 0.9) ** 2 * rng.uniform(0.5, 1.5)
        shoulders = reach * rng.uniform(0.2, 0.35)
        right, drives, _ = _arm("link", rng, reach, mass)
        left, left_drives, _ = _arm(
            "left",
            np.random.default_rng([seed, 6, attempt, 1]),
            reach,
            mass,
            SECOND_ARM,
            tool=False,
        )
        if rng.uniform() < 0.5:
            _gripper(_last(right), "", reach, drives, rng)
        right.pos, left.pos = (0, -shoulders, 0), (0, shoulders, 0)
        right.quat, left.quat = _quat("x", -0.6), _quat("x", 0.6)
        chest = _Part(
            "chest",
            (0, 0, 0.3 * reach),
            None,
            _capsule((0, -shoulders, 0), (0, shoulders, 0), 0.1 * reach, 0.5 * mass),
            [right, left],
        )
        extra = []
        if rng.uniform() < 0.5:
            chest.inner = _joint("waist", "0 0 1", (-1.0, 1.0), 1.0, 0.1) + chest.inner
            extra.append(_Drive("waist", Slot(0.0, WAIST), 5 * mass, (-1.0, 1.0)))
        if rng.uniform() < 0.6:
            chest.children.append(
                _Part(
                    "head",
                    (0, 0, 0.15 * reach),
                    None,
                    _joint("head_pan", "0 0 1", (-1.5, 1.5), 0.1, 0.01)
                    + '<geom type="sphere" size="0.08" mass="1"/>',
                )
            )
            extra.append(_Drive("head_pan", Slot(0.0, HEAD), 5.0, (-1.5, 1.5)))
        pedestal = _Part(
            "base",
            (0, 0, 0.8),
            None,
            f'<geom type="cylinder" size="0.15 0.4" pos="0 0 -0.4" mass="{mass:.6g}"/>',
            [chest],
        )
        all_drives = extra + drives + left_drives
        robot = _reaching(
            f"two-armed-{seed}",
            pedestal.xml(),
            all_drives,
            _actuation(rng, 0.8),
            rng,
            "two-armed torso",
        )
        if robot is not None:
            return robot
    raise RuntimeError(f"no well-conditioned home posture for two-armed robot {seed}")


def mobile_manipulator(seed: int) -> Robot:
    """A floating wheeled base (two driven wheels and two swivel casters) with a lift, one or two
    arms, maybe a gripper (Fetch, TIAGo, PR2); the first arm reaches while the wheels brake."""
    for attempt in range(20):
        rng = np.random.default_rng([seed, 7, attempt])
        reach = float(np.exp(rng.uniform(math.log(0.6), math.log(1.1))))
        mass = 12 * (reach / 0.9) ** 2 * rng.uniform(0.5, 1.5)
        base_mass = rng.uniform(30, 120)
        radius, half = rng.uniform(0.06, 0.12), rng.uniform(0.2, 0.35)
        height = rng.uniform(0.3, 0.6)
        arm, drives, _ = _arm("link", rng, reach, mass)
        if rng.uniform() < 0.6:
            _gripper(_last(arm), "", reach, drives, rng)
        arms = [arm]
        if rng.uniform() < 0.3:
            left, left_drives, _ = _arm(
                "left",
                np.random.default_rng([seed, 7, attempt, 1]),
                reach,
                mass,
                SECOND_ARM,
                tool=False,
            )
            arm.pos, left.pos = (0.1, -0.2, 0), (0.1, 0.2, 0)
            arms.append(left)
            drives += left_drives
        else:
            arm.pos = (0.1, 0, 0)
        lift = rng.uniform() < 0.6
        torso = _Part(
            "torso",
            (0, 0, height),
            None,
            (_joint("lift", "0 0 1", (0.0, 0.35), 50.0, 1.0, "slide") if lift else "")
            + '<geom type="box" size="0.1 0.15 0.15" pos="0 0 0.15" '
            + f'mass="{rng.uniform(5, 20):.6g}"/>',
            arms,
        )
        extra = [_Drive("lift", Slot(0.0, LIFT), 2000.0, (0.0, 0.35))] if lift else []
        wheels = []
        for k, side in enumerate((1, -1)):
            wheels.append(
                _Part(
                    f"wheel{k}",
                    (0, side * half, radius - height / 2),
                    None,
                    _joint(f"wheel{k}", "0 1 0", None, 0.5, 0.05)
                    + _contact(
                        f"wheel{k}",
                        "cylinder",
                        (radius, 0.025),
                        2.0,
                        extra=' zaxis="0 1 0" friction="1 0.05 0.001"',
                    ),
                )
            )
            extra.append(_Drive(f"wheel{k}", Slot(0.5, WHEEL, side), 100.0, None))
        pivots = [(f"caster{k}", x * half) for k, x in enumerate((0.8, -0.8))]
        casters = [
            _caster(name, (x, 0, 0.8 * radius - height / 2), 0.4 * radius, rng)
            for name, x in pivots
        ]
        base = _Part(
            "base",
            (0, 0, 0),
            None,
            '<freejoint name="root"/>'
            + f'<geom type="box" size="{half:.6g} {0.9 * half:.6g} {height / 2:.6g}" '
            + f'mass="{base_mass:.6g}"/>'
            + "".join(
                _contact(
                    name,
                    "sphere",
                    (0.4 * radius,),
                    0.0,
                    (x, 0, 0.4 * radius - height / 2),
                    _FRICTIONLESS,
                )
                for name, x in pivots
            ),
            [*wheels, *casters, torso],
        )
        base.pos = (0, 0, -_lowest(base.xml()) + 0.001)
        robot = _reaching(
            f"mobile-manipulator-{seed}",
            base.xml(),
            extra + drives,
            _actuation(rng, 0.8),
            rng,
            "mobile manipulator",
        )
        if robot is not None:
            return robot
    raise RuntimeError(f"no well-conditioned home posture for mobile manipulator {seed}")


def _caster(
    name: str, pos: tuple[float, float, float], radius: float, rng: np.random.Generator
) -> _Part:
    """A swivel caster under a base, its pivot at `pos`: a fork turning freely about the vertical
    and its wheel (of `radius`) rolling freely below it, two unactuated continuous joints as
    vendors' bases have them. The base itself rests on a frictionless sphere in the wheel's place
    (`mobile_manipulator`), which carries it and never steers it."""
    damping = float(np.exp(rng.uniform(math.log(0.001), math.log(0.1))))
    wheel = _Part(
        f"{name}_wheel",
        (-radius, 0, -radius),
        None,
        _joint(f"{name}_roll", "0 1 0", None, damping, 1e-4)
        + f'<geom type="cylinder" size="{radius:.6g} {0.3 * radius:.6g}" zaxis="0 1 0" '
        'mass="0.3"/>',
    )
    return _Part(
        f"{name}_fork",
        pos,
        None,
        _joint(f"{name}_swivel", "0 0 1", None, damping, 1e-4) + _knot(radius, 0.2),
        [wheel],
    )

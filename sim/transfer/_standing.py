"""Procedural standing bodies shaped like real ones: floating-base quadrupeds (hip roll, hip pitch,
knee per leg) and humanoids (legs of 5-6 joints on flat feet, waist, arms, head, some hands), from
a seed, with the "posture" task's markers.

`_bodies` makes planar legged bodies with position servos; an encoder trained on them alone
collapsed on vendor files, whose legged robots float in 3D, weigh a kilogram to a hundred and are
mostly torque-driven. Most of these are too (their native posture skills are PD laws closed by the
policy, `_skills`); the rest have position servos. A biped's two torso ends go down together: it
cannot pitch its pelvis and stand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ._building import (
    _G,
    BODY_ARM,
    FINGER,
    HEAD,
    WAIST,
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
from ._families import posture_markers
from ._robot import Robot, Slot, _quat


def _legged(
    name: str,
    torso: _Part,
    drives: list[_Drive],
    actuation: tuple[str, float],
    rng: np.random.Generator,
    leg: float,
    morphology: str,
    tied: bool = False,
) -> Robot:
    """A standing body: placed on the floor, actuated, with the posture task's markers."""
    torso.pos = (0, 0, -_lowest(torso.xml()) + 0.001)
    kind, gear = actuation
    scene = _scene(name, 0.005, torso.xml(), _actuators(drives, kind, gear, rng.uniform(3, 10)))
    return _procedural_robot(
        name, "legged", posture_markers(scene, tied=tied), drives, actuation, leg, morphology
    )


def procedural_quadruped(seed: int) -> Robot:
    """A floating-base quadruped: hip roll, hip pitch and knee per leg under a box torso, standing
    on bent knees at qpos 0 (all one way, or front and hind facing each other); legs 0.2-0.6 m,
    0.6-84 kg (mass grows with the leg's cube: a toy at the short end, HyQ's size at the long);
    some with continuous joints (no stops), as many vendors' files write them."""
    rng = np.random.default_rng([seed, 3])
    leg = float(np.exp(rng.uniform(math.log(0.2), math.log(0.6))))
    thigh = leg * rng.uniform(0.45, 0.55)
    shin = leg - thigh
    length, width = leg * rng.uniform(0.8, 1.6), leg * rng.uniform(0.35, 0.6)
    mass = 130 * leg**3 * float(np.exp(rng.uniform(math.log(0.6), math.log(3.0))))
    torso_mass = mass * rng.uniform(0.55, 0.75)
    leg_mass = (mass - torso_mass) / 4
    bend = rng.uniform(0.5, 0.85)
    facing = rng.uniform() < 0.35
    actuation = _actuation(rng)
    effort = mass * _G * leg * float(np.exp(rng.uniform(math.log(0.45), math.log(1.5))))
    stops = rng.uniform() < 0.7  # else its joints are continuous, as many vendors' files say
    hips, abducts = ((-1.2, 1.2), (-0.6, 0.6)) if stops else (None, None)
    damping, armature = rng.uniform(0.0, 0.5) * mass / 12, rng.uniform(0.3, 1.5) * 0.01 * mass / 12
    radius, offset = 0.07 * leg, width * rng.uniform(0.15, 0.3)
    back = math.asin(min(thigh * math.sin(bend) / shin, 0.95))
    legs, drives = [], []
    for i, (front, side) in enumerate(((1, 1), (1, -1), (-1, 1), (-1, -1))):
        sign = -1.0 if facing and front < 0 else 1.0
        knees = tuple(sorted((-sign * 0.7 * (bend + back), sign * 1.2))) if stops else None
        foot = _Part(
            f"foot{i}",
            (0, 0, -shin),
            None,
            _contact(f"foot{i}", "sphere", (0.8 * radius,), 0.05 * leg_mass)
            + f'<site name="foot{i}" size="{0.8 * radius:.6g}"/>',
        )
        shin_part = _Part(
            f"shin{i}",
            (0, 0, -thigh),
            _quat("y", sign * (bend + back)),
            _joint(f"knee{i}", "0 1 0", knees, damping, armature)  # type: ignore[arg-type]
            + _capsule((0, 0, 0), (0, 0, -shin), 0.6 * radius, 0.25 * leg_mass),
            [foot],
        )
        thigh_part = _Part(
            f"thigh{i}",
            (0, side * offset, 0),
            _quat("y", -sign * bend),
            _joint(f"hip{i}", "0 1 0", hips, damping, armature)
            + _capsule((0, 0, 0), (0, 0, -thigh), radius, 0.5 * leg_mass),
            [shin_part],
        )
        legs.append(
            _Part(
                f"hip{i}",
                (front * 0.42 * length, side * width / 2, 0),
                None,
                _joint(f"abduct{i}", "1 0 0", abducts, damping, armature)
                + _capsule((0, 0, 0), (0, side * offset, 0), radius, 0.2 * leg_mass),
                [thigh_part],
            )
        )
        limb = 0.0 if front > 0 else 1.0
        drives += [
            _Drive(f"abduct{i}", Slot(limb, 2, side), effort, abducts),
            _Drive(f"hip{i}", Slot(limb, 0, side), effort, hips),
            _Drive(f"knee{i}", Slot(limb, 1, side), effort, knees),  # type: ignore[arg-type]
        ]
    torso = _Part(
        "torso",
        (0, 0, 0),
        None,
        '<freejoint name="root"/>'
        + f'<geom name="torso" type="capsule" fromto="{-length / 2:.6g} 0 0 {length / 2:.6g} 0 0" '
        f'size="{0.25 * width:.6g}" mass="0"/>'
        f'<geom type="box" size="{length / 2:.6g} {width / 2:.6g} {0.2 * width:.6g}" '
        f'mass="{torso_mass:.6g}"/>',
        legs,
    )
    return _legged(f"quadruped-{seed}", torso, drives, actuation, rng, leg, "quadruped")


def procedural_humanoid(seed: int) -> Robot:
    """A floating-base humanoid, 1.0-1.9 m and 15-120 kg: legs of 5-6 joints on flat feet, a waist
    of 0-3, arms of 0 or 3-7 (half with hands of 2-5 fingers, some underactuated), a head of 0-2;
    standing on slightly bent knees at qpos 0."""
    rng = np.random.default_rng([seed, 4])
    tall = rng.uniform(1.0, 1.9)
    mass = max(15.0, 65 * (tall / 1.75) ** 3 * rng.uniform(0.65, 1.5))  # a small child's, at least
    leg = 0.47 * tall * rng.uniform(0.93, 1.07)
    thigh = leg * rng.uniform(0.47, 0.53)
    shin = leg - thigh
    ankle, sole, wide = 0.045 * tall, 0.14 * tall * rng.uniform(0.9, 1.1), 0.055 * tall
    hips = 0.09 * tall * rng.uniform(0.85, 1.15)
    actuation = _actuation(rng, 0.85)
    damping, armature = rng.uniform(0.0, 1.0), rng.uniform(0.03, 0.3) * mass / 50
    bend = rng.uniform(0.1, 0.35)
    leg_effort = mass * _G * leg * rng.uniform(0.5, 1.0)
    yaw, roll = rng.uniform() < 0.85, rng.uniform() < 0.8
    roll = roll or not yaw  # legs of 5-6 joints: a hip yaw, an ankle roll or both
    drives: list[_Drive] = []
    legs = []
    for i, side in enumerate((1, -1)):
        foot = _Part(
            f"foot{i}",
            (0, 0, 0),
            None,
            (_joint(f"ankle_roll{i}", "1 0 0", (-0.4, 0.4), damping, armature) if roll else "")
            + _contact(
                f"foot{i}",
                "box",
                (sole / 2, wide / 2, ankle / 4),
                0.015 * mass,
                (0.1 * sole, 0, -0.75 * ankle),
                ' friction="1.2 0.05 0.001"',
            )
            + f'<site name="foot{i}" pos="{0.1 * sole:.6g} 0 {-ankle:.6g}" size="0.01"/>',
        )
        chain = _Part(
            f"thigh{i}",
            (0, 0, 0),
            _quat("y", -bend),
            _joint(f"hip_pitch{i}", "0 1 0", (-1.6, 0.5), damping, armature)
            + _capsule((0, 0, 0), (0, 0, -thigh), 0.06 * tall * 0.5, 0.1 * mass),
            [
                _Part(
                    f"shin{i}",
                    (0, 0, -thigh),
                    _quat("y", 2 * bend),
                    _joint(f"knee{i}", "0 1 0", (-2 * bend + 0.02, 2.2), damping, armature)
                    + _capsule((0, 0, 0), (0, 0, -shin), 0.05 * tall * 0.5, 0.045 * mass),
                    [
                        _Part(
                            f"ankle{i}",
                            (0, 0, -shin),
                            _quat("y", -bend),
                            _joint(f"ankle_pitch{i}", "0 1 0", (-0.8, 0.8), damping, armature)
                            + _knot(0.03 * tall, 0.005 * mass),
                            [foot],
                        )
                    ],
                )
            ],
        )
        hip = _Part(
            f"hipx{i}",
            (0, 0, 0),
            None,
            _joint(f"hip_roll{i}", "1 0 0", (-0.5, 0.5), damping, armature)
            + _knot(0.04 * tall, 0.01 * mass),
            [chain],
        )
        top = _Part(
            f"hipz{i}",
            (0, side * hips, -0.05 * tall),
            None,
            (_joint(f"hip_yaw{i}", "0 0 1", (-0.6, 0.6), damping, armature) if yaw else "")
            + _knot(0.04 * tall, 0.01 * mass),
            [hip],
        )
        legs.append(top)

        def slot(role: int, side: float = side) -> Slot:
            return Slot(0.5, role, side)

        drives += [_Drive(f"hip_yaw{i}", slot(4), leg_effort * 0.5, (-0.6, 0.6))] if yaw else []
        drives += [
            _Drive(f"hip_roll{i}", slot(2), leg_effort, (-0.5, 0.5)),
            _Drive(f"hip_pitch{i}", slot(0), leg_effort, (-1.6, 0.5)),
            _Drive(f"knee{i}", slot(1), leg_effort, (-2 * bend + 0.02, 2.2)),
            _Drive(f"ankle_pitch{i}", slot(3), leg_effort * 0.8, (-0.8, 0.8)),
        ]
        drives += [_Drive(f"ankle_roll{i}", slot(5), leg_effort * 0.6, (-0.4, 0.4))] if roll else []
    # the upper body: a waist chain up to the chest, arms and a head on it
    chest_height = 0.28 * tall
    upper = _Part(
        "chest",
        (0, 0, 0.06 * tall),
        None,
        _capsule(
            (0, -hips, 0.6 * chest_height), (0, hips, 0.6 * chest_height), 0.07 * tall, 0.3 * mass
        ),
    )
    waist_axes = "zyx"[: int(rng.integers(0, 4))]
    outer = upper
    for k, axis in reversed(list(enumerate(waist_axes))):
        outer = _Part(
            f"waist{k}",
            (0, 0, 0.06 * tall if k == 0 else 0),
            None,
            _joint(
                f"waist{k}",
                {"z": "0 0 1", "y": "0 1 0", "x": "1 0 0"}[axis],
                (-0.5, 0.5),
                damping,
                armature,
            )
            + _knot(0.05 * tall, 0.01 * mass),
            [outer],
        )
        upper.pos = (0, 0, 0)
        drives.append(_Drive(f"waist{k}", Slot(0.5, WAIST + k), leg_effort, (-0.5, 0.5)))
    necks = int(rng.integers(0, 3))
    head = _Part(
        "head",
        (0, 0, chest_height),
        None,
        "".join(
            _joint(f"neck{k}", "0 0 1" if k == 0 else "0 1 0", (-0.8, 0.8), 0.1, armature)
            for k in range(necks)
        )
        + _capsule((0, 0, 0.02 * tall), (0, 0, 0.1 * tall), 0.06 * tall, 0.07 * mass),
    )
    drives += [
        _Drive(f"neck{k}", Slot(0.5, HEAD + k), 0.05 * mass, (-0.8, 0.8)) for k in range(necks)
    ]
    upper.children.append(head)
    arm_joints = 0 if rng.uniform() < 0.1 else int(rng.integers(3, 8))
    hand = _Hand.drawn(rng) if arm_joints and rng.uniform() < 0.5 else None
    for i, side in enumerate((1, -1)):
        if not arm_joints:
            break
        part, arm_drives = _limb(
            f"arm{i}",
            "yxzyzyx"[:arm_joints],
            (0.17 * tall, 0.15 * tall, 0.06 * tall),
            0.05 * mass,
            0.04 * tall,
            damping,
            armature,
            rng,
            hand,
        )
        part.pos = (0, side * (hips + 0.08 * tall), chest_height)
        upper.children.append(part)
        drives += [
            _Drive(d.joint, Slot(0.5, BODY_ARM + d.slot.joint, side), d.effort, d.range)
            for d in arm_drives
        ]
    pelvis = _Part(
        "torso",
        (0, 0, 0),
        None,
        '<freejoint name="root"/>'
        + '<geom name="torso" type="capsule" '
        + f'fromto="{-0.05 * tall:.6g} 0 0 {0.05 * tall:.6g} 0 0" '
        f'size="{0.06 * tall:.6g}" mass="{0.15 * mass:.6g}"/>',
        [*legs, outer],
    )
    return _legged(
        f"humanoid-{seed}", pelvis, drives, actuation, rng, leg + ankle, "humanoid", tied=True
    )


@dataclass(frozen=True)
class _Hand:
    """A humanoid's hand: `fingers` of `phalanges` each, their first joints driven; with
    `underactuated` the rest unactuated (as a tendon-driven hand's file has them), else driven
    too. Phalanges of `mass` kilograms (tens of grams), `damping` as vendors write it."""

    fingers: int
    phalanges: int
    underactuated: bool
    mass: float
    damping: float

    @classmethod
    def drawn(cls, rng: np.random.Generator) -> _Hand:
        fingers = int(rng.integers(2, 6))
        return cls(
            fingers,
            int(rng.integers(1, 1 + min(3, 8 // fingers))),  # at most 8 joints a hand
            bool(rng.uniform() < 0.6),
            float(np.exp(rng.uniform(math.log(0.01), math.log(0.06)))),
            float(np.exp(rng.uniform(math.log(0.01), math.log(1.0)))),
        )


def _limb(
    prefix: str,
    axes: str,
    lengths: tuple[float, float, float],
    mass: float,
    radius: float,
    damping: float,
    armature: float,
    rng: np.random.Generator,
    hand: _Hand | None = None,
) -> tuple[_Part, list[_Drive]]:
    """A hanging arm (shoulder, upper arm, forearm, hand along -z) of len(axes) joints, and a
    `hand`'s finger joints; drive roles count joints from the shoulder, fingers FINGER+k (of the
    driven finger joints, in order)."""
    upper, fore, palm = lengths
    where = {1: upper, 3: fore}  # the link that follows joint k is this long
    unit = {"x": "1 0 0", "y": "0 1 0", "z": "0 0 1"}
    parts = []
    drives = []
    for k, axis in enumerate(axes):
        length = where.get(k, 0.0) if k < len(axes) - 1 else palm
        share = mass * (length / sum(lengths) if length else 0.03)
        bounds = (-1.5, 1.5) if k != 3 else (0.0, 2.4)
        parts.append(
            _Part(
                f"{prefix}_{k}",
                (0, 0, -where.get(k - 1, 0.0)) if k else (0, 0, 0),
                None,
                _joint(f"{prefix}_j{k}", unit[axis], bounds, damping, armature)
                + (
                    _capsule((0, 0, 0), (0, 0, -length), radius * (1 - 0.1 * k), share)
                    if length
                    else f'<geom type="sphere" size="{radius:.6g}" mass="{share:.6g}"/>'
                ),
            )
        )
        effort = _G * mass * sum(lengths) * rng.uniform(1.5, 4) * (1 - 0.12 * k)
        drives.append(_Drive(f"{prefix}_j{k}", Slot(0.0, k), effort, bounds))
    if hand is not None:
        _fingers(parts[-1], prefix, hand, palm, 0.2 * radius, drives)
    for outer, inner in zip(reversed(parts[:-1]), reversed(parts[1:]), strict=True):
        outer.children.insert(0, inner)
    return parts[0], drives


def _fingers(
    tip: _Part, prefix: str, hand: _Hand, palm: float, radius: float, drives: list[_Drive]
) -> None:
    """A hand's fingers at the end of the palm `tip`, chains of phalanges curling about x."""
    length = 0.4 * palm / hand.phalanges
    for f in range(hand.fingers):
        chain = []
        for p in range(hand.phalanges):
            name = f"{prefix}_f{f}" if p == 0 else f"{prefix}_f{f}_{p}"
            pos = (0.01 * (f - hand.fingers / 2), 0, -palm) if p == 0 else (0, 0, -length)
            chain.append(
                _Part(
                    name,
                    pos,
                    None,
                    _joint(name, "1 0 0", (0.0, 1.4), hand.damping, 1e-4)
                    + _capsule((0, 0, 0), (0, 0, -length), radius, hand.mass),
                )
            )
            if p == 0 or not hand.underactuated:
                role = FINGER + len([d for d in drives if d.slot.joint >= FINGER])
                drives.append(_Drive(name, Slot(0.0, role), 0.5, (0.0, 1.4)))
        for outer, inner in pairwise(chain):
            outer.children.append(inner)
        tip.children.append(chain[0])

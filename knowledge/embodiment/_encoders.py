"""Embodiment encoders: ψ(embodiment) -> a vector, where nearby vectors mean skills likely transfer.

Vectors from different encoders, or from two versions of one encoder, live in different spaces and
must never be compared; `EmbeddingSpace` names the space so that an index can refuse (or rebuild
for) the wrong one. A learned encoder (torch, trained on transfer outcomes) is another `Encoder`
subclass with its own name and version; it overrides `encode_many` to batch.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._descriptors import Embodiment
from ._parts import Actuator, Joint

Metric = Literal["l2", "cosine"]


@dataclass(frozen=True, slots=True)
class EmbeddingSpace:
    """Which encoder made a vector: vectors compare only within one space."""

    name: str
    version: str
    dim: int
    metric: Metric = "l2"
    """l2: Euclidean distance; cosine: 1 - cosine similarity (inner product of normalized
    vectors)."""

    def __post_init__(self) -> None:
        if not self.name or not self.version:
            raise ValueError("an embedding space needs a name and a version")
        if self.dim < 1:
            raise ValueError(f"an embedding space needs dim >= 1, got {self.dim}")
        if self.metric not in ("l2", "cosine"):
            raise ValueError(f"metric must be 'l2' or 'cosine', got {self.metric!r}")


class Encoder(ABC):
    """Maps embodiment descriptors to float32 vectors of length `dim` in the space `space`."""

    name: str
    version: str
    dim: int
    metric: Metric = "l2"

    @property
    def space(self) -> EmbeddingSpace:
        return EmbeddingSpace(self.name, self.version, self.dim, self.metric)

    fallback: Encoder | None = None
    """The encoder a query is ranked by instead when `assess` finds its body out of this
    encoder's depth (an out-of-distribution score above 1)."""

    guard: Encoder | None = None
    """An encoder whose distances `guarded` adds to this one's for a query in its depth: where
    the guard is sure two bodies differ in kind (None: this encoder's distance alone ranks)."""

    def guarded(self, distances: np.ndarray, guard_distances: np.ndarray) -> np.ndarray:
        """The distances a query ranks by, given this encoder's and the guard's (same shape)."""
        return distances

    @abstractmethod
    def encode(self, embodiment: Embodiment) -> np.ndarray:
        """One vector, shape (dim,), dtype float32."""

    def assess(self, embodiment: Embodiment) -> tuple[np.ndarray, float | None]:
        """The body's vector and how far it lies from what the encoder knows (above 1: out of
        distribution; None: the encoder has no such notion, as the feature encoder)."""
        return self.encode(embodiment), None

    def encode_many(self, embodiments: Iterable[Embodiment]) -> np.ndarray:
        """Vectors stacked in order, shape (n, dim), dtype float32."""
        rows = [self.encode(embodiment) for embodiment in embodiments]
        return np.stack(rows) if rows else np.empty((0, self.dim), np.float32)


def _log_scale(value: float, top: float) -> float:
    """log(1 + value) / log(1 + top): 0 at 0, 1 at `top`, still growing (slowly) beyond."""
    return math.log1p(max(value, 0.0)) / math.log1p(top)


def _span(low: float, high: float, value: float) -> float:
    return min(max((value - low) / (high - low), 0.0), 1.0)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


_SENSOR_GROUPS = {
    "touch": {"touch", "tactile", "contact"},
    "force_torque": {"force", "torque", "jointactfrc", "actuatorfrc"},
    "inertial": {
        "accelerometer",
        "gyro",
        "velocimeter",
        "magnetometer",
        "framequat",
        "frameangvel",
        "framelinacc",
    },
    "proprioceptive": {
        "jointpos",
        "jointvel",
        "ballquat",
        "ballangvel",
        "actuatorpos",
        "actuatorvel",
        "tendonpos",
    },
    "range": {"rangefinder", "camprojection", "geomdist"},
}

FEATURES: tuple[tuple[str, float], ...] = (
    # Structure weighs most: a policy rarely survives a change of structure, while control often
    # absorbs differences of scale, and dynamics and sensors matter least for whether a skill can
    # transfer at all.
    ("floating_base", 3.0),
    ("dof", 3.0),
    ("end_effectors", 2.0),
    ("wheels", 2.0),
    ("limb_balance", 2.0),
    ("chain_depth", 2.0),
    ("branching", 1.5),
    ("hinge_fraction", 1.5),
    ("slide_fraction", 1.5),
    ("ball_fraction", 1.5),
    ("actuated_fraction", 1.5),
    ("actuators", 1.0),
    ("mass", 1.0),
    ("reach", 1.0),
    ("heaviest_body_fraction", 1.0),
    ("trunk_mass_fraction", 1.0),
    ("longest_link", 1.0),
    ("mean_link", 1.0),
    ("hinge_range", 1.0),
    ("limited_fraction", 1.0),
    ("strength", 1.0),
    ("damping", 0.5),
    ("armature", 0.5),
    ("frictionloss", 0.5),
    ("motor_fraction", 0.5),
    ("position_fraction", 0.5),
    ("velocity_fraction", 0.5),
    ("other_actuator_fraction", 0.5),
    ("ctrl_limited_fraction", 0.5),
    *((f"{group}_sensors", 0.5) for group in _SENSOR_GROUPS),
)
"""Feature names and weights, in vector order. Any change to a feature or a weight moves every
vector: bump `FeatureEncoder.version` with it, so that saved indexes are rebuilt rather than
mixed."""


def _fraction(count: int, total: int) -> float:
    return count / total if total else 0.0


def morphology_features(e: Embodiment) -> dict[str, float]:
    """Named, unweighted features of a body, each roughly in [0, 1]: what the default encoder sees.

    Every feature aggregates over a set (joints, actuators, bodies, sensors), so no order can show.
    """
    moving = [j for j in e.joints if j.type != "free"]
    hinges = [j for j in moving if j.type == "hinge"]
    jointed = {j.body for j in moving}
    depth = [0] * len(e.bodies)  # jointed bodies from the base down to each body
    for i, body in enumerate(e.bodies):
        depth[i] = (depth[body.parent] if body.parent >= 0 else 0) + (i in jointed)
    # Structure is read on rigid parts (bodies welded together are one), as MuJoCo's URDF import
    # fuses them: since version 6, a welded head or camera on a link is no branch, so a robot's
    # MJCF and URDF agree (robosuite's Sawyer: 14 other robots nearer than its URDF before, 1).
    top = e.rigid_parts
    below: dict[int, int] = {}  # parts hanging on each part
    for i, body in enumerate(e.bodies):
        if top[i] == i and body.parent >= 0:
            below[top[body.parent]] = below.get(top[body.parent], 0) + 1
    # The trunk: the root parts, however a file splits them into bodies. A two-armed robot's
    # welded torso is trunk; a humanoid's torso on a waist joint is not. (The root body's own share
    # of the mass was a feature until version 5: robosuite's MJCF arms put their mass on a welded
    # link below a massless mount, the URDFs on the root, so it parted one robot's two files.) A
    # root counts even on a hinge to the world (a pendulum's first link), as every root of a scene
    # does: counting only unjointed roots put Baxter's MJCF beside Tiago and its arm URDF beside a
    # humanoid's upper body again (arms 0.89).
    trunk_mass = math.fsum(b.mass for i, b in enumerate(e.bodies) if e.bodies[top[i]].parent < 0)
    kinds = [a.kind for a in e.actuators]
    driven = {t for a in e.actuators if a.moves_joints for t in a.target}
    joint_strength = {
        a.target[0]: s for a in e.actuators if a.transmission == "joint" and (s := _strength(a))
    }
    strengths = [
        joint_strength.get(i) or _limit(j.force_range)
        for i, j in enumerate(e.joints)
        if j.type != "free"
    ]
    strengths = [s for s in strengths if s]
    actuated = sum(
        i in driven or j.force_range is not None for i, j in enumerate(e.joints) if j.type != "free"
    )
    links = [b.link_length for b in e.bodies if b.parent >= 0]
    reach, mass = max(e.reach, 1e-6), max(e.mass, 1e-9)
    features = {
        "floating_base": float(e.floating_base),
        "dof": _log_scale(e.dof, 64),
        "end_effectors": _log_scale(len(e.end_effectors), 16),
        "wheels": _log_scale(_wheels(e), 16),
        "chain_depth": _log_scale(_mean([float(depth[i]) for i in e.end_effectors]), 16),
        "branching": _log_scale(max(below.values(), default=0), 8),
        "hinge_fraction": _fraction(len(hinges), len(moving)),
        "slide_fraction": _fraction(sum(j.type == "slide" for j in moving), len(moving)),
        "ball_fraction": _fraction(sum(j.type == "ball" for j in moving), len(moving)),
        "actuated_fraction": _fraction(actuated, len(moving)),
        "actuators": _log_scale(len(e.actuators), 64),
        "mass": _span(-2.0, 3.0, math.log10(mass)),
        "reach": _span(-2.0, 1.0, math.log10(reach)),
        "heaviest_body_fraction": max((b.mass for b in e.bodies), default=0.0) / mass,
        "trunk_mass_fraction": trunk_mass / mass,
        "limb_balance": _limb_balance(e, below),
        "longest_link": max(links, default=0.0) / reach,
        "mean_link": _mean(links) / reach,
        "hinge_range": _mean(
            [
                min((j.range[1] - j.range[0]) / (2 * math.pi), 1.0) if j.range else 1.0
                for j in hinges
            ]
        ),
        "limited_fraction": _fraction(sum(j.range is not None for j in moving), len(moving)),
        "damping": _log_scale(_mean([j.damping for j in moving]), 100),
        "armature": _log_scale(_mean([j.armature for j in moving]), 1),
        "frictionloss": _log_scale(_mean([j.frictionloss for j in moving]), 10),
        "motor_fraction": _fraction(kinds.count("motor"), len(kinds)),
        "position_fraction": _fraction(kinds.count("position"), len(kinds)),
        "velocity_fraction": _fraction(kinds.count("velocity"), len(kinds)),
        "other_actuator_fraction": _fraction(
            kinds.count("muscle") + kinds.count("other"), len(kinds)
        ),
        "ctrl_limited_fraction": _fraction(
            sum(a.ctrl_range is not None for a in e.actuators), len(kinds)
        ),
        "strength": _log_scale(_mean(strengths), 1000),
    }
    for group, types in _SENSOR_GROUPS.items():
        features[f"{group}_sensors"] = _log_scale(sum(s.type in types for s in e.sensors), 8)
    return features


LIMB_PARTS = 2
"""Rigid parts on joints a limb has at least: a leg's thigh and shank; not a wheel, a finger's last
link or a sensor on a joint. One part hanging on a floating body's trunk is a limb too if it swings
(its mass off its hinge's axis): a one-link leg, as on a minitaur with locked knees or a RHex."""


def _limb_balance(e: Embodiment, below: dict[int, int]) -> float:
    """How evenly the four heaviest limbs share their mass: (third + fourth) / (first + second).

    A limb is any unbranched chain of rigid parts (`Embodiment.rigid_parts`; `below` counts the
    parts hanging on each) that ends in a tip, below a root or a part with several parts on it,
    with at least `LIMB_PARTS` parts, or one that swings on a floating body's trunk (`_swings`):
    legs, but also a neck and head, a tail or a finger. So it measures four chains of like mass,
    not four legs: four like legs give about 1; a humanoid's arms are lighter than its legs, or
    end in a hand that branches into fingers and so are no limb (0-0.54); dm_control's dog 0.51
    (its neck and head outweigh a leg); a four-fingered hand up to 0.92; an arm, a wheeled base or
    a biped 0 or near it (fewer than four limbs). From the tree and the masses alone: no pose or
    name enters."""
    top = e.rigid_parts
    mass: dict[int, float] = {}
    for i, body in enumerate(e.bodies):
        mass[top[i]] = mass.get(top[i], 0.0) + body.mass
    hinges: dict[int, list[Joint]] = {}
    for joint in e.joints:
        if joint.type == "hinge":
            hinges.setdefault(joint.body, []).append(joint)
    limbs = []
    for tip in mass:
        if below.get(tip):
            continue
        chain, part = [tip], top[e.bodies[tip].parent] if e.bodies[tip].parent >= 0 else -1
        while part >= 0 and below[part] == 1 and e.bodies[part].parent >= 0:
            chain.append(part)
            part = top[e.bodies[part].parent]
        on_trunk = e.floating_base and part >= 0 and e.bodies[part].parent < 0
        if e.bodies[tip].parent >= 0 and (
            len(chain) >= LIMB_PARTS or (on_trunk and _swings(e, hinges.get(tip, [])))
        ):
            limbs.append(math.fsum(mass[i] for i in chain))
    if len(limbs) < 4:
        return 0.0
    first, second, third, fourth = sorted(limbs, reverse=True)[:4]
    return (third + fourth) / max(first + second, 1e-12)


WHEEL_OFFSET = 0.1
"""A wheel's centre of mass lies on its axle: within this share of its body's extent of the joint
axis (through the body's origin, where URDF and most MJCF files put a wheel's joint)."""


def _wheels(e: Embodiment) -> int:
    """Wheels (and propellers) of a floating body: hinges that turn freely (no range, or wider than
    a full turn) on bodies with no joint below them, whose centre of mass lies on the axis. A leg
    whose knee turns freely (a minitaur's) carries its mass away from the axis; a fixed arm's
    wrist roll is not a wheel, so a fixed body has none."""
    if not e.floating_base:
        return 0
    above_a_joint: set[int] = set()
    for joint in e.joints:
        parent = e.bodies[joint.body].parent if joint.type != "free" else -1
        while parent >= 0 and parent not in above_a_joint:
            above_a_joint.add(parent)
            parent = e.bodies[parent].parent
    count = 0
    for joint in e.joints:
        turns = joint.range is None or joint.range[1] - joint.range[0] > 2 * math.pi + 1e-9
        if joint.type != "hinge" or not turns or joint.body in above_a_joint:
            continue
        count += not _off_axis(e, joint)
    return count


def _off_axis(e: Embodiment, joint: Joint) -> bool:
    """Whether the centre of mass of the joint's body lies off the joint's axis, by more than
    `WHEEL_OFFSET` of the body's extent: it swings like a leg rather than turns like a wheel."""
    body = e.bodies[joint.body]
    axis = np.array(joint.axis) / max(float(np.linalg.norm(joint.axis)), 1e-12)
    com = np.array(body.com)
    return float(np.linalg.norm(com - (com @ axis) * axis)) > WHEEL_OFFSET * max(body.extent, 1e-9)


def _swings(e: Embodiment, hinges: list[Joint]) -> bool:
    """Whether one of a body's `hinges` moves it with its mass off the hinge's axis (`_off_axis`).
    Read on the part's top body, whose joint it is, as `_wheels` reads a wheel: mass a file welds
    below it does not count, and the axis is taken through the body's origin."""
    return any(_off_axis(e, joint) for joint in hinges)


def _limit(bounds: tuple[float, float] | None) -> float:
    return max(abs(bounds[0]), abs(bounds[1])) if bounds else 0.0


def _strength(a: Actuator) -> float:
    """Peak force or torque an actuator can apply: its force limit, else gear times the largest
    control."""
    if a.force_range:
        return _limit(a.force_range)
    return abs(a.gear[0]) * _limit(a.ctrl_range) if a.kind == "motor" else 0.0


class FeatureEncoder(Encoder):
    """The transparent default: `morphology_features` times the `FEATURES` weights, compared by L2
    distance."""

    name = "morphology-features"
    version = "7"  # 2: wheels; 3: trunk mass; 4: limb balance; 5: no root mass; 6: rigid parts;
    # 7: one-link legs
    dim = len(FEATURES)
    feature_names = tuple(name for name, _ in FEATURES)

    def __init__(self) -> None:
        self._weights = np.array([weight for _, weight in FEATURES], np.float32)

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        features = morphology_features(embodiment)
        return np.array([features[name] for name in self.feature_names], np.float32) * self._weights

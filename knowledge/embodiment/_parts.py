"""The parts of a robot body's descriptor: bodies, joints, actuators, sites and sensors.

Plain frozen records; `Embodiment` (in `_descriptors`) holds them in canonical order, and `_mjcf`
reads them from a compiled MuJoCo model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import EmbodimentError

JointType = Literal["free", "ball", "slide", "hinge"]
Range = tuple[float, float]
Vec3 = tuple[float, float, float]

JOINT_DOF = {"free": 6, "ball": 3, "slide": 1, "hinge": 1}
_JOINT_TRANSMISSIONS = frozenset({"joint", "jointinparent", "tendon"})
ACTUATOR_KINDS = ("motor", "position", "velocity", "muscle", "other")


@dataclass(frozen=True, slots=True)
class Body:
    """A rigid body. `parent` indexes `Embodiment.bodies`; -1 is the world."""

    name: str
    parent: int
    pos: Vec3
    """Frame offset from the parent; zero for bodies on the world, whose placement is not their
    shape."""
    quat: tuple[float, float, float, float]
    mass: float
    com: Vec3
    inertia: tuple[float, float, float, float, float, float]
    """Ixx Iyy Izz Ixy Ixz Iyz about the centre of mass, in body axes (unique, unlike principal
    axes)."""
    extent: float
    """Distance from the body origin to the farthest geom surface or site: a leaf link's tip."""

    @property
    def link_length(self) -> float:
        return math.hypot(*self.pos)


@dataclass(frozen=True, slots=True)
class Joint:
    """A joint of `bodies[body]`; joints of one body keep their file order, which is kinematic."""

    name: str
    body: int
    type: JointType
    axis: Vec3
    range: Range | None
    """Radians (hinge, ball) or metres (slide); None when unlimited."""
    damping: float
    armature: float
    frictionloss: float
    force_range: Range | None
    """Limit on actuator force at this joint (URDF `effort`); None when unlimited."""


@dataclass(frozen=True, slots=True)
class Actuator:
    """An actuator. `target` holds joint indices for joint and tendon transmissions, else body
    indices."""

    name: str
    transmission: str
    target: tuple[int, ...]
    kind: str
    """motor, position, velocity, muscle or other, read from the gain and bias types."""
    gear: tuple[float, float, float, float, float, float]
    gain: float
    bias: Vec3
    ctrl_range: Range | None
    force_range: Range | None

    @property
    def moves_joints(self) -> bool:
        """Whether `target` holds joint indices (joint and tendon transmissions), not body
        indices."""
        return self.transmission in _JOINT_TRANSMISSIONS


@dataclass(frozen=True, slots=True)
class EmbodimentSite:
    """An MJCF site: a named point fixed on a body (a tool tip, a sensor mount)."""

    name: str
    body: int
    pos: Vec3


@dataclass(frozen=True, slots=True)
class Sensor:
    """A sensor, on the body that carries the object it reads (-1: the world or a tendon)."""

    name: str
    type: str
    dim: int
    body: int


Parts = tuple[str, list[Body], list[Joint], list[Actuator], list[EmbodimentSite], list[Sensor]]
"""A model's name and its parts in model order (not yet canonical)."""


def vec(values: Any) -> Any:
    """A tuple of Python floats (of whatever length the field has)."""
    return tuple(float(v) for v in values)


def check_finite(label: str, parts: Parts) -> Parts:
    """`parts` if every number in them is finite; else EmbodimentError naming the file, the part
    and the field (MuJoCo compiles a `nan` in some attributes, which no description can hold)."""
    for group in parts[1:]:
        for part in group:
            for field in part.__dataclass_fields__:
                value = getattr(part, field)
                numbers = value if isinstance(value, tuple) else (value,)
                if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
                    raise EmbodimentError(
                        f"{label}: {type(part).__name__.lower()} {part.name!r} has a {field} "
                        f"that is not a finite number ({value}): check the file's values there"
                    )
    return parts

"""What a transfer experiment knows of a body: a `Robot` (its scene, with what its tasks need, and
its skill interface: actuated joints placed by `Slot`s) and the helpers the body generators share.

Skills move between bodies through slots, never through names or file order, so that a posture for
a four-legged body drives a six-legged one by matching legs front to back, and an arm skill drives
another arm joint by joint from the base.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import mujoco
import numpy as np
from numpy.typing import ArrayLike

from knowledge import Embodiment

from ._families import posture_task, reach_task

if TYPE_CHECKING:
    from .._tasks import Task

Kind = Literal["arm", "legged"]
TASKS: dict[str, tuple[str, ...]] = {"arm": ("reach",), "legged": ("posture",)}
"""The task families each kind of body has."""
_AXES = {"z": (0.0, 0.0, 1.0), "y": (0.0, 1.0, 0.0), "x": (1.0, 0.0, 0.0)}


@dataclass(frozen=True, slots=True)
class Slot:
    """Where an actuated joint sits: `limb` along the body (0 front or base .. 1 back), `joint`
    outward (or, from `_building.HELD` on, a part only like bodies have), `side` across the
    body (1 left, -1 right, 0 on the middle line)."""

    limb: float
    joint: int
    side: float = 0.0


@dataclass(frozen=True)
class Robot:
    """A body in its family's scene, with the interface its skills use (actuator k drives
    `joints[k]`)."""

    name: str
    kind: Kind
    scene: str = field(repr=False)
    joints: tuple[str, ...]
    slots: tuple[Slot, ...]
    gear: tuple[float, ...]
    """Actuator length per joint radian: position targets are `gear * angle`."""
    size: float
    """The length tasks scale with: an arm's reach, a legged body's leg length (metres)."""
    home: tuple[float, ...]
    """Joint angles at home, the keyframe the task starts from (zeros for procedural bodies)."""
    keyframe: str | None = None
    source: str = ""
    morphology: str = ""
    """What kind of robot it stands for ("arm", "planar legged", "quadruped", "humanoid", ...)."""

    def embodiment(self) -> Embodiment:
        return Embodiment.from_mjcf(self.scene)

    @property
    def tasks(self) -> tuple[str, ...]:
        return TASKS[self.kind]

    def task(self, family: str) -> Task:
        """This body's task of a family (one of `tasks`)."""
        if family not in self.tasks:
            raise ValueError(
                f"{self.name} is a{'n' if self.kind == 'arm' else ''} {self.kind} body: "
                f"its tasks are {list(self.tasks)}, not {family!r}"
            )
        return reach_task(self) if family == "reach" else posture_task(self)


def _f(values: ArrayLike) -> str:
    return " ".join(f"{float(v):.6g}" for v in np.atleast_1d(values))


def _quat(axis: str, angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), *(math.sin(angle / 2) * np.array(_AXES[axis]))])


def _conditioning(scene: str, joints: Sequence[str] | None = None) -> float:
    """Smallest over largest singular value of the tool's position Jacobian at home (qpos 0), over
    `joints` (default: every degree of freedom)."""
    model = mujoco.MjModel.from_xml_string(scene)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    jac = np.zeros((3, model.nv))
    mujoco.mj_jacSite(model, data, jac, None, model.site("ee").id)
    if joints is not None:
        jac = jac[:, [model.joint(j).dofadr[0] for j in joints]]
    values = np.linalg.svd(jac, compute_uv=False)
    return float(values[-1] / values[0])

"""Cross-embodiment transfer data for research: procedural robot bodies (arms and legged bodies
from a seed) and transfer datasets (a native skill per body, evaluated on every other body of its
kind), with the `simnet encoder dataset` command."""

from ._bodies import (
    Robot,
    Slot,
    procedural_arm,
    procedural_legged,
    robot_population,
    shipped_robots,
)
from ._datasets import NativeSkill, native_skill, retarget, transfer_dataset

__all__ = [
    "NativeSkill",
    "Robot",
    "Slot",
    "native_skill",
    "procedural_arm",
    "procedural_legged",
    "retarget",
    "robot_population",
    "shipped_robots",
    "transfer_dataset",
]

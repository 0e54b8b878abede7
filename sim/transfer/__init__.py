"""Cross-embodiment transfer data for research: procedural robot bodies from a seed (small arms and
planar legged bodies; and shaped like real robots, industrial arms, two-armed torsos, mobile
manipulators, quadrupeds and humanoids) and transfer datasets (a native skill per body, evaluated on
the other bodies of its task family), with the `simnet encoder dataset` command."""

from ._bodies import procedural_arm, procedural_legged, robot_population, shipped_robots
from ._datasets import CLASSES, NativeSkill, body_classes, native_skill, retarget, transfer_dataset
from ._manipulators import industrial_arm, mobile_manipulator, two_armed
from ._robot import Robot, Slot
from ._standing import procedural_humanoid, procedural_quadruped

__all__ = [
    "CLASSES",
    "NativeSkill",
    "Robot",
    "Slot",
    "body_classes",
    "industrial_arm",
    "mobile_manipulator",
    "native_skill",
    "procedural_arm",
    "procedural_humanoid",
    "procedural_legged",
    "procedural_quadruped",
    "retarget",
    "robot_population",
    "shipped_robots",
    "transfer_dataset",
    "two_armed",
]

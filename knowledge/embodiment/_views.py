"""The same robot as another format describes it: what training shows the learned encoder so that
the format a vendor chose does not move a body.

A robot shipped as MJCF and as URDF reads differently once described: the URDF's root link is fused
into the world (a fixed robot loses its base), its joints have no armature and carry their effort,
a motor has gear 1 and controls up to that effort (an MJCF motor of gear 100 and control 0.4 is
a URDF's 40 N m), and it has no sites or sensors. Servos stay servos (a transmission says so).
`urdf_view` applies those differences to any descriptor. The view is the same robot, so a skill
transfers to it exactly as to the original: training lets either stand for the body (`_training`),
and the out-of-distribution reference counts both as seen.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from ._descriptors import Embodiment
from ._tokens import _strength


def urdf_view(e: Embodiment) -> Embodiment:
    """`e` as its URDF would describe it, after `from_urdf` completes it (see the module doc)."""
    jointed = {j.body for j in e.joints}
    static: list[bool] = []
    turn: list[
        np.ndarray
    ] = []  # welded to the world (a fixed root and what is fixed to it); rotation
    for i, b in enumerate(e.bodies):
        welded = i not in jointed and (b.parent < 0 or static[b.parent])
        quat = np.array(b.quat, float)
        if b.parent >= 0 and static[b.parent]:
            mujoco.mju_mulQuat(quat, turn[b.parent], np.array(b.quat, float))
        static.append(welded)
        turn.append(quat)
    kept = [i for i in range(len(e.bodies)) if not static[i]]
    new = {old: k for k, old in enumerate(kept)}
    bodies = []
    for i in kept:
        body = e.bodies[i]
        if body.parent < 0 or static[body.parent]:  # hangs on the world, as a URDF's root link
            body = dataclasses.replace(body, parent=-1, pos=(0.0, 0.0, 0.0), quat=_quat(turn[i]))
        else:
            body = dataclasses.replace(body, parent=new[body.parent])
        bodies.append(body)
    drives = {a.target[0]: a for a in e.actuators if a.transmission == "joint" and a.target}
    joints = []
    for j, joint in enumerate(e.joints):
        effort = _strength(drives.get(j), joint.force_range)
        joints.append(
            dataclasses.replace(
                joint,
                body=new[joint.body],
                armature=0.0,
                force_range=(-effort, effort) if effort > 0 else joint.force_range,
            )
        )
    actuators = []
    for act in e.actuators:
        if act.kind != "motor" or act.transmission != "joint":
            actuators.append(act)  # a servo: a transmission of its kind, as the URDF would say
            continue
        effort = _strength(act, e.joints[act.target[0]].force_range)
        actuators.append(
            dataclasses.replace(
                act,
                gear=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0),
                ctrl_range=(-effort, effort) if effort > 0 else None,
                force_range=None,
            )
        )
    return Embodiment(e.name, tuple(bodies), tuple(joints), tuple(actuators), (), ())


def _quat(q: np.ndarray) -> tuple[float, float, float, float]:
    return float(q[0]), float(q[1]), float(q[2]), float(q[3])

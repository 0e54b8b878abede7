"""The servos a task builder adds to a scene that has no actuators (any URDF): position servos
sized from each joint's effort limit where the file gives one, and velocity servos for a URDF's
wheels, whose angle is not worth holding."""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from ._scenes import JointLimit

SERVO_GAIN = 200.0  # a servo's stiffness where nothing says how strong its joint is
SERVO_ERROR = 0.1  # rad (or m): a URDF joint's servo pushes with its effort at this error
_HINGE = int(mujoco.mjtJoint.mjJNT_HINGE)
_JOINT_EQUALITY = int(mujoco.mjtEq.mjEQ_JOINT)


def add_servos(
    spec: Any,
    model: mujoco.MjModel,
    joints: list[str],
    gain: float | None,
    limits: dict[str, JointLimit] | None,
    wheels: bool = False,
) -> None:
    """A position servo per joint, limited to the joint's range, its velocity damping a tenth of
    its stiffness (the joint's inertia is not known here, so no critical damping); and the implicit
    integrator, so that stiff servos on light links stay stable.

    MJCF (`limits` None): stiffness `gain`, or 200. A URDF joint (`limits`: its `<limit>`): sized
    as `Embodiment.from_urdf` sizes a position servo, so that it pushes with the joint's effort at
    SERVO_ERROR (0.1 rad or m) of error, kp = effort / 0.1 (200 where the file gives no effort,
    as for an effort of 20), its force limited to the effort; `gain` replaces effort / 0.1. With
    `wheels`, a URDF's wheel (`_wheels`) gets a velocity servo instead, sized as `from_urdf` sizes
    one: it pushes with the effort at a tenth of the joint's velocity limit (of 1 rad/s where the
    file gives none), kv = kp / velocity limit, its control limited to the velocity limit.

    A joint that an equality ties to another (a URDF `<mimic>` joint, such as a gripper's second
    finger, which MuJoCo reads as a joint equality) gets no servo: its leader's servo moves it, as
    on the robot, and `Embodiment.from_urdf` counts no drive for it either.
    """
    turning = _wheels(model, joints) if wheels and limits is not None else set()
    for joint in _drivers(model, joints):
        j = model.joint(joint)
        act = spec.add_actuator(name=f"{joint}_servo", target=joint)
        act.trntype = mujoco.mjtTrn.mjTRN_JOINT
        act.gaintype = mujoco.mjtGain.mjGAIN_FIXED
        act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
        limit = None if limits is None else limits.get(joint, JointLimit(None, None))
        stiffness = SERVO_GAIN if gain is None else gain
        if limit is not None and limit.effort is not None:
            act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.forcerange = [-limit.effort, limit.effort]
            if gain is None:
                stiffness = limit.effort / SERVO_ERROR
        if limit is not None and j.id in turning:
            kv = stiffness / (limit.velocity or 1.0)
            act.gainprm[0], act.biasprm[2] = kv, -kv
            if limit.velocity is not None:
                act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
                act.ctrlrange = [-limit.velocity, limit.velocity]
            continue
        act.gainprm[0] = stiffness
        act.biasprm[1], act.biasprm[2] = -stiffness, -0.1 * stiffness
        if bool(model.jnt_limited[j.id]):
            act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.ctrlrange = model.jnt_range[j.id].tolist()
    if spec.option.integrator == mujoco.mjtIntegrator.mjINT_EULER:
        spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST


def _drivers(model: mujoco.MjModel, joints: list[str]) -> list[str]:
    """`joints` in order, each joint that an active joint equality moves replaced by the joint it
    follows (none for a joint the equality holds still), each once."""
    leader = {
        int(model.eq_obj1id[e]): int(model.eq_obj2id[e])
        for e in range(model.neq)
        if int(model.eq_type[e]) == _JOINT_EQUALITY and bool(model.eq_active0[e])
    }
    found: list[str] = []
    for name in joints:
        j, seen = int(model.joint(name).id), set()
        while j in leader and j not in seen:  # a cycle of equalities ends where it began
            seen.add(j)
            j = leader[j]
        if j >= 0 and model.joint(j).name not in found:
            found.append(model.joint(j).name)
    return found


def _wheels(model: mujoco.MjModel, joints: list[str]) -> set[int]:
    """The ids of the joints among `joints` that are wheels (or rotors): hinges without a position
    limit (URDF `continuous`, or `revolute` with no `lower` and `upper`, as Upkie writes its
    wheels), the only joint from their body down, whose part of the robot is centred on the axis
    (its centre of mass and each of its collision geoms' centres within 2% of its reach from the
    axis, in the model's default pose). Gravity does not turn such a part, so no angle of it is
    worth holding. A leg's last link left unlimited (Minitaur's continuous knees) is off its axis.
    """
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    found = set()
    for name in joints:
        j = int(model.joint(name).id)
        body = int(model.jnt_bodyid[j])
        if int(model.jnt_type[j]) != _HINGE or bool(model.jnt_limited[j]):
            continue
        part = [b for b in range(model.nbody) if _descends(model, b, body)]
        if sum(int(model.body_jntnum[b]) for b in part) != 1:
            continue
        anchor, axis = data.xanchor[j], data.xaxis[j]
        geoms = [g for g in range(model.ngeom) if int(model.geom_bodyid[g]) in part]
        solid = [g for g in geoms if model.geom_contype[g] or model.geom_conaffinity[g]] or geoms
        centre = data.subtree_com[body]
        off = [
            float(np.linalg.norm(np.cross(p - anchor, axis)))
            for p in (centre, *data.geom_xpos[solid])
        ]
        reach = max(
            [float(np.linalg.norm(centre - anchor))]
            + [
                float(np.linalg.norm(data.geom_xpos[g] - anchor) + model.geom_rbound[g])
                for g in solid
            ]
        )
        if max(off) <= 0.02 * reach:
            found.add(j)
    return found


def _descends(model: mujoco.MjModel, body: int, ancestor: int) -> bool:
    """Whether `body` is `ancestor` or below it."""
    while body > 0:
        if body == ancestor:
            return True
        body = int(model.body_parentid[body])
    return False

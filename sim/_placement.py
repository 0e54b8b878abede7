"""Where a task's robot starts: a floating base resting exactly on the ground, and the robot's own
parts that overlap at rest kept from colliding. Used by the task builders (`sim._builders`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mujoco
import numpy as np

Posture = Mapping[str, float | Sequence[float]]
PLANE = int(mujoco.mjtGeom.mjGEOM_PLANE)
_MESH = int(mujoco.mjtGeom.mjGEOM_MESH)
QPOS_SIZE = {
    int(mujoco.mjtJoint.mjJNT_FREE): 7,
    int(mujoco.mjtJoint.mjJNT_BALL): 4,
    int(mujoco.mjtJoint.mjJNT_HINGE): 1,
    int(mujoco.mjtJoint.mjJNT_SLIDE): 1,
}


def rest_on_floor(spec: Any, model: mujoco.MjModel, base_body: str, pose: Posture) -> None:
    """Move `base_body` (just given a free joint) up or down so that the lowest point of its
    collision geoms (its own and those of the bodies below it: not a prop's or a static terrain's),
    with `pose` set, touches the ground: the highest upward-facing plane fixed to the world, or
    z = 0 where there is none (where the task adds its floor)."""
    data = mujoco.MjData(model)
    for joint, value in pose.items():
        j = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint)
        size = QPOS_SIZE.get(int(model.jnt_type[j]), 0) if j >= 0 else 0
        try:
            values = np.atleast_1d(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError):
            continue  # the keyframe refuses it, naming the joint
        if size and values.shape == (size,) and np.isfinite(values).all():
            adr = int(model.jnt_qposadr[j])
            data.qpos[adr : adr + size] = values
    mujoco.mj_kinematics(model, data)
    base = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, base_body)
    lowest, ground = np.inf, None
    for g in range(model.ngeom):
        if int(model.geom_type[g]) == PLANE:
            if model.geom_bodyid[g] == 0 and data.geom_xmat[g, 8] > 1 - 1e-9:
                ground = max(ground if ground is not None else -np.inf, data.geom_xpos[g, 2])
            continue
        collides = model.geom_contype[g] or model.geom_conaffinity[g]
        if collides and model.body_rootid[model.geom_bodyid[g]] == base:
            lowest = min(lowest, lowest_point(model, data, g))
    if np.isfinite(lowest):
        body = spec.body(base_body)
        body.pos = [body.pos[0], body.pos[1], body.pos[2] + (ground or 0.0) - lowest]


def exclude_overlaps(
    spec: Any, model: mujoco.MjModel, keyframe: str | None, body: int
) -> list[tuple[str, str]]:
    """Exclude from collision each pair of the robot's own bodies (those of `body`'s kinematic
    tree: not the world's geoms, a prop's or the floor) whose contact is active in the start pose:
    MoveIt's rule for the pairs an SRDF disables ("in collision in the default pose"). A URDF
    has no such list and its collision meshes often overlap at rest (a gripper inside a thigh,
    wheels inside a base): kept, each pair pushes the robot apart from the first step and multiplies
    the contacts to solve. Unnamed bodies cannot be excluded by name and keep theirs. The pairs are
    sorted by name, so that the same files give the same scene. Returns them."""
    data = mujoco.MjData(model)
    if keyframe is not None:
        mujoco.mj_resetDataKeyframe(model, data, model.key(keyframe).id)
    mujoco.mj_forward(model, data)
    root = int(model.body_rootid[body])
    pairs: set[tuple[str, str]] = set()
    for i in range(data.ncon):
        contact = data.contact[i]
        if contact.geom[0] < 0 or contact.geom[1] < 0 or contact.dist >= contact.includemargin:
            continue  # a flex's, or within the margin but not pushing
        bodies = [int(model.geom_bodyid[g]) for g in contact.geom]
        if any(b == 0 or int(model.body_rootid[b]) != root for b in bodies):
            continue
        names = sorted(str(model.body(b).name) for b in bodies)
        if all(names):
            pairs.add((names[0], names[1]))
    for first, second in sorted(pairs):
        spec.add_exclude(bodyname1=first, bodyname2=second)
    return sorted(pairs)


def lowest_point(model: mujoco.MjModel, data: mujoco.MjData, g: int) -> float:
    """The lowest world z of geom `g`'s collision shape: exact for primitives and for a mesh (its
    vertices; MuJoCo collides with their convex hull); a height field by its bounding box."""
    kind, size = int(model.geom_type[g]), model.geom_size[g]
    rotation = data.geom_xmat[g].reshape(3, 3)
    z, up = float(data.geom_xpos[g, 2]), rotation[2]  # up: the geom's axes' world z components
    if kind == _MESH:
        start, count = (
            model.mesh_vertadr[model.geom_dataid[g]],
            model.mesh_vertnum[model.geom_dataid[g]],
        )
        return z + float((model.mesh_vert[start : start + count] @ up).min())
    if kind == int(mujoco.mjtGeom.mjGEOM_SPHERE):
        return z - size[0]
    if kind == int(mujoco.mjtGeom.mjGEOM_CAPSULE):
        return z - size[0] - size[1] * abs(up[2])
    if kind == int(mujoco.mjtGeom.mjGEOM_CYLINDER):
        return z - size[1] * abs(up[2]) - size[0] * float(np.hypot(up[0], up[1]))
    if kind == int(mujoco.mjtGeom.mjGEOM_ELLIPSOID):
        return z - float(np.linalg.norm(size * up))
    if kind == int(mujoco.mjtGeom.mjGEOM_BOX):
        return z - float(np.abs(size * up).sum())
    corners = np.array([[x, y, w] for x in (-1, 1) for y in (-1, 1) for w in (-1, 1)])
    box = model.geom_aabb[g, :3] + corners * model.geom_aabb[g, 3:]  # in the geom's frame
    return z + float((box @ up).min())

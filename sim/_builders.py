"""Task builders: a reach task for any arm and a stand task for any legged robot, from its MJCF or
URDF, in a few lines.

A builder reads the robot with MuJoCo's own loaders (MJCF text or file, or a URDF file), edits the
model spec (a target, a site, servos where the file has none, a start keyframe), writes the scene
back as self-contained MJCF text and returns a `Task` whose terms come from the vocabulary of
`sim._tasks`: the result is data like any hand-written task, and travels the same way. A name that
the robot does not have is a TaskDefinitionError naming the argument and the name.

The files a scene loads (meshes, textures, heightfields; for URDF, relative and `package://` mesh
paths) are read once and carried by the task as assets, by hash, under portable names
(`sim._assets.bundle`, through `sim._scenes`); included files are inlined. Such a task runs on
any machine.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from ._errors import TaskDefinitionError
from ._placement import PLANE, QPOS_SIZE, Posture, exclude_overlaps, rest_on_floor
from ._scenes import Scene, compile_scene, load_scene, scene_task, urdf_limits
from ._servos import add_servos
from ._tasks import FORMAT, Task

TARGET = "reach_target"  # the body and site a reach task adds
END_EFFECTOR = "reach_ee"  # the site added when the end effector is a body
CONTROL_PERIOD_S = 0.04  # default control step: 25 Hz
_MOVING = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
_FREE = int(mujoco.mjtJoint.mjJNT_FREE)
_HINGE = int(mujoco.mjtJoint.mjJNT_HINGE)


def reach_task(
    scene: Scene,
    *,
    end_effector: str,
    joints: Sequence[str] | None = None,
    target_box: tuple[Sequence[float], Sequence[float]] | None = None,
    horizon: int = 100,
    tolerance: float = 0.05,
    home: Posture | None = None,
    keyframe: str | None = None,
    joint_noise: float = 0.02,
    servo_gain: float | None = None,
    control_substeps: int | None = None,
    name: str | None = None,
    embodiment: str | None = None,
    package_path: Sequence[str | os.PathLike[str]] = (),
    balance_inertia: bool = False,
    exclude_start_contacts: bool = True,
) -> Task:
    """A task in which the arm brings `end_effector` (a site, or a body: a site is added at its
    origin) within `tolerance` metres of a target drawn uniformly from `target_box` ((low xyz),
    (high xyz), in the world frame; default: a 0.2 m cube around where the end effector starts)
    and holds it there at the end of `horizon` control steps.

    `joints` (default: every hinge and slide joint from the end effector's body up to the root) are
    observed (positions, velocities) with the vector from the end effector to the target; their
    start positions get normal noise of `joint_noise` rad. The action drives every actuator of the
    scene, as changes of their controls (mode "delta"). A scene with no actuators (any URDF) gets a
    position servo on each of `joints` (`add_servos`: a URDF joint's is sized from its effort
    limit; `servo_gain` sets every servo's stiffness instead, 200 by default for MJCF). `home`
    (joint name -> position) adds a start keyframe, with position servos aimed at it; or
    `keyframe` names one the scene has.
    `package_path` lists directories to find a URDF's `package://` meshes in (then
    ROS_PACKAGE_PATH, then the folders holding the file: `knowledge.resolve_package_uri`).
    `balance_inertia=True` repairs inertias MuJoCo refuses, as `Embodiment.from_urdf` does: a full
    inertia that is not positive definite keeps its diagonal, MuJoCo's `balanceinertia` raises the
    smallest moment to the triangle inequality, massless links that carry a joint get 1e-6 kg.
    `exclude_start_contacts` (default True): pairs of the robot's own bodies in contact in the start
    pose never collide (`<contact><exclude>`), as an SRDF disables pairs in collision in the default
    pose; a URDF's collision shapes often overlap at rest, and each such pair would push the robot
    apart from its first step.
    """
    spec, source = load_scene(scene, package_path, balance_inertia)
    limits = urdf_limits(scene)
    model = compile_scene(spec, source)
    site, body = _end_effector(spec, model, end_effector, source)
    chain = _chain_joints(model, body, joints, "joints")
    _check_new_names(model, [TARGET, END_EFFECTOR] if site is None else [TARGET])
    if site is None:
        spec.body(model.body(body).name).add_site(
            name=END_EFFECTOR, size=[0.01] * 3, rgba=[1, 0.5, 0, 1]
        )
        site = END_EFFECTOR
    if model.nu == 0:
        add_servos(spec, model, chain, servo_gain, limits)
    start = _start_keyframe(spec, keyframe, home, "home")
    model = compile_scene(spec, source)
    low, high = _target_box(model, site, start, target_box)
    centre = (low + high) / 2
    if exclude_start_contacts:
        exclude_overlaps(spec, model, start, body)
    target = spec.worldbody.add_body(name=TARGET, pos=centre.tolist())
    target.add_site(name=TARGET, size=[0.025] * 3, rgba=[0, 1, 0, 0.5])
    label = embodiment or _model_name(spec, source)
    distance = {"term": "site_distance", "from": site, "to": TARGET}
    init: list[dict[str, Any]] = [
        {
            "target": f"body/{TARGET}/pos",
            "op": "add",
            "dist": "uniform",
            "low": (low - centre).tolist(),
            "high": (high - centre).tolist(),
        }
    ]
    init += _joint_noise(chain, joint_noise)
    return scene_task(
        spec,
        source,
        {
            "format": FORMAT,
            "name": name or f"{label}_reach",
            "embodiment": label,
            "keyframe": start,
            "init": init,
            "observation": [
                {"term": "qpos", "joints": chain},
                {"term": "qvel", "joints": chain},
                {"term": "site_delta", "from": site, "to": TARGET},
            ],
            "action": {"mode": "delta"},
            "reward": [{**distance, "weight": -1.0}],
            "success": {"when": "end", "all": [{**distance, "below": _positive(tolerance)}]},
            "failure": [],
            "horizon": horizon,
            "control_substeps": control_substeps or _substeps(model),
        },
    )


def stand_task(
    scene: Scene,
    *,
    base_body: str,
    height: float,
    upright: float = 0.8,
    horizon: int = 200,
    joints: Sequence[str] | None = None,
    posture: Posture | None = None,
    keyframe: str | None = None,
    floating_base: bool = False,
    joint_noise: float = 0.02,
    action: str = "absolute",
    servo_gain: float | None = None,
    control_substeps: int | None = None,
    name: str | None = None,
    embodiment: str | None = None,
    package_path: Sequence[str | os.PathLike[str]] = (),
    balance_inertia: bool = False,
    exclude_start_contacts: bool = True,
) -> Task:
    """A task in which a legged robot keeps `base_body` (a floating body: its free joint) above
    `height` metres and upright (the cosine between its z axis and the world's above `upright`)
    for all of `horizon` control steps; dropping below either ends the branch as a failure.

    `joints` (default: every hinge and slide joint) are observed (positions, velocities) with the
    base's position, its free joint's velocity and its uprightness; their start positions get
    normal noise of `joint_noise` rad. The action drives every actuator (mode `action`, "absolute":
    position targets for position servos, velocities for velocity servos, torques for motors). A
    scene with no actuators gets a servo on each of `joints`, as `reach_task` does, except that a
    URDF's wheels get velocity servos (`add_servos`). `posture` (joint name -> position; a
    free joint takes its 7 qpos values) adds a start keyframe with position servos aimed at it; or
    `keyframe` names one the scene has. `floating_base=True` gives a base welded to the world (a
    URDF's root, as MuJoCo reads it) a free joint named "<base_body>_free" and places the base so
    that the lowest point of the robot's collision geoms, in `posture`, touches the scene's
    ground plane, or z = 0 (a URDF puts its root at the origin, its legs below), unless `posture`
    places that free joint itself or a `keyframe` is given; a scene with no ground plane gets one
    at z = 0. `package_path`, `balance_inertia` and `exclude_start_contacts`: as for `reach_task`.
    """
    spec, source = load_scene(scene, package_path, balance_inertia)
    limits = urdf_limits(scene)
    model = compile_scene(spec, source)
    base = _named(model, "body", base_body, "base_body", source)
    free = [
        j
        for j in range(model.njnt)
        if int(model.jnt_bodyid[j]) == base and int(model.jnt_type[j]) == _FREE
    ]
    if not free and floating_base and int(model.body_parentid[base]) == 0:
        spec.body(base_body).add_freejoint(name=f"{base_body}_free")
        model = compile_scene(spec, source)
        free = [int(model.joint(f"{base_body}_free").id)]
        if keyframe is None and f"{base_body}_free" not in (posture or {}):
            rest_on_floor(spec, model, base_body, posture or {})
            model = compile_scene(spec, source)
    if not free:
        hint = (
            ": pass floating_base=True (MuJoCo welds a URDF's root to the world)"
            if int(model.body_parentid[base]) == 0
            else ""
        )
        raise TaskDefinitionError(
            "base_body",
            f"body {base_body!r} of {source} has no free joint: a stand task needs a floating "
            f"base{hint}",
        )
    if not any(int(t) == PLANE for t in model.geom_type):
        spec.worldbody.add_geom(
            name="stand_floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[20, 20, 0.1]
        )
    free_name = model.joint(free[0]).name
    if not free_name:
        raise TaskDefinitionError("base_body", f"the free joint of {base_body!r} needs a name")
    if not (isinstance(height, int | float) and height > 0):
        raise TaskDefinitionError("height", f"must be a number > 0, got {height!r}")
    if not 0.0 <= upright < 1.0:
        raise TaskDefinitionError("upright", f"must be in [0, 1), got {upright!r}")
    moving = _all_moving(model) if joints is None else _known_joints(model, joints, "joints")
    if model.nu == 0:
        add_servos(spec, model, moving, servo_gain, limits, wheels=True)
    start = _start_keyframe(spec, keyframe, posture, "posture")
    model = compile_scene(spec, source)
    if exclude_start_contacts:
        exclude_overlaps(spec, model, start, base)
        model = compile_scene(spec, source)
    label = embodiment or _model_name(spec, source)
    high = {"term": "body_height", "body": base_body}
    level = {"term": "body_upright", "body": base_body}
    return scene_task(
        spec,
        source,
        {
            "format": FORMAT,
            "name": name or f"{label}_stand",
            "embodiment": label,
            "keyframe": start,
            "init": _joint_noise(moving, joint_noise),
            "observation": [
                {"term": "qpos", "joints": moving},
                {"term": "qvel", "joints": [free_name, *moving]},
                {"term": "body_pos", "body": base_body},
                {"term": "body_upright", "body": base_body},
            ],
            "action": {"mode": action},
            "reward": [
                {"term": "alive", "weight": 1.0},
                {**level, "weight": 1.0},
                {"term": "ctrl_sq", "weight": -0.001},
            ],
            "success": {
                "when": "end",
                "all": [{**high, "above": float(height)}, {**level, "above": float(upright)}],
            },
            "failure": [{**high, "below": float(height)}, {**level, "below": float(upright)}],
            "horizon": horizon,
            "control_substeps": control_substeps or _substeps(model),
        },
    )


# ---- reading and writing the scene ----


def _model_name(spec: Any, source: str) -> str:
    return str(spec.modelname or Path(source).stem or "robot")


def _substeps(model: mujoco.MjModel) -> int:
    return max(1, round(CONTROL_PERIOD_S / float(model.opt.timestep)))


def _positive(value: float) -> float:
    if not (isinstance(value, int | float) and value > 0):
        raise TaskDefinitionError("tolerance", f"must be a number > 0, got {value!r}")
    return float(value)


# ---- names ----

_OBJECTS = {"body": mujoco.mjtObj.mjOBJ_BODY, "joint": mujoco.mjtObj.mjOBJ_JOINT}


def _names(model: mujoco.MjModel, kind: str) -> list[str]:
    count = model.nbody if kind == "body" else model.njnt
    found = (mujoco.mj_id2name(model, _OBJECTS[kind], i) for i in range(count))
    return [n for n in found if n]


def _named(model: mujoco.MjModel, kind: str, name: object, field: str, source: str) -> int:
    ident = mujoco.mj_name2id(model, _OBJECTS[kind], name) if isinstance(name, str) else -1
    if ident < 0:
        raise TaskDefinitionError(
            field, f"{source} has no {kind} named {name!r}{_hint(model, kind, name)}"
        )
    return int(ident)


def _hint(model: mujoco.MjModel, kind: str, name: object) -> str:
    names = _names(model, kind)
    close = difflib.get_close_matches(str(name), names, n=3)
    if close:
        return f" (did you mean {', '.join(close)}?)"
    plural = "bodies" if kind == "body" else f"{kind}s"
    return f"; its {plural} are {', '.join(names[:12])}{', ...' if len(names) > 12 else ''}"


def _end_effector(
    spec: Any, model: mujoco.MjModel, name: str, source: str
) -> tuple[str | None, int]:
    """(the site, or None for a body, and the body id) that `end_effector` names."""
    site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, name) if isinstance(name, str) else -1
    if site >= 0:
        return name, int(model.site_bodyid[site])
    body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name) if isinstance(name, str) else -1
    if body > 0:
        return None, int(body)
    sites = [n for n in (model.site(i).name for i in range(model.nsite)) if n]
    raise TaskDefinitionError(
        "end_effector",
        f"{source} has no site or body named {name!r}; its sites are {sites or 'none'}, "
        f"its bodies {_names(model, 'body')[1:]}",
    )


def _check_new_names(model: mujoco.MjModel, names: list[str]) -> None:
    for name in names:
        for kind in (mujoco.mjtObj.mjOBJ_BODY, mujoco.mjtObj.mjOBJ_SITE):
            if mujoco.mj_name2id(model, kind, name) >= 0:
                raise TaskDefinitionError("scene", f"already has an element named {name!r}")


def _chain_joints(
    model: mujoco.MjModel, body: int, joints: Sequence[str] | None, field: str
) -> list[str]:
    """The given joints (checked), or the hinge and slide joints from `body` up to the root."""
    if joints is not None:
        return _known_joints(model, joints, field)
    chain: list[str] = []
    while body > 0:
        first, count = int(model.body_jntadr[body]), int(model.body_jntnum[body])
        for j in reversed(range(first, first + count)):
            if int(model.jnt_type[j]) in _MOVING:
                chain.append(_joint_name(model, j, field))
        body = int(model.body_parentid[body])
    if not chain:
        raise TaskDefinitionError(field, "no hinge or slide joint moves the end effector")
    return chain[::-1]


def _all_moving(model: mujoco.MjModel) -> list[str]:
    moving = [
        _joint_name(model, j, "joints")
        for j in range(model.njnt)
        if int(model.jnt_type[j]) in _MOVING
    ]
    if not moving:
        raise TaskDefinitionError("joints", "the robot has no hinge or slide joint")
    return moving


def _joint_name(model: mujoco.MjModel, joint: int, field: str) -> str:
    name = model.joint(joint).name
    if not name:
        raise TaskDefinitionError(field, f"joint {joint} has no name: name it, or pass `joints`")
    return str(name)


def _known_joints(model: mujoco.MjModel, joints: Sequence[str], field: str) -> list[str]:
    if isinstance(joints, str) or not joints:
        raise TaskDefinitionError(field, "must be a non-empty list of joint names")
    for i, joint in enumerate(joints):
        _named(model, "joint", joint, f"{field}[{i}]", "the scene")
    return list(joints)


# ---- what the builders add ----


def _start_keyframe(
    spec: Any, keyframe: str | None, pose: Posture | None, field: str
) -> str | None:
    """The keyframe a task starts from: `keyframe` (checked), or one made from `pose`."""
    if keyframe is not None and pose is not None:
        raise TaskDefinitionError(field, "give a pose or a keyframe, not both")
    model = spec.compile()
    if keyframe is not None:
        if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, keyframe) < 0:
            keys = [model.key(i).name for i in range(model.nkey)]
            raise TaskDefinitionError(
                "keyframe", f"the scene has no keyframe {keyframe!r}; it has {keys}"
            )
        return keyframe
    if pose is None:
        return None
    qpos = model.qpos0.copy()
    for joint, value in pose.items():
        j = _named(model, "joint", joint, f"{field}[{joint!r}]", "the scene")
        adr = int(model.jnt_qposadr[j])
        values = np.atleast_1d(np.asarray(value, dtype=np.float64))
        size = QPOS_SIZE[int(model.jnt_type[j])]
        if values.shape != (size,) or not np.isfinite(values).all():
            raise TaskDefinitionError(f"{field}[{joint!r}]", f"needs {size} finite number(s)")
        low, high = model.jnt_range[j]
        if size == 1 and model.jnt_limited[j] and not low <= values[0] <= high:
            unit = "rad" if int(model.jnt_type[j]) == _HINGE else "m"
            raise TaskDefinitionError(
                f"{field}[{joint!r}]",
                f"{values[0]:g} {unit} is outside the joint's range [{low:.4g}, {high:.4g}] {unit}",
            )
        qpos[adr : adr + size] = values
    ctrl = np.zeros(model.nu)
    for a in range(model.nu):  # position servos aim at the pose; other actuators start at zero
        servo = int(model.actuator_biastype[a]) == int(mujoco.mjtBias.mjBIAS_AFFINE) and (
            model.actuator_biasprm[a, 1] < 0
        )
        if servo and int(model.actuator_trntype[a]) == int(mujoco.mjtTrn.mjTRN_JOINT):
            ctrl[a] = qpos[int(model.jnt_qposadr[int(model.actuator_trnid[a, 0])])]
    name = "start"
    while mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, name) >= 0:
        name += "_"
    spec.add_key(name=name, qpos=qpos.tolist(), ctrl=ctrl.tolist())
    return name


def _target_box(
    model: mujoco.MjModel,
    site: str,
    keyframe: str | None,
    box: tuple[Sequence[float], Sequence[float]] | None,
) -> tuple[np.ndarray, np.ndarray]:
    if box is None:
        data = mujoco.MjData(model)
        if keyframe is not None:
            mujoco.mj_resetDataKeyframe(model, data, model.key(keyframe).id)
        mujoco.mj_kinematics(model, data)
        start = data.site(site).xpos.copy()
        return start - 0.1, start + 0.1
    try:
        low, high = (np.asarray(v, dtype=np.float64) for v in box)
    except (TypeError, ValueError) as exc:
        raise TaskDefinitionError("target_box", "must be ((x, y, z), (x, y, z))") from exc
    if low.shape != (3,) or high.shape != (3,) or not np.isfinite([low, high]).all():
        raise TaskDefinitionError("target_box", "must be ((x, y, z), (x, y, z)), finite")
    if np.any(low > high):
        raise TaskDefinitionError("target_box", f"low {low.tolist()} exceeds high {high.tolist()}")
    return low, high


def _joint_noise(joints: list[str], std: float) -> list[dict[str, Any]]:
    if not (isinstance(std, int | float) and std >= 0):
        raise TaskDefinitionError("joint_noise", f"must be a number >= 0, got {std!r}")
    if std == 0:
        return []
    return [
        {"target": f"joint/{j}/qpos", "op": "add", "dist": "normal", "mean": 0.0, "std": float(std)}
        for j in joints
    ]

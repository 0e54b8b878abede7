"""Reading robot files: MuJoCo compiles an MJCF or URDF file; its arrays become descriptor parts.

URDF is first completed by the rules in `_urdf` (floating base, actuators, package URIs, xacro).

Compiling first resolves defaults, includes, angle units and `fromto` shorthands, so the parts say
what the body is, not how its file is written.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import EmbodimentError
from ._parts import Actuator, Body, EmbodimentSite, Joint, Range, Sensor, vec
from ._urdf import compile_urdf, drives, floats_by_default, prepare_urdf

Parts = tuple[str, list[Body], list[Joint], list[Actuator], list[EmbodimentSite], list[Sensor]]
"""A model's name and its parts in model order (not yet canonical)."""


def _read(path: Path) -> bytes:
    if not path.exists():
        raise EmbodimentError(f"{path}: no such file")
    if not path.is_file():
        raise EmbodimentError(f"{path}: not a regular file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise EmbodimentError(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def read_mjcf(source: str | os.PathLike[str]) -> Parts:
    """The parts of an MJCF file, or of MJCF text (a string starting with `<`)."""
    if isinstance(source, str) and source.lstrip().startswith("<"):
        return _compile(
            "<MJCF text>", source.encode(), "mujoco", mujoco.MjModel.from_xml_string, source
        )
    path = Path(source)
    return _compile(str(path), _read(path), "mujoco", mujoco.MjModel.from_xml_path, str(path))


def read_urdf(
    path: str | os.PathLike[str],
    *,
    floating_base: bool | None = None,
    package_path: Iterable[str | os.PathLike[str]] | None = None,
    balance_inertia: bool = False,
) -> Parts:
    """The parts of a URDF (or xacro) file, by the rules in `_urdf`."""
    path = Path(path)
    label = str(path)
    text, robot = prepare_urdf(
        label, path, _read(path), package_path=package_path, balance_inertia=balance_inertia
    )
    floating = floats_by_default(robot) if floating_base is None else bool(floating_base)
    model = compile_urdf(label, text, floating, drives(robot))
    if model.njnt == 0:
        raise EmbodimentError(f"{label}: the model has no joints, so there is no robot to describe")
    return _describe(model)


def _compile(
    label: str, text: bytes, root: str, compile_: Callable[[str], mujoco.MjModel], arg: str
) -> Parts:
    """Check the XML and its root element ourselves (clearer messages), then let MuJoCo compile
    it."""
    try:
        tag = ET.fromstring(text.lstrip()).tag
    except ET.ParseError as exc:
        raise EmbodimentError(f"{label}: XML syntax error: {exc}") from exc
    if tag != root:
        hint = {
            "robot": "; it is URDF: use Embodiment.from_urdf",
            "mujoco": "; it is MJCF: use Embodiment.from_mjcf",
        }
        raise EmbodimentError(
            f"{label}: the root element is <{tag}>, not <{root}>{hint.get(tag, '')}"
        )
    try:
        model = compile_(arg)
    except ValueError as exc:
        problem = " ".join(str(exc).split())
        raise EmbodimentError(f"{label}: MuJoCo cannot compile it: {problem}") from exc
    if model.njnt == 0:
        raise EmbodimentError(f"{label}: the model has no joints, so there is no robot to describe")
    return _describe(model)


# -- reading the compiled model -------------------------------------------------------------------


def _enum(value: Any, enum: Any, prefix: str) -> Any:
    return enum(int(value)).name.removeprefix(prefix).lower()


def _describe(m: mujoco.MjModel) -> Parts:
    """Read the compiled arrays. Model body b becomes descriptor body b - 1 (the world, -1)."""

    def name(adr: int) -> str:
        return m.names[adr : m.names.index(b"\0", adr)].decode()

    def bounds(limited: Any, values: np.ndarray) -> Range | None:
        return (float(values[0]), float(values[1])) if limited else None

    extent = np.zeros(m.nbody)
    np.maximum.at(extent, m.geom_bodyid, np.linalg.norm(m.geom_pos, axis=1) + m.geom_rbound)
    np.maximum.at(extent, m.site_bodyid, np.linalg.norm(m.site_pos, axis=1))
    bodies = [
        Body(
            name(m.name_bodyadr[b]),
            int(m.body_parentid[b]) - 1,
            (0.0, 0.0, 0.0) if m.body_parentid[b] == 0 else vec(m.body_pos[b]),
            vec(m.body_quat[b]),
            float(m.body_mass[b]),
            vec(m.body_ipos[b]),
            _inertia(m, b),
            float(extent[b]),
        )
        for b in range(1, m.nbody)
    ]
    joints = [
        Joint(
            name(m.name_jntadr[j]),
            int(m.jnt_bodyid[j]) - 1,
            _enum(m.jnt_type[j], mujoco.mjtJoint, "mjJNT_"),
            vec(m.jnt_axis[j]),
            bounds(m.jnt_limited[j], m.jnt_range[j]),
            float(m.dof_damping[m.jnt_dofadr[j]]),
            float(m.dof_armature[m.jnt_dofadr[j]]),
            float(m.dof_frictionloss[m.jnt_dofadr[j]]),
            bounds(m.jnt_actfrclimited[j], m.jnt_actfrcrange[j]),
        )
        for j in range(m.njnt)
    ]
    actuators = [
        Actuator(
            name(m.name_actuatoradr[a]),
            _enum(m.actuator_trntype[a], mujoco.mjtTrn, "mjTRN_"),
            _actuator_target(m, a),
            _actuator_kind(m, a),
            vec(m.actuator_gear[a]),
            float(m.actuator_gainprm[a, 0]),
            vec(m.actuator_biasprm[a, :3]),
            bounds(m.actuator_ctrllimited[a], m.actuator_ctrlrange[a]),
            bounds(m.actuator_forcelimited[a], m.actuator_forcerange[a]),
        )
        for a in range(m.nu)
    ]
    sites = [
        EmbodimentSite(name(m.name_siteadr[s]), int(m.site_bodyid[s]) - 1, vec(m.site_pos[s]))
        for s in range(m.nsite)
    ]
    sensors = [
        Sensor(
            name(m.name_sensoradr[s]),
            _enum(m.sensor_type[s], mujoco.mjtSensor, "mjSENS_"),
            int(m.sensor_dim[s]),
            _sensor_body(m, s) - 1,
        )
        for s in range(m.nsensor)
    ]
    return name(0), bodies, joints, actuators, sites, sensors


def _inertia(m: mujoco.MjModel, b: int) -> Any:
    """The inertia tensor in body axes: unique, where principal axes are not (equal moments,
    signs)."""
    rot: np.ndarray = np.zeros(9)
    mujoco.mju_quat2Mat(rot, m.body_iquat[b])
    rot = rot.reshape(3, 3)
    tensor = rot @ np.diag(m.body_inertia[b]) @ rot.T
    tensor[np.abs(tensor) < 1e-9 * max(float(np.abs(np.diag(tensor)).max()), 1e-300)] = (
        0.0  # rotation noise
    )
    return vec([tensor[0, 0], tensor[1, 1], tensor[2, 2], tensor[0, 1], tensor[0, 2], tensor[1, 2]])


def _actuator_target(m: mujoco.MjModel, a: int) -> tuple[int, ...]:
    """Joints (or, for site and body transmissions, bodies) that actuator `a` moves, in descriptor
    indices."""
    trn, obj = int(m.actuator_trntype[a]), int(m.actuator_trnid[a, 0])
    if trn in (mujoco.mjtTrn.mjTRN_JOINT, mujoco.mjtTrn.mjTRN_JOINTINPARENT):
        return (obj,)
    if trn == mujoco.mjtTrn.mjTRN_TENDON:
        wraps = range(m.tendon_adr[obj], m.tendon_adr[obj] + m.tendon_num[obj])
        return tuple(
            sorted(
                {
                    int(m.wrap_objid[w])
                    for w in wraps
                    if m.wrap_type[w] == mujoco.mjtWrap.mjWRAP_JOINT
                }
            )
        )
    if trn in (mujoco.mjtTrn.mjTRN_SITE, mujoco.mjtTrn.mjTRN_SLIDERCRANK):
        return (int(m.site_bodyid[obj]) - 1,)
    if trn == mujoco.mjtTrn.mjTRN_BODY:
        return (obj - 1,)
    return ()


def _actuator_kind(m: mujoco.MjModel, a: int) -> str:
    """What the control signal means, from MuJoCo's gain and bias: force, target position or
    velocity."""
    gain_type, bias_type = m.actuator_gaintype[a], m.actuator_biastype[a]
    gain, bias = m.actuator_gainprm[a, 0], m.actuator_biasprm[a]
    if gain_type == mujoco.mjtGain.mjGAIN_MUSCLE:
        return "muscle"
    if gain_type != mujoco.mjtGain.mjGAIN_FIXED:
        return "other"
    if bias_type == mujoco.mjtBias.mjBIAS_NONE:
        return "motor"
    if bias_type == mujoco.mjtBias.mjBIAS_AFFINE and gain != 0 and bias[0] == 0:
        if bias[1] == -gain:
            return "position"
        if bias[1] == 0 and bias[2] == -gain:
            return "velocity"
    return "other"


def _sensor_body(m: mujoco.MjModel, s: int) -> int:
    """Model body that carries the object sensor `s` reads (0, the world, when none does)."""
    kind, obj = int(m.sensor_objtype[s]), int(m.sensor_objid[s])
    if kind in (mujoco.mjtObj.mjOBJ_BODY, mujoco.mjtObj.mjOBJ_XBODY):
        return obj
    owners = {
        int(mujoco.mjtObj.mjOBJ_JOINT): m.jnt_bodyid,
        int(mujoco.mjtObj.mjOBJ_SITE): m.site_bodyid,
        int(mujoco.mjtObj.mjOBJ_GEOM): m.geom_bodyid,
        int(mujoco.mjtObj.mjOBJ_CAMERA): m.cam_bodyid,
    }
    if kind in owners:
        return int(owners[kind][obj])
    if (
        kind == mujoco.mjtObj.mjOBJ_ACTUATOR
        and m.actuator_trntype[obj] == mujoco.mjtTrn.mjTRN_JOINT
    ):
        return int(m.jnt_bodyid[m.actuator_trnid[obj, 0]])
    return 0

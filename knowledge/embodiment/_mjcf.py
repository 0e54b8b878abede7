"""Reading robot files: MuJoCo compiles an MJCF or URDF file; its arrays become descriptor parts.

URDF is first completed by the rules in `_urdf` (floating base, actuators, package URIs, xacro).

Compiling first resolves defaults, includes, angle units and `fromto` shorthands, so the parts say
what the body is, not how its file is written.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import EmbodimentError
from ._mesh_mass import MeshMass
from ._meshes import Bounds, extremes
from ._parts import (
    Actuator,
    Body,
    EmbodimentSite,
    Joint,
    Parts,
    Range,
    Sensor,
    check_finite,
    vec,
)
from ._scene import robot_only, with_armature_motors, with_floating_base
from ._trim import Plan, split, trim
from ._urdf import compile_urdf, drives, floats_by_default, prepare_urdf


def _read(path: Path) -> bytes:
    if not path.exists():
        raise EmbodimentError(f"{path}: no such file")
    if not path.is_file():
        raise EmbodimentError(f"{path}: not a regular file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise EmbodimentError(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def read_mjcf(source: str | os.PathLike[str], *, floating_base: bool | None = None) -> Parts:
    """The parts of an MJCF file, or of MJCF text (a string starting with `<`)."""
    return prepare_mjcf(source).parts(floating_base=floating_base)


@dataclass
class MjcfModel:
    """A parsed MJCF model whose geoms and meshes `_trim` has sorted, not yet compiled."""

    label: str
    load: Callable[[], Any]
    """Parses the source again: a spec compiles once, and the untrimmed fallback needs its own."""
    spec: Any
    plan: Plan

    def visual_files(self) -> set[str]:
        """`file` attributes the description does not read: textures, skins, and the meshes only
        visual geoms use (the descriptor cache leaves them out of its key)."""
        meshes = self.spec.meshes
        kept = {mesh.file for mesh in meshes if mesh.name in self.plan.physical}
        dropped = {mesh.file for mesh in meshes if mesh.name not in self.plan.physical}
        looks = {t.file for t in self.spec.textures} | {s.file for s in self.spec.skins}
        return (dropped - kept) | looks

    def parts(self, *, floating_base: bool | None = None) -> Parts:
        """Compile the trimmed spec (once). Should that fail, the file compiles as it is, with
        the same geoms ignored and the same mesh bounds: trimming never changes a description
        (but for the last digits of inertias weighed with numpy, `_mesh_mass`), nor turns a file
        MuJoCo reads into a refusal; the refusal is then the file's own. The robot is then told
        from its scene, and a welded walker given its free joint (`_scene`)."""
        trim(self.spec, self.plan)
        try:
            model, visual = self.spec.compile(), self.plan.visual
        except ValueError:
            spec = _parsed(self.label, self.load)
            visual = split(spec).visual
            model = _compiled(self.label, spec)
            boxed = {}
        else:
            boxed = {geom.id: self.plan.stand_ins[name] for geom, name in self.plan.boxed}
        if model.njnt == 0:
            raise EmbodimentError(
                f"{self.label}: the model has no joints, so there is no robot to describe"
            )
        parts = _describe(model, {geom.id for geom in visual}, self.plan.bounds, boxed)
        parts = robot_only(with_armature_motors(parts))
        return with_floating_base(self.label, check_finite(self.label, parts), floating_base)


def prepare_mjcf(source: str | os.PathLike[str]) -> MjcfModel:
    """Parse an MJCF file or text (checking the XML and its root element ourselves, for clearer
    messages) and find its visual geoms."""
    if isinstance(source, str) and source.lstrip().startswith("<"):
        label, text = "<MJCF text>", source.encode()
        parse: Callable[[], Any] = lambda: mujoco.MjSpec.from_string(source)  # noqa: E731
    else:
        path = Path(source)
        label, text = str(path), _read(path)
        parse = lambda: mujoco.MjSpec.from_file(str(path))  # noqa: E731

    def load() -> Any:
        """Parse, and merge meshes and textures that would compile alike (vendor models often
        name one file twice, for a visual and a collision geom): MuJoCo's own `dedup_assets`."""
        spec = parse()
        spec.dedup_assets()
        return spec

    _check_root(label, text, "mujoco")
    spec = _parsed(label, load)
    return MjcfModel(label, load, spec, split(spec))


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
    return check_finite(label, _describe(model))


def _check_root(label: str, text: bytes, root: str) -> None:
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


def _refusal(label: str, exc: ValueError) -> EmbodimentError:
    problem = " ".join(str(exc).split())
    return EmbodimentError(f"{label}: MuJoCo cannot compile it: {problem}")


def _parsed(label: str, load: Callable[[], Any]) -> Any:
    try:
        return load()
    except ValueError as exc:
        raise _refusal(label, exc) from exc


def _compiled(label: str, spec: Any) -> mujoco.MjModel:
    try:
        return spec.compile()
    except ValueError as exc:
        raise _refusal(label, exc) from exc


# -- reading the compiled model -------------------------------------------------------------------


def _enum(value: Any, enum: Any, prefix: str) -> Any:
    return enum(int(value)).name.removeprefix(prefix).lower()


def _describe(
    m: mujoco.MjModel,
    ignored: Iterable[int] = (),
    known: Mapping[str, Bounds] | None = None,
    boxed: Mapping[int, MeshMass] | None = None,
) -> Parts:
    """Read the compiled arrays. Model body b becomes descriptor body b - 1 (the world, -1).

    A body's extent reaches its sites and the far side of its geoms' bounding spheres, but not
    the `ignored` (visual) geoms'. A mesh's sphere is centred on its vertices' box (`_meshes`:
    the rule URDF collision meshes follow), from the `known` bounds read from its file or else
    from its compiled vertices, so that trimming a mesh to the vertices that keep its bounds
    changes nothing. A geom `_trim` made the inertia box of its mesh (`boxed`) reaches as far as
    that mesh's bounds."""

    def name(adr: int) -> str:
        return m.names[adr : m.names.index(b"\0", adr)].decode()

    def limits(limited: Any, values: np.ndarray) -> Range | None:
        return (float(values[0]), float(values[1])) if limited else None

    surface = np.linalg.norm(m.geom_pos, axis=1) + m.geom_rbound
    for g in np.flatnonzero((m.geom_type == mujoco.mjtGeom.mjGEOM_MESH) & (m.geom_dataid >= 0)):
        surface[g] = _mesh_surface(m, int(g), known or {}, name)
    for box, mass in (boxed or {}).items():
        surface[box] = _placed(m, box, mass.bounds, mass.centre, _rotation(mass.quat))
    physical = np.ones(m.ngeom, bool)
    physical[list(ignored)] = False
    extent = np.zeros(m.nbody)
    np.maximum.at(extent, m.geom_bodyid[physical], surface[physical])
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
            limits(m.jnt_limited[j], m.jnt_range[j]),
            float(m.dof_damping[m.jnt_dofadr[j]]),
            float(m.dof_armature[m.jnt_dofadr[j]]),
            float(m.dof_frictionloss[m.jnt_dofadr[j]]),
            limits(m.jnt_actfrclimited[j], m.jnt_actfrcrange[j]),
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
            limits(m.actuator_ctrllimited[a], m.actuator_ctrlrange[a]),
            limits(m.actuator_forcelimited[a], m.actuator_forcerange[a]),
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


def _rotation(quat: np.ndarray) -> np.ndarray:
    matrix = np.zeros(9)
    mujoco.mju_quat2Mat(matrix, quat)
    return matrix.reshape(3, 3)


def _mesh_surface(
    m: mujoco.MjModel, g: int, known: Mapping[str, Bounds], name: Callable[[int], str]
) -> float:
    """How far from its body's origin mesh geom `g` reaches: MuJoCo centres a mesh on its
    volume and turns it to its principal axes (`mesh_pos`, `mesh_quat`); the file's frame is
    placed back first."""
    mesh = int(m.geom_dataid[g])
    turn = _rotation(m.mesh_quat[mesh])
    found = known.get(name(m.name_meshadr[mesh]))
    if found is None:
        start, count = m.mesh_vertadr[mesh], m.mesh_vertnum[mesh]
        if count == 0:
            return float(np.linalg.norm(m.geom_pos[g]) + m.geom_rbound[g])
        # both float64 and contiguous: numpy multiplied float32 by a transposed float64 ten times
        # slower (the same numbers)
        points = np.asarray(m.mesh_vert[start : start + count], dtype=np.float64)
        found = extremes(points @ np.ascontiguousarray(turn.T) + m.mesh_pos[mesh])[0]
    return _placed(m, g, found, m.mesh_pos[mesh], turn)


def _placed(m: mujoco.MjModel, g: int, bounds: Bounds, pos: np.ndarray, turn: np.ndarray) -> float:
    """How far from its body's origin a mesh's bounding sphere (in the mesh file's frame) reaches
    in geom `g`, whose frame MuJoCo moved by `pos` and turned by `turn` from the file's."""
    centre, radius = bounds
    local = turn.T @ (centre - pos)
    return float(np.linalg.norm(m.geom_pos[g] + _rotation(m.geom_quat[g]) @ local) + radius)


def _inertia(m: mujoco.MjModel, b: int) -> Any:
    """The inertia tensor in body axes: unique, where principal axes are not (equal moments,
    signs)."""
    rot = _rotation(m.body_iquat[b])
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

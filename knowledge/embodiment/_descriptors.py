"""Robot bodies described from their MuJoCo-compiled models.

A descriptor says what a body *is* (kinematic tree, joints, actuators, masses, sensors), not how its file
is written: MuJoCo compiles the MJCF or URDF first, so defaults, includes, angle units and `fromto`
shorthands are resolved, and the parts are put in a canonical order so that the fingerprint names the
body, not the file.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import mujoco
import numpy as np

from .._canonical import canonical_json, content_hash
from .._errors import EmbodimentError

FORMAT = 1
"""Version of the `to_dict` layout; `from_dict` refuses other versions rather than guess."""

JointType = Literal["free", "ball", "slide", "hinge"]
Range = tuple[float, float]
Vec3 = tuple[float, float, float]

_JOINT_DOF = {"free": 6, "ball": 3, "slide": 1, "hinge": 1}
_JOINT_TRANSMISSIONS = frozenset({"joint", "jointinparent", "tendon"})
ACTUATOR_KINDS = ("motor", "position", "velocity", "muscle", "other")
_MAX_PARTS = 4096


@dataclass(frozen=True, slots=True)
class Body:
    """A rigid body. `parent` indexes `Embodiment.bodies`; -1 is the world."""

    name: str
    parent: int
    pos: Vec3
    """Frame offset from the parent; zero for bodies on the world, whose placement is not their shape."""
    quat: tuple[float, float, float, float]
    mass: float
    com: Vec3
    inertia: tuple[float, float, float, float, float, float]
    """Ixx Iyy Izz Ixy Ixz Iyz about the centre of mass, in body axes (unique, unlike principal axes)."""
    extent: float
    """Distance from the body origin to the farthest geom surface or site: the tip of a leaf link."""

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
    """An actuator. `target` holds joint indices for joint and tendon transmissions, else body indices."""

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
        """Whether `target` holds joint indices (joint and tendon transmissions) rather than body indices."""
        return self.transmission in _JOINT_TRANSMISSIONS


@dataclass(frozen=True, slots=True)
class EmbodimentSite:
    """An MJCF site: a named point fixed on a body (a tool tip, a sensor mount)."""

    name: str
    body: int
    pos: Vec3


@dataclass(frozen=True, slots=True)
class Sensor:
    """A sensor, attached to the body that carries the object it reads (-1: the world or a tendon)."""

    name: str
    type: str
    dim: int
    body: int


@dataclass(frozen=True)
class Embodiment:
    """The descriptor of a robot body, in canonical order. Build it with `from_mjcf`, `from_urdf` or `from_dict`."""

    name: str
    bodies: tuple[Body, ...] = field(repr=False)
    joints: tuple[Joint, ...] = field(repr=False)
    actuators: tuple[Actuator, ...] = field(repr=False)
    sites: tuple[EmbodimentSite, ...] = field(repr=False)
    sensors: tuple[Sensor, ...] = field(repr=False)

    @classmethod
    def from_mjcf(cls, source: str | os.PathLike[str]) -> Embodiment:
        """Describe an MJCF file, or MJCF text (a string starting with `<`; includes resolve from the cwd)."""
        if isinstance(source, str) and source.lstrip().startswith("<"):
            return _compile(
                "<MJCF text>", source.encode(), "mujoco", mujoco.MjModel.from_xml_string, source
            )
        path = Path(source)
        return _compile(str(path), _read(path), "mujoco", mujoco.MjModel.from_xml_path, str(path))

    @classmethod
    def from_urdf(cls, path: str | os.PathLike[str]) -> Embodiment:
        """Describe a URDF file. MuJoCo fuses links on fixed joints into their parent (the base into the world)."""
        path = Path(path)
        return _compile(str(path), _read(path), "robot", mujoco.MjModel.from_xml_path, str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Embodiment:
        """Read a descriptor from `to_dict` output (for example from a peer's record), checking every field."""
        where = "embodiment descriptor"
        if not isinstance(data, Mapping):
            raise EmbodimentError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise EmbodimentError(
                f"{where}: format {data.get('format')!r} is not {FORMAT}, the one this library reads"
            )
        unknown = set(data) - {"format", "name", *_PARTS, *_DERIVED}
        if unknown:
            raise EmbodimentError(f"{where}: unknown keys {sorted(unknown)}")
        parts = {key: _parse_list(kind, data.get(key), key) for key, kind in _PARTS.items()}
        embodiment = _canonical(_parse("text", data.get("name"), "name"), **parts)
        for key in _DERIVED:
            if key in data and data[key] != _plain(getattr(embodiment, key)):
                found = getattr(embodiment, key)
                raise EmbodimentError(
                    f"{where}: {key} says {data[key]!r} but the parts give {found!r}"
                )
        return embodiment

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, canonical form; totals and the fingerprint are included for readers and checked on reading.

        Canonicalized again first, so an Embodiment edited by hand (dataclasses.replace) round-trips too.
        """
        canon = _canonical(self.name, **{key: getattr(self, key) for key in _PARTS})
        data: dict[str, Any] = {"format": FORMAT, "name": canon.name}
        data.update({key: [_plain(item) for item in getattr(canon, key)] for key in _PARTS})
        data.update({key: _plain(getattr(canon, key)) for key in _DERIVED})
        return data

    @cached_property
    def fingerprint(self) -> str:
        """Hex SHA-256 of the compact, key-sorted JSON of `to_dict()` without names, totals and fingerprint.

        Names are labels, so renaming a joint keeps the fingerprint; any physical change alters it.
        """
        physical = {
            key: [_plain(item, names=False) for item in getattr(self, key)] for key in _PARTS
        }
        physical["format"] = FORMAT
        return content_hash(physical)

    @cached_property
    def dof(self) -> int:
        return sum(_JOINT_DOF[joint.type] for joint in self.joints)

    @cached_property
    def mass(self) -> float:
        return _num(math.fsum(body.mass for body in self.bodies))

    @cached_property
    def floating_base(self) -> bool:
        return any(joint.type == "free" for joint in self.joints)

    @cached_property
    def end_effectors(self) -> tuple[int, ...]:
        """Leaf bodies of moving chains: hands, fingertips, feet, wheels."""
        moving = self._moving()
        parents = {body.parent for body in self.bodies}
        return tuple(i for i in range(len(self.bodies)) if moving[i] and i not in parents)

    @cached_property
    def reach(self) -> float:
        """Longest path from a base (a body on the world) through link offsets to the tip of a moving body."""
        path = [0.0] * len(self.bodies)
        for i, body in enumerate(self.bodies):
            if body.parent >= 0:
                path[i] = path[body.parent] + body.link_length
        moving = self._moving()
        return _num(
            max((path[i] + b.extent for i, b in enumerate(self.bodies) if moving[i]), default=0.0)
        )

    def _moving(self) -> list[bool]:
        """Whether each body has a joint on itself or an ancestor (parents precede children)."""
        jointed = {joint.body for joint in self.joints}
        moving: list[bool] = []
        for i, body in enumerate(self.bodies):
            moving.append(i in jointed or (body.parent >= 0 and moving[body.parent]))
        return moving

    def __repr__(self) -> str:
        return f"Embodiment({self.name!r}, dof={self.dof}, mass={self.mass}, fingerprint={self.fingerprint[:12]!r})"


_PARTS: dict[str, type] = {
    "bodies": Body,
    "joints": Joint,
    "actuators": Actuator,
    "sites": EmbodimentSite,
    "sensors": Sensor,
}
_DERIVED = ("dof", "mass", "reach", "end_effectors", "fingerprint")
_REFS = frozenset({"parent", "body", "target"})


# -- reading files -----------------------------------------------------------------------------------


def _read(path: Path) -> bytes:
    if not path.exists():
        raise EmbodimentError(f"{path}: no such file")
    if not path.is_file():
        raise EmbodimentError(f"{path}: not a regular file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise EmbodimentError(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def _compile(
    label: str, text: bytes, root: str, compile_: Callable[[str], mujoco.MjModel], arg: str
) -> Embodiment:
    """Check the XML and its root element ourselves (clearer messages), then let MuJoCo compile it."""
    try:
        tag = ET.fromstring(text).tag
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
        if b"package://" in text:
            problem += (
                "; the file names meshes by package:// URIs, which MuJoCo cannot resolve:"
                " rewrite them as paths relative to the file"
            )
        raise EmbodimentError(f"{label}: MuJoCo cannot compile it: {problem}") from exc
    if model.njnt == 0:
        raise EmbodimentError(f"{label}: the model has no joints, so there is no robot to describe")
    return _describe(model)


# -- reading the compiled model ----------------------------------------------------------------------


def _enum(value: Any, enum: Any, prefix: str) -> Any:
    return enum(int(value)).name.removeprefix(prefix).lower()


def _describe(m: mujoco.MjModel) -> Embodiment:
    """Read the compiled arrays. Model body b becomes descriptor body b - 1 (the world becomes -1)."""

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
            (0.0, 0.0, 0.0) if m.body_parentid[b] == 0 else _vec(m.body_pos[b]),
            _vec(m.body_quat[b]),
            float(m.body_mass[b]),
            _vec(m.body_ipos[b]),
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
            _vec(m.jnt_axis[j]),
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
            _vec(m.actuator_gear[a]),
            float(m.actuator_gainprm[a, 0]),
            _vec(m.actuator_biasprm[a, :3]),
            bounds(m.actuator_ctrllimited[a], m.actuator_ctrlrange[a]),
            bounds(m.actuator_forcelimited[a], m.actuator_forcerange[a]),
        )
        for a in range(m.nu)
    ]
    sites = [
        EmbodimentSite(name(m.name_siteadr[s]), int(m.site_bodyid[s]) - 1, _vec(m.site_pos[s]))
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
    return _canonical(name(0), bodies, joints, actuators, sites, sensors)


def _inertia(m: mujoco.MjModel, b: int) -> Any:
    """The inertia tensor in body axes: unique, where principal axes are not (equal moments, signs)."""
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, m.body_iquat[b])
    rot = rot.reshape(3, 3)
    tensor = rot @ np.diag(m.body_inertia[b]) @ rot.T
    tensor[np.abs(tensor) < 1e-9 * max(float(np.abs(np.diag(tensor)).max()), 1e-300)] = (
        0.0  # rotation noise
    )
    return _vec(
        [tensor[0, 0], tensor[1, 1], tensor[2, 2], tensor[0, 1], tensor[0, 2], tensor[1, 2]]
    )


def _actuator_target(m: mujoco.MjModel, a: int) -> tuple[int, ...]:
    """Joints (or, for site and body transmissions, bodies) that actuator `a` moves, in descriptor indices."""
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
    """What the control signal means, from MuJoCo's gain and bias: force, target position or velocity."""
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


# -- canonical order ---------------------------------------------------------------------------------


def _canonical(
    name: str, bodies: Any, joints: Any, actuators: Any, sites: Any, sensors: Any
) -> Embodiment:
    """Round every number, check every index, and order the parts so that sibling order cannot show.

    Each body's subtree gets a hash of its own content (joints, sites, sensors and actuators attached to it,
    names left out) and of its children's hashes; siblings are visited in hash order, names breaking ties.
    """
    bodies, joints, actuators, sites, sensors = (
        [_rounded(item) for item in part] for part in (bodies, joints, actuators, sites, sensors)
    )
    n = len(bodies)
    refs = [(f"bodies[{i}].parent", b.parent, -1, i) for i, b in enumerate(bodies)]
    refs += [(f"joints[{i}].body", j.body, 0, n) for i, j in enumerate(joints)]
    refs += [(f"sites[{i}].body", x.body, -1, n) for i, x in enumerate(sites)]
    refs += [(f"sensors[{i}].body", x.body, -1, n) for i, x in enumerate(sensors)]
    refs += [
        (f"actuators[{i}].target", t, *((0, len(joints)) if a.moves_joints else (-1, n)))
        for i, a in enumerate(actuators)
        for t in a.target
    ]
    for where, ref, low, high in refs:
        if not low <= ref < high:
            raise EmbodimentError(f"embodiment: {where} is {ref}, outside {low}..{high - 1}")

    local: list[list[Any]] = [[_plain(b, names=False, refs=False), [], [], [], []] for b in bodies]
    position_in_body: dict[int, int] = {}
    for j, joint in enumerate(joints):
        position_in_body[j] = len(local[joint.body][1])
        local[joint.body][1].append(_plain(joint, names=False, refs=False))
    for site in sites:
        if site.body >= 0:
            local[site.body][2].append(_plain(site, names=False, refs=False))
    for sensor in sensors:
        if sensor.body >= 0:
            local[sensor.body][3].append(_plain(sensor, names=False, refs=False))
    for act in actuators:
        if act.moves_joints and len(act.target) == 1:
            owner, where = joints[act.target[0]].body, position_in_body[act.target[0]]
        elif not act.moves_joints and len(act.target) == 1 and act.target[0] >= 0:
            owner, where = act.target[0], -1
        else:
            continue  # multi-joint tendons join the order after the bodies are placed
        local[owner][4].append([_plain(act, names=False, refs=False), where])

    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, body in enumerate(bodies):
        (children[body.parent] if body.parent >= 0 else roots).append(i)
    digest = [""] * n
    for i in reversed(range(n)):
        content = [
            local[i][0],
            local[i][1],
            *(sorted(canonical_json(x).decode() for x in part) for part in local[i][2:]),
        ]
        digest[i] = content_hash([content, sorted(digest[c] for c in children[i])])

    def rank(i: int) -> tuple[str, str, int]:
        return digest[i], bodies[i].name, i

    order: list[int] = []
    stack = sorted(roots, key=rank, reverse=True)
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(sorted(children[i], key=rank, reverse=True))
    new_body = {old: new for new, old in enumerate(order)}
    new_body[-1] = -1

    def body_of(item: Any) -> Any:
        return item.__class__(**{**_fields(item), "body": new_body[item.body]})

    placed_joints = sorted(range(len(joints)), key=lambda j: (new_body[joints[j].body], j))
    new_joint = {old: new for new, old in enumerate(placed_joints)}

    def retarget(act: Actuator) -> Actuator:
        table = new_joint if act.moves_joints else new_body
        return Actuator(**{**_fields(act), "target": tuple(sorted(table[t] for t in act.target))})

    def by_content(item: Any) -> tuple[Any, ...]:
        ref = item.target if isinstance(item, Actuator) else item.body
        return ref, canonical_json(_plain(item, names=False, refs=False)), item.name

    return Embodiment(
        name=name,
        bodies=tuple(
            Body(**{**_fields(bodies[old]), "parent": new_body[bodies[old].parent]})
            for old in order
        ),
        joints=tuple(body_of(joints[old]) for old in placed_joints),
        actuators=tuple(sorted(map(retarget, actuators), key=by_content)),
        sites=tuple(sorted(map(body_of, sites), key=by_content)),
        sensors=tuple(sorted(map(body_of, sensors), key=by_content)),
    )


# -- numbers and plain data --------------------------------------------------------------------------


def _num(x: float) -> float:
    """Six significant digits, tiny values to zero: compiled numbers differ in last bits between
    equivalent files (summation order), and the fingerprint must not see that."""
    if not math.isfinite(x):
        raise EmbodimentError(f"embodiment: non-finite number {x}")
    return 0.0 if abs(x) < 1e-12 else float(f"{x:.6g}") + 0.0


def _vec(values: Any) -> Any:
    """A tuple of Python floats (of whatever length the field has)."""
    return tuple(float(v) for v in values)


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, tuple) and value and isinstance(value[0], float):
        return tuple(_num(v) for v in value)
    return value


def _rounded(item: Any) -> Any:
    values = {key: _round(value) for key, value in _fields(item).items()}
    if isinstance(item, Body) and next((q for q in values["quat"] if q != 0), 1.0) < 0:
        values["quat"] = tuple(0.0 - q for q in values["quat"])  # q and -q are one rotation
    return item.__class__(**values)


def _fields(item: Any) -> dict[str, Any]:
    return {f.name: getattr(item, f.name) for f in fields(item)}


def _plain(value: Any, *, names: bool = True, refs: bool = True) -> Any:
    """JSON-safe form of a part, optionally without its name and its indices into other parts."""
    if hasattr(value, "__dataclass_fields__"):
        return {
            key: _plain(v)
            for key, v in _fields(value).items()
            if (names or key != "name") and (refs or key not in _REFS)
        }
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# -- checking plain data -----------------------------------------------------------------------------

_SCHEMA: dict[type, dict[str, Any]] = {
    # field kinds: "text", "int", "num", N (a list of N numbers), "range" (two numbers or null),
    # "ints" (a list of indices), or a tuple of the allowed strings
    Body: dict(
        name="text", parent="int", pos=3, quat=4, mass="num", com=3, inertia=6, extent="num"
    ),
    Joint: dict(
        name="text",
        body="int",
        type=tuple(_JOINT_DOF),
        axis=3,
        range="range",
        damping="num",
        armature="num",
        frictionloss="num",
        force_range="range",
    ),
    Actuator: dict(
        name="text",
        transmission="text",
        target="ints",
        kind=ACTUATOR_KINDS,
        gear=6,
        gain="num",
        bias=3,
        ctrl_range="range",
        force_range="range",
    ),
    EmbodimentSite: dict(name="text", body="int", pos=3),
    Sensor: dict(name="text", type="text", dim="int", body="int"),
}


def _fail(where: str, what: str, value: Any) -> EmbodimentError:
    return EmbodimentError(f"embodiment descriptor: {where} must be {what}, got {value!r:.80}")


def _parse(kind: Any, value: Any, where: str) -> Any:
    """One field of plain data, checked against its kind in `_SCHEMA` (bools are not numbers)."""
    if kind == "range":
        return None if value is None else _parse(2, value, where)
    if isinstance(kind, int) or kind == "ints":
        size, item = (kind, "num") if isinstance(kind, int) else (None, "int")
        if (
            not isinstance(value, list)
            or len(value) != (size or len(value))
            or len(value) > _MAX_PARTS
        ):
            raise _fail(where, f"a list of {size or 'at most ' + str(_MAX_PARTS)} {item}s", value)
        return tuple(_parse(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(kind, tuple):
        if value not in kind:
            raise _fail(where, f"one of {list(kind)}", value)
        return value
    if kind == "text" and not (isinstance(value, str) and len(value) <= 200):
        raise _fail(where, "a string of at most 200 characters", value)
    if kind == "int" and type(value) is not int:
        raise _fail(where, "an integer", value)
    if kind == "num":
        if type(value) not in (int, float) or not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        return float(value)
    return value


def _parse_list(part: type, value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > _MAX_PARTS:
        raise _fail(where, f"a list of at most {_MAX_PARTS} objects", value)
    schema, parsed = _SCHEMA[part], []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or set(item) != set(schema):
            raise _fail(f"{where}[{i}]", f"an object with keys {sorted(schema)}", item)
        parsed.append(
            part(
                **{
                    key: _parse(kind, item[key], f"{where}[{i}].{key}")
                    for key, kind in schema.items()
                }
            )
        )
    return parsed

"""Reading URDF: what MuJoCo's URDF import leaves out, filled in from the file before it compiles.

MuJoCo welds a URDF's root link to the world and makes no actuators, so a legged robot would read as
a fixed, unactuated body. Before compiling, the file is rewritten (`prepare_urdf`), and the spec
edited (`compile_urdf`), by these rules:

- xacro: a file in the xacro namespace (or named `*.xacro`) is expanded by the `xacro` package
  (ROS's own, on PyPI) when it is installed, with `$(find pkg)` resolved from the package search
  path below; without it the file is refused, saying so.
- `package://NAME/...` mesh URIs resolve by `knowledge.resolve_package_uri` (the one search order,
  shared with sim's task files): the `package_path` argument, then `ROS_PACKAGE_PATH`, then the
  file's own folders. `file://` URIs and relative names resolve as paths.
- Visual elements are dropped: they do not change the physics, and reading their meshes was most
  of the time a first query took. In a link whose `<inertial>` is given, a collision mesh only
  bounds the link's extent, so it becomes its bounding sphere (`_meshes`: STL and OBJ read with
  numpy, not compiled by MuJoCo); one in another format (COLLADA `.dae`) is dropped. In a link
  without `<inertial>`, MuJoCo infers the inertia from the mesh, so it stays.
- Floating base: `floating_base=True` or `False` decides. By default (None) a robot floats when its
  root link is not the `world` link and it has legs or wheels: at least two legs (movable chains
  from the root with two or more joints that point down at the zero pose, URDF's z being up, or
  whose joints or links are named as legs: leg, hip, thigh, knee, calf, shin, foot, toe, ...), or
  at least two joints that turn freely (continuous, or wider than a full turn) on links with no
  movable joint below them (wheels, propellers).
  Arms, hands and pendulums stay fixed.
- Actuators: a movable joint is actuated when a `<transmission>` drives it (state-only interfaces
  do not), with the kind its hardware interface names (effort: motor, position, velocity; none:
  motor), or else when its `<limit effort>` is positive (a motor). Mimic joints follow their
  leader and get none. A motor's control is the
  joint torque or force, limited to the effort; a position or velocity servo's gain reaches the
  effort limit at an error of 0.1 (rad or m) or of a tenth of the velocity limit.
- Inertias: MuJoCo refuses inertias that no rigid body has. `balance_inertia=True` repairs them:
  a full inertia that is not positive definite keeps its diagonal, MuJoCo's `balanceinertia`
  raises the smallest moment until the triangle inequality holds, and massless links that carry
  a joint (a split multi-axis joint) get 1e-6 kg (`boundmass`).
"""

from __future__ import annotations

import math
import os
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import EmbodimentError
from .._packages import PACKAGE_SCHEME, PackageNotFoundError, resolve_package_uri
from ._meshes import MESH_FORMATS, bounding_sphere

XACRO_NS = "http://www.ros.org/wiki/xacro"
_MOVABLE = frozenset({"revolute", "continuous", "prismatic"})
_KINDS = {"effort": "motor", "position": "position", "velocity": "velocity"}
_SERVO_ERROR = 0.1
_xacro_lock = threading.Lock()
PackagePath = list[str | os.PathLike[str]]


@dataclass(frozen=True, slots=True)
class _Drive:
    joint: str
    kind: str
    effort: float | None
    velocity: float | None
    range: tuple[float, float] | None


def prepare_urdf(
    label: str,
    path: Path,
    text: bytes,
    *,
    package_path: Iterable[str | os.PathLike[str]] | None,
    balance_inertia: bool,
) -> tuple[str, ET.Element]:
    """The URDF text MuJoCo will compile, and its parsed tree (for the mobility and drive rules)."""
    roots = list(package_path or ())
    robot = _parse(label, text)
    if path.name.endswith(".xacro") or uses_xacro(robot):
        robot = _parse(label, _expand_xacro(label, path, roots))
    if robot.tag != "robot":
        hint = "; it is MJCF: use Embodiment.from_mjcf" if robot.tag == "mujoco" else ""
        raise EmbodimentError(f"{label}: the root element is <{robot.tag}>, not <robot>{hint}")
    _check_vectors(label, robot)
    for link in robot.iter("link"):
        for visual in link.findall("visual"):
            link.remove(visual)
        for collision in link.findall("collision"):
            mesh = collision.find("geometry/mesh")
            if mesh is None:
                continue
            resolved = resolve_mesh(label, path, mesh.get("filename", ""), roots)
            if resolved.suffix.lower() not in MESH_FORMATS:
                link.remove(collision)
            elif link.find("inertial") is None:
                mesh.set("filename", str(resolved))  # MuJoCo infers the link's inertia from it
            else:
                _as_sphere(label, collision, mesh, resolved)
    if balance_inertia:
        for inertia in robot.iter("inertia"):
            _diagonal_if_not_positive(inertia)
    extension = robot.find("mujoco")
    if extension is None:
        extension = ET.SubElement(robot, "mujoco")
    compiler = extension.find("compiler")
    if compiler is None:
        compiler = ET.SubElement(extension, "compiler")
    compiler.set("discardvisual", "true")
    compiler.set("strippath", "false")  # mesh names are absolute now
    compiler.attrib.pop("meshdir", None)
    if balance_inertia:
        compiler.set("balanceinertia", "true")
        compiler.set("boundmass", "1e-6")  # massless links that carry a joint (split joints)
        compiler.set("boundinertia", "1e-9")
    return ET.tostring(robot, encoding="unicode"), robot


def _check_vectors(label: str, robot: ET.Element) -> None:
    """Say which joint or link has a malformed origin or axis (MuJoCo's message would point into
    the rewritten text, not the file)."""
    for owner in [*robot.iter("joint"), *robot.iter("link")]:
        for element in owner.iter():
            for key in ("xyz", "rpy") if element.tag in ("origin", "axis") else ():
                value = element.get(key)
                if value is not None and _floats(value, (math.nan,) * 3)[0] is math.nan:
                    raise EmbodimentError(
                        f"{label}: {owner.tag} {owner.get('name')!r} has <{element.tag}"
                        f' {key}="{value}">, which is not three numbers'
                    )


def _parse(label: str, text: bytes) -> ET.Element:
    try:
        return ET.fromstring(text.lstrip())  # blank lines before the XML declaration
    except ET.ParseError as exc:
        raise EmbodimentError(f"{label}: XML syntax error: {exc}") from exc


def uses_xacro(robot: ET.Element) -> bool:
    """Xacro elements or `${...}` expressions (expanded files often still declare the namespace)."""
    prefix = "{%s}" % XACRO_NS
    return any(
        element.tag.startswith(prefix) or any("${" in v for v in element.attrib.values())
        for element in robot.iter()
    )


def resolve_mesh(label: str, path: Path, name: str, package_path: PackagePath) -> Path:
    """The file a URDF mesh `filename` names: `package://` URIs by the one search order
    (`knowledge._packages`), `file://` URIs and other names as paths from the URDF's folder."""
    if name.startswith(PACKAGE_SCHEME):
        try:
            return resolve_package_uri(name, package_path=package_path, relative_to=path)
        except PackageNotFoundError as exc:
            raise exc.at(label) from None
    name = name.removeprefix("file://")
    return Path(name) if os.path.isabs(name) else path.parent / name


def _as_sphere(label: str, collision: ET.Element, mesh: ET.Element, file: Path) -> None:
    """Replace a mesh by its bounding sphere (`_meshes`): its extent without MuJoCo's mesh work."""
    if not file.is_file():
        raise EmbodimentError(f"{label}: collision mesh {file} does not exist")
    scale = np.array(_floats(mesh.get("scale"), (1.0, 1.0, 1.0)))
    centre, radius = bounding_sphere(label, file, scale)
    origin = collision.find("origin")
    if origin is None:
        origin = ET.SubElement(collision, "origin")
    xyz = np.array(_floats(origin.get("xyz"), (0.0, 0.0, 0.0)))
    xyz = xyz + _rotation(_floats(origin.get("rpy"), (0.0, 0.0, 0.0))) @ centre
    origin.set("xyz", " ".join(repr(float(v)) for v in xyz))
    geometry = collision.find("geometry")
    assert geometry is not None
    geometry.remove(mesh)
    ET.SubElement(geometry, "sphere", radius=repr(max(radius, 1e-6)))


def _diagonal_if_not_positive(inertia: ET.Element) -> None:
    keys = ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")
    try:
        xx, xy, xz, yy, yz, zz = (float(inertia.get(k, "0")) for k in keys)
    except ValueError:
        return  # MuJoCo names the bad number
    matrix = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    if np.linalg.eigvalsh(matrix).min() <= 0:
        for key in ("ixy", "ixz", "iyz"):
            inertia.set(key, "0")


def _expand_xacro(label: str, path: Path, roots: PackagePath) -> bytes:
    """The URDF a xacro file expands to, with `$(find pkg)` looked up on the search path."""
    try:
        import xacro
        import xacro.substitution_args as substitution
    except ImportError:
        raise EmbodimentError(
            f"{label}: it is a xacro file, and the xacro package is not installed: install it"
            f" (pip install xacro) or expand the file first (xacro {path.name} > robot.urdf)"
        ) from None

    def find(package: str) -> str:
        try:
            uri = f"{PACKAGE_SCHEME}{package}"
            return str(resolve_package_uri(uri, package_path=roots, relative_to=path))
        except PackageNotFoundError as exc:
            raise exc.at(f"{label}: $(find {package})") from None

    with _xacro_lock:  # xacro keeps its state in module globals
        original = substitution._eval_find
        substitution._eval_find = find
        try:
            return xacro.process_file(str(path)).toxml().encode()
        except EmbodimentError:
            raise
        except Exception as exc:  # xacro raises its own and plain exceptions
            raise EmbodimentError(f"{label}: xacro cannot expand it: {exc}") from exc
        finally:
            substitution._eval_find = original


# -- the rules that need the tree --------------------------------------------------------------


def _floats(text: str | None, default: tuple[float, ...]) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in (text or "").split())
    except ValueError:
        return default
    return values if len(values) == len(default) else default


def _rotation(rpy: tuple[float, ...]) -> np.ndarray:
    (cr, sr), (cp, sp), (cy, sy) = ((math.cos(a), math.sin(a)) for a in rpy)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


def _link(joint: ET.Element, end: str) -> str:
    element = joint.find(end)
    return "" if element is None else element.get("link", "")


def _movable(joint: ET.Element) -> bool:
    return joint.get("type") in _MOVABLE and joint.find("mimic") is None


_LEG_WORDS = frozenset(
    {"leg", "legs", "hip", "thigh", "knee", "calf", "shin", "shank", "foot", "feet", "toe", "toes"}
    | {"ankle", "paw"}
)


def named_as_leg(names: Iterable[str]) -> bool:
    """Whether one of a limb's joint or link names names part of a leg (`FR_upper_leg`, `LHipYaw`,
    `hip0`): a word of the name, split at underscores, digits and capitals, ends with a leg word
    (`upperleg` does, `base_footprint` does not)."""
    words = {w.lower() for n in names for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", n)}
    return any(w.endswith(leg) for w in words for leg in _LEG_WORDS)


def _names(joints: list[ET.Element]) -> list[str]:
    return [j.get("name", "") for j in joints] + [_link(j, "child") for j in joints]


def floats_by_default(robot: ET.Element) -> bool:
    """The default floating-base rule (module docstring): not on `world`, and legs or wheels."""
    joints = [j for j in robot.findall("joint") if _link(j, "child") and _link(j, "parent")]
    children: dict[str, list[ET.Element]] = {}
    for joint in joints:
        children.setdefault(_link(joint, "parent"), []).append(joint)
    child_links = {_link(j, "child") for j in joints}
    roots = [link.get("name", "") for link in robot.findall("link")]
    roots = [name for name in roots if name not in child_links]
    if len(roots) != 1 or roots[0] == "world":
        return False  # welded to the world, or not a tree (MuJoCo will say so)

    def below(link: str) -> list[ET.Element]:
        """Every joint in the subtree of `link`."""
        found, stack = [], list(children.get(link, ()))
        while stack:
            joint = stack.pop()
            found.append(joint)
            stack.extend(children.get(_link(joint, "child"), ()))
        return found

    # link frames at the zero pose, and the limbs: the first movable joints below the root
    position, rotation = {roots[0]: np.zeros(3)}, {roots[0]: np.eye(3)}
    limbs: list[ET.Element] = []
    stack = [(roots[0], False)]
    while stack:
        link, inside = stack.pop()
        for joint in children.get(link, ()):
            child, origin = _link(joint, "child"), joint.find("origin")
            if child in position:
                continue  # a loop: MuJoCo will say so
            xyz = _floats(None if origin is None else origin.get("xyz"), (0.0, 0.0, 0.0))
            rpy = _floats(None if origin is None else origin.get("rpy"), (0.0, 0.0, 0.0))
            position[child] = position[link] + rotation[link] @ np.array(xyz)
            rotation[child] = rotation[link] @ _rotation(rpy)
            if _movable(joint) and not inside:
                limbs.append(joint)
            stack.append((child, inside or _movable(joint)))

    legs = 0
    for limb in limbs:
        inner = [limb, *below(_link(limb, "child"))]
        points = np.array([position[_link(j, "child")] for j in inner])
        reach = float(np.linalg.norm(points - points[0], axis=1).max())
        drop = float(points[0, 2] - points[:, 2].min())
        down = reach > 0 and drop >= 0.5 * reach
        legs += sum(map(_movable, inner)) >= 2 and (down or named_as_leg(_names(inner)))
    wheels = sum(
        _turns(joint) and joint.find("mimic") is None and not any(map(_movable, below(child)))
        for joint in joints
        for child in [_link(joint, "child")]
    )
    return legs >= 2 or wheels >= 2


def _turns(joint: ET.Element) -> bool:
    """Continuous, or revolute with a range wider than a full turn (a wheel or a propeller)."""
    if joint.get("type") == "continuous":
        return True
    low, high = _number(joint.find("limit"), "lower"), _number(joint.find("limit"), "upper")
    return (
        joint.get("type") == "revolute"
        and low is not None
        and high is not None
        and (high - low > 2 * math.pi)
    )


def drives(robot: ET.Element) -> list[_Drive]:
    """The joints to actuate and how (module docstring), in file order."""
    joints = {j.get("name", ""): j for j in robot.findall("joint") if _movable(j)}
    kinds: dict[str, str] = {}
    for transmission in robot.iter("transmission"):
        for joint in transmission.findall("joint"):
            name = joint.get("name", "")
            interfaces = [
                (e.text or "").rsplit("/", 1)[-1].lower() for e in joint.iter("hardwareInterface")
            ]
            if name not in joints or any("state" in i for i in interfaces):
                continue  # fixed or mimic joints, and read-only interfaces, drive nothing
            kind = next(
                (k for w, k in _KINDS.items() for i in interfaces if i.startswith(w)), "motor"
            )
            kinds.setdefault(name, kind)
    found = []
    for name, joint in joints.items():
        limit = joint.find("limit")
        effort = abs(_number(limit, "effort") or 0.0)
        if name not in kinds and not effort:
            continue
        low, high = _number(limit, "lower"), _number(limit, "upper")
        bounds = None
        if joint.get("type") != "continuous" and low is not None and high is not None:
            bounds = (low, high) if low < high else None
        velocity = abs(_number(limit, "velocity") or 0.0) or None
        found.append(_Drive(name, kinds.get(name, "motor"), effort or None, velocity, bounds))
    return found


def _number(element: ET.Element | None, key: str) -> float | None:
    value = None if element is None else element.get(key)
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def compile_urdf(label: str, text: str, floating: bool, actuated: list[_Drive]) -> Any:
    """Compile the prepared URDF, with a free joint on the root body and the drives added."""
    try:
        spec = mujoco.MjSpec.from_string(text)
        if floating:
            root = spec.worldbody.first_body()
            if root is not None:
                root.add_freejoint(name=f"{root.name}_free" if root.name else "root")
        for drive in actuated:
            _add_actuator(spec, drive)
        return spec.compile()
    except ValueError as exc:
        problem = re.sub(r",? line \d+", "", " ".join(str(exc).split()))  # of the rewritten text
        if any(w in problem for w in ("balanceinertia", "positive eigenvalues", "mjMINVAL")):
            problem += (
                "; Embodiment.from_urdf(..., balance_inertia=True) repairs such inertias"
                " (simnet: --balance-inertia)"
            )
        raise EmbodimentError(f"{label}: MuJoCo cannot compile it: {problem}") from exc


def _add_actuator(spec: Any, drive: _Drive) -> None:
    act = spec.add_actuator(name=drive.joint, target=drive.joint)
    act.trntype = mujoco.mjtTrn.mjTRN_JOINT
    effort = drive.effort
    if drive.kind == "motor":
        if effort:
            act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.ctrlrange = [-effort, effort]
        return
    if effort:
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = [-effort, effort]
    act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
    if drive.kind == "position":
        gain = (effort or 1.0) / _SERVO_ERROR
        act.gainprm[0], act.biasprm[1] = gain, -gain
        if drive.range:
            act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.ctrlrange = list(drive.range)
    else:
        gain = (effort or 1.0) / (_SERVO_ERROR * (drive.velocity or 1.0))
        act.gainprm[0], act.biasprm[2] = gain, -gain
        if drive.velocity:
            act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
            act.ctrlrange = [-drive.velocity, drive.velocity]

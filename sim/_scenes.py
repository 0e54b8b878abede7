"""A task builder's scene: MJCF text, an MJCF file or a URDF file read into a model spec with the
files it loads bundled (`sim._assets.bundle`), compiled with errors that name the scene, and
written back into a `Task` that carries those files.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from knowledge import sha256_hex

from ._assets import bundle, drop_visual_meshes
from ._errors import TaskDefinitionError
from ._tasks import Task

Scene = str | os.PathLike[str]
"""MJCF text (a string starting with `<`), or the path of an MJCF or URDF file."""


def load_scene(
    scene: Scene, package_path: Sequence[str | os.PathLike[str]], balance_inertia: bool = False
) -> tuple[Any, str]:
    """The model spec of MJCF text, an MJCF file or a URDF file, with the files it loads read and
    renamed (`bundle`: the spec compiles from their bytes), and how to name it in errors.

    Bodies without joints stay bodies (MuJoCo fuses them into their parents when reading URDF):
    a URDF's tool frame can be the end effector, and the target a reach task adds stays a body.
    """
    if isinstance(scene, str) and scene.lstrip().startswith("<"):
        source = "the scene"
        try:
            spec = mujoco.MjSpec.from_string(scene)
        except ValueError as exc:
            raise TaskDefinitionError("scene", f"MuJoCo cannot read it: {_one_line(exc)}") from exc
    else:
        path = Path(scene)
        source = str(path)
        if not path.is_file():
            raise TaskDefinitionError("scene", f"{path}: no such file (nor MJCF text)")
        try:
            spec = mujoco.MjSpec.from_file(source)
        except ValueError as exc:
            detail = f"{path}: MuJoCo cannot read it: {_one_line(exc)}"
            raise TaskDefinitionError("scene", detail) from exc
        spec.modelname = spec.modelname or path.stem
    spec.compiler.fusestatic = False
    if balance_inertia:
        _balance_inertia(spec)
    bundle(spec, package_path=package_path)
    return spec, source


def _balance_inertia(spec: Any) -> None:
    """`Embodiment.from_urdf(balance_inertia=True)`'s repairs, on the spec (a task is compiled
    from it, not from the file)."""
    for body in spec.bodies:
        full = np.asarray(body.fullinertia)  # ixx iyy izz ixy ixz iyz, NaN when not given
        if np.isnan(full[0]):
            continue
        xx, yy, zz, xy, xz, yz = full
        if np.linalg.eigvalsh(np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])).min() <= 0:
            body.fullinertia = [xx, yy, zz, 0.0, 0.0, 0.0]
    spec.compiler.balanceinertia = True
    spec.compiler.boundmass = 1e-6
    spec.compiler.boundinertia = 1e-9


@dataclass(frozen=True, slots=True)
class JointLimit:
    """A URDF joint's `<limit effort velocity>`, each positive, or None where the file gives none
    (or 0), read as `Embodiment.from_urdf` reads them."""

    effort: float | None
    velocity: float | None


def urdf_limits(scene: Scene) -> dict[str, JointLimit] | None:
    """Joint name -> its limits, when `scene` is a URDF (its root element is `<robot>`, which is how
    MuJoCo tells the two apart); None for MJCF. Called after `load_scene` has read the scene."""
    try:
        if isinstance(scene, str) and scene.lstrip().startswith("<"):
            root = ElementTree.fromstring(scene)
        else:
            root = ElementTree.parse(scene).getroot()
    except (OSError, ElementTree.ParseError):
        return None  # MuJoCo read it (xacro, entities): not a URDF this can read, so no limits
    if root.tag != "robot":
        return None
    limits = {}
    for joint in root.findall("joint"):  # not a <transmission>'s <joint>
        limit = joint.find("limit")
        limits[joint.get("name", "")] = JointLimit(
            _positive(limit, "effort"), _positive(limit, "velocity")
        )
    return limits


def _positive(limit: ElementTree.Element | None, key: str) -> float | None:
    try:
        value = abs(float(limit.get(key, "0"))) if limit is not None else 0.0
    except ValueError:
        return None
    return value if 0.0 < value < float("inf") else None


MESH_FORMATS = "STL, OBJ and MSH"  # what MuJoCo reads (4.0: no decoder for any other format)


def compile_scene(spec: Any, source: str) -> mujoco.MjModel:
    try:
        return spec.compile()
    except ValueError as exc:
        problem = _one_line(exc)
        if any(w in problem for w in ("balanceinertia", "positive eigenvalues", "mjMINVAL")):
            problem += "; balance_inertia=True repairs such inertias"
        if "no decoder found for mesh file" in problem:
            problem = f"{_unreadable_meshes(spec)}; MuJoCo says: {problem}"
        raise TaskDefinitionError("scene", f"{source}: does not compile: {problem}") from exc


def _unreadable_meshes(spec: Any) -> str:
    """What to do about meshes in formats MuJoCo has no decoder for (a URDF's COLLADA `.dae`,
    common in ROS packages): `Embodiment.from_urdf` leaves such collision meshes out, but a task
    simulates the robot and cannot."""
    suffixes = {".stl", ".obj", ".msh"}
    files = sorted({m.file for m in spec.meshes if Path(m.file).suffix.lower() not in suffixes})
    kinds = sorted({Path(f).suffix.lower() or "without a suffix" for f in files})
    named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    collada = " (COLLADA)" if ".dae" in kinds else ""
    return (
        f"MuJoCo reads {MESH_FORMATS} meshes, not {'/'.join(kinds) or 'this format'}{collada}: "
        f"{named or 'a mesh'}. Convert them to STL or OBJ (e.g. `assimp export in.dae out.stl`; "
        "Blender and MeshLab also do), point the robot file's mesh file names at the converted "
        "copies (for package:// URIs, in a copy of the package that package_path=[...] lists "
        "first) and build from that file"
    )


def scene_task(spec: Any, source: str, definition: dict[str, Any]) -> Task:
    """The task of `definition` on the scene `spec` holds, carrying the files its physics loads
    (`drop_visual_meshes`)."""
    drop_visual_meshes(spec)
    compile_scene(spec, source)
    files = dict(spec.assets)
    definition["scene"] = str(spec.to_xml())
    if files:
        definition["assets"] = {name: sha256_hex(data) for name, data in sorted(files.items())}
    return Task(definition, files)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())

"""MJCF trimmed to its physics before MuJoCo compiles it.

Vendor MJCF models draw each link with detailed visual meshes beside simpler collision geometry,
and MuJoCo's mesh compiler (file decoding, normals, bounding-volume hierarchy, hull, inertia)
spent seconds on meshes that do not move the body; its own `discardvisual` drops them only after
compiling them. By MuJoCo's rules a geom

- *collides* when its contype or conaffinity is non-zero, or a contact pair names it;
- *weighs* (sets its body's inertia) when `inertiafromgeom="true"`, or "auto" (the default) in a
  body without an `<inertial>`, and its group is inside `inertiagrouprange`, and its mass (when
  given) or else its density is above zero;
- is *visual* when it does neither, nor feels fluid forces (`fluidshape`).

Before compiling, the spec is edited, never pruned (deleting from a spec took milliseconds per
element), so no reference can break:

- visual geoms that use a mesh become tiny spheres, and the descriptor ignores visual geoms;
- a mesh only visual geoms use becomes a tetrahedron of four inline vertices (unit-sized once
  scaled: MuJoCo refuses meshes of almost no volume);
- a mesh only geoms that collide but do not weigh use (the body's inertia is given) matters only
  through its bounding sphere (`_meshes`), so it becomes the few vertices that keep it: the extreme
  vertex along each axis and the one farthest from the box's centre (STL and OBJ read with numpy);
- textures become flat 1x1 builtins (decoding PNG files was most of some models' time).

A mesh that weighs, in binary STL or MSH with MuJoCo's default (`legacy`) inertia, is replaced by
its inertia box (`_mesh_mass`, computed with numpy): each mesh geom using it becomes a box of the
same mass, centre of mass, principal axes and inertia, and the descriptor reads its extent from the
mesh's bounds. Other meshes that weigh compile as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from .._errors import EmbodimentError
from ._mesh_mass import MeshMass, big_enough, mesh_mass, triangles
from ._meshes import MESH_FORMATS, Bounds, extremes, vertices

_NEVER = mujoco.mjtInertiaFromGeom.mjINERTIAFROMGEOM_FALSE
_UNLESS_GIVEN = mujoco.mjtInertiaFromGeom.mjINERTIAFROMGEOM_AUTO


@dataclass
class Plan:
    """What `split` found in a spec: its visual geoms and which meshes the others need whole."""

    visual: list[Any]
    whole: set[str]
    """Meshes a weighing geom (or a primitive fitted to a mesh) uses: compiled as they are."""
    bounded: set[str]
    """Meshes only geoms that collide without weighing use: only their bounds matter."""
    bounds: dict[str, Bounds] = field(default_factory=dict)
    """Bounding spheres (`_meshes`) of the `bounded` meshes, read from their files."""
    stand_ins: dict[str, MeshMass] = field(default_factory=dict)
    """Mass properties of the `whole` meshes whose geoms became their inertia boxes."""
    boxed: list[tuple[Any, str]] = field(default_factory=list)
    """Those geoms, each with the name of the mesh it used."""

    @property
    def physical(self) -> set[str]:
        return self.whole | self.bounded


def split(spec: Any) -> Plan:
    """Sort a parsed (not yet compiled) spec's geoms and meshes by what the physics needs."""
    compiler = spec.compiler
    low, high = compiler.inertiagrouprange
    rule = mujoco.mjtInertiaFromGeom(compiler.inertiafromgeom)

    def weighs(geom: Any) -> bool:
        if rule == _NEVER or not low <= geom.group <= high:
            return False
        if rule == _UNLESS_GIVEN and geom.parent.explicitinertial:
            return False
        return geom.mass > 0 if not math.isnan(geom.mass) else geom.density > 0

    paired = {name for pair in spec.pairs for name in (pair.geomname1, pair.geomname2)}
    plan = Plan([], set(), set())
    for geom in spec.geoms:
        heavy = weighs(geom)
        collides = geom.contype or geom.conaffinity or geom.name in paired
        if not (heavy or collides or geom.fluid_ellipsoid):
            plan.visual.append(geom)
        elif geom.meshname:
            whole = heavy or geom.type != mujoco.mjtGeom.mjGEOM_MESH
            (plan.whole if whole else plan.bounded).add(geom.meshname)
    plan.bounded -= plan.whole
    return plan


def trim(spec: Any, plan: Plan) -> None:
    """Edit the spec as the module docstring says, filling `plan.bounds`."""
    for geom in plan.visual:
        if geom.meshname:
            geom.type, geom.meshname, geom.size = mujoco.mjtGeom.mjGEOM_SPHERE, "", [1e-3, 0, 0]
    for mesh in spec.meshes:
        if mesh.plugin.active:
            continue
        if mesh.name not in plan.physical and all(mesh.scale):
            _tetrahedron(mesh)
        elif mesh.name in plan.bounded:
            _bound(mesh, _mesh_file(spec, mesh), plan)
    _box_weighing_meshes(spec, plan)
    for texture in spec.textures:
        texture.file, texture.content_type, texture.cubefiles = "", "", [""] * 6
        texture.builtin = mujoco.mjtBuiltin.mjBUILTIN_FLAT
        texture.width = texture.height = 1


def _bound(mesh: Any, path: Path, plan: Plan) -> None:
    """Replace a mesh by the vertices that keep its bounds; left whole when its file is not one
    numpy reads here or those vertices span no volume."""
    if len(mesh.uservert) or _moved(mesh) or path.suffix.lower() not in MESH_FORMATS:
        return
    try:
        points = vertices(mesh.name, path)
    except EmbodimentError:
        return  # MuJoCo reads it, or says what is wrong with it
    scaled = points * np.asarray(mesh.scale)
    if not np.isfinite(scaled).all():
        return
    sphere, keep = extremes(scaled)
    corner = scaled[keep]
    if np.linalg.matrix_rank(corner[1:] - corner[0], tol=1e-6 * sphere[1]) < 3:
        return
    plan.bounds[mesh.name] = sphere
    _inline(mesh, points[keep].ravel().tolist())


def _mesh_file(spec: Any, mesh: Any) -> Path:
    """The file MuJoCo would read for `mesh` (with `strippath`, meshdir/<file name>)."""
    folder = Path(spec.modelfiledir) / (spec.compiler.meshdir or spec.meshdir)
    return folder / Path(mesh.file).name if spec.strippath else folder / mesh.file


def _moved(mesh: Any) -> bool:
    """Whether MuJoCo moves the mesh's vertices before using them (`refpos`, `refquat`)."""
    return any(mesh.refpos) or list(mesh.refquat) != [1.0, 0.0, 0.0, 0.0]


def _tetrahedron(mesh: Any) -> None:
    """A stand-in of inline vertices for a mesh the description does not read: MuJoCo compiles
    it in no time, scaled back to the unit tetrahedron."""
    _inline(mesh, [0.0] * 3 + np.diag(1 / np.abs(mesh.scale)).ravel().tolist())


def _inline(mesh: Any, vertex: list[float]) -> None:
    mesh.file, mesh.content_type = "", ""
    mesh.uservert = vertex
    mesh.userface = mesh.usernormal = mesh.usertexcoord = []
    mesh.userfacenormal = mesh.userfacetexcoord = []


_QUAT = mujoco.mjtOrientation.mjORIENTATION_QUAT
_LEGACY = mujoco.mjtMeshInertia.mjMESH_INERTIA_LEGACY


def _box_weighing_meshes(spec: Any, plan: Plan) -> None:
    """Replace each `whole` mesh that `_mesh_mass` can weigh by its inertia box: in every geom
    using it (mesh geoms only, oriented by a quaternion), then in the asset (a tetrahedron)."""
    users: dict[str, list[Any]] = {}
    for geom in spec.geoms:
        if geom.meshname in plan.whole:
            users.setdefault(geom.meshname, []).append(geom)
    for mesh in spec.meshes:
        geoms = users.get(mesh.name, [])
        if not geoms or not _boxable(mesh, geoms):
            continue
        found = triangles(_mesh_file(spec, mesh))
        mass = found and mesh_mass(*found, np.asarray(mesh.scale))
        if not mass or not big_enough(mass):
            continue
        for geom in geoms:
            _to_box(geom, mass)
            plan.boxed.append((geom, mesh.name))
        plan.stand_ins[mesh.name] = mass
        _tetrahedron(mesh)


def _boxable(mesh: Any, geoms: list[Any]) -> bool:
    """Whether `_mesh_mass` weighs the mesh as MuJoCo would and every geom using it can become its
    box: a file-read mesh, as it is, with the legacy inertia, used by mesh geoms oriented by a
    quaternion whose inertia comes from their volume."""
    if (
        mesh.plugin.active
        or _moved(mesh)
        or len(mesh.uservert)
        or mesh.content_type
        or not all(mesh.scale)
        or mesh.inertia != _LEGACY
    ):
        return False
    return all(
        g.type == mujoco.mjtGeom.mjGEOM_MESH
        and g.alt.type == _QUAT
        and g.typeinertia == mujoco.mjtGeomInertia.mjINERTIA_VOLUME
        for g in geoms
    )


def _to_box(geom: Any, mass: MeshMass) -> None:
    """The geom's frame moves to the mesh's centre of mass and principal axes, as MuJoCo moves a
    mesh geom's; its mass is what the mesh's volume gave it."""
    quat = np.asarray(geom.quat, dtype=np.float64)
    norm = float(np.sqrt(quat @ quat))
    if norm >= 1e-14 and abs(norm - 1) > 1e-14:
        quat = quat / norm
    offset, turned = np.zeros(3), np.zeros(4)
    mujoco.mju_rotVecQuat(offset, mass.centre, quat)
    mujoco.mju_mulQuat(turned, quat, mass.quat)
    if math.isnan(geom.mass):
        geom.mass = geom.density * mass.volume
    geom.pos = np.asarray(geom.pos) + offset
    geom.quat = turned
    geom.type, geom.meshname, geom.size = mujoco.mjtGeom.mjGEOM_BOX, "", mass.box

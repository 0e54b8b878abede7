"""Mass properties of a mesh by MuJoCo's rules, computed with numpy rather than by MuJoCo.

A mesh that sets its body's inertia made MuJoCo decode it, dedup its vertices, build normals, a
bounding-volume hierarchy and (for collisions) a convex hull: most of a second for the fruit fly's
or the dog's hundreds of thousands of triangles, where the descriptor needs the mesh's volume,
centre of mass, inertia and bounds only. This module follows `mjCMesh::Process` with the `legacy`
inertia (MuJoCo's default): each triangle spans a pyramid to a reference point, its volume taken
positive whatever the winding, first to the area-weighted centroid of the faces (for the centre of
mass), then to the centre of mass (for the volume and the second moments), summed in MuJoCo's order:
the volume and centre of mass are MuJoCo's to the last bit. The principal axes come from the
engine's `mju_eig3`, exact to 1e-14; MuJoCo 4.0's compiler stops its own short of exact (by up to
2e-7 radians, 1e-4 where two moments are close), in a way not reproduced here, so the inertia a body
gets differs from MuJoCo's by up to 1e-7 of its largest moment. The bounds are those of the vertices
as MuJoCo stores them (float32, in the principal frame), within 5e-8 of MuJoCo's.

Only binary STL and MuJoCo's MSH are read, with the checks MuJoCo's readers make; anything else
(or a mesh MuJoCo would refuse) is None, and MuJoCo then compiles the mesh itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from ._meshes import Bounds, extremes

_MINVAL = 1e-15  # mjMINVAL
_EPS = 1e-14  # mjEPS
_STL_MAX_FACES = 200_000  # MuJoCo's STL decoder refuses more
_MSH_HEADER = 16


@dataclass(frozen=True)
class MeshMass:
    """A mesh's mass properties at unit density, in its scaled file frame."""

    volume: float
    centre: np.ndarray
    """Centre of mass: MuJoCo's `mesh_pos`."""
    quat: np.ndarray
    """Principal axes: MuJoCo's `mesh_quat`."""
    box: np.ndarray
    """Half sizes of the box with the same volume-normalised inertia (MuJoCo's inertia box)."""
    bounds: Bounds
    """Bounding sphere (`_meshes`) of the vertices MuJoCo would store, in the file frame."""


def triangles(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The (n, 3) float32 vertices and (m, 3) faces of a binary STL or MSH file as MuJoCo's readers
    take them, or None for other files and for files those readers refuse."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if path.suffix in (".stl", ".STL"):
        return _stl(data)
    if path.suffix == ".msh":
        return _msh(data)
    return None


def _stl(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    if len(data) < 84:
        return None
    count = int.from_bytes(data[80:84], "little", signed=True)
    if not 1 <= count <= _STL_MAX_FACES or 84 + 50 * count != len(data):
        return None
    rows = np.frombuffer(data, np.uint8, offset=84).reshape(count, 50)
    vertices = rows[:, 12:48].copy().view("<f4").reshape(-1, 3)
    if not (np.abs(vertices) <= 2.0**30).all():
        return None
    return vertices, np.arange(3 * count).reshape(count, 3)


def _msh(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    if len(data) < _MSH_HEADER:
        return None
    nvert, nnormal, ntexcoord, nface = np.frombuffer(data, "<i4", 4).tolist()
    if nvert < 4 or nface <= 0 or nnormal not in (0, nvert) or ntexcoord not in (0, nvert):
        return None  # no faces: MuJoCo makes them from the convex hull
    floats = 3 * nvert + 3 * nnormal + 2 * ntexcoord
    if len(data) != _MSH_HEADER + 4 * floats + 12 * nface:
        return None
    vertices = np.frombuffer(data, "<f4", 3 * nvert, _MSH_HEADER).reshape(nvert, 3)
    faces = np.frombuffer(data, "<i4", 3 * nface, _MSH_HEADER + 4 * floats).reshape(nface, 3)
    if not np.isfinite(vertices).all() or faces.min() < 0 or faces.max() >= nvert:
        return None
    return vertices, faces


def _total(values: np.ndarray) -> float:
    """A sum taken left to right, as MuJoCo's loops take it (numpy's own is pairwise): the same
    last bits."""
    return float(np.cumsum(values)[-1])


Columns = list[np.ndarray]
"""One coordinate of many points per array: numpy works on whole contiguous rows this way, where
(n, 3) arrays took ten times longer."""


def _triangle(a: Columns, b: Columns, c: Columns) -> tuple[Columns, Columns, np.ndarray]:
    """Each triangle's centre, unit normal and area, operation for operation as MuJoCo's
    `triangle` (faces under mjMINVAL have no area and their normal is left unscaled)."""
    centre = [(a[k] + b[k] + c[k]) / 3 for k in range(3)]
    u, v = [b[k] - a[k] for k in range(3)], [c[k] - a[k] for k in range(3)]
    cross = [u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0]]
    length = np.sqrt(_dot(cross, cross))
    small = length < _MINVAL
    unit = np.where(small, 1.0, length)
    return centre, [x / unit for x in cross], np.where(small, 0.0, 0.5 * length)


def _dot(a: Columns, b: Columns) -> np.ndarray:
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _corners(points: Columns, faces: np.ndarray) -> tuple[Columns, Columns, Columns]:
    return tuple([x[faces[i]] for x in points] for i in range(3))  # type: ignore[return-value]


def mesh_mass(vertices: np.ndarray, faces: np.ndarray, scale: np.ndarray) -> MeshMass | None:
    """The legacy mass properties of a scaled mesh, or None where MuJoCo refuses it (too small,
    eigenvalues not positive or breaking the triangle inequality)."""
    scale = np.asarray(scale, np.float64)
    points = [vertices[:, k].astype(np.float64) * scale[k] for k in range(3)]
    corners = np.ascontiguousarray(faces.T)
    centre, normal, area = _triangle(*_corners(points, corners))
    total_area = _total(area)
    if total_area < _MINVAL:
        return None
    facecen = [_total(area * centre[k]) / total_area for k in range(3)]
    volumes = np.abs(_dot([centre[k] - facecen[k] for k in range(3)], normal) * area / 3)
    volume = _total(volumes)
    if volume < _MINVAL:
        return None
    mass_centre = np.array(
        [_total(volumes * (centre[k] * 3.0 / 4.0 + facecen[k] / 4.0)) for k in range(3)]
    )
    mass_centre /= volume
    found = _second_moments([points[k] - mass_centre[k] for k in range(3)], corners)
    if found is None:
        return None
    volume, full = found
    values, vectors, quat = np.zeros(3), np.zeros(9), np.zeros(4)
    mujoco.mju_eig3(values, vectors, quat, full.ravel())
    a, b, c = values.tolist()
    sums = (b + c - a, a + c - b, a + b - c)
    if c <= 0 or any(s < x * -1e-6 - 1e-9 for s, x in zip(sums, (a, b, c), strict=True)):
        return None  # MuJoCo's own refusals, within its tolerances
    box = np.array([0.5 * math.sqrt(6 * max(x, 0.0) / volume) for x in sums])
    return MeshMass(volume, mass_centre, quat, box, _stored_bounds(points, mass_centre, quat))


_PRODUCTS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


def _second_moments(points: Columns, faces: np.ndarray) -> tuple[float, np.ndarray] | None:
    """Volume and inertia tensor (unit density) of a mesh whose vertices are centred on its centre
    of mass: `mjCMesh::ComputeInertia`, term by term."""
    d, e, f = _corners(points, faces)
    centre, normal, area = _triangle(d, e, f)
    volumes = np.abs(_dot(centre, normal) * area / 3)
    volume = _total(volumes)
    if volume < _MINVAL:
        return None
    weights = volumes / 20
    p = []
    for k, m in _PRODUCTS:
        term = 2 * (d[k] * d[m] + e[k] * e[m] + f[k] * f[m])
        for x, y in ((d, e), (d, f), (e, f)):
            term = term + x[k] * y[m]
            term = term + x[m] * y[k]
        p.append(_total(weights * term))
    full = np.array(
        [[p[1] + p[2], -p[3], -p[4]], [-p[3], p[0] + p[2], -p[5]], [-p[4], -p[5], p[0] + p[1]]]
    )
    return volume, full


def _stored_bounds(points: Columns, centre: np.ndarray, quat: np.ndarray) -> Bounds:
    """The bounding sphere of the vertices MuJoCo stores (moved to the centre of mass, turned to
    the principal axes, narrowed to float32), placed back as the descriptor places them."""
    flat = np.zeros(9)
    mujoco.mju_quat2Mat(flat, quat)
    turn = flat.reshape(3, 3)
    moved = [points[k] - centre[k] for k in range(3)]
    stored = [
        (moved[0] * turn[0, j] + moved[1] * turn[1, j] + moved[2] * turn[2, j])
        .astype(np.float32)
        .astype(np.float64)
        for j in range(3)
    ]
    back = [
        stored[0] * turn[k, 0] + stored[1] * turn[k, 1] + stored[2] * turn[k, 2] + centre[k]
        for k in range(3)
    ]
    return extremes(np.stack(back, axis=1))[0]


def big_enough(mass: MeshMass) -> bool:
    """Whether a box of the mesh's inertia has volume enough for MuJoCo to weigh it."""
    return bool(8 * np.prod(mass.box) > _EPS and (mass.box > 0).all() and mass.volume > _EPS)

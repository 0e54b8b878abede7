"""Bounding spheres of collision meshes, read with numpy rather than compiled by MuJoCo.

Where a link's inertia is given (a URDF `<inertial>`, an MJCF body's), its collision meshes matter
to the descriptor only through the link's extent. MuJoCo's mesh compiler (normals, bounding-volume
hierarchy, hull, volume) took most of a second on a robot with large meshes; reading the vertices
takes milliseconds. A mesh's extent is the sphere centred on its vertices' bounding box through
its farthest vertex, in every format (`_mjcf` computes the same sphere for meshes MuJoCo compiles).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .._errors import EmbodimentError

MESH_FORMATS = frozenset({".stl", ".obj"})
"""Formats read here; collision meshes in others (COLLADA .dae) are left out."""
_NUMBER = rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ASCII_VERTEX = re.compile(
    rb"vertex\s+(" + _NUMBER + rb")\s+(" + _NUMBER + rb")\s+(" + _NUMBER + rb")"
)
_OBJ_VERTEX = re.compile(
    rb"^v\s+(" + _NUMBER + rb")\s+(" + _NUMBER + rb")\s+(" + _NUMBER + rb")", re.MULTILINE
)


def vertices(label: str, path: Path) -> np.ndarray:
    """The (n, 3) vertices of an STL (binary or ASCII) or OBJ file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EmbodimentError(f"{label}: cannot read mesh {path}: {exc.strerror or exc}") from exc
    if path.suffix.lower() == ".obj":
        found = _OBJ_VERTEX.findall(data)
    elif len(data) >= 84 and 84 + 50 * int.from_bytes(data[80:84], "little") == len(data):
        triangles = np.frombuffer(data, np.uint8, offset=84).reshape(-1, 50)
        return triangles[:, 12:48].copy().view("<f4").reshape(-1, 3).astype(np.float64)
    else:
        found = _ASCII_VERTEX.findall(data)
    if not found:
        raise EmbodimentError(f"{label}: mesh {path} has no vertices")
    return np.array(found, dtype=np.float64)


Bounds = tuple[np.ndarray, float]
"""A mesh's bounding sphere in its own frame: centred on its vertices' box, through the farthest
vertex."""


def extremes(points: np.ndarray) -> tuple[Bounds, list[int]]:
    """The bounding sphere of (n, 3) points, and the indices of the points that keep it: the
    extreme one along each axis and the farthest from the centre."""
    low, high = points.argmin(axis=0), points.argmax(axis=0)
    axes = np.arange(3)
    centre = (points[low, axes] + points[high, axes]) / 2
    offset = points - centre
    squared = np.einsum("ij,ij->i", offset, offset)
    far = int(squared.argmax())
    return (centre, float(np.sqrt(squared[far]))), sorted({*low.tolist(), *high.tolist(), far})


def bounding_sphere(label: str, path: Path, scale: np.ndarray) -> Bounds:
    """The bounding sphere of a mesh file's scaled vertices."""
    points = vertices(label, path) * scale
    if not np.isfinite(points).all():
        raise EmbodimentError(f"{label}: mesh {path} has non-finite vertices")
    return extremes(points)[0]

"""Bounding spheres of URDF collision meshes, read with numpy rather than compiled by MuJoCo.

A URDF link's inertia is written out in the file, so its collision meshes matter to the descriptor
only through the link's extent. MuJoCo's mesh compiler (hull, volume, normals) took most of a
second on a robot with large meshes; reading the vertices takes milliseconds. A mesh becomes the
sphere around its vertices' bounding box, the bound MuJoCo's own `rbound` also is for a geom.
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


def bounding_sphere(label: str, path: Path, scale: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre (in the mesh's frame) and radius of the sphere around the scaled vertices' box."""
    points = vertices(label, path) * scale
    if not np.isfinite(points).all():
        raise EmbodimentError(f"{label}: mesh {path} has non-finite vertices")
    centre = (points.min(axis=0) + points.max(axis=0)) / 2
    return centre, float(np.linalg.norm(points - centre, axis=1).max())

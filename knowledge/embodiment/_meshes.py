"""Bounding spheres of collision meshes, read with numpy rather than compiled by MuJoCo.

Where a link's inertia is given (a URDF `<inertial>`, an MJCF body's), its collision meshes matter
to the descriptor only through the link's extent. MuJoCo's mesh compiler (normals, bounding-volume
hierarchy, hull, volume) took most of a second on a robot with large meshes; reading the vertices
takes milliseconds. A mesh's extent is the sphere centred on its vertices' bounding box through
its farthest vertex, in every format (`_mjcf` computes the same sphere for meshes MuJoCo compiles).
"""

from __future__ import annotations

import re
import warnings
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
        fast = _obj_vertices(data)
        if fast is not None:
            return fast
        found = _OBJ_VERTEX.findall(data)
    elif len(data) >= 84 and 84 + 50 * int.from_bytes(data[80:84], "little") == len(data):
        triangles = np.frombuffer(data, np.uint8, offset=84).reshape(-1, 50)
        return triangles[:, 12:48].copy().view("<f4").reshape(-1, 3).astype(np.float64)
    else:
        found = _ASCII_VERTEX.findall(data)
    if not found:
        raise EmbodimentError(f"{label}: mesh {path} has no vertices")
    return np.array(found, dtype=np.float64)


def _obj_vertices(data: bytes) -> np.ndarray | None:
    """An OBJ file's vertices when its `v ` lines hold only numbers, as many on each (3, 4 with a
    weight, 6 with a colour), else None (the regular expression then reads them). Splitting and
    parsing in C took a quarter of the expression's time on vendor meshes of 10 MB."""
    lines = [chunk.partition(b"\n")[0] for chunk in (b"\n" + data).split(b"\nv ")[1:]]
    if not lines or b"\nv\t" in data:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns where it stops parsing: text it cannot read
        try:
            flat = np.fromstring(b" ".join(lines), sep=" ")
        except (DeprecationWarning, ValueError):
            return None
    width, rest = divmod(flat.size, len(lines))
    if rest or width < 3 or {len(lines[0].split()), len(lines[-1].split())} != {width}:
        return None  # two counts per line never pass this; only three mixed could
    return flat.reshape(len(lines), width)[:, :3].copy()


Bounds = tuple[np.ndarray, float]
"""A mesh's bounding sphere in its own frame: centred on its vertices' box, through the farthest
vertex."""


def extremes(points: np.ndarray) -> tuple[Bounds, list[int]]:
    """The bounding sphere of (n, 3) points, and the indices of the points that keep it: the
    extreme one along each axis and the farthest from the centre. (Computed on the transposed
    coordinates: reducing along rows of an (n, 3) array was ten times slower on small meshes.)"""
    columns = np.ascontiguousarray(points.T)
    low, high = columns.argmin(axis=1), columns.argmax(axis=1)
    axes = np.arange(3)
    centre = (columns[axes, low] + columns[axes, high]) / 2
    offset = columns - centre[:, None]
    squared = offset[0] * offset[0] + offset[1] * offset[1] + offset[2] * offset[2]
    far = int(squared.argmax())
    return (centre, float(np.sqrt(squared[far]))), sorted({*low.tolist(), *high.tolist(), far})


def bounding_sphere(label: str, path: Path, scale: np.ndarray) -> Bounds:
    """The bounding sphere of a mesh file's scaled vertices."""
    points = vertices(label, path) * scale
    if not np.isfinite(points).all():
        raise EmbodimentError(f"{label}: mesh {path} has non-finite vertices")
    return extremes(points)[0]

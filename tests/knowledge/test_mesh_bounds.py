"""Mesh bounds read with numpy (`_meshes`): OBJ vertices come out as written, by the fast path or
the regular expression, and bounding spheres are the ones the straightforward computation gives.

Properties over generated files: vertex lines of 3, 4 (a weight) or 6 numbers (a colour), one
count or two mixed, among normals, texture coordinates, faces, comments and blank lines, with LF
or CRLF line ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import EmbodimentError
from knowledge.embodiment._meshes import _obj_vertices, extremes, vertices

number = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
written = st.one_of(
    number.map(repr), number.map(lambda x: f"{x:.6f}"), number.map(lambda x: f"{x:.3e}")
)
other_line = st.sampled_from(
    ["vn 0 0 1", "vt 0.5 0.5", "f 1 2 3", "f 1/1/1 2/2/2 3/3/3", "# a comment", "", "o part"]
)


@st.composite
def obj_files(draw):
    """(OBJ text, the vertices it holds): counts per line from one or two of 3, 4, 6."""
    counts = draw(st.lists(st.sampled_from([3, 4, 6]), min_size=1, max_size=2, unique=True))
    lines, expected = [], []
    for _ in range(draw(st.integers(1, 30))):
        lines += draw(st.lists(other_line, max_size=2))
        values = draw(st.lists(written, min_size=6, max_size=6))[: draw(st.sampled_from(counts))]
        lines.append("v " + draw(st.sampled_from([" ", "  "])).join(values))
        expected.append([float(v) for v in values[:3]])
    end = draw(st.sampled_from(["\n", "\r\n"]))
    return end.join(lines) + draw(st.sampled_from(["", end])), np.array(expected)


@settings(max_examples=300, deadline=None)
@given(obj_files())
def test_obj_vertices_are_read_as_written(tmp_path_factory, file):
    text, expected = file
    path = tmp_path_factory.mktemp("obj") / "mesh.obj"
    path.write_bytes(text.encode())
    assert np.array_equal(vertices("mesh", path), expected)
    fast = _obj_vertices(text.encode())  # when the fast path answers, it answers right
    assert fast is None or np.array_equal(fast, expected)


def test_the_fast_path_reads_uniform_files_and_leaves_the_rest_to_the_expression():
    assert _obj_vertices(b"v 1 2 3\nv 4 5 6 1 0 0\n") is None  # two counts
    assert _obj_vertices(b"v 1 2 3 # a corner\nv 4 5 6\n") is None  # text after the numbers
    assert _obj_vertices(b"v\t1 2 3\n") is None  # a tab after the v
    assert np.array_equal(_obj_vertices(b"v 1 2 3 1\r\nv 4 5 6 1\r\n"), [[1, 2, 3], [4, 5, 6]])


def test_an_obj_without_vertices_is_refused(tmp_path):
    path = tmp_path / "empty.obj"
    path.write_bytes(b"# nothing here\nvn 0 0 1\n")
    with pytest.raises(EmbodimentError, match="has no vertices"):
        vertices("robot.urdf", path)


def reference_sphere(points: np.ndarray) -> tuple[np.ndarray, float]:
    """The bounding sphere by its definition: centred on the box, through the farthest point."""
    centre = (points.min(axis=0) + points.max(axis=0)) / 2
    return centre, float(np.sqrt(((points - centre) ** 2).sum(axis=1).max()))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(number, number, number), min_size=1, max_size=60))
def test_extremes_give_the_bounding_sphere_and_the_points_that_keep_it(rows):
    points = np.array(rows, dtype=np.float64)
    (centre, radius), keep = extremes(points)
    want_centre, want_radius = reference_sphere(points)
    assert np.array_equal(centre, want_centre)
    assert radius == pytest.approx(want_radius, rel=1e-12, abs=1e-300)
    kept_centre, kept_radius = reference_sphere(points[keep])  # the kept points alone
    assert np.array_equal(kept_centre, centre)
    assert kept_radius == pytest.approx(radius, rel=1e-12, abs=1e-300)

"""Mesh mass properties by MuJoCo's legacy rules, computed with numpy: the volume and centre of
mass MuJoCo computes, to the last bit, and no answer where MuJoCo's readers refuse a file."""

from __future__ import annotations

import struct
from pathlib import Path

import mujoco
import numpy as np
import pytest

from knowledge.embodiment._mesh_mass import big_enough, mesh_mass, triangles

CORNERS = [(x, y, z) for x in (0, 1) for y in (0, 1) for z in (0, 1)]
FACES = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1)]
FACES += [(2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]


def write_stl(path: Path, points: np.ndarray, faces: list[tuple[int, int, int]]) -> None:
    data = b"\0" * 80 + struct.pack("<I", len(faces))
    for face in faces:
        data += struct.pack("<3f", 0, 0, 0)
        data += b"".join(struct.pack("<3f", *points[i]) for i in face) + b"\0\0"
    path.write_bytes(data)


def compiled(path: Path, scale: tuple[float, float, float]) -> mujoco.MjModel:
    spec = mujoco.MjSpec()
    spec.add_mesh(name="m", file=str(path), scale=list(scale))
    body = spec.worldbody.add_body()
    body.add_joint()
    body.add_geom(type=mujoco.mjtGeom.mjGEOM_MESH, meshname="m", density=1)
    return spec.compile()


@pytest.mark.parametrize("seed", range(8))
def test_volume_and_centre_are_mujocos_to_the_last_bit(tmp_path, seed):
    """A skewed, non-convex solid (a box with one corner pushed in) at a random scale."""
    rng = np.random.default_rng(seed)
    points = np.array(CORNERS, dtype=np.float64) * rng.uniform(0.01, 2, 3)
    points[7] *= 0.6  # a dent: the legacy rule takes every pyramid's volume as positive
    points += rng.uniform(-1, 1, 3)
    write_stl(tmp_path / "solid.stl", points, FACES)
    scale = tuple(rng.uniform(0.5, 2, 3).tolist())
    found = triangles(tmp_path / "solid.stl")
    assert found is not None
    mass = mesh_mass(*found, np.array(scale))
    assert mass is not None and big_enough(mass)
    model = compiled(tmp_path / "solid.stl", scale)  # type: ignore[arg-type]
    assert mass.volume == model.body_mass[1]
    assert (mass.centre == model.mesh_pos[0]).all()
    sizes = mass.box**2
    principal = mass.volume * (sizes.sum() - sizes) / 3  # the inertia box's moments
    assert sorted(principal) == pytest.approx(sorted(model.body_inertia[1]), rel=1e-9)


def test_files_mujoco_refuses_give_no_answer(tmp_path):
    write_stl(tmp_path / "flat.stl", np.array(CORNERS, float) * [1, 1, 0], FACES)
    flat = triangles(tmp_path / "flat.stl")
    assert flat is not None and mesh_mass(*flat, np.ones(3)) is None  # no volume
    (tmp_path / "ascii.stl").write_text("solid x\nendsolid x\n")
    (tmp_path / "short.msh").write_bytes(struct.pack("<4i", 3, 0, 0, 1))
    (tmp_path / "cube.obj").write_text("v 0 0 0\n")
    for name in ("ascii.stl", "short.msh", "cube.obj", "missing.stl"):
        assert triangles(tmp_path / name) is None, name


def test_an_msh_file_reads_as_its_stl_twin(tmp_path):
    points = np.array(CORNERS, dtype=np.float32)
    header = struct.pack("<4i", 8, 0, 0, len(FACES))
    body = points.tobytes() + np.array(FACES, dtype="<i4").tobytes()
    (tmp_path / "cube.msh").write_bytes(header + body)
    write_stl(tmp_path / "cube.stl", points, FACES)
    msh, stl = (triangles(tmp_path / f"cube.{kind}") for kind in ("msh", "stl"))
    assert msh is not None and stl is not None
    one, two = mesh_mass(*msh, np.ones(3)), mesh_mass(*stl, np.ones(3))
    assert one is not None and two is not None
    assert (
        (one.volume, *one.centre) == (two.volume, *two.centre) == pytest.approx((1, 0.5, 0.5, 0.5))
    )

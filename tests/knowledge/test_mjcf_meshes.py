"""MJCF mesh robots: MuJoCo compiles only the geometry that acts in the simulation (`_trim`), and
the description is the one the whole file gives, with visual geoms out of each body's extent."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import mujoco
import numpy as np
import pytest

import knowledge
from knowledge import Embodiment, EmbodimentError, Identity
from knowledge.embodiment._mjcf import prepare_mjcf

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"
MESHBOT = ROBOTS / "meshbot_description"
MJCF = MESHBOT / "mjcf" / "meshbot.xml"


def test_the_mjcf_and_urdf_of_one_arm_have_the_same_extents():
    """Visual meshes (larger than the collision ones here) bound nothing; a collision mesh bounds
    its body as the sphere around its vertices' box, in either format."""
    mjcf = Embodiment.from_mjcf(MJCF)
    urdf = Embodiment.from_urdf(MESHBOT / "urdf" / "meshbot.urdf")
    for name in ("upper", "lower", "tip"):
        ours, theirs = (next(b for b in e.bodies if b.name == name) for e in (mjcf, urdf))
        assert (ours.extent, ours.mass, *ours.inertia) == pytest.approx(
            (theirs.extent, theirs.mass, *theirs.inertia), rel=1e-9
        ), name


def test_a_mesh_that_sets_its_bodys_inertia_compiles_whole():
    body = Embodiment.from_mjcf(MJCF)
    model = mujoco.MjModel.from_xml_path(str(MJCF))  # MuJoCo on the file as it is
    base = next(b for b in body.bodies if b.name == "base")
    assert base.mass == pytest.approx(model.body("base").mass[0], rel=1e-6) and base.mass > 0
    plan = prepare_mjcf(MJCF).plan
    assert (plan.whole, plan.bounded) == ({"base"}, {"link", "link_half", "tip"})
    assert len(plan.visual) == 3  # two visual meshes and a visual sphere


@pytest.mark.parametrize(
    "path",
    [MJCF, *(p for p in sorted(ROBOTS.glob("*.xml")) if "defaults" not in p.name)],
    ids=lambda p: p.name,
)
def test_trimming_never_changes_a_description(path, untrimmed):
    assert Embodiment.from_mjcf(path) == untrimmed(path)


def test_visual_meshes_and_textures_are_never_read(tmp_path):
    package = tmp_path / "meshbot_description"
    shutil.copytree(MESHBOT, package)
    text = MJCF.read_text()
    text = text.replace('file="link.stl" scale="1.5 2 2"', 'file="nowhere.stl"')
    text = text.replace('builtin="checker" width="64" height="64"', 'file="nowhere.png"')
    (package / "mjcf" / "meshbot.xml").write_text(text)
    with pytest.raises(ValueError, match="nowhere"):
        mujoco.MjModel.from_xml_path(str(package / "mjcf" / "meshbot.xml"))
    moved = Embodiment.from_mjcf(package / "mjcf" / "meshbot.xml")
    assert moved.fingerprint == Embodiment.from_mjcf(MJCF).fingerprint


def write_cube_stl(path: Path, side: float) -> None:
    corners = [(x, y, z) for x in (0, side) for y in (0, side) for z in (0, side)]
    faces = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1)]
    faces += [(2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]
    data = b"\0" * 80 + struct.pack("<I", len(faces))
    for face in faces:
        data += struct.pack("<3f", 0, 0, 0)
        data += b"".join(struct.pack("<3f", *corners[i]) for i in face) + b"\0\0"
    path.write_bytes(data)


def test_a_mesh_too_small_to_trim_compiles_whole(tmp_path, untrimmed):
    """A 12-micrometre collision cube has volume enough for MuJoCo, and the vertices that keep its
    bounds do not: the file is then compiled as it is, to the same description."""
    side = 1.2e-5
    write_cube_stl(tmp_path / "cube.stl", side)
    (tmp_path / "tiny.xml").write_text(
        '<mujoco><asset><mesh name="cube" file="cube.stl"/></asset><worldbody><body>'
        '<inertial pos="0 0 0" mass="1" diaginertia="1 1 1"/><joint/>'
        '<geom type="mesh" mesh="cube"/></body></worldbody></mujoco>'
    )
    body = Embodiment.from_mjcf(tmp_path / "tiny.xml")
    assert body.bodies[0].extent == pytest.approx(side * np.sqrt(3), rel=1e-5)
    assert body == untrimmed(tmp_path / "tiny.xml")


def test_a_descriptor_stored_before_visual_extents_were_left_out_still_works(tmp_path):
    """meshbot_with_visual_extents.json is what the previous reader wrote for meshbot.xml (its
    visual geoms widened each extent). Stored descriptors are read as they are, and a query with
    the file still finds their skill first."""
    stored = json.loads((MESHBOT / "mjcf" / "meshbot_with_visual_extents.json").read_text())
    old, new = Embodiment.from_dict(stored), Embodiment.from_mjcf(MJCF)
    assert old.fingerprint == stored["fingerprint"] != new.fingerprint
    assert old.reach > new.reach and (old.dof, old.mass) == (new.dof, new.mass)
    with knowledge.open(tmp_path / "site.db", Identity.generate()) as kb:
        kb.skills.publish("reach-meshbot", "reach", embodiments=[stored])
        kb.skills.publish(
            "reach-arm7", "reach", embodiments=[Embodiment.from_mjcf(ROBOTS / "arm7.xml").to_dict()]
        )
        found = kb.skills.query(MJCF, active_only=False)
    assert [r.skill.name for r in found] == ["reach-meshbot", "reach-arm7"]
    assert 0 < found[0].distance < found[1].distance


def weighing_robot(tmp_path: Path, geom: str) -> Path:
    """A body whose inertia a 5 cm STL cube sets (no <inertial>), turned and moved in its body."""
    write_cube_stl(tmp_path / "cube.stl", 0.05)
    (tmp_path / "robot.xml").write_text(
        '<mujoco><asset><mesh name="cube" file="cube.stl" scale="1 2 0.5"/></asset><worldbody>'
        f'<body name="link"><joint/><geom type="mesh" mesh="cube" {geom}/>'
        '<geom type="sphere" size="0.01" pos="0 0 0.2"/></body></worldbody></mujoco>'
    )
    return tmp_path / "robot.xml"


@pytest.mark.parametrize(
    "geom",
    ['pos="0.1 0 0" quat="0.9 0.1 0.3 0"', 'mass="2" quat="0 1 0 0"', 'density="300"'],
)
def test_a_weighing_stl_mesh_becomes_a_box_of_its_mass_and_inertia(tmp_path, geom, untrimmed_parts):
    """MuJoCo never reads the mesh; the body weighs what MuJoCo weighing it gives (float noise)."""
    path = weighing_robot(tmp_path, geom)
    model = prepare_mjcf(path)
    parts = model.parts()
    assert [name for _, name in model.plan.boxed] == ["cube"]
    whole = mujoco.MjModel.from_xml_path(str(path))
    body = parts[1][0]
    assert body.mass == pytest.approx(whole.body_mass[1], rel=1e-12)
    assert body.com == pytest.approx(whole.body_ipos[1], abs=1e-12)
    assert sorted(np.linalg.eigvalsh(full_inertia(body.inertia))) == pytest.approx(
        sorted(whole.body_inertia[1]), rel=1e-9
    )
    assert body.extent == pytest.approx(untrimmed_parts(path)[1][0].extent, rel=1e-7)


def full_inertia(six: tuple[float, ...]) -> np.ndarray:
    xx, yy, zz, xy, xz, yz = six
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


@pytest.mark.parametrize("geom", ['euler="0 0 30"', 'axisangle="0 0 1 30"'])
def test_a_weighing_mesh_oriented_otherwise_than_by_quaternion_compiles_whole(
    tmp_path, geom, untrimmed
):
    path = weighing_robot(tmp_path, geom)
    model = prepare_mjcf(path)
    model.parts()
    assert not model.plan.boxed
    assert Embodiment.from_mjcf(path) == untrimmed(path)


def test_a_weighing_mesh_mujoco_refuses_is_still_refused(tmp_path):
    path = weighing_robot(tmp_path, "")
    (tmp_path / "cube.stl").write_text("solid cube\nendsolid cube\n")  # ASCII: MuJoCo reads none
    with pytest.raises(EmbodimentError, match="MuJoCo cannot compile it"):
        Embodiment.from_mjcf(path)

"""URDF as vendors write it: floating bases, actuators from limits and transmissions, package://
meshes, xacro, inertias MuJoCo refuses, and vendor frames that are not end effectors. The robots are
files in tests/assets/robots written for these rules (see each file's comment)."""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path

import pytest

from knowledge import Embodiment, EmbodimentError

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"
MESHBOT = ROBOTS / "meshbot_description"


def urdf(name: str, **options) -> Embodiment:
    return Embodiment.from_urdf(ROBOTS / name, **options)


def names(e: Embodiment, indices) -> list[str]:
    return sorted(e.bodies[i].name for i in indices)


# -- floating base ---------------------------------------------------------------------------------


def test_a_legged_urdf_floats_and_is_actuated():
    dog = urdf("quadruped12.urdf")
    assert (dog.floating_base, dog.dof, len(dog.actuators)) == (True, 18, 12)
    free = [j for j in dog.joints if j.type == "free"]
    assert len(free) == 1 and dog.bodies[free[0].body].name == "trunk"
    assert dog.mass == pytest.approx(6.0 + 0.001 + 4 * (0.6 + 1.0 + 0.3 + 0.05))  # trunk kept
    # transmissions give the kind: effort interfaces are motors, the knees position servos
    kinds = {dog.joints[a.target[0]].name: a.kind for a in dog.actuators}
    assert {j: k for j, k in kinds.items() if k == "position"} == {
        f"{leg}_knee": "position" for leg in ("fl", "fr", "hl", "hr")
    }
    knee = next(a for a in dog.actuators if a.kind == "position")
    assert knee.ctrl_range == (-2.6, -0.9) and knee.force_range == (-30.0, 30.0)
    assert knee.gain == pytest.approx(30.0 / 0.1)  # the effort limit at 0.1 rad of error
    hip = next(a for a in dog.actuators if dog.joints[a.target[0]].name == "fl_hip")
    assert (hip.kind, hip.ctrl_range, hip.gear[0]) == ("motor", (-20.0, 20.0), 1.0)
    # the feet are fused into the calves, the imu and camera frames into the trunk
    assert names(dog, dog.end_effectors) == ["fl_calf", "fr_calf", "hl_calf", "hr_calf"]


def test_floating_base_can_be_forced_either_way():
    fixed = urdf("quadruped12.urdf", floating_base=False)
    assert (fixed.floating_base, fixed.dof) == (False, 12)
    assert "trunk" not in [b.name for b in fixed.bodies]  # fused into the world
    arm = urdf("arm6.urdf", floating_base=True)
    assert (arm.floating_base, arm.dof) == (True, 12)
    assert urdf("arm6.urdf").floating_base is False


def test_wheels_make_a_robot_mobile_and_velocity_transmissions_servos():
    base = urdf("diffbot.urdf")
    assert (base.floating_base, base.dof) == (True, 8)
    assert {(a.kind, a.ctrl_range, a.force_range) for a in base.actuators} == {
        ("velocity", (-15.0, 15.0), (-5.0, 5.0))
    }
    assert base.actuators[0].gain == pytest.approx(5.0 / (0.1 * 15.0), rel=1e-5)
    assert names(base, base.end_effectors) == ["left_wheel", "right_wheel"]


def test_a_robot_welded_to_the_world_link_stays_fixed(tmp_path):
    text = (ROBOTS / "quadruped12.urdf").read_text()
    welded = text.replace(
        '<link name="trunk">',
        '<link name="world"/><joint name="weld" type="fixed"><parent link="world"/>'
        '<child link="trunk"/><origin xyz="0 0 0.5"/></joint><link name="trunk">',
    )
    (tmp_path / "welded.urdf").write_text(welded)
    assert Embodiment.from_urdf(tmp_path / "welded.urdf").floating_base is False


# -- end effectors ---------------------------------------------------------------------------------


def test_vendor_frames_are_not_end_effectors():
    arm = urdf("arm_frames.urdf")  # fusestatic off: ten camera, screen and sensor frames stay
    assert len(arm.bodies) == 17
    assert [arm.bodies[i].name for i in arm.end_effectors] == ["link6"]
    # link offsets to link6, then its cylinder's corner; the frames reach no farther
    assert arm.reach == pytest.approx(1.0 + math.hypot(0.04, 0.05), rel=1e-5)


def test_what_is_welded_to_a_link_is_that_link_and_no_tip():
    """A pad, a camera frame or a heavy cover welded to a link is part of the link's rigid part:
    the tip stays the link, however heavy the welded body; a pad on a joint of its own is a tip."""
    text = (ROBOTS / "arm7.xml").read_text()
    anchor = '<site name="ee"'
    assert anchor in text

    def welded(name: str, mass: float, joint: str = "") -> Embodiment:
        body = (
            f'<body name="{name}" pos="0 0 0.1">{joint}'
            f'<geom type="sphere" size="0.02" mass="{mass}"/></body>'
        )
        return Embodiment.from_mjcf(text.replace(anchor, body + anchor, 1))

    for name, mass in (("pad", 0.05), ("cam", 1e-6), ("cover", 5.0)):
        arm = welded(name, mass)
        assert [arm.bodies[i].name for i in arm.end_effectors] == ["link7"]
        names = [b.name for b in arm.bodies]
        assert arm.rigid_parts[names.index(name)] == names.index("link7")
    sliding = welded("pad", 0.05, '<joint name="press" type="slide" axis="0 0 1"/>')
    assert [sliding.bodies[i].name for i in sliding.end_effectors] == ["pad"]
    # a head welded to the first link, which carries the rest of the arm, is no tip either
    head = '<body name="head" pos="0 0.1 0.1"><geom type="sphere" size="0.08" mass="2"/></body>'
    link2 = '<body name="link2"'
    with_head = Embodiment.from_mjcf(text.replace(link2, head + link2))
    assert [with_head.bodies[i].name for i in with_head.end_effectors] == ["link7"]


def test_an_older_peers_end_effectors_are_recomputed_not_refused():
    arm = urdf("arm_frames.urdf")
    data = arm.to_dict()
    data["end_effectors"] = list(range(7, 17))  # frames, as the previous version listed them
    data["reach"] = 99.0
    again = Embodiment.from_dict(data)
    assert again == arm and again.end_effectors == arm.end_effectors


# -- meshes and packages ---------------------------------------------------------------------------


def test_package_meshes_resolve_from_the_files_folders():
    bot = Embodiment.from_urdf(MESHBOT / "urdf" / "meshbot.urdf")
    extents = {b.name: b.extent for b in bot.bodies}
    # a mesh counts as the sphere around its vertices' box: centre distance plus radius
    assert extents["upper"] == pytest.approx(0.15 + math.hypot(0.15, 0.03, 0.03), rel=1e-5)
    assert extents["lower"] == pytest.approx(0.075 + math.hypot(0.075, 0.03, 0.03), rel=1e-5)
    assert extents["tip"] == pytest.approx(
        math.hypot(0.01, 0.01, 0.05) + math.hypot(0.01, 0.01, 0.04), rel=1e-5
    )
    assert (bot.dof, len(bot.actuators), bot.floating_base) == (3, 3, False)


def test_package_path_and_ros_package_path_find_a_moved_package(tmp_path, monkeypatch):
    original = Embodiment.from_urdf(MESHBOT / "urdf" / "meshbot.urdf")
    alone = tmp_path / "elsewhere" / "meshbot.urdf"
    alone.parent.mkdir()
    shutil.copy(MESHBOT / "urdf" / "meshbot.urdf", alone)
    monkeypatch.delenv("ROS_PACKAGE_PATH", raising=False)
    with pytest.raises(EmbodimentError) as caught:
        Embodiment.from_urdf(alone)
    message = str(caught.value)
    assert str(alone) in message and "no package 'meshbot_description'" in message
    assert "package_path=" in message and "ROS_PACKAGE_PATH" in message
    assert Embodiment.from_urdf(alone, package_path=[ROBOTS]) == original
    monkeypatch.setenv("ROS_PACKAGE_PATH", f"/nowhere:{ROBOTS}")
    assert Embodiment.from_urdf(alone) == original


def test_missing_and_unreadable_meshes(tmp_path):
    package = tmp_path / "meshbot_description"
    shutil.copytree(MESHBOT, package)
    (package / "meshes" / "tip.obj").unlink()
    with pytest.raises(EmbodimentError, match="tip.obj does not exist"):
        Embodiment.from_urdf(package / "urdf" / "meshbot.urdf")
    # a COLLADA collision mesh is left out: the link keeps no extent from it
    (package / "meshes" / "tip.dae").write_text("<COLLADA/>")
    text = (package / "urdf" / "meshbot.urdf").read_text().replace("tip.obj", "tip.dae")
    (package / "urdf" / "meshbot.urdf").write_text(text)
    bot = Embodiment.from_urdf(package / "urdf" / "meshbot.urdf")
    assert next(b for b in bot.bodies if b.name == "tip").extent == 0.0


# -- inertias and xacro ----------------------------------------------------------------------------


def test_inertias_mujoco_refuses_are_balanced_on_request():
    path = ROBOTS / "unbalanced_inertia.urdf"
    with pytest.raises(EmbodimentError) as caught:
        Embodiment.from_urdf(path)
    assert str(path) in str(caught.value) and "balance_inertia=True" in str(caught.value)
    body = Embodiment.from_urdf(path, balance_inertia=True)
    assert (body.dof, body.mass) == (2, 1.5)
    for b in body.bodies:  # every inertia now that of a rigid body
        xx, yy, zz = b.inertia[:3]
        assert xx + yy >= zz and yy + zz >= xx and xx + zz >= yy


XACRO = """<?xml version="1.0"?>
<robot name="twin" xmlns:xacro="http://www.ros.org/wiki/xacro">
  <xacro:property name="height" value="0.3"/>
  <xacro:macro name="arm" params="side y">
    <link name="${side}_link"><inertial><mass value="1"/>
      <inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
      <collision><geometry>
        <mesh filename="$(find meshbot_description)/meshes/link.stl"/></geometry></collision>
    </link>
    <joint name="${side}_joint" type="revolute"><parent link="base"/><child link="${side}_link"/>
      <origin xyz="0 ${y} ${height}"/><axis xyz="0 1 0"/>
      <limit lower="-1" upper="1" effort="10" velocity="1"/></joint>
  </xacro:macro>
  <link name="base"><inertial><mass value="2"/>
    <inertia ixx="0.02" iyy="0.02" izz="0.02" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <xacro:arm side="left" y="0.2"/>
  <xacro:arm side="right" y="-0.2"/>
</robot>
"""


def test_xacro_without_the_xacro_package_is_refused_clearly(tmp_path, monkeypatch):
    for name in ("xacro", "xacro.substitution_args"):
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    path = tmp_path / "twin.urdf.xacro"
    path.write_text(XACRO)
    with pytest.raises(EmbodimentError) as caught:
        Embodiment.from_urdf(path)
    message = str(caught.value)
    assert str(path) in message and "xacro" in message and "pip install xacro" in message


@pytest.mark.skipif(importlib.util.find_spec("xacro") is None, reason="xacro is not installed")
def test_xacro_is_expanded_by_the_xacro_package(tmp_path):
    path = tmp_path / "twin.urdf.xacro"
    path.write_text(XACRO)
    twin = Embodiment.from_urdf(path, package_path=[ROBOTS])  # $(find ...) searches it too
    assert (twin.dof, len(twin.actuators)) == (2, 2)
    assert sorted(b.name for b in twin.bodies) == ["left_link", "right_link"]
    extent = 0.15 + math.hypot(0.15, 0.03, 0.03)  # the meshbot link, found by $(find ...)
    assert [b.extent for b in twin.bodies] == pytest.approx([extent] * 2, rel=1e-5)


def test_a_declared_but_unused_xacro_namespace_is_plain_urdf():
    assert "xmlns:xacro" in (ROBOTS / "quadruped12.urdf").read_text()
    assert urdf("quadruped12.urdf").dof == 18

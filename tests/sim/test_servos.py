"""Tests of sim._servos: the servos task builders give a scene with no actuators. A URDF robot's
are as strong as its joints' effort limits say, its wheels turn under velocity servos, and an MJCF
robot's keep one stiffness; checked on robots written here and on corpus robots (Talos, Upkie)."""

from __future__ import annotations

import sys
from pathlib import Path
from xml.etree import ElementTree

import mujoco
import numpy as np
import pytest

import knowledge
import sim
from sim import reach_task, stand_task

ROBOTS = "tests/assets/robots"
BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from corpus import CACHE, fetched  # noqa: E402

on_the_corpus = pytest.mark.skipif(
    not fetched(CACHE), reason="no corpus: run python benchmarks/corpus.py to fetch it"
)
ROBOT_DATA = CACHE / "example-robot-data" / "cmeel.prefix" / "share"


def test_a_urdf_arms_servos_are_as_strong_as_its_joints():
    """Each servo a URDF arm gets pushes with its joint's `<limit effort>` at 0.1 rad of error and
    never harder (the effort `Embodiment.from_urdf` reads); the UR5-sized arm holds its pose where
    one stiffness for every joint (200) let its shoulder sag by 0.2 rad."""
    path = f"{ROBOTS}/arm6.urdf"
    home = {"shoulder_lift_joint": -1.2, "elbow_joint": 1.5, "wrist_1_joint": -1.5}
    task = reach_task(path, end_effector="tool0", home=home, horizon=50, joint_noise=0.0)
    model = task.template.model
    efforts = {"shoulder_pan_joint": 150, "shoulder_lift_joint": 150, "elbow_joint": 150}
    efforts |= {"wrist_1_joint": 28, "wrist_2_joint": 28}
    for a in range(model.nu):
        joint = model.joint(model.actuator_trnid[a, 0]).name
        kp = model.actuator_gainprm[a, 0]
        assert model.actuator_biasprm[a, :3].tolist() == [0, -kp, -kp / 10]
        if joint in efforts:
            assert kp == efforts[joint] / 0.1
            assert model.actuator_forcerange[a].tolist() == [-efforts[joint], efforts[joint]]
        else:  # wrist_3_joint: continuous, and the file gives it no effort
            assert joint == "wrist_3_joint" and kp == 200 and not model.actuator_forcelimited[a]
    descriptor = knowledge.Embodiment.from_urdf(path)
    assert {a.name: a.ctrl_range for a in descriptor.actuators} == {
        j: (-e, e) for j, e in efforts.items()
    }

    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key(task.definition["keyframe"]).id)
    elbow = model.actuator("elbow_joint_servo").id
    for error, push in ((0.05, 75.0), (0.1, 150.0), (0.3, 150.0)):
        data.ctrl[elbow] = data.qpos[model.joint("elbow_joint").qposadr[0]] + error
        mujoco.mj_forward(model, data)
        assert data.actuator_force[elbow] == pytest.approx(push)

    mujoco.mj_resetDataKeyframe(model, data, model.key(task.definition["keyframe"]).id)
    mujoco.mj_forward(model, data)
    start, pose = data.site("reach_ee").xpos.copy(), data.qpos.copy()
    mujoco.mj_step(model, data, 50 * task.definition["control_substeps"])  # zero action: hold
    assert np.abs(data.qpos - pose).max() < 0.03
    assert np.linalg.norm(data.site("reach_ee").xpos - start) < 0.03  # 0.15 m with kp 200

    stiff = reach_task(path, end_effector="tool0", servo_gain=500.0).template.model
    assert stiff.actuator_gainprm[:, 0].tolist() == [500.0] * 6
    assert stiff.actuator_forcerange[0].tolist() == [-150, 150]  # the effort still bounds it


def test_an_mjcf_robot_without_actuators_keeps_the_servos_it_had():
    """Only a URDF says how strong its joints are: an MJCF scene without actuators gets stiffness
    200 (or `servo_gain`) on every joint, wheels included, with no force range of its own."""
    scene = """<mujoco model="cart"><worldbody><body name="cart" pos="0 0 0.3">
      <freejoint name="root"/><geom type="box" size="0.2 0.1 0.05"/>
      <body name="wheel" pos="0 0.15 -0.2"><joint name="spin" axis="0 1 0"/>
        <geom type="cylinder" size="0.1 0.02" zaxis="0 1 0"/></body>
      <body name="pole"><joint name="tilt" axis="0 1 0" range="-1 1" actuatorfrcrange="-5 5"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.3" size="0.02"/></body></body></worldbody>
    </mujoco>"""
    model = stand_task(scene, base_body="cart", height=0.1).template.model
    assert model.actuator_gainprm[:, 0].tolist() == [200.0, 200.0]
    assert model.actuator_biasprm[:, :3].tolist() == [[0, -200, -20]] * 2
    assert not model.actuator_forcelimited.any()
    gains = stand_task(scene, base_body="cart", height=0.1, servo_gain=50.0).template.model
    assert gains.actuator_gainprm[:, 0].tolist() == [50.0, 50.0]


ROVER = """<robot name="rover">
  <link name="chassis">
    <inertial><mass value="8"/><inertia ixx="0.1" iyy="0.15" izz="0.2" ixy="0" ixz="0" iyz="0"/>
    </inertial>
    <collision><geometry><box size="0.4 0.3 0.1"/></geometry></collision>
  </link>
  <link name="left_wheel">{wheel}</link>
  <link name="right_wheel">{wheel}</link>
  <link name="caster">
    <inertial><mass value="0.1"/><inertia ixx="1e-4" iyy="1e-4" izz="1e-4" ixy="0" ixz="0" iyz="0"/>
    </inertial>
    <collision><geometry><sphere radius="0.03"/></geometry></collision>
  </link>
  <link name="mast">
    <inertial><origin xyz="0 0 0.2"/><mass value="1"/>
      <inertia ixx="0.01" iyy="0.01" izz="1e-4" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 0.2"/><geometry><box size="0.02 0.02 0.4"/></geometry></collision>
  </link>
  <link name="flag">
    <inertial><mass value="0.1"/><inertia ixx="1e-4" iyy="1e-4" izz="1e-4" ixy="0" ixz="0" iyz="0"/>
    </inertial>
  </link>
  <joint name="left_wheel_joint" type="continuous">
    <parent link="chassis"/><child link="left_wheel"/><origin xyz="0.1 0.17 -0.03"/>
    <axis xyz="0 1 0"/><limit effort="5" velocity="15"/>
  </joint>
  <!-- Upkie writes its wheels as revolute joints without lower or upper limits -->
  <joint name="right_wheel_joint" type="revolute">
    <parent link="chassis"/><child link="right_wheel"/><origin xyz="0.1 -0.17 -0.03"/>
    <axis xyz="0 1 0"/><limit effort="5" velocity="15"/>
  </joint>
  <joint name="caster_joint" type="fixed">
    <parent link="chassis"/><child link="caster"/><origin xyz="-0.15 0 -0.06"/>
  </joint>
  <!-- no position limit either, but its link is off its axis: gravity turns it -->
  <joint name="mast_joint" type="continuous">
    <parent link="chassis"/><child link="mast"/><origin xyz="0 0 0.05"/>
    <axis xyz="0 1 0"/><limit effort="40" velocity="2"/>
  </joint>
  <joint name="flag_joint" type="revolute">
    <parent link="mast"/><child link="flag"/><origin xyz="0 0 0.4"/>
    <axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="0" velocity="1"/>
  </joint>
</robot>"""
WHEEL = """<inertial><mass value="0.5"/>
      <inertia ixx="0.001" iyy="0.002" izz="0.001" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin rpy="1.5708 0 0"/><geometry><cylinder radius="0.06" length="0.03"/>
    </geometry></collision>"""


def test_a_urdf_robots_wheels_get_velocity_servos_in_a_stand_task(tmp_path):
    """A wheel (no position limit, nothing movable beyond it, centred on its axis) is driven by
    velocity, so holding the start posture brakes it rather than locking it at an angle, and a
    skill drives the robot by its wheels' speed; a joint without limits whose link gravity turns
    (the mast) keeps a position servo, as every joint of a reach task does."""
    path = tmp_path / "rover.urdf"
    path.write_text(ROVER.format(wheel=WHEEL))
    task = stand_task(
        path, base_body="chassis", height=0.05, floating_base=True, posture={"mast_joint": 0.1}
    )
    model = task.template.model
    servo = {model.joint(model.actuator_trnid[a, 0]).name: a for a in range(model.nu)}
    for wheel in ("left_wheel_joint", "right_wheel_joint"):
        a = servo[wheel]
        kv = 5 / (0.1 * 15)  # the effort at a tenth of the velocity limit (in the scene's 6 digits)
        assert model.actuator_gainprm[a, 0] == pytest.approx(kv, rel=1e-5)
        assert model.actuator_biasprm[a, :3] == pytest.approx([0, 0, -kv], rel=1e-5)
        assert model.actuator_ctrlrange[a].tolist() == [-15, 15]
        assert model.actuator_forcerange[a].tolist() == [-5, 5]
    mast, flag = servo["mast_joint"], servo["flag_joint"]
    assert model.actuator_biasprm[mast, :3].tolist() == [0, -400, -40]
    assert model.actuator_gainprm[flag, 0] == 200 and not model.actuator_forcelimited[flag]
    key = model.key(task.definition["keyframe"])
    assert key.ctrl[servo["left_wheel_joint"]] == 0 and key.ctrl[mast] == pytest.approx(0.1)

    def drive(speed: float) -> tuple[float, float]:
        """The chassis's travel and the mast's angle after 2 s with the wheels told `speed`."""
        data = mujoco.MjData(model)
        mujoco.mj_resetDataKeyframe(model, data, key.id)
        mujoco.mj_forward(model, data)
        start = data.body("chassis").xpos.copy()
        data.ctrl[servo["left_wheel_joint"]] = data.ctrl[servo["right_wheel_joint"]] = speed
        mujoco.mj_step(model, data, round(2.0 / model.opt.timestep))
        travel = float(np.linalg.norm(data.body("chassis").xpos[:2] - start[:2]))
        return travel, float(data.qpos[model.joint("mast_joint").qposadr[0]])

    still, upright = drive(0.0)
    assert still < 0.01 and upright == pytest.approx(0.1, abs=0.02)
    rolled, upright = drive(5.0)
    assert rolled > 0.8 * 0.06 * 5.0 * 2.0  # radius x speed x time (3 cm when a position servo
    assert upright == pytest.approx(0.1, abs=0.05)  # aimed the wheels at 5 rad)

    reach = reach_task(path, end_effector="left_wheel").template.model
    assert reach.actuator_biasprm[0, :3].tolist() == [0, -50, -5]  # a position servo: 5 / 0.1


@on_the_corpus
def test_a_humanoid_holds_its_posture_with_servos_as_strong_as_its_joints():
    """Talos (90 kg; knees of 300 N m, wrists of 3) holding the half-sitting posture of its SRDF
    stands with the servos its efforts give; with one stiffness for every joint (200, what every
    joint had before) its legs give way and it falls."""
    robots = ROBOT_DATA / "example-robot-data" / "robots" / "talos_data"
    (state,) = [
        s
        for s in ElementTree.parse(robots / "srdf" / "talos.srdf").getroot().iter("group_state")
        if s.get("name") == "half_sitting"
    ]
    posture = {j.get("name"): float(j.get("value")) for j in state if j.get("name") != "root_joint"}

    def held(**servos: float) -> list[str]:
        task = stand_task(
            robots / "robots" / "talos_reduced.urdf",
            base_body="base_link",
            height=0.8,
            floating_base=True,
            posture=posture,
            package_path=[ROBOT_DATA],
            horizon=100,
            **servos,
        )
        hold = task.template.model.key(task.definition["keyframe"]).ctrl.copy()
        result = sim.evaluate(
            task, lambda o: np.tile(hold, (len(o), 1)), branches=4, progress=False
        )
        return [o.reason for o in result.outcomes]

    assert held() == ["success"] * 4
    assert "success" not in held(servo_gain=200.0)


@on_the_corpus
def test_upkie_balances_by_driving_its_wheels():
    """Upkie's wheels (revolute joints without lower or upper limits) get velocity servos: holding
    the start posture brakes them and it tips over, as a wheeled biped does; feeding its pitch back
    into its wheels' speed keeps it upright, which wheels locked at an angle never could."""
    upkie = CACHE / "upkie-description" / "upkie_description" / "urdf" / "upkie.urdf"
    legs = {"left_hip": 0.0, "left_knee": 0.0, "right_hip": 0.0, "right_knee": 0.0}
    task = stand_task(upkie, base_body="base", height=0.35, floating_base=True, posture=legs)
    model = task.template.model
    wheels = [model.actuator(f"{side}_wheel_servo").id for side in ("left", "right")]
    assert all(model.actuator_biasprm[a, 1] == 0 for a in wheels)  # velocity servos
    assert model.actuator_ctrlrange[wheels].tolist() == [[-111, 111]] * 2
    assert model.actuator_forcerange[wheels].tolist() == [[-1.7, 1.7]] * 2
    assert model.actuator_gainprm[model.actuator("left_knee_servo").id, 0] == 160  # 16 N m

    key = model.key(task.definition["keyframe"])
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, key.id)
    mujoco.mj_forward(model, data)
    forward = np.sign([data.xaxis[model.actuator_trnid[a, 0], 1] for a in wheels])
    data.qvel[4] = 0.3  # a push: pitching at 0.3 rad/s
    for _ in range(250):  # 10 s
        w, x, y, z = data.qpos[3:7]
        pitch = np.arcsin(np.clip(2 * (w * y - z * x), -1, 1))
        data.ctrl[:] = key.ctrl
        data.ctrl[wheels] = forward * (20 * pitch + 2 * data.qvel[4] + 40 * data.qvel[0])
        mujoco.mj_step(model, data, task.definition["control_substeps"])
        assert data.body("base").xpos[2] > 0.35
    assert abs(data.qpos[model.jnt_qposadr[model.actuator_trnid[wheels[0], 0]]]) > 1  # they rolled

    hold = np.tile(key.ctrl, (4, 1))
    limp = sim.evaluate(task, lambda o: hold[: len(o)], branches=4, progress=False)
    assert {o.reason for o in limp.outcomes} == {"failure:body_upright"}


GRIPPER = """<robot name="gripper">
  <link name="palm">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/>
    </inertial>
    <collision><geometry><box size="0.1 0.1 0.04"/></geometry></collision>
  </link>
  <link name="left"><inertial><mass value="0.05"/>
    <inertia ixx="1e-5" iyy="1e-5" izz="1e-5" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <link name="right"><inertial><mass value="0.05"/>
    <inertia ixx="1e-5" iyy="1e-5" izz="1e-5" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <joint name="left_finger" type="prismatic">
    <parent link="palm"/><child link="left"/><origin xyz="0 0.02 0.05"/>
    <axis xyz="0 1 0"/><limit effort="20" lower="0" upper="0.04" velocity="0.2"/>
  </joint>
  <joint name="right_finger" type="prismatic">
    <parent link="palm"/><child link="right"/><origin xyz="0 -0.02 0.05"/>
    <axis xyz="0 -1 0"/><limit effort="20" lower="0" upper="0.04" velocity="0.2"/>
    <mimic joint="left_finger"/>
  </joint>
</robot>"""


def test_a_mimic_joint_follows_its_leader_without_a_servo_of_its_own(tmp_path):
    """A gripper's second finger (URDF `<mimic>`) gets no servo: the leader's servo opens both, as
    on the robot, and the task has the drives `Embodiment.from_urdf` counts, whichever finger it
    reaches with. With a servo of its own (before), the follower held its start while the leader
    opened: the two fought through the equality and neither finger reached the target."""
    path = tmp_path / "gripper.urdf"
    path.write_text(GRIPPER)
    assert [a.name for a in knowledge.Embodiment.from_urdf(path).actuators] == ["left_finger"]
    both = ["left_finger", "right_finger"]
    for end, joints in (("left", both), ("right", both), ("right", None)):
        model = reach_task(path, end_effector=end, joints=joints).template.model
        driven = [model.joint(model.actuator_trnid[a, 0]).name for a in range(model.nu)]
        assert driven == ["left_finger"]

    data = mujoco.MjData(model)
    data.ctrl[0] = 0.03
    mujoco.mj_step(model, data, round(1.0 / model.opt.timestep))
    for finger in ("left_finger", "right_finger"):
        assert data.joint(finger).qpos[0] == pytest.approx(0.03, abs=0.002)

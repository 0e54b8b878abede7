"""The procedural body family: every seed gives a valid, compilable body with a working task."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import sim.transfer
from sim.transfer import Robot

SEEDS = st.integers(0, 2**31 - 1)


def check(robot: Robot) -> mujoco.MjModel:
    """Common to every body: compiles, one actuator per listed joint and in order, a descriptor, its
    tasks."""
    model = mujoco.MjModel.from_xml_string(robot.scene)
    assert [model.joint(int(model.actuator_trnid[a, 0])).name for a in range(model.nu)] == list(
        robot.joints
    )
    assert len(robot.slots) == len(robot.gear) == len(robot.home) == model.nu
    assert all(0.0 <= s.limb <= 1.0 for s in robot.slots)
    body = robot.embodiment()
    assert body.name == robot.name and len(body.actuators) == model.nu
    for family in robot.tasks:
        task = robot.task(family)
        assert task.act_dim == model.nu and task.template.model.nu == model.nu
    return model


@settings(max_examples=30)
@given(seed=SEEDS)
def test_arms_are_valid_for_every_seed(seed):
    robot = sim.transfer.procedural_arm(seed)
    model = check(robot)
    assert robot.kind == "arm" and robot.tasks == ("reach",)
    assert 3 <= model.njnt <= 7 and all(model.jnt_type == mujoco.mjtJoint.mjJNT_HINGE)
    assert robot.embodiment().dof == model.njnt and 0.5 < robot.size < 1.2
    assert (model.jnt_range[:, 0] < 0).all() and (
        model.jnt_range[:, 1] > 0
    ).all()  # home (0) within the limits
    # at rest the arm holds its home pose (gravity compensation, position actuators at 0)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    home = data.site("ee").xpos.copy()
    mujoco.mj_step(model, data, nstep=250)
    assert np.linalg.norm(data.site("ee").xpos - home) < 0.01 * robot.size
    assert not data.warning.number.any()
    assert robot.scene == sim.transfer.procedural_arm(seed).scene


@settings(max_examples=30)
@given(seed=SEEDS)
def test_legged_bodies_are_valid_for_every_seed(seed):
    robot = sim.transfer.procedural_legged(seed)
    model = check(robot)
    legs = len({s.limb for s in robot.slots})
    assert robot.kind == "legged" and robot.tasks == ("posture",) and 2 <= legs <= 6
    assert sorted(s.joint for s in robot.slots) == [0, 1] * legs or sorted(
        s.joint for s in robot.slots
    ) == sorted([0, 1] * legs)
    assert len(robot.embodiment().end_effectors) == legs
    # it stands: a second with every joint held at 0 keeps the torso up and level
    data = mujoco.MjData(model)
    mujoco.mj_step(model, data, nstep=200)
    torso = data.body("torso")
    assert torso.xpos[2] > 0.8 * model.body("torso").pos[2] and torso.xmat[8] > 0.95
    for end in ("front", "back"):  # its posture task starts from where the torso's ends are
        assert (
            np.linalg.norm(data.site(end).xpos - data.site(f"home_{end}").xpos) < 0.05 * robot.size
        )
    assert not data.warning.number.any()
    assert robot.scene == sim.transfer.procedural_legged(seed).scene


def test_the_shipped_scenes_are_robots_too():
    arm7, walker = sim.transfer.shipped_robots()
    for robot in (arm7, walker):
        check(robot)
    assert (
        arm7.keyframe == "home"
        and arm7.home[3] == pytest.approx(1.4)
        and arm7.size == pytest.approx(1.04, abs=0.01)
    )
    assert [s.limb for s in walker.slots] == [1.0, 1.0, 0.0, 0.0]  # the hind leg is the back one


def test_a_population_has_distinct_names_and_tasks_are_per_kind():
    population = sim.transfer.robot_population(3, 2, seed=10)
    assert [r.name for r in population] == [
        "arm-10",
        "arm-11",
        "arm-12",
        "legged-10",
        "legged-11",
        "simnet-arm7",
        "simnet-walker",
    ]
    with pytest.raises(ValueError, match="reach"):
        population[3].task("reach")

"""Bodies shaped like real robots (quadrupeds, humanoids, industrial arms, two-armed torsos, mobile
manipulators): valid for any seed, standing or holding still under their own control law, their
native skills working on themselves, and skills moving between them through their slots; and with
what real robot files have: unactuated joints, continuous joints, light links."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import sim.transfer
from sim.transfer._building import HELD, WHEEL
from sim.transfer._datasets import _sources, sampler
from sim.transfer._skills import _kinds, _Law

from .test_bodies import check

SEEDS = st.integers(0, 2**31 - 1)


@settings(max_examples=10, deadline=None)
@given(seed=SEEDS)
def test_quadrupeds_are_valid_for_every_seed(seed):
    robot = sim.transfer.procedural_quadruped(seed)
    model = check(robot)
    body = robot.embodiment()
    assert robot.kind == "legged" and robot.morphology == "quadruped"
    assert body.floating_base and model.nu == 12 and len(body.end_effectors) == 4
    assert sorted({(s.limb, s.side) for s in robot.slots}) == [(0, -1), (0, 1), (1, -1), (1, 1)]
    assert 0.6 < body.mass < 90 and robot.scene == sim.transfer.procedural_quadruped(seed).scene


@settings(max_examples=10, deadline=None)
@given(seed=SEEDS)
def test_humanoids_are_valid_for_every_seed(seed):
    robot = sim.transfer.procedural_humanoid(seed)
    model = check(robot)
    body = robot.embodiment()
    legs = [s for s in robot.slots if s.joint < HELD]
    assert body.floating_base and robot.morphology == "humanoid" and 10 <= len(legs) <= 12
    assert {s.side for s in legs} == {-1, 1} and {s.joint for s in legs} >= {0, 1, 2, 3}
    assert 10 < body.mass < 150 and model.nu == len(robot.joints)


@settings(max_examples=10, deadline=None)
@given(seed=SEEDS, make=st.sampled_from(["industrial_arm", "two_armed", "mobile_manipulator"]))
def test_manipulators_are_valid_for_every_seed(seed, make):
    robot = getattr(sim.transfer, make)(seed)
    model = check(robot)
    arm = [s.joint for s in robot.slots if s.joint < HELD]
    assert robot.kind == "arm" and arm == list(range(len(arm))) and len(arm) in (6, 7)
    assert robot.embodiment().floating_base == (make == "mobile_manipulator")
    wheels = [k for k, s in enumerate(robot.slots) if WHEEL <= s.joint < WHEEL + 20]
    assert len(wheels) == (2 if make == "mobile_manipulator" else 0)
    assert all(_kinds(model)[k] == "velocity" for k in wheels)


@pytest.mark.parametrize(
    "robot",
    [sim.transfer.procedural_quadruped(0), sim.transfer.procedural_humanoid(5)],
    ids=lambda r: r.name,
)
def test_a_standing_body_stands_under_its_own_law(robot):
    """Held at qpos 0 by its skill's control law for 1.5 s, the torso stays up and level."""
    task = robot.task("posture")
    model = task.template.model
    data = mujoco.MjData(model)
    law = _Law(robot, model, "posture")
    for _ in range(task.definition["horizon"]):
        law.control(data, np.zeros(len(robot.joints)))
        mujoco.mj_step(model, data, nstep=task.definition["control_substeps"])
    torso = data.body("torso")
    assert torso.xpos[2] > 0.9 * model.body("torso").pos[2] and torso.xmat[8] > 0.98
    assert not data.warning.number.any()


@pytest.mark.parametrize(
    "robot",
    [
        sim.transfer.procedural_quadruped(1),
        sim.transfer.procedural_humanoid(5),
        sim.transfer.industrial_arm(0),
        sim.transfer.industrial_arm(1),  # an underactuated gripper: three phalanges unactuated
        sim.transfer.two_armed(1),
        sim.transfer.mobile_manipulator(2),
    ],
    ids=lambda r: r.name,
)
def test_native_skills_work_on_their_own_bodies(robot):
    (family,) = robot.tasks
    skill = sim.transfer.native_skill(robot, family).skill
    result = sim.evaluate(
        robot.task(family), skill, branches=16, sampler=sampler(family, 5), progress=False
    )
    assert result.success_rate >= 0.8 and skill.spec.hidden == ()


def test_a_torque_skill_does_not_drive_a_body_of_servos():
    """A PD law's torques, read by position servos as targets, do not hold a posture: the same
    quadruped with servos fails with the motor body's skill and succeeds with its own."""
    motor = sim.transfer.procedural_quadruped(1)
    assert set(_kinds(motor.task("posture").template.model)) == {"motor"}
    spec = mujoco.MjSpec.from_string(motor.scene)
    for actuator in spec.actuators:
        actuator.set_to_position(kp=20.0, kv=1.0)
        actuator.ctrlrange = [-1.2, 1.2]
    servos = sim.transfer.Robot(
        "servo-quadruped",
        "legged",
        spec.to_xml(),
        motor.joints,
        motor.slots,
        (1.0,) * len(motor.joints),
        motor.size,
        motor.home,
    )
    task = servos.task("posture")
    borrowed = sim.transfer.retarget(
        sim.transfer.native_skill(motor, "posture").skill, motor, servos, "posture"
    )
    own = sim.transfer.native_skill(servos, "posture").skill
    runs = [
        sim.evaluate(task, skill, branches=16, sampler=sampler("posture", 5), progress=False)
        for skill in (borrowed, own)
    ]
    assert runs[0].success_rate <= 0.2 and runs[1].success_rate >= 0.8


def test_legs_are_matched_by_side_as_well_as_front_to_back():
    """A quadruped's skill on another quadruped: each leg's joints drive the same leg."""
    a, b = sim.transfer.procedural_quadruped(3), sim.transfer.procedural_quadruped(4)
    skill = sim.transfer.native_skill(a, "posture").skill
    moved = sim.transfer.retarget(skill, a, b, "posture")
    assert moved is skill  # same slots in the same order: nothing to rewire
    reversed_b = sim.transfer.Robot(
        b.name, b.kind, b.scene, b.joints, tuple(reversed(b.slots)), b.gear, b.size, b.home
    )
    weights = sim.transfer.retarget(skill, a, reversed_b, "posture").module().state_dict()
    original = skill.module().state_dict()
    n = len(a.joints)
    rewired, last = weights["layers.0.weight"].numpy(), original["layers.0.weight"].numpy()
    assert np.allclose(rewired[:, 2 * n :], last[::-1, 2 * n :])


def test_sources_are_the_own_skill_and_a_seeded_draw():
    robots = sim.transfer.robot_population(6, 0, shipped=False)
    natives = [(i, sim.transfer.native_skill(r, "reach")) for i, r in enumerate(robots)]
    picked = _sources(natives, robots[2], 3, seed=0)
    assert len(picked) == 4 and (2, natives[2][1]) in picked
    assert picked == _sources(natives, robots[2], 3, seed=0)
    assert _sources(natives, robots[2], None, 0) == natives == _sources(natives, robots[2], 9, 0)


def unactuated(robot: sim.transfer.Robot) -> list[str]:
    """The scene's joints that no actuator drives, the free base aside."""
    model = mujoco.MjModel.from_xml_string(robot.scene)
    names = [model.joint(j).name for j in range(model.njnt) if model.jnt_type[j] != 0]
    return [n for n in names if n not in robot.joints]


def continuous(robot: sim.transfer.Robot) -> list[str]:
    model = mujoco.MjModel.from_xml_string(robot.scene)
    return [
        model.joint(j).name
        for j in range(model.njnt)
        if model.jnt_type[j] != 0 and not model.jnt_limited[j]
    ]


@settings(max_examples=10, deadline=None)
@given(
    seed=SEEDS,
    make=st.sampled_from(
        ["industrial_arm", "two_armed", "mobile_manipulator", "procedural_humanoid"]
    ),
)
def test_unactuated_joints_are_fingers_and_casters_and_move_under_the_driven_ones(seed, make):
    """Held by its own law for a second, a body's unactuated joints (a gripper's mimic finger or
    distal phalanges, a hand's, casters) move with nothing driving them, within their ranges."""
    robot = getattr(sim.transfer, make)(seed)
    (family,) = robot.tasks
    passive = unactuated(robot)
    assert all("finger" in n or "caster" in n or "_f" in n for n in passive), passive
    if make == "mobile_manipulator":
        assert sorted(n for n in passive if "caster" in n) == sorted(
            f"caster{k}_{part}" for k in (0, 1) for part in ("roll", "swivel")
        )
        assert set(continuous(robot)) >= {"caster0_roll", "caster1_swivel", "wheel0", "wheel1"}
    task = robot.task(family)
    model = task.template.model
    data = mujoco.MjData(model)
    law = _Law(robot, model, family)
    for _ in range(int(1.0 / (model.opt.timestep * task.definition["control_substeps"]))):
        law.control(data, np.zeros(len(robot.joints)))
        mujoco.mj_step(model, data, nstep=task.definition["control_substeps"])
    assert np.isfinite(data.qpos).all() and not data.warning.number.any()
    for name in passive:
        joint = model.joint(name)
        if model.jnt_limited[joint.id]:
            low, high = model.jnt_range[joint.id]
            assert low - 0.05 <= data.qpos[joint.qposadr[0]] <= high + 0.05


def test_the_real_shaped_population_has_unactuated_and_continuous_joints_and_light_links():
    """What kept vendor files out of the learned encoder's distribution: a third of these bodies
    have unactuated joints, a third continuous ones, most a moving link under 100 g, and humanoids
    reach 35-40 joints with their hands."""
    robots = sim.transfer.robot_population(
        0, 0, industrial=12, two_armed=4, mobile=4, quadrupeds=12, humanoids=8, shipped=False
    )
    assert 0.25 <= np.mean([bool(unactuated(r)) for r in robots]) <= 0.5
    assert 0.25 <= np.mean([bool(continuous(r)) for r in robots]) <= 0.5
    assert any(continuous(r) for r in robots if r.morphology == "quadruped")
    assert any(continuous(r) for r in robots if r.morphology == "industrial arm")
    lightest = []
    for robot in robots:
        model = mujoco.MjModel.from_xml_string(robot.scene)
        moving = {int(model.jnt_bodyid[j]) for j in range(model.njnt) if model.jnt_type[j] != 0}
        lightest.append(min(model.body_mass[b] for b in moving))
    assert np.mean(np.array(lightest) < 0.1) > 0.5
    joints = [len(r.joints) + len(unactuated(r)) for r in robots if r.morphology == "humanoid"]
    assert 35 <= max(joints) <= 45 and min(joints) >= 10

"""Native skills, retargeting between bodies, and the transfer dataset (real MuJoCo evaluations)."""

from __future__ import annotations

import json

import mujoco
import numpy as np
import pytest
from click.testing import CliRunner

import sim
import sim.transfer
from knowledge import TransferDataset
from sim.cli import encoder_dataset_command
from sim.transfer._datasets import observation_slots, posture_skill, reach_skill, sampler

ARMS = {
    n: next(r for s in range(100) if len((r := sim.transfer.procedural_arm(s)).joints) == n)
    for n in (3, 7)
}
ARM7, WALKER = sim.transfer.shipped_robots()
SIX = next(r for s in range(100) if len((r := sim.transfer.procedural_legged(s)).joints) == 12)


def weights(skill: sim.Policy) -> np.ndarray:
    return skill.module().layers[0].weight.detach().numpy()


def test_a_skill_is_unchanged_between_bodies_with_one_interface():
    skill = reach_skill(ARMS[7])
    assert sim.transfer.retarget(skill, ARMS[7], ARM7, "reach") is skill


def test_an_arm_skill_drives_a_smaller_arm_joint_by_joint_from_the_base():
    skill = reach_skill(ARMS[7])
    small = sim.transfer.retarget(skill, ARMS[7], ARMS[3], "reach")
    task = ARMS[3].task("reach")
    assert (small.spec.obs_dim, small.spec.act_dim) == (task.obs_dim, task.act_dim)
    assert np.array_equal(
        weights(small)[:, -3:], weights(skill)[:3, -3:]
    )  # goal offset -> first three joints
    assert not weights(small)[:, :-3].any()
    large = sim.transfer.retarget(small, ARMS[3], ARMS[7], "reach")
    assert np.array_equal(weights(large)[:3, -3:], weights(small)[:, -3:])
    assert not weights(large)[3:].any()  # joints the skill does not know are commanded to 0 (home)
    assert sim.evaluate(task, small, branches=4, progress=False).n == 4


def test_legs_are_matched_front_to_back():
    posture = posture_skill(SIX)
    on_walker = sim.transfer.retarget(posture, SIX, WALKER, "posture")
    six, two = weights(posture), weights(on_walker)
    # walker actuators: hind hip, hind knee, fore hip, fore knee; the six legs run front (0) to back
    # (5)
    assert np.array_equal(two[[2, 3], -6:], six[[0, 1], -6:]) and np.array_equal(
        two[[0, 1], -6:], six[[10, 11], -6:]
    )
    assert len(observation_slots(WALKER, "posture")) == two.shape[1]
    with pytest.raises(ValueError, match="posture"):
        sim.transfer.retarget(posture, SIX, ARM7, "posture")


def test_native_skills_work_on_their_own_bodies():
    for robot in (ARMS[3], ARMS[7]):
        result = sim.evaluate(
            robot.task("reach"),
            sim.transfer.native_skill(robot, "reach").skill,
            branches=16,
            sampler=sampler("reach", 5),
            progress=False,
        )
        assert result.success_rate >= 0.8
    for robot in (SIX, WALKER):
        skill = sim.transfer.native_skill(robot, "posture").skill
        result = sim.evaluate(
            robot.task("posture"), skill, branches=16, sampler=sampler("posture", 5), progress=False
        )
        assert result.success_rate >= 0.8 and skill.spec.hidden == ()


def test_a_posture_skill_bends_the_knees_nearest_the_lower_goal():
    """The map follows its goal: a lower front goal bends the front knees most, a lower back goal
    the back ones."""
    w = weights(posture_skill(SIX))
    knees = [
        k for k, s in enumerate(SIX.slots) if s.joint == 1
    ]  # front to back; they bend negative
    front, back = w[knees, -4], w[knees, -1]  # per metre of goal offset, the z of each goal
    assert np.all(np.diff(front) < 0) and np.all(np.diff(back) > 0)
    assert front[0] > 10 * abs(front[-1]) and back[-1] > 10 * abs(back[0])


def test_a_posture_skill_fails_where_the_gear_differs():
    """Open loop, it works only as far as the bodies agree: the walker with twice the actuator gear
    (same joint stiffness) holds the postures with its own skill, and misses them with the
    walker's."""
    spec = mujoco.MjSpec.from_string(WALKER.scene)
    for actuator in spec.actuators:
        actuator.gear[0] = 2.0
        actuator.gainprm[0] /= 4
        actuator.biasprm[1:3] = actuator.biasprm[1:3] / 4
        actuator.ctrlrange = actuator.ctrlrange * 2
    geared = sim.transfer.Robot(
        "geared-walker",
        "legged",
        spec.to_xml(),
        WALKER.joints,
        WALKER.slots,
        (2.0,) * 4,
        WALKER.size,
        WALKER.home,
    )
    task, branches = (
        geared.task("posture"),
        {"branches": 16, "sampler": sampler("posture", 5), "progress": False},
    )
    assert sim.evaluate(task, posture_skill(geared), **branches).success_rate >= 0.8
    assert (
        sim.evaluate(
            task,
            sim.transfer.retarget(posture_skill(WALKER), WALKER, geared, "posture"),
            **branches,
        ).success_rate
        <= 0.25
    )


def test_the_dataset_is_the_same_with_any_number_of_workers(tmp_path):
    robots = [sim.transfer.procedural_arm(s) for s in range(3)] + [
        WALKER,
        sim.transfer.procedural_legged(0),
    ]
    one = sim.transfer.transfer_dataset(robots, branches=4, workers=1, seed=2, progress=False)
    two = sim.transfer.transfer_dataset(robots, branches=4, workers=2, seed=2, progress=False)
    assert one.transfers == two.transfers and one.names == two.names
    assert len(one.transfers) == 3 * 3 + 2 * 2 and one.tasks == ("posture", "reach")
    assert all(t.trials == 4 for t in one.transfers)
    assert np.diag(one.rates("reach")[:3, :3]).min() >= 0.5  # each arm's own skill, on its own body
    assert np.diag(one.rates("posture")[3:, 3:]).min() >= 0.5
    assert one.meta["branches"] == 4 and [r["name"] for r in one.meta["robots"]] == [
        r.name for r in robots
    ]
    assert one.classes == {r.name: sim.transfer.CLASSES[r.morphology] for r in robots}
    with pytest.raises(ValueError, match="distinct"):
        sim.transfer.transfer_dataset(robots + robots[:1], branches=1)


def test_the_dataset_command_writes_a_file(tmp_path):
    out = tmp_path / "transfer.json.gz"
    result = CliRunner().invoke(
        encoder_dataset_command,
        [
            "--arms",
            "2",
            "--legged",
            "0",
            "--no-shipped",
            "--branches",
            "2",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    data = TransferDataset.load(out)
    assert (
        summary["bodies"] == len(data.bodies) == 2
        and summary["transfers"] == 4
        and data.tasks == ("reach",)
    )
    empty = CliRunner().invoke(
        encoder_dataset_command, ["--arms", "0", "--legged", "0", "--no-shipped", "--out", str(out)]
    )
    assert empty.exit_code == 2


def test_body_classes_name_each_robot_s_kind_from_the_dataset_records():
    """The recipe's classes come from what `transfer_dataset` recorded: the class, or for older
    files the morphology, or for files written before that (arms and planar legged bodies only)
    the kind."""
    robots = sim.transfer.robot_population(1, 1, industrial=1, quadrupeds=1)
    records = [
        {"name": r.name, "kind": r.kind, "morphology": r.morphology, "source": r.source}
        for r in robots
    ]
    now = TransferDataset((), (), {"robots": records})
    older = TransferDataset((), (), {"robots": [{"name": "arm-9", "kind": "arm"}]})
    recorded = TransferDataset((), (), {"robots": [{"name": "x-1", "kind": "arm", "class": "c"}]})
    classes = sim.transfer.body_classes([now, older, recorded])
    assert classes == {
        **{r.name: sim.transfer.CLASSES[r.morphology] for r in robots},
        "arm-9": "arm",
        "x-1": "c",  # a class the file records is the class
    }
    assert {classes[r.name] for r in robots} == {"arm", "planar legged", "quadruped"}

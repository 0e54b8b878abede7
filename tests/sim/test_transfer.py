"""Native skills, retargeting between bodies, and the transfer dataset (real MuJoCo evaluations)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import sim
from knowledge import TransferDataset
from sim._transfer import observation_slots, reach_skill, sampler, walk_skill
from sim.cli import encoder_dataset_command

ARMS = {n: next(r for s in range(100) if len((r := sim.procedural_arm(s)).joints) == n) for n in (3, 7)}
ARM7, WALKER = sim.shipped_robots()
SIX = next(r for s in range(100) if len((r := sim.procedural_legged(s)).joints) == 12)


def weights(skill: sim.Skill) -> np.ndarray:
    return skill.module().layers[0].weight.detach().numpy()


def test_a_skill_is_unchanged_between_bodies_with_one_interface():
    skill = reach_skill(ARMS[7])
    assert sim.retarget(skill, ARMS[7], ARM7, "reach") is skill


def test_an_arm_skill_drives_a_smaller_arm_joint_by_joint_from_the_base():
    skill = reach_skill(ARMS[7])
    small = sim.retarget(skill, ARMS[7], ARMS[3], "reach")
    task = ARMS[3].task("reach")
    assert (small.spec.obs_dim, small.spec.act_dim) == (task.obs_dim, task.act_dim)
    assert np.array_equal(weights(small)[:, -3:], weights(skill)[:3, -3:])  # goal offset -> first three joints
    assert not weights(small)[:, :-3].any()
    large = sim.retarget(small, ARMS[3], ARMS[7], "reach")
    assert np.array_equal(weights(large)[:3, -3:], weights(small)[:, -3:])
    assert not weights(large)[3:].any()  # joints the skill does not know are commanded to 0 (home)
    assert sim.evaluate(task, small, branches=4, progress=False).n == 4


def test_legs_are_matched_front_to_back():
    gait = sim._transfer._linear_skill(*sim._transfer._gait(SIX, np.array([0.5, 0.6, -2.0, -1.0, 0.1, -0.4])), "gait")
    on_walker = sim.retarget(gait, SIX, WALKER, "walk")
    six, two = weights(gait), weights(on_walker)
    # walker actuators: hind hip, hind knee, fore hip, fore knee; the six legs run front (0) to back (5)
    assert np.array_equal(two[[2, 3], :2], six[[0, 1], :2]) and np.array_equal(two[[0, 1], :2], six[[10, 11], :2])
    assert len(observation_slots(WALKER, "walk")) == two.shape[1]
    with pytest.raises(ValueError, match="walk"):
        sim.retarget(gait, SIX, ARM7, "walk")


def test_native_skills_work_on_their_own_bodies():
    for robot in (ARMS[3], ARMS[7]):
        result = sim.evaluate(robot.task("reach"), sim.native_skill(robot, "reach").skill, branches=16,
                              sampler=sampler("reach", 5), progress=False)
        assert result.success_rate >= 0.8
    gait = walk_skill(WALKER, iterations=4)
    walked = sim.evaluate(WALKER.task("walk"), gait, branches=16, sampler=sampler("walk", 5), progress=False)
    assert walked.success_rate >= 0.5 and gait.spec.hidden == ()


def test_the_dataset_is_the_same_with_any_number_of_workers(tmp_path):
    robots = [sim.procedural_arm(s) for s in range(3)] + [WALKER, sim.procedural_legged(0)]
    one = sim.transfer_dataset(robots, branches=4, workers=1, seed=2, progress=False)
    two = sim.transfer_dataset(robots, branches=4, workers=2, seed=2, progress=False)
    assert one.transfers == two.transfers and one.names == two.names
    assert len(one.transfers) == 3 * 3 + 2 * 2 and one.tasks == ("reach", "walk")
    assert all(t.trials == 4 for t in one.transfers)
    reach = one.rates("reach")
    assert np.diag(reach[:3, :3]).min() >= 0.5  # each arm's own skill, on its own body
    assert one.meta["branches"] == 4 and [r["name"] for r in one.meta["robots"]] == [r.name for r in robots]
    with pytest.raises(ValueError, match="distinct"):
        sim.transfer_dataset(robots + robots[:1], branches=1)


def test_the_dataset_command_writes_a_file(tmp_path):
    out = tmp_path / "transfer.json.gz"
    result = CliRunner().invoke(encoder_dataset_command, ["--arms", "2", "--legged", "0", "--no-shipped", "--branches",
                                                          "2", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    data = TransferDataset.load(out)
    assert summary["bodies"] == len(data.bodies) == 2 and summary["transfers"] == 4 and data.tasks == ("reach",)
    empty = CliRunner().invoke(encoder_dataset_command, ["--arms", "0", "--legged", "0", "--no-shipped", "--out",
                                                         str(out)])
    assert empty.exit_code == 2

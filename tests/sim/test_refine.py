"""Refinement at inference time: a planner around a brittle skill, simulating with nominal dynamics
while the episodes run in their own, does better than the skill alone; what it did distills into a
new skill that does better on its own, which certifies."""

from __future__ import annotations

import pytest

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, TrustPolicy
from sim.evaluation import distill_refined


@pytest.fixture(scope="module")
def refined():
    task = sim.load_task("arm_reach")
    degraded = sim.load_skill("arm_reach_degraded")
    sampler = sim.load_sampler("arm_reach", seed=5)
    result = sim.refine(task, degraded, sampler=sampler, episodes=24, candidates=24, lookahead=10)
    return task, degraded, sampler, result


def test_the_planner_does_better_than_the_skill_alone(refined):
    task, degraded, sampler, result = refined
    alone = sim.evaluate(task, degraded, branches=24, sampler=sampler, progress=False)
    assert result.success.shape == (24,) and result.returns.shape == (24,)
    assert result.success_rate >= alone.success_rate + 0.2, (
        result.success_rate,
        alone.success_rate,
    )
    assert len(result.observations) == len(result.actions) > 24 * 5
    assert result.observations.shape[1] == task.obs_dim and result.actions.shape[1] == task.act_dim


def test_what_it_did_distills_into_a_skill_that_certifies_as_a_new_version(refined):
    task, degraded, _sampler, result = refined
    successor = distill_refined(result, epochs=300)
    fresh = sim.load_sampler("arm_reach", seed=9)
    before = sim.evaluate(task, degraded, branches=64, sampler=fresh, progress=False)
    after = sim.evaluate(task, successor, branches=64, sampler=fresh, progress=False)
    assert after.success_rate > before.success_rate
    kb = knowledge.open(
        ":memory:",
        Identity.generate(),
        policy=TrustPolicy(activation=ActivationPolicy(min_branches=64, min_lower_bound=0.3)),
    )
    old = sim.publish_skill(kb, degraded, "reach", "reach", tasks=[task])
    new = sim.publish_skill(kb, successor, "reach", "reach", tasks=[task], parents=[old.id])
    sim.certify(kb, new.id, after)
    assert kb.is_active(new.id) and kb.skills.get(new.id).parents == (old.id,)


def test_bad_planner_settings_are_refused(short_arm):
    policy = sim.load_skill("arm_reach_good")
    with pytest.raises(ValueError, match="'best' or 'mppi'"):
        sim.refine(short_arm, policy, sampler=sim.Sampler(), method="greedy")
    with pytest.raises(ValueError, match="replan <= lookahead"):
        sim.refine(short_arm, policy, sampler=sim.Sampler(), lookahead=3, replan=5)

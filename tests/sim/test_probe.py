"""Adversarial probing: the cross-entropy search finds a region where a skill fails far more often
than random branches show, reports it as a task and sampler that replay the measurement exactly,
and a policy can refuse certificates whose probe found such a region."""

from __future__ import annotations

import pytest

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, TrustPolicy


@pytest.fixture(scope="module")
def walker_probe():
    task = sim.load_task("walker_forward")
    policy = sim.load_skill("walker_forward_good")
    sampler = sim.load_sampler("walker_forward", seed=3)
    return task, policy, sampler, sim.probe(task, policy, sampler=sampler, budget=256, seed=1)


def test_the_probe_finds_a_failure_region_random_branches_hardly_see(walker_probe):
    task, policy, sampler, found = walker_probe
    random = sim.evaluate(task, policy, branches=256, sampler=sampler, progress=False)
    random_failure = 1 - random.success_rate
    assert random_failure < 0.15 and found.failure_rate >= 3 * random_failure, (
        random_failure,
        found,
    )
    assert found.budget == 256 and found.branches == 64
    assert all(0.0 <= low <= high <= 1.0 for low, high in found.box)


def test_the_region_replays_exactly(walker_probe):
    _task, policy, _sampler, found = walker_probe
    again = sim.evaluate(
        found.task, policy, branches=found.branches, sampler=found.sampler, progress=False
    )
    assert again.n - again.successes == found.failures
    record = found.to_record()
    assert record["format"] == "simnet.sim.probe/1" and record["failure_rate"] == found.failure_rate
    assert record["region"]["task_hash"] == found.task.hash
    assert sim.Sampler.from_json(record["region"]["sampler"]) == found.sampler


def test_a_policy_can_refuse_a_certificate_whose_probe_found_a_failure_region(walker_probe):
    task, policy, sampler, found = walker_probe
    strict = ActivationPolicy(min_branches=64, min_lower_bound=0.5, max_probe_failure_rate=0.2)
    kb = knowledge.open(":memory:", Identity.generate(), policy=TrustPolicy(activation=strict))
    skill = sim.publish_skill(kb, policy, "walk", "walk", tasks=[task])
    result = sim.evaluate(task, policy, branches=64, sampler=sampler, progress=False)
    unprobed = sim.certify(kb, skill.id, result)
    assert unprobed.probe is None and not kb.is_active(skill.id)
    assert "carries no adversarial probe" in " ".join(kb.activation(skill.id).reasons)
    probed = sim.certify(kb, skill.id, result, probe=found)
    assert probed.probe["failure_rate"] == found.failure_rate
    assert "has a failure region" in " ".join(kb.activation(skill.id).reasons)
    lenient = ActivationPolicy(min_branches=64, min_lower_bound=0.5, min_probe_budget=256)
    kb.set_policy(TrustPolicy(activation=lenient))
    assert kb.is_active(skill.id)  # probed with enough rollouts; no failure bound asked for
    kb.set_policy(
        TrustPolicy(activation=ActivationPolicy(**{**lenient.__dict__, "min_probe_budget": 1000}))
    )
    assert "the policy asks for 1000" in " ".join(kb.activation(skill.id).reasons)


def test_a_probe_needs_something_to_search_and_enough_budget(short_arm):
    policy = sim.load_skill("arm_reach_good")
    flat = short_arm.replace(init=[])
    with pytest.raises(ValueError, match="nothing to search"):
        sim.probe(flat, policy, sampler=sim.Sampler(), budget=64)
    with pytest.raises(ValueError, match="too few rollouts"):
        sim.probe(short_arm, policy, sampler=sim.load_sampler("arm_reach"), budget=8, rounds=4)


def test_verifying_a_certificate_replays_its_probe_and_catches_a_softened_one(walker_probe):
    task, policy, sampler, found = walker_probe
    kb = knowledge.open(":memory:", Identity.generate())
    skill = sim.publish_skill(kb, policy, "walk", "walk", tasks=[task])
    result = sim.evaluate(task, policy, branches=16, sampler=sampler, progress=False)
    honest = sim.certify(kb, skill.id, result, probe=found)
    assert sim.verify_certificate(kb, honest).valid
    softened = dict(honest.probe, failures=0, failure_rate=0.0)
    lie = kb.certificates.add(
        skill.id,
        branches=honest.branches,
        successes=honest.successes,
        randomized=honest.randomized,
        evaluation=honest.evaluation,
        probe=softened,
    )
    verdict = sim.verify_certificate(kb, lie)
    assert not verdict.valid and "the probe's region fails" in verdict.detail

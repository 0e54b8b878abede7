"""Skills bound to task records, and spot checks: a site re-runs sampled waves of another site's
certificate, counts it once it reproduces, and signs a dispute that replicates when it does not."""

from __future__ import annotations

import json
import random

import pytest

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, TrustPolicy
from sim.evaluation._evaluation_record import _summary
from sim.validation import Validator, ValidatorSettings

POLICY = ActivationPolicy(min_branches=16, min_lower_bound=0.5, spot_check_branches=8)


@pytest.fixture
def sites(tmp_path):
    """A publishes and validates; B spot-checks remote certificates; C only listens."""
    keys = [Identity.generate() for _ in range(3)]
    kbs = []
    for i, key in enumerate(keys):
        policy = TrustPolicy(activation=POLICY)
        for other in keys:
            if other is not key:
                policy = policy.with_root(other.public_key)
        kbs.append(knowledge.open(tmp_path / f"{i}.db", key, policy=policy))
    yield kbs
    for kb in kbs:
        kb.close()


def sync(*kbs):
    for a in kbs:
        for b in kbs:
            if a is not b:
                b.ingest(a.envelopes_since(b.heads()))
                for blob in b.blobs.missing(a.blobs.list()):
                    b.blobs.put(a.blobs.get(blob))


def evaluate(kb, skill, task, branches=32):
    return sim.evaluate(
        task,
        sim.load_policy(kb, skill.id),
        branches=branches,
        wave=8,
        sampler=sim.load_sampler("arm_reach", seed=3),
        progress=False,
    )


def test_a_skill_names_its_tasks_and_any_site_compiles_them(sites, short_arm):
    a, b, _ = sites
    skill = sim.publish_skill(
        a, sim.load_skill("arm_reach_good"), "reach", "reach", tasks=[short_arm]
    )
    assert skill.tasks == (short_arm.hash,)
    sync(a, b)
    (task,) = sim.skill_tasks(b, skill.id)
    assert task.hash == short_arm.hash and task.horizon == 20
    broken = a.tasks.publish({"format": "simnet.task/1", "name": "no-scene"})
    other = a.skills.publish("x", "reach", tasks=[broken])
    with pytest.raises(sim.TaskDefinitionError):
        sim.skill_tasks(a, other.id)
    missing = a.skills.publish("y", "reach", tasks=["00" * 32])
    with pytest.raises(knowledge.UnknownTaskError):
        sim.skill_tasks(a, missing.id)


def test_an_honest_certificate_reproduces_and_then_counts(sites, short_arm):
    a, b, c = sites
    skill = sim.publish_skill(
        a, sim.load_skill("arm_reach_good"), "reach", "reach", tasks=[short_arm]
    )
    cert = sim.certify(a, skill.id, evaluate(a, skill, short_arm))
    sync(a, b, c)
    assert a.is_active(skill.id)  # its own certificate needs no spot check at A
    assert not b.is_active(skill.id) and b.certificates.awaiting_check() == [cert]
    result = sim.spot_check(b, cert, rng=random.Random(1))
    assert (
        result.reproduced
        and len(result.branches) == 8
        and "match the record exactly" in (result.detail)
    )
    assert result.check is not None and result.check.checker == b.identity.public_key_hex
    assert b.is_active(skill.id) and b.certificates.awaiting_check() == []
    sync(a, b, c)
    assert not c.is_active(skill.id)  # B's reproduction is B's: C checks for itself


def test_an_inflated_certificate_is_disputed_and_stops_counting_everywhere(sites, short_arm):
    """A validator runs the degraded skill and signs every branch a success: a spot check of any
    wave catches it, and the dispute it signs carries the evidence to every site."""
    a, b, c = sites
    skill = sim.publish_skill(
        a, sim.load_skill("arm_reach_degraded"), "reach-degraded", "reach", tasks=[short_arm]
    )
    honest = evaluate(a, skill, short_arm).to_record()
    assert sum(honest["outcomes"]["success"]) < 32
    inflated = json.loads(json.dumps(honest))
    inflated["outcomes"]["success"] = [1] * 32
    inflated["summary"] = _summary(32, 32, honest["summary"]["mean_return"], 0.95)
    sim.check_record(inflated)  # consistent in itself: only a re-run tells
    cert = a.certificates.add(
        skill.id,
        branches=32,
        successes=32,
        randomized=sim.randomized(inflated),
        evaluation=inflated,
    )
    sync(a, b, c)
    for kb in (a, c):  # without spot checks, the lie counts
        kb.set_policy(TrustPolicy(kb.policy.roots, ActivationPolicy(min_branches=16)))
    assert a.is_active(skill.id) and c.is_active(skill.id)
    result = sim.spot_check(b, cert, branches=1, budget_s=0)
    assert not result.reproduced and len(result.branches) == 8  # one whole wave
    assert "differ from the record on its own platform" in result.detail
    evidence = result.check.evidence
    assert evidence["recorded_success"] == [1] * 8 and 0 in evidence["rerun_success"]
    sync(a, b, c)
    for kb in (a, b, c):
        assert not kb.is_active(skill.id), kb.activation(skill.id)
        assert [d.id for d in kb.certificates.disputes(cert.validator)] == [result.check.id]


def test_a_record_that_cannot_be_re_run_raises_and_signs_nothing(sites, short_arm):
    a, b, _ = sites
    skill = sim.publish_skill(
        a, sim.load_skill("arm_reach_good"), "reach", "reach", tasks=[short_arm]
    )
    cert = a.certificates.add(skill.id, branches=16, successes=16, evaluation={"note": "trust me"})
    sync(a, b)
    with pytest.raises(sim.EvaluationRecordError):
        sim.spot_check(b, cert)
    assert b.certificates.checks(cert.id) == []


def test_a_validators_spot_check_honours_its_job_time_budget(sites, short_arm):
    """A validator's spot check re-ran the record's waves with no per-step callback, so
    `max_job_s` (and a stop) was not honoured until the spot check ended: with a budget already
    spent, the old code signed its check anyway. Now it stops at the first control step, over
    budget, never retried, nothing signed."""
    a, b, c = sites
    skill = sim.publish_skill(
        a, sim.load_skill("arm_reach_good"), "reach", "reach", tasks=[short_arm]
    )
    cert = sim.certify(a, skill.id, evaluate(a, skill, short_arm))
    sync(a, b, c)
    settings = ValidatorSettings(certifies=False, max_job_s=1e-9)
    validator = Validator(b, settings, rng=random.Random(1))
    job = validator.step()
    assert job is not None and job.kind == "spot_check"
    (failed,) = validator.status()["failed"]
    assert failed["retry_at"] is None, failed
    assert "over budget: it ran for more than this site's budget of 1e-09 s" in failed["reason"]
    assert b.certificates.checks(cert.id) == [] and validator.totals["spot_checks"] == 0

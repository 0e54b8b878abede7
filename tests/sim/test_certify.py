"""From evaluation to activation: skills as records with blob weights, certificates that re-run."""

from __future__ import annotations

import dataclasses
import json

import pytest

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, TrustPolicy


@pytest.fixture
def site(tmp_path):
    policy = TrustPolicy(
        activation=ActivationPolicy(
            min_branches=16,
            min_lower_bound=0.8,
            required_randomization=frozenset({"mass", "damping"}),
        )
    )
    kb = knowledge.open(tmp_path / "site.db", Identity.generate(), policy=policy)
    yield kb
    kb.close()


@pytest.fixture
def published(site):
    good = sim.publish_skill(site, sim.load_skill("arm_reach_good"), "reach-good", "reach")
    bad = sim.publish_skill(site, sim.load_skill("arm_reach_degraded"), "reach-degraded", "reach")
    return good, bad


def run(site, skill_id, task, branches=16, seed=1):
    return sim.evaluate(
        task,
        sim.load_policy(site, skill_id),
        branches=branches,
        sampler=sim.load_sampler("arm_reach", seed=seed),
        progress=False,
    )


def test_a_published_skill_loads_back_as_the_same_policy(site, published):
    good, _bad = published
    loaded = sim.load_policy(site, good.id)
    shipped = sim.load_skill("arm_reach_good")
    assert loaded.hash == shipped.hash and loaded.weights == shipped.weights
    assert good.policy["weights"] in good.blobs  # the weights travel as a blob the record names


def test_missing_or_corrupt_weights_are_specific_errors(tmp_path, published, site):
    good, _bad = published
    other = knowledge.open(
        tmp_path / "other.db",
        Identity.generate(),
        policy=TrustPolicy().with_root(site.identity.public_key),
    )
    other.ingest(site.envelopes_since({}))  # the record arrives, the blob does not (blobs are lazy)
    with pytest.raises(knowledge.BlobError, match="not stored"):
        sim.load_policy(other, good.id)
    record = dict(good.policy)
    record["architecture"] = {**record["architecture"], "hidden": [8]}
    wrong = site.skills.publish("wrong-spec", "reach", policy=record, blobs=good.blobs)
    with pytest.raises(sim.PolicyPayloadError):
        sim.load_policy(site, wrong.id)
    other.close()


def test_only_the_good_skill_becomes_active(site, published, short_arm):
    good, bad = published
    for skill in published:
        assert not site.is_active(skill.id)
        sim.certify(site, skill.id, run(site, skill.id, short_arm))
    assert site.is_active(good.id), site.activation(good.id)
    assert not site.is_active(bad.id)
    (cert,) = site.certificates.for_skill(good.id)
    assert {"mass", "damping", "gain", "gravity", "pose", "initial_state"} <= set(cert.randomized)
    assert cert.evaluation["summary"]["n"] == 16


def test_a_skill_that_names_an_entry_point_evaluates_certifies_and_verifies(
    site, installed_policy, short_walker
):
    """load_policy gives the skill's EntryPointRef (checked to be installed), which evaluate calls
    with the task, not the factory itself: a factory is no policy."""
    ref = sim.EntryPointRef("stand_still", "fleetctl", "1.2.0")
    skill = site.skills.publish("stand-still", "walk", policy=ref.to_json())
    loaded = sim.load_policy(site, skill.id)
    assert loaded == ref
    result = sim.evaluate(short_walker, loaded, branches=4, progress=False)
    assert result.to_record()["policy"] == ref.to_json()
    cert = sim.certify(site, skill.id, result)
    assert sim.verify_certificate(site, cert).valid
    elsewhere = site.skills.publish(
        "stand-still-1.3", "walk", policy=dataclasses.replace(ref, version="1.3.0").to_json()
    )
    with pytest.raises(sim.EntryPointError, match="needs fleetctl==1.3.0"):
        sim.load_policy(site, elsewhere.id)


def test_certificate_verifies_and_tampering_any_claim_fails(site, published, short_arm):
    good, _bad = published
    cert = sim.certify(site, good.id, run(site, good.id, short_arm))
    assert sim.verify_certificate(site, cert).valid
    tampered = [
        dataclasses.replace(cert, successes=cert.successes - 1),
        dataclasses.replace(cert, branches=cert.branches + 1),
        dataclasses.replace(cert, confidence=0.99),
        dataclasses.replace(cert, randomized=("mass",)),
        dataclasses.replace(cert, evaluation=None),
    ]
    record = json.loads(json.dumps(cert.evaluation))
    record["outcomes"]["success"][0] = 1 - record["outcomes"]["success"][0]
    tampered.append(dataclasses.replace(cert, evaluation=record))
    record = json.loads(json.dumps(cert.evaluation))
    record["sampler"]["seed"] += (
        1  # a different world than the one claimed: outcomes will not match
    )
    tampered.append(dataclasses.replace(cert, evaluation=record))
    record = json.loads(json.dumps(cert.evaluation))
    record["task"]["definition"]["horizon"] += 5  # the task hash no longer matches
    tampered.append(dataclasses.replace(cert, evaluation=record))
    for bad in tampered:
        verdict = sim.verify_certificate(site, bad)
        assert not verdict.valid, bad


def test_a_lying_validator_does_not_reproduce(site, published, short_arm):
    """A validator signs a record of the degraded skill's outcomes under the good skill: it re-runs
    false."""
    good, bad = published
    bad_run = run(site, bad.id, short_arm).to_record()
    with pytest.raises(sim.EvaluationRecordError, match="not skill"):
        sim.certify(
            site, good.id, bad_run
        )  # certify itself refuses an evaluation of another policy
    forged_record = {**bad_run, "policy": run(site, good.id, short_arm).to_record()["policy"]}
    cert = site.certificates.add(
        good.id,
        branches=16,
        successes=forged_record["summary"]["successes"],
        confidence=0.95,
        randomized=sim.randomized(forged_record),
        evaluation=forged_record,
    )
    verdict = sim.verify_certificate(site, cert)
    assert not verdict.valid


def test_certificates_replicate_with_the_skill_and_gate_activation_elsewhere(
    tmp_path, site, published, short_arm
):
    good, bad = published
    for skill in published:
        sim.certify(site, skill.id, run(site, skill.id, short_arm))
    strict = TrustPolicy(activation=ActivationPolicy(min_branches=64)).with_root(
        site.identity.public_key
    )
    lenient = TrustPolicy(
        activation=ActivationPolicy(min_branches=16, min_lower_bound=0.5)
    ).with_root(site.identity.public_key)
    for policy, expected in ((strict, set()), (lenient, {good.id})):
        with knowledge.open(
            tmp_path / f"{len(expected)}.db", Identity.generate(), policy=policy
        ) as other:
            other.ingest(site.envelopes_since({}))
            assert {s.id for s in other.skills.list(active_only=True)} == expected


def test_actuators_addressed_through_their_joints_count_as_gain_and_bias_randomization():
    terms = [
        {"target": "actuator@joint/*/gain", "op": "scale", "dist": "uniform", "low": 1, "high": 2},
        {"target": "actuator@joint/j1/bias", "op": "add", "dist": "constant", "value": 0.0},
    ]
    record = {"sampler": {"terms": terms}, "task": {"definition": {"init": []}}}
    assert sim.randomized(record) == ["bias", "gain"]

"""The calibration ledger: robots' outcome records, predictions scored against them, the field test
that suspends a skill doing worse than its certificates promised, and suspensions that replicate."""

from __future__ import annotations

import json
import math

import pytest

import knowledge
from knowledge import ActivationPolicy, Identity, Role, TrustPolicy
from knowledge.stats import crps, shortfall_log_ratio

# the certificates here are typed in: activation counts them only with rerunnable_only off
POLICY = ActivationPolicy(min_branches=64, min_lower_bound=0.8, rerunnable_only=False)


def site(policy: ActivationPolicy = POLICY, *roots: knowledge.KnowledgeBase):
    trust = TrustPolicy(activation=policy)
    for root in roots:
        trust = trust.with_root(root.identity.public_key)
    return knowledge.open(":memory:", Identity.generate(), policy=trust)


def certified(kb, successes=128, branches=128, steps=(40.0, 50.0, 60.0)):
    skill = kb.skills.publish("reach", "reach")
    outcomes = {"success": [1] * successes + [0] * (branches - successes)}
    outcomes["steps"] = [steps[i % len(steps)] for i in range(branches)]
    kb.certificates.add(
        skill.id, branches=branches, successes=successes, evaluation={"outcomes": outcomes}
    )
    return skill


def report(kb, skill, successes: int, failures: int, embodiment="arm7", steps=45.0):
    with kb.batch():
        for ok in [True] * successes + [False] * failures:
            kb.outcomes.record(skill.id, success=ok, embodiment=embodiment, values={"steps": steps})


def test_outcomes_are_one_cumulative_record_per_writer_and_skill():
    kb = site()
    skill = certified(kb)
    before = kb.heads()[kb.identity.public_key_hex].seq
    report(kb, skill, 30, 10)
    assert kb.heads()[kb.identity.public_key_hex].seq == before + 1  # one envelope for 40 runs
    (found,) = kb.outcomes.get(skill.id)
    assert (found.trials, found.successes, found.embodiment) == (40, 30, "arm7")
    assert found.values["steps"] == (45.0,) * 40 and found.site == kb.identity.public_key_hex
    assert kb.outcomes.totals(skill.id) == knowledge.Counts(40, 30, 10)
    with pytest.raises(ValueError, match="one body per writer and skill"):
        kb.outcomes.record(skill.id, success=True, embodiment="quadruped")
    with pytest.raises(ValueError, match="positive integer"):
        kb.outcomes.record(skill.id, success=True, embodiment="arm7", trials=0)
    with pytest.raises(knowledge.UnknownSkillError):
        kb.outcomes.record("ab" * 32, success=True, embodiment="arm7")


def test_only_writers_with_publish_report_outcomes_and_they_replicate_by_site():
    a = site()
    b = site(POLICY, a)
    skill = certified(a)
    robot_key = Identity.generate()
    a.delegate(robot_key.public_key, [Role.VALIDATE])  # no publish role
    robot = knowledge.open(
        ":memory:", robot_key, policy=TrustPolicy().for_device_of(a.identity.public_key)
    )
    robot.ingest(a.envelopes_since({}))
    robot.learn_site_heads(a.heads())
    with pytest.raises(knowledge.NotAuthorizedError):
        robot.outcomes.record(skill.id, success=True, embodiment="arm7")
    report(a, skill, 5, 0)
    b.ingest(a.envelopes_since({}))
    (found,) = b.outcomes.get(skill.id)
    assert found.site == a.identity.public_key_hex and found.trials == 5


def test_the_field_test_keeps_an_honest_skill_and_suspends_a_miscalibrated_one():
    kb = site()
    honest, worse = certified(kb), certified(kb, steps=(30.0,))
    report(kb, honest, 285, 15)  # 95% in the field: as promised (lower bound ~0.97 at 128/128)
    test = kb.ledger.field_test(honest.id)
    assert test is not None and not test.suspended and kb.is_active(honest.id)
    trials = 0
    while not kb.ledger.field_test(worse.id).suspended if trials else True:
        report(kb, worse, 3, 2)  # 60% in the field
        trials += 5
    assert trials <= 40  # as early as the evidence allows
    test = kb.ledger.field_test(worse.id)
    assert test.log_ratio >= math.log(1 / POLICY.field_alpha) == test.threshold
    activation = kb.activation(worse.id)
    assert not activation.active and activation.reasons[0].startswith(
        "suspended here: field success"
    )
    kb.set_policy(
        TrustPolicy(kb.policy.roots, ActivationPolicy(**{**POLICY.__dict__, "field_check": False}))
    )
    assert kb.is_active(worse.id)


def test_suspensions_replicate_with_their_evidence_and_other_sites_follow_if_they_choose():
    a = site()
    follower = site(ActivationPolicy(**{**POLICY.__dict__, "follow_suspensions": True}), a)
    bystander = site(POLICY, a)
    skill = certified(a)
    report(a, skill, 12, 28)
    assert a.ledger.publish_suspensions() == [skill.id]
    assert a.ledger.publish_suspensions() == []  # nothing changed since
    for other in (follower, bystander):
        other.ingest(a.envelopes_since({}))
    assert not follower.is_active(skill.id)
    assert "suspended by" in follower.activation(skill.id).reasons[0]
    assert bystander.is_active(skill.id)  # it has no field evidence of its own and does not follow
    report(a, skill, 1000, 0)  # the skill recovers in the field: the suspension is lifted
    assert a.is_active(skill.id), a.activation(skill.id)
    assert a.ledger.publish_suspensions() == [skill.id]
    follower.ingest(a.envelopes_since(follower.heads()))
    assert follower.is_active(skill.id)


def test_ledger_rows_score_predictions_against_outcomes(tmp_path):
    kb = site()
    skill = certified(kb, successes=120, branches=128, steps=(40.0, 60.0))
    report(kb, skill, 18, 2, steps=50.0)
    (row,) = kb.ledger.rows()
    p = 120 / 128
    assert (row.site, row.embodiment, row.task, row.skills) == (
        kb.identity.public_key_hex,
        "arm7",
        "reach",
        1,
    )
    assert row.brier == pytest.approx((18 * (1 - p) ** 2 + 2 * p**2) / 20)
    assert row.log_score == pytest.approx(-(18 * math.log(p) + 2 * math.log(1 - p)) / 20)
    assert row.coverage == 1.0  # 0.9 lies in the certificate's 95% interval
    assert row.crps["steps"] == pytest.approx(crps([40.0, 60.0] * 64, 50.0)) == pytest.approx(5.0)
    kb.ledger.calibration_png(tmp_path / "calibration.png")
    assert (tmp_path / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_shortfall_log_ratio_and_crps():
    assert shortfall_log_ratio(0, 0, 0.9, 0.8) == 0.0
    assert shortfall_log_ratio(9, 10, 0.9, 0.8) < 0 < shortfall_log_ratio(5, 10, 0.9, 0.8)
    with pytest.raises(ValueError):
        shortfall_log_ratio(1, 2, 0.8, 0.9)
    assert crps([1.0], 1.0) == 0.0 and crps([0.0, 2.0], 1.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        crps([], 1.0)


def test_simnet_ledger_prints_scores_suspensions_and_a_plot(tmp_path):
    from click.testing import CliRunner

    from knowledge.cli import main

    home = knowledge.SiteHome(tmp_path)
    key = Identity.generate()
    key.save(home.key)
    home.policy.write_text(TrustPolicy(activation=POLICY).to_toml())
    with knowledge.open(home.store, key, policy=home.policy) as kb:
        skill = certified(kb)
        report(kb, skill, 10, 30)
    runner = CliRunner()
    out = runner.invoke(
        main, ["--home", str(tmp_path), "ledger", "--plot", str(tmp_path / "c.png")]
    )
    assert out.exit_code == 0, out.output
    assert "arm7" in out.output and "suspended here: reach" in out.output
    assert (tmp_path / "c.png").exists()
    data = runner.invoke(main, ["--home", str(tmp_path), "ledger", "--json"])
    parsed = json.loads(data.output)
    assert parsed["rows"][0]["trials"] == 40 and parsed["suspended"][0]["skill"] == skill.id

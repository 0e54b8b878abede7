import copy
import json

import numpy as np
import pytest

from knowledge import canonical_json
from sim import (
    SPRT,
    EvaluationRecordError,
    check_record,
    evaluate,
    load_sampler,
    load_skill,
    record_hash,
    reproduce,
)
from sim.evaluation._evaluation_record import _summary, environment, outcomes_of


@pytest.fixture(scope="module")
def recorded(short_walker):
    skill = load_skill("walker_forward_good")
    result = evaluate(
        short_walker,
        skill,
        branches=12,
        wave=4,
        sampler=load_sampler("walker_forward", seed=9),
        sprt=SPRT(0.3, 0.9),
        progress=False,
    )
    return skill, result, result.to_record()


def test_records_are_json_safe_and_deterministic(recorded, short_walker):
    skill, result, record = recorded
    assert json.loads(canonical_json(record)) == record
    again = evaluate(
        short_walker,
        skill,
        branches=12,
        wave=4,
        sampler=load_sampler("walker_forward", seed=9),
        sprt=SPRT(0.3, 0.9),
        threads=1,
        progress=False,
    ).to_record()
    assert canonical_json(again) == canonical_json(record)
    assert record_hash(again) == record_hash(record)
    assert record["task"]["hash"] == short_walker.hash
    assert record["template"]["source_hash"] == short_walker.template.source_hash
    assert record["policy"]["skill_hash"] == skill.hash
    assert record["layout"]["wave"] == 4 and record["sampler"]["seed"] == 9
    assert record["environment"]["mujoco"] == environment()["mujoco"]
    assert record["summary"]["n"] == len(record["outcomes"]["branch"]) == result.n
    assert record["sequential"]["decision"] == result.decision
    assert outcomes_of(record) == result.outcomes


def test_reproduce_on_the_same_platform_is_exact(recorded):
    skill, result, record = recorded
    verdict = reproduce(json.loads(json.dumps(record)), skill, threads=1, progress=False)
    assert verdict.matches and verdict.exact and verdict.same_platform
    assert verdict.rerun.outcomes == result.outcomes


def test_elsewhere_the_rate_must_lie_in_the_interval(recorded):
    skill, _, record = recorded
    elsewhere = copy.deepcopy(record)
    elsewhere["environment"]["platform"]["machine"] = "riscv64"
    verdict = reproduce(elsewhere, skill, progress=False)
    assert verdict.matches and not verdict.same_platform and "inside" in verdict.detail


def test_a_record_of_other_patch_semantics_is_compared_statistically(recorded):
    """A record made when a sampler's targets meant something else (before a servo's gain moved
    its bias with it) replays other physics: it is judged by its rate, never bit for bit."""
    skill, _, record = recorded
    older = copy.deepcopy(record)
    del older["environment"]["patch_semantics"]
    verdict = reproduce(older, skill, progress=False)
    assert not verdict.same_platform and "inside" in verdict.detail


def test_a_result_that_does_not_reproduce_is_reported(recorded, short_walker):
    skill, _, record = recorded
    forged = copy.deepcopy(record)
    forged["outcomes"]["steps"][0] -= 1  # consistent with the summary, but not what happens
    verdict = reproduce(forged, skill, progress=False)
    assert not verdict.matches and verdict.mismatched_branches == (0,)
    # elsewhere, a claimed rate far from what the skill does falls outside the interval
    claimed = copy.deepcopy(record)
    claimed["environment"]["numpy"] = "0.0"
    n = len(claimed["outcomes"]["success"])
    claimed["outcomes"]["success"] = [1] * n
    claimed["outcomes"]["reason"] = ["success"] * n
    claimed["summary"] = _summary(
        n, n, claimed["summary"]["mean_return"], claimed["summary"]["confidence"]
    )
    check_record(claimed)  # self-consistent: only re-running exposes it
    assert record["summary"]["successes"] == 0
    verdict = reproduce(claimed, skill, progress=False)
    assert not verdict.matches and "outside" in verdict.detail


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda r: r["task"]["definition"].update(horizon=31), "task.hash"),
        (
            lambda r: r["summary"].update(successes=r["summary"]["successes"] + 1),
            "summary.successes",
        ),
        (
            lambda r: r["summary"].update(wilson_lower=r["summary"]["wilson_lower"] + 1e-6),
            "summary.wilson_lower",
        ),
        (
            lambda r: r["outcomes"]["success"].__setitem__(0, 1 - r["outcomes"]["success"][0]),
            "summary",
        ),
        (lambda r: r["outcomes"]["total_reward"].__setitem__(1, 99.0), "summary"),
        (lambda r: r["outcomes"]["branch"].reverse(), "outcomes.branch"),
        (lambda r: r["outcomes"]["reason"].pop(), "outcomes"),
        (lambda r: r.pop("environment"), "keys"),
        (lambda r: r.update(format="simnet.sim.evaluation/0"), "format"),
        (lambda r: r["layout"].update(branches=2), "layout"),
        # 4 outcomes of 12 branches: only a sequential test that decided stops before them all
        (lambda r: r.update(sequential=None), "layout.branches': is 12, but the record holds 4"),
        (lambda r: r["sequential"].update(decision="undecided"), "layout.branches"),
    ],
)
def test_tampered_records_are_refused(recorded, tamper, message):
    skill, _, record = recorded
    bad = copy.deepcopy(record)
    tamper(bad)
    with pytest.raises(EvaluationRecordError, match=message):
        check_record(bad)
    with pytest.raises(EvaluationRecordError):
        reproduce(bad, skill, progress=False)


def test_bounds_computed_by_another_libm_are_accepted(recorded):
    _, _, record = recorded
    elsewhere = copy.deepcopy(record)
    elsewhere["summary"]["clopper_pearson_lower"] += 1e-15  # a last-bit difference in log/exp
    check_record(elsewhere)


def test_tampered_inputs_do_not_reproduce_or_are_refused(recorded):
    skill, _, record = recorded
    reseeded = copy.deepcopy(record)
    reseeded["sampler"]["seed"] += 1
    verdict = reproduce(reseeded, skill, progress=False)
    assert not verdict.matches and "other patches" in verdict.detail
    widened = copy.deepcopy(record)
    widened["sampler"]["terms"][0]["high"] = 3.0
    assert not reproduce(widened, skill, progress=False).matches
    with pytest.raises(EvaluationRecordError, match="record field 'policy'"):
        reproduce(record, load_skill("walker_forward_degraded"), progress=False)
    wrong_scene = copy.deepcopy(record)
    wrong_scene["template"]["source_hash"] = "0" * 64
    with pytest.raises(EvaluationRecordError, match="source_hash"):
        reproduce(wrong_scene, skill, progress=False)


def test_records_of_callables_reproduce_with_the_same_callable(short_arm):
    def still(obs):
        return np.zeros((len(obs), 7))

    record = evaluate(short_arm, still, branches=4, progress=False).to_record()
    assert record["policy"]["kind"] == "callable"
    assert reproduce(record, still, progress=False).matches
    assert not reproduce(record, lambda obs: np.full((len(obs), 7), 0.05), progress=False).matches


def test_a_record_with_fewer_outcomes_than_its_rerun_is_a_verdict_not_a_crash(short_walker):
    """A peer's record may hold fewer branches than its layout asks for (n <= branches) where its
    sequential test decided: a re-run whose test does not decide as early then has more outcomes
    than the record, which is a mismatch to report, never an exception. (Without a test that
    decided, such a record is inconsistent: test_tampered_records_are_refused.)"""
    skill = load_skill("walker_forward_good")
    sampler = load_sampler("walker_forward", seed=9)
    short = evaluate(short_walker, skill, branches=8, wave=4, sampler=sampler, progress=False)
    record = short.to_record()
    record["layout"]["branches"] = 12  # 8 outcomes of at most 12: a test that decided at 8
    record["sequential"] = {**SPRT(0.49, 0.51).to_json(), "decision": "accept", "decided_at": 8}
    check_record(record)
    verdict = reproduce(record, skill, progress=False)  # its test decides nothing in 12
    assert not verdict.exact and len(verdict.rerun.outcomes) == 12

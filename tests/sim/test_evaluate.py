import numpy as np
import pytest

from knowledge.stats import fixed_sample_size
from sim import (
    SPRT,
    MLPSpec,
    MutationError,
    Policy,
    PolicyOutputError,
    Sampler,
    compare,
    evaluate,
    load_sampler,
    load_skill,
)


@pytest.mark.parametrize("task_name", ["arm_reach", "walker_forward"])
def test_shipped_good_skills_beat_the_degraded_ones(request, task_name):
    task = request.getfixturevalue("arm" if task_name == "arm_reach" else "walker")
    sampler = load_sampler(task_name, seed=3)
    good = evaluate(
        task, load_skill(f"{task_name}_good"), branches=48, sampler=sampler, progress=False
    )
    bad = evaluate(
        task, load_skill(f"{task_name}_degraded"), branches=48, sampler=sampler, progress=False
    )
    assert good.success_rate >= 0.85
    assert 0.2 <= bad.success_rate <= 0.8
    assert good.mean_return > bad.mean_return
    assert good.clopper_pearson_lower > bad.success_rate
    assert good.wilson_lower >= good.clopper_pearson_lower  # Wilson is the less conservative bound


def test_sprt_stops_early_in_small_waves_with_the_right_decisions(walker):
    test = SPRT(0.75, 0.92, 0.05, 0.05)
    fixed = fixed_sample_size(test.p0, test.p1, test.alpha, test.beta)
    sampler = load_sampler("walker_forward", seed=4)
    good = evaluate(
        walker,
        load_skill("walker_forward_good"),
        branches=fixed,
        sampler=sampler,
        wave=8,
        sprt=test,
        progress=False,
    )
    bad = evaluate(
        walker,
        load_skill("walker_forward_degraded"),
        branches=fixed,
        sampler=sampler,
        wave=8,
        sprt=test,
        progress=False,
    )
    assert (good.decision, bad.decision) == ("accept", "reject")
    for result in (good, bad):
        assert result.decided_at <= result.n < fixed
        assert result.n % 8 == 0  # whole waves
        assert test.decide([o.success for o in result.outcomes]) == (
            result.decision,
            result.decided_at,
        )


def test_sprt_outcomes_are_a_prefix_of_the_full_run(short_walker):
    sampler = load_sampler("walker_forward", seed=5)
    skill = load_skill("walker_forward_degraded")
    full = evaluate(short_walker, skill, branches=32, sampler=sampler, wave=8, progress=False)
    early = evaluate(
        short_walker,
        skill,
        branches=32,
        sampler=sampler,
        wave=8,
        sprt=SPRT(0.5, 0.9),
        progress=False,
    )
    assert early.decision == "reject"
    assert early.outcomes == full.outcomes[: early.n]


def test_paired_comparison_on_the_same_branches(walker):
    sampler = load_sampler("walker_forward", seed=6)
    result = compare(
        walker,
        load_skill("walker_forward_good"),
        load_skill("walker_forward_degraded"),
        branches=64,
        sampler=sampler,
        progress=False,
    )
    c, i = result.candidate, result.incumbent
    assert [o.branch for o in c.outcomes] == [o.branch for o in i.outcomes]
    assert c.patches_digest == i.patches_digest
    assert (
        result.both_succeed + result.candidate_only + result.incumbent_only + result.both_fail == 64
    )
    assert result.candidate_only > result.incumbent_only
    assert result.rate_difference == pytest.approx(c.success_rate - i.success_rate)
    assert result.mcnemar_p < 0.01 and result.return_difference > 0
    record = result.to_record()
    assert record["paired"]["candidate_only"] == result.candidate_only
    same = compare(
        walker,
        load_skill("walker_forward_good"),
        load_skill("walker_forward_good"),
        branches=8,
        sampler=sampler,
        progress=False,
    )
    assert same.candidate_only == same.incumbent_only == 0 and same.mcnemar_p == 1.0


def test_outcomes_are_identical_for_1_2_and_4_workers(short_walker, short_arm):
    for task, name in ((short_walker, "walker_forward"), (short_arm, "arm_reach")):
        sampler = load_sampler(name, seed=8)
        skill = load_skill(f"{name}_good")  # an affine MLP, and a 64x64 torch MLP
        runs = [
            evaluate(task, skill, branches=20, wave=4, sampler=sampler, workers=w, progress=False)
            for w in (1, 2, 4)
        ]
        assert runs[0].outcomes == runs[1].outcomes == runs[2].outcomes
        assert runs[0].to_record() == runs[2].to_record()
    skill, sampler = load_skill("walker_forward_good"), load_sampler("walker_forward", seed=8)
    sprt = [
        evaluate(
            short_walker,
            skill,
            branches=20,
            wave=4,
            sampler=sampler,
            workers=w,
            sprt=SPRT(0.5, 0.9),
            progress=False,
        )
        for w in (1, 2)
    ]
    assert sprt[0].decision == "reject"
    assert sprt[0].to_record() == sprt[1].to_record()  # the extra waves a round ran are not kept


def test_errors_raised_in_workers_arrive_whole(short_walker, short_arm):
    sampler = Sampler.from_json(
        {
            "seed": 0,
            "terms": [
                {
                    "target": "body/torso/mass",
                    "op": "set",
                    "dist": "uniform",
                    "low": -1.0,
                    "high": 1.0,
                }
            ],
        }
    )
    with pytest.raises(MutationError) as info:
        evaluate(
            short_walker,
            load_skill("walker_forward_good"),
            branches=8,
            wave=4,
            sampler=sampler,
            workers=2,
            progress=False,
        )
    assert info.value.branch is not None and "must stay > 0" in str(info.value)
    spec = MLPSpec(17, 7, ())
    tensors = {name: np.ones(shape) for name, shape in spec.tensor_shapes().items()}
    tensors["act_scale"] = np.full(7, 1e308)  # finite weights, infinite actions
    with pytest.raises(PolicyOutputError) as info:
        evaluate(
            short_arm, Policy.from_tensors(spec, tensors), branches=4, workers=2, progress=False
        )
    assert info.value.branches == (0, 1, 2, 3) and info.value.step == 0


def test_workers_need_a_policy_that_can_travel(short_walker):
    with pytest.raises(ValueError, match="a Policy\\) or an EntryPointRef"):
        evaluate(
            short_walker, lambda obs: np.zeros((len(obs), 4)), branches=4, workers=2, progress=False
        )


def test_progress_bar_on_request(short_walker, capsys):
    evaluate(short_walker, load_skill("walker_forward_good"), branches=4, progress=True)
    assert "evaluate walker_forward" in capsys.readouterr().err


def test_bad_arguments(short_walker):
    skill = load_skill("walker_forward_good")
    for kwargs in (
        {"branches": 0},
        {"branches": 4, "wave": 0},
        {"branches": 4, "confidence": 1.5},
        {"branches": 4, "workers": 0},
    ):
        with pytest.raises(ValueError):
            evaluate(short_walker, skill, progress=False, **kwargs)

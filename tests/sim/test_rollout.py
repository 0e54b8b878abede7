import numpy as np
import pytest
import torch

from sim import (
    MLPSpec,
    Mutation,
    Patch,
    Policy,
    PolicyCallError,
    PolicyOutputError,
    Sampler,
    evaluate,
    load_sampler,
    load_skill,
)
from sim.evaluation import branch_patch
from sim.evaluation._rollout import (
    _UNSTABLE,
    _UNSTABLE_SLICE,
    PolicyCaller,
    _lane_split,
    run_wave,
)


def _zeros(act_dim):
    return lambda obs: np.zeros((len(obs), act_dim))


def test_outcomes_do_not_depend_on_the_thread_count(short_walker):
    skill = load_skill("walker_forward_good")
    sampler = load_sampler("walker_forward", seed=21)
    runs = [
        evaluate(
            short_walker, skill, branches=24, wave=8, sampler=sampler, threads=n, progress=False
        ).outcomes
        for n in (1, 2, 3)
    ]
    assert runs[0] == runs[1] == runs[2]
    assert len({o.total_reward for o in runs[0]}) > 1  # the branches really differ


def test_unstable_branches_fail_with_a_reason_and_the_others_continue(short_arm):
    sampler = Sampler()
    patches = [branch_patch(short_arm, sampler, b) for b in range(3)]
    # an absurd gain with the same bias explodes branch 1 alone
    patches[1] = patches[1] + Patch((Mutation("actuator/a2/gain", "scale", (1e12,)),))
    caller = PolicyCaller(_zeros(7), short_arm)
    outcomes = run_wave(short_arm, caller, sampler, 0, 3, 3, 2, patches=patches)
    assert outcomes[1].reason.startswith("unstable:") and not outcomes[1].success
    assert outcomes[1].steps < short_arm.horizon
    for other in (outcomes[0], outcomes[2]):
        assert other.reason in ("horizon", "success") and other.steps == short_arm.horizon


def test_the_unstable_warnings_are_one_slice_of_a_batchs_warnings():
    """The rollout reads them as a view each step: no other warning may fall between them."""
    assert list(range(_UNSTABLE_SLICE.start, _UNSTABLE_SLICE.stop)) == sorted(_UNSTABLE)


def test_a_policy_that_raises_names_the_step_and_branches(short_arm):
    calls = []

    def flaky(obs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("sensor dropout")
        return np.zeros((len(obs), 7))

    expected = (
        "control step 2, branch\\(es\\) 0, 1, 2, 3: the policy raised RuntimeError: sensor dropout"
    )
    with pytest.raises(PolicyCallError, match=expected) as info:
        evaluate(short_arm, flaky, branches=4, progress=False)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.branches == (0, 1, 2, 3) and info.value.step == 2


def test_nan_actions_name_the_branch(short_arm):
    calls = []

    def nan_in_second_wave_row_1(obs):
        calls.append(1)
        out = np.zeros((len(obs), 7))
        if len(calls) > short_arm.horizon:  # wave 0 ran its whole horizon: this is wave 1
            out[1, 3] = np.nan
        return out

    with pytest.raises(
        PolicyOutputError, match="control step 0, branch\\(es\\) 5: the policy returned NaN"
    ) as info:
        evaluate(short_arm, nan_in_second_wave_row_1, branches=8, wave=4, progress=False)
    assert info.value.branches == (5,)


def test_wrong_shapes_and_types_are_errors(short_arm):
    with pytest.raises(PolicyOutputError, match="shape \\(4, 6\\), expected \\(4, 7\\)"):
        evaluate(short_arm, lambda obs: np.zeros((len(obs), 6)), branches=4, progress=False)
    with pytest.raises(PolicyOutputError, match="shape \\(7,\\)"):
        evaluate(short_arm, lambda obs: np.zeros(7), branches=4, progress=False)
    with pytest.raises(PolicyOutputError, match="not a numeric array"):
        evaluate(short_arm, lambda obs: [["x"] * 7] * len(obs), branches=4, progress=False)


def test_ended_branches_are_zeroed_rows_and_may_hold_nan(short_walker):
    """A fixed layout: the policy always sees the full wave; rows of ended branches are zero, and
    what the policy returns for them (even NaN) is ignored."""
    shapes = []

    def policy(obs):
        shapes.append(obs.shape)
        out = np.zeros((len(obs), 4))
        out[np.all(obs == 0, axis=1)] = np.nan
        return out

    fallen = short_walker.replace(
        failure=[{"term": "body_height", "body": "torso", "below": 0.3625}]
    )
    result = evaluate(fallen, policy, branches=5, wave=8, progress=False)
    assert set(shapes) == {(8, 11)}
    assert result.n == 5


def test_state_and_model_patches_both_reach_the_branch(short_arm):
    seen = []

    def record(obs):
        seen.append(obs.copy())
        return np.zeros((len(obs), 7))

    moved = Patch(
        (
            Mutation("body/target/pos", "set", (0.3, 0.2, 0.5)),
            Mutation("joint/j1/qpos", "set", (0.4,)),
        )
    )
    run_wave(
        short_arm, PolicyCaller(record, short_arm), Sampler(), 0, 2, 2, 1, patches=[Patch(), moved]
    )
    assert seen[0][1, 0] == 0.4 and seen[0][0, 0] == 0.0
    assert not np.allclose(seen[0][0, 14:17], seen[0][1, 14:17])


def test_mujoco_errors_end_branches_with_their_message(walker):
    # an arena too small for the first foot contact: mj_step raises inside the batch
    cramped = walker.template.xml.replace(
        '<option timestep="0.005"/>', '<option timestep="0.005"/><size memory="4K"/>'
    )
    result = evaluate(
        walker.replace(scene=cramped, horizon=50),
        load_skill("walker_forward_good"),
        branches=3,
        progress=False,
    )
    for outcome in result.outcomes:
        assert (
            outcome.reason.startswith("mujoco:mj_stackAlloc: out of memory")
            and "\n" not in outcome.reason
        )
        assert not outcome.success and outcome.steps < 50


def _large_mlp(obs_dim, act_dim):
    """A 256x256 MLP (72,000 parameters): large enough that its waves run as two lanes."""
    spec = MLPSpec(obs_dim, act_dim, (256, 256))
    rng = np.random.default_rng(7)
    tensors = {
        name: np.ones(shape) if name == "obs_std" else rng.normal(0.0, 0.05, shape)
        for name, shape in spec.tensor_shapes().items()
    }
    return Policy.from_tensors(spec, tensors)


def test_two_lanes_give_the_outcomes_of_one(short_arm):
    """On two threads a wave of a large MLP skill runs as two lanes of rows, each calling the policy
    on its own rows; every branch ends exactly as it does with one call on the whole wave."""
    skill = _large_mlp(short_arm.obs_dim, short_arm.act_dim)
    caller = PolicyCaller(skill, short_arm)
    assert _lane_split(short_arm, caller, 96, 2) == 32  # the lanes really run
    runs = [
        evaluate(
            short_arm,
            skill,
            branches=80,
            wave=96,
            sampler=load_sampler("arm_reach", seed=4),
            threads=n,
            progress=False,
        ).outcomes
        for n in (1, 2)
    ]
    assert runs[0] == runs[1]
    assert len({o.total_reward for o in runs[0]}) == 80


def test_a_small_policy_runs_as_one_lane(short_arm):
    """The shipped 64x64 skill: a second call per control step costs more than the overlap saves."""
    caller = PolicyCaller(load_skill("arm_reach_good"), short_arm)
    assert caller.parameters == 17 * 64 + 64 + 64 * 64 + 64 + 64 * 7 + 7
    assert _lane_split(short_arm, caller, 96, 2) == 0
    assert caller.splits_exactly(96, 32, short_arm.obs_dim)  # it could split: its size decides


def _wide_layer():
    """17 -> 2,048 (36,864 parameters), which makes a module large enough for lanes."""
    return torch.nn.Linear(17, 2048, dtype=torch.float64)


class _BatchMean(torch.nn.Module):
    """A large module whose rows depend on each other: it must see the whole wave at once."""

    def __init__(self):
        super().__init__()
        self.layer = _wide_layer()

    def forward(self, obs):
        x = self.layer(obs)[:, :7]
        return torch.tanh(x - x.mean(dim=0))


def test_a_module_whose_rows_depend_on_the_batch_runs_as_one_lane(short_arm):
    shapes = []
    module = _BatchMean()
    module.register_forward_hook(lambda _m, args, _out: shapes.append(tuple(args[0].shape)))
    caller = PolicyCaller(module, short_arm)
    assert not caller.splits_exactly(64, 32, short_arm.obs_dim)
    assert not PolicyCaller(_zeros(7), short_arm).splits_exactly(64, 32, short_arm.obs_dim)
    shapes.clear()
    evaluate(short_arm, module, branches=64, threads=2, progress=False)
    # the probe's two half calls, then every control step one call on the whole wave
    assert shapes.count((32, short_arm.obs_dim)) == 2
    assert shapes.count((64, short_arm.obs_dim)) > 1 and set(shapes) == {(32, 17), (64, 17)}


def test_an_error_in_a_lane_is_the_error_one_call_names(short_arm):
    """A policy that fails in both lanes: the wave runs again as one lane, whose single call names
    the bad branches of both, as without lanes."""
    sentinel = 1.234567

    class NanAtSentinel(torch.nn.Module):  # large and row by row: the lanes run
        def __init__(self):
            super().__init__()
            self.layer = _wide_layer()

        def forward(self, obs):
            out = self.layer(obs)[:, :7] * 0.0
            out[(obs[:, 0] - sentinel).abs() < 1e-12] = float("nan")
            return out

    sampler = Sampler()
    marked = Patch((Mutation("joint/j1/qpos", "set", (sentinel,)),))
    patches = [
        branch_patch(short_arm, sampler, b) + marked
        if b in (5, 40)
        else branch_patch(short_arm, sampler, b)
        for b in range(64)
    ]
    caller = PolicyCaller(NanAtSentinel(), short_arm)
    assert _lane_split(short_arm, caller, 64, 2) == 32
    with pytest.raises(PolicyOutputError, match="step 0, branch\\(es\\) 5, 40: the policy") as info:
        run_wave(short_arm, caller, sampler, 0, 64, 64, 2, patches=patches)
    assert info.value.branches == (5, 40)

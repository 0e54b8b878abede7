import numpy as np
import torch

from sim import evaluate, load_sampler
from sim.evaluation import distill, fit_mlp


def test_fit_mlp_recovers_an_affine_map():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2000, 4))
    weight = rng.normal(size=(4, 2))
    actions = obs @ weight + 0.5
    skill = fit_mlp(obs, actions, hidden=(), epochs=4000)
    with torch.inference_mode():
        fitted = skill.module()(torch.from_numpy(obs[:50])).numpy()
    np.testing.assert_allclose(fitted, actions[:50], atol=2e-2)


def test_distill_imitates_a_local_controller_as_data(short_walker):
    gait_phase = np.array([0.3, -0.2, 0.1, 0.4])

    def expert(obs):  # an affine function of the clock: a CPG
        return 0.5 * obs[:, :1] * gait_phase + 0.2 * obs[:, 1:2] - 0.1

    sampler = load_sampler("walker_forward", seed=2)
    skill = distill(
        short_walker, expert, sampler=sampler, branches=8, iterations=2, hidden=(16,), epochs=2000
    )
    assert skill.spec.obs_dim == short_walker.obs_dim and skill.spec.hidden == (16,)
    probe = []
    evaluate(
        short_walker,
        lambda o: (probe.append(o.copy()), expert(o))[1],
        branches=4,
        sampler=sampler,
        progress=False,
    )
    obs = np.concatenate(probe)
    with torch.inference_mode():
        student = skill.module()(torch.from_numpy(obs)).numpy()
    assert np.max(np.abs(student - expert(obs))) < 0.05

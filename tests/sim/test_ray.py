"""The Ray backend for evaluations on a real local Ray (2 CPUs, one session for all tests): the same
outcomes as worker processes. Worlds on Ray actors are in test_world_backends."""

import sys

import numpy as np
import pytest

import sim


def test_ray_actors_run_the_same_evaluation_as_worker_processes(ray_session, short_walker):
    skill, sampler = (
        sim.load_skill("walker_forward_good"),
        sim.load_sampler("walker_forward", seed=11),
    )
    common = dict(branches=24, wave=8, sampler=sampler, workers=2, progress=False)
    local = sim.evaluate(short_walker, skill, **common)
    remote = sim.evaluate(short_walker, skill, backend="ray", **common)
    assert remote.outcomes == local.outcomes and remote.to_record() == local.to_record()
    sprt = sim.SPRT(0.5, 0.9)
    assert (
        sim.evaluate(short_walker, skill, backend="ray", sprt=sprt, **common).to_record()
        == sim.evaluate(short_walker, skill, sprt=sprt, **common).to_record()
    )
    with pytest.raises(ValueError, match="only those can be shipped"):
        sim.evaluate(
            short_walker,
            lambda obs: np.zeros((len(obs), 4)),
            branches=2,
            backend="ray",
            progress=False,
        )


def test_without_the_extra_the_ray_backend_says_how_to_get_it(monkeypatch, short_walker):
    monkeypatch.setitem(
        sys.modules, "ray", None
    )  # as if `pip install 'simnet-fleet[ray]'` had not been run
    with pytest.raises(sim.BackendError, match=r"pip install 'simnet-fleet\[ray\]'"):
        sim.use_ray()
    with pytest.raises(sim.BackendError):
        sim.evaluate(
            short_walker,
            sim.load_skill("walker_forward_good"),
            branches=2,
            backend="ray",
            progress=False,
        )

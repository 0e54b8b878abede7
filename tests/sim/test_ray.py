"""The Ray backend on a real local Ray (2 CPUs, one session for all tests): same outcomes, same worlds."""

import sys

import numpy as np
import pytest

import sim
from sim import Mutation


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


def test_a_world_on_ray_actors_is_the_same_world_and_survives_a_killed_actor(
    ray_session, tmp_path, region, world_entities, kill_when_busy
):
    worlds = {
        b: sim.World.create(
            tmp_path / f"{b}.db",
            {"west": region, "east": region},
            world_entities,
            checkpoint_every=500,
            backend=b,
        )
        for b in ("ray", "process")
    }
    try:
        for world in worlds.values():
            with world.batch():
                for tick in range(0, 60000, 25):
                    world.apply(
                        "west",
                        Mutation("actuator/walker1/hhip/ctrl", "set", (0.5 * np.sin(0.01 * tick),)),
                        at=tick,
                    )
        remote = worlds["ray"]
        pid = remote.worker_pid("west")
        killer = kill_when_busy(pid)
        for world in worlds.values():
            world.advance(60000)
        killer.join()
        for shard in ("west", "east"):
            assert remote.snapshot(shard).same_state(worlds["process"].snapshot(shard))
        assert remote.recoveries == 1 and remote.worker_pid("west") != pid
        assert [e.to_json() for e in remote.events("west")] == [
            e.to_json() for e in worlds["process"].events("west")
        ]
        assert remote.replay("west", 0, 60000).exact
        task, skill = (
            sim.load_task("walker_forward").replace(horizon=20),
            sim.load_skill("walker_forward_good"),
        )
        runs = [
            w.evaluate(
                "west",
                task,
                skill,
                branches=8,
                wave=4,
                entity="walker1",
                sampler=sim.load_sampler("walker_forward", seed=2),
            )
            for w in worlds.values()
        ]
        assert runs[0].outcomes == runs[1].outcomes and runs[0].start.same_state(runs[1].start)
    finally:
        for world in worlds.values():
            world.close()


def test_without_the_extra_the_ray_backend_says_how_to_get_it(monkeypatch, short_walker):
    monkeypatch.setitem(
        sys.modules, "ray", None
    )  # as if `pip install simnet[ray]` had not been run
    with pytest.raises(sim.BackendError, match=r"pip install 'simnet\[ray\]'"):
        sim.use_ray()
    with pytest.raises(sim.BackendError):
        sim.evaluate(
            short_walker,
            sim.load_skill("walker_forward_good"),
            branches=2,
            backend="ray",
            progress=False,
        )

"""One conformance suite for every world backend: shards inline, in worker processes, in Ray actors.

Each check runs against every backend (`backend`) or every backend with workers of its own
(`worker_backend`: process and Ray, whose workers can die), and compares with a world run inline
where the outcome must be the same bits. A new backend passes these before anything else.
"""

import os

import pytest

import sim
from sim import Intervention, Mutation

ON_RAY = pytest.mark.xdist_group("ray")  # every Ray test on one xdist worker: see conftest.py
PUSH = Mutation("joint/crate/~joint0/qvel", "set", (1.0, 0, 0, 0, 0, 0))


def _with_ray(request, name):
    if name == "ray":
        request.getfixturevalue("ray_session")
    return name


@pytest.fixture(params=["inline", "process", pytest.param("ray", marks=ON_RAY)])
def backend(request):
    return _with_ray(request, request.param)


@pytest.fixture(params=["process", pytest.param("ray", marks=ON_RAY)])
def worker_backend(request):
    return _with_ray(request, request.param)


def _same(a, b):
    return all(a.snapshot(s).same_state(b.snapshot(s)) for s in ("west", "east"))


def _events(world, shard="west"):
    return [e.to_json() for e in world.events(shard)]


def test_a_world_reopens_on_its_backend_where_it_stopped(make_world, tmp_path, drive, backend):
    world, reference = make_world("w", backend), make_world("ref", backend="inline")
    for w in (world, reference):
        w.apply("east", PUSH, provenance="push")
        drive(w, 100)
    assert world.status()["backend"] == backend and _same(world, reference)
    world.close()
    with sim.World.open(tmp_path / "w.db", backend=backend) as world:
        assert world.head("west") == 100 and _same(world, reference)
        for w in (world, reference):
            drive(w, 60)
        assert _same(world, reference) and _events(world) == _events(reference)


def test_forks_replays_and_migrations_are_the_same_bits_as_inline(make_world, drive, backend):
    worlds = [make_world("w", backend, every=50), make_world("ref", backend="inline", every=50)]
    for w in worlds:
        drive(w, 120)
    before = [w.snapshot("west") for w in worlds]
    branches = [w.fork("west", 60, label="what if") for w in worlds]
    for b in branches:
        b.apply(Mutation("joint/walker1/rootz/qvel", "set", (1.5,)))
        assert b.advance(100) == 160
    assert branches[0].snapshot().same_state(branches[1].snapshot())
    assert not branches[0].snapshot().same_state(before[0])
    for w, snap in zip(worlds, before, strict=True):
        assert w.snapshot("west").same_state(snap)  # the canonical world never changed
    push = Mutation("joint/walker1/rootz/qvel", "set", (0.5,))
    counterfactual = [
        w.replay("west", 20, 100, interventions=[Intervention(40, push)]) for w in worlds
    ]
    assert counterfactual[0].snapshot.same_state(counterfactual[1].snapshot)
    for w in worlds:
        w.migrate("walker1", "east")
        w.advance(30)
    assert _same(*worlds) and worlds[0].entities() == {"crate": "east", "walker1": "east"}
    branches[0].delete()
    assert [b.id for b in worlds[0].branches()] == [counterfactual[0].branch.id]


def test_unknown_shards_branches_and_entities_are_refused(make_world, backend):
    world = make_world(backend=backend)
    task, skill = sim.load_task("walker_forward"), sim.load_skill("walker_forward_good")
    for call in (
        lambda: world.advance(1, ["north"]),
        lambda: world.apply("north", PUSH),
        lambda: world.snapshot("north"),
        lambda: world.fork("north", 0),
        lambda: world.branch("nope"),
        lambda: world.head("west", "nope"),
        lambda: world.migrate("walker1", "north"),
    ):
        with pytest.raises(sim.UnknownShardError):
            call()
    with pytest.raises(sim.UnknownEntityError):
        world.migrate("walker9", "east")
    with pytest.raises(sim.UnknownEntityError):
        world.evaluate("west", task, skill, branches=2, entity="walker9")
    assert world.head("west") == 0 and world.events("west") == []


def test_an_evaluation_from_a_world_is_the_same_on_every_backend(make_world, drive, backend):
    worlds = [make_world("w", backend), make_world("ref", backend="inline")]
    for w in worlds:
        drive(w, 40)
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
        for w in worlds
    ]
    assert runs[0].outcomes == runs[1].outcomes and runs[0].start.same_state(runs[1].start)


def test_every_mutation_is_logged_and_a_reopened_world_resumes_exactly(
    make_world, tmp_path, drive, worker_backend
):
    world, reference = make_world("w", worker_backend), make_world("ref", backend="inline")
    for w in (world, reference):
        w.apply(
            "east",
            Mutation("joint/crate/~joint0/qvel", "set", (1.0, 0, 0, 0, 0, 0)),
            provenance="push",
        )
        drive(w, 300)
    event = world.events("west")[0]
    assert (event.seq, event.tick, event.entity, event.kind, event.provenance) == (
        1,
        0,
        "walker1",
        "mutate",
        "gait@0",
    )
    assert world.events("east")[0].entity == "crate"
    world.close()
    world = sim.World.open(tmp_path / "w.db", backend=worker_backend)
    assert world.head("west") == 300 and _same(world, reference)
    for w in (world, reference):
        drive(w, 200)
    assert _same(world, reference) and _events(world) == _events(reference)
    status = world.status()
    assert status["shards"]["west"]["checkpoints"] == 6 and status["shards"]["west"]["events"] == 25
    assert (
        status["shards"]["east"]["entities"] == ["crate"]
        and world.worker_pid("west") != os.getpid()
    )
    world.close()


def test_replay_is_bit_exact_against_the_original_run(make_world, drive, backend):
    world = make_world(backend=backend, every=50)
    seen = {}
    for _ in range(8):
        seen[world.head("west")] = world.snapshot("west")  # on arrival: before this tick's events
        drive(world, 40)
    for start, stop in ((0, 280), (40, 160), (120, 120), (130, 240)):
        replay = world.replay("west", start, stop)
        assert replay.exact and replay.snapshot.same_state(seen[stop])
    assert world.replay("west", 0, 320).checked == (50, 100, 150, 200, 250, 300)


TICKS = 40000  # ~1.5 s of physics: long enough to be killed in, short enough to run three times


def test_a_shard_worker_killed_mid_run_is_rebuilt_with_no_lost_or_duplicated_events(
    make_world, kill_when_busy, gait, worker_backend
):
    world = make_world("w", backend=worker_backend, every=500)
    reference = make_world("ref", backend="inline", every=500)
    for w in (world, reference):
        with w.batch():
            for tick in range(
                0, TICKS, 20
            ):  # scheduled ahead: one long advance, killed in the middle
                w.apply("west", gait(tick), provenance=f"gait@{tick}", at=tick)
    pid = world.worker_pid("west")
    killer = kill_when_busy(pid)  # at 0.15 s of CPU: a tenth of the way in
    world.advance(TICKS)
    killer.join()
    reference.advance(TICKS)
    assert world.recoveries == 1 and world.worker_pid("west") != pid
    assert world.head("west") == TICKS and _same(world, reference)
    assert _events(world) == _events(reference) and len(_events(world)) == TICKS // 20
    assert world.replay("west", 0, TICKS).checked == tuple(range(500, TICKS + 1, 500))


def test_evaluations_run_inside_the_shard_worker_from_its_state(make_world, drive, backend):
    world = make_world(backend=backend)
    drive(world, 60)
    task, skill = (
        sim.load_task("walker_forward").replace(horizon=25),
        sim.load_skill("walker_forward_good"),
    )
    sampler = sim.load_sampler("walker_forward", seed=9)
    inside = world.evaluate(
        "west", task, skill, branches=8, wave=4, sampler=sampler, entity="walker1"
    )
    snap = world.snapshot("west")
    here = sim.evaluate(
        snap.task(task, "walker1"),
        skill,
        branches=8,
        wave=4,
        sampler=snap.sampler(sampler, "walker1"),
        start=snap,
        progress=False,
    )
    assert inside.to_record() == here.to_record() and inside.start.tick == 60
    with pytest.raises(sim.UnknownEntityError):
        world.evaluate("west", task, skill, branches=2, entity="walker9")
    with pytest.raises(sim.UnknownEntityError, match="in shard 'east', not 'west'"):
        world.evaluate("west", task, skill, branches=2, entity="crate")
    for branches in ("2", True, 0):
        with pytest.raises(ValueError, match="branches must be a positive integer"):
            world.evaluate("west", task, skill, branches=branches)
    for kwargs, error in (
        ({"threads": "a"}, "threads must be"),
        ({"confidence": "x"}, "confidence must be"),
        ({"sampler": {}}, "sampler must be a sim.Sampler"),
        ({"sprt": {}}, "sprt must be a sim.SPRT"),
    ):
        with pytest.raises(ValueError, match=error):
            world.evaluate("west", task, skill, branches=2, **kwargs)
    with pytest.raises(ValueError, match="task must be a sim.Task"):
        world.evaluate("west", None, skill, branches=2)

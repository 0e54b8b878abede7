import copy

import numpy as np
import pytest

import knowledge
import sim
from knowledge import Identity


@pytest.fixture(scope="module")
def walked(tmp_path_factory, region, world_entities):
    """A world whose walker has been driven for a while (inline: this module tests snapshots, not
    workers)."""
    path = tmp_path_factory.mktemp("world") / "w.db"
    with sim.World.create(
        path, {"west": region, "east": region}, world_entities, backend="inline"
    ) as world:
        world.apply(
            "west", sim.Mutation("body/walker1/torso/mass", "scale", (1.1,)), provenance="payload"
        )
        for k in range(6):
            world.apply(
                "west", sim.Mutation("actuator/walker1/hhip/ctrl", "set", (0.3 * (-1) ** k,))
            )
            world.advance(20)
        yield world, world.snapshot("west")


def test_a_snapshot_is_exact_data(walked):
    world, snap = walked
    assert (snap.world, snap.world_id, snap.shard, snap.branch, snap.tick, snap.events) == (
        world.name,
        world.id,
        "west",
        None,
        120,
        7,
    )
    assert snap.time == pytest.approx(0.6) and not snap.state.flags.writeable
    assert snap.patch == sim.Patch((sim.Mutation("body/walker1/torso/mass", "scale", (1.1,)),))
    again = sim.Snapshot.from_json(snap.to_json(), snap.template.xml)
    assert again.same_state(snap) and again.to_json() == snap.to_json()
    tampered = copy.deepcopy(snap.to_json())
    tampered["state"][3] += 1e-12
    with pytest.raises(sim.EvaluationRecordError, match="state_sha256"):
        sim.Snapshot.from_json(tampered, snap.template.xml)
    with pytest.raises(sim.EvaluationRecordError, match="source_hash"):
        sim.Snapshot.from_json(snap.to_json(), sim.load_task("walker_forward").definition["scene"])


def test_tasks_and_samplers_are_scoped_to_an_entity(walked):
    _world, snap = walked
    task = snap.task(sim.load_task("walker_forward"), "walker1")
    assert (
        task.template.source_hash == snap.template.source_hash
        and task.definition["keyframe"] is None
    )
    assert task.definition["observation"][1]["joints"][0] == "walker1/hhip"
    assert task.definition["init"][0]["target"] == "joint/walker1/*hip/qpos"
    assert task.definition["success"]["all"][0]["body"] == "walker1/torso"
    sampler = snap.sampler(sim.load_sampler("walker_forward", seed=2), "walker1")
    assert all(
        t.target.split("/")[1] == "walker1" or t.target.startswith("option/") for t in sampler.terms
    )
    with pytest.raises(sim.TaskDefinitionError):
        snap.task(sim.load_task("walker_forward"), "crate")  # the crate has no torso


def test_evaluations_start_from_the_snapshot_and_reproduce(walked):
    _world, snap = walked
    task = snap.task(sim.load_task("walker_forward").replace(horizon=30), "walker1")
    sampler = snap.sampler(sim.load_sampler("walker_forward", seed=4), "walker1")
    skill = sim.load_skill("walker_forward_good")
    result = sim.evaluate(
        task, skill, branches=8, wave=4, sampler=sampler, start=snap, progress=False
    )
    record = result.to_record()
    assert record["format"] == "simnet.sim.evaluation/2" and record["start"] == snap.to_json()
    assert sim.reproduce(record, skill).exact
    fresh = sim.evaluate(
        task, skill, branches=8, wave=4, sampler=sampler, progress=False
    )  # reset, not the world
    assert [o.total_reward for o in fresh.outcomes] != [o.total_reward for o in result.outcomes]
    tampered = copy.deepcopy(record)
    tampered["start"]["state"][2] = 0.0
    with pytest.raises(sim.EvaluationRecordError, match="state_sha256"):
        sim.reproduce(tampered, skill)
    with pytest.raises(sim.IncompatibleTemplateError, match="snapshot.task"):
        sim.evaluate(sim.load_task("walker_forward"), skill, branches=2, start=snap, progress=False)


def test_a_world_certificate_says_where_it_was_evaluated_and_verifies(tmp_path, walked):
    world, _snap = walked
    zero = world.fork("west", 0).snapshot()  # the walker as placed, standing
    task = zero.task(sim.load_task("walker_forward"), "walker1")
    sampler = zero.sampler(sim.load_sampler("walker_forward", seed=5), "walker1")
    kb = knowledge.open(tmp_path / "site.db", Identity.generate())
    good = sim.publish_skill(kb, sim.load_skill("walker_forward_good"), "walk", "walk")
    bad = sim.load_skill("walker_forward_degraded")
    result = sim.evaluate(
        task, sim.load_policy(kb, good.id), branches=32, sampler=sampler, start=zero, progress=False
    )
    worse = sim.evaluate(task, bad, branches=32, sampler=sampler, start=zero, progress=False)
    assert result.success_rate >= 0.8 and worse.success_rate < result.success_rate
    cert = sim.certify(kb, good.id, result)
    start = cert.evaluation["start"]
    assert (start["world"]["id"], start["shard"], start["tick"]) == (world.id, "west", 0)
    verdict = sim.verify_certificate(kb, cert)
    assert verdict.valid and verdict.reproduction.exact
    kb.close()


def test_a_start_from_another_build_is_refused(walked):
    _world, snap = walked
    short = sim.Snapshot(
        snap.world,
        snap.world_id,
        snap.shard,
        None,
        snap.tick,
        snap.events,
        snap.template,
        snap.patch,
        np.append(snap.state, 0.0),
    )
    task = snap.task(sim.load_task("walker_forward"), "walker1")
    with pytest.raises(sim.IncompatibleTemplateError, match="another MuJoCo build"):
        sim.evaluate(
            task, sim.load_skill("walker_forward_good"), branches=2, start=short, progress=False
        )

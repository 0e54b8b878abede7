"""A user's program against the public API, for the type checker only: tests/test_types.py checks it
with `mypy --strict`, as a user's CI would. It follows the README's snippets; nothing here runs
(pytest does not collect this file, and its functions are never called).

`assert_type` pins what the API promises where a wrong annotation would pass silently (an `Any`
satisfies every use), such as `kb.skills.query` returning a list a `for` loop can iterate. An
ignore comment pins an error the checker must keep reporting: --strict reports an unused one.
"""

from __future__ import annotations

import asyncio
from typing import Any, assert_type

import federation
import knowledge
import sim
from knowledge import (
    Activation,
    Certificate,
    CertificateSummary,
    Counts,
    Embodiment,
    Head,
    Identity,
    IngestReport,
    KnowledgeBase,
    LearnedEncoder,
    MapRegion,
    Observation,
    QueryResult,
    Role,
    Skill,
    TransferDataset,
    TrustPolicy,
    evaluate_encoder,
    train_encoder,
)
from knowledge.embodiment import FeatureEncoder, SkillIndex
from knowledge.stats import SPRT, clopper_pearson_lower, wilson_lower_bound
from sim import Entity, Intervention, Mutation


def knowledge_base(weights: bytes) -> None:
    site_key = Identity.generate()
    site_key.save("site.key")
    kb = knowledge.open("site.db", site_key)
    assert_type(kb, KnowledgeBase)

    arm = Embodiment.from_mjcf("panda.xml")
    skill = kb.skills.publish(
        "pick-mug-side-grasp",
        "pick",
        description="grasp a mug by its body",
        policy={"kind": "mlp", "architecture": {}, "weights": kb.blobs.put(weights)},
        embodiments=[arm.to_dict()],
        parents=[],
        preconditions=["mug visible"],
    )
    assert_type(skill, Skill)
    assert_type(kb.skills.get(skill.id), Skill)
    listed = kb.skills.list(task="pick", active_only=True)
    assert_type(listed, list[Skill])
    names: list[str] = [s.name for s in listed]
    for s in kb.skills.list():
        print(s.id, s.task, s.embodiments, names)
    kb.skills.withdraw(skill.id)

    kitchen = kb.maps["kitchen"]
    kitchen.observe((12, 7), {"label": "mug"}, confidence=0.8)
    kitchen.delete((12, 7), confidence=0.9)
    seen = kitchen.get((12, 7))
    assert_type(seen, Observation | None)
    for cell, observation in kitchen.cells().items():
        print(cell, observation.confidence)
    stamp = kitchen.observe_many([(0, 0), (0, 1)], ["floor", "wall"], [0.5, 0.7])
    assert_type(stamp, int)
    box = kitchen.region((0, 0), (10, 10))
    assert_type(box, MapRegion)
    print(len(box), box.values, box.observation(0).author)

    kb.counters.record(skill.id, success=True)
    assert_type(kb.counters.get(skill.id), Counts)
    assert_type(kb.counters.per_site(skill.id), dict[str, Counts])

    cert = kb.certificates.add(
        skill.id, branches=128, successes=126, randomized=["mass", "friction"], evaluation={}
    )
    assert_type(cert, Certificate)
    kb.revoke(skill.id, "drops thin mugs")
    active: bool = kb.is_active(skill.id)
    assert_type(kb.activation(skill.id), Activation)
    print(active, kb.activation(skill.id).reasons)

    with kb.batch():
        for cell_xy in [(1, 2), (3, 4)]:
            kitchen.observe(cell_xy, "free", confidence=0.7)
    kb.close()


def trust(site_key: Identity, robot_key: Identity, site_url: str) -> None:
    kb = knowledge.open("site.db", site_key, policy="trust.toml")
    kb = knowledge.open("site.db", site_key, policy=TrustPolicy())
    kb.delegate(robot_key.public_key, [Role.PUBLISH])
    kb.revoke_key(robot_key.public_key, last_seq=41, reason="robot lost")
    robot = knowledge.open(
        "robot.db", robot_key, policy=TrustPolicy().for_device_of(site_key.public_key)
    )
    report = federation.sync_with(robot, site_url, site_key.public_key)
    assert_type(report, federation.SyncReport)
    print(report.pulled, report.pushed, report.rejected, report.bytes_received)


def replication(a: KnowledgeBase, b: KnowledgeBase) -> None:
    heads = b.heads()
    assert_type(heads, dict[str, Head])
    page = a.envelopes_since(heads, limit=1000)
    assert_type(page, list[bytes])
    report = b.ingest(page)
    assert_type(report, IngestReport)
    for rejection in report.rejected:
        print(rejection.reason)
    a.checkpoint()


def query_by_embodiment(kb: KnowledgeBase) -> None:
    arm = Embodiment.from_mjcf("arm7.xml")
    other = Embodiment.from_urdf("arm6.urdf")
    kb.skills.publish("pick-mug-side-grasp", "pick", embodiments=[arm.to_dict(), other.to_dict()])

    results = kb.skills.query(
        "new_arm.urdf", task="pick", k=10, active_only=True, min_certified_branches=0
    )
    assert_type(results, list[QueryResult])
    for r in results:  # the issue: this loop failed `mypy --strict` while `list` was the method
        distance: float = r.distance
        summary: CertificateSummary = r.certificates
        scope: dict[str, Any] = r.skill.embodiments[r.scope]
        print(distance, r.skill.name, r.activation.reasons, summary.best_lower_bound, scope)
    nearest = [r.skill for r in kb.skills.query(arm, task="pick", encoder=FeatureEncoder())]
    assert_type(nearest, list[Skill])

    learned = kb.skills.query("new_arm.xml", task="reach", encoder=LearnedEncoder())
    assert_type(learned, list[QueryResult])
    encoder = train_encoder(TransferDataset.from_knowledge_base(kb))
    assert_type(encoder, LearnedEncoder)
    report = evaluate_encoder(TransferDataset.load("transfer.json.gz"), encoder)
    print(report)

    index = SkillIndex(FeatureEncoder().space)
    index.add(["a", "b"], FeatureEncoder().encode_many([arm, other]))
    for hit in index.search(FeatureEncoder().encode(arm), k=1):
        print(hit.skill_id, hit.distance)


def statistics() -> None:
    low: float = wilson_lower_bound(126, 128, 0.95)
    exact: float = clopper_pearson_lower(126, 128, 0.95)
    decision, decided_at = SPRT(0.85, 0.95).decide([True, True, False])
    print(low, exact, decision, decided_at)


def evaluate_and_certify(kb: KnowledgeBase, arm: Embodiment) -> None:
    skill = sim.publish_skill(
        kb, sim.load_skill("arm_reach_good"), "reach-good", "reach", embodiments=[arm.to_dict()]
    )
    assert_type(skill, Skill)
    task = sim.load_task("arm_reach")
    assert_type(task, sim.Task)
    policy = sim.load_policy(kb, skill.id)
    assert_type(policy, sim.Policy | sim.EntryPointRef)
    result = sim.evaluate(task, policy, branches=256, sampler=sim.load_sampler("arm_reach", 7))
    assert_type(result, sim.Evaluation)
    successes: int = result.successes
    bounds: tuple[float, float] = (result.wilson_lower, result.clopper_pearson_lower)
    print(successes, bounds)
    cert = sim.certify(kb, skill.id, result)
    assert_type(cert, Certificate)
    valid: bool = sim.verify_certificate(kb, cert).valid
    matches: bool = sim.reproduce(result.to_record(), sim.load_skill("arm_reach_good")).matches
    early = sim.evaluate(
        task, sim.load_skill("arm_reach_good"), branches=256, sprt=sim.SPRT(0.85, 0.95)
    )
    paired = sim.compare(
        task, sim.load_skill("arm_reach_good"), sim.load_skill("arm_reach_degraded"), branches=64
    )
    print(valid, matches, early.successes, paired)


def worlds(floor_xml: str, crate_xml: str, kb: KnowledgeBase, skill_id: str) -> None:
    walker = sim.load_task("walker_forward").definition["scene"]
    world = sim.World.create(
        "site/worlds/cell.db",
        {"west": floor_xml, "east": floor_xml},
        [Entity("walker1", walker, "west"), Entity("crate", crate_xml, "east", (0, 1, 0))],
        checkpoint_every=1000,
    )
    world.apply(
        "west",
        [
            Mutation("actuator/walker1/hhip/ctrl", "set", (0.4,)),
            Mutation("body/walker1/torso/mass", "scale", (1.2,)),
        ],
        provenance="operator:ana",
    )
    with world.batch():
        for tick in range(0, 2000, 20):
            world.apply("west", Mutation("actuator/walker1/hhip/ctrl", "set", (0.3,)), at=tick)
    world.advance(2000)
    world.close()
    world = sim.World.open("site/worlds/cell.db")

    branch = world.fork("west", at=1200)
    assert_type(branch, sim.Branch)
    branch.apply(Mutation("joint/walker1/rootz/qvel", "set", (1.5,)))
    branch.advance(400)
    exact: bool = world.replay("west", 0, 2000).exact
    whatif = world.replay(
        "west",
        1000,
        1600,
        interventions=[Intervention(1200, Mutation("body/walker1/torso/mass", "scale", (1.5,)))],
    )
    print(exact, whatif.branch, whatif.snapshot)
    world.migrate("walker1", "east")
    branch.delete()
    world.prune(before=1500)

    snap = world.snapshot("west")
    assert_type(snap, sim.Snapshot)
    skill = sim.load_policy(kb, skill_id)
    task = snap.task(sim.load_task("walker_forward"), "walker1")
    result = sim.evaluate(
        task,
        skill,
        branches=256,
        start=snap,
        sampler=snap.sampler(sim.load_sampler("walker_forward", seed=7), "walker1"),
    )
    cert = sim.certify(kb, skill_id, result)
    inside = world.evaluate(
        "west", sim.load_task("walker_forward"), skill, branches=256, entity="walker1"
    )
    assert_type(inside, sim.Evaluation)
    print(cert.evaluation, inside.successes)


def mistakes(kb: KnowledgeBase) -> None:
    # names the packages import on first use are known to the checker, and only those
    knowledge.Embodyment.from_mjcf("arm.xml")  # type: ignore[attr-defined]
    federation.serv("site")  # type: ignore[attr-defined]
    kb.skills.query("arm.xml", k="10")  # type: ignore[arg-type]
    for s in kb.skills.list():
        print(s.distance)  # type: ignore[attr-defined]  # a Skill; QueryResult has the distance


async def robot_sync(robot_kb: KnowledgeBase, url: str, key: bytes) -> None:
    report = await federation.async_sync_with(robot_kb, url, key)
    assert_type(report, federation.SyncReport)


def main() -> None:
    asyncio.run(robot_sync(knowledge.open(":memory:"), "http://site-a:7070", b"\0" * 32))

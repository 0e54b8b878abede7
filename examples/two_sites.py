"""Two sites share what their robots learn, in one process: publish, observe, count, certify,
revoke.

Site A's root key delegates a robot; the robot publishes a skill (the shipped arm-reaching
controller: its weights in a blob, its architecture and the task it is meant for in records) and
maps a room while "offline"; the sites exchange signed envelopes (what federation puts on the wire)
and converge. Site B, a validator, rolls the skill out in the simulator on the task it names and
certifies the result, which makes it active at site A; a revocation then turns it off everywhere.

    python examples/two_sites.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import knowledge
import sim
from knowledge import Identity, Role, TrustPolicy

ARM = Path(sim.__file__).parent / "assets" / "scenes" / "arm7.xml"  # the arm arm_reach runs


def sync(a: knowledge.KnowledgeBase, b: knowledge.KnowledgeBase) -> int:
    """One anti-entropy exchange in both directions; returns how many envelopes moved."""
    moved = 0
    while True:
        step = len(b.ingest(a.envelopes_since(b.heads())).accepted)
        step += len(a.ingest(b.envelopes_since(a.heads())).accepted)
        for device, site in (
            (a, b),
            (b, a),
        ):  # a robot takes its own site's heads as the word on its feed
            if device.policy.device_of == site.identity.public_key:
                device.learn_site_heads(site.heads())
        if not step:
            return moved
        moved += step


def main() -> None:
    root_a, root_b, robot = Identity.generate(), Identity.generate(), Identity.generate()
    # Each site trusts the other's root: A trusts B to validate, B trusts A to publish and revoke.
    policy_a = TrustPolicy.from_toml(
        f"""
        [[roots]]
        name = "site-b"
        key = "{root_b.public_key_hex}"
        roles = ["validate"]
        [activation]
        min_branches = 64
        min_lower_bound = 0.9
        required_randomization = ["mass", "damping", "gain"]
        """
    )
    policy_b = TrustPolicy().with_root(
        root_a.public_key, roles=[Role.PUBLISH, Role.REVOKE], name="site-a"
    )

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        site_a = knowledge.open(tmp / "site-a.db", root_a, policy=policy_a)
        site_b = knowledge.open(tmp / "site-b.db", root_b, policy=policy_b)
        robot_kb = knowledge.open(
            tmp / "robot.db", robot, policy=policy_a.for_device_of(root_a.public_key)
        )

        site_a.delegate(robot.public_key, [Role.PUBLISH])
        sync(site_a, robot_kb)
        print(f"site A ({root_a.key_id}) delegated robot {robot.key_id} the publish role")

        # The robot works offline: a skill, a semantic map, usage counts.
        skill = sim.publish_skill(
            robot_kb,
            sim.load_skill("arm_reach_good"),
            "reach-to-target",
            "reach",
            description="move the arm's tip to a target point",
            embodiments=[knowledge.Embodiment.from_mjcf(ARM).to_dict()],
            tasks=[sim.load_task("arm_reach")],
        )
        with robot_kb.batch():  # one envelope for the whole scan
            for x in range(4):
                robot_kb.maps["kitchen"].observe((x, 0), {"label": "counter"}, confidence=0.7)
            robot_kb.maps["kitchen"].observe((2, 1), {"label": "mug"}, confidence=0.9)
        for outcome in (True, True, False, True):
            robot_kb.counters.record(skill.id, success=outcome)
        print(f"robot published {skill.name} ({skill.id[:12]}…), mapped 5 cells, ran it 4 times")

        moved = sync(robot_kb, site_a) + sync(site_a, site_b)
        print(f"sync: {moved} signed envelopes moved robot -> site A -> site B")
        print(
            f"site B sees skill: {skill.id in site_b.skills}, "
            f"mug at {site_b.maps['kitchen'].get((2, 1)).cell}, "
            f"counts {site_b.counters.get(skill.id)}"
        )
        print(f"active at site A before any certificate: {site_a.is_active(skill.id)}")

        # Site B validates: the task the skill names arrived with it; its weights travel on demand
        # (over HTTP, from a peer's blob store; in process, copied from the robot by hash).
        for blob in skill.blobs:
            site_b.blobs.put(robot_kb.blobs.get(blob), expected=blob)
        (task,) = sim.skill_tasks(site_b, skill.id)
        result = sim.evaluate(
            task,
            sim.load_policy(site_b, skill.id),
            branches=64,
            sampler=sim.load_sampler(task.name, seed=5),  # masses, damping, gains, gravity
            progress=False,
        )
        sim.certify(site_b, skill.id, result)
        sync(site_a, site_b)
        certified_active = site_a.is_active(skill.id)
        print(
            f"site B evaluated it on {task.name}: {result.successes}/{result.n} branches "
            f"succeeded; active at site A now: {certified_active}"
        )

        site_a.revoke(skill.id, "overshoots near the joint limits")
        sync(site_a, site_b)
        sync(site_a, robot_kb)
        print(
            f"site A revoked it; active at A: {site_a.is_active(skill.id)}, "
            f"revoked at B: {site_b.is_revoked(skill.id)}, "
            f"revoked on the robot: {robot_kb.is_revoked(skill.id)}"
        )

        converged = site_a.snapshot() == site_b.snapshot() == robot_kb.snapshot()
        print(f"all three hold identical knowledge: {converged}")
        for kb in (site_a, site_b, robot_kb):
            kb.close()
        if not (converged and certified_active):
            raise SystemExit(1)


if __name__ == "__main__":
    main()

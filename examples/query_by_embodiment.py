"""Which skills will work on a new robot? Ask the knowledge base with the robot's model file.

A site publishes skills for six bodies (the simulator's 7-dof reaching arm, and the project's models
in examples/robots/: another 7-dof arm, a parallel gripper, a quadruped, a small humanoid and a
wheeled base), each skill scoped by the descriptors of the bodies it was made for. Only certificates
activate a skill, and only the simulator makes them: the site rolls the two shipped arm-reaching
controllers (a working one and a degraded one, published with the task they are meant for) out in
96 randomized branches each and certifies the results. The working one meets the site's policy; the
degraded one does not, and the site revokes it fleet-wide. The simulator has no task for the other
skills (picking, locomotion, docking), so nothing certifies them and they stay inactive, with the
reason. Then a new robot arrives, a 6-dof arm described only by its URDF, and the site asks which
skills fit it: first everything, nearest body first, then only active reach skills.

    python examples/query_by_embodiment.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import knowledge
import sim
from knowledge import ActivationPolicy, Embodiment, Identity, QueryResult, TrustPolicy

ROBOTS = Path(__file__).resolve().parent / "robots"
SIM_ARM = Path(sim.__file__).parent / "assets" / "scenes" / "arm7.xml"  # what arm_reach runs

# name, task family, scope (model files), shipped skill the simulator evaluates (or None)
SKILLS = [
    ("reach-good", "reach", [SIM_ARM], "arm_reach_good"),
    ("reach-degraded", "reach", [SIM_ARM], "arm_reach_degraded"),
    ("pick-mug-side-grasp", "pick", [ROBOTS / "arm7.xml"], None),
    ("pick-box-top-down", "pick", [ROBOTS / "arm7.xml", ROBOTS / "gripper.xml"], None),
    ("pinch-small-parts", "pick", [ROBOTS / "gripper.xml"], None),
    ("trot-flat-ground", "locomotion", [ROBOTS / "quadruped.xml"], None),
    ("climb-stairs", "locomotion", [ROBOTS / "humanoid_small.xml"], None),
    ("dock-to-charger", "navigate", [ROBOTS / "wheeled_base.xml"], None),
]
BRANCHES = 96


def state(result: QueryResult) -> str:
    return "active" if result.activation.active else result.activation.reasons[0]


def table(results: list[QueryResult]) -> str:
    header = (
        f"{'#':>2}  {'distance':>8}  {'skill':<20} {'task':<11} {'nearest scope':<17} {'certs':>5} "
        f"{'branches':>8} {'best LCB':>8}  state"
    )
    rows = [header, "-" * len(header)]
    for rank, r in enumerate(results, 1):
        scope = r.skill.embodiments[r.scope]["name"]
        c = r.certificates
        rows.append(
            f"{rank:>2}  {r.distance:8.3f}  {r.skill.name:<20} {r.skill.task:<11} "
            f"{scope:<17} {c.count:>5} "
            f"{c.branches:>8} {c.best_lower_bound:8.3f}  {state(r)}"
        )
    return "\n".join(rows)


def main() -> None:
    policy = TrustPolicy(
        activation=ActivationPolicy(
            min_branches=64,
            min_lower_bound=0.9,
            required_randomization=frozenset({"mass", "damping", "gain"}),
        )
    )
    task = sim.load_task("arm_reach")

    with tempfile.TemporaryDirectory() as tmp:
        # The site is its own validator here: a site root holds every role on its own store.
        with knowledge.open(Path(tmp) / "site.db", Identity.generate(), policy=policy) as kb:
            ids = {}
            for name, family, scope, shipped in SKILLS:
                bodies = [Embodiment.from_mjcf(path).to_dict() for path in scope]
                if shipped is None:  # a description of a skill: nothing here can run it
                    skill = kb.skills.publish(name, family, embodiments=bodies)
                    ids[name] = skill.id
                    continue
                skill = sim.publish_skill(
                    kb, sim.load_skill(shipped), name, family, embodiments=bodies, tasks=[task]
                )
                ids[name] = skill.id
                result = sim.evaluate(
                    task,
                    sim.load_policy(kb, skill.id),
                    branches=BRANCHES,
                    sampler=sim.load_sampler("arm_reach", seed=3),
                    progress=False,
                )
                cert = sim.certify(kb, skill.id, result)
                print(
                    f"simulator: {name:<15} {result.successes:>3}/{result.n} branches succeeded, "
                    f"Wilson lower bound {result.wilson_lower:.3f}; "
                    f"randomized {', '.join(cert.randomized)}"
                )
            degraded = kb.certificates.for_skill(ids["reach-degraded"])[0]
            kb.revoke(
                ids["reach-degraded"],
                f"misses its target in {degraded.branches - degraded.successes} "
                f"of {degraded.branches} simulated branches",
            )
            print("no simulator task for pick, locomotion or navigate: those stay uncertified\n")

            new_robot = ROBOTS / "arm6.urdf"
            print(f"new robot: {Embodiment.from_urdf(new_robot)}")
            print(
                "distance: Euclidean, between weighted morphology features "
                "(the default FeatureEncoder)\n"
            )
            print("every skill, nearest body first (active_only=False):")
            print(table(kb.skills.query(new_robot, active_only=False)))
            print("\nactive reach skills (task='reach', active_only=True):")
            print(table(kb.skills.query(new_robot, task="reach")))
            saved = sorted(p.name for p in Path(tmp).glob("*.index"))
            print(
                f"\nthe index is saved beside the store as {saved[0]} "
                "and reused when the site reopens"
            )


if __name__ == "__main__":
    main()

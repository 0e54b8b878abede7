"""Which skills will work on a new robot? Ask the knowledge base with the robot's model file.

A site publishes skills for five bodies (a 7-dof arm, a parallel gripper, a quadruped, a small
humanoid and a wheeled base: the project's models in examples/robots/), each skill scoped by the
descriptors of the bodies it was trained on. A validator certifies some, one is revoked. Then a new
robot arrives, a 6-dof arm described only by its URDF, and the site asks which skills fit it: first
everything, nearest body first, then only active pick skills.

    python examples/query_by_embodiment.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import knowledge
from knowledge import ActivationPolicy, Embodiment, Identity, QueryResult, TrustPolicy

ROBOTS = Path(__file__).resolve().parent / "robots"

# name, task family, scope (model files), certificate (branches, successes) or None
SKILLS = [
    ("pick-mug-side-grasp", "pick", ["arm7.xml"], (128, 127)),
    ("pick-box-top-down", "pick", ["arm7.xml", "gripper.xml"], (128, 126)),
    ("place-on-shelf", "place", ["arm7.xml"], (256, 251)),
    ("pinch-small-parts", "pick", ["gripper.xml"], (64, 50)),
    ("trot-flat-ground", "locomotion", ["quadruped.xml"], (128, 128)),
    ("climb-stairs", "locomotion", ["humanoid_small.xml"], None),
    ("dock-to-charger", "navigate", ["wheeled_base.xml"], (96, 95)),
]


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
            required_randomization=frozenset({"mass", "friction"}),
        )
    )
    bodies = {
        p.name: Embodiment.from_mjcf(p)
        for p in sorted(ROBOTS.glob("*.xml"))
        if "defaults" not in p.name
    }

    with tempfile.TemporaryDirectory() as tmp:
        with knowledge.open(Path(tmp) / "site.db", Identity.generate(), policy=policy) as kb:
            ids = {}
            for name, task, scope, certificate in SKILLS:
                skill = kb.skills.publish(
                    name, task, embodiments=[bodies[f].to_dict() for f in scope]
                )
                ids[name] = skill.id
                if certificate is not None:
                    branches, successes = certificate
                    kb.certificates.add(
                        skill.id,
                        branches=branches,
                        successes=successes,
                        randomized=["mass", "friction"],
                    )
            kb.revoke(ids["pick-mug-side-grasp"], "drops thin-walled mugs")

            new_robot = ROBOTS / "arm6.urdf"
            print(f"new robot: {Embodiment.from_urdf(new_robot)}")
            print(
                "distance: Euclidean, between weighted morphology features "
                "(the default FeatureEncoder)\n"
            )
            print("every skill, nearest body first (active_only=False):")
            print(table(kb.skills.query(new_robot, active_only=False)))
            print("\nactive pick skills (task='pick', active_only=True):")
            print(table(kb.skills.query(new_robot, task="pick")))
            saved = sorted(p.name for p in Path(tmp).glob("*.index"))
            print(
                f"\nthe index is saved beside the store as {saved[0]} "
                "and reused when the site reopens"
            )


if __name__ == "__main__":
    main()

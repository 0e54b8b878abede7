"""A site's persistent twin: log, reopen, fork before a slip, replay exactly, ask "what if", certify
from it.

A world of two shards (cells of a site) holds a walking robot and a crate. An operator's setpoints
are logged as the walker runs; the world is closed and reopened where it stopped; a branch is forked
before a moment of interest and pushed; the recorded history replays bit for bit; a counterfactual
replay makes the walker heavier; the walker migrates to the other cell; the walking skill is
certified from the world's own state, so the certificate says where and when it was evaluated; and
old history is pruned.

    python examples/world_twin.py
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import knowledge
import sim
from sim import Entity, Intervention, Mutation

FLOOR = """<mujoco model="cell"><option timestep="0.005"/>
  <worldbody><geom name="floor" type="plane" size="50 50 0.1"/></worldbody></mujoco>"""
CRATE = """<mujoco><worldbody><body name="crate" pos="1 0 0.3"><freejoint/>
  <geom name="box" type="box" size=".1 .1 .1" mass="2"/></body></worldbody></mujoco>"""


def setpoints(tick: int) -> list[Mutation]:
    """The walker's four joint targets: what an operator or a planner would send."""
    return [
        Mutation(f"actuator/walker1/{joint}/ctrl", "set", (0.15 * math.sin(0.02 * tick + i),))
        for i, joint in enumerate(("hhip", "hknee", "fhip", "fknee"))
    ]


def walker_x(snapshot: sim.Snapshot) -> float:
    """The walker's forward position: its root slide joint in the snapshot's state row (time comes
    first)."""
    return float(snapshot.state[1 + snapshot.template.model.joint("walker1/rootx").qposadr[0]])


def main() -> None:
    walker = sim.load_task("walker_forward").definition["scene"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cell.db"
        with sim.World.create(
            path,
            {"west": FLOOR, "east": FLOOR},
            [Entity("walker1", walker, "west"), Entity("crate", CRATE, "east", (0, 1, 0))],
        ) as world:
            with world.batch():
                for tick in range(0, 2000, 20):
                    world.apply("west", setpoints(tick), at=tick, provenance="planner")
            world.advance(2000)
            before = world.snapshot("west")
        with sim.World.open(path) as world:
            print(
                f"reopened at tick {world.head('west')}, "
                f"same state: {world.snapshot('west').same_state(before)}"
            )
            branch = world.fork("west", at=1200)
            branch.apply(
                Mutation("joint/walker1/rootz/qvel", "set", (1.5,)), provenance="what if it jumped"
            )
            branch.advance(400)
            print(
                f"branch {branch.id} at tick {branch.head}; canonical untouched: "
                f"{world.snapshot('west').same_state(before)}"
            )
            replay = world.replay("west", 0, 2000)
            print(
                f"replay 0..2000: exact={replay.exact}, {len(replay.checked)} checkpoints compared"
            )
            heavier = world.replay(
                "west",
                1000,
                2000,
                interventions=[
                    Intervention(1200, Mutation("body/walker1/torso/mass", "scale", (1.5,)))
                ],
            )
            print(
                f"counterfactual: a heavier walker ends at x={walker_x(heavier.snapshot):.3f}, "
                f"the recorded one at x={walker_x(replay.snapshot):.3f} "
                f"(branch {heavier.branch.id})"
            )
            world.migrate("walker1", "east", provenance="walked into the east cell")
            print(f"entities: {world.entities()}")

            snap = world.snapshot("east")
            kb = knowledge.open(Path(tmp) / "site.db", knowledge.Identity.generate())
            task = snap.task(sim.load_task("walker_forward"), "walker1")  # walking in this cell
            skill = sim.publish_skill(
                kb, sim.load_skill("walker_forward_good"), "walk", "walk", tasks=[task]
            )
            result = sim.evaluate(
                task,
                sim.load_policy(kb, skill.id),
                branches=64,
                start=snap,
                progress=False,
                sampler=snap.sampler(sim.load_sampler("walker_forward", seed=7), "walker1"),
            )
            cert = sim.certify(kb, skill.id, result)
            start = cert.evaluation["start"]
            print(
                f"certified {cert.successes}/{cert.branches} from world "
                f"{start['world']['name']} shard {start['shard']} at t={start['time']:.2f}s; "
                f"verifies: {sim.verify_certificate(kb, cert).valid}"
            )
            kb.close()

            for old in (
                world.branches()
            ):  # retention: the what-ifs are done, and so is the history before 1000
                old.delete()
            print(f"pruned: {world.prune(before=1000)} (history from these ticks on)")


if __name__ == "__main__":
    main()

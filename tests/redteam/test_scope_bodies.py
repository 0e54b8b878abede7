"""A publish-only robot of a trusted site writes skills whose scope bodies are within every check a
descriptor has, and no robot: a body with 1,500 joints, a chain of 1,500 bodies, two bodies of
10^308 kg each, a joint of negative damping. Another site's queries encode them when they index
the skills (`simnet skills query` at that site, and its robots' own queries).

Before the fix, a query with the learned encoder after those skills arrived padded every body
it encoded with them to 1,500 joints (the attention of 25 arms so padded took gigabytes: 100 arms
21 GB and 156 s, against 0.4 s) and measured the chain's farthest points one by one in Python (7 s
for 1,000 bodies, 28 s for 2,000, twice per body); any query raised OverflowError on the masses
(the feature encoder's too, the default), the learned one ValueError on the damping, and a
robot's second query found nothing at all, honest skills included, for as long as it ran. Now
such bodies cost about what their bytes do, a scope the encoder cannot encode is skipped, and the
honest skills are found.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import federation
from knowledge import Embodiment, LearnedEncoder
from knowledge.embodiment import FeatureEncoder

from .test_forks import simnet
from .test_new_surfaces import device
from .test_scene_budget import run_capped

ARM = Path(__file__).parents[2] / "examples" / "robots" / "arm7.xml"
HONEST = 24  # honest skills, each for another arm: what the query encodes beside the scopes


def _body(parent: int) -> dict:
    return {
        "name": "",
        "parent": parent,
        "pos": [0.1, 0.0, 0.0] if parent >= 0 else [0.0, 0.0, 0.0],
        "quat": [1, 0, 0, 0],
        "mass": 1,
        "com": [0, 0, 0],
        "inertia": [1, 1, 1, 0, 0, 0],
        "extent": 0.1,
    }


def _joint(body: int, damping: float = 0.0) -> dict:
    return {
        "name": "",
        "body": body,
        "type": "hinge",
        "axis": [0, 0, 1],
        "range": None,
        "damping": damping,
        "armature": 0,
        "frictionloss": 0,
        "force_range": None,
    }


def _scope(bodies: list[dict], joints: list[dict]) -> dict:
    return {
        "format": 1,
        "name": "scope",
        "bodies": bodies,
        "joints": joints,
        "actuators": [],
        "sites": [],
        "sensors": [],
    }


def hostile_scopes() -> dict[str, dict]:
    """Descriptors `Embodiment.from_dict` takes (every number finite, every list within its
    length), each under 256 KB."""
    heavy = [_body(-1), _body(0), _body(1)]
    heavy[1]["mass"] = heavy[2]["mass"] = 1e308
    return {
        "wide": _scope([_body(-1), _body(0)], [_joint(1) for _ in range(1500)]),
        "long": _scope([_body(i - 1) for i in range(1500)], [_joint(1)]),
        "heavy": _scope(heavy, [_joint(1), _joint(2)]),
        "negative": _scope([_body(-1), _body(0)], [_joint(1, damping=-5.0)]),
    }


def honest_arms(count: int) -> list[Embodiment]:
    """The example arm, its masses scaled: a body of its own for each honest skill."""
    arm = Embodiment.from_mjcf(ARM)
    return [
        dataclasses.replace(
            arm,
            name=f"arm-{i}",
            bodies=tuple(dataclasses.replace(b, mass=b.mass * (1 + i / 50)) for b in arm.bodies),
        )
        for i in range(count)
    ]


def timed_query(site, encoder: str) -> tuple[float, int, list[str]]:
    """`simnet skills query` at the site with the arm (every skill, its nearest 8): seconds, peak
    resident MB and the skills' names; AssertionError with the output if it fails."""
    started = time.monotonic()
    args = ("skills", "query", "--mjcf", str(ARM), "--all", "-k", "8", "--json")
    status, output, peak = run_capped(site, *args, "--encoder", encoder)
    took = time.monotonic() - started
    assert status == 0 and "Traceback" not in output, output[-3000:]
    return took, peak, [row["name"] for row in json.loads(output[output.index("[") :])]


def test_a_peers_scope_bodies_neither_stall_nor_break_another_sites_queries(live, tmp_path):
    a, b = live("a"), live("b")  # a's queries; b a site a trusts to publish
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet(site, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    a.start(), b.start()

    honest = device(a, tmp_path, "honest", "publish")
    for body in honest_arms(HONEST):
        honest.skills.publish(body.name, "reach", embodiments=[body.to_dict()])
    federation.sync_with(honest, a.url, a.key.public_key)
    honest.close()
    before = {encoder: timed_query(a, encoder) for encoder in ("learned", "features")}
    assert len(before["learned"][2]) == 8

    robot = device(b, tmp_path, "robot", "publish")  # the attacker: publish only
    for name, scope in hostile_scopes().items():
        robot.skills.publish(name, "reach", embodiments=[scope])
    federation.sync_with(robot, b.url, b.key.public_key)
    simnet(a, "sync")  # a pulls b's new skills
    assert len(json.loads(simnet(a, "skills", "list", "--json"))) == HONEST + 4

    for index in a.home.glob("*.index"):  # as at a site whose first query comes now: the index,
        index.unlink()  # a cache, is built from every skill held, the honest and b's
    for encoder in ("learned", "features"):
        took, peak, names = timed_query(a, encoder)
        took_before, peak_before, names_before = before[encoder]
        assert names == names_before, (encoder, names)  # the arms, nearest first, as before
        assert took < took_before + 10, (encoder, took, took_before)
        assert peak < peak_before + 1000, (encoder, peak, peak_before)

    # a robot of a that holds the library and queries as long as it runs
    reader = device(a, tmp_path, "reader", "publish")
    for encoder in (FeatureEncoder(), LearnedEncoder(), FeatureEncoder()):
        found = reader.skills.query(ARM, active_only=False, k=HONEST, encoder=encoder)
        assert {r.skill.name for r in found} == {f"arm-{i}" for i in range(HONEST)}, encoder
    reader.close()
    a.assert_no_traceback(), b.assert_no_traceback()

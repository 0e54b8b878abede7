"""A robot of a trusted site, holding only the publish role, against a real `simnet serve
--validate` that revoked its skill: it publishes the very same tensors again, re-encoded with a
line of safetensors metadata, so the weights blob (and the skill's revocation key, its hash) is new.
Before the fix the validator certified the copy and it was active again: a revocation "of the
behaviour, not the record" missed the same behaviour in other bytes. Now weights count only in the
one encoding of their tensors (`Policy.from_tensors`'s): the copy is refused with the reason in the
validator's status and never active.
"""

from __future__ import annotations

import json

import safetensors.torch

import federation
import sim
from knowledge import content_hash

from .conftest import wait_until
from .test_forks import simnet
from .test_new_surfaces import device


def test_the_same_tensors_in_other_bytes_do_not_escape_a_revocation(live, tmp_path):
    a, b = live("a"), live("b")  # a validates and revokes; b is a site a trusts to publish
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet(site, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    (a.home / "validator.toml").write_text("branches = 64\n")  # what activation asks for
    a.start("--validate"), b.start()
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")

    def active() -> list[str]:
        return [s["name"] for s in json.loads(simnet(a, "skills", "list", "--json")) if s["active"]]

    robot = device(b, tmp_path, "robot", "publish")
    bad = sim.publish_skill(robot, good, "bad", "reach", tasks=[task])
    federation.sync_with(robot, b.url, b.key.public_key, push_blobs=list(bad.blobs))
    simnet(b, "sync")
    wait_until(lambda: active() == ["bad"], 120, "the skill to be certified", step=1)
    simnet(a, "revoke", bad.id, "--reason", "hurt someone in the field")
    assert active() == []

    tensors = safetensors.torch.load(good.weights)
    again = safetensors.torch.save(dict(sorted(tensors.items())), metadata={"v": "2"})
    assert again != good.weights and safetensors.torch.load(again).keys() == tensors.keys()
    weights = robot.blobs.put(again)
    architecture = good.spec.to_json()
    skill_hash = content_hash({"architecture": architecture, "weights_sha256": weights})
    policy = {
        "kind": "mlp",
        "architecture": architecture,
        "weights": weights,
        "skill_hash": skill_hash,
    }
    robot.skills.publish("bad-again", "reach", policy=policy, blobs=[weights], tasks=[task.hash])
    federation.sync_with(robot, b.url, b.key.public_key, push_blobs=[weights])
    simnet(b, "sync")

    def judged() -> bool:
        validator = a.status()["validator"]
        failed = [f["name"] for f in validator["failed"]]
        return "bad-again" in failed or validator["certificates"] > 1

    wait_until(judged, 120, "the copy to be judged", step=1)
    assert active() == [], "the revoked behaviour is active again under new bytes"
    failed = {f["name"]: f["reason"] for f in a.status()["validator"]["failed"]}
    for phrase in ("PolicyPayloadError", "one encoding of their tensors", "Policy.from_tensors"):
        assert phrase in failed["bad-again"], (phrase, failed["bad-again"])
    a.stop()
    a.assert_no_traceback(), b.assert_no_traceback()

"""A robot of a trusted site, holding only the publish role, against a real `simnet serve
--validate`: it publishes the shipped reach weights on tasks that would never end (a horizon of
10^12 steps, and one of 10^6 physics steps a branch, within what a task may say but over the site's
`max_branch_steps`). Before the fix the validator sat on the first for ever: an honest skill
published after it was never certified, and the site took a minute to stop. Now both are refused
with their reasons in the validator's status, the honest skill is certified and active, and the
site stops at once.
"""

from __future__ import annotations

import json

import federation
import sim

from .conftest import wait_until
from .test_forks import simnet
from .test_new_surfaces import device


def validating_pair(live):
    """Sites a and b, serving: a validates (64 branches, what activation asks for) and trusts b to
    publish; b trusts a to validate."""
    a, b = live("a"), live("b")  # a validates; b is a site a trusts to publish
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet(site, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    (a.home / "validator.toml").write_text("branches = 64\n")  # what activation asks for
    a.start("--validate"), b.start()
    return a, b


def certified_honest_skill(a, tmp_path, within: float):
    """A robot of `a` publishes the shipped reach skill; wait until it is the only active one (the
    validator got past whatever came before it), and return it."""
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")
    robot_of_a = device(a, tmp_path, "honest", "publish")
    honest = sim.publish_skill(robot_of_a, good, "honest", "reach", tasks=[task])
    federation.sync_with(robot_of_a, a.url, a.key.public_key, push_blobs=list(honest.blobs))

    def active() -> list[str]:
        return [s["name"] for s in json.loads(simnet(a, "skills", "list", "--json")) if s["active"]]

    wait_until(lambda: active() == ["honest"], within, "the honest skill to be certified", step=1)
    return honest


def test_a_publish_only_robot_cannot_stall_a_validating_site(live, tmp_path):
    a, b = validating_pair(live)
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")

    robot = device(b, tmp_path, "robot", "publish")
    weights = robot.blobs.put(good.weights)
    policy = {
        "kind": "mlp",
        "architecture": good.spec.to_json(),
        "weights": weights,
        "skill_hash": good.hash,
    }
    endless = robot.tasks.publish({**task.to_json(), "horizon": 10**12})  # no Task would take it
    robot.skills.publish("endless", "reach", policy=policy, blobs=[weights], tasks=[endless])
    sim.publish_skill(robot, good, "long", "reach", tasks=[task.replace(horizon=100_000)])
    federation.sync_with(robot, b.url, b.key.public_key, push_blobs=[weights])
    simnet(b, "sync")
    assert a.status()["skills"] == 2  # a holds both before anything honest is published

    certified_honest_skill(a, tmp_path, 120)
    failed = {f["name"]: f["reason"] for f in a.status()["validator"]["failed"]}
    assert set(failed) == {"endless", "long"}, failed
    assert "TaskDefinitionError" in failed["endless"] and "horizon" in failed["endless"]
    for phrase in ("arm_reach", "100,000 x 10 = 1,000,000", "20,000", "raise max_branch_steps"):
        assert phrase in failed["long"], (phrase, failed["long"])

    a.stop()  # at once: nothing is under way (Live.stop gives it 30 s)
    assert "did not stop" not in a.log_text()
    a.assert_no_traceback(), b.assert_no_traceback()

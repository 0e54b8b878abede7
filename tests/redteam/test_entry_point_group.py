"""A robot of a trusted site, holding only the publish role, against a real `simnet serve
--validate`: its skill's policy names a locally installed entry point, as a skill may, but in the
group "console_scripts" rather than "simnet.policies": the `simnet` program itself. Before the fix
the validator imported it and called it with the task (`knowledge.cli:run(task)`: any installed
program's entry point, chosen by the record). Now a policy's entry point is looked up in the
policies' group only: the skill fails with PolicySpecError naming the field, nothing is imported.
"""

from __future__ import annotations

import importlib.metadata
import json

import federation
import sim

from .conftest import wait_until
from .test_forks import simnet
from .test_new_surfaces import device


def test_a_skill_cannot_make_a_validator_call_an_installed_program(live, tmp_path):
    a, b = live("a"), live("b")  # a validates; b is a site a trusts to publish
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet(site, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    a.start("--validate"), b.start()
    program = next(
        ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name == "simnet"
    )
    assert program.dist is not None and program.value == "knowledge.cli:run"
    policy = {
        "kind": "entry_point",
        "group": "console_scripts",
        "name": "simnet",
        "distribution": program.dist.name,
        "version": program.dist.version,
    }
    robot = device(b, tmp_path, "robot", "publish")
    task = robot.tasks.publish(sim.load_task("arm_reach").to_json())
    robot.skills.publish("program", "reach", policy=policy, tasks=[task])
    federation.sync_with(robot, b.url, b.key.public_key)
    simnet(b, "sync")

    wait_until(lambda: a.status()["validator"]["failed"], 60, "the skill to be judged", step=1)
    failed = {f["name"]: f["reason"] for f in a.status()["validator"]["failed"]}
    assert set(failed) == {"program"}, failed
    for phrase in ("PolicySpecError", "policy.group", "simnet.policies"):
        assert phrase in failed["program"], (phrase, failed["program"])
    assert not [s for s in json.loads(simnet(a, "skills", "list", "--json")) if s["active"]]
    a.stop()
    a.assert_no_traceback(), b.assert_no_traceback()

"""A mesh robot's skill across real processes: its task's files travel as blobs by hash. A robot
publishes the skill and its task (the files stay with the robot); the validator site's `serve
--validate` waits for them, then certifies once the robot gives them to it; a third site's
`simnet verify` says "cannot verify here" while its peer lacks them, and "valid" once it has them,
with the robot's directory gone."""

from __future__ import annotations

import json
import shutil

import numpy as np

import knowledge
import sim
from federation import sync_with

from .conftest import SiteProcess, simnet, wait_until


def still(task: sim.Task) -> sim.Policy:
    """Motors off: a linear skill (data, so it publishes and certifies)."""
    return sim.Policy.linear(
        np.zeros((task.act_dim, task.obs_dim)), np.zeros(task.act_dim), {"note": "motors off"}
    )


def certificates(site: SiteProcess, skill_id: str) -> list[knowledge.Certificate]:
    with knowledge.open(site.home / "site.db", policy=site.home / "trust.toml") as kb:
        return kb.certificates.for_skill(skill_id) if skill_id in kb.skills else []


def waiting(site: SiteProcess) -> list[dict]:
    path = site.home / "validator.json"
    return json.loads(path.read_text()).get("waiting", []) if path.exists() else []


def test_a_mesh_task_is_certified_once_its_files_arrive_and_verified_elsewhere(
    fleet, tmp_path, mesh_robot
):
    publisher, validator, verifier = (fleet.add(n) for n in ("publisher", "validator", "verifier"))
    for a, b in ((publisher, validator), (validator, publisher), (publisher, verifier)):
        fleet.connect(a, b)
    fleet.connect(verifier, publisher)  # the verifier's one peer
    fleet.trust(verifier, validator)  # it counts the validator's certificates
    (validator.home / "validator.toml").write_text("branches = 8\nretry_s = 1.0\n")
    publisher.start()
    validator.start("--validate")

    identity = knowledge.Identity.generate()
    simnet(publisher.home, "device", "add", identity.public_key_hex, "--roles", "publish")
    robot = knowledge.open(
        ":memory:", identity, policy=knowledge.TrustPolicy().for_device_of(publisher.key.public_key)
    )
    sync_with(robot, publisher.url, publisher.key.public_key)
    scene = mesh_robot(tmp_path / "robot")
    task = sim.reach_task(scene, end_effector="ee", horizon=10)
    skill = sim.publish_skill(robot, still(task), "still", "reach", tasks=[task])
    files = sorted(task.definition["assets"].values())
    shutil.rmtree(tmp_path / "robot")  # from here on the files exist only as the robot's blobs
    assert set(files) < set(skill.blobs)  # what a robot pushes with the skill, but here:
    weights_only = [skill.policy["weights"]]  # a robot that pushes its weights and not its meshes
    sync_with(robot, publisher.url, publisher.key.public_key, push_blobs=weights_only)

    wait_until(
        lambda: any("asset 'meshes/fore.obj'" in w["reason"] for w in waiting(validator)),
        120,
        "the validator to wait for the mesh",
    )
    assert not certificates(validator, skill.id)
    report = sync_with(robot, validator.url, validator.key.public_key, push_blobs=files)
    assert report.blobs_pushed == len(files)  # the validator holds the task: it takes its files
    wait_until(lambda: certificates(validator, skill.id), 120, "the certificate")
    (cert,) = certificates(validator, skill.id)
    assert cert.evaluation["task"]["hash"] == task.hash

    wait_until(lambda: certificates(publisher, skill.id), 60, "the certificate at the publisher")
    simnet(verifier.home, "sync")
    lacking = simnet(verifier.home, "verify", cert.id[:16], "--json", check=False)
    assert lacking.returncode == 3, lacking.stderr
    verdict = json.loads(lacking.stdout)
    assert verdict["verdict"] == "cannot verify here" and not verdict["valid"]
    assert verdict["detail"].startswith("cannot verify here: asset 'meshes/fore.obj' (")
    assert "publisher: " in verdict["detail"]  # the peer it asked, and what it said

    sync_with(robot, publisher.url, publisher.key.public_key, push_blobs=files)
    valid = simnet(verifier.home, "verify", cert.id[:16], "--json")
    assert json.loads(valid.stdout)["verdict"] == "valid"
    robot.close()

"""A robot of a trusted site, holding only the publish role, against a real `simnet serve
--validate`: it publishes the shipped reach weights on the reach task with one line added to the
scene, a heightfield of 20,000 x 20,000 samples (1.6 GB of floats, from 90 bytes of MJCF) placed
where nothing touches it. Before the fix the validator compiled it in the server's own process
(and hashed a copy of the compiled model): a larger one takes the machine's memory and the site with
it. Now the scene is compiled first in a child process capped at `max_scene_mb`; the task is
refused unstarted with its reason in the validator's status, an honest skill after it is certified
and active, and the site never held the heightfield.
"""

from __future__ import annotations

import json
import resource

import federation
import sim

from .conftest import wait_until
from .test_forks import simnet
from .test_new_surfaces import device

BOMB = '<hfield name="bomb" nrow="20000" ncol="20000" size="1 1 1 0.1"/>'


def peak_rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) >> 10 for line in status if line.startswith("VmHWM:"))


def test_a_scene_that_asks_for_gigabytes_is_refused_before_the_site_compiles_it(live, tmp_path):
    a, b = live("a"), live("b")  # a validates; b is a site a trusts to publish
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet(site, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    (a.home / "validator.toml").write_text("branches = 64\n")  # what activation asks for
    a.start("--validate"), b.start()
    # Only for this machine's sake, where the old code runs: the victim may not take more than
    # 8 GB of address space (it uses about 3.3 GB for its libraries); a real site has no such cap.
    resource.prlimit(a.pid, resource.RLIMIT_AS, (8 << 30, 8 << 30))
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")

    robot = device(b, tmp_path, "robot", "publish")
    scene = task.to_json()["scene"].replace("<worldbody>", f"<asset>{BOMB}</asset><worldbody>", 1)
    far = '<geom type="hfield" hfield="bomb" pos="50 0 0"/>'  # nothing touches it
    scene = scene.replace("<worldbody>", f"<worldbody>{far}")
    bomb = robot.tasks.publish({**task.to_json(), "scene": scene})
    weights = robot.blobs.put(good.weights)
    policy = {
        "kind": "mlp",
        "architecture": good.spec.to_json(),
        "weights": weights,
        "skill_hash": good.hash,
    }
    robot.skills.publish("bomb", "reach", policy=policy, blobs=[weights], tasks=[bomb])
    federation.sync_with(robot, b.url, b.key.public_key, push_blobs=[weights])
    simnet(b, "sync")
    assert a.status()["skills"] == 1  # a holds it before anything honest is published

    robot_of_a = device(a, tmp_path, "honest", "publish")
    honest = sim.publish_skill(robot_of_a, good, "honest", "reach", tasks=[task])
    federation.sync_with(robot_of_a, a.url, a.key.public_key, push_blobs=list(honest.blobs))

    def active() -> list[str]:
        return [s["name"] for s in json.loads(simnet(a, "skills", "list", "--json")) if s["active"]]

    wait_until(lambda: active() == ["honest"], 120, "the honest skill to be certified", step=1)
    wait_until(lambda: a.status()["validator"]["failed"], 30, "the bomb to be refused", step=1)
    failed = {f["name"]: f["reason"] for f in a.status()["validator"]["failed"]}
    assert set(failed) == {"bomb"}, failed
    for phrase in ("over budget", "task arm_reach: its scene", "1,024 MiB", "max_scene_mb"):
        assert phrase in failed["bomb"], (phrase, failed["bomb"])
    assert peak_rss_mb(a.pid) < 1500  # the heightfield never lived in the site's process
    a.stop()
    a.assert_no_traceback(), b.assert_no_traceback()

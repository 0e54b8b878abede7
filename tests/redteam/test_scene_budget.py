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
import subprocess
import sys

import federation
import knowledge
import sim

from .conftest import SIMNET, wait_until
from .test_forks import simnet
from .test_new_surfaces import device
from .test_validator_budget import certified_honest_skill, validating_pair

BOMB = '<hfield name="bomb" nrow="20000" ncol="20000" size="1 1 1 0.1"/>'


def peak_rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) >> 10 for line in status if line.startswith("VmHWM:"))


def test_a_scene_that_asks_for_gigabytes_is_refused_before_the_site_compiles_it(live, tmp_path):
    a, b = validating_pair(live)
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

    certified_honest_skill(a, tmp_path, 120)
    wait_until(lambda: a.status()["validator"]["failed"], 30, "the bomb to be refused", step=1)
    failed = {f["name"]: f["reason"] for f in a.status()["validator"]["failed"]}
    assert set(failed) == {"bomb"}, failed
    for phrase in ("over budget", "task arm_reach: its scene", "1,024 MiB", "max_scene_mb"):
        assert phrase in failed["bomb"], (phrase, failed["bomb"])
    assert peak_rss_mb(a.pid) < 1500  # the heightfield never lived in the site's process
    a.stop()
    a.assert_no_traceback(), b.assert_no_traceback()


_MEASURED = """
import os, subprocess, sys
process = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(process.pid, 0)
with open(sys.argv[1], "w") as peak:
    peak.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs a command and writes its peak resident size (KB) to a file. It is started from this small
interpreter, not from the test's worker: Linux counts the resident size a process had before its
`exec` (a fork of a worker holding gigabytes) in its peak."""


def run_capped(site, *args: str) -> tuple[int, str, int]:
    """`simnet --home site args` in a process capped at 8 GB of address space (for this machine's
    sake, where the old code runs): its exit status, output and peak resident MB (its own and its
    children's, such as the scene check's)."""
    out, peak = site.home / "capped.out", site.home / "capped.peak"
    command = ["prlimit", f"--as={8 << 30}", *SIMNET, "--home", str(site.home), *args]
    with open(out, "w") as sink:
        status = subprocess.run(
            [sys.executable, "-c", _MEASURED, str(peak), *command],
            stdout=sink,
            stderr=subprocess.STDOUT,
        ).returncode
    return status, out.read_text(), int(peak.read_text()) >> 10


def test_verify_and_evaluate_refuse_a_scene_that_asks_for_gigabytes_before_compiling_it(
    live, tmp_path
):
    """`simnet verify` of a certificate whose record names the heightfield scene, and `simnet
    evaluate --task` of it saved as a file, compiled it in their own process (1.6 GB, then hashed):
    they had no scene budget. Now a child process compiles it first under the validator's limits,
    and the command refuses it naming the task and the limit (verify: no verdict, exit 3)."""
    site = live("site")  # a home; no server: the commands open the store themselves
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")
    far = '<geom type="hfield" hfield="bomb" pos="50 0 0"/>'  # nothing touches it
    scene = task.to_json()["scene"].replace(
        "<worldbody>", f"<asset>{BOMB}</asset><worldbody>{far}", 1
    )
    bomb = {**task.to_json(), "scene": scene}
    with knowledge.SiteHome(site.home).open_writer() as kb:
        skill = sim.publish_skill(kb, good, "good", "reach", tasks=[task])
        record = sim.evaluate(task, good, branches=8, progress=False).to_record()
        record["task"] = {"definition": bomb, "hash": knowledge.content_hash(bomb)}  # as a peer's
        certificate = sim.certify(kb, skill.id, record)
    (tmp_path / "bomb.json").write_text(json.dumps(bomb))
    limit = "this site's budget of 1,024 MiB and 60 s (--max-scene-mb, --max-compile-s"

    status, output, peak = run_capped(site, "verify", certificate.id[:16])
    assert status == 3, output
    assert (
        f"{certificate.id[:16]} UNVERIFIED: cannot verify here: task arm_reach: its scene" in output
    )
    assert limit in output and "Traceback" not in output
    assert peak < 1500, peak  # the heightfield never lived in the command's process

    args = ("evaluate", "arm_reach_good", "--task", str(tmp_path / "bomb.json"), "--branches", "8")
    status, output, peak = run_capped(site, *args)
    assert status == 1 and "task arm_reach: its scene with 8 simulations" in output, output
    assert limit in output and "Traceback" not in output
    assert peak < 1500, peak

"""A publish-only robot against a real `simnet serve --validate`: the shipped reach weights on the
reach task with four bodies of 100 spheres each dropped on one another far from the arm. The scene
fits the memory budget and the task the step budget (750 physics steps a branch), but once they
touch every control step of 64 simulations takes most of a second: a wave, a minute or more. Before
the fix the validator looked at its stop signal only between waves, so a site asked to stop kept
simulating for over 30 s, and no budget bounded the job's time. Now the stop is honoured
within a control step, and a job that runs past `max_job_s` fails for good, named, with no
certificate; an honest skill after it is certified.
"""

from __future__ import annotations

import time

import federation
import knowledge
import sim

from .conftest import wait_until
from .test_new_surfaces import device
from .test_validator_budget import certified_honest_skill

COLLIDES = 'contype="1" conaffinity="1"'  # the task's geoms collide with nothing by default
SPHERES = "".join(
    f'<geom type="sphere" size=".05" pos="{i % 10 * 0.09} {i // 10 * 0.09} 0" {COLLIDES}/>'
    for i in range(100)
)
PILE = "".join(f'<body pos="10 0 {0.06 + k * 0.3}"><freejoint/>{SPHERES}</body>' for k in range(4))
FLOOR = f'<geom type="plane" size="20 20 .1" {COLLIDES}/>'
ARENA = '<size memory="8M"/>'  # per simulation: 64 fit max_scene_mb


def test_a_slow_scene_neither_holds_a_stop_nor_runs_past_the_job_budget(live, tmp_path):
    a = live("a")
    (a.home / "validator.toml").write_text("branches = 64\n")  # what activation asks for
    a.start("--validate")
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")
    robot = device(a, tmp_path, "robot", "publish")
    scene = task.to_json()["scene"].replace("<worldbody>", f"<worldbody>{FLOOR}{PILE}", 1)
    scene = scene.replace("</mujoco>", f"{ARENA}</mujoco>")
    pile = sim.Task({**task.to_json(), "scene": scene})
    slow = sim.publish_skill(robot, good, "slow", "reach", tasks=[pile])
    federation.sync_with(robot, a.url, a.key.public_key, push_blobs=list(slow.blobs))

    def current() -> str | None:
        return ((a.status()["validator"] or {}).get("current") or {}).get("name")

    wait_until(lambda: current() == "slow", 60, "the slow skill's evaluation to start", step=0.5)
    time.sleep(8)  # its scene checked and compiled: the first wave is under way
    asked = time.monotonic()
    a.stop()
    took = time.monotonic() - asked
    assert took < 10, f"the site took {took:.1f} s to stop"
    assert "stopped during evaluate slow" in a.log_text()

    (a.home / "validator.toml").write_text("branches = 64\nmax_job_s = 10\n")
    a.start("--validate")  # the slow skill is queued again, first
    wait_until(lambda: current() == "slow", 60, "the slow skill's evaluation to resume", step=0.5)
    honest = certified_honest_skill(a, tmp_path, 120)
    (failed,) = a.status()["validator"]["failed"]
    assert failed["name"] == "slow" and failed["retry_at"] is None, failed  # not retried
    for phrase in ("over budget", "more than this site's budget of 10 s", "raise max_job_s"):
        assert phrase in failed["reason"], (phrase, failed["reason"])
    started = time.monotonic()
    a.stop()
    assert time.monotonic() - started < 10
    with knowledge.SiteHome(a.home).open_readonly() as kb:
        assert kb.certificates.for_skill(slow.id) == []
        assert len(kb.certificates.for_skill(honest.id)) == 1
    assert "did not stop" not in a.log_text()
    a.assert_no_traceback()

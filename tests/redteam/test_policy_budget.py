"""A robot of a trusted site, holding only the publish role, against a real `simnet serve
--validate`: its skill is a network of four layers of 1,024 units (13 MB of float32 weights, far
within what a policy may carry) on the reach task at 20,000 control steps of one physics step
each, within the site's `max_branch_steps`. Before the fix the validator rolled it out for minutes
a wave (a network at the limits of a policy, for hours) while an honest skill published after it
waited. Now the network's
cost per branch, read from the record before its weights are fetched, is over `max_branch_macs`:
it is refused unstarted with the reason in the validator's status, and the honest skill is
certified and active at once.
"""

from __future__ import annotations

import numpy as np

import federation
import sim

from .test_forks import simnet
from .test_new_surfaces import device
from .test_validator_budget import certified_honest_skill, validating_pair


def test_a_publish_only_robot_cannot_stall_a_validator_with_a_huge_network(live, tmp_path):
    a, b = validating_pair(live)
    task = sim.load_task("arm_reach")
    long = task.replace(horizon=20_000, control_substeps=1)  # the step budget

    spec = sim.MLPSpec(task.obs_dim, task.act_dim, hidden=(1024,) * 4, dtype="float32")
    rng = np.random.default_rng(0)
    tensors = {n: rng.normal(0, 0.01, s) for n, s in spec.tensor_shapes().items()}
    tensors["obs_std"] = np.ones(task.obs_dim)
    huge = sim.Policy.from_tensors(spec, tensors)
    robot = device(b, tmp_path, "robot", "publish")
    slow = sim.publish_skill(robot, huge, "huge", "reach", tasks=[long])
    federation.sync_with(robot, b.url, b.key.public_key, push_blobs=list(slow.blobs))
    simnet(b, "sync")
    assert a.status()["skills"] == 1  # a holds it before anything honest is published

    certified_honest_skill(a, tmp_path, 60)
    failed = {f["name"]: f["reason"] for f in a.status()["validator"]["failed"]}
    assert set(failed) == {"huge"}, failed
    for phrase in ("over budget", "multiply-adds", "10,000,000,000", "max_branch_macs"):
        assert phrase in failed["huge"], (phrase, failed["huge"])
    a.stop()  # at once: nothing is under way
    a.assert_no_traceback(), b.assert_no_traceback()

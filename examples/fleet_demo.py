"""The whole loop, by itself, across three sites on this machine; nothing typed in.

Each site is a real `simnet serve` process on a loopback port with its own key, store and policy:

- at site A a robot arm distills its controller into a small MLP skill on its own body (DAgger in
  the embedded simulator) and publishes it with its weights and the task it is for;
- gossip carries it to B and C; B runs the validator service (`serve --validate`): it fetches the
  weights from a peer, evaluates the skill in 128 randomized branches and signs a certificate;
- C's policy counts another site's certificate only once C has re-run part of it itself: C's
  validator spot-checks B's certificate, it reproduces, and the skill turns active at C too;
- a robot at C with a different body (a 6-dof arm described by a URDF) finds the skill by
  embodiment query and loads its weights from its site;
- A revokes the skill, and it turns off at every site and on the robot.

    python examples/fleet_demo.py
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import torch

import knowledge
import sim
from federation import PeerBlobSource, SimnetAuth, SiteConfig, sync_with
from knowledge import Identity, TrustPolicy
from sim.evaluation import distill

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]
SITES = ("site-a", "site-b", "site-c")
ROBOTS = Path(__file__).resolve().parent / "robots"
# every site: a skill is active once a trusted validator certified it on 128 branches or more, with
# a 95% lower bound of 0.8 on success, randomizing masses and friction
ACTIVATION = {
    "min_branches": 128,
    "min_lower_bound": 0.8,
    "required_randomization": frozenset({"mass", "friction"}),
}
STARTED = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.1f} s] {text}", flush=True)


def simnet(home: Path, *args: str) -> str:
    result = subprocess.run([*SIMNET, "--home", str(home), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"simnet {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_status(home: Path) -> dict:
    """A site's status, asked over HTTP with the site's own key (its store is the server's)."""
    identity = Identity.load(SiteConfig.load(home).key_path)
    url = json.loads((home / "serve.json").read_text())["url"]
    auth = SimnetAuth(identity, identity.public_key)
    return httpx.get(f"{url}/v1/status", auth=auth, timeout=10).json()


def validator_state(home: Path) -> dict:
    """What a site's validator service last reported (its status; `simnet status` shows it too)."""
    return site_status(home).get("validator") or {}


def wait_for(what: str, predicate, timeout: float = 90.0) -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out waiting for: {what}")
        time.sleep(0.2)
    say(f"{what} ({time.monotonic() - start:.1f} s)")


def init_sites(tmp: Path) -> tuple[dict[str, Path], dict[str, int], dict[str, bytes]]:
    homes = {name: tmp / name for name in SITES}
    ports = {name: free_port() for name in SITES}
    keys = {}
    for name, home in homes.items():
        simnet(home, "init", "--name", name, "--listen", f"127.0.0.1:{ports[name]}")
        keys[name] = Identity.load(home / "site.key").public_key
    for name, home in homes.items():  # a full mesh; every site trusts the others for every role
        for other in SITES:
            if other != name:
                url = f"http://127.0.0.1:{ports[other]}"
                trust = ["--key", keys[other].hex(), "--trust", "publish,validate,revoke"]
                simnet(home, "peer", "add", other, url, *trust)
        config = SiteConfig.load(home)
        config.gossip = type(config.gossip)(interval_s=0.5, jitter=0.2, max_backoff_s=4.0)
        config.save()
        policy = TrustPolicy.load(home / "trust.toml")
        activation: dict = dict(ACTIVATION)
        validator = "branches = 128\n"
        if name == "site-c":  # C re-runs 32 branches of another site's certificate first
            activation["spot_check_branches"] = 32
            validator = "certifies = false  # only spot-check\n"
        (home / "trust.toml").write_text(
            replace(policy, activation=replace(policy.activation, **activation)).to_toml()
        )
        (home / "validator.toml").write_text(validator)
    return homes, ports, keys


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        homes, ports, keys = init_sites(Path(tmp))
        say("three sites initialized: " + ", ".join(f"{n} :{p}" for n, p in ports.items()))
        logs = [open(home / "serve.log", "w") for home in homes.values()]  # noqa: SIM115 - closed below
        flags = {"site-a": [], "site-b": ["--validate"], "site-c": ["--validate"]}
        servers = [
            subprocess.Popen(
                [*SIMNET, "--home", str(home), "serve", *flags[name]],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for (name, home), log in zip(homes.items(), logs, strict=True)
        ]
        try:
            wait_for(
                "all three servers answer (B and C also run the validator service)",
                lambda: all((h / "serve.json").exists() for h in homes.values()),
            )
            run_fleet(homes, ports, keys)
        finally:
            for server in servers:
                server.send_signal(signal.SIGTERM)
            for server in servers:
                server.wait(timeout=60)
            for log in logs:
                log.close()
            say("servers stopped by SIGTERM; each wrote its log to <site>/serve.log")


def run_fleet(homes: dict[str, Path], ports: dict[str, int], keys: dict[str, bytes]) -> None:
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    # A robot arm at site A: its own key, delegated by A's root, its own store.
    robot = Identity.generate()
    simnet(homes["site-a"], "device", "add", robot.public_key_hex, "--roles", "publish")
    robot_kb = knowledge.open(":memory:", robot, policy=TrustPolicy().for_device_of(keys["site-a"]))
    sync_with(robot_kb, url["site-a"], keys["site-a"])  # learns its delegation

    # Its controller is a 64x64 network; it distills it into a 32x32 MLP on its own body.
    task = sim.load_task("arm_reach")
    teacher = sim.load_skill("arm_reach_good").module()

    def controller(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return teacher(torch.as_tensor(obs)).numpy()

    skill_policy = distill(
        task,
        controller,
        sampler=sim.load_sampler("arm_reach", seed=11),
        branches=64,
        iterations=3,
        hidden=(32, 32),
        act_bound=0.15,
        epochs=400,
    )
    body = knowledge.Embodiment.from_mjcf(ROBOTS / "arm7.xml")
    skill = sim.publish_skill(
        robot_kb,
        skill_policy,
        "reach-dls-32",
        "reach",
        description="reach a target with the end effector (distilled on an arm7)",
        embodiments=[body.to_dict()],
        tasks=[task],
    )
    weights = skill.policy["weights"]
    report = sync_with(robot_kb, url["site-a"], keys["site-a"], push_blobs=[weights])
    say(
        f"robot {robot.key_id} distilled and published {skill.name} ({skill.id[:12]}…, "
        f"{len(skill_policy.weights)} bytes of weights, task {task.name} {task.hash[:12]}…); "
        f"pushed {report.pushed} envelopes and its weights to site-a"
    )

    wait_for(
        "gossip brings the skill to site-b and site-c",
        lambda: all(site_status(homes[n])["skills"] == 1 for n in ("site-b", "site-c")),
    )
    wait_for(
        "site-b's validator fetched the weights, evaluated 128 branches and certified it",
        lambda: validator_state(homes["site-b"]).get("certificates", 0) >= 1,
        timeout=120,
    )
    b = validator_state(homes["site-b"])
    say(
        f"  site-b evaluated {b['branches_evaluated']} branches at "
        f"{b['branches_per_s']:.0f} branches/s (randomized: mass, friction, damping, gain, "
        "initial state)"
    )
    wait_for(
        "the certificate reaches site-a and the skill is active there",
        lambda: site_status(homes["site-a"])["active_skills"] == 1,
    )
    wait_for(
        "site-c's validator spot-checked site-b's certificate",
        lambda: validator_state(homes["site-c"]).get("spot_checks", 0) >= 1,
        timeout=120,
    )
    c = validator_state(homes["site-c"])
    say(
        f"  site-c re-ran {c['branches_spot_checked']} of its branches in random whole waves: "
        f"they reproduced ({c['disputes']} disputes)"
    )
    wait_for(
        "the skill is active at every site",
        lambda: all(site_status(h)["active_skills"] == 1 for h in homes.values()),
    )

    # A robot with another body at site C: it finds the skill by embodiment, as C's policy says.
    other = Identity.generate()
    simnet(homes["site-c"], "device", "add", other.public_key_hex, "--roles", "publish")
    site_c_policy = TrustPolicy.load(homes["site-c"] / "trust.toml")
    other_kb = knowledge.open(":memory:", other, policy=site_c_policy.for_device_of(keys["site-c"]))
    sync_with(other_kb, url["site-c"], keys["site-c"])
    (found,) = other_kb.skills.query(ROBOTS / "arm6.urdf", task="reach")
    other_kb.blobs.add_source(PeerBlobSource("site-c", url["site-c"], keys["site-c"], other))
    loaded = sim.load_policy(other_kb, found.skill.id)
    say(
        f"a 6-dof arm (URDF) at site-c queries by embodiment: {found.skill.name} at distance "
        f"{found.distance:.3f}, active={found.activation.active}; its weights fetched from site-c "
        f"match: {loaded.hash == skill_policy.hash}"
    )

    simnet(homes["site-a"], "revoke", skill.id, "--reason", "overshoots near the joint limits")
    say("site-a revoked it (simnet revoke)")
    wait_for(
        "the revocation reaches every site",
        lambda: all(site_status(h)["active_skills"] == 0 for h in homes.values()),
    )
    sync_with(other_kb, url["site-c"], keys["site-c"])
    say(f"the robot at site-c syncs: active there now: {other_kb.is_active(skill.id)}")
    for name, home in homes.items():
        s = site_status(home)
        say(
            f"  {name}: skills {s['skills']}, active {s['active_skills']}, "
            f"certificates {s['certificates']}, revocations {s['revocations']}"
        )
    say("certificates typed in by hand: 0")


if __name__ == "__main__":
    main()

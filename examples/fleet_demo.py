"""A fleet of three sites on this machine: publish at one, watch gossip carry it, certify, revoke.

Each site is a real `simnet serve` process on a loopback port with its own key, store and policy. A
robot delegated by site A publishes a skill; gossip brings it to B and C; a validator delegated by
site B certifies it, so it becomes active under A's policy; A revokes it and the revocation reaches
every site. Everything is shut down at the end.

    python examples/fleet_demo.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import knowledge
from federation import SimnetAuth, SiteConfig, sync_with
from knowledge import Identity, TrustPolicy

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]
SITES = ("site-a", "site-b", "site-c")


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
    config = SiteConfig.load(home)
    identity = Identity.load(config.key_path)
    url = json.loads((home / "serve.json").read_text())["url"]
    return httpx.get(
        f"{url}/v1/status", auth=SimnetAuth(identity, identity.public_key), timeout=10
    ).json()


def wait_for(what: str, predicate, timeout: float = 60.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out waiting for: {what}")
        time.sleep(0.2)
    elapsed = time.monotonic() - start
    print(f"  ... {what}: {elapsed:.1f} s")
    return elapsed


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        homes = {name: Path(tmp) / name for name in SITES}
        ports = {name: free_port() for name in SITES}
        keys = {}
        for name, home in homes.items():
            simnet(home, "init", "--name", name, "--listen", f"127.0.0.1:{ports[name]}")
            keys[name] = Identity.load(home / "site.key").public_key
        for name, home in homes.items():  # full mesh; every site trusts the others for every role
            for other in SITES:
                if other != name:
                    simnet(
                        home,
                        "peer",
                        "add",
                        other,
                        f"http://127.0.0.1:{ports[other]}",
                        "--key",
                        keys[other].hex(),
                        "--trust",
                        "publish,validate,revoke",
                    )
            config = SiteConfig.load(home)
            config.gossip = type(config.gossip)(interval_s=0.5, jitter=0.2, max_backoff_s=4.0)
            config.save()
        print(
            f"three sites initialized in {tmp}: " + ", ".join(f"{n} :{p}" for n, p in ports.items())
        )

        logs = [open(home / "serve.log", "w") for home in homes.values()]  # noqa: SIM115 - closed below
        servers = [
            subprocess.Popen(
                [*SIMNET, "--home", str(home), "serve"], stdout=log, stderr=subprocess.STDOUT
            )
            for home, log in zip(homes.values(), logs, strict=True)
        ]
        try:
            wait_for(
                "all three servers answer",
                lambda: all((h / "serve.json").exists() for h in homes.values()),
            )
            run_fleet(homes, ports, keys)
        finally:
            for server in servers:
                server.send_signal(signal.SIGTERM)
            for server in servers:
                server.wait(timeout=20)
            for log in logs:
                log.close()
            print(
                "servers stopped by SIGTERM; each wrote its log to <site>/serve.log, e.g.:\n"
                + "".join(
                    f"    {line}"
                    for line in (homes["site-b"] / "serve.log").read_text().splitlines(True)[:4]
                )
            )


def run_fleet(homes: dict[str, Path], ports: dict[str, int], keys: dict[str, bytes]) -> None:
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    # A robot at site A: its own key, delegated by A's root, with its own (here: in-memory) store.
    robot = Identity.generate()
    simnet(homes["site-a"], "device", "add", robot.public_key_hex, "--roles", "publish")
    robot_kb = knowledge.open(":memory:", robot, policy=TrustPolicy().for_device_of(keys["site-a"]))
    sync_with(robot_kb, url["site-a"], keys["site-a"])  # learns its delegation
    weights = robot_kb.blobs.put(os.urandom(64 * 1024))
    skill = robot_kb.skills.publish(
        "pick-mug-side-grasp",
        "pick",
        description="grasp a mug from the side",
        policy={"blob": weights, "format": "safetensors"},
        blobs=[weights],
    )
    for ok in (True, True, True, False):
        robot_kb.counters.record(skill.id, success=ok)
    report = sync_with(robot_kb, url["site-a"], keys["site-a"])
    print(
        f"robot {robot.key_id} published {skill.name} ({skill.id[:12]}…) "
        f"and pushed {report.pushed} envelopes to site-a"
    )

    wait_for(
        "gossip brings the skill to site-b and site-c",
        lambda: all(site_status(homes[n])["skills"] == 1 for n in ("site-b", "site-c")),
    )

    # A validator at site B certifies the skill (the simulator would produce these numbers).
    validator = Identity.generate()
    simnet(homes["site-b"], "device", "add", validator.public_key_hex, "--roles", "validate")
    validator_kb = knowledge.open(
        ":memory:", validator, policy=TrustPolicy().for_device_of(keys["site-b"])
    )
    sync_with(validator_kb, url["site-b"], keys["site-b"])
    validator_kb.certificates.add(
        skill.id,
        branches=128,
        successes=127,
        randomized=["mass", "friction"],
        evaluation={"task": "pick-mug", "note": "from a branch evaluation"},
    )
    sync_with(validator_kb, url["site-b"], keys["site-b"])
    print(f"validator {validator.key_id} at site-b certified it: 127/128 branches")
    wait_for(
        "the skill is active at every site",
        lambda: all(site_status(h)["active_skills"] == 1 for h in homes.values()),
    )

    simnet(homes["site-a"], "revoke", skill.id, "--reason", "drops mugs with thin handles")
    print("site-a revoked it (simnet revoke)")
    wait_for(
        "the revocation reaches every site",
        lambda: all(
            site_status(h)["revocations"] == 1 and site_status(h)["active_skills"] == 0
            for h in homes.values()
        ),
    )
    sync_with(robot_kb, url["site-a"], keys["site-a"], blobs=[weights])
    print(f"the robot syncs: revoked on the robot too: {robot_kb.is_revoked(skill.id)}")
    for name, home in homes.items():
        s = site_status(home)
        print(
            f"  {name}: skills {s['skills']}, active {s['active_skills']}, "
            f"certificates {s['certificates']}, "
            f"revocations {s['revocations']}, writers {s['writers']}"
        )
    print(simnet(homes["site-c"], "skills", "list").rstrip())


if __name__ == "__main__":
    main()

"""The closed loop across sites, as real `simnet serve` processes, with one dishonest validator.

N sites (`--quick`: 4) in a full mesh, each trusting the others for every role:
- site 0 publishes (a robot of its own: an MLP reach skill with its weights and task) and revokes;
  its policy counts certificates without re-running them;
- site 1 is an honest validator: `serve --validate` evaluates skills on 128 branches and certifies;
- the middle sites spot-check: their policy counts another site's certificate only after re-running
  32 of its branches (`serve --validate` with `certifies = false`);
- the last site is a dishonest validator: a device of its own signs certificates that claim every
  branch of the *degraded* reach skill succeeded (a real evaluation, outcomes inflated).

Every policy stops counting a validator after one dispute. Measured: publish of the good skill until
it is active at every site, revocation until inactive everywhere, branches evaluated and re-run by
the validator services, remote certificates spot-checked, disputes seen at every site, and whether
the degraded skill is active anywhere once the dispute has spread. The raw baseline
is the same 128-branch evaluation in this process (`raw_evaluate_s`).

Prints one JSON line.   python benchmarks/loop.py [--quick] [--sites N]
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import knowledge
import sim
from federation import SiteConfig, sync_with
from knowledge import Identity, TrustPolicy
from sim.evaluation._evaluation_record import _summary
from sim.validation import fleet_sampler

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]
BRANCHES = 128


def simnet(home: Path, *args: str) -> str:
    result = subprocess.run([*SIMNET, "--home", str(home), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"simnet {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Site:
    def __init__(self, root: Path, index: int, role: str) -> None:
        self.name, self.role, self.home = f"site-{index}", role, root / f"site-{index}"
        self.port, self.process = free_port(), None
        simnet(self.home, "init", "--name", self.name, "--listen", f"127.0.0.1:{self.port}")
        self.key = Identity.load(self.home / "site.key").public_key

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configure(self, sites: list[Site]) -> None:
        for other in sites:
            if other is not self:
                trust = ["--key", other.key.hex(), "--trust", "publish,validate,revoke"]
                simnet(self.home, "peer", "add", other.name, other.url, *trust)
        config = SiteConfig.load(self.home)
        config.gossip = type(config.gossip)(interval_s=0.5, jitter=0.2, max_backoff_s=2.0)
        config.save()
        policy = TrustPolicy.load(self.home / "trust.toml")
        activation = replace(
            policy.activation,
            min_branches=BRANCHES,
            min_lower_bound=0.8,
            distrust_after_disputes=1,
            spot_check_branches=32 if self.role == "spot-check" else 0,
        )
        (self.home / "trust.toml").write_text(replace(policy, activation=activation).to_toml())
        spot_only = self.role == "spot-check"
        settings = "certifies = false\n" if spot_only else f"branches = {BRANCHES}\n"
        (self.home / "validator.toml").write_text(settings)

    def start(self) -> None:
        flags = ["--validate"] if self.role in ("validator", "spot-check") else []
        self.log = open(self.home / "serve.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*SIMNET, "--home", str(self.home), "serve", *flags],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
            self.log.close()

    def read(self) -> knowledge.KnowledgeBase:
        """The site's store, read-only beside its server, judged by its own policy."""
        return knowledge.open(self.home / "site.db", policy=self.home / "trust.toml")

    def validator(self) -> dict:
        path = self.home / "validator.json"
        return json.loads(path.read_text()) if path.exists() else {}


def wait(predicate, timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - start


def everywhere(sites: list[Site], check) -> bool:
    for site in sites:
        with site.read() as kb:
            if not check(kb):
                return False
    return True


def device(site: Site, roles: str) -> knowledge.KnowledgeBase:
    """A device of `site` (a robot, a validator machine) under its site's policy, in memory,
    synced with its site."""
    identity = Identity.generate()
    simnet(site.home, "device", "add", identity.public_key_hex, "--roles", roles)
    policy = TrustPolicy.load(site.home / "trust.toml").for_device_of(site.key)
    kb = knowledge.open(":memory:", identity, policy=policy)
    sync_with(kb, site.url, site.key)
    return kb


def forge(liar: knowledge.KnowledgeBase, skill: knowledge.Skill, task: sim.Task) -> None:
    """A real evaluation of `skill`, every outcome then claimed a success, signed as a
    certificate."""
    honest = sim.evaluate(
        task,
        sim.load_policy(liar, skill.id),
        branches=BRANCHES,
        sampler=fleet_sampler(task, seed=1),
        progress=False,
    ).to_record()
    inflated = json.loads(json.dumps(honest))
    inflated["outcomes"]["success"] = [1] * BRANCHES
    inflated["summary"] = _summary(BRANCHES, BRANCHES, honest["summary"]["mean_return"], 0.95)
    liar.certificates.add(
        skill.id,
        branches=BRANCHES,
        successes=BRANCHES,
        randomized=sim.randomized(inflated),
        evaluation=inflated,
    )


def run(n: int) -> dict:
    task = sim.load_task("arm_reach")
    good, degraded = sim.load_skill("arm_reach_good"), sim.load_skill("arm_reach_degraded")
    started = time.perf_counter()
    sampler = sim.load_sampler("arm_reach")
    sim.evaluate(task, good, branches=BRANCHES, sampler=sampler, progress=False)
    raw_evaluate_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        roles = ["publisher", "validator"] + ["spot-check"] * (n - 3) + ["dishonest"]
        sites = [Site(Path(tmp), i, role) for i, role in enumerate(roles)]
        for site in sites:
            site.configure(sites)
        for site in sites:
            site.start()
        try:
            wait(lambda: all((s.home / "serve.json").exists() for s in sites), 120)
            publisher, liar_site = sites[0], sites[-1]
            robot = device(publisher, "publish")
            liar = device(liar_site, "validate")

            # the dishonest validator forges first, so that honest work can only catch it
            bad = sim.publish_skill(robot, degraded, "reach-degraded", "reach", tasks=[task])
            sync_with(robot, publisher.url, publisher.key, push_blobs=list(bad.blobs))
            liar.blobs.put(robot.blobs.get(bad.blobs[0]))

            def liar_has_it() -> bool:  # gossip brings the skill to the liar's site
                sync_with(liar, liar_site.url, liar_site.key)
                return bad.id in liar.skills

            wait(liar_has_it, 120)
            forge(liar, bad, task)
            sync_with(liar, liar_site.url, liar_site.key)

            published = time.perf_counter()
            skill = sim.publish_skill(robot, good, "reach-good", "reach", tasks=[task])
            sync_with(robot, publisher.url, publisher.key, push_blobs=list(skill.blobs))
            wait(lambda: everywhere(sites, lambda kb: kb.is_active(skill.id)), 300)
            publish_to_active_s = time.perf_counter() - published
            wait(lambda: everywhere(sites, lambda kb: len(kb.certificates.disputes()) >= 1), 300)
            disputed_after_s = time.perf_counter() - published

            revoked = time.perf_counter()
            simnet(publisher.home, "revoke", skill.id, "--reason", "benchmark")
            wait(lambda: everywhere(sites, lambda kb: not kb.is_active(skill.id)), 300)
            revoke_to_inactive_s = time.perf_counter() - revoked
            states = [s.validator() for s in sites]
            with publisher.read() as kb:
                disputes = len(kb.certificates.disputes())
            degraded_active = [
                s.name for s in sites if everywhere([s], lambda kb: kb.is_active(bad.id))
            ]
        finally:
            for site in sites:
                site.stop()
    return {
        "benchmark": "loop",
        "sites": n,
        "publish_to_active_s": round(publish_to_active_s, 2),
        "revoke_to_inactive_s": round(revoke_to_inactive_s, 2),
        "branches_evaluated": sum(s.get("branches_evaluated", 0) for s in states),
        "branches_spot_checked": sum(s.get("branches_spot_checked", 0) for s in states),
        "spot_checked": sum(s.get("spot_checks", 0) for s in states),
        "disputes_detected": disputes,
        "dispute_everywhere_s": round(disputed_after_s, 2),
        "forged_certificates": 1,
        "sites_where_the_forged_skill_is_active": len(degraded_active),
        "hand_typed_certificates": 0,
        "raw_evaluate_s": round(raw_evaluate_s, 3),
        "publish_to_active_over_raw_evaluate": round(publish_to_active_s / raw_evaluate_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4 sites")
    parser.add_argument("--sites", type=int, default=None, help="how many sites (at least 4)")
    args = parser.parse_args()
    n = args.sites or (4 if args.quick else 8)
    if n < 4:
        parser.error("the loop needs at least 4 sites: publisher, validator, spot-check, liar")
    print(json.dumps(run(n)))


if __name__ == "__main__":
    main()

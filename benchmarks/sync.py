"""Sync over real HTTP between `simnet serve` processes on loopback.

(a) One site holds K new records (default 10,000 skill records, one per envelope, as robots
    publish them); a fresh site pulls them: wall time, records/s, and bytes on the wire
    (compressed bodies, as sent) against the raw size of the records' JSON payloads.
(b) M sites (default 16), each holding records of its own, in push-pull gossip rounds: in every
    round each site syncs with one peer chosen at random, all at once; rounds until every site
    holds everything, against the goal ceil(log2 M) + 2.
(c) P peers (default 64) sync with one busy `simnet serve` site at once, each pulling what is new
    there (20 records, a gossip round's increment) and pushing 3 of its own: the fraction of
    rounds that succeed (goal: all), round time p50/p99 against one uncontended round (goal: p99
    under 2 s), and /v1/health's p99 latency while it lasts.

Prints one JSON line.   python benchmarks/sync.py [--quick] [--records K] [--sites M] [--peers P]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import knowledge
from federation import GossipConfig, PeerConfig, SimnetAuth, SiteConfig, sync_with
from knowledge import Identity, TrustPolicy

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Site:
    def __init__(self, root: Path, name: str) -> None:
        self.name, self.home, self.port = name, root / name, free_port()
        subprocess.run(
            [
                *SIMNET,
                "--home",
                str(self.home),
                "init",
                "--name",
                name,
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            check=True,
            capture_output=True,
        )
        config = SiteConfig.load(self.home)
        config.gossip = GossipConfig(interval_s=3600.0)  # the benchmark drives every round itself
        config.save()
        self.key = Identity.load(self.home / "site.key")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def trust(self, keys: list[bytes]) -> None:
        policy = TrustPolicy()
        for key in keys:
            policy = policy.with_root(key)
        (self.home / "trust.toml").write_text(policy.to_toml())

    def publish(self, count: int) -> int:
        """Write `count` skill records into the site's own store (before serving); returns payload
        bytes."""
        with knowledge.open(self.home / "site.db", self.key, policy=self.home / "trust.toml") as kb:
            before = {s.id for s in kb.skills.list()}
            for i in range(count):
                kb.skills.publish(
                    f"{self.name}-skill-{i}",
                    random.choice(["pick", "place", "walk", "push"]),
                    description=f"skill {i} learned at {self.name}: approach, grasp, lift, verify",
                    embodiments=[{"fingerprint": f"{random.getrandbits(256):064x}", "dof": 7}],
                    preconditions=["object visible"],
                    postconditions=["object held"],
                )
            return sum(
                len(knowledge.canonical_json(_record(kb, s.id)))
                for s in kb.skills.list()
                if s.id not in before
            )

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*SIMNET, "--home", str(self.home), "serve"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit(f"{self.name} did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def admin(self, path: str, body: dict) -> dict:
        auth = SimnetAuth(self.key, self.key.public_key)
        return (
            httpx.post(f"{self.url}{path}", json=body, auth=auth, timeout=600)
            .raise_for_status()
            .json()
        )

    def heads(self) -> dict:
        auth = SimnetAuth(self.key, self.key.public_key)
        return (
            httpx.get(f"{self.url}/v1/heads", auth=auth, timeout=60)
            .raise_for_status()
            .json()["heads"]
        )


def _record(kb: knowledge.KnowledgeBase, skill_id: str) -> dict:
    return json.loads(kb._replica.feeds[kb.identity.public_key].get(f"skill/{skill_id}"))


def bulk_pull(root: Path, records: int) -> dict:
    source = Site(root, "source")
    fresh_key = Identity.generate()
    source.trust([fresh_key.public_key])  # reading needs trust too
    payload = source.publish(records)
    source.start()
    try:
        policy = TrustPolicy().with_root(source.key.public_key)
        with knowledge.open(root / "fresh.db", fresh_key, policy=policy) as fresh:
            start = time.perf_counter()
            report = sync_with(fresh, source.url, source.key.public_key)
            seconds = time.perf_counter() - start
            assert len(fresh.skills.list()) == records, (
                "the fresh site did not receive every record"
            )
    finally:
        source.stop()
    wire = report.bytes_sent + report.bytes_received
    return {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "wire_bytes": wire,
        "payload_bytes": payload,
        "bytes_ratio": round(wire / payload, 3),
    }


def gossip_rounds(root: Path, count: int, per_site: int, rng: random.Random) -> dict:
    sites = [Site(root, f"g{i:02d}") for i in range(count)]
    for site in sites:
        config = SiteConfig.load(site.home)
        config.peers = [PeerConfig(o.name, o.url, o.key.public_key) for o in sites if o is not site]
        config.save()
        site.trust([o.key.public_key for o in sites if o is not site])
        site.publish(per_site)
    with ThreadPoolExecutor(len(sites)) as pool:
        list(pool.map(Site.start, sites))
        try:
            rounds = 0
            while len({json.dumps(h, sort_keys=True) for h in pool.map(Site.heads, sites)}) > 1:
                rounds += 1
                if rounds > 50:
                    raise SystemExit("gossip did not converge in 50 rounds")
                pairs = [(s, rng.choice([o for o in sites if o is not s])) for s in sites]
                list(
                    pool.map(
                        lambda pair: pair[0].admin("/v1/admin/sync", {"peer": pair[1].name}), pairs
                    )
                )
        finally:
            list(pool.map(Site.stop, sites))
    return {
        "sites": count,
        "rounds_to_converge": rounds,
        "rounds_goal": math.ceil(math.log2(count)) + 2,
    }


def cpu_seconds(pid: int) -> float | None:
    """A process's CPU time so far (user + system; Linux's /proc, else None)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_server(root: Path, peers: int, records: int) -> dict:
    server = Site(root, "busy")
    clients = [Identity.generate() for _ in range(peers + 1)]  # the last one: the baseline round
    server.trust([c.public_key for c in clients])
    server.publish(records)
    server.start()
    policy = TrustPolicy().with_root(server.key.public_key)
    probes: list[float] = []
    failures = 0
    stop = False

    def probe() -> None:
        """/v1/health every 50 ms, a new connection each time, as a load balancer checks. One
        client for all: a client per probe would load the CA bundle each time (~30 ms of CPU, over
        half a core at this rate), loading the machine it measures."""
        nonlocal failures
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=5, limits=fresh) as client:
            while not stop:
                start = time.perf_counter()
                try:
                    client.get(f"{server.url}/v1/health").raise_for_status()
                    probes.append(time.perf_counter() - start)
                except httpx.HTTPError:
                    failures += 1
                time.sleep(0.05)

    def one_round(identity: Identity) -> float | None:
        with knowledge.open(":memory:", identity, policy=policy) as kb:
            for i in range(3):
                kb.skills.publish(f"{identity.key_id}-{i}", "pick")
            start = time.perf_counter()
            try:
                sync_with(kb, server.url, server.key.public_key, deadline=120)
            except knowledge.SimnetError:
                return None
            return time.perf_counter() - start

    try:
        alone = one_round(clients.pop())  # one round with nobody else syncing: the baseline
        assert server.process is not None
        server_cpu = cpu_seconds(server.process.pid)
        own_cpu, wall = time.process_time(), time.perf_counter()
        prober = ThreadPoolExecutor(1)
        prober.submit(probe)
        with ThreadPoolExecutor(peers) as pool:
            times = list(pool.map(one_round, clients))
        stop = True
        wall = time.perf_counter() - wall
        own_cpu = time.process_time() - own_cpu
        after = cpu_seconds(server.process.pid)
        server_cpu = None if after is None or server_cpu is None else after - server_cpu
        prober.shutdown(wait=True)
    finally:
        server.stop()
    done = sorted(t for t in times if t is not None)
    return {
        "busy_peers": peers,
        "busy_success_rate": round(len(done) / peers, 3),
        "busy_round_p50_s": round(statistics.median(done), 3) if done else None,
        "busy_round_p99_s": round(done[min(len(done) - 1, int(0.99 * len(done)))], 3)
        if done
        else None,
        "uncontended_round_s": round(alone, 3) if alone else None,
        "health_p99_ms": round(1000 * sorted(probes)[int(0.99 * (len(probes) - 1))], 1)
        if probes
        else None,
        "health_failures": failures,
        # where the time goes: the whole burst's wall time, the server's CPU per round, and this
        # process's (the 64 peers: opening, publishing, syncing; and the probe)
        "busy_wall_s": round(wall, 3),
        "busy_server_cpu_ms_per_round": round(1000 * server_cpu / peers, 1)
        if server_cpu is not None
        else None,
        "busy_peers_cpu_ms_per_round": round(1000 * own_cpu / peers, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--sites", type=int, default=None)
    parser.add_argument("--peers", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    records = args.records or (1_000 if args.quick else 10_000)
    sites = args.sites or (6 if args.quick else 16)
    rng = random.Random(args.seed)
    random.seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"benchmark": "sync", **bulk_pull(Path(tmp) / "a", records)}
        result.update(gossip_rounds(Path(tmp) / "b", sites, 3, rng))
        result.update(busy_server(Path(tmp) / "c", args.peers or 64, 20))
    result["record_kind"] = "skill record, one per envelope"
    print(json.dumps(result))


if __name__ == "__main__":
    main()

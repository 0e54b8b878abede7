"""A fleet of sites gossiping over a simulated network: the real sync rounds and ingest, at scale.

Every site is a real knowledge base behind the real server application (`federation.create_app`);
rounds are `federation.async_sync_with` over an in-process transport that drops a fraction of the
requests (`--loss`) and, for some rounds, cuts the fleet in two halves (`--partition`). Time is
virtual: one gossip round per `interval_s`. In each round every site syncs with one peer chosen at
random. The figures:

- rounds_to_converge: after 1% of the sites (at least 3) each publish a skill, rounds until every
  site holds everything; against rounds_goal = ceil(log2 sites) + 3.
- diffusion_half_life_rounds: rounds from a skill's first certificate until half the sites count it
  active; diffusion_full_rounds: until all do.
- revocation_rounds: rounds from a revocation until every site has turned the skill off.
- partition_heal_rounds: after `--partition` rounds split in halves (each half writing), rounds from
  the heal until everyone holds everything again.
- bytes_per_site: bytes sent and received over the whole run, per site.

Prints one JSON line.   python benchmarks/fleet.py [--quick] [--sites N] [--loss P] [--partition R]

With `--plot fleet.png` it also runs fleets of 1/8, 1/4 and 1/2 the size (at least 16 sites) and
draws each figure against the number of sites, with the goal ceil(log2 sites) + 3 (needs
matplotlib: the `plot` extra); the JSON line then carries every size's figures under "series".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

import knowledge
from federation import RequestVerifier, Site, SiteConfig, async_sync_with, create_app
from knowledge import ActivationPolicy, Identity, Role, TrustedRoot, TrustPolicy

INTERVAL_S = 5.0  # virtual seconds per gossip round
CONCURRENCY = 64  # rounds in flight at once in this process


class Network:
    """Routes requests to the sites' apps by host name; drops some; honours a partition."""

    def __init__(self, apps: dict[str, httpx.ASGITransport], loss: float, rng: random.Random):
        self.apps, self.loss, self.rng = apps, loss, rng
        self.side: dict[str, int] | None = None  # site -> half, while the fleet is cut in two
        self.bytes = 0

    def link(self, caller: str) -> Link:
        return Link(self, caller)


class Link(httpx.AsyncBaseTransport):
    """One site's view of the network: what it sends may be lost, or cut off by the partition."""

    def __init__(self, network: Network, caller: str) -> None:
        self.network, self.caller = network, caller

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        net, host = self.network, request.url.host
        if net.side is not None and net.side[self.caller] != net.side[host]:
            raise httpx.ConnectError("partitioned", request=request)
        if net.rng.random() < net.loss:
            raise httpx.ConnectError("dropped", request=request)
        response = await net.apps[host].handle_async_request(request)
        raw = b"".join([chunk async for chunk in response.aiter_raw()])  # as sent: gzipped
        net.bytes += len(request.content) + len(raw)
        return httpx.Response(
            response.status_code, headers=response.headers, content=raw, request=request
        )


class Fleet:
    def __init__(self, root: Path, count: int, loss: float, rng: random.Random) -> None:
        self.rng = rng
        self.keys = [Identity.generate() for _ in range(count)]
        roles = frozenset(Role)
        policy = TrustPolicy(
            roots=tuple(TrustedRoot(k.public_key, roles, f"s{i}") for i, k in enumerate(self.keys)),
            # the certificate here is a bare record: this measures how it spreads, not the
            # simulator (benchmarks/loop.py measures the loop with real evaluations)
            activation=ActivationPolicy(rerunnable_only=False),
        )
        self.kbs: list[knowledge.KnowledgeBase] = []
        self.sites: list[Site] = []
        apps: dict[str, httpx.ASGITransport] = {}
        for i, key in enumerate(self.keys):
            home = root / f"s{i}"
            home.mkdir(parents=True)
            kb = knowledge.open(":memory:", key, policy=policy)
            site = Site(SiteConfig(home, name=f"s{i}"), kb)
            site.verifier.close()
            site.verifier = RequestVerifier(site.key)  # nonces in memory: a simulation, not a site
            self.kbs.append(kb)
            self.sites.append(site)
            apps[f"s{i}"] = httpx.ASGITransport(app=create_app(site))
        self.network = Network(apps, loss, rng)
        self.rounds = 0

    def close(self) -> None:
        for site in self.sites:
            site.close()

    async def _sync(self, i: int, j: int, slots: asyncio.Semaphore) -> None:
        async with slots:
            try:
                await async_sync_with(
                    self.kbs[i],
                    f"http://s{j}",
                    self.keys[j].public_key,
                    transport=self.network.link(f"s{i}"),
                    deadline=600,
                )
            except knowledge.SimnetError:
                pass  # a dropped or partitioned round: later rounds make up for it

    def round(self) -> None:
        """Every site syncs with one peer chosen at random, all at once (one virtual interval)."""
        pairs = [(i, self._peer(i)) for i in range(len(self.kbs))]

        async def go() -> None:
            slots = asyncio.Semaphore(CONCURRENCY)
            await asyncio.gather(*(self._sync(i, j, slots) for i, j in pairs))

        asyncio.run(go())
        self.rounds += 1

    def _peer(self, i: int) -> int:
        j = self.rng.randrange(len(self.kbs) - 1)
        return j + (j >= i)

    def converged(self) -> bool:
        first = {a: h.seq for a, h in self.kbs[0].heads().items()}
        return all({a: h.seq for a, h in kb.heads().items()} == first for kb in self.kbs[1:])

    def share(self, predicate) -> float:
        return sum(1 for kb in self.kbs if predicate(kb)) / len(self.kbs)


def until(fleet: Fleet, done, what: str, limit: int = 200) -> int:
    """Rounds run until `done()` holds (progress on stderr)."""
    start = fleet.rounds
    while not done():
        if fleet.rounds - start >= limit:
            raise SystemExit(f"{what}: not done within {limit} rounds")
        fleet.round()
        print(f"round {fleet.rounds}: {what}", file=sys.stderr, flush=True)
    return fleet.rounds - start


def run(count: int, loss: float, partition: int, seed: int) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), count, loss, rng)
        try:
            started = time.perf_counter()
            writers = rng.sample(range(count), max(3, count // 100))
            skills = [fleet.kbs[w].skills.publish(f"skill-of-s{w}", "pick").id for w in writers]
            converge = until(fleet, fleet.converged, "convergence")

            skill = skills[0]
            fleet.kbs[writers[1]].certificates.add(skill, branches=256, successes=256)
            half = until(
                fleet, lambda: fleet.share(lambda kb: kb.is_active(skill)) >= 0.5, "half active"
            )
            full = half + until(
                fleet, lambda: fleet.share(lambda kb: kb.is_active(skill)) == 1, "all active"
            )

            fleet.kbs[writers[0]].revoke(skill, "falls over")
            revocation = until(
                fleet, lambda: fleet.share(lambda kb: kb.is_revoked(skill)) == 1, "revoked"
            )

            heal = None
            if partition:
                fleet.network.side = {f"s{i}": int(i >= count // 2) for i in range(count)}
                for writer in (0, count - 1):  # one write on each side of the cut
                    fleet.kbs[writer].skills.publish(f"written-apart-by-s{writer}", "pick")
                for _ in range(partition):
                    fleet.round()
                fleet.network.side = None
                heal = until(fleet, fleet.converged, "healed")
            seconds = time.perf_counter() - started
        finally:
            fleet.close()
    return {
        "sites": count,
        "rounds_to_converge": converge,
        "rounds_goal": math.ceil(math.log2(count)) + 3,
        "diffusion_half_life_rounds": half,
        "diffusion_full_rounds": full,
        "revocation_rounds": revocation,
        "partition_heal_rounds": heal,
        "bytes_per_site": round(fleet.network.bytes / count),
        "loss": loss,
        "virtual_seconds_per_round": INTERVAL_S,
        "wall_seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1,000 sites (default: 2,000)")
    parser.add_argument("--sites", type=int, default=None)
    parser.add_argument("--loss", type=float, default=0.02, help="fraction of requests dropped")
    parser.add_argument("--partition", type=int, default=3, help="rounds cut in two halves")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None, help="draw the figures per fleet size")
    args = parser.parse_args()
    count = args.sites or (1_000 if args.quick else 2_000)
    if args.plot is None:
        print(
            json.dumps({"benchmark": "fleet", **run(count, args.loss, args.partition, args.seed)})
        )
        return
    sizes = sorted({max(16, count // d) for d in (8, 4, 2)} | {count})
    series = [run(n, args.loss, args.partition, args.seed) for n in sizes]
    plot(series, args.plot)
    print(
        json.dumps({"benchmark": "fleet", **series[-1], "plot": str(args.plot), "series": series})
    )


def plot(series: list[dict], path: Path) -> None:
    """Rounds (convergence, diffusion, revocation, healing) and bytes per site against sites."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    sites = [r["sites"] for r in series]
    fig, (rounds, wire) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label in (
        ("rounds_to_converge", "converge"),
        ("diffusion_half_life_rounds", "half the sites activate a certified skill"),
        ("diffusion_full_rounds", "all sites activate it"),
        ("revocation_rounds", "a revocation reaches all"),
        ("partition_heal_rounds", "a partition heals"),
    ):
        if all(r[key] is not None for r in series):
            rounds.plot(sites, [r[key] for r in series], marker="o", label=label)
    rounds.plot(
        sites, [r["rounds_goal"] for r in series], "k--", label="goal: ceil(log2 sites) + 3"
    )
    rounds.set(xscale="log", xlabel="sites", ylabel="gossip rounds", title="Diffusion")
    rounds.legend(fontsize=8, loc="upper left")
    wire.plot(sites, [r["bytes_per_site"] / 1000 for r in series], marker="o")
    wire.set(
        xscale="log", xlabel="sites", ylabel="KB per site (whole run)", title="Bytes on the wire"
    )
    for axes in (rounds, wire):
        axes.set_xticks(sites, [str(n) for n in sites])
        axes.minorticks_off()
    fig.suptitle(f"Gossip over a simulated network, {series[0]['loss']:.0%} of requests lost")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""The gossip scheduler inside `simnet serve`: sync with a random peer every interval.

Each round a site picks one peer at random (among those not backing off) and runs a push-pull
anti-entropy round with it, so news spreads epidemically: a fleet of n sites converges in O(log n)
rounds. Intervals carry jitter so sites do not fall into lockstep; a failing peer is retried after
interval * 2**failures (capped), and a partitioned site catches up on its first successful round.
The peer list is re-read from simnet.toml every round, so `simnet peer add` needs no restart.

Each round runs as its own task, at most one per peer and `MAX_ROUNDS` at once, and is held to
`[limits] sync_deadline_s`: a peer that answers slowly (or trickles bytes for ever) costs its own
round, which fails at the deadline and backs off, while the scheduler goes on starting rounds with
the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from knowledge import PolicyError, TrustPolicy

from ._client import SyncReport, async_sync_with
from ._config import PeerConfig, SiteConfig
from ._errors import ConfigError, FederationError
from ._site import Site
from ._status import STATE_FILE

log = logging.getLogger("federation.gossip")
MAX_ROUNDS = 4  # scheduled rounds in flight at once; and `sync_now` runs at most this many at once


@dataclass
class PeerState:
    name: str
    url: str
    failures: int = 0
    next_attempt: float = 0.0  # time.time() before which this peer is not tried (backoff)
    last_attempt: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    last_pulled: int = 0
    last_pushed: int = 0
    rounds: int = 0


class Gossip:
    def __init__(self, site: Site, *, rng: random.Random | None = None) -> None:
        self.site = site
        self.rng = rng or random.Random()
        self._states: dict[str, PeerState] = {}
        self._locks: dict[
            str, asyncio.Lock
        ] = {}  # per peer name: one round at a time with each peer
        self._rounds: set[asyncio.Task[Any]] = (
            set()
        )  # scheduled rounds in flight (at most MAX_ROUNDS)
        self._task: asyncio.Task[None] | None = None
        self._policy_mtime = site.config.policy_path.stat().st_mtime_ns

    @property
    def config(self) -> SiteConfig:
        return self.site.config

    def _reload(self) -> None:
        """Pick up edits to simnet.toml and trust.toml (`simnet peer add`) without a restart."""
        try:
            self.site.config = SiteConfig.load(self.config.home)
            self.site.kb.expect_own_feed_from(p.key for p in self.config.peers)
            mtime = self.config.policy_path.stat().st_mtime_ns
            if mtime != self._policy_mtime:
                self.site.kb.set_policy(TrustPolicy.load(self.config.policy_path))
                self._policy_mtime = mtime
        except (ConfigError, PolicyError, OSError) as exc:
            log.warning("keeping the previous configuration: %s", exc)

    async def _peers(self) -> list[PeerConfig]:
        await anyio.to_thread.run_sync(self._reload)
        peers = self.config.peers
        self._states = {p.name: self._states.get(p.name) or PeerState(p.name, p.url) for p in peers}
        self._locks = {
            n: lock for n, lock in self._locks.items() if n in self._states or lock.locked()
        }
        return peers

    def states(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self._states.values()]

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="simnet-gossip")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._rounds) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass

    def _busy(self, name: str) -> bool:
        lock = self._locks.get(name)
        return lock is not None and lock.locked()

    async def _run(self) -> None:
        while True:
            gossip = self.config.gossip
            await asyncio.sleep(
                gossip.interval_s * (1 + self.rng.uniform(-gossip.jitter, gossip.jitter))
            )
            try:
                if len(self._rounds) >= MAX_ROUNDS:
                    continue  # every slot holds a (slow) round: each ends by its deadline
                now = time.time()
                ready = [
                    p
                    for p in await self._peers()
                    if self._states[p.name].next_attempt <= now and not self._busy(p.name)
                ]
                if ready:
                    task = asyncio.get_running_loop().create_task(
                        self._scheduled(self.rng.choice(ready))
                    )
                    self._rounds.add(task)
                    task.add_done_callback(self._rounds.discard)
            except Exception as exc:  # noqa: BLE001 - nothing may stop the scheduler for good
                log.error("gossip round failed: %s: %s", type(exc).__name__, exc)
                log.debug("gossip round failed", exc_info=exc)

    async def _scheduled(self, peer: PeerConfig) -> None:
        try:
            await self._round(peer)
        except Exception as exc:  # noqa: BLE001 - a round's own failure is recorded in _round; this is a bug
            log.error("gossip round with %s failed: %s: %s", peer.name, type(exc).__name__, exc)
            log.debug("gossip round failed", exc_info=exc)

    async def sync_now(self, name: str | None = None) -> list[dict[str, Any]]:
        """Sync with one named peer, or with every peer (several at once), now (ignoring backoff);
        one result per peer, in the order of the peer list. A round already running with a peer is
        waited for."""
        peers = await self._peers()
        if name is not None:
            peers = [p for p in peers if name in (p.name, p.url)]
            if not peers:
                raise FederationError(f"no peer named {name!r}; see `simnet peer list`")
        slots = asyncio.Semaphore(MAX_ROUNDS)

        async def one(peer: PeerConfig) -> dict[str, Any]:
            async with slots:
                return await self._round(peer)

        return list(await asyncio.gather(*(one(peer) for peer in peers)))

    async def _round(self, peer: PeerConfig) -> dict[str, Any]:
        state = self._states.setdefault(peer.name, PeerState(peer.name, peer.url))
        lock = self._locks.setdefault(peer.name, asyncio.Lock())
        async with lock:
            state.last_attempt = time.time()
            state.rounds += 1
            try:
                withheld = await anyio.to_thread.run_sync(self.site.withheld_from, peer.key)
                limits = self.config.limits
                report: SyncReport = await async_sync_with(
                    self.site.kb,
                    peer.url,
                    peer.key,
                    page=limits.max_page,
                    timeout=limits.timeout_s,
                    deadline=limits.sync_deadline_s,
                    withhold=withheld,
                    verify=self.config.tls.client_context(),
                )
            except Exception as exc:  # noqa: BLE001 - one peer's answers, however poisonous, fail only its round
                state.failures += 1
                backoff = min(
                    self.config.gossip.interval_s * 2**state.failures,
                    self.config.gossip.max_backoff_s,
                )
                state.next_attempt = time.time() + backoff
                error = (
                    str(exc) if isinstance(exc, FederationError) else f"{type(exc).__name__}: {exc}"
                )
                state.last_error = error[:1000]
                log.warning(
                    "sync with %s failed (%s); next try in %.1f s",
                    peer.name,
                    state.last_error,
                    backoff,
                )
                if not isinstance(
                    exc, FederationError
                ):  # a bug its answers found here: the trace is for -vv
                    log.debug("sync with %s failed", peer.name, exc_info=exc)
                result = {"peer": peer.name, "ok": False, "error": state.last_error}
                self.site.metrics.sync_rounds.labels(peer.name, "failed").inc()
            else:
                self._count(peer, report)
                state.failures, state.next_attempt, state.last_error = 0, 0.0, None
                state.last_success = time.time()
                state.last_pulled, state.last_pushed = report.pulled, report.pushed
                if report.pulled or report.pushed:
                    log.info(
                        "synced with %s: pulled %d, pushed %d",
                        peer.name,
                        report.pulled,
                        report.pushed,
                    )
                result = {
                    "peer": peer.name,
                    "ok": True,
                    "pulled": report.pulled,
                    "pushed": report.pushed,
                    "rejected": len(report.rejected),
                    "refused_by_peer": report.refused_by_peer,
                }
            try:
                self._save()
            except OSError as exc:
                log.warning("cannot write %s: %s", STATE_FILE, exc)
            return result

    def _count(self, peer: PeerConfig, report: SyncReport) -> None:
        metrics = self.site.metrics
        metrics.sync_rounds.labels(peer.name, "ok").inc()
        metrics.envelopes_in.labels("pull").inc(report.pulled)
        metrics.envelopes_out.labels("push").inc(report.pushed)
        metrics.refused(report.rejected, f"pull from {peer.name}")

    def _save(self) -> None:
        """Write peers.json (what `simnet status` shows when it cannot ask the server)."""
        path = self.config.home / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.states(), indent=1))
        os.replace(tmp, path)

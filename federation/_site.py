"""What a running site server holds: its configuration, knowledge base, request verifier,
metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio

from knowledge import KnowledgeBase

from ._auth import RequestVerifier
from ._config import SiteConfig, Withheld, withheld_from
from ._errors import BusyError, FederationError
from ._metrics import SiteMetrics

log = logging.getLogger("federation")
RELEASE_EVERY_S = 1.0  # how often a server applies the held envelopes that have fallen due
DEVICE_FETCHES = 4  # blobs a site fetches from its peers for its devices at once (_blob_routes)


class Site:
    """What a running server holds: the configuration, the knowledge base, the request verifier."""

    def __init__(self, config: SiteConfig, kb: KnowledgeBase) -> None:
        if kb.identity is None:
            raise FederationError("a site server needs a knowledge base opened with the site's key")
        self.config = config
        self.kb = kb
        # a re-installed root writes only once every configured peer has shown its feed back
        kb.expect_own_feed_from(p.key for p in config.peers)
        self.identity = kb.identity
        self.key = kb.identity.public_key
        self.verifier = RequestVerifier(self.key, path=config.replay_path)
        self.syncs = asyncio.Semaphore(config.limits.max_concurrent_syncs)
        self.queued = 0  # requests waiting for a sync slot
        self.device_fetches = threading.BoundedSemaphore(DEVICE_FETCHES)
        # on the event loop: the fetch under way for each blob, and the devices that started one
        self.fetching: dict[str, asyncio.Future[int]] = {}
        self.fetching_for: set[bytes] = set()
        self.gossip: Any = None  # set by the gossip scheduler when it runs
        self.closed = False
        self.metrics = SiteMetrics(
            kb, lambda: self.gossip.states() if self.gossip else [], home=config.home
        )

    def close(self) -> None:
        """Close the replay log and the knowledge base (idempotent)."""
        self.closed = True
        self.verifier.close()
        self.kb.close()

    @contextlib.asynccontextmanager
    async def sync_turn(self) -> AsyncIterator[None]:
        """A slot to read or apply a page in. Requests wait their turn first come, first served
        (asyncio's semaphore wakes waiters in order), up to `max_queued_syncs` waiting and
        `queue_timeout_s` each; beyond either, BusyError (503 with Retry-After) instead of a
        pile-up."""
        limits = self.config.limits
        if self.syncs.locked() and self.queued >= limits.max_queued_syncs:
            raise BusyError("too many syncs in progress; retry later")
        self.queued += 1
        try:
            async with asyncio.timeout(limits.queue_timeout_s):
                await self.syncs.acquire()
        except TimeoutError:
            raise BusyError(
                f"too many syncs in progress; no turn within {limits.queue_timeout_s:g} s"
            ) from None
        finally:
            self.queued -= 1
        try:
            yield
        finally:
            self.syncs.release()

    async def release_held(self, every_s: float = RELEASE_EVERY_S) -> None:
        """Apply envelopes held until due (stamped ahead of this site's clock) as they fall due,
        until cancelled: a site with no traffic applies them all the same."""
        while True:
            await asyncio.sleep(every_s)
            if self.closed or not self.kb.held():
                continue
            try:
                report = await anyio.to_thread.run_sync(self.kb.release_held)
            except Exception:  # noqa: BLE001 - logged; the next tick tries again
                log.exception("applying the held envelopes that fell due failed")
                continue
            self.metrics.ingested(report, "held")

    def withheld_from(self, caller: bytes) -> Withheld:
        return withheld_from(self.config, self.kb, caller)

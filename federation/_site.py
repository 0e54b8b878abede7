"""What a running site server holds: its configuration, knowledge base, request verifier,
metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from knowledge import KnowledgeBase

from ._auth import RequestVerifier
from ._config import SiteConfig
from ._errors import FederationError
from ._metrics import SiteMetrics


class Site:
    """What a running server holds: the configuration, the knowledge base, the request verifier."""

    def __init__(self, config: SiteConfig, kb: KnowledgeBase) -> None:
        if kb.identity is None:
            raise FederationError("a site server needs a knowledge base opened with the site's key")
        self.config = config
        self.kb = kb
        self.key = kb.identity.public_key
        self.verifier = RequestVerifier(self.key, path=config.replay_path)
        self.syncs = asyncio.Semaphore(config.limits.max_concurrent_syncs)
        self.gossip: Any = None  # set by the gossip scheduler when it runs
        self.closed = False
        self.metrics = SiteMetrics(kb, lambda: self.gossip.states() if self.gossip else [])

    def close(self) -> None:
        """Close the replay log and the knowledge base (idempotent)."""
        self.closed = True
        self.verifier.close()
        self.kb.close()

    def withheld_from(self, caller: bytes) -> set[bytes]:
        return withheld_from(self.config, self.kb, caller)


def withheld_from(config: SiteConfig, kb: KnowledgeBase, caller: bytes) -> set[bytes]:
    """Feeds `caller` may not receive (by pull or push): those holding a private map it cannot
    read."""
    private = {m for rule in config.private if caller not in rule.readers for m in rule.maps}
    return kb.authors_writing(private) if private else set()

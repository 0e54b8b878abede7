"""What a running site exposes to Prometheus at `/metrics`.

Counters are incremented where things happen (requests, gossip rounds, envelopes in and out); gauges
about what the site holds are read from the knowledge base when Prometheus scrapes, so nothing has
to keep them in step (counted again only when it changed: `knowledge_counts`); so are the
validator's, from its state file (`validator.json`): a site where no validator has run exports none
of them. Each site has its own registry: several sites in one process (tests) never mix.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from knowledge import IngestReport, KnowledgeBase, Rejection

from ._status import knowledge_counts, read_validator_state

__all__ = ["CONTENT_TYPE", "SiteMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
RECENT = 50  # refusals the status page lists


class SiteMetrics:
    """The site's counters, and a collector that reads its gauges at scrape time."""

    def __init__(
        self,
        kb: KnowledgeBase,
        peers: Callable[[], list[dict[str, Any]]] = list,
        home: Path | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "simnet_requests",
            "HTTP requests answered, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.sync_rounds = Counter(
            "simnet_sync_rounds",
            "Sync rounds this site ran with a peer (gossip, admin sync), by outcome.",
            ["peer", "outcome"],
            registry=self.registry,
        )
        self.envelopes_in = Counter(
            "simnet_envelopes_received",
            "Envelopes applied here, by how they came: pushed to us, or pulled in our rounds.",
            ["via"],
            registry=self.registry,
        )
        self.envelopes_out = Counter(
            "simnet_envelopes_sent",
            "Envelopes sent: in answer to a peer's pull, or pushed in our rounds.",
            ["via"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "simnet_envelopes_rejected",
            "Envelopes refused here, by reason (docs/KNOWLEDGE.md lists the reasons).",
            ["reason"],
            registry=self.registry,
        )
        self.registry.register(_Holdings(kb, peers))
        if home is not None:
            self.registry.register(_Validator(home))
        self.recent: deque[tuple[float, str, Rejection]] = deque(maxlen=RECENT)

    def ingested(self, report: IngestReport, via: str) -> None:
        self.envelopes_in.labels(via).inc(len(report.accepted))
        self.refused(report.rejected, via)

    def refused(self, rejections: Iterable[Rejection], via: str) -> None:
        """Count refusals by reason, and keep the latest for the status page."""
        for rejection in rejections:
            self.rejections.labels(rejection.reason).inc()
            self.recent.appendleft((time.time(), via, rejection))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Holdings:
    """Gauges read at scrape time: skills by state, writers, envelopes held, forks, peers."""

    def __init__(self, kb: KnowledgeBase, peers: Callable[[], list[dict[str, Any]]]) -> None:
        self.kb = kb
        self.peers = peers

    def describe(self) -> Iterable[Metric]:
        return []  # collected lazily: the registry must not read the store when it registers us

    def collect(self) -> Iterable[Metric]:
        counts = knowledge_counts(self.kb)  # what /v1/status and `simnet status` report
        skills = GaugeMetricFamily("simnet_skills", "Skills held, by state here.", labels=["state"])
        active, revoked = (
            counts["active_skills"],
            counts["revocations"],
        )  # a revoked one is inactive
        skills.add_metric(["active"], active)
        skills.add_metric(["inactive"], counts["skills"] - active - revoked)
        skills.add_metric(["revoked"], revoked)
        yield skills
        yield GaugeMetricFamily(
            "simnet_writers", "Writers whose feeds are held.", value=counts["writers"]
        )
        yield GaugeMetricFamily(
            "simnet_envelopes_held", "Envelopes held, summed over feeds.", value=counts["envelopes"]
        )
        yield GaugeMetricFamily(
            "simnet_equivocations",
            "Writers caught forking their feed.",
            value=counts["equivocations"],
        )
        now = time.time()
        age = GaugeMetricFamily(
            "simnet_peer_last_sync_age_seconds",
            "Seconds since the last successful sync with each peer (absent: never).",
            labels=["peer"],
        )
        failures = GaugeMetricFamily(
            "simnet_peer_failures", "Consecutive failed rounds with each peer.", labels=["peer"]
        )
        for state in self.peers():
            if state.get("last_success"):
                age.add_metric([state["name"]], now - state["last_success"])
            failures.add_metric([state["name"]], state.get("failures", 0))
        yield age
        yield failures


class _Validator:
    """The validator's progress, read from its state file in the site's home at scrape time. No
    file (no validator ever ran here): no samples. An unreadable file: only
    `simnet_validator_stale` 1, so no counter appears to reset."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        v = read_validator_state(self.home)
        if v is None:
            return
        yield GaugeMetricFamily(
            "simnet_validator_stale",
            "1 if the validator's state cannot be believed: its process is gone while it says "
            "idle or busy, it has not been updated for long, or the file is unreadable.",
            value=1 if v["stale"] else 0,
        )
        if v["error"]:
            return
        yield CounterMetricFamily(
            "simnet_evaluation_branches",
            "Branches the validator rolled out: evaluated for certificates plus spot-checked.",
            value=v["branches_evaluated"] + v["branches_spot_checked"],
        )
        yield GaugeMetricFamily(
            "simnet_evaluation_branches_per_second",
            "The validator's throughput: branches per second of time spent on jobs.",
            value=v["branches_per_s"],
        )
        yield GaugeMetricFamily(
            "simnet_validator_queue_jobs", "Jobs queued for the validator.", value=v["queued"]
        )
        jobs = GaugeMetricFamily(
            "simnet_validator_jobs",
            "Jobs that failed (given up or retried later) or wait for weights or a task.",
            labels=["state"],
        )
        jobs.add_metric(["failed"], len(v["failed"]))
        jobs.add_metric(["waiting"], len(v["waiting"]))
        yield jobs
        for name, what in (
            ("certificates", "Certificates the validator signed."),
            ("spot_checks", "Other validators' certificates it spot-checked."),
            ("disputes", "Spot checks that did not reproduce (disputes it signed)."),
        ):
            yield CounterMetricFamily(f"simnet_validator_{name}", what, value=v[name])

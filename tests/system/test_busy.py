"""A busy site over real HTTP: many peers sync with one `simnet serve` process at once.

Requests wait their turn in a fair queue instead of being turned away, clients retry what is still
refused as busy (honouring Retry-After), and the site keeps answering /v1/health throughout."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

import knowledge
from federation import SiteConfig, sync_with
from federation._auth import signed_message
from knowledge import Identity, TrustPolicy

PEERS = 24


def test_every_round_of_many_concurrent_peers_succeeds(fleet):
    site = fleet.add("busy", interval_s=3600)
    config = SiteConfig.load(site.home)
    # two pages at a time, and a short queue: some requests must be turned away and come back
    config.limits = type(config.limits)(max_concurrent_syncs=2, max_queued_syncs=1)
    config.save()
    peers = [Identity.generate() for _ in range(PEERS)]
    policy = TrustPolicy()
    for peer in peers:
        policy = policy.with_root(peer.public_key)
    (site.home / "trust.toml").write_text(policy.to_toml())
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        for i in range(20):
            kb.skills.publish(f"news-{i}", "pick")
    site.start()
    health: list[int] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            health.append(httpx.get(f"{site.url}/v1/health", timeout=10).status_code)
            time.sleep(0.05)

    def one_round(identity: Identity) -> tuple[int, int]:
        trusting = TrustPolicy().with_root(site.key.public_key)
        with knowledge.open(":memory:", identity, policy=trusting) as kb:
            kb.skills.publish(f"{identity.key_id}-skill", "pick")
            report = sync_with(kb, site.url, site.key.public_key, deadline=120)
            return report.pulled, report.pushed

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with ThreadPoolExecutor(PEERS) as pool:
            reports = list(pool.map(one_round, peers))
    finally:
        done.set()
        prober.join()
    assert reports == [(20, 1)] * PEERS
    assert health and set(health) == {200}
    assert sum(site.heads().values()) == 20 + PEERS
    metrics = httpx.get(f"{site.url}/metrics", timeout=10).text
    turned_away = sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "simnet_requests_total" and sample.labels["status"] == "503"
    )
    assert turned_away > 0  # the queue was full at times: those rounds succeeded by retrying


def test_requests_accepted_at_once_stay_refused_as_replays_after_a_crash(fleet):
    """A busy site writes the nonces of simultaneous requests to disk together (group commits), yet
    each request is answered only once its own nonce is there: killed right after answering them,
    the restarted site refuses every one of them replayed."""
    site = fleet.add("replays", interval_s=3600)
    site.start()
    target = "/v1/heads"

    def signed() -> dict[str, str]:
        ts, nonce = time.time_ns() // 1_000_000, os.urandom(16).hex()
        message = signed_message("GET", target, b"", ts, nonce, site.key.public_key)
        sig = site.key.sign(message).hex()
        return {
            "authorization": f"Simnet key={site.key.public_key_hex}, ts={ts}, nonce={nonce}, "
            f"sig={sig}"
        }

    requests = [signed() for _ in range(48)]

    def send(headers: dict[str, str]) -> httpx.Response:
        return httpx.get(f"{site.url}{target}", headers=headers, timeout=30)

    with ThreadPoolExecutor(16) as pool:
        assert [r.status_code for r in pool.map(send, requests)] == [200] * len(requests)
    site.stop(signal.SIGKILL)
    site.start()
    with ThreadPoolExecutor(16) as pool:
        again = list(pool.map(send, requests))
    assert [r.status_code for r in again] == [401] * len(requests)
    assert all("replayed" in r.json()["detail"] for r in again)

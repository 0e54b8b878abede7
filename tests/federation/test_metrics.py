"""/metrics and /v1/ready: what an operator's Prometheus and load balancer see, over the real
app."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import federation._status
import knowledge
from federation import PAGE_TYPE, Gossip, PeerConfig, SiteConfig, async_sync_with, encode_page
from knowledge import SiteHome


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def free_port_url():
    """A loopback URL where nothing listens: every round with it fails. Its port stays bound (never
    listening) for the test, so no server elsewhere (another xdist worker's) can take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def scrape(site) -> dict[tuple[str, tuple], float]:
    """The site's /metrics (unsigned, as Prometheus asks) as {(sample name, sorted labels):
    value}."""

    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=site.app), base_url="http://site"
        ) as client:
            return await client.get("/metrics")

    response = run(go())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_a_push_is_counted_by_envelope_and_by_request(make_site):
    a = make_site("a")
    b = make_site("b", trust=(a.key,))
    for name in ("pick-mug", "pick-box", "pick-cup"):
        a.kb.skills.publish(name, "pick")
    report = run(async_sync_with(a.kb, "http://b", b.key, transport=httpx.ASGITransport(app=b.app)))
    assert report.pushed == 3
    seen = scrape(b)
    assert seen[("simnet_envelopes_received_total", (("via", "push"),))] == 3
    assert seen[("simnet_envelopes_sent_total", (("via", "answer"),))] == 0
    assert seen[("simnet_requests_total", (("route", "envelopes"), ("status", "200")))] >= 1
    assert seen[("simnet_skills", (("state", "active"),))] == 0  # no certificates yet
    assert seen[("simnet_skills", (("state", "inactive"),))] == 3
    assert seen[("simnet_writers", ())] == 1
    assert seen[("simnet_envelopes_held", ())] == 3


def test_a_forged_envelope_is_counted_by_its_reason(make_site):
    a = make_site("a")
    b = make_site("b", trust=(a.key,))
    a.kb.skills.publish("pick-mug", "pick")
    (raw,) = a.kb.envelopes_since({})
    forged = raw[:-1] + bytes([raw[-1] ^ 1])  # the signature is the envelope's last 64 bytes

    async def push():
        async with b.client(a.identity) as client:
            return await client.post(
                "/v1/envelopes", content=encode_page([forged]), headers={"content-type": PAGE_TYPE}
            )

    answer = run(push())
    assert answer.status_code == 200 and answer.json()["rejected"][0]["reason"] == "bad_signature"
    seen = scrape(b)
    assert seen[("simnet_envelopes_rejected_total", (("reason", "bad_signature"),))] == 1
    assert seen[("simnet_envelopes_held", ())] == 0


def test_unsigned_requests_are_counted_with_their_refusal(make_site):
    a = make_site("a")

    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=a.app), base_url="http://site"
        ) as client:
            return await client.get("/v1/heads")

    assert run(go()).status_code == 401
    assert scrape(a)[("simnet_requests_total", (("route", "heads"), ("status", "401")))] == 1


def test_ready_until_the_site_closes(make_site):
    a = make_site("a")

    async def ready():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=a.app), base_url="http://site"
        ) as client:
            return await client.get("/v1/ready")

    assert (run(ready()).status_code, run(ready()).json()) == (200, {"status": "ready"})
    a.site.close()
    answer = run(ready())
    assert answer.status_code == 503 and answer.json()["error"] == "not_ready"


def test_a_served_site_answers_prometheus_and_readiness(tmp_path, cli, serve_process):
    """The real `simnet serve` process: ready once up, and its scrape names the skills it holds."""
    home = tmp_path / "s"
    assert cli(home, "init", "--name", "s", "--listen", "127.0.0.1:0").code == 0
    with knowledge.open(SiteHome(home).store, knowledge.Identity.load(SiteHome(home).key)) as kb:
        kb.skills.publish("walk", "walk")
    url = serve_process(home).url
    assert httpx.get(f"{url}/v1/ready", timeout=10).json() == {"status": "ready"}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    states = {s.labels["state"]: s.value for s in families["simnet_skills"].samples}
    assert states == {"active": 0.0, "inactive": 1.0, "revoked": 0.0}


def test_gossip_rounds_are_counted_by_peer_and_outcome(make_site, serve_app, free_port_url):
    a, b = make_site("a"), make_site("b")
    b.trust(a.key)
    a.trust(b.key)
    b.kb.skills.publish("from-b", "pick")
    config = SiteConfig.load(a.home)
    config.peers = [
        PeerConfig("b", serve_app(b.app), b.key),
        PeerConfig("gone", free_port_url, b.key),
    ]
    config.save()
    gossip = Gossip(a.site)
    a.site.gossip = gossip
    results = run(gossip.sync_now())
    assert [(r["peer"], r["ok"]) for r in results] == [("b", True), ("gone", False)]
    seen = scrape(a)
    assert seen[("simnet_sync_rounds_total", (("outcome", "ok"), ("peer", "b")))] == 1
    assert seen[("simnet_sync_rounds_total", (("outcome", "failed"), ("peer", "gone")))] == 1
    assert seen[("simnet_envelopes_received_total", (("via", "pull"),))] == 1
    assert seen[("simnet_peer_failures", (("peer", "gone"),))] == 1
    assert ("simnet_peer_last_sync_age_seconds", (("peer", "b"),)) in seen
    assert ("simnet_peer_last_sync_age_seconds", (("peer", "gone"),)) not in seen


@contextlib.contextmanager
def calls_of(function: Callable) -> Iterator[list[int]]:
    """Count the calls of `function` made in this thread and in threads started inside the block
    (the server's worker threads): a profiler watching the real code, which it leaves as it is."""
    code, count = function.__code__, [0]

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            count[0] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def test_scrapes_reuse_the_counts_until_the_knowledge_base_changes(make_site, monkeypatch):
    """Anyone may scrape /metrics: with nothing changed, a scrape (or a status request) must not
    judge every skill's activation again; a new skill shows at the next scrape all the same."""
    monkeypatch.setattr(federation._status, "COUNTS_MAX_AGE_S", 600.0)  # however slow the machine
    a = make_site("a")
    for name in ("pick-mug", "pick-box", "pick-cup"):
        a.kb.skills.publish(name, "pick")
    inactive = ("simnet_skills", (("state", "inactive"),))

    async def status():
        async with a.client() as client:
            return (await client.get("/v1/status")).json()

    with calls_of(knowledge.KnowledgeBase.is_active) as judged:
        assert scrape(a)[inactive] == 3
        assert judged == [3]  # one judgement per skill
        assert scrape(a)[inactive] == 3 and run(status())["skills"] == 3
        assert judged == [3]  # the same counts, judged once
        a.kb.skills.publish("pick-pen", "pick")
        assert scrape(a)[inactive] == 4
        assert judged == [7]

"""federation._gossip: the scheduler, driven with asyncio in-process against real apps on real
HTTP."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import socket
import time

import pytest

import knowledge
from federation import FederationError, Gossip, GossipConfig, PeerConfig, ServerLimits, SiteConfig
from knowledge import TrustPolicy

gossip_module = importlib.import_module("federation._gossip")


class FakeTime:
    """Stands in for the `time` module inside federation._gossip: a wall clock the test moves."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(gossip_module, "time", fake)
    return fake


@pytest.fixture
def closed_port():
    """closed_port() -> a loopback port held bound but not listening (connections are refused) until
    closed_port.release(port) or teardown, so no other server is handed it meanwhile."""
    held: dict[int, socket.socket] = {}

    def _reserve() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        held[port] = sock
        return port

    _reserve.release = lambda port: held.pop(port).close()
    yield _reserve
    for sock in held.values():
        sock.close()


@pytest.fixture
def make_site_peer(make_site, closed_port):
    """make_site_peer(a) -> (b, port): a site b that trusts a and is trusted by it, not yet
    listening on port."""

    def _make(a, name: str = "b"):
        b = make_site(name)
        b.trust(a.key)
        a.trust(b.key)
        return b, closed_port()

    return _make


def set_peers(site, *peers: PeerConfig) -> None:
    """Edit the site's simnet.toml on disk, as `simnet peer add/remove` does."""
    config = SiteConfig.load(site.home)
    config.peers = list(peers)
    config.save()


def state(gossip: Gossip, name: str) -> dict:
    return next(s for s in gossip.states() if s["name"] == name)


async def until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def skills(kb: knowledge.KnowledgeBase) -> set[str]:
    return {s.id for s in kb.skills.list()}


def test_backoff_grows_as_interval_times_two_to_the_failures_capped(
    make_site, make_site_peer, clock
):
    a = make_site("a", gossip=GossipConfig(interval_s=1.0, jitter=0.0, max_backoff_s=10.0))
    b, port = make_site_peer(a)
    set_peers(a, PeerConfig("b", f"http://127.0.0.1:{port}", b.key))
    gossip = Gossip(a.site)

    async def go():
        seen = []
        for _ in range(6):
            [result] = await gossip.sync_now(
                "b"
            )  # sync_now ignores backoff: each call is a real attempt
            s = state(gossip, "b")
            seen.append((s["failures"], s["next_attempt"] - clock.now))
            assert result["ok"] is False and "cannot reach" in result["error"]
            assert s["last_error"] == result["error"] and s["last_attempt"] == clock.now
        return seen

    assert asyncio.run(go()) == [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (5, 10.0), (6, 10.0)]
    assert state(gossip, "b")["rounds"] == 6 and state(gossip, "b")["last_success"] is None
    saved = json.loads((a.home / "peers.json").read_text())
    assert saved == gossip.states()  # what `simnet status` shows when it cannot ask the server


def test_success_resets_the_backoff(make_site, make_site_peer, serve_app, closed_port, clock):
    a = make_site("a", gossip=GossipConfig(interval_s=1.0, jitter=0.0, max_backoff_s=10.0))
    b, port = make_site_peer(a)
    b.kb.skills.publish("walk", "locomotion")
    set_peers(a, PeerConfig("b", f"http://127.0.0.1:{port}", b.key))
    gossip = Gossip(a.site)

    async def fail_then_succeed():
        for _ in range(3):
            await gossip.sync_now("b")
        assert state(gossip, "b")["failures"] == 3
        closed_port.release(port)
        await asyncio.to_thread(serve_app, b.app, port)  # the peer comes back on its address
        clock.now += 5
        return await gossip.sync_now("b")

    [result] = asyncio.run(fail_then_succeed())
    assert result == {
        "peer": "b",
        "ok": True,
        "pulled": 1,
        "pushed": 0,
        "rejected": 0,
        "refused_by_peer": 0,
    }
    s = state(gossip, "b")
    assert (s["failures"], s["next_attempt"], s["last_error"]) == (0, 0.0, None)
    assert (s["last_success"], s["last_pulled"], s["rounds"]) == (clock.now, 1, 4)
    assert skills(a.kb) == skills(b.kb)


def test_a_failing_peer_is_skipped_until_its_next_attempt(
    make_site, make_site_peer, serve_app, clock
):
    a = make_site("a", gossip=GossipConfig(interval_s=0.02, jitter=0.0, max_backoff_s=60.0))
    live = make_site("live")
    live.trust(a.key)
    dead, port = make_site_peer(a)
    set_peers(
        a,
        PeerConfig("dead", f"http://127.0.0.1:{port}", dead.key),
        PeerConfig("live", serve_app(live.app), live.key),
    )
    gossip = Gossip(a.site, rng=random.Random(7))

    async def go():
        gossip.start()
        try:
            await until(
                lambda: (
                    "dead" in {s["name"] for s in gossip.states()}
                    and state(gossip, "dead")["failures"] == 1
                ),
                what="a first failed attempt at the dead peer",
            )
            assert state(gossip, "dead")["next_attempt"] == clock.now + 0.04  # interval * 2**1
            rounds = state(gossip, "live")["rounds"]
            await until(
                lambda: state(gossip, "live")["rounds"] >= rounds + 10,
                what="ten rounds with the live peer",
            )
            assert (
                state(gossip, "dead")["rounds"] == 1
            )  # the wall clock has not reached its next attempt
            clock.now += 0.05  # now it has
            await until(
                lambda: state(gossip, "dead")["failures"] == 2, what="the dead peer to be retried"
            )
            assert state(gossip, "dead")["rounds"] == 2
            assert state(gossip, "dead")["next_attempt"] == clock.now + 0.08
        finally:
            await gossip.stop()

    asyncio.run(go())
    assert state(gossip, "live")["failures"] == 0 and state(gossip, "live")["last_error"] is None


def test_peers_are_reread_from_simnet_toml(make_site, serve_app):
    a = make_site("a")
    b, c = make_site("b"), make_site("c")
    for peer in (b, c):
        peer.trust(a.key)
        a.trust(peer.key)
    b.kb.skills.publish("from-b", "pick")
    c.kb.skills.publish("from-c", "pick")
    url_b, url_c = serve_app(b.app), serve_app(c.app)
    gossip = Gossip(a.site)

    async def go():
        assert await gossip.sync_now() == []  # no peers yet
        set_peers(a, PeerConfig("b", url_b, b.key))  # `simnet peer add b` while the server runs
        first = await gossip.sync_now()
        set_peers(a, PeerConfig("c", url_c, c.key))  # `simnet peer remove b; simnet peer add c`
        second = await gossip.sync_now()
        with pytest.raises(FederationError, match="no peer named 'b'"):
            await gossip.sync_now("b")
        return first, second

    first, second = asyncio.run(go())
    assert [(r["peer"], r["ok"], r["pulled"]) for r in first] == [("b", True, 1)]
    assert [(r["peer"], r["ok"], r["pulled"]) for r in second] == [("c", True, 1)]
    assert skills(a.kb) == skills(b.kb) | skills(c.kb) and len(skills(a.kb)) == 2
    assert a.site.config.peers == [PeerConfig("c", url_c, c.key)]


def test_a_malformed_simnet_toml_keeps_the_previous_peers(make_site, serve_app):
    a, b = make_site("a"), make_site("b")
    b.trust(a.key)
    url = serve_app(b.app)
    set_peers(a, PeerConfig("b", url, b.key))
    gossip = Gossip(a.site)
    asyncio.run(gossip.sync_now())
    (a.home / "simnet.toml").write_text("[[peers]\nthis is not toml")
    [result] = asyncio.run(gossip.sync_now())
    assert result["peer"] == "b" and result["ok"] is True


def test_trust_policy_edits_are_picked_up(make_site, serve_app):
    a, b = make_site("a"), make_site("b")
    b.trust(a.key)  # b lets a read; a does not trust b's writers yet
    skill = b.kb.skills.publish("from-b", "pick").id
    set_peers(a, PeerConfig("b", serve_app(b.app), b.key))
    gossip = Gossip(a.site)
    [before] = asyncio.run(gossip.sync_now("b"))
    assert before["ok"] and before["pulled"] == 0 and before["rejected"] == 1
    assert skill not in skills(a.kb)

    policy = TrustPolicy.load(a.config.policy_path).with_root(
        b.key, name="b"
    )  # `simnet peer add --trust`
    a.config.policy_path.write_text(policy.to_toml())
    stat = a.config.policy_path.stat()  # make the edit visible even on a coarse-mtime file system
    os.utime(a.config.policy_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    [after] = asyncio.run(gossip.sync_now("b"))
    assert after["ok"] and after["pulled"] == 1
    assert skill in skills(a.kb)
    assert a.kb.roles_of(b.key) is not None


def test_sync_now_with_every_peer_in_turn(make_site, serve_app):
    a = make_site("a")
    peers = [make_site(name) for name in ("b", "c", "d")]
    for p in peers:
        p.trust(a.key)
        a.trust(p.key)
        p.kb.skills.publish(f"from-{p.name}", "pick")
    set_peers(a, *(PeerConfig(p.name, serve_app(p.app), p.key) for p in peers))
    results = asyncio.run(Gossip(a.site).sync_now())
    assert [(r["peer"], r["ok"], r["pulled"]) for r in results] == [
        ("b", True, 1),
        ("c", True, 1),
        ("d", True, 1),
    ]


def misbehaving(app):
    """The real app, except that /v1/heads answers a JSON list (a fault injected in the peer)."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/heads":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": b"[]"})
            return
        await app(scope, receive, send)

    return wrapped


def test_sync_now_with_a_misbehaving_peer_reports_a_failure(make_site, serve_app):
    a, bad = make_site("a"), make_site("bad")
    bad.trust(a.key)
    set_peers(a, PeerConfig("bad", serve_app(misbehaving(bad.app)), bad.key))
    gossip = Gossip(a.site)
    [result] = asyncio.run(
        gossip.sync_now("bad")
    )  # what `simnet sync` gets through the admin endpoint
    assert result["ok"] is False and result["peer"] == "bad"
    assert state(gossip, "bad")["failures"] == 1


def test_a_misbehaving_peer_does_not_stop_the_scheduler(make_site, serve_app):
    a = make_site("a", gossip=GossipConfig(interval_s=0.02, jitter=0.0, max_backoff_s=0.05))
    good, bad = make_site("good"), make_site("bad")
    for p in (good, bad):
        p.trust(a.key)
    set_peers(
        a,
        PeerConfig("good", serve_app(good.app), good.key),
        PeerConfig("bad", serve_app(misbehaving(bad.app)), bad.key),
    )
    gossip = Gossip(a.site, rng=random.Random(3))

    async def go():
        gossip.start()
        try:
            await until(
                lambda: any(s["name"] == "bad" and s["rounds"] for s in gossip.states()),
                what="a round with the bad peer",
            )
            rounds = state(gossip, "good")["rounds"]
            await until(
                lambda: state(gossip, "good")["rounds"] >= rounds + 3,
                timeout=5,
                what="gossip to go on with the good peer after the bad peer's round",
            )
        finally:
            await gossip.stop()

    asyncio.run(go())
    assert state(gossip, "bad")["failures"] >= 1 and state(gossip, "bad")["last_error"]


def trickling(app, drips: int = 200, every: float = 0.02):
    """The real app, except that /v1/sync answers a 200 whose body trickles (one byte per `every` s,
    each well inside the client's read timeout) until the client goes or `drips` bytes are out."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/sync":
            await app(scope, receive, send)
            return
        gone = asyncio.Event()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/x-simnet-envelopes"),
                    (b"content-length", b"100000"),
                ],
            }
        )
        for _ in range(drips):
            if gone.is_set():
                break
            await send({"type": "http.response.body", "body": b"\0", "more_body": True})
            await asyncio.sleep(every)
        watcher.cancel()

    return wrapped


def test_a_slow_peer_holds_up_only_its_own_rounds(make_site, serve_app):
    # room for 3 rounds with the live peer on a loaded machine (the suite runs on every core: once
    # only 2 fitted in 0.5 s), and well short of the slow peer's 4 s of trickling
    deadline = 1.5
    a = make_site(
        "a",
        gossip=GossipConfig(interval_s=0.02, jitter=0.0, max_backoff_s=0.05),
        limits=ServerLimits(timeout_s=1.0, sync_deadline_s=deadline),
    )
    live, slow = make_site("live"), make_site("slow")
    for p in (live, slow):
        p.trust(a.key)
    set_peers(
        a,
        PeerConfig("live", serve_app(live.app), live.key),
        PeerConfig("slow", serve_app(trickling(slow.app)), slow.key),
    )
    gossip = Gossip(a.site, rng=random.Random(5))

    async def scheduled():
        gossip.start()
        try:
            await until(
                lambda: any(s["name"] == "slow" and s["rounds"] for s in gossip.states()),
                what="a round with the slow peer",
            )
            rounds = state(gossip, "live")["rounds"]
            await until(
                lambda: state(gossip, "slow")["failures"] == 1,
                timeout=5,
                what="the slow round to fail",
            )
            return (
                state(gossip, "live")["rounds"] - rounds
            )  # rounds with the live peer while it ran
        finally:
            await gossip.stop()

    meanwhile = asyncio.run(scheduled())
    assert meanwhile >= 3
    slow_state = state(gossip, "slow")
    assert f"did not finish within its deadline of {deadline:g} s" in slow_state["last_error"]
    assert slow_state["next_attempt"] > slow_state["last_attempt"]  # backing off
    assert state(gossip, "live")["failures"] == 0

    started = time.monotonic()
    results = asyncio.run(
        gossip.sync_now()
    )  # both at once: one deadline, not one per slow peer in turn
    took = time.monotonic() - started
    assert [(r["peer"], r["ok"]) for r in results] == [("live", True), ("slow", False)]
    assert deadline <= took < deadline + 1.0, took

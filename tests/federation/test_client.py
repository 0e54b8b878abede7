"""federation._client: one anti-entropy round, against the real ASGI app (in-process or served by
uvicorn)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import socket

import httpx
import pytest

import knowledge
from federation import (
    FederationError,
    PeerError,
    ServerLimits,
    SyncReport,
    WireError,
    async_sync_with,
    encode_page,
    exchange,
    sync_with,
)
from federation._client import Call
from knowledge import Identity

BLOB = bytes(range(256)) * 2400  # 600 KiB: more than one streamed chunk


@pytest.fixture
def pair(make_site):
    """Two sites that trust each other's roots for every role."""
    a, b = make_site("a"), make_site("b")
    a.trust(b.key)
    b.trust(a.key)
    return a, b


def publish(kb: knowledge.KnowledgeBase, n: int, prefix: str) -> list[str]:
    return [kb.skills.publish(f"{prefix}-{i}", "pick").id for i in range(n)]


def envelopes(kb: knowledge.KnowledgeBase) -> int:
    return sum(h.seq for h in kb.heads().values())


def skill_ids(kb: knowledge.KnowledgeBase) -> set[str]:
    return {s.id for s in kb.skills.list(include_withdrawn=True)}


def writer_below(key: bytes) -> knowledge.KnowledgeBase:
    """A writer (its own site root) whose key sorts before `key`: its feed is served first."""
    while True:
        identity = Identity.generate()
        if identity.public_key < key:
            return knowledge.open(":memory:", identity)


async def drive(rounds, client: httpx.AsyncClient) -> tuple[SyncReport, list[tuple[str, str]]]:
    """Run the sans-I/O round by hand: make each yielded Call with `client`, feed back the
    response."""
    sent = []
    step = next(rounds)
    while True:
        assert isinstance(step, Call), step
        request = client.build_request(
            step.method, step.url, content=step.content, headers=step.headers
        )
        sent.append((request.method, request.url.path))
        response = await client.send(request)
        await response.aread()
        try:
            step = rounds.send(response)
        except StopIteration as done:
            return done.value, sent


def run(coro):
    return asyncio.run(coro)


# --- the round ------------------------------------------------------------------------------------


def test_exchange_yields_calls_and_two_knowledge_bases_converge(pair):
    a, b = pair
    publish(a.kb, 3, "a")
    publish(b.kb, 5, "b")
    b.kb.maps["yard"].observe((1, 2), "gate", 0.9)

    async def go():
        async with b.client(a.identity) as http:
            return await drive(exchange(a.kb, "http://site", page=2), http)

    report, sent = run(go())
    assert sent == (
        [("POST", "/v1/sync")] * math.ceil(6 / 2)  # the last page says it holds all there is
        + [("GET", "/v1/heads")]
        + [("POST", "/v1/envelopes")] * math.ceil(3 / 2)
    )
    assert (
        report.pulled,
        report.pushed,
        report.duplicates,
        report.rejected,
        report.refused_by_peer,
    ) == (6, 3, 0, [], 0)
    assert report.bytes_sent > 0 and report.bytes_received > 0 and report.peer == "http://site"
    assert a.kb.heads() == b.kb.heads()
    assert skill_ids(a.kb) == skill_ids(b.kb) and len(skill_ids(a.kb)) == 8
    assert a.kb.maps["yard"].get((1, 2)).value == "gate"


def test_sync_with_over_real_http_converges_and_a_second_round_moves_nothing(pair, serve_app):
    a, b = pair
    publish(a.kb, 4, "a")
    publish(b.kb, 7, "b")
    url = serve_app(b.app)
    report = sync_with(a.kb, url + "/", b.key, page=3)
    assert (report.pulled, report.pushed, report.peer) == (7, 4, url)
    assert a.kb.heads() == b.kb.heads() and len(skill_ids(b.kb)) == 11
    again = sync_with(a.kb, url, b.key, page=3)
    assert (again.pulled, again.pushed, again.duplicates, again.refused_by_peer) == (0, 0, 0, 0)


def test_async_sync_with_in_process(pair):
    a, b = pair
    publish(a.kb, 2, "a")
    publish(b.kb, 2, "b")
    report = run(async_sync_with(a.kb, "http://b", b.key, transport=httpx.ASGITransport(app=b.app)))
    assert (report.pulled, report.pushed) == (2, 2)
    assert a.kb.heads() == b.kb.heads()


def test_devices_sync_through_their_site(make_site, make_device):
    """Two robots of one site exchange a map through it (delegations travel first)."""
    site = make_site("s")
    robot, other = make_device(site), make_device(site)
    robot.maps["floor"].observe((3, 4), {"label": "shelf"}, 0.8)
    transport = httpx.ASGITransport(app=site.app)
    assert run(async_sync_with(robot, "http://s", site.key, transport=transport)).pushed == 1
    run(async_sync_with(other, "http://s", site.key, transport=httpx.ASGITransport(app=site.app)))
    assert other.maps["floor"].get((3, 4)).value == {"label": "shelf"}


@pytest.mark.parametrize("client_page, server_page", [(4, 1000), (10, 3), (1, 1000), (5, 1000)])
@pytest.mark.parametrize("says_complete", [True, False])
def test_paging_with_small_pages(pair, fault, client_page, server_page, says_complete):
    """Pages of the smaller of the two limits. A page that holds everything says so (Simnet-
    Complete) and the round asks no more; from a site that does not say (an older one), the round
    asks until a page comes back empty."""
    a, b = pair
    b.site.config.limits = ServerLimits(max_page=server_page)
    publish(b.kb, 25, "b")

    def older(request, status, headers, body):
        headers.pop("simnet-complete", None)
        return status, headers, body

    counting = fault(httpx.ASGITransport(app=b.app), None if says_complete else older)
    report = run(async_sync_with(a.kb, "http://b", b.key, page=client_page, transport=counting))
    per_page = min(client_page, server_page)
    assert report.pulled == 25
    pages = math.ceil(25 / per_page) + (not says_complete)
    assert counting.requests.count(("POST", "/v1/sync")) == pages
    assert a.kb.heads() == b.kb.heads()


def test_push_to_a_peer_that_accepts_smaller_pages(pair):
    """Sites may configure different [limits] max_page; a round with default pages must still push
    everything (today the peer answers 413 to the whole page and the round fails, every round)."""
    a, b = pair
    b.site.config.limits = ServerLimits(max_page=3)
    mine = publish(a.kb, 10, "a")
    report = run(async_sync_with(a.kb, "http://b", b.key, transport=httpx.ASGITransport(app=b.app)))
    assert report.pushed == 10 and set(mine) <= skill_ids(b.kb)


def test_a_peer_that_refuses_everything_ends_the_round(pair, fault):
    """Feeds the other side will not take are offered a bounded number of times per round, not
    forever."""
    a, b = pair
    c, d = (
        knowledge.open(":memory:", Identity.generate()),
        knowledge.open(":memory:", Identity.generate()),
    )
    publish(c, 12, "c")
    publish(d, 12, "d")
    a.trust(c.identity.public_key)  # a holds c's feed, which b does not trust
    b.trust(d.identity.public_key)  # b holds d's feed, which a does not trust
    a.kb.ingest(c.envelopes_since({}))
    b.kb.ingest(d.envelopes_since({}))
    counting = fault(httpx.ASGITransport(app=b.app))
    report = run(async_sync_with(a.kb, "http://b", b.key, page=5, transport=counting))
    assert (report.pulled, report.pushed) == (0, 0)
    assert report.rejected and {r.reason for r in report.rejected} == {"unknown_writer"}
    assert 1 <= report.refused_by_peer <= 12
    assert (
        1 <= counting.requests.count(("POST", "/v1/sync")) <= 3
    )  # not once per page of d's feed, let alone forever
    assert 1 <= counting.requests.count(("POST", "/v1/envelopes")) <= 3
    assert (
        c.identity.public_key_hex not in b.kb.heads()
        and d.identity.public_key_hex not in a.kb.heads()
    )
    c.close()
    d.close()


def test_a_peer_that_repeats_the_same_page_ends_the_round(pair, fault):
    a, b = pair
    publish(b.kb, 12, "b")
    first: list[bytes] = []

    def replay_first_page(request, status, headers, body):
        if request.url.path == "/v1/sync":
            first.append(body)
            return status, headers, first[0]
        return None

    faulty = fault(httpx.ASGITransport(app=b.app), replay_first_page)
    report = run(async_sync_with(a.kb, "http://b", b.key, page=5, transport=faulty))
    assert (report.pulled, report.duplicates) == (5, 5)
    assert faulty.requests.count(("POST", "/v1/sync")) == 2


def test_feeds_the_client_refuses_do_not_starve_the_feeds_it_trusts(pair):
    """b serves a feed a does not trust (d's, a full page of it) before its own; a must still get
    b's news."""
    a, b = pair
    d = writer_below(b.key)
    publish(d, 6, "d")
    b.trust(d.identity.public_key)
    b.kb.ingest(d.envelopes_since({}))
    mine = publish(b.kb, 3, "b")
    for _ in range(3):  # a few rounds, as gossip would run them
        run(
            async_sync_with(
                a.kb, "http://b", b.key, page=5, transport=httpx.ASGITransport(app=b.app)
            )
        )
    assert set(mine) <= skill_ids(a.kb), (
        "a never received b's own skills: d's refused feed blocks every round"
    )
    d.close()


def test_feeds_the_peer_refuses_do_not_starve_the_rest_of_a_push(pair):
    """a holds a feed b does not trust (c's, a full page of it) that sorts before a's own; b must
    still get a's."""
    a, b = pair
    c = writer_below(a.key)
    publish(c, 6, "c")
    a.trust(c.identity.public_key)
    a.kb.ingest(c.envelopes_since({}))
    mine = publish(a.kb, 3, "a")
    for _ in range(3):
        run(
            async_sync_with(
                a.kb, "http://b", b.key, page=5, transport=httpx.ASGITransport(app=b.app)
            )
        )
    assert set(mine) <= skill_ids(b.kb), (
        "b never received a's own skills: c's refused feed blocks every push"
    )
    c.close()


# --- blobs ----------------------------------------------------------------------------------------


def test_blob_fetch_stores_verified_bytes(pair, serve_app, fault):
    a, b = pair
    blob_hash = b.kb.blobs.put(BLOB)
    url = serve_app(b.app)
    report = sync_with(a.kb, url, b.key, blobs=[blob_hash])
    assert report.blobs == 1 and a.kb.blobs.get(blob_hash) == BLOB
    counting = fault(httpx.HTTPTransport())
    assert (
        sync_with(a.kb, url, b.key, blobs=[blob_hash], transport=counting).blobs == 0
    )  # already held: not asked
    assert not any(path.startswith("/v1/blobs/") for _, path in counting.requests)


def test_blob_the_peer_lacks_is_a_peer_error(pair):
    a, b = pair
    missing = hashlib.sha256(b"nobody has this").hexdigest()
    with pytest.raises(PeerError, match="404 not_found") as caught:
        run(
            async_sync_with(
                a.kb, "http://b", b.key, blobs=[missing], transport=httpx.ASGITransport(app=b.app)
            )
        )
    assert (caught.value.status, caught.value.code) == (404, "not_found")
    assert missing not in a.kb.blobs


CORRUPTIONS = {
    "flip": lambda body: body[:1000] + bytes([body[1000] ^ 1]) + body[1001:],
    "truncate": lambda body: body[:-1],
    "extend": lambda body: body + b"\x00",
    "replace": lambda body: b"evil bytes",
    "empty": lambda body: b"",
}


def corrupt_blobs(how):
    def rewrite(request, status, headers, body):
        if request.url.path.startswith("/v1/blobs/"):
            return status, headers, CORRUPTIONS[how](body)
        return None

    return rewrite


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_blob_corrupted_in_transit_is_refused_and_not_stored_over_http(pair, serve_app, fault, how):
    a, b = pair
    blob_hash = b.kb.blobs.put(BLOB)
    url = serve_app(b.app)
    with pytest.raises(PeerError, match=f"blob {blob_hash[:16]}… from .* is corrupt"):
        sync_with(
            a.kb,
            url,
            b.key,
            blobs=[blob_hash],
            transport=fault(httpx.HTTPTransport(), corrupt_blobs(how)),
        )
    assert blob_hash not in a.kb.blobs


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_blob_corrupted_in_transit_is_refused_and_not_stored_async(pair, fault, how):
    a, b = pair
    blob_hash = b.kb.blobs.put(BLOB)
    transport = fault(httpx.ASGITransport(app=b.app), corrupt_blobs(how))
    with pytest.raises(PeerError, match="is corrupt"):
        run(async_sync_with(a.kb, "http://b", b.key, blobs=[blob_hash], transport=transport))
    assert blob_hash not in a.kb.blobs
    # the same fetch through an honest transport succeeds: the refusal was the corruption's doing
    run(
        async_sync_with(
            a.kb, "http://b", b.key, blobs=[blob_hash], transport=httpx.ASGITransport(app=b.app)
        )
    )
    assert a.kb.blobs.get(blob_hash) == BLOB


# --- failures are PeerErrors ----------------------------------------------------------------------


def test_a_read_only_knowledge_base_cannot_sync(pair):
    a, b = pair
    with knowledge.open(a.config.store_path) as readonly:
        with pytest.raises(PeerError, match="needs a knowledge base opened with an identity"):
            sync_with(readonly, "http://127.0.0.1:9", b.key)


def test_unreachable_peer(pair):
    a, b = pair
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PeerError, match=f"cannot reach http://127.0.0.1:{port}/v1/sync") as caught:
        sync_with(a.kb, f"http://127.0.0.1:{port}", b.key, timeout=5)
    assert caught.value.status is None


def test_untrusted_caller_gets_a_peer_error_with_status_and_code(make_site):
    a, b = make_site("a"), make_site("b")
    a.trust(b.key)  # but b does not trust a
    with pytest.raises(PeerError) as caught:
        run(async_sync_with(a.kb, "http://b", b.key, transport=httpx.ASGITransport(app=b.app)))
    assert (caught.value.status, caught.value.code) == (403, "forbidden")
    assert "not trusted by this site's policy" in str(caught.value)


def test_wrong_peer_key_is_refused_by_the_peer(pair):
    a, b = pair
    with pytest.raises(PeerError) as caught:
        run(
            async_sync_with(
                a.kb,
                "http://b",
                Identity.generate().public_key,
                transport=httpx.ASGITransport(app=b.app),
            )
        )
    assert (caught.value.status, caught.value.code) == (401, "unauthenticated")


def _answer(path: str, body: bytes, status: int = 200, content_type: str = "application/json"):
    def rewrite(request, _status, headers, _body):
        if request.url.path == path:
            return status, {"content-type": content_type}, body
        return None

    return rewrite


MISBEHAVING = {
    "sync answers a non-page": _answer(
        "/v1/sync", b"garbage", content_type="application/x-simnet-envelopes"
    ),
    "sync answers more than asked": _answer("/v1/sync", encode_page([b"x"] * 6)),
    "sync answers 500 html": _answer("/v1/sync", b"<html>oops</html>", 500, "text/html"),
    "heads answers non-JSON": _answer("/v1/heads", b"{"),
    "heads answers bad keys": _answer("/v1/heads", json.dumps({"heads": {"zz": 1}}).encode()),
    "heads answers a list": _answer("/v1/heads", b"[]"),
    "heads answers a string": _answer("/v1/heads", b'"heads"'),
    "push answers a list": _answer("/v1/envelopes", b"[]"),
    "push answers a non-number": _answer(
        "/v1/envelopes", json.dumps({"accepted": "many", "heads": {}}).encode()
    ),
    "push answers rejected as a number": _answer(
        "/v1/envelopes", json.dumps({"accepted": 1, "rejected": 5, "heads": {}}).encode()
    ),
}


@pytest.mark.parametrize("rewrite", list(MISBEHAVING.values()), ids=list(MISBEHAVING))
def test_a_misbehaving_peer_is_a_federation_error(pair, fault, rewrite):
    """Whatever a peer answers, the round ends with a FederationError (which gossip handles),
    nothing else."""
    a, b = pair
    publish(a.kb, 2, "a")  # something to push
    publish(b.kb, 2, "b")  # something to pull
    with pytest.raises(FederationError):
        run(
            async_sync_with(
                a.kb,
                "http://b",
                b.key,
                page=5,
                transport=fault(httpx.ASGITransport(app=b.app), rewrite),
            )
        )


def test_wire_errors_from_a_peer_are_federation_errors():
    assert issubclass(WireError, FederationError) and issubclass(PeerError, FederationError)


def test_an_answer_over_the_cap_is_refused_before_it_is_all_read(pair, monkeypatch):
    """A peer streaming a huge (or decompression-bomb) answer is cut off at the cap, not read into
    memory."""
    import federation._client as client_module

    a, b = pair
    publish(b.kb, 50, "b")
    monkeypatch.setattr(client_module, "_answer_cap", lambda kb: 2_000)
    with pytest.raises(PeerError, match="exceeds 2000 bytes"):
        run(async_sync_with(a.kb, "http://b", b.key, transport=httpx.ASGITransport(app=b.app)))
    assert skill_ids(a.kb) == set()


def busy_for(times: int, retry_after: str | None = "0"):
    """A rewrite: the first `times` answers are the server's busy 503 (with its Retry-After)."""
    seen = {"busy": 0}

    def rewrite(request, status, headers, body):
        if seen["busy"] >= times:
            return None
        seen["busy"] += 1
        busy = {"content-type": "application/json"}
        if retry_after is not None:
            busy["retry-after"] = retry_after
        return 503, busy, b'{"error": "busy", "detail": "too many syncs in progress; retry later"}'

    return rewrite


@pytest.mark.parametrize("retry_after", ["0", None], ids=["retry-after", "backoff"])
def test_a_busy_peer_is_asked_again_and_the_round_completes(pair, serve_app, fault, retry_after):
    a, b = pair
    publish(b.kb, 3, "b")
    counting = fault(httpx.HTTPTransport(), busy_for(3, retry_after))
    report = sync_with(a.kb, serve_app(b.app), b.key, transport=counting)
    assert report.pulled == 3 and a.kb.heads() == b.kb.heads()
    assert counting.requests[:4] == [("POST", "/v1/sync")] * 4  # three busy answers, then the page


def test_a_busy_peer_is_asked_again_async(pair, fault):
    a, b = pair
    publish(b.kb, 2, "b")
    transport = fault(httpx.ASGITransport(app=b.app), busy_for(2))
    report = asyncio.run(async_sync_with(a.kb, "http://b", b.key, transport=transport))
    assert report.pulled == 2


def test_a_peer_busy_past_the_deadline_fails_the_round_with_its_answer(pair, serve_app, fault):
    a, b = pair
    always = fault(httpx.HTTPTransport(), busy_for(10**6, "120"))
    with pytest.raises(PeerError) as refused:  # a round long enough for a loaded machine's answer
        sync_with(a.kb, serve_app(b.app), b.key, transport=always, deadline=8)
    assert (refused.value.status, refused.value.code) == (503, "busy")
    assert len(always.requests) == 1  # a wait (capped at 10 s) does not fit in 8 s: no second try


def test_refusals_are_reported_by_reason_and_a_peers_odd_answers_are_contained(pair, fault):
    """The push answer's reasons are counted as the peer gives them (anything but a short
    identifier as "unknown"); a malformed `held` list is the peer's error, not ours; the peer's
    `Simnet-Time` gives the offset."""
    a, b = pair
    publish(a.kb, 2, "a")

    def answer(held: object, reason: object):
        def rewrite(request, status, headers, body):
            if request.url.path != "/v1/envelopes":
                return None
            sent = json.loads(body)
            sent |= {"accepted": 0, "rejected": [{"index": 0, "reason": reason}], "held": held}
            return status, headers, json.dumps(sent).encode()

        return fault(httpx.ASGITransport(app=b.app), rewrite)

    report = run(async_sync_with(a.kb, "http://b", b.key, transport=answer([], "<b>odd</b>")))
    assert report.refused_by_peer_reasons == {"unknown": 1} and report.refused_by_peer == 1
    assert report.clock_offset_ms is not None and abs(report.clock_offset_ms) < 5_000
    publish(a.kb, 2, "more")  # (b took the first two: only its answer was rewritten)
    report = run(
        async_sync_with(a.kb, "http://b", b.key, transport=answer([{"index": 1}], "clock_skew"))
    )
    assert report.refused_by_peer_reasons == {"clock_skew": 1} and report.held_by_peer == 1
    publish(a.kb, 1, "last")
    with pytest.raises(PeerError, match="held envelopes without valid envelope indexes"):
        run(async_sync_with(a.kb, "http://b", b.key, transport=answer([{"index": 9}], "gap")))

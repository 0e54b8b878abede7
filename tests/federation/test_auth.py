"""federation._auth: requests signed by SimnetAuth, checked by RequestVerifier (real Ed25519
keys)."""

from __future__ import annotations

import os
import re
import time

import httpx
import pytest

from federation import AuthError, RequestVerifier, SimnetAuth
from federation._auth import (
    ANSWER_HEADER,
    DEFAULT_WINDOW_MS,
    answer_signature,
    answer_signed_by,
    signed_message,
)
from knowledge import Identity

WINDOW = DEFAULT_WINDOW_MS
NOW = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def caller():
    return Identity.generate()


@pytest.fixture
def server():
    return Identity.generate()


def sign(request: httpx.Request, identity: Identity, audience: bytes) -> httpx.Request:
    """Run SimnetAuth's flow on `request` (it signs in place and yields it)."""
    flow = SimnetAuth(identity, audience).auth_flow(request)
    return next(flow)


def header(
    identity: Identity,
    audience: bytes,
    method: str,
    target: str,
    body: bytes,
    *,
    ts: int,
    nonce: str | None = None,
    claimed: bytes | None = None,
) -> str:
    """An Authorization header built by hand (any timestamp, nonce, or a key it does not own)."""
    nonce = nonce or os.urandom(16).hex()
    sig = identity.sign(signed_message(method, target, body, ts, nonce, audience))
    return (
        f"Simnet key={(claimed or identity.public_key).hex()}, ts={ts}, "
        f"nonce={nonce}, sig={sig.hex()}"
    )


def parts(request: httpx.Request) -> tuple[str, str, bytes, str]:
    return (
        request.method,
        request.url.raw_path.decode(),
        request.content,
        request.headers["authorization"],
    )


def refused(
    verifier: RequestVerifier, method, target, body, auth, match: str, status: int = 401
) -> None:
    with pytest.raises(AuthError, match=match) as caught:
        verifier.verify(method, target, body, auth)
    assert caught.value.status == status


def test_simnet_auth_signs_method_path_query_body_and_audience(caller, server):
    request = sign(
        httpx.Request("POST", "http://peer:7070/v1/sync?x=1", content=b'{"heads": {}}'),
        caller,
        server.public_key,
    )
    auth = request.headers["authorization"]
    match = re.fullmatch(
        r"Simnet key=([0-9a-f]{64}), ts=([0-9]+), nonce=([0-9a-f]{32}), sig=([0-9a-f]{128})", auth
    )
    assert match and match[1] == caller.public_key_hex
    assert RequestVerifier(server.public_key).verify(*parts(request)) == caller.public_key


def test_each_request_gets_a_fresh_nonce(caller, server):
    nonces = {
        sign(httpx.Request("GET", "http://p/v1/heads"), caller, server.public_key)
        .headers["authorization"]
        .split("nonce=")[1][:32]
        for _ in range(20)
    }
    assert len(nonces) == 20


def test_valid_request_verifies_through_httpx_auth(caller, server):
    seen = []
    verifier = RequestVerifier(server.public_key)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(verifier.verify(*parts(request)))
        return httpx.Response(200)

    with httpx.Client(
        transport=httpx.MockTransport(handler), auth=SimnetAuth(caller, server.public_key)
    ) as client:
        client.post("http://peer/v1/envelopes", content=b"SNP1\x00\x00\x00\x00")
        client.get("http://peer/v1/blobs/" + "a" * 64)
        client.post("http://peer/v1/sync", json={"heads": {}})
    assert seen == [caller.public_key] * 3


def test_missing_header(server):
    for missing in (None, ""):
        refused(
            RequestVerifier(server.public_key),
            "GET",
            "/v1/heads",
            b"",
            missing,
            "request is not signed",
        )


@pytest.mark.parametrize(
    "auth",
    [
        "Bearer abc",
        "Simnet key=00, ts=1, nonce=00, sig=00",
        "Simnet key={key}, ts={ts}, nonce={nonce}",  # no signature
        "Simnet key={KEY}, ts={ts}, nonce={nonce}, sig={sig}",  # upper-case hex
        "Simnet ts={ts}, key={key}, nonce={nonce}, sig={sig}",  # fields out of order
        "Simnet key={key}, ts=-{ts}, nonce={nonce}, sig={sig}",
        "Simnet key={key}, ts={ts}, nonce={nonce}, sig={sig}, extra=1",
        "Simnet key={key},ts={ts},nonce={nonce},sig={sig}",
        "simnet key={key}, ts={ts}, nonce={nonce}, sig={sig}",
        "Simnet key={key}, ts=12345678901234567, nonce={nonce}, sig={sig}",  # 17-digit timestamp
    ],
)
def test_malformed_header(caller, server, auth):
    good = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    fields = dict(re.findall(r"(\w+)=([0-9a-f]+)", good))
    auth = auth.format(
        key=fields["key"],
        KEY=fields["key"].upper(),
        ts=fields["ts"],
        nonce=fields["nonce"],
        sig=fields["sig"],
    )
    refused(
        RequestVerifier(server.public_key, clock=Clock()),
        "GET",
        "/v1/heads",
        b"",
        auth,
        "Authorization header is not of the form",
    )


def test_forged_signature(caller, server):
    verifier = RequestVerifier(server.public_key, clock=Clock())
    auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    forged = re.sub(r"sig=[0-9a-f]{128}", "sig=" + os.urandom(64).hex(), auth)
    refused(verifier, "GET", "/v1/heads", b"", forged, "request signature does not verify")


def test_key_claimed_by_someone_else(caller, server):
    """Signing with one key and naming another (a trusted peer's) does not verify."""
    victim = Identity.generate()
    auth = header(
        caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW, claimed=victim.public_key
    )
    refused(
        RequestVerifier(server.public_key, clock=Clock()),
        "GET",
        "/v1/heads",
        b"",
        auth,
        "does not verify",
    )


def test_key_that_is_not_a_curve_point_does_not_verify(server):
    auth = f"Simnet key={'ff' * 32}, ts={NOW}, nonce={'00' * 16}, sig={'00' * 64}"
    refused(
        RequestVerifier(server.public_key, clock=Clock()),
        "GET",
        "/v1/heads",
        b"",
        auth,
        "does not verify",
    )


@pytest.mark.parametrize("change", ["body", "path", "query", "method"])
def test_altered_request(caller, server, change):
    method, target, body = "POST", "/v1/sync?limit=5", b'{"heads": {}}'
    auth = header(caller, server.public_key, method, target, body, ts=NOW)
    altered = {
        "body": (method, target, b'{"heads": {}} '),
        "path": (method, "/v1/envelopes?limit=5", body),
        "query": (method, "/v1/sync?limit=6", body),
        "method": ("PUT", target, body),
    }[change]
    verifier = RequestVerifier(server.public_key, clock=Clock())
    refused(verifier, *altered, auth, "request signature does not verify")
    assert (
        verifier.verify(method, target, body, auth) == caller.public_key
    )  # the original still does


def test_method_is_case_insensitive_in_the_signature(caller, server):
    auth = header(caller, server.public_key, "post", "/v1/sync", b"{}", ts=NOW)
    assert (
        RequestVerifier(server.public_key, clock=Clock()).verify("POST", "/v1/sync", b"{}", auth)
        == caller.public_key
    )


def test_wrong_audience(caller, server):
    other_site = Identity.generate()
    request = sign(httpx.Request("GET", "http://peer/v1/heads"), caller, other_site.public_key)
    refused(
        RequestVerifier(server.public_key),
        *parts(request),
        "does not verify .*meant for another site",
    )
    assert RequestVerifier(other_site.public_key).verify(*parts(request)) == caller.public_key


@pytest.mark.parametrize("offset", [WINDOW + 1, -(WINDOW + 1), 10 * WINDOW, -NOW])
def test_stale_and_future_timestamps(caller, server, offset):
    auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW + offset)
    refused(
        RequestVerifier(server.public_key, clock=Clock()),
        "GET",
        "/v1/heads",
        b"",
        auth,
        f"request timestamp is {abs(offset)} ms from this site's clock \\(window {WINDOW} ms\\)",
    )


@pytest.mark.parametrize("offset", [WINDOW, -WINDOW, 0])
def test_timestamps_at_the_edge_of_the_window_are_accepted(caller, server, offset):
    auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW + offset)
    assert (
        RequestVerifier(server.public_key, clock=Clock()).verify("GET", "/v1/heads", b"", auth)
        == caller.public_key
    )


def test_custom_window(caller, server):
    verifier = RequestVerifier(server.public_key, window_ms=1000, clock=Clock())
    refused(
        verifier,
        "GET",
        "/v1/heads",
        b"",
        header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW - 1001),
        "window 1000 ms",
    )


def test_replayed_nonce(caller, server):
    verifier = RequestVerifier(server.public_key)
    request = sign(
        httpx.Request("POST", "http://peer/v1/envelopes", content=b"page"),
        caller,
        server.public_key,
    )
    assert verifier.verify(*parts(request)) == caller.public_key
    refused(verifier, *parts(request), "request replayed: this nonce was already used")
    refused(verifier, *parts(request), "request replayed")


def test_same_nonce_from_two_keys_is_not_a_replay(caller, server):
    other = Identity.generate()
    verifier = RequestVerifier(server.public_key, clock=Clock())
    nonce = "ab" * 16
    for who in (caller, other):
        auth = header(who, server.public_key, "GET", "/v1/heads", b"", ts=NOW, nonce=nonce)
        assert verifier.verify("GET", "/v1/heads", b"", auth) == who.public_key


def test_a_refused_request_does_not_burn_its_nonce(caller, server):
    verifier = RequestVerifier(server.public_key, clock=Clock())
    nonce = "cd" * 16
    bad = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW, nonce=nonce)
    refused(verifier, "GET", "/v1/status", b"", bad, "does not verify")
    good = header(caller, server.public_key, "GET", "/v1/status", b"", ts=NOW, nonce=nonce)
    assert verifier.verify("GET", "/v1/status", b"", good) == caller.public_key


def test_a_replay_after_the_nonce_expired_is_refused_as_stale(caller, server):
    clock = Clock()
    verifier = RequestVerifier(server.public_key, clock=clock)
    auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    verifier.verify("GET", "/v1/heads", b"", auth)
    for later in (WINDOW + 1, 2 * WINDOW + 1, 100 * WINDOW):
        clock.now = NOW + later
        refused(verifier, "GET", "/v1/heads", b"", auth, "request timestamp is")


def test_nonce_cache_expires_with_the_clock(caller, server):
    clock = Clock()
    verifier = RequestVerifier(server.public_key, max_nonces=2, clock=clock)
    for _ in range(2):
        verifier.verify(
            "GET",
            "/v1/heads",
            b"",
            header(caller, server.public_key, "GET", "/v1/heads", b"", ts=clock.now),
        )
    full = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=clock.now)
    refused(
        verifier,
        "GET",
        "/v1/heads",
        b"",
        full,
        "too many requests in the replay window; retry later",
        429,
    )
    clock.now = NOW + 2 * WINDOW  # remembered until now + 2 windows: still full
    refused(
        verifier,
        "GET",
        "/v1/heads",
        b"",
        header(caller, server.public_key, "GET", "/v1/heads", b"", ts=clock.now),
        "too many requests",
        429,
    )
    clock.now = NOW + 2 * WINDOW + 1  # both nonces expired: room again
    for _ in range(2):
        verifier.verify(
            "GET",
            "/v1/heads",
            b"",
            header(caller, server.public_key, "GET", "/v1/heads", b"", ts=clock.now),
        )
    refused(
        verifier,
        "GET",
        "/v1/heads",
        b"",
        header(caller, server.public_key, "GET", "/v1/heads", b"", ts=clock.now),
        "too many requests",
        429,
    )


def test_max_nonces_refusal_is_429_and_the_nonce_stays_usable(caller, server):
    clock = Clock()
    verifier = RequestVerifier(server.public_key, max_nonces=1, clock=clock)
    verifier.verify(
        "GET", "/v1/heads", b"", header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    )
    later = header(
        caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW + 2 * WINDOW, nonce="ef" * 16
    )
    clock.now = NOW + WINDOW
    refused(verifier, "GET", "/v1/heads", b"", later, "too many requests", 429)
    clock.now = (
        NOW + 2 * WINDOW + 1
    )  # the first nonce expired; `later` (its ts still in the window) passes
    assert verifier.verify("GET", "/v1/heads", b"", later) == caller.public_key


def test_verifier_is_thread_safe_under_concurrent_replays(caller, server):
    from concurrent.futures import ThreadPoolExecutor

    verifier = RequestVerifier(server.public_key)
    request = sign(httpx.Request("GET", "http://peer/v1/heads"), caller, server.public_key)

    def attempt(_):
        try:
            verifier.verify(*parts(request))
            return True
        except AuthError:
            return False

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(64)))
    assert results.count(True) == 1  # exactly one of 64 simultaneous copies gets through


# --- the replay log on disk (a server's verifier has a path: <home>/replay.db) --------------------


def rows(path) -> list[tuple[str, str, int]]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return db.execute("SELECT key, nonce, expires FROM seen").fetchall()


def test_an_accepted_nonce_is_on_disk_before_verify_returns_and_refused_by_the_next_process(
    caller, server, tmp_path
):
    path = tmp_path / "replay.db"
    clock = Clock()
    first = RequestVerifier(server.public_key, clock=clock, path=path)
    auth = header(caller, server.public_key, "POST", "/v1/admin/revoke", b"{}", ts=NOW)
    assert first.verify("POST", "/v1/admin/revoke", b"{}", auth) == caller.public_key
    assert rows(path) == [
        (caller.public_key_hex, auth.split("nonce=")[1][:32], NOW + 2 * WINDOW)
    ]  # no close needed
    restarted = RequestVerifier(
        server.public_key, clock=clock, path=path
    )  # the first one never closed: a crash
    refused(
        restarted,
        "POST",
        "/v1/admin/revoke",
        b"{}",
        auth,
        "request replayed: this nonce was already used",
    )
    fresh = header(caller, server.public_key, "POST", "/v1/admin/revoke", b"{}", ts=NOW)
    assert restarted.verify("POST", "/v1/admin/revoke", b"{}", fresh) == caller.public_key
    first.close()
    restarted.close()


def test_simultaneous_requests_share_commits_and_each_is_on_disk_when_it_returns(
    caller, server, tmp_path
):
    """Many requests at once (a busy site): their nonces go to disk in group commits; each verify
    returns only once its own row is there, and of simultaneous copies of one request exactly one
    gets through."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "replay.db"
    verifier = RequestVerifier(server.public_key, clock=Clock(), path=path)
    one = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    requests = [
        header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW) for _ in range(48)
    ]

    def attempt(auth: str) -> bool:
        try:
            verifier.verify("GET", "/v1/heads", b"", auth)
        except AuthError:
            return False
        nonce = auth.split("nonce=")[1][:32]
        return (caller.public_key_hex, nonce, NOW + 2 * WINDOW) in rows(path)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(attempt, [*requests, *[one] * 16]))
    assert results[:48] == [True] * 48
    assert results[48:].count(True) == 1
    assert len(rows(path)) == 49
    verifier.close()


def test_requests_sharing_a_commit_that_fails_otherwise_than_sqlite_are_refused(
    caller, server, tmp_path, monkeypatch
):
    """A group commit that raises something other than a database error (a fault injected here)
    leaves its rows off the disk: the request leading it fails, and one that shared it is refused
    (503), not answered as if its nonce were recorded."""
    import threading

    verifier = RequestVerifier(server.public_key, clock=Clock(), path=tmp_path / "replay.db")
    real_commit, first_started, release = verifier._commit, threading.Event(), threading.Event()
    calls = []

    def commit(batch) -> None:
        calls.append(len(batch.rows))
        if len(calls) == 1:  # the first commit holds, so the next two requests share the second
            first_started.set()
            release.wait(10)
            real_commit(batch)
        else:
            raise MemoryError("injected")

    monkeypatch.setattr(verifier, "_commit", commit)
    outcomes: dict[int, str] = {}

    def attempt(i: int) -> None:
        auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
        try:
            verifier.verify("GET", "/v1/heads", b"", auth)
            outcomes[i] = "recorded"
        except AuthError as exc:
            outcomes[i] = f"refused {exc.status}"
        except MemoryError:
            outcomes[i] = "failed"

    threads = [threading.Thread(target=attempt, args=(0,))]
    threads[0].start()
    assert first_started.wait(10)
    threads += [threading.Thread(target=attempt, args=(i,)) for i in (1, 2)]
    for thread in threads[1:]:
        thread.start()
    while len(verifier._open_batch.rows) < 2:  # both wait in the next batch
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(10)
    assert calls == [1, 2]
    assert outcomes[0] == "recorded"
    assert sorted([outcomes[1], outcomes[2]]) == ["failed", "refused 503"]
    verifier.close()


def test_the_replay_log_forgets_what_has_expired(caller, server, tmp_path):
    path, clock = tmp_path / "replay.db", Clock()
    verifier = RequestVerifier(server.public_key, clock=clock, path=path)
    verifier.verify(
        "GET", "/v1/heads", b"", header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    )
    verifier.close()
    clock.now = NOW + 2 * WINDOW + 1  # the timestamp is stale by now: nothing left to remember
    RequestVerifier(server.public_key, clock=clock, path=path).close()
    assert rows(path) == []


def test_claim_checks_the_header_without_the_body_and_burns_nothing(caller, server):
    verifier = RequestVerifier(server.public_key, clock=Clock())
    auth = header(caller, server.public_key, "POST", "/v1/envelopes", b"page", ts=NOW)
    claim = verifier.claim(
        auth
    )  # form, window, unused nonce: all a server knows before reading the body
    assert claim.key == caller.public_key
    with pytest.raises(AuthError, match="does not verify"):
        verifier.check(claim, "POST", "/v1/envelopes", b"another page")
    verifier.check(claim, "POST", "/v1/envelopes", b"page")
    verifier.remember(claim)
    refused(verifier, "POST", "/v1/envelopes", b"page", auth, "request replayed")
    with pytest.raises(AuthError, match="request replayed"):
        verifier.remember(claim)  # the second of two simultaneous copies


def test_a_closed_replay_log_accepts_nothing(caller, server, tmp_path):
    verifier = RequestVerifier(server.public_key, clock=Clock(), path=tmp_path / "replay.db")
    verifier.close()
    auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
    refused(verifier, "GET", "/v1/heads", b"", auth, "cannot record the request's nonce", 503)
    refused(
        verifier, "GET", "/v1/heads", b"", auth, "cannot record", 503
    )  # not remembered: not a replay


def test_an_unreadable_replay_log_is_a_clear_error(server, tmp_path):
    from federation import FederationError

    (tmp_path / "replay.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(
        FederationError, match="cannot open the log of accepted requests .*replay.db"
    ):
        RequestVerifier(server.public_key, path=tmp_path / "replay.db")


def test_a_nonce_the_full_disk_refuses_is_507_and_taken_once_there_is_space(
    caller, server, tmp_path
):
    """SQLITE_FULL for real (the replay log may not grow): the request is refused with 507, its
    nonce is not spent, and the same request is accepted once there is space."""
    verifier = RequestVerifier(server.public_key, clock=Clock(), path=tmp_path / "replay.db")
    db = verifier._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    for _ in range(1000):  # until the log's pages are full
        auth = header(caller, server.public_key, "GET", "/v1/heads", b"", ts=NOW)
        try:
            verifier.verify("GET", "/v1/heads", b"", auth)
        except AuthError as exc:
            assert exc.status == 507 and "database or disk is full" in str(exc)
            break
    else:
        raise AssertionError("the replay log never filled up")
    db.execute("PRAGMA max_page_count = 1073741823")
    assert verifier.verify("GET", "/v1/heads", b"", auth) == caller.public_key
    refused(verifier, "GET", "/v1/heads", b"", auth, "request replayed")
    verifier.close()


def test_a_client_whose_clock_is_off_re_signs_once_on_the_peers_clock(make_site, serve_app):
    """A refusal carries the site's clock (Simnet-Time): a client more than the window off signs
    the request again on that clock, once, and keeps the correction for the next requests."""
    site = make_site("a")
    device = Identity.generate()
    site.kb.delegate(device.public_key, ["publish"])
    url = serve_app(site.app)
    sent: list[int] = []
    for skew in (-60_000, 90_000):
        auth = SimnetAuth(device, site.key, now_ms=lambda skew=skew: int(time.time() * 1000) + skew)
        hooks = {"request": [lambda request: sent.append(1)]}
        with httpx.Client(base_url=url, auth=auth, event_hooks=hooks, timeout=10) as client:
            sent.clear()
            assert client.get("/v1/heads").status_code == 200
            assert len(sent) == 2 and abs(auth.offset_ms + skew) < 5_000
            assert client.get("/v1/heads").status_code == 200 and len(sent) == 3  # no retry now
    stranger = SimnetAuth(Identity.generate(), site.key)  # clocks agree: a refusal stays one
    with httpx.Client(base_url=url, auth=stranger, event_hooks=hooks, timeout=10) as client:
        sent.clear()
        assert client.get("/v1/heads").status_code == 403 and len(sent) == 1


# --- signed answers ------------------------------------------------------------------------------


def answered(request: httpx.Request, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.Response(200, content=body, headers=headers, request=request)


def test_an_answer_counts_only_signed_by_the_key_meant_for_this_very_request(caller, server):
    """`answer_signed_by` holds for the site's signature over this request (method, path, its whole
    Authorization header) and this body; not for another key, another request's signature (a
    replay), another caller's request reusing the nonce, another path, a changed body, or none."""
    body = b'{"heads":{}}'
    first = sign(httpx.Request("GET", "http://site/v1/heads"), caller, server.public_key)
    second = sign(httpx.Request("GET", "http://site/v1/heads"), caller, server.public_key)
    other_path = sign(httpx.Request("GET", "http://site/v1/status"), caller, server.public_key)

    def signature(identity: Identity, request: httpx.Request, content: bytes = body) -> dict:
        header = request.headers["authorization"]
        return answer_signature(identity, "GET", request.url.raw_path.decode(), header, content)

    good = signature(server, first)
    assert set(good) == {ANSWER_HEADER}
    assert answer_signed_by(answered(first, body, good), server.public_key)
    assert not answer_signed_by(answered(first, body, good), caller.public_key)
    assert not answer_signed_by(answered(first, body, signature(caller, first)), server.public_key)
    assert not answer_signed_by(answered(second, body, good), server.public_key)  # replayed
    assert not answer_signed_by(answered(other_path, body, good), server.public_key)
    assert not answer_signed_by(answered(first, b'{"heads":{"x":1}}', good), server.public_key)
    assert not answer_signed_by(answered(first, body, {}), server.public_key)
    assert not answer_signed_by(answered(first, body, {ANSWER_HEADER: "zz"}), server.public_key)
    attacker = Identity.generate()  # its own request, reusing the first one's nonce
    nonce = first.headers["authorization"].split("nonce=")[1][:32]
    theirs = httpx.Request("GET", "http://site/v1/heads")
    theirs.headers["authorization"] = header(
        attacker, server.public_key, "GET", "/v1/heads", b"", ts=NOW, nonce=nonce
    )
    relayed = signature(server, theirs)
    assert answer_signed_by(answered(theirs, body, relayed), server.public_key)
    assert not answer_signed_by(answered(first, body, relayed), server.public_key)
    unsigned = httpx.Request("GET", "http://site/v1/heads")
    assert answer_signature(server, "GET", "/v1/heads", None, body) == {}
    assert not answer_signed_by(answered(unsigned, body, good), server.public_key)

"""federation._server in-process: the limits that need a held semaphore or a stalled body to show;
failures (a full store, anything that escapes a route) over real HTTP, in a server process or
uvicorn in a thread.

(The refusals of bad requests are tested against real `simnet serve` processes in tests/system.)
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

import federation._server
import knowledge
from federation import FederationError, ServerLimits, SimnetAuth, Site, SiteConfig
from federation._wire import PAGE_TYPE, encode_page
from knowledge import Identity, SiteHome, TrustPolicy


def run(coro):
    return asyncio.run(coro)


def test_a_site_needs_a_writable_knowledge_base(tmp_path):
    knowledge.open(tmp_path / "s.db", knowledge.Identity.generate()).close()
    with knowledge.open(tmp_path / "s.db") as readonly:
        with pytest.raises(
            FederationError, match="needs a knowledge base opened with the site's key"
        ):
            Site(SiteConfig(tmp_path), readonly)


def test_too_many_syncs_at_once_is_503_busy(make_site):
    a = make_site("a", limits=ServerLimits(max_concurrent_syncs=1, max_queued_syncs=0))
    a.kb.skills.publish("walk", "pick")

    async def go():
        async with a.client() as client:
            await a.site.syncs.acquire()  # one sync in progress
            try:
                busy = await client.post("/v1/sync", json={"heads": {}})
                push = await client.post(
                    "/v1/envelopes",
                    content=b"SNP1\x00\x00\x00\x00",
                    headers={"content-type": "application/x-simnet-envelopes"},
                )
            finally:
                a.site.syncs.release()
            after = await client.post("/v1/sync", json={"heads": {}})
        return busy, push, after

    busy, push, after = run(go())
    for response in (busy, push):
        assert response.status_code == 503
        assert response.json() == {
            "error": "busy",
            "detail": "too many syncs in progress; retry later",
        }
    assert after.status_code == 200 and after.content[:4] == b"SNP1"


def signed_header(site, body: bytes, path: str = "/v1/sync") -> str:
    """The Authorization header SimnetAuth would send for POST `path` with `body` (signed by the
    site itself)."""
    request = httpx.Request("POST", f"http://site{path}", content=body)
    return next(SimnetAuth(site.identity, site.key).auth_flow(request)).headers["authorization"]


def test_a_body_that_does_not_arrive_in_time_is_408(make_site):
    a = make_site("a", limits=ServerLimits(timeout_s=0.2))
    body = b'{"heads": {}}'

    async def stalled():
        yield body[:10]
        await asyncio.sleep(1.0)
        yield body[10:]

    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=a.app), base_url="http://site"
        ) as client:
            return await client.post(
                "/v1/sync", content=stalled(), headers={"authorization": signed_header(a, body)}
            )

    response = run(go())
    assert response.status_code == 408
    assert response.json()["error"] == "timeout" and "0.2 s" in response.json()["detail"]


def test_an_unsigned_body_is_refused_before_it_is_read(make_site):
    """Authentication looks only at the header: an unsigned (or untrusted) caller's body is never
    read."""
    a = make_site("a", limits=ServerLimits(timeout_s=5.0))
    sent = []

    async def endless():
        while True:
            sent.append(1)
            yield b"x" * 65536
            await asyncio.sleep(0)

    async def go():
        transport = httpx.ASGITransport(app=a.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://site") as client:
            unsigned = await client.post("/v1/envelopes", content=endless())
            stranger = knowledge.Identity.generate()
            request = httpx.Request("POST", "http://site/v1/envelopes", content=b"SNP1\0\0\0\0")
            header = next(SimnetAuth(stranger, a.key).auth_flow(request)).headers["authorization"]
            untrusted = await client.post(
                "/v1/envelopes", content=endless(), headers={"authorization": header}
            )
        return unsigned, untrusted

    unsigned, untrusted = run(go())
    assert unsigned.status_code == 401 and unsigned.json()["error"] == "unauthenticated"
    assert untrusted.status_code == 403 and "not trusted" in untrusted.json()["detail"]
    assert len(sent) <= 4  # the transport's first chunks at most; an endless body was not awaited


def test_an_unexpected_failure_is_a_json_500_and_the_app_keeps_serving(make_site, monkeypatch):
    a = make_site("a")

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    async def both():
        async with a.client() as client:
            monkeypatch.setattr(a.kb, "heads", broken)
            failed = await client.get("/v1/heads")
            monkeypatch.undo()
            return failed, await client.get("/v1/heads")

    failed, after = run(both())
    assert failed.status_code == 500
    assert failed.json() == {
        "error": "internal_error",
        "detail": "the site failed to handle this request (RuntimeError); it is logged there",
    }
    assert after.status_code == 200 and "heads" in after.json()


def test_health_needs_no_signature_and_names_the_site(make_site):
    a = make_site("north")

    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=a.app), base_url="http://site"
        ) as client:
            return await client.get("/v1/health")

    response = run(go())
    assert response.json() == {"status": "ok", "name": "north", "key": a.identity.public_key_hex}


REFUSALS = {
    # what the knowledge base raises -> (status, code)
    "not authorized": (
        knowledge.NotAuthorizedError("key 0123 lacks the revoke role at this site"),
        403,
        "not_authorized",
    ),
    "unknown skill": (knowledge.UnknownSkillError("no skill abab… here"), 404, "not_found"),
    "invalid record": (knowledge.RecordError("reason is too long"), 400, "bad_request"),
    "invalid envelope": (
        knowledge.EnvelopeError("bad_signature", "not signed by its author"),
        400,
        "bad_request",
    ),
    "clock skew": (knowledge.ClockSkewError("the clock is 10 minutes ahead"), 409, "conflict"),
    "blob": (knowledge.BlobError("blob abab… is not stored here"), 409, "conflict"),
    "any other refusal": (knowledge.SimnetError("not now"), 409, "conflict"),
    "a store that cannot be written": (knowledge.StoreError("disk I/O error"), 503, "unavailable"),
    "a read-only store": (
        knowledge.StoreReadOnlyError("cannot write the store s.db: its folder is read-only"),
        503,
        "unavailable",
    ),
    "a full disk": (
        knowledge.StoreFullError("cannot write the store s.db: the disk is full"),
        507,
        "insufficient_storage",
    ),
}
STORE_DETAILS = {
    503: "the site cannot write its store now ({}); it is logged there",
    507: "the site's disk is full: nothing of this request was stored; retry later",
}


@pytest.mark.parametrize("error, status, code", list(REFUSALS.values()), ids=list(REFUSALS))
def test_a_write_the_knowledge_base_refuses_is_a_4xx_naming_it(
    make_site, monkeypatch, caplog, error, status, code
):
    a = make_site("a")

    def refuse(*args, **kwargs):
        raise error

    async def go():
        async with a.client() as client:
            monkeypatch.setattr(a.kb, "revoke", refuse)
            refused = await client.post(
                "/v1/admin/revoke", json={"skill": "ab" * 32, "reason": "x"}
            )
            monkeypatch.undo()
            return refused, await client.post(
                "/v1/admin/revoke", json={"skill": "ab" * 32, "reason": "x"}
            )

    refused, after = run(go())
    assert refused.status_code == status and refused.json()["error"] == code, refused.text
    if status in STORE_DETAILS:  # the disk, not the caller: logged here, named there
        assert refused.json()["detail"] == STORE_DETAILS[status].format(type(error).__name__)
        assert f"the store failed: {error}" in caplog.text
    else:
        assert refused.json()["detail"] == (
            error.args[0] if isinstance(error, KeyError) else str(error)
        )
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert after.status_code == 200 and after.json() == {"revoked": "ab" * 32}


def test_a_sync_waits_its_turn_instead_of_being_refused(make_site):
    a = make_site("a", limits=ServerLimits(max_concurrent_syncs=1))
    a.kb.skills.publish("walk", "pick")

    async def go():
        async with a.client() as client:
            await a.site.syncs.acquire()  # one sync in progress
            waiting = asyncio.create_task(client.post("/v1/sync", json={"heads": {}}))
            await asyncio.sleep(0.2)
            queued = a.site.queued
            a.site.syncs.release()
            return queued, await waiting

    queued, answer = run(go())
    assert queued == 1
    assert answer.status_code == 200 and answer.content[:4] == b"SNP1"


def test_no_turn_within_the_queue_timeout_is_503_with_retry_after(make_site):
    a = make_site("a", limits=ServerLimits(max_concurrent_syncs=1, queue_timeout_s=0.2))

    async def go():
        async with a.client() as client:
            await a.site.syncs.acquire()
            try:
                return await client.post("/v1/sync", json={"heads": {}})
            finally:
                a.site.syncs.release()

    answer = run(go())
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"] == "busy" and "no turn within 0.2 s" in answer.json()["detail"]
    assert a.site.queued == 0


# --- failures over real HTTP ---------------------------------------------------------------------

FULL_STORE_SERVER = """
import signal, sys
from federation import _serve

opened = _serve.open_site


def open_site(home):  # the site's store may not grow (SQLITE_FULL) until SIGUSR1
    site = opened(home)
    db = site.kb._replica.store._db
    db.execute("PRAGMA max_page_count = %d" % db.execute("PRAGMA page_count").fetchone()[0])
    signal.signal(signal.SIGUSR1, lambda *_: db.execute("PRAGMA max_page_count = 1073741823"))
    return site


_serve.open_site = open_site
_serve.serve(sys.argv[1], gossip=False)
"""


def until(answer, timeout: float = 30.0):
    """`answer()` again until it is not None; that."""
    deadline = time.monotonic() + timeout
    while (result := answer()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


def test_a_site_whose_store_is_full_answers_a_push_507_and_keeps_serving(tmp_path, cli):
    """The real server, its store full as SQLite sees it (it may not grow: SQLITE_FULL): a push is
    answered 507 in JSON, nothing of it is stored, and the site goes on serving reads; once there is
    space the same push is taken, and the store holds it after the server stops."""
    home = SiteHome(tmp_path / "s")
    assert cli(home.path, "init", "--name", "s", "--listen", "127.0.0.1:0").code == 0
    peer = Identity.generate()
    home.policy.write_text(TrustPolicy.load(home.policy).with_root(peer.public_key).to_toml())
    with knowledge.open(":memory:", peer) as remote:
        for i in range(20):
            remote.skills.publish(f"remote-{i}", "pick", description="r" * 3000)
        page = encode_page(remote.envelopes_since({}))
    site_key = Identity.load(home.key).public_key
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", FULL_STORE_SERVER, str(home.path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def served() -> str | None:
            assert process.poll() is None, log.read_text()
            try:
                url = json.loads((home.path / "serve.json").read_text())["url"]
                return url if httpx.get(f"{url}/v1/health").status_code == 200 else None
            except (OSError, ValueError, KeyError, httpx.HTTPError):
                return None

        url = until(served)
        with httpx.Client(base_url=url, auth=SimnetAuth(peer, site_key), timeout=30) as client:

            def push() -> httpx.Response:
                return client.post(
                    "/v1/envelopes", content=page, headers={"content-type": PAGE_TYPE}
                )

            full = push()
            assert full.status_code == 507, full.text
            assert full.json() == {"error": "insufficient_storage", "detail": STORE_DETAILS[507]}
            heads = client.get("/v1/heads")  # reads go on, and show nothing of the push
            assert heads.status_code == 200 and peer.public_key_hex not in heads.json()["heads"]
            assert client.get("/v1/status").json()["skills"] == 0
            assert process.poll() is None and httpx.get(f"{url}/v1/health").status_code == 200
            process.send_signal(signal.SIGUSR1)  # space again

            def taken_once_there_is_space() -> httpx.Response | None:
                answer = push()
                return None if answer.status_code == 507 else answer

            taken = until(taken_once_there_is_space)
            assert taken.status_code == 200 and taken.json()["accepted"] == 20, taken.text
            assert taken.json()["heads"][peer.public_key_hex] == 20
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    with knowledge.open(home.store) as kb:
        assert kb.heads()[peer.public_key_hex].seq == 20 and len(kb.skills.list()) == 20
    text = log.read_text()
    assert f"POST /v1/envelopes: the store failed: cannot write the store {home.store}" in text
    assert "the disk is full" in text and "Traceback" not in text


class Panic(BaseException):
    """As pyo3's PanicException: not an Exception, so `except Exception` does not catch it."""


def test_whatever_escapes_a_route_is_a_json_500_and_the_server_keeps_serving(
    make_site, serve_app, monkeypatch, caplog
):
    """Faults injected under real uvicorn: a panic in an endpoint, an exception in a route outside
    `endpoint` (the OpenAPI description). Each is logged and answered as JSON 500, never as
    Starlette's or uvicorn's plain-text page; the next requests are served."""
    a = make_site("a")
    url = serve_app(a.app)

    def panic(*args, **kwargs):
        raise Panic("called `Option::unwrap()` on a `None` value")

    def broken(routes):
        raise RuntimeError("the description failed")

    with httpx.Client(base_url=url, auth=SimnetAuth(a.identity, a.key), timeout=30) as client:
        monkeypatch.setattr(a.kb, "heads", panic)
        monkeypatch.setattr(federation._server, "describe", broken)
        failed = {
            "Panic": client.get("/v1/heads"),
            "RuntimeError": client.get("/v1/openapi.json"),
        }
        monkeypatch.undo()
        after = [client.get("/v1/heads"), client.get("/v1/openapi.json")]
    for name, answer in failed.items():
        assert answer.status_code == 500, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {
            "error": "internal_error",
            "detail": f"the site failed to handle this request ({name}); it is logged there",
        }
    assert [answer.status_code for answer in after] == [200, 200]
    assert "GET /v1/heads failed: Panic: called `Option::unwrap()`" in caplog.text
    assert "GET /v1/openapi.json failed: RuntimeError: the description failed" in caplog.text

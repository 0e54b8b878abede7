"""federation._server in-process: the limits that need a held semaphore or a stalled body to show.

(The refusals of bad requests are tested against real `simnet serve` processes in tests/system.)
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

import knowledge
from federation import FederationError, ServerLimits, Site, SiteConfig


def run(coro):
    return asyncio.run(coro)


def test_a_site_needs_a_writable_knowledge_base(tmp_path):
    knowledge.open(tmp_path / "s.db", knowledge.Identity.generate()).close()
    with knowledge.open(tmp_path / "s.db") as readonly:
        with pytest.raises(FederationError, match="needs a knowledge base opened with the site's key"):
            Site(SiteConfig(tmp_path), readonly)


def test_too_many_syncs_at_once_is_503_busy(make_site):
    a = make_site("a", limits=ServerLimits(max_concurrent_syncs=1))
    a.kb.skills.publish("walk", "pick")

    async def go():
        async with a.client() as client:
            await a.site.syncs.acquire()  # one sync in progress
            try:
                busy = await client.post("/v1/sync", json={"heads": {}})
                push = await client.post("/v1/envelopes", content=b"SNP1\x00\x00\x00\x00",
                                         headers={"content-type": "application/x-simnet-envelopes"})
            finally:
                a.site.syncs.release()
            after = await client.post("/v1/sync", json={"heads": {}})
        return busy, push, after

    busy, push, after = run(go())
    for response in (busy, push):
        assert response.status_code == 503
        assert response.json() == {"error": "busy", "detail": "too many syncs in progress; retry later"}
    assert after.status_code == 200 and after.content[:4] == b"SNP1"


def test_a_body_that_does_not_arrive_in_time_is_408(make_site):
    a = make_site("a", limits=ServerLimits(timeout_s=0.2))

    async def stalled():
        yield b'{"heads": '
        await asyncio.sleep(1.0)
        yield b"{}}"

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a.app), base_url="http://site") as client:
            return await client.post("/v1/sync", content=stalled())  # the body is read before authentication

    response = run(go())
    assert response.status_code == 408
    assert response.json()["error"] == "timeout" and "0.2 s" in response.json()["detail"]


def test_health_needs_no_signature_and_names_the_site(make_site):
    a = make_site("north")

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a.app), base_url="http://site") as client:
            return await client.get("/v1/health")

    response = run(go())
    assert response.json() == {"status": "ok", "name": "north", "key": a.identity.public_key_hex}

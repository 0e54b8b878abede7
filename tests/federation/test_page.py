"""The status page (`GET /status`) over the real app: what it shows, that it escapes what writers
wrote, and that only this machine may see it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx

from federation import PAGE_TYPE, encode_page
from knowledge import ActivationPolicy


def get(site, path: str, client: tuple[str, int] = ("127.0.0.1", 5000)) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=site.app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            return await http.get(path)

    return asyncio.run(go())


def test_the_page_shows_skills_states_forks_and_refusals(make_site):
    a = make_site("a")
    b = make_site("b", trust=(a.key,))
    b.kb.set_policy(replace(b.kb.policy, activation=ActivationPolicy(rerunnable_only=False)))
    certified = a.kb.skills.publish("pick-mug", "pick")  # and a certificate typed in
    a.kb.certificates.add(certified.id, branches=256, successes=256)
    revoked = a.kb.skills.publish("drops-mugs", "pick")
    a.kb.revoke(revoked.id, "falls over")
    raws = a.kb.envelopes_since({})

    async def push():
        async with b.client(a.identity) as client:
            forged = raws[0][:-1] + bytes([raws[0][-1] ^ 1])
            return await client.post(
                "/v1/envelopes",
                content=encode_page([forged, *raws]),
                headers={"content-type": PAGE_TYPE},
            )

    assert asyncio.run(push()).status_code == 200
    page = get(b, "/status")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "<h1>b</h1>" in html
    assert f"<code>{certified.id[:16]}</code>" in html and "class='active'>active<" in html
    assert "class='revoked'>revoked<" in html
    assert "bad_signature" in html and "push" in html


def test_what_writers_wrote_is_escaped(make_site):
    a = make_site("a")
    a.kb.skills.publish("<script>alert('x')</script>", "pick")
    html = get(a, "/status").text
    assert "<script>" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html


def test_only_this_machine_may_see_the_page(make_site):
    a = make_site("a")
    refused = get(a, "/status", client=("10.0.0.5", 5000))
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert "SSH tunnel" in refused.json()["detail"]

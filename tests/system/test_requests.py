"""Bad requests against real `simnet serve` processes: each refused with the right status and a JSON
{"error", "detail"} body, and nothing changes (heads and status compared before and after).

Also: private maps are withheld from sites without read rights; blob corruption in transit is
caught; /v1/openapi.json describes every endpoint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import federation
import knowledge
from federation import PAGE_TYPE, PeerConfig, PeerError, SiteConfig, decode_page, encode_page
from federation._auth import signed_message
from federation._config import PrivateMaps
from knowledge import Identity, TrustPolicy
from knowledge._envelope import decode as decode_envelope

JSON = "application/json"
ENDPOINTS = {  # every route the server serves, and its methods
    "/v1/health": {"get"},
    "/v1/ready": {"get"},
    "/metrics": {"get"},
    "/status": {"get"},
    "/v1/sync": {"post"},
    "/v1/heads": {"get"},
    "/v1/envelopes": {"post"},
    "/v1/blobs/{hash}": {"get", "put"},
    "/v1/status": {"get"},
    "/v1/admin/sync": {"post"},
    "/v1/admin/revoke": {"post"},
    "/v1/admin/delegate": {"post"},
    "/v1/admin/revoke-key": {"post"},
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def authorization(
    identity: Identity,
    audience: bytes,
    method: str,
    target: str,
    body: bytes,
    *,
    ts: int | None = None,
    nonce: str | None = None,
    claimed: bytes | None = None,
) -> str:
    ts = now_ms() if ts is None else ts
    nonce = nonce or os.urandom(16).hex()
    sig = identity.sign(signed_message(method, target, body, ts, nonce, audience))
    return (
        f"Simnet key={(claimed or identity.public_key).hex()}, ts={ts}, "
        f"nonce={nonce}, sig={sig.hex()}"
    )


def call(
    ps,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    who: Identity | None | str = "peer",
    content_type: str | None = JSON,
    signed_method: str | None = None,
    signed_path: str | None = None,
    signed_body: bytes | None = None,
    ts_offset_ms: int = 0,
    audience: bytes | None = None,
    claimed: bytes | None = None,
    raw_auth: str | None = None,
    stream: bool = False,
) -> httpx.Response:
    """One request to the prepared site, signed as `who` ("peer", "site", "device", an Identity, or
    None for unsigned), optionally signed over something other than what is sent."""
    identity = {"peer": ps.peer, "site": ps.site.key, "device": ps.device.identity}.get(who, who)
    headers = {} if content_type is None else {"content-type": content_type}
    if raw_auth is not None:
        headers["authorization"] = raw_auth
    elif identity is not None:
        headers["authorization"] = authorization(
            identity,
            audience or ps.site.key.public_key,
            signed_method or method,
            signed_path or path,
            body if signed_body is None else signed_body,
            ts=now_ms() + ts_offset_ms,
            claimed=claimed,
        )
    content = iter([body[i : i + 16384] for i in range(0, len(body), 16384)]) if stream else body
    with httpx.Client(base_url=ps.site.url, timeout=30) as client:
        return client.request(method, path, content=content, headers=headers)


def assert_refused(response: httpx.Response, status: int, code: str | None) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith(JSON), response.headers
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert isinstance(body["error"], str) and isinstance(body["detail"], str) and body["detail"], (
        body
    )
    if code is not None:
        assert body["error"] == code, body
    return body


def sync_body(heads: object = None, limit: object = 10) -> bytes:
    return json.dumps({"heads": {} if heads is None else heads, "limit": limit}).encode()


def skill_id(ps) -> str:
    return next(s.id for s in ps.device.skills.list())


Case = Callable[[object], httpx.Response]

CASES: dict[str, tuple[Case, int, str | None]] = {
    # --- not authenticated: 401 ---
    "unsigned push": (
        lambda ps: call(ps, "POST", "/v1/envelopes", ps.fresh(), who=None, content_type=PAGE_TYPE),
        401,
        "unauthenticated",
    ),
    "unsigned sync": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(), who=None),
        401,
        "unauthenticated",
    ),
    "unsigned heads": (lambda ps: call(ps, "GET", "/v1/heads", who=None), 401, "unauthenticated"),
    "unsigned status": (lambda ps: call(ps, "GET", "/v1/status", who=None), 401, "unauthenticated"),
    "unsigned admin": (
        lambda ps: call(
            ps, "POST", "/v1/admin/revoke", b'{"skill": "%s"}' % skill_id(ps).encode(), who=None
        ),
        401,
        "unauthenticated",
    ),
    "forged: signed by another key in the peer's name": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/envelopes",
            ps.fresh(),
            who=Identity.generate(),
            claimed=ps.peer.public_key,
            content_type=PAGE_TYPE,
        ),
        401,
        "unauthenticated",
    ),
    "forged: the site's own key claimed on an admin call": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/admin/revoke",
            b'{"skill": "%s"}' % skill_id(ps).encode(),
            who=Identity.generate(),
            claimed=ps.site.key.public_key,
        ),
        401,
        "unauthenticated",
    ),
    "altered body": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/envelopes",
            ps.fresh(),
            signed_body=encode_page([]),
            content_type=PAGE_TYPE,
        ),
        401,
        "unauthenticated",
    ),
    "altered path": (
        lambda ps: call(ps, "GET", "/v1/status", signed_path="/v1/health"),
        401,
        "unauthenticated",
    ),
    "altered method": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(), signed_method="GET"),
        401,
        "unauthenticated",
    ),
    "stale timestamp": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", ps.fresh(), ts_offset_ms=-120_000, content_type=PAGE_TYPE
        ),
        401,
        "unauthenticated",
    ),
    "future timestamp": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", ps.fresh(), ts_offset_ms=120_000, content_type=PAGE_TYPE
        ),
        401,
        "unauthenticated",
    ),
    "wrong audience": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/envelopes",
            ps.fresh(),
            audience=Identity.generate().public_key,
            content_type=PAGE_TYPE,
        ),
        401,
        "unauthenticated",
    ),
    "malformed authorization": (
        lambda ps: call(ps, "GET", "/v1/heads", raw_auth="Simnet key=zz, ts=1"),
        401,
        "unauthenticated",
    ),
    "bearer token": (
        lambda ps: call(ps, "GET", "/v1/heads", raw_auth="Bearer abc"),
        401,
        "unauthenticated",
    ),
    # --- authenticated but not allowed: 403 ---
    "untrusted caller pushes": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", ps.fresh(), who=Identity.generate(), content_type=PAGE_TYPE
        ),
        403,
        "forbidden",
    ),
    "untrusted caller syncs": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(), who=Identity.generate()),
        403,
        "forbidden",
    ),
    "untrusted caller reads heads": (
        lambda ps: call(ps, "GET", "/v1/heads", who=Identity.generate()),
        403,
        "forbidden",
    ),
    "untrusted caller reads status": (
        lambda ps: call(ps, "GET", "/v1/status", who=Identity.generate()),
        403,
        "forbidden",
    ),
    "untrusted caller fetches a blob": (
        lambda ps: call(ps, "GET", f"/v1/blobs/{ps.blob}", who=Identity.generate()),
        403,
        "forbidden",
    ),
    "peer on admin sync": (lambda ps: call(ps, "POST", "/v1/admin/sync", b"{}"), 403, "forbidden"),
    "peer on admin revoke": (
        lambda ps: call(ps, "POST", "/v1/admin/revoke", b'{"skill": "%s"}' % skill_id(ps).encode()),
        403,
        "forbidden",
    ),
    "peer on admin delegate": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/admin/delegate",
            b'{"device": "%s", "roles": ["publish"]}' % Identity.generate().public_key_hex.encode(),
        ),
        403,
        "forbidden",
    ),
    "peer on admin revoke-key": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/admin/revoke-key",
            b'{"device": "%s", "last_seq": 0}' % ps.device.identity.public_key_hex.encode(),
        ),
        403,
        "forbidden",
    ),
    "device on admin revoke": (
        lambda ps: call(
            ps, "POST", "/v1/admin/revoke", b'{"skill": "%s"}' % skill_id(ps).encode(), who="device"
        ),
        403,
        "forbidden",
    ),
    # --- over the limits: 413 ---
    "push body over max_body_bytes": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/envelopes",
            ps.fresh() + b"\0" * ps.limits.max_body_bytes,
            content_type=PAGE_TYPE,
        ),
        413,
        "too_large",
    ),
    "sync body over max_body_bytes": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body() + b" " * ps.limits.max_body_bytes),
        413,
        "too_large",
    ),
    "chunked body over max_body_bytes": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/envelopes",
            ps.fresh() + b"\0" * ps.limits.max_body_bytes,
            content_type=PAGE_TYPE,
            stream=True,
        ),
        413,
        "too_large",
    ),
    "page over max_page": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", ps.fresh(ps.limits.max_page + 1), content_type=PAGE_TYPE
        ),
        413,
        "too_large",
    ),
    "page announcing more envelopes than max_page": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", b"SNP1\xff\xff\xff\xff", content_type=PAGE_TYPE
        ),
        413,
        "too_large",
    ),
    # --- malformed: 400 ---
    "sync body not JSON": (lambda ps: call(ps, "POST", "/v1/sync", b"{heads"), 400, "bad_request"),
    "sync body not UTF-8": (
        lambda ps: call(ps, "POST", "/v1/sync", b"\xff\xfe{}"),
        400,
        "bad_request",
    ),
    "sync body a JSON array": (lambda ps: call(ps, "POST", "/v1/sync", b"[]"), 400, "bad_request"),
    "sync body empty": (lambda ps: call(ps, "POST", "/v1/sync", b""), 400, "bad_request"),
    "heads not an object": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(heads=[1, 2])),
        400,
        "bad_request",
    ),
    "heads key not hex": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(heads={"zz" * 32: 1})),
        400,
        "bad_request",
    ),
    "heads seq negative": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(heads={"ab" * 32: -1})),
        400,
        "bad_request",
    ),
    "heads seq a string": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(heads={"ab" * 32: "3"})),
        400,
        "bad_request",
    ),
    "heads seq too large": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(heads={"ab" * 32: 2**63})),
        400,
        "bad_request",
    ),
    "equivocators not a list": (
        lambda ps: call(ps, "POST", "/v1/sync", b'{"heads": {}, "equivocators": "all"}'),
        400,
        "bad_request",
    ),
    "equivocator not hex": (
        lambda ps: call(ps, "POST", "/v1/sync", b'{"heads": {}, "equivocators": ["zz"]}'),
        400,
        "bad_request",
    ),
    "limit zero": (lambda ps: call(ps, "POST", "/v1/sync", sync_body(limit=0)), 400, "bad_request"),
    "limit not a number": (
        lambda ps: call(ps, "POST", "/v1/sync", sync_body(limit="all")),
        400,
        "bad_request",
    ),
    "page with a bad magic": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", b"SNP2" + ps.fresh()[4:], content_type=PAGE_TYPE
        ),
        400,
        "bad_request",
    ),
    "page cut short": (
        lambda ps: call(ps, "POST", "/v1/envelopes", ps.fresh(2)[:-10], content_type=PAGE_TYPE),
        400,
        "bad_request",
    ),
    "page with trailing bytes": (
        lambda ps: call(ps, "POST", "/v1/envelopes", ps.fresh() + b"x", content_type=PAGE_TYPE),
        400,
        "bad_request",
    ),
    "page as JSON": (
        lambda ps: call(ps, "POST", "/v1/envelopes", b'{"envelopes": []}', content_type=PAGE_TYPE),
        400,
        "bad_request",
    ),
    "blob hash not hex": (lambda ps: call(ps, "GET", "/v1/blobs/" + "Z" * 64), 400, "bad_request"),
    "blob hash upper-case": (
        lambda ps: call(ps, "GET", "/v1/blobs/" + ps.blob.upper()),
        400,
        "bad_request",
    ),
    "admin revoke without a skill": (
        lambda ps: call(ps, "POST", "/v1/admin/revoke", b'{"reason": "x"}', who="site"),
        400,
        "bad_request",
    ),
    "admin revoke with a bad skill id": (
        lambda ps: call(ps, "POST", "/v1/admin/revoke", b'{"skill": "abc"}', who="site"),
        400,
        "bad_request",
    ),
    "admin delegate with an unknown role": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/admin/delegate",
            b'{"device": "%s", "roles": ["fly"]}' % Identity.generate().public_key_hex.encode(),
            who="site",
        ),
        400,
        "bad_request",
    ),
    "admin delegate with roles not a list": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/admin/delegate",
            b'{"device": "%s", "roles": "publish"}' % Identity.generate().public_key_hex.encode(),
            who="site",
        ),
        400,
        "bad_request",
    ),
    "admin revoke-key without last_seq": (
        lambda ps: call(
            ps,
            "POST",
            "/v1/admin/revoke-key",
            b'{"device": "%s"}' % ps.device.identity.public_key_hex.encode(),
            who="site",
        ),
        400,
        "bad_request",
    ),
    "admin body not JSON": (
        lambda ps: call(ps, "POST", "/v1/admin/delegate", b"device=x", who="site"),
        400,
        "bad_request",
    ),
    # --- wrong content type: 415 (its error code is checked separately) ---
    "push as application/json": (
        lambda ps: call(ps, "POST", "/v1/envelopes", ps.fresh(), content_type=JSON),
        415,
        None,
    ),
    "push without a content type": (
        lambda ps: call(ps, "POST", "/v1/envelopes", ps.fresh(), content_type=None),
        415,
        None,
    ),
    "push as octet-stream": (
        lambda ps: call(
            ps, "POST", "/v1/envelopes", ps.fresh(), content_type="application/octet-stream"
        ),
        415,
        None,
    ),
    # --- not here: 404 ---
    "blob not stored": (lambda ps: call(ps, "GET", "/v1/blobs/" + "0" * 64), 404, "not_found"),
}


@pytest.mark.parametrize("send, status, code", list(CASES.values()), ids=list(CASES))
def test_refused_with_status_and_json_error_and_nothing_changes(prepared_site, send, status, code):
    ps = prepared_site
    before = ps.snapshot()
    assert_refused(send(ps), status, code)
    assert ps.snapshot() == before
    assert ps.site.healthy()


def test_the_oracle_sees_an_accepted_push(prepared_site):
    """The same kind of request, valid, does change the site: the refusals above are the server's
    doing."""
    ps = prepared_site
    heads, _ = ps.snapshot()
    response = call(ps, "POST", "/v1/envelopes", ps.fresh(2), content_type=PAGE_TYPE)
    assert response.status_code == 200 and response.json()["accepted"] == 2
    me = ps.device.identity.public_key_hex
    assert ps.site.heads()[me] == heads[me] + 2


def test_wrong_content_type_is_not_reported_as_too_large(prepared_site):
    body = assert_refused(
        call(prepared_site, "POST", "/v1/envelopes", prepared_site.fresh(), content_type=JSON),
        415,
        None,
    )
    assert PAGE_TYPE in body["detail"]
    assert body["error"] != "too_large", (
        "a 415 is labelled 'too_large' (federation/_server.py maps every non-400 WireError so)"
    )


def test_content_type_parameters_are_accepted(prepared_site):
    response = call(
        prepared_site,
        "POST",
        "/v1/envelopes",
        prepared_site.held_page(),
        content_type=f"{PAGE_TYPE}; charset=binary",
    )
    assert response.status_code == 200 and response.json()["accepted"] == 0


def test_replayed_push_is_refused(prepared_site):
    ps = prepared_site
    body = ps.fresh(1)
    headers = {
        "content-type": PAGE_TYPE,
        "authorization": authorization(
            ps.peer, ps.site.key.public_key, "POST", "/v1/envelopes", body
        ),
    }
    with httpx.Client(base_url=ps.site.url, timeout=30) as client:
        first = client.post("/v1/envelopes", content=body, headers=headers)
        assert first.status_code == 200 and first.json()["accepted"] == 1
        before = ps.snapshot()
        again = client.post("/v1/envelopes", content=body, headers=headers)
    assert "replayed" in assert_refused(again, 401, "unauthenticated")["detail"]
    assert ps.snapshot() == before


def test_replayed_read_is_refused(prepared_site):
    ps = prepared_site
    headers = {
        "authorization": authorization(ps.peer, ps.site.key.public_key, "GET", "/v1/heads", b"")
    }
    with httpx.Client(base_url=ps.site.url, timeout=30) as client:
        assert client.get("/v1/heads", headers=headers).status_code == 200
        assert (
            "replayed"
            in assert_refused(client.get("/v1/heads", headers=headers), 401, "unauthenticated")[
                "detail"
            ]
        )


def test_refusals_name_the_problem(prepared_site):
    ps = prepared_site
    details = {
        "stale": call(ps, "GET", "/v1/heads", ts_offset_ms=-120_000).json()["detail"],
        "unsigned": call(ps, "GET", "/v1/heads", who=None).json()["detail"],
        "untrusted": call(ps, "GET", "/v1/heads", who=Identity.generate()).json()["detail"],
        "admin": call(ps, "POST", "/v1/admin/sync", b"{}").json()["detail"],
        "page": call(
            ps, "POST", "/v1/envelopes", ps.fresh(ps.limits.max_page + 1), content_type=PAGE_TYPE
        ).json()["detail"],
        "body": call(ps, "POST", "/v1/sync", b" " * (ps.limits.max_body_bytes + 1)).json()[
            "detail"
        ],
    }
    assert "timestamp" in details["stale"]
    assert "not signed" in details["unsigned"]
    assert "not trusted" in details["untrusted"]
    assert "own key" in details["admin"]
    assert f"at most {ps.limits.max_page}" in details["page"]
    assert f"limit of {ps.limits.max_body_bytes}" in details["body"]


def test_deeply_nested_json_is_a_400_not_a_500(prepared_site):
    ps = prepared_site
    before = ps.snapshot()
    for body in (b"[" * 5000 + b"]" * 5000, b'{"heads": ' + b"[" * 5000 + b"]" * 5000 + b"}"):
        assert_refused(call(ps, "POST", "/v1/sync", body), 400, "bad_request")
    assert_refused(
        call(ps, "POST", "/v1/admin/revoke", b"[" * 5000 + b"]" * 5000, who="site"),
        400,
        "bad_request",
    )
    assert ps.snapshot() == before and ps.site.healthy()


def in_parallel(*calls) -> list:
    """Run slow independent steps (site inits, server starts) at once; re-raise the first
    failure."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def trust_roots(site, *keys: bytes) -> None:
    policy = TrustPolicy.load(site.home / "trust.toml")
    for key in keys:
        policy = policy.with_root(key)
    (site.home / "trust.toml").write_text(policy.to_toml())


def test_a_private_map_is_never_served_to_a_site_without_read_rights(fleet, early_device):
    a = fleet.add("a", interval_s=3600)
    reader, nosy = Identity.generate(), Identity.generate()
    config = SiteConfig.load(a.home)
    config.private = [PrivateMaps(("secure",), (reader.public_key,))]
    config.save()
    trust_roots(a, reader.public_key, nosy.public_key)
    public, secret = early_device(a), early_device(a)  # the private map gets a dedicated device key
    a.start()
    root = a.key.public_key
    public.maps["lobby"].observe((0, 0), "door", 0.5)
    secret.maps["lobby"].observe(
        (5, 5), "stairs", 0.5
    )  # public, before the device writes anything private
    federation.sync_with(public, a.url, root)
    federation.sync_with(secret, a.url, root)
    nosy_kb = knowledge.open(":memory:", nosy, policy=TrustPolicy().with_root(root))
    federation.sync_with(nosy_kb, a.url, root)  # nosy holds the secret device's public beginnings
    secret_hex, public_hex = secret.identity.public_key_hex, public.identity.public_key_hex
    early = nosy_kb.heads()[secret_hex].seq

    secret.maps["secure"].observe((7, 7), "vault", 0.9)
    federation.sync_with(secret, a.url, root)
    assert a.heads(reader)[secret_hex] == secret.heads()[secret_hex].seq  # the site holds it all

    for who, allowed in ((reader, True), (nosy, False)):
        heads = a.heads(who)
        assert public_hex in heads and (secret_hex in heads) == allowed
        for their in ({}, {secret_hex: 0}, {secret_hex: early}):
            with a.client(who) as client:
                response = client.post("/v1/sync", json={"heads": their, "limit": 1000})
            assert response.status_code == 200
            authors = {
                decode_envelope(raw, max_bytes=1 << 26).author.hex()
                for raw in decode_page(response.content, max_count=1000, max_envelope_bytes=1 << 26)
            }
            assert (secret_hex in authors) == allowed, (who, their)
    reader_kb = knowledge.open(":memory:", reader, policy=TrustPolicy().with_root(root))
    federation.sync_with(reader_kb, a.url, root)
    federation.sync_with(nosy_kb, a.url, root)
    assert reader_kb.maps["secure"].get((7, 7)).value == "vault"
    assert nosy_kb.maps["secure"].get((7, 7)) is None and nosy_kb.heads()[secret_hex].seq == early
    assert nosy_kb.maps["lobby"].get((0, 0)).value == "door"
    reader_kb.close()
    nosy_kb.close()


def test_a_private_map_is_not_pushed_to_a_peer_without_read_rights(fleet, early_device):
    """The site's own sync round must apply its read rules too: pushing a feed is serving it."""
    a, b = in_parallel(
        lambda: fleet.add("a", interval_s=3600), lambda: fleet.add("b", interval_s=3600)
    )
    config = SiteConfig.load(a.home)
    config.private = [PrivateMaps(("secure",), ())]  # no other site may read it
    config.peers = [PeerConfig("b", b.url, b.key.public_key)]
    config.save()
    trust_roots(a, b.key.public_key)
    trust_roots(b, a.key.public_key)
    public, secret = early_device(a), early_device(a)
    in_parallel(a.start, b.start)
    root = a.key.public_key
    public.maps["lobby"].observe((0, 0), "door", 0.5)
    secret.maps["secure"].observe((7, 7), "vault", 0.9)
    for robot in (public, secret):
        federation.sync_with(robot, a.url, root)
    with (
        a.client() as client
    ):  # what `simnet sync b` asks a's server: a round with b, pull then push
        [report] = (
            client.post("/v1/admin/sync", json={"peer": "b"}).raise_for_status().json()["reports"]
        )
    assert report["ok"], report
    heads_at_b = b.heads()
    assert public.identity.public_key_hex in heads_at_b  # the round did push a's news
    assert secret.identity.public_key_hex not in heads_at_b, "a pushed its private map's feed to b"


class Corrupting(httpx.HTTPTransport):
    """Between a client and a real server: flips one byte of every blob body in transit."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = response.read()
        if request.url.path.startswith("/v1/blobs/") and response.status_code == 200:
            body = body[:100] + bytes([body[100] ^ 0x01]) + body[101:]
        headers = [
            (k, v)
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
        ]
        return httpx.Response(response.status_code, headers=headers, content=body, request=request)


def test_blob_corruption_in_transit_is_detected(prepared_site):
    ps = prepared_site
    with knowledge.open(":memory:", ps.peer) as kb:
        with pytest.raises(PeerError, match="is corrupt"):
            federation.sync_with(
                kb, ps.site.url, ps.site.key.public_key, blobs=[ps.blob], transport=Corrupting()
            )
        assert ps.blob not in kb.blobs
        report = federation.sync_with(kb, ps.site.url, ps.site.key.public_key, blobs=[ps.blob])
        assert report.blobs == 1 and kb.blobs.get(ps.blob) == ps.blob_data


def test_openapi_lists_every_endpoint(prepared_site):
    response = httpx.get(f"{prepared_site.site.url}/v1/openapi.json", timeout=30)
    assert response.status_code == 200, response.text[:300]
    paths = response.json()["paths"]
    assert {path: set(ops) for path, ops in paths.items()} == ENDPOINTS


def test_openapi_needs_nothing_beyond_the_server_extra():
    """/v1/openapi.json builds its schema with Starlette's SchemaGenerator, which parses the
    endpoint docstrings with PyYAML: without it the endpoint answers 500. PyYAML must then come with
    Starlette, in the server extra, not from something another extra (ray) happens to pull in."""
    from importlib.metadata import requires

    def names(extra: str) -> set[str]:
        marker = f"extra == '{extra}'"
        return {
            r.split(";")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
            for r in requires("simnet-fleet") or ()
            if marker in r
        }

    server = names("server")
    assert {"starlette", "uvicorn", "pyyaml"} <= server, sorted(server)


def test_unknown_routes_and_methods_answer_json_errors(prepared_site):
    with prepared_site.site.client() as client:
        assert_refused(client.get("/v1/nothing-here"), 404, None)
        assert_refused(client.get("/v1/sync"), 405, None)
        assert_refused(client.delete("/v1/heads"), 405, None)


def test_admin_revoke_key_refuses_a_negative_seq(prepared_site):
    device = Identity.generate().public_key_hex
    before = prepared_site.site.heads()
    with prepared_site.site.client() as client:
        response = client.post("/v1/admin/revoke-key", json={"device": device, "last_seq": -1})
    assert_refused(response, 400, "bad_request")
    assert prepared_site.site.heads() == before


def test_admin_revoke_with_an_oversized_reason_is_a_4xx(prepared_site):
    """A reason that makes the revocation envelope larger than peers accept (1 MiB) must be refused
    as input, even though the body itself is within the site's limit."""
    body = json.dumps({"skill": "ab" * 32, "reason": "x" * (1200 << 10)}).encode()
    assert len(body) < prepared_site.limits.max_body_bytes
    before = prepared_site.site.heads()
    with prepared_site.site.client() as client:
        response = client.post("/v1/admin/revoke", content=body, headers={"content-type": JSON})
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:200])
    assert_refused(response, response.status_code, None)
    assert prepared_site.site.heads() == before and prepared_site.site.healthy()

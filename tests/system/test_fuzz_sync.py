"""Hypothesis fuzzing of the sync endpoints' body parsers against a real `simnet serve` process.

Random bytes, mutated valid JSON bodies, mutated valid pages, random headers and content types.
Every answer is a 2xx or a 4xx with a JSON error (never a 5xx), the server keeps serving, and
nothing changes: every page sent is built from envelopes the site already holds, so no fuzzed
request carries a valid new envelope (the last test shows that one that does is seen by the same
oracle).
"""

from __future__ import annotations

import json
import struct

import httpx
import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from federation import PAGE_TYPE, SimnetAuth, decode_page

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
U32 = struct.Struct(">I")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=70), children, max_size=4)
    ),
    max_leaves=12,
)
printable = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
header_values = st.text(printable, min_size=1, max_size=60)
header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True).filter(
    lambda n: (
        n.lower()
        not in {
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "expect",
            "upgrade",
            "te",
            "trailer",
            "keep-alive",
            "authorization",
            "content-type",
        }
    )
)
content_types = st.one_of(
    st.sampled_from(
        [
            PAGE_TYPE,
            "application/json",
            "application/octet-stream",
            "text/plain",
            f"{PAGE_TYPE}; x=1",
            PAGE_TYPE.upper(),
            f" {PAGE_TYPE}",
            "multipart/form-data; boundary=x",
            "",
        ]
    ),
    header_values,
)


@pytest.fixture(scope="module")
def fuzz(prepared_site):
    """(prepared site, a client signing as its trusted peer, a client that does not sign).

    One connection per request: on a kept-alive connection every answer from `simnet serve` waits
    ~40 ms for a delayed ACK (its accepted sockets lack TCP_NODELAY), which would make fuzzing 40x
    slower.
    """
    ps = prepared_site
    fresh = httpx.Limits(max_keepalive_connections=0)
    with (
        httpx.Client(
            base_url=ps.site.url,
            timeout=30,
            limits=fresh,
            auth=SimnetAuth(ps.peer, ps.site.key.public_key),
        ) as signed,
        httpx.Client(base_url=ps.site.url, timeout=30, limits=fresh) as unsigned,
    ):
        yield ps, signed, unsigned


def snapshot(ps, client: httpx.Client) -> tuple[dict, dict]:
    return client.get("/v1/heads").json(), client.get("/v1/status").json()


def sent(
    client: httpx.Client, method: str, path: str, body: bytes, headers: dict
) -> httpx.Response:
    try:
        return client.request(method, path, content=body, headers=headers)
    except httpx.LocalProtocolError:
        reject()  # the client itself refused to send this (an illegal header): not a server test


def check(fuzz, response: httpx.Response, before) -> None:
    ps, signed, _ = fuzz
    event(
        f"{response.status_code} "
        f"{response.json().get('error', '') if response.status_code >= 400 else ''}"
        if response.headers.get("content-type", "").startswith("application/json")
        else str(response.status_code)
    )
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error", "detail"} and body["detail"], body
    assert signed.get("/v1/health").status_code == 200
    assert snapshot(ps, signed) == before
    assert ps.site.process.poll() is None


SYNC_PATHS = ["/v1/sync", "/v1/envelopes"]


@settings(FUZZ, max_examples=80)
@given(path=st.sampled_from(SYNC_PATHS), body=st.binary(max_size=3000))
def test_random_bytes(fuzz, path, body):
    ps, signed, _ = fuzz
    before = snapshot(ps, signed)
    content_type = PAGE_TYPE if path == "/v1/envelopes" else "application/json"
    check(fuzz, sent(signed, "POST", path, body, {"content-type": content_type}), before)


@st.composite
def mutated_sync_bodies(draw, heads: dict) -> bytes:
    body: object = {"heads": dict(heads), "limit": draw(st.integers(1, 30))}
    how = draw(st.sampled_from(["heads", "limit", "entry", "whole", "extra", "bytes"]))
    if how == "heads":
        body["heads"] = draw(json_values)
    elif how == "limit":
        body["limit"] = draw(json_values)
    elif how == "entry":
        key = draw(
            st.one_of(
                st.text(max_size=70),
                st.text("0123456789abcdefABCDEF", min_size=62, max_size=66),
                st.sampled_from(list(heads) or ["ab" * 32]),
            )
        )
        body["heads"][key] = draw(st.one_of(json_values, st.integers(-(2**70), 2**70)))
    elif how == "whole":
        body = draw(json_values)
    elif how == "extra":
        key = draw(
            st.one_of(st.sampled_from(["equivocators", "heads", "limit"]), st.text(max_size=10))
        )
        body[key] = draw(
            st.one_of(
                json_values, st.lists(st.sampled_from(list(heads) or ["ab" * 32]), max_size=3)
            )
        )
    raw = json.dumps(body).encode()
    if how == "bytes":
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(raw)))
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            if op == "flip" and at < len(raw):
                raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
            elif op == "insert":
                raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
            elif op == "delete":
                raw = raw[:at] + raw[at + draw(st.integers(1, 8)) :]
            else:
                raw = raw[:at]
    return raw


@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_mutated_sync_bodies(fuzz, data):
    ps, signed, _ = fuzz
    before = snapshot(ps, signed)
    body = data.draw(mutated_sync_bodies(before[0]["heads"]))
    response = sent(signed, "POST", "/v1/sync", body, {"content-type": "application/json"})
    check(fuzz, response, before)
    if response.status_code == 200:  # a valid request gets a well-formed page, within the limit
        page = decode_page(
            response.content, max_count=ps.limits.max_page, max_envelope_bytes=64 << 20
        )
        assert len(page) <= ps.limits.max_page


@st.composite
def mutated_pages(draw, envelopes: list[bytes]) -> bytes:
    items = list(envelopes)
    for _ in range(draw(st.integers(0, 2))):  # reshape the list: duplicate, drop, reorder
        op = draw(st.sampled_from(["duplicate", "drop", "swap"]))
        i = draw(st.integers(0, len(items) - 1)) if items else 0
        if op == "duplicate" and items:
            items.insert(i, items[i])
        elif op == "drop" and items:
            items.pop(i)
        elif op == "swap" and len(items) > 1:
            j = draw(st.integers(0, len(items) - 1))
            items[i], items[j] = items[j], items[i]
    if items and draw(st.booleans()):  # damage one envelope's bytes
        i = draw(st.integers(0, len(items) - 1))
        raw = bytearray(items[i])
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(raw) - 1))
            raw[at] = draw(st.integers(0, 255))
        items[i] = (
            bytes(raw[: draw(st.integers(0, len(raw)))]) if draw(st.booleans()) else bytes(raw)
        )
    raw = b"SNP1" + U32.pack(len(items)) + b"".join(U32.pack(len(e)) + e for e in items)
    framing = draw(st.sampled_from(["none", "count", "length", "flip", "truncate", "append"]))
    if framing == "count":
        raw = raw[:4] + U32.pack(draw(st.integers(0, 2**32 - 1))) + raw[8:]
    elif framing == "length" and items:
        raw = raw[:8] + U32.pack(draw(st.integers(0, 2**32 - 1))) + raw[12:]
    elif framing == "flip":
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif framing == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif framing == "append":
        raw += draw(st.binary(min_size=1, max_size=16))
    return raw


@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_mutated_pages(fuzz, data):
    ps, signed, _ = fuzz
    before = snapshot(ps, signed)
    held = ps.held(8)  # the site's delegation and the robot's sent feed: all held already
    body = data.draw(mutated_pages(held))
    response = sent(signed, "POST", "/v1/envelopes", body, {"content-type": PAGE_TYPE})
    check(fuzz, response, before)
    if response.status_code == 200:
        assert response.json()["accepted"] == 0


@settings(FUZZ, max_examples=60)
@given(
    route=st.sampled_from(
        [
            ("POST", "/v1/sync"),
            ("POST", "/v1/envelopes"),
            ("GET", "/v1/heads"),
            ("GET", "/v1/status"),
            ("GET", "/v1/health"),
        ]
    ),
    body_kind=st.sampled_from(["empty", "page", "json", "bytes"]),
    random_body=st.binary(max_size=200),
    content_type=st.one_of(st.none(), content_types),
    extra=st.dictionaries(header_names, header_values, max_size=4),
    auth=st.one_of(
        st.just("signed"),
        st.just("none"),
        header_values.map(lambda v: "raw:" + v),
        st.sampled_from(
            [
                "Simnet",
                "Simnet key=",
                "Simnet key=" + "0" * 64 + ", ts=1, nonce=" + "0" * 32 + ", sig=" + "0" * 128,
            ]
        ).map(lambda v: "raw:" + v),
    ),
)
def test_random_headers_and_content_types(
    fuzz, route, body_kind, random_body, content_type, extra, auth
):
    ps, signed, unsigned = fuzz
    before = snapshot(ps, signed)
    method, path = route
    body = {
        "empty": b"",
        "page": ps.held_page(4),
        "json": json.dumps({"heads": {}, "limit": 3}).encode(),
        "bytes": random_body,
    }[body_kind]
    headers = dict(extra)
    if content_type is not None:
        headers["content-type"] = content_type
    client = signed if auth == "signed" else unsigned
    if auth.startswith("raw:"):
        headers["authorization"] = auth[4:]
    response = sent(client, method, path, body, headers)
    check(fuzz, response, before)
    if auth != "signed" and path != "/v1/health":
        assert response.status_code == 401  # nothing is served without a valid signature


def test_the_oracle_sees_a_valid_push_and_the_server_survived(fuzz):
    ps, signed, _ = fuzz
    before = snapshot(ps, signed)
    response = signed.post(
        "/v1/envelopes", content=ps.fresh(1), headers={"content-type": PAGE_TYPE}
    )
    assert response.status_code == 200 and response.json()["accepted"] == 1
    after = snapshot(ps, signed)
    assert after != before
    me = ps.device.identity.public_key_hex
    assert after[0]["heads"][me] == before[0]["heads"][me] + 1
    assert ps.site.process.poll() is None and ps.site.healthy()


def test_an_equivocator_named_twice_is_a_normal_request(fuzz):
    """Found by the fuzzer: the same author twice in 'equivocators' gave a 500."""
    ps, signed, _ = fuzz
    author = "32" * 32
    body = json.dumps({"heads": {author: 6}, "limit": 1, "equivocators": [author, author]}).encode()
    response = signed.post("/v1/sync", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200

"""No signed request is accepted twice, not even after a restart (issue #13, 7).

A signed admin request is captured as it leaves the client, accepted once, and replayed byte for
byte over a raw socket after the server was killed (SIGKILL) and restarted, and again after a clean
restart, all inside its timestamp window: 401 each time, and the site's heads do not move.
"""

from __future__ import annotations

import signal
import socket

import httpx

from federation import SimnetAuth
from knowledge import Identity

from .conftest import Live, assert_refused


def capture(
    site: Live, method: str, path: str, body: dict | None = None
) -> tuple[bytes, bytes, httpx.Response]:
    """Send a request as the `simnet` CLI does (SimnetAuth, the site's key): (head, body) as sent,
    and the answer."""
    captured: list[httpx.Request] = []
    with httpx.Client(
        base_url=site.url,
        auth=SimnetAuth(site.key, site.key.public_key),
        timeout=10,
        event_hooks={"request": [captured.append]},
    ) as client:
        response = client.request(method, path, json=body)
    request = captured[0]
    lines = [f"{request.method} {request.url.raw_path.decode()} HTTP/1.1"]
    lines += [
        f"{k}: {v}" for k, v in request.headers.items() if k.lower() not in ("host", "connection")
    ]
    return ("\r\n".join(lines) + "\r\nconnection: close\r\n").encode(), request.content, response


def replay(site: Live, head: bytes, body: bytes) -> httpx.Response:
    """The captured bytes, over a raw socket to the site's current address; the answer parsed."""
    host, port = site.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + f"host: {host}:{port}\r\n\r\n".encode() + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    _headers, _, content = rest.partition(b"\r\n\r\n")
    return httpx.Response(
        int(status_line.split()[1]), content=content, headers={"content-type": "application/json"}
    )


def test_a_captured_admin_request_is_refused_after_a_crash_and_after_a_restart(live):
    site = live("replayed").start()
    device = Identity.generate().public_key_hex
    head, body, first = capture(
        site, "POST", "/v1/admin/delegate", {"device": device, "roles": ["publish"]}
    )
    assert first.status_code == 200 and first.json() == {"delegated": device, "roles": ["publish"]}
    read_head, read_body, read = capture(site, "GET", "/v1/heads")
    assert read.status_code == 200
    after_first = site.heads()
    assert_refused(
        replay(site, head, body), 401, "unauthenticated", "request replayed"
    )  # the same process

    for how in (
        signal.SIGKILL,
        signal.SIGTERM,
    ):  # a crash right after the request, then a clean restart
        site.stop(how)
        site.start()
        for captured in ((head, body), (read_head, read_body)):
            assert_refused(
                replay(site, *captured),
                401,
                "unauthenticated",
                "request replayed: this nonce was already used",
            )
        assert site.heads() == after_first, how

    # the server still serves, and a fresh request of the same kind is accepted (the refusals were
    # the replays')
    other = Identity.generate().public_key_hex
    _, _, fresh = capture(
        site, "POST", "/v1/admin/delegate", {"device": other, "roles": ["publish"]}
    )
    assert fresh.status_code == 200 and site.heads() != after_first
    site.assert_no_traceback()

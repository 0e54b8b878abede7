"""Connection exhaustion (issue #13, 8), against a live `simnet serve` whose process may open 448
files.

Half-sent headers, silent sockets, trickled headers, unsigned large bodies and malformed requests,
from raw loopback sockets: the server closes what does not send its headers in time, never runs out
of file descriptors, refuses unsigned bodies before reading them, keeps answering honest callers
throughout, and logs a few rate-limited lines, no traceback.
"""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from federation import PAGE_TYPE, ServerLimits
from federation._http import IN_FLIGHT, RESERVED_FILES
from knowledge import Identity

from .conftest import Live, assert_refused, signed

NOFILE = 448
CAP = (
    NOFILE - IN_FLIGHT - RESERVED_FILES
)  # the connection cap the server derives from its file limit (128)
HEADER_TIMEOUT = 1.0
HALF = b"GET /v1/heads HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthor"


@pytest.fixture(scope="module")
def site(module_live) -> Live:
    return module_live(
        "target", limits=ServerLimits(header_timeout_s=HEADER_TIMEOUT), nofile=NOFILE
    ).start()


def address(site: Live) -> tuple[str, int]:
    host, port = site.url.removeprefix("http://").split(":")
    return host, int(port)


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def wait_closed(socks: list[socket.socket], timeout: float) -> float:
    """Seconds until the server closed every socket (AssertionError if some stay open past
    `timeout`)."""
    start, open_ = time.monotonic(), set(socks)
    for sock in socks:
        sock.setblocking(False)
    while open_:
        left = timeout - (time.monotonic() - start)
        assert left > 0, f"{len(open_)} of {len(socks)} connections still open after {timeout} s"
        readable, _, _ = select.select(list(open_)[:500], [], [], min(left, 0.1))
        open_ -= {s for s in readable if closed_by_server(s)}
    return time.monotonic() - start


def honest_heads(site: Live) -> tuple[dict, float]:
    started = time.monotonic()
    return site.heads(), time.monotonic() - started


def log_lines(site: Live, pattern: str) -> int:
    return len(re.findall(pattern, site.log_text()))


def test_hundreds_of_half_open_connections_neither_exhaust_files_nor_lock_anyone_out(site):
    before, _ = honest_heads(site)
    baseline = site.open_files()
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], site.open_files())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    socks = []
    try:
        for i in range(300):  # half send half a request line and headers, half send nothing at all
            sock = socket.create_connection(address(site), timeout=5)
            if i % 2 == 0:
                sock.sendall(HALF)
            socks.append(sock)
        heads, seconds = honest_heads(
            site
        )  # an honest caller gets in (the longest idle connection makes room)
        assert heads == before and seconds < 5.0, seconds
        waited = wait_closed(socks, HEADER_TIMEOUT + 4)
    finally:
        stop.set()
        sampler.join()
        for sock in socks:
            sock.close()
    assert waited <= HEADER_TIMEOUT + 4
    assert peak[0] <= CAP + IN_FLIGHT + baseline < NOFILE, (
        peak[0],
        baseline,
    )  # measured here: about 170
    time.sleep(0.2)
    assert site.open_files() <= baseline + 2, (site.open_files(), baseline)
    assert site.heads() == before and site.healthy()
    site.assert_no_traceback()
    assert "out of system resource" not in site.log_text()
    assert log_lines(site, "connections open \\(the limit\\)") <= 2  # 172 evictions, rate-limited
    assert log_lines(site, "request headers did not arrive") <= 2  # 128 timeouts, rate-limited


def test_trickled_headers_and_a_half_request_on_a_kept_alive_connection_are_closed_in_time(site):
    trickle = socket.create_connection(address(site), timeout=5)
    kept = socket.create_connection(address(site), timeout=5)
    kept.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert kept.recv(4096).startswith(b"HTTP/1.1 200")
    kept.sendall(
        HALF
    )  # the next request, half sent: uvicorn's 5 s keep-alive timer is off from here on
    started = time.monotonic()
    try:
        for byte in HALF:  # a byte every 0.1 s: would take 4.5 s to send
            if time.monotonic() - started > HEADER_TIMEOUT + 1:
                break
            try:
                trickle.send(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
        assert (
            wait_closed([trickle, kept], HEADER_TIMEOUT + 2) + (time.monotonic() - started)
            < HEADER_TIMEOUT + 3
        )
    finally:
        trickle.close()
        kept.close()
    assert site.healthy()
    site.assert_no_traceback()


def post_head(site: Live, path: str, length: int | None, authorization: str | None) -> bytes:
    host, port = address(site)
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Type: {PAGE_TYPE}"]
    lines.append(
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    )
    if authorization:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer_without_sending_the_body(site: Live, head: bytes) -> httpx.Response:
    with socket.create_connection(address(site), timeout=3) as sock:
        sock.sendall(head)  # the body announced is never sent: the server must answer without it
        raw = b""
        while b"\r\n\r\n" not in raw or not raw.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, raw
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    return httpx.Response(
        int(status_line.split()[1]),
        content=rest.partition(b"\r\n\r\n")[2],
        headers={"content-type": "application/json"},
    )


def test_bodies_are_refused_on_their_headers_before_a_byte_of_them_is_read(site):
    before = site.heads()
    stranger = Identity.generate()
    cases = [
        (None, 8_000_000, 401, "unauthenticated", "request is not signed"),
        (None, None, 401, "unauthenticated", "request is not signed"),  # chunked
        ("Simnet key=00", 8_000_000, 401, "unauthenticated", "not of the form"),
        (
            signed(stranger, site.key.public_key, "POST", "/v1/envelopes", b"x"),
            8_000_000,
            403,
            "forbidden",
            "is not trusted by this site's policy",
        ),
        (
            signed(site.key, site.key.public_key, "POST", "/v1/envelopes", b"x", ts=1),
            8_000_000,
            401,
            "unauthenticated",
            "request timestamp is",
        ),
    ]
    for authorization, length, status, code, phrase in cases:
        response = answer_without_sending_the_body(
            site, post_head(site, "/v1/envelopes", length, authorization)
        )
        assert_refused(response, status, code, phrase)
    assert site.heads() == before and site.healthy()
    site.assert_no_traceback()


def peak_memory_kb(site: Live) -> int:
    status = open(f"/proc/{site.pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1])


def test_unsigned_large_bodies_cost_no_memory(site):
    """Eight callers each send a 12 MB unsigned body (under max_body_bytes): the server answers 401
    on the headers and discards the rest as it arrives; its peak memory does not grow by the 96
    MB."""
    before, peak = site.heads(), peak_memory_kb(site)
    body = os.urandom(1 << 20) * 12

    def send() -> int:
        with socket.create_connection(address(site), timeout=10) as sock:
            sock.sendall(post_head(site, "/v1/envelopes", len(body), None))
            try:
                sock.sendall(body)
            except OSError:  # the server may close once it answered and its header deadline passed
                pass
            return int(sock.recv(64).split()[1])

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda _: send(), range(8))) == [401] * 8
    grown_mb = (peak_memory_kb(site) - peak) / 1024
    print(f"peak memory grew by {grown_mb:.1f} MB")
    assert grown_mb < 40, f"peak memory grew by {grown_mb:.0f} MB"
    assert site.heads() == before and site.healthy()
    site.assert_no_traceback()


def test_a_flood_of_malformed_requests_logs_a_few_lines(site):
    lines_before = site.log_text().count("\n")
    for _ in range(200):
        with socket.create_connection(address(site), timeout=5) as sock:
            sock.sendall(b"\x16\x03\x01 NOT HTTP\r\n\r\n")  # e.g. a TLS hello: h11 refuses it
            assert sock.recv(4096).startswith(b"HTTP/1.1 400")
    assert site.healthy()
    new = site.log_text().splitlines()[lines_before:]
    assert sum("Invalid HTTP request" in line for line in new) <= 2, new[:10]
    site.assert_no_traceback()

"""The status page is for this machine's operator only, not for web pages its browser opens.

`GET /status` cannot be signed (a browser shows it), so it is served to loopback clients only.
Before the fix the server looked at the client's address alone: a web page the operator opened
elsewhere could rebind its own name to 127.0.0.1 (DNS rebinding) and then read the page from the
operator's browser as same-origin, under its own name, with every peer's address and last error,
every skill and why it is (not) active, the forks caught and the latest refusals. Such a request
comes from 127.0.0.1, but names the web page's host in `Host`.

Now the page is served only under a loopback name (`localhost`, `127.0.0.1`, `[::1]`): any other
`Host` is refused 403, saying why, and the site goes on serving.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from .conftest import assert_refused


@pytest.fixture(scope="module")
def site(module_live):
    return module_live("site").start()


@pytest.mark.parametrize(
    "host", ["rebound.attacker.example", "rebound.attacker.example:{port}", "10.0.0.5:{port}"]
)
def test_the_status_page_is_refused_under_another_host_name(site, host):
    """Attack: a request from 127.0.0.1, as a browser makes it after DNS rebinding, naming the
    attacker's host (or an address other than loopback) in `Host`."""
    port = site.url.rsplit(":", 1)[1]
    answer = httpx.get(f"{site.url}/status", headers={"host": host.format(port=port)})
    assert_refused(answer, 403, "forbidden", "this machine only", "Host")
    assert "<html" not in answer.text
    assert httpx.get(f"{site.url}/v1/health").status_code == 200
    site.assert_no_traceback()


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", None])
def test_the_status_page_is_served_under_a_loopback_name(site, host):
    """What an operator's SSH tunnel or a local `curl` sends (HTTP/1.0 may send no `Host`)."""
    port = site.url.rsplit(":", 1)[1]
    if host is None:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as conn:
            conn.sendall(b"GET /status HTTP/1.0\r\n\r\n")
            answer = b"".join(iter(lambda: conn.recv(65536), b"")).decode()
        assert answer.startswith("HTTP/1.1 200") and "<html" in answer, answer[:300]
        return
    answer = httpx.get(f"{site.url}/status", headers={"host": host.format(port=port)})
    assert answer.status_code == 200, answer.text[:300]
    assert "<html" in answer.text

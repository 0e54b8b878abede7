"""A private map stays with its readers while a round is under way: a peer that may not read the
map holds its heads answer (the middle of the site's gossip round with it) until a device's first
write to the private map reaches the site, then asks for everything. The site withholds the
device's feed from that page on, as it would in the next round. (The feeds to withhold were once
judged when the round began, so the private envelope went out in that round's push.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import federation
import knowledge
from federation import PAGE_TYPE, PeerConfig, decode_page, encode_page
from federation._config import PrivateMaps
from knowledge import Identity, Role, TrustPolicy

NO_HEADS = {"heads": {}, "hashes": {}, "equivocators": []}


@dataclass
class Eavesdropper:
    """A peer with no read rights to the private map: it holds its first heads answer until
    `release` is set, and keeps every envelope pushed to it."""

    asked: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    received: list[bytes] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        spy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # /v1/heads: the push phase waits for it
                spy.asked.set()
                spy.release.wait(30)
                self.answer(json.dumps(NO_HEADS).encode(), "application/json")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path == "/v1/sync":
                    self.answer(encode_page([]), PAGE_TYPE)
                    return
                spy.received += decode_page(body, max_count=1 << 16, max_envelope_bytes=1 << 26)
                took = {"accepted": 0, "rejected": [], "held": [], **NO_HEADS}
                self.answer(json.dumps(took).encode(), "application/json")

        return Handler


@pytest.fixture
def eavesdropper() -> Iterator[tuple[Eavesdropper, str]]:
    spy = Eavesdropper()
    server = ThreadingHTTPServer(("127.0.0.1", 0), spy.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield spy, f"http://127.0.0.1:{server.server_address[1]}"
    spy.release.set()
    server.shutdown()


def test_a_feed_that_turns_private_mid_round_is_withheld_from_that_page_on(live, eavesdropper):
    spy, spy_url = eavesdropper
    spy_key = Identity.generate()
    site = live("keeper")
    config = site.config
    config.peers = [PeerConfig("spy", spy_url, spy_key.public_key)]
    config.private = [PrivateMaps(("vault",), ())]
    config.save()
    policy = TrustPolicy.load(site.home / "trust.toml").with_root(
        spy_key.public_key, [Role.PUBLISH]
    )
    (site.home / "trust.toml").write_text(policy.to_toml())
    device = Identity.generate()
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        kb.delegate(device.public_key, [Role.PUBLISH])
    site.start()
    robot = knowledge.open(":memory:", device, policy=TrustPolicy().with_root(site.key.public_key))
    federation.sync_with(robot, site.url, site.key.public_key)
    robot.maps["lobby"].observe("door", "open", 0.9)
    federation.sync_with(robot, site.url, site.key.public_key)  # public so far: seq 1

    reports: list[dict] = []

    def round_with_spy() -> None:
        with site.client(timeout=60) as client:
            reports.append(client.post("/v1/admin/sync", json={"peer": "spy"}).json())

    gossip = threading.Thread(target=round_with_spy)
    gossip.start()
    assert spy.asked.wait(30), "the site never asked the spy for its heads"
    robot.maps["vault"].observe("combination", "4-8-15-16", 0.9)  # seq 2: private
    assert federation.sync_with(robot, site.url, site.key.public_key).pushed == 1
    spy.release.set()
    gossip.join(60)
    assert reports and reports[0]["reports"][0]["ok"], reports

    from_device = [raw for raw in spy.received if raw[2:34] == device.public_key]
    assert 2 not in [int.from_bytes(raw[34:42], "big") for raw in from_device]
    assert not any(b"vault" in raw or b"4-8-15-16" in raw for raw in spy.received)
    site.assert_no_traceback()
    robot.close()

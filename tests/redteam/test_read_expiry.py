"""A delegation's expiry ends its reads: against a live `simnet serve`, a device whose delegation
has expired reads and pushes nothing (heads, sync, envelopes, blobs and status answer 403 saying the
grant expired) even while the site itself writes nothing, so that its hybrid clock stands still
before the expiry. (The read check once compared the expiry with the site's last timestamp, not its
clock: an idle site served an expired device for as long as it stayed idle.)
"""

from __future__ import annotations

import json
import time

import httpx

import federation
import knowledge
from federation import PAGE_TYPE, encode_page
from knowledge import Identity, TrustPolicy

from ..conftest import simnet_here
from .conftest import assert_refused, signed, wait_until

LIFETIME, LIFETIME_MS = "3s", 3000


def test_an_expired_delegation_reads_nothing_from_an_idle_site(live):
    site = live("idle")
    device = Identity.generate()
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        blob = kb.blobs.put(b"weights" * 100)
    site.start()
    # Granted through the running server, so that its start-up (seconds, on a loaded machine)
    # does not eat the grant's lifetime before the robot's first sync.
    started_ms = time.time_ns() // 1_000_000
    simnet_here(site.home, "device", "add", device.public_key_hex, "--expires-in", LIFETIME)
    robot = knowledge.open(":memory:", device, policy=TrustPolicy().with_root(site.key.public_key))
    federation.sync_with(robot, site.url, site.key.public_key)  # a reader while its grant lasts
    robot.skills.publish("before-expiry", "pick")
    pushed = robot.envelopes_since({}, limit=100)
    expired_ms = started_ms + LIFETIME_MS + 500
    wait_until(lambda: time.time_ns() // 1_000_000 > expired_ms, 30, "the expiry")
    before = site.heads()
    requests = {
        "heads": ("GET", "/v1/heads", b"", None),
        "sync": ("POST", "/v1/sync", json.dumps({"heads": {}}).encode(), "application/json"),
        "push": ("POST", "/v1/envelopes", encode_page(pushed), PAGE_TYPE),
        "blob": ("GET", f"/v1/blobs/{blob}", b"", None),
        "status": ("GET", "/v1/status", b"", None),
    }
    with httpx.Client(base_url=site.url, timeout=10) as client:
        for method, target, body, content_type in requests.values():
            headers = {"authorization": signed(device, site.key.public_key, method, target, body)}
            if content_type:
                headers["content-type"] = content_type
            response = client.request(method, target, content=body, headers=headers)
            assert_refused(response, 403, "forbidden", "holds no current grant", "expired")
    assert site.heads() == before
    assert site.healthy()
    site.assert_no_traceback()
    robot.close()

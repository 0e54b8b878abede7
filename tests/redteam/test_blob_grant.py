"""Uploading a blob needs a current grant of the publish role: against a live `simnet serve`, a
device whose publish delegation has expired, but which another trusted root delegated another role
(so it may still read), is refused a blob upload with 403. (The upload checked the roles of every
grant the key ever had, expired and revoked ones too.)"""

from __future__ import annotations

import hashlib
import time

import httpx

import knowledge
from knowledge import Identity, Role, TrustPolicy
from knowledge._clock import pack

from .conftest import assert_refused, signed, wait_until

LIFETIME_MS = 2000


def test_an_expired_publish_grant_uploads_no_blob(live):
    site = live("blobs")
    other_root, device = Identity.generate(), Identity.generate()
    trust = site.home / "trust.toml"
    trust.write_text(TrustPolicy.load(trust).with_root(other_root.public_key).to_toml())
    weights = b"weights" * 100
    blob = hashlib.sha256(weights).hexdigest()
    with knowledge.open(":memory:", other_root) as other:
        other.delegate(device.public_key, [Role.VALIDATE])  # reading stays allowed
        vouching = other.envelopes_since({})
    with knowledge.open(site.home / "site.db", site.key, policy=trust) as kb:
        kb.ingest(vouching)
        expires_ms = time.time_ns() // 1_000_000 + LIFETIME_MS
        kb.delegate(device.public_key, [Role.PUBLISH], expires=pack(expires_ms))
        kb.skills.publish("grasp", "pick", policy={"kind": "blob"}, blobs=[blob])
        assert kb.can_read(device.public_key)
    site.start()
    wait_until(lambda: time.time_ns() // 1_000_000 > expires_ms + 500, 30, "the expiry")
    target = f"/v1/blobs/{blob}"
    headers = {
        "authorization": signed(device, site.key.public_key, "PUT", target, weights),
        "content-type": "application/octet-stream",
    }
    with httpx.Client(base_url=site.url, timeout=10) as client:
        response = client.put(target, content=weights, headers=headers)
    assert_refused(response, 403, "not_authorized", "current grant of the publish role")
    with site.client() as client:  # the site's own key: nothing was stored
        assert client.get(target).status_code == 404
    assert site.healthy()
    site.assert_no_traceback()

"""Reading needs a current grant (issue #13, 6): against a live `simnet serve`, a key whose
delegation was revoked, a device delegated no roles and a stranger read and push nothing — heads,
sync, envelopes, blobs, status all answer 403 saying what is missing — while grant holders read;
admin is the root's only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest

import federation
import knowledge
from federation import PAGE_TYPE, encode_page
from knowledge import Identity, Role, TrustPolicy

from .conftest import Live, assert_refused, signed

NEED = "reading and pushing need a current grant"


@dataclass
class Setup:
    site: Live
    blob: str
    peer: Identity  # a site root the policy trusts
    good: knowledge.KnowledgeBase  # a robot delegated publish
    revoked: (
        knowledge.KnowledgeBase
    )  # a robot delegated publish, then revoked after its 2nd envelope
    roleless: Identity  # a device delegated no roles


def send(
    site: Live,
    who: Identity,
    method: str,
    target: str,
    body: bytes = b"",
    content_type: str | None = None,
):
    headers = {"authorization": signed(who, site.key.public_key, method, target, body)}
    if content_type:
        headers["content-type"] = content_type
    with httpx.Client(base_url=site.url, timeout=10) as client:
        return client.request(method, target, content=body, headers=headers)


def admin(site: Live, path: str, body: dict) -> dict:
    with site.client() as client:
        return client.post(path, json=body).raise_for_status().json()


def robot(site: Live) -> knowledge.KnowledgeBase:
    return knowledge.open(
        ":memory:", Identity.generate(), policy=TrustPolicy().with_root(site.key.public_key)
    )


@pytest.fixture(scope="module")
def setup(module_live):
    site = module_live("grants")
    peer = Identity.generate()
    policy = TrustPolicy.load(site.home / "trust.toml").with_root(peer.public_key)
    (site.home / "trust.toml").write_text(policy.to_toml())
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        blob = kb.blobs.put(b"weights" * 1000)
    site.start()
    good, revoked, roleless = robot(site), robot(site), Identity.generate()
    for kb in (good, revoked):
        admin(
            site,
            "/v1/admin/delegate",
            {"device": kb.identity.public_key_hex, "roles": [Role.PUBLISH.value]},
        )
        federation.sync_with(
            kb, site.url, site.key.public_key
        )  # learns its delegation: it may read
    admin(site, "/v1/admin/delegate", {"device": roleless.public_key_hex, "roles": []})
    for i in range(3):
        revoked.skills.publish(f"soon-revoked-{i}", "pick")
    federation.sync_with(revoked, site.url, site.key.public_key)
    admin(
        site,
        "/v1/admin/revoke-key",
        {"device": revoked.identity.public_key_hex, "last_seq": 2, "reason": "lost"},
    )
    revoked.skills.publish("after-revocation", "pick")  # what a revoked key would like to push
    yield Setup(site, blob, peer, good, revoked, roleless)
    good.close()
    revoked.close()


def reads(s: Setup) -> dict[str, tuple[str, str, bytes, str | None]]:
    return {
        "heads": ("GET", "/v1/heads", b"", None),
        "sync": (
            "POST",
            "/v1/sync",
            json.dumps({"heads": {}, "limit": 100}).encode(),
            "application/json",
        ),
        "push": (
            "POST",
            "/v1/envelopes",
            encode_page(s.revoked.envelopes_since({}, limit=100)),
            PAGE_TYPE,
        ),
        "blob": ("GET", f"/v1/blobs/{s.blob}", b"", None),
        "status": ("GET", "/v1/status", b"", None),
    }


REFUSED = {  # who, and what the refusal must say is missing
    "revoked device": (
        lambda s: s.revoked.identity,
        ["holds no current grant here", "revoked", NEED],
    ),
    "device delegated no roles": (lambda s: s.roleless, ["is delegated no roles here", NEED]),
    "stranger": (lambda s: Identity.generate(), ["is not trusted by this site's policy", NEED]),
}


@pytest.mark.parametrize("endpoint", ["heads", "sync", "push", "blob", "status"])
@pytest.mark.parametrize("who", list(REFUSED))
def test_without_a_current_grant_nothing_is_read_or_pushed(setup, who, endpoint):
    s = setup
    identity, phrases = REFUSED[who][0](s), REFUSED[who][1]
    before = s.site.heads()
    response = send(s.site, identity, *reads(s)[endpoint])
    detail = assert_refused(response, 403, "forbidden", *phrases)
    assert identity.public_key_hex[:16] in detail
    assert s.site.heads() == before
    assert s.site.healthy()
    s.site.assert_no_traceback()


def test_the_revoked_device_was_a_reader_and_its_held_prefix_stays(setup):
    """The refusals above are the revocation's doing: the same device read before it, and the site
    keeps exactly the envelopes up to last_seq."""
    s = setup
    assert s.site.heads()["heads"][s.revoked.identity.public_key_hex] == 2
    with pytest.raises(federation.PeerError, match="403 forbidden: .*holds no current grant"):
        federation.sync_with(s.revoked, s.site.url, s.site.key.public_key)
    assert s.site.heads()["heads"][s.revoked.identity.public_key_hex] == 2


@pytest.mark.parametrize("who", ["robot", "peer root", "site"])
def test_grant_holders_read_everything(setup, who):
    s = setup
    identity = {"robot": s.good.identity, "peer root": s.peer, "site": s.site.key}[who]
    for endpoint, request in reads(s).items():
        if endpoint == "push":
            request = ("POST", "/v1/envelopes", encode_page([]), PAGE_TYPE)
        response = send(s.site, identity, *request)
        assert response.status_code == 200, (endpoint, response.status_code, response.text[:300])
    assert send(s.site, identity, "GET", f"/v1/blobs/{s.blob}").content == b"weights" * 1000


ADMIN = {
    "sync": {"peer": None},
    "revoke": {"skill": "ab" * 32, "reason": "x"},
    "delegate": {"device": "cd" * 32, "roles": ["publish"]},
    "revoke-key": {"device": "cd" * 32, "last_seq": 0},
}


@pytest.mark.parametrize("path", list(ADMIN))
@pytest.mark.parametrize("who", ["robot", "peer root", "revoked device"])
def test_admin_endpoints_are_the_site_roots_only(setup, who, path):
    s = setup
    identity = {
        "robot": s.good.identity,
        "peer root": s.peer,
        "revoked device": s.revoked.identity,
    }[who]
    before = s.site.heads()
    response = send(
        s.site,
        identity,
        "POST",
        f"/v1/admin/{path}",
        json.dumps(ADMIN[path]).encode(),
        "application/json",
    )
    assert_refused(
        response, 403, "forbidden", "only this site's own key may use the admin endpoints"
    )
    assert s.site.heads() == before and s.site.healthy()
    s.site.assert_no_traceback()

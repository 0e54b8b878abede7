"""Red team, issue #13 item 9: a revoked key rewriting the history its revocation was meant to keep.

The attack: a device D writes envelopes 1..5, which its root R holds; R revokes D's key at
last_seq=3 (`kb.revoke_key(D, 3)`, which pins envelope 3 by its hash). D — stolen, or its owner
turned hostile — then signs *another* history: alternative envelopes at seqs 2 and 3 (a fork below
the revocation), or only at seq 3 (a fork exactly at last_seq), and offers them to a site S that
trusts R, in every order: before the revocation reaches S or after it, alone or beside the real
envelopes, the alternative branch first or the real one first, everything in one batch. Before the
fix, an equivocation at or below last_seq cut the kept history, and a site holding the alternative
branch kept it.

What must hold whatever the order, once S has synced with R (anti-entropy: `envelopes_since(heads)`
⇄ `ingest`, both ways, until nothing moves): S's views hold exactly the records of D's pinned prefix
1..3 (no record of the alternative branch, none of 4..5), S's head for D is R's (seq 3, the pinned
hash), and S reopened from its SQLite file holds the same. Where S held the pinned history when the
fork arrived, the fork is evidence (`kb.equivocations()`) and nothing is cut.

Everything runs in-process on real knowledge bases (S on a real SQLite file); the device's
alternative envelopes are signed by hand with its own key (Feed.write + seal), as an attacker
holding the key would.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import pytest

import federation
import knowledge
from knowledge import Identity, Role, TrustPolicy
from knowledge._clock import pack
from knowledge._envelope import ZERO_HASH, Envelope, Kind, decode, seal
from knowledge._feed import Feed
from knowledge._records import record_text

MAX_ROUNDS = 12


def env(raw: bytes) -> Envelope:
    return decode(raw, max_bytes=1 << 26)


def now_hlc() -> int:
    return pack(time.time_ns() // 1_000_000)


def cell(map_name: str, name: str, value, confidence: float, hlc: int) -> dict[str, str]:
    record = {"v": 1, "hlc": hlc, "value": value, "confidence": confidence, "deleted": False}
    return {f"cell/{map_name}/{name}": record_text(record)}


class Forger:
    """Signs envelopes in a device's name by hand, continuing its Doc from a chosen prefix of its
    feed."""

    def __init__(self, identity: Identity, prefix: list[bytes]) -> None:
        self.identity = identity
        self.feed = Feed(identity.public_key)
        self.last: Envelope | None = None
        for raw in prefix:
            e = env(raw)
            self.feed.replay(e.update)
            self.feed.apply_queued()
            self.last = e

    def write(self, changes: dict[str, str]) -> bytes:
        update, _ = self.feed.write(changes)
        seq = 1 if self.last is None else self.last.seq + 1
        prev = ZERO_HASH if self.last is None else self.last.hash
        hlc = max(now_hlc(), 0 if self.last is None else self.last.hlc + 1)
        self.last = seal(self.identity, Kind.UPDATE, seq, prev, hlc, update)
        return self.last.raw


@dataclass
class Scene:
    root: knowledge.KnowledgeBase  # R: the device's site root; it revoked D at last_seq=3
    device: Identity  # D
    delegation: list[bytes]  # R's envelopes before the revocation (the delegation)
    revocation: list[bytes]  # R's envelope carrying the key revocation
    real: list[bytes]  # D's envelopes 1..5
    alt: list[bytes]  # D's alternative envelopes at seqs 2 and 3 (prev: real 1, then alt 2)
    alt3: bytes  # D's alternative envelope at seq 3 only (prev: real 2)
    pinned: dict  # R's views: exactly the pinned prefix's records

    @property
    def d(self) -> str:
        return self.device.public_key_hex


def by_author(kb: knowledge.KnowledgeBase, key: bytes) -> list[bytes]:
    return [raw for raw in kb.envelopes_since({}, limit=10**6) if env(raw).author == key]


@pytest.fixture
def scene() -> Scene:
    return make_scene()


def make_scene() -> Scene:
    """R delegates D; D writes 1..5, all held by R; R revokes D at 3; D signs its alternative
    envelopes."""
    r_id, d_id = Identity.generate(), Identity.generate()
    root = knowledge.open(":memory:", r_id)
    device = knowledge.open(":memory:", d_id, policy=TrustPolicy().for_device_of(r_id.public_key))
    root.delegate(d_id.public_key, [Role.PUBLISH])
    delegation = by_author(root, r_id.public_key)
    device.ingest(delegation)
    device.learn_site_heads(
        root.heads()
    )  # the device's first sync: it learns how far its own feed goes
    for i in range(1, 6):  # one envelope each: cells real1 .. real5
        device.maps["m"].observe(f"real{i}", f"r{i}", 0.5)
    real = by_author(device, d_id.public_key)
    assert [env(r).seq for r in real] == [1, 2, 3, 4, 5]
    report = root.ingest(real)
    assert report.rejected == [], report.rejected
    root.revoke_key(d_id.public_key, 3, reason="stolen")
    revocation = by_author(root, r_id.public_key)[len(delegation) :]
    assert len(revocation) == 1
    assert (
        root.heads()[d_id.public_key_hex].seq == 3
    )  # the root keeps only the pinned prefix itself
    pinned = root.snapshot()
    assert sorted(pinned["cells"]) == ["m/real1", "m/real2", "m/real3"]

    # The alternative history: seq 2 and 3 after the common envelope 1, high confidence, overwriting
    # real1.
    fork = Forger(d_id, real[:1])
    alt = [
        fork.write(
            {
                **cell("m", "alt2", "forged", 1.0, now_hlc()),
                **cell("m", "real1", "forged", 1.0, now_hlc()),
            }
        ),
        fork.write(cell("m", "alt3", "forged", 1.0, now_hlc())),
    ]
    alt3 = Forger(d_id, real[:2]).write(cell("m", "alt3only", "forged", 1.0, now_hlc()))
    assert env(alt[0]).seq == 2 and env(alt[1]).seq == 3 and env(alt3).seq == 3
    assert env(alt[1]).hash != env(real[2]).hash and env(alt3).hash != env(real[2]).hash
    device.close()
    return Scene(root, d_id, delegation, revocation, real, alt, alt3, pinned)


def open_site(path, root_key: bytes) -> knowledge.KnowledgeBase:
    return knowledge.open(
        path, Identity.load(path.with_suffix(".key")), policy=TrustPolicy().with_root(root_key)
    )


def new_site(tmp_path, root_key: bytes) -> knowledge.KnowledgeBase:
    path = tmp_path / "s.db"
    Identity.generate().save(path.with_suffix(".key"))
    return open_site(path, root_key)


def sync(a: knowledge.KnowledgeBase, b: knowledge.KnowledgeBase) -> None:
    """Anti-entropy both ways until nothing moves (what `federation.sync_with` does over HTTP)."""
    for _ in range(MAX_ROUNDS):
        before = (a.heads(), b.heads())
        b.ingest(a.envelopes_since(b.heads(), limit=10**6))
        a.ingest(b.envelopes_since(a.heads(), limit=10**6))
        for device, site in (
            (a, b),
            (b, a),
        ):  # a device takes its own site's heads as the word on its feed
            if device.policy.device_of == site.identity.public_key:
                device.learn_site_heads(site.heads())
        if (a.heads(), b.heads()) == before:
            return
    raise AssertionError("sync did not settle")


def seqs_and_hashes(kb: knowledge.KnowledgeBase) -> dict[str, tuple[int, str]]:
    return {a: (h.seq, h.hash) for a, h in kb.heads().items()}


def views(kb: knowledge.KnowledgeBase) -> dict:
    """The views that hold records (equivocation evidence may differ from site to site)."""
    snap = kb.snapshot()
    return {k: v for k, v in snap.items() if k != "equivocators"}


def assert_pinned(site: knowledge.KnowledgeBase, scene: Scene) -> None:
    head, root_head = site.heads().get(scene.d), scene.root.heads()[scene.d]
    pinned = (3, env(scene.real[2]).hash.hex())
    assert head is not None and (head.seq, head.hash) == (root_head.seq, root_head.hash) == pinned
    assert views(site) == views(scene.root), (
        sorted(site.snapshot()["cells"]),
        sorted(scene.pinned["cells"]),
    )
    assert sorted(site.snapshot()["cells"]) == ["m/real1", "m/real2", "m/real3"]
    assert (
        site.snapshot()["cells"]["m/real1"][0] == "r1"
    )  # the forged overwrite of real1 is nowhere
    # The root never takes anything of the alternative branch from the site either.
    assert views(scene.root) == {k: v for k, v in scene.pinned.items() if k != "equivocators"}


# Each order is a list of steps: a batch of envelopes offered to S, or "sync" (a full sync with R).
def _orders(s: Scene) -> dict[str, list]:
    r1, real, alt, alt3 = s.real[:1], s.real, s.alt, [s.alt3]
    rev = s.delegation + s.revocation
    return {
        # the fork arrives before the revocation
        "real-all, alt, then revocation": [s.delegation, real, alt, rev, "sync"],
        "alt branch only, then revocation": [s.delegation, r1, alt, rev, "sync"],
        "alt branch, then real, then revocation": [s.delegation, r1, alt, real, rev, "sync"],
        "real, alt3, then revocation": [s.delegation, real, alt3, rev, "sync"],
        # the revocation arrives first
        "revocation, real-all, alt": [rev, real, alt, "sync"],
        "revocation, real 1..3 held, alt": [rev, real[:3], alt, "sync"],
        "revocation, real 1, alt": [rev, r1, alt, "sync"],
        "revocation, real 1..2, alt3": [rev, real[:2], alt3, "sync"],
        "revocation, alt with real 1, then real": [rev, r1 + alt, real, "sync"],
        # all in one batch, in either order within it
        "one batch: alt first": [rev + r1 + alt + real],
        "one batch: real first": [rev + real + alt],
        "one batch: alt3 first": [rev + real[:2] + alt3 + real[2:]],
        # the fork again after the site converged
        "synced, then alt and alt3 again": ["sync", r1 + alt, [s.alt3], "sync"],
    }


ORDERS = [  # the keys of _orders, for test ids
    "real-all, alt, then revocation",
    "alt branch only, then revocation",
    "alt branch, then real, then revocation",
    "real, alt3, then revocation",
    "revocation, real-all, alt",
    "revocation, real 1..3 held, alt",
    "revocation, real 1, alt",
    "revocation, real 1..2, alt3",
    "revocation, alt with real 1, then real",
    "one batch: alt first",
    "one batch: real first",
    "one batch: alt3 first",
    "synced, then alt and alt3 again",
]


@pytest.mark.parametrize("order", ORDERS)
def test_fork_below_last_seq_never_displaces_the_pinned_prefix(scene, tmp_path, order):
    """Attack: the revoked device offers its alternative history in this order; after a sync with
    the root, the site shows exactly the pinned prefix 1..3, its head for D is the root's, and a
    reopen of its SQLite store keeps both. The attacker offering the fork again afterwards changes
    nothing."""
    orders = _orders(scene)
    assert sorted(orders) == sorted(ORDERS)
    steps = orders[order]
    site = new_site(tmp_path, scene.root.identity.public_key)
    for step in steps:
        if step == "sync":
            sync(scene.root, site)
        else:
            report = site.ingest(step)
            outcomes = (
                len(report.accepted)
                + report.duplicates
                + len(report.rejected)
                + len(report.equivocations)
            )
            assert outcomes == len(step)
    sync(scene.root, site)  # the site finally meets the root
    assert_pinned(site, scene)

    # The attacker keeps pushing its branch: refused or kept as evidence, never shown.
    site.ingest(scene.real[:1] + scene.alt + [scene.alt3])
    sync(scene.root, site)
    assert_pinned(site, scene)

    path = tmp_path / "s.db"
    snapshot, heads, equivocations = site.snapshot(), site.heads(), site.equivocations()
    site.close()
    reopened = open_site(path, scene.root.identity.public_key)
    try:
        assert views(reopened) == {k: v for k, v in snapshot.items() if k != "equivocators"}
        assert seqs_and_hashes(reopened) == {a: (h.seq, h.hash) for a, h in heads.items()}
        assert reopened.equivocations() == equivocations
        sync(scene.root, reopened)
        assert_pinned(reopened, scene)
    finally:
        reopened.close()


@pytest.mark.parametrize("fork", ["alt 2+3", "alt 3 only"])
def test_fork_against_a_site_holding_the_pinned_history_is_evidence_and_cuts_nothing(
    scene, tmp_path, fork
):
    """Attack: the site already holds the revocation and D's pinned envelopes 1..3; D offers a fork
    at or below last_seq. The site keeps its history (nothing cut, nothing to re-fetch), records
    every forked seq in `kb.equivocations()` and keeps taking D's pinned envelopes as duplicates."""
    site = new_site(tmp_path, scene.root.identity.public_key)
    sync(scene.root, site)
    assert_pinned(site, scene)
    before = views(site)
    offered = scene.alt if fork == "alt 2+3" else [scene.alt3]
    report = site.ingest(offered)
    forked = [(scene.d, env(raw).seq) for raw in offered]
    assert report.accepted == [] and report.rejected == [], report
    assert report.equivocations == forked
    assert site.equivocations() == forked
    assert views(site) == before
    head = site.heads()[scene.d]
    assert (head.seq, head.hash) == (3, env(scene.real[2]).hash.hex())  # nothing was cut
    again = site.ingest(scene.real[:3])
    assert again.rejected == [] and again.duplicates == 3
    assert_pinned(site, scene)


def test_restart_does_not_change_what_the_site_reports_about_a_pinned_fork(scene, tmp_path):
    """A restart must not change what a site shows. After the fork of a revoked, pinned device was
    kept as evidence (the site held the pinned history; D is not cut nor refused), the running site
    reports D in neither `snapshot()["equivocators"]` nor `heads()[D].equivocated_at` — but reopened
    from the same SQLite file it reports D as an equivocator (at seq 3). Equal stores must give
    equal snapshots."""
    site = new_site(tmp_path, scene.root.identity.public_key)
    sync(scene.root, site)
    site.ingest(scene.alt)
    snapshot, heads = site.snapshot(), site.heads()
    site.close()
    reopened = open_site(tmp_path / "s.db", scene.root.identity.public_key)
    try:
        assert reopened.snapshot() == snapshot
        assert reopened.heads() == heads
    finally:
        reopened.close()


def test_envelope_at_last_seq_with_another_hash_is_refused_as_revoked_writer(scene, tmp_path):
    """Attack: with the revocation held and D's envelopes 1..2, the envelope D signs at seq 3 that
    is not the pinned one is refused ("revoked_writer") and changes nothing; the pinned one is then
    accepted."""
    site = new_site(tmp_path, scene.root.identity.public_key)
    site.ingest(scene.delegation + scene.revocation)
    assert site.ingest(scene.real[:2]).rejected == []
    before = (site.snapshot(), site.heads())
    report = site.ingest([scene.alt3])
    assert [r.reason for r in report.rejected] == ["revoked_writer"], report
    assert (site.snapshot(), site.heads()) == before
    assert site.ingest(scene.real[2:]).reasons() == [
        "revoked_writer",
        "revoked_writer",
    ]  # 4 and 5: past last_seq
    sync(scene.root, site)
    assert_pinned(site, scene)


def test_alternative_prefix_below_last_seq_is_not_taken_after_the_revocation(scene, tmp_path):
    """Attack: the revocation reached the site first, and the site holds only D's envelope 1. D
    offers its alternative envelope 2 (below last_seq: no pin to compare with yet) — and the site
    must not end up with it: once the site meets the root it must hold the pinned 1..3 and nothing
    of the alternative branch, without needing D (or anyone) to send the real envelope 2 again
    outside anti-entropy."""
    site = new_site(tmp_path, scene.root.identity.public_key)
    site.ingest(scene.delegation + scene.revocation)
    site.ingest(scene.real[:1])
    site.ingest(scene.alt)  # alt 2 falls below last_seq; alt 3 is refused as not pinned
    sync(scene.root, site)
    assert_pinned(site, scene)


@pytest.mark.parametrize("order", ["revocation first", "checkpoint first"])
@pytest.mark.parametrize("at", [2, 3])
def test_forged_checkpoint_of_the_alternative_history_never_displaces_the_pinned_prefix(
    scene, tmp_path, at, order
):
    """Attack: instead of envelopes, D signs a *checkpoint* of its alternative history at seq 2
    (below last_seq) or 3 (at it), and offers it to a site that holds nothing of D yet, before or
    after the revocation. After a sync with the root the site must hold exactly the pinned prefix.
    (At seq 3 the pin refuses it; at seq 2 nothing can be compared until the root's envelopes arrive
    — and then the root's envelope 2 must not be waved through as "covered by the checkpoint held
    here", nor its envelope 3 left refused as a broken chain.)"""
    fork = Forger(scene.device, scene.real[:1])
    fork.write(cell("m", "alt-cp2", "forged", 1.0, now_hlc()))
    if at == 3:
        fork.write(cell("m", "alt-cp3", "forged", 1.0, now_hlc()))
    checkpoint = seal(
        scene.device, Kind.CHECKPOINT, at, fork.last.hash, fork.last.hlc, fork.feed.state()
    ).raw
    site = new_site(tmp_path, scene.root.identity.public_key)
    if order == "revocation first":
        site.ingest(scene.delegation + scene.revocation)
        report = site.ingest([checkpoint])
        if at == 3:
            assert report.reasons() == ["revoked_writer"]
    else:
        site.ingest(scene.delegation)
        site.ingest([checkpoint])
        site.ingest(scene.revocation)
    sync(scene.root, site)
    assert_pinned(site, scene)


def test_all_interleavings_of_the_fork_and_the_real_feed_converge(scene, tmp_path):
    """Attack: every permutation of {revocation, real 1..5, alt 2..3} offered one piece at a time (a
    sample of the 5040 orders, deterministic), then one sync with the root: always the pinned
    prefix."""
    pieces = [
        ("rev", scene.delegation + scene.revocation),
        ("r1", scene.real[:1]),
        ("r2", scene.real[1:2]),
        ("r3", scene.real[2:3]),
        ("r45", scene.real[3:]),
        ("a2", scene.alt[:1]),
        ("a3", scene.alt[1:]),
    ]
    orders = list(itertools.permutations(pieces))[::367]  # 14 spread-out orders
    for n, order in enumerate(orders):
        path = tmp_path / f"p{n}.db"
        Identity.generate().save(path.with_suffix(".key"))
        site = open_site(path, scene.root.identity.public_key)
        try:
            for _name, batch in order:
                site.ingest(batch)
            sync(scene.root, site)
            try:
                assert_pinned(site, scene)
            except AssertionError as exc:
                raise AssertionError(f"order {[name for name, _b in order]}: {exc}") from None
        finally:
            site.close()


def test_over_the_wire_a_live_site_holding_the_fork_takes_the_pinned_prefix_from_the_root(
    scene, live
):
    """Attack over HTTP: a live site S (a real `simnet serve` process) that trusts R is pushed R's
    key revocation, D's envelope 1 and D's alternative envelopes 2..3 (POST /v1/envelopes: alt 2 is
    taken, alt 3 refused as not the pinned one). R then runs one ordinary sync round with S
    (`federation.sync_with`): S must end with exactly the pinned prefix — its /v1/heads for D is R's
    head, its store's views are R's — and keep it across a restart of the server, with nothing in
    its log."""
    site = live("s")
    root_key = scene.root.identity.public_key
    policy = TrustPolicy.load(site.home / "trust.toml").with_root(root_key, name="r")
    (site.home / "trust.toml").write_text(policy.to_toml())
    site.start()
    page = federation.encode_page(scene.delegation + scene.revocation + scene.real[:1] + scene.alt)
    with site.client(scene.root.identity) as client:
        answer = client.post(
            "/v1/envelopes", content=page, headers={"content-type": federation.PAGE_TYPE}
        )
    assert answer.status_code == 200, answer.text
    assert [r["reason"] for r in answer.json()["rejected"]] == ["revoked_writer"], answer.json()

    federation.sync_with(scene.root, site.url, site.key.public_key)
    federation.sync_with(
        scene.root, site.url, site.key.public_key
    )  # a second round changes nothing more

    def check() -> None:
        assert site.heads()["heads"][scene.d] == 3
        with knowledge.open(site.home / "site.db") as store:  # read-only, beside the running server
            assert_pinned(store, scene)

    check()
    site.stop()
    site.start()
    check()
    site.assert_no_traceback()

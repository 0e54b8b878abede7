"""Unit tests for knowledge._views: the typed CRDT views merged over every trusted feed."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import Counts, Identity, RecordIssue, Role, TrustedRoot, TrustPolicy
from knowledge._records import ALL_ROLES, RecordType, content_id, make_key, record_text
from knowledge._trust import Authority
from knowledge._views import Views


def key(seed: int) -> bytes:
    return Identity.from_seed(bytes([seed]) * 32).public_key


RA, RB = key(1), key(2)  # two site roots
D1, D2 = key(11), key(12)  # devices of site A
D3 = key(13)  # a device of site B
STRANGER = key(99)  # nobody delegated it
POLICY = TrustPolicy(roots=(TrustedRoot(RA, ALL_ROLES, "a"), TrustedRoot(RB, ALL_ROLES, "b")))
SKILL_ID = "5e" * 32


# --- record builders ----------------------------------------------------------------------------


def delegate(device: bytes, roles=("publish",), expires=None) -> dict[str, str]:
    rec = {"v": 1, "hlc": 1, "roles": sorted(roles), "expires": expires}
    return {make_key(RecordType.DELEGATE, device.hex()): record_text(rec)}


def skill(author: bytes, name: str = "pick-mug", hlc: int = 1) -> tuple[str, dict[str, str]]:
    rec = {"v": 1, "name": name, "task": "pick", "author": author.hex(), "hlc": hlc}
    text = record_text(rec)
    sid = content_id(text)
    return sid, {make_key(RecordType.SKILL, sid): text}


def cert(
    validator: bytes, skill_id: str, hlc: int = 1, branches: int = 64
) -> tuple[str, dict[str, str]]:
    rec = {
        "v": 1,
        "skill": skill_id,
        "validator": validator.hex(),
        "hlc": hlc,
        "branches": branches,
        "successes": branches,
        "confidence": 0.95,
        "randomized": [],
        "evaluation": None,
    }
    text = record_text(rec)
    cid = content_id(text)
    return cid, {make_key(RecordType.CERT, cid): text}


def cell(
    map_name: str, name: str, confidence: float, hlc: int, value=None, deleted: bool = False
) -> dict[str, str]:
    rec = {"v": 1, "hlc": hlc, "value": value, "confidence": confidence, "deleted": deleted}
    return {make_key(RecordType.CELL, map_name, name): record_text(rec)}


def counter(skill_id: str, p=(0, 0, 0), n=(0, 0, 0), hlc: int = 1) -> dict[str, str]:
    fields = ("uses", "successes", "failures")
    rec = {
        "v": 1,
        "hlc": hlc,
        "p": dict(zip(fields, p, strict=True)),
        "n": dict(zip(fields, n, strict=True)),
    }
    return {make_key(RecordType.COUNTER, skill_id): record_text(rec)}


def withdraw(skill_id: str) -> dict[str, str]:
    return {
        make_key(RecordType.WITHDRAW, skill_id): record_text({"v": 1, "hlc": 2, "reason": "old"})
    }


def revoke(skill_id: str) -> dict[str, str]:
    return {
        make_key(RecordType.REVOKE, skill_id): record_text({"v": 1, "hlc": 2, "reason": "unsafe"})
    }


class Site:
    """Feeds as plain dicts, folded into Views with trust settled the way the knowledge base does
    it."""

    def __init__(self, policy: TrustPolicy = POLICY, own: bytes | None = None) -> None:
        self.policy, self.own = policy, own
        self.feeds: dict[bytes, dict[str, str]] = {}
        self.views = Views(Authority(policy, own, {}, {}))

    def write(self, author: bytes, changes: dict[str, str | None]) -> list[RecordIssue]:
        feed = self.feeds.setdefault(author, {})
        for k, text in changes.items():
            if text is None:
                feed.pop(k, None)
            else:
                feed[k] = text
        issues: list[RecordIssue] = []
        self.views.update(author, dict(changes), issues)
        self.settle()
        return issues

    def settle(self) -> None:
        authority = Authority(self.policy, self.own, *self.views.delegation_records())
        while True:
            self.views.rebuild(authority, ((a, f.items()) for a, f in self.feeds.items()))
            settled = Authority(self.policy, self.own, *self.views.delegation_records())
            if settled == authority:
                return
            authority = settled


def fleet() -> Site:
    site = Site()
    site.write(RA, {**delegate(D1, ["publish", "validate"]), **delegate(D2, ["publish"])})
    site.write(RB, delegate(D3, ["publish", "validate", "revoke"]))
    return site


def test_fleet_setup():
    site = fleet()
    auth = site.views.authority
    assert (
        auth.sites(D1, Role.PUBLISH) == auth.sites(D2, Role.PUBLISH) == auth.sites(RA, None) == {RA}
    )
    assert auth.sites(D3, Role.PUBLISH) == auth.sites(RB, None) == {RB}
    assert auth.sites(STRANGER, Role.PUBLISH) == frozenset() and auth.grants(STRANGER) == ()
    delegations, revocations = site.views.delegation_records()
    assert set(delegations) == {RA, RB}
    assert set(delegations[RA]) == {D1, D2} and set(delegations[RB]) == {D3}
    assert revocations == {}


# --- semantic maps: LWW by (confidence, hlc, author key) ----------------------------------------


def winner(site: Site, m: str = "floor1", c: str = "1,1"):
    best = site.views.cell(m, c)
    assert best is not None
    return best[0], best[1]


def test_higher_confidence_wins_over_newer_hlc():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.9, hlc=10, value="shelf"))
    site.write(D3, cell("floor1", "1,1", 0.5, hlc=99, value="table"))
    author, rec = winner(site)
    assert author == D1 and rec["value"] == "shelf"


def test_equal_confidence_newer_hlc_wins():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.5, hlc=10, value="old"))
    site.write(D3, cell("floor1", "1,1", 0.5, hlc=11, value="new"))
    assert winner(site)[1]["value"] == "new"


def test_equal_confidence_and_hlc_larger_author_key_wins():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.5, hlc=10, value=D1.hex()))
    site.write(D3, cell("floor1", "1,1", 0.5, hlc=10, value=D3.hex()))
    author, rec = winner(site)
    assert author == max(D1, D3) and rec["value"] == author.hex()


def test_a_tombstone_wins_by_the_same_order():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.5, hlc=10, value="mug"))
    site.write(D3, cell("floor1", "1,1", 0.7, hlc=5, deleted=True))
    author, rec = winner(site)
    assert author == D3 and rec["deleted"] is True and rec["value"] is None
    assert site.views.cells("floor1") == ["1,1"]  # the cell still exists, as a tombstone
    site.write(D1, cell("floor1", "1,1", 0.8, hlc=11, value="mug again"))
    assert winner(site)[1]["value"] == "mug again"


def test_a_weaker_tombstone_loses():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.9, hlc=10, value="mug"))
    site.write(D3, cell("floor1", "1,1", 0.2, hlc=50, deleted=True))
    assert winner(site)[1]["value"] == "mug"


def test_an_author_replaces_its_own_observation():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.9, hlc=10, value="first"))
    site.write(D3, cell("floor1", "1,1", 0.5, hlc=11, value="other"))
    site.write(
        D1, cell("floor1", "1,1", 0.1, hlc=12, value="second")
    )  # D1's record is now the 0.1 one
    assert winner(site)[1]["value"] == "other"


def test_removing_a_record_falls_back_to_the_next_best():
    site = fleet()
    site.write(D1, cell("floor1", "1,1", 0.9, hlc=10, value="best"))
    site.write(D3, cell("floor1", "1,1", 0.5, hlc=11, value="next"))
    site.write(D1, {make_key(RecordType.CELL, "floor1", "1,1"): None})
    assert winner(site)[1]["value"] == "next"
    site.write(D3, {make_key(RecordType.CELL, "floor1", "1,1"): None})
    assert site.views.cell("floor1", "1,1") is None
    assert site.views.cells("floor1") == [] and site.views.map_names() == []


def test_maps_and_cells_are_listed_sorted():
    site = fleet()
    site.write(
        D1, {**cell("b", "2,2", 0.5, 1), **cell("b", "1,1", 0.5, 1), **cell("a", "x", 0.5, 1)}
    )
    assert site.views.map_names() == ["a", "b"]
    assert site.views.cells("b") == ["1,1", "2,2"]
    assert site.views.cells("nope") == []


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([D1, D2, D3, RA, RB]),
            st.sampled_from([0.0, 0.25, 0.5, 1.0]),
            st.integers(1, 4),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    ),
    st.randoms(use_true_random=False),
)
def test_lww_winner_is_the_max_and_independent_of_order(observations, rnd):
    latest = {}  # each author's last write is its current record
    for author, conf, hlc, deleted in observations:
        latest[author] = (conf, hlc, deleted)
    expected = max(latest.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))

    results = []
    for order in (list(latest.items()), rnd.sample(list(latest.items()), len(latest))):
        site = fleet()
        for author, (conf, hlc, deleted) in order:
            site.write(
                author,
                cell("m", "c", conf, hlc, value=None if deleted else author.hex(), deleted=deleted),
            )
        author, rec = winner(site, "m", "c")
        results.append((author, rec))
        assert author == expected[0]
        assert (rec["confidence"], rec["hlc"], rec["deleted"]) == expected[1]
    assert results[0] == results[1]


# --- counters: PN per site ----------------------------------------------------------------------


def test_counters_sum_p_minus_n_per_site():
    site = fleet()
    site.write(D1, counter(SKILL_ID, p=(10, 7, 3), n=(1, 1, 0)))
    site.write(D2, counter(SKILL_ID, p=(5, 5, 0), n=(0, 0, 0)))
    site.write(RA, counter(SKILL_ID, p=(1, 0, 1)))
    site.write(D3, counter(SKILL_ID, p=(4, 1, 3), n=(2, 0, 2)))
    counts = site.views.counts(SKILL_ID)
    assert counts == {RA: Counts(15, 11, 4), RB: Counts(2, 1, 1)}


def test_counter_records_replace_per_author():
    site = fleet()
    site.write(D1, counter(SKILL_ID, p=(1, 1, 0)))
    site.write(
        D1, counter(SKILL_ID, p=(3, 2, 1), hlc=2)
    )  # grow-only per author: the new record holds the total
    assert site.views.counts(SKILL_ID) == {RA: Counts(3, 2, 1)}


def test_counters_of_an_unknown_skill_are_empty():
    assert fleet().views.counts(SKILL_ID) == {}


def test_counters_can_go_negative_by_corrections():
    site = fleet()
    site.write(D3, counter(SKILL_ID, p=(0, 0, 0), n=(2, 0, 0)))
    assert site.views.counts(SKILL_ID) == {RB: Counts(-2, 0, 0)}


# --- skills and withdrawal ----------------------------------------------------------------------


def test_skill_record_is_visible():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, changes)
    assert site.views.skill(sid)["author"] == D1.hex()
    assert site.views.indexes(RecordType.SKILL) == [sid]
    assert site.views.skill("00" * 32) is None
    assert not site.views.withdrawn(sid)
    assert not site.views.withdrawn("00" * 32)


def test_withdrawal_by_another_device_of_the_same_site_is_effective():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, changes)
    site.write(D2, withdraw(sid))
    assert site.views.withdrawn(sid)


def test_withdrawal_by_the_publishers_root_is_effective():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, changes)
    site.write(RA, withdraw(sid))
    assert site.views.withdrawn(sid)


def test_withdrawal_by_the_publisher_itself_is_effective():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, {**changes, **withdraw(sid)})
    assert site.views.withdrawn(sid)


def test_withdrawal_by_another_site_is_not_effective():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, changes)
    site.write(D3, withdraw(sid))
    site.write(RB, withdraw(sid))
    assert not site.views.withdrawn(sid)
    assert site.views.skill(sid) is not None


def test_withdrawal_arriving_before_the_skill_applies_once_it_arrives():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D2, withdraw(sid))
    assert not site.views.withdrawn(sid)
    site.write(D1, changes)
    assert site.views.withdrawn(sid)


# --- certificates and revocations (grow-only: feeds refuse to rewrite them, see test_feed.py) ----


def test_certificates_union_across_validators():
    site = fleet()
    sid, changes = skill(D2)
    site.write(D2, changes)
    c1, cert1 = cert(D1, sid)
    c3, cert3 = cert(D3, sid)
    site.write(D1, cert1)
    site.write(D3, cert3)
    assert [c for c, _ in site.views.certificates(sid)] == sorted([c1, c3])
    assert site.views.certificates("00" * 32) == []


def test_revocations_union_and_remove_wins():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, changes)
    assert site.views.revocations(sid) == {}
    site.write(D3, revoke(sid))
    site.write(RA, revoke(sid))
    assert set(site.views.revocations(sid)) == {D3, RA}


# --- authorization ------------------------------------------------------------------------------


def _reasons(issues: list[RecordIssue]) -> list[str]:
    return [i.reason for i in issues]


def test_unauthorized_roles_are_reported_and_not_shown():
    site = fleet()
    sid, skill_changes = skill(D2)
    site.write(D2, skill_changes)
    cid, cert_changes = cert(D2, sid)
    issues = site.write(D2, cert_changes)  # D2 only has publish
    assert issues == [
        RecordIssue(
            D2.hex(), make_key(RecordType.CERT, cid), "unauthorized: needs the validate role"
        )
    ]
    assert site.views.certificates(sid) == []
    issues = site.write(D1, revoke(sid))  # D1 has publish and validate, not revoke
    assert _reasons(issues) == ["unauthorized: needs the revoke role"]
    assert site.views.revocations(sid) == {}
    issues = site.write(D3, delegate(STRANGER))  # only roots delegate
    assert _reasons(issues) == ["unauthorized: needs the site root role"]
    assert site.views.authority.grants(STRANGER) == ()


def test_unknown_writer_records_are_reported_and_not_shown():
    site = fleet()
    sid, changes = skill(STRANGER)
    issues = site.write(STRANGER, {**changes, **cell("m", "c", 1.0, 1, "x")})
    assert sorted(_reasons(issues)) == ["unauthorized: needs the publish role"] * 2
    assert site.views.skill(sid) is None and site.views.cell("m", "c") is None


def test_delegated_roles_are_capped_by_the_roots_roles():
    policy = TrustPolicy(roots=(TrustedRoot(RA, frozenset({Role.PUBLISH})),))
    site = Site(policy)
    site.write(RA, delegate(D1, ["publish", "validate", "revoke"]))
    assert site.views.authority.grants(D1)[0].roles == frozenset({Role.PUBLISH})
    sid, changes = skill(D1)
    assert site.write(D1, changes) == []
    _cid, changes = cert(D1, sid)
    assert _reasons(site.write(D1, changes)) == ["unauthorized: needs the validate role"]


def test_records_of_a_device_appear_once_its_delegation_arrives():
    site = Site()
    sid, changes = skill(D1)
    site.write(D1, changes)
    assert site.views.skill(sid) is None
    site.write(RA, delegate(D1))
    assert site.views.skill(sid) is not None
    site.write(RA, {make_key(RecordType.DELEGATE, D1.hex()): None})  # delegation withdrawn
    assert site.views.skill(sid) is None


def test_key_revocations_are_collected_per_root():
    site = fleet()
    rec = record_text({"v": 1, "hlc": 3, "last_seq": 4, "reason": "lost"})
    site.write(RA, {make_key(RecordType.KEY_REVOKE, D1.hex()): rec})
    delegations, revocations = site.views.delegation_records()
    assert revocations == {RA: {D1: {"v": 1, "hlc": 3, "last_seq": 4, "reason": "lost"}}}
    assert site.views.authority.grants(D1)[0].last_seq == 4


def test_own_key_is_its_own_root_when_nobody_delegates_it():
    site = Site(TrustPolicy(), own=D1)
    sid, changes = skill(D1)
    assert site.write(D1, changes) == []
    assert site.views.skill(sid) is not None


# --- mixed versions: unknown types, newer schemas, invalid records ------------------------------


def test_unknown_record_types_are_skipped_with_an_issue():
    site = fleet()
    sid, changes = skill(D1)
    issues = site.write(D1, {"widget/abc": '{"v":1}', **changes, "hologram/x/y": "not even json"})
    assert sorted((i.key, i.reason.split(":")[0]) for i in issues) == [
        ("hologram/x/y", "unknown_type"),
        ("widget/abc", "unknown_type"),
    ]
    assert site.views.skill(sid) is not None  # the known record in the same change still applies


def test_newer_schema_versions_are_skipped_with_an_issue():
    site = fleet()
    future = record_text(
        {"v": 2, "hlc": 1, "value": {"shape": "new"}, "confidence": 0.9, "quality": "hd"}
    )
    issues = site.write(
        D1, {make_key(RecordType.CELL, "m", "c"): future, **cell("m", "d", 0.5, 1, "ok")}
    )
    assert issues == [RecordIssue(D1.hex(), "cell/m/c", "newer_schema: v2 kept, not shown")]
    assert site.views.cell("m", "c") is None
    assert site.views.cell("m", "d") is not None


def test_a_newer_schema_record_replaces_the_authors_older_one():
    site = fleet()
    site.write(D1, cell("m", "c", 0.5, 1, "v1 value"))
    future = record_text({"v": 3, "hlc": 2})
    site.write(D1, {make_key(RecordType.CELL, "m", "c"): future})
    assert site.views.cell("m", "c") is None  # the author's current record is one we cannot read


def test_invalid_keys_and_records_are_skipped_with_an_issue():
    site = fleet()
    bad_cell = record_text({"v": 1, "hlc": 1, "value": 1, "confidence": 7})
    issues = site.write(
        D1, {"skill/not-a-hash": "{}", "cell/m/c": bad_cell, "counter/" + SKILL_ID: "[]"}
    )
    by_key = {i.key: i.reason for i in issues}
    assert by_key["skill/not-a-hash"].startswith("invalid_key:")
    assert by_key["cell/m/c"].startswith("invalid_record:") and "confidence" in by_key["cell/m/c"]
    assert by_key["counter/" + SKILL_ID].startswith("invalid_record:")
    assert site.views.cell("m", "c") is None and site.views.counts(SKILL_ID) == {}


def test_a_skill_claiming_another_author_is_invalid():
    site = fleet()
    sid, changes = skill(D2)  # record says author D2 ...
    issues = site.write(D1, changes)  # ... but it sits in D1's feed
    assert len(issues) == 1 and issues[0].reason.startswith("invalid_record:")
    assert site.views.skill(sid) is None


def test_deleting_an_unknown_or_invalid_key_is_harmless():
    site = fleet()
    issues = site.write(D1, {"widget/abc": None, "cell/m/c": None})
    assert _reasons(issues) == ["unknown_type: kept and forwarded, not shown"]
    assert site.views.map_names() == []


# --- determinism --------------------------------------------------------------------------------


def _state(views: Views):
    return (
        {t: sorted(map(str, views.indexes(t))) for t in RecordType},
        {c: views.cell("m", c) for c in views.cells("m")},
        views.counts(SKILL_ID),
        views.delegation_records(),
    )


def test_rebuild_gives_the_same_views_in_any_feed_order():
    site = fleet()
    sid, changes = skill(D1)
    site.write(D1, {**changes, **counter(SKILL_ID, p=(3, 1, 2)), **cell("m", "c", 0.5, 3, "x")})
    site.write(D3, {**revoke(sid), **counter(SKILL_ID, p=(1, 1, 0)), **cell("m", "c", 0.5, 3, "y")})
    site.write(D2, withdraw(sid))
    reference = _state(site.views)
    authority = site.views.authority
    feeds = list(site.feeds.items())
    for perm in itertools.islice(itertools.permutations(feeds), 24):
        views = Views(authority)
        views.rebuild(authority, ((a, f.items()) for a, f in perm))
        assert _state(views) == reference
    views = Views(authority)
    for author, feed in random.Random(3).sample(feeds, len(feeds)):
        items = list(feed.items())
        random.Random(4).shuffle(items)
        views.update(author, dict(items), [])
    assert _state(views) == reference


def test_a_revocation_covers_the_same_policy_published_again(tmp_path):
    """Revoking a skill revokes its behaviour: the same policy (weights and architecture) under a
    new record is revoked with it, whichever came first and after a reopen; another policy, or a
    skill with none, is not (red team: a revoked policy republished was certified and active
    again in seconds)."""
    me = Identity.generate()
    weights = {"kind": "mlp", "weights": "ab" * 32, "architecture": {"hidden": [64]}}
    with knowledge.open(tmp_path / "site.db", me) as kb:
        early = kb.skills.publish("reach", "reach", policy=weights)  # before the revocation
        first = kb.skills.publish("reach", "reach", policy=weights, description="first")
        other = kb.skills.publish("reach", "reach", policy={**weights, "weights": "cd" * 32})
        plain = kb.skills.publish("reach", "reach")
        kb.revoke(first.id, "drops mugs")
        again = kb.skills.publish("reach-2", "reach", policy=weights)  # after it
        restated = kb.skills.publish("r", "reach", policy={**weights, "note": "new!"})
        del weights["architecture"]
        bare = kb.skills.publish("r", "reach", policy=weights)  # what a loader ignores aside
        same = (early, first, again, restated, bare)
        assert all(kb.is_revoked(s.id) for s in same)
        assert all("revoked" in kb.activation(s.id).reasons for s in same)
        assert not kb.is_revoked(other.id) and not kb.is_revoked(plain.id)
    with knowledge.open(tmp_path / "site.db", me) as kb:
        assert [kb.is_revoked(s.id) for s in (*same, other, plain)] == [True] * 5 + [False] * 2

"""The KnowledgeBase API end to end: publish, maps, counters, certificates, revocation, activation,
delegation, checkpoints, batches, threads, durability on reopen."""

from __future__ import annotations

import datetime
import threading
import time

import pytest

import knowledge
from knowledge import Identity, NotAuthorizedError, Role, TrustPolicy, UnknownSkillError


def sync(a: knowledge.KnowledgeBase, b: knowledge.KnowledgeBase) -> None:
    """Anti-entropy in both directions until neither side learns anything."""
    while True:
        moved = len(b.ingest(a.envelopes_since(b.heads())).accepted)
        moved += len(a.ingest(b.envelopes_since(a.heads())).accepted)
        if not moved:
            return


def test_publish_get_list_and_reopen(tmp_path):
    me = Identity.generate()
    with knowledge.open(tmp_path / "kb.db", me) as kb:
        skill = kb.skills.publish("pick-mug", "pick", description="grasp from the side", parents=[])
        kb.skills.publish("walk", "locomotion")
        assert kb.skills.get(skill.id) == skill
        assert [s.name for s in kb.skills.list(task="pick")] == ["pick-mug"]
        assert len(kb.skills.list()) == 2
    with knowledge.open(
        tmp_path / "kb.db", me
    ) as kb:  # everything acknowledged is there after reopen
        assert kb.skills.get(skill.id).description == "grasp from the side"
        kb.skills.publish("place", "pick")  # and the writer continues its own feed without a fork
        assert kb.heads()[me.public_key_hex].seq == 3
    with pytest.raises(UnknownSkillError):
        knowledge.open(tmp_path / "kb.db").skills.get("0" * 64)


def test_skill_id_is_content_hash_and_records_are_immutable(open_kb):
    kb = open_kb()
    a = kb.skills.publish("x", "t")
    b = kb.skills.publish("x", "t")
    assert a.id != b.id  # author and clock are part of the record: every publish is a new element
    assert len(a.id) == 64


def test_semantic_map_highest_confidence_wins_and_tombstones(open_kb):
    a, b = open_kb("a"), open_kb("b")
    b.set_policy(TrustPolicy().with_root(a.identity.public_key))
    a.set_policy(TrustPolicy().with_root(b.identity.public_key))
    a.maps["floor1"].observe((3, 4), {"label": "chair"}, confidence=0.9)
    b.maps["floor1"].observe((3, 4), {"label": "table"}, confidence=0.6)
    sync(a, b)
    assert a.maps["floor1"].get((3, 4)).value == {"label": "chair"}
    assert b.maps["floor1"].get("3,4").value == {"label": "chair"}
    b.maps["floor1"].delete((3, 4), confidence=0.95)
    sync(a, b)
    assert a.maps["floor1"].get((3, 4)).deleted
    assert a.maps["floor1"].cells() == {}
    assert "3,4" in a.maps["floor1"].cells(include_deleted=True)
    assert a.maps.names() == ["floor1"]


def test_counters_sum_across_sites(open_kb):
    a, b = open_kb("a"), open_kb("b")
    b.set_policy(TrustPolicy().with_root(a.identity.public_key))
    a.set_policy(TrustPolicy().with_root(b.identity.public_key))
    skill = a.skills.publish("walk", "locomotion")
    for ok in (True, True, False):
        a.counters.record(skill.id, success=ok)
    b.counters.record(skill.id, success=True, uses=5)
    b.counters.adjust(skill.id, knowledge.Counts(uses=-1, successes=-1))
    sync(a, b)
    assert a.counters.get(skill.id) == knowledge.Counts(uses=7, successes=6, failures=1)
    assert a.counters.per_site(skill.id) == b.counters.per_site(skill.id)
    assert a.counters.per_site(skill.id)[b.identity.public_key_hex] == knowledge.Counts(4, 4, 0)


def test_activation_follows_certificates_and_revocation_wins(open_kb):
    site, validator = open_kb("site"), open_kb("validator")
    policy = TrustPolicy.from_toml(
        f"""
        [[roots]]
        name = "validator"
        key = "{validator.identity.public_key_hex}"
        roles = ["validate"]
        [activation]
        min_branches = 64
        min_lower_bound = 0.9
        required_randomization = ["mass"]
        min_validators = 1
        rerunnable_only = false  # the certificates below are typed in
        """
    )
    site.set_policy(policy)
    validator.set_policy(TrustPolicy().with_root(site.identity.public_key))
    skill = site.skills.publish("push", "push")
    assert not site.is_active(skill.id)
    sync(site, validator)
    validator.certificates.add(skill.id, branches=64, successes=64, randomized=["mass", "friction"])
    validator.certificates.add(
        skill.id, branches=64, successes=40, randomized=["mass"]
    )  # too weak alone
    sync(site, validator)
    assert len(site.certificates.for_skill(skill.id)) == 2
    assert site.is_active(skill.id), site.activation(skill.id)
    assert [s.id for s in site.skills.list(active_only=True)] == [skill.id]
    site.revoke(skill.id, "drops mugs")
    assert not site.is_active(skill.id)
    assert "revoked" in site.activation(skill.id).reasons


def test_certificates_from_untrusted_validators_do_not_count(open_kb):
    site, stranger = open_kb("site"), open_kb("stranger")
    skill = site.skills.publish("push", "push")
    stranger.set_policy(TrustPolicy().with_root(site.identity.public_key))
    sync(site, stranger)
    stranger.certificates.add(skill.id, branches=500, successes=500)
    report = site.ingest(stranger.envelopes_since(site.heads()))
    assert report.reasons() == ["unknown_writer"]
    assert not site.is_active(skill.id)


def test_a_site_cannot_delegate_to_its_own_key(open_kb):
    """Such a delegation would count nowhere (a root's roles come from policies): refused, and
    nothing written."""
    root = Identity.generate()
    site = open_kb("site", root)
    heads = site.heads()
    with pytest.raises(knowledge.RecordError, match="its own key"):
        site.delegate(root.public_key, [Role.PUBLISH])
    assert site.heads() == heads


def test_roles_are_enforced_locally(open_kb):
    root = Identity.generate()
    device = open_kb("device", policy=TrustPolicy().for_device_of(root.public_key))
    site = open_kb("site", root)
    site.delegate(device.identity.public_key, [Role.PUBLISH])
    device.ingest(site.envelopes_since(device.heads()))
    device.learn_site_heads(site.heads())  # a device writes once it has seen its site's heads
    device.skills.publish("ok", "t")
    assert site.ingest(
        device.envelopes_since(site.heads())
    ).ok  # the site admits its delegated device
    assert len(site.skills.list()) == 1
    with pytest.raises(NotAuthorizedError, match="validate"):
        device.certificates.add("0" * 64, branches=10, successes=10)
    with pytest.raises(NotAuthorizedError, match="revoke"):
        device.revoke("0" * 64)


def test_current_roles_are_the_grants_in_force_now(open_kb):
    """`current_roles` leaves out what `roles_of` still lists: an expired delegation's roles (by
    the site's clock, though the site wrote nothing since) and a revoked device's."""
    site = open_kb("site")
    lasting, expiring, revoked = (Identity.generate().public_key for _ in range(3))
    site.delegate(lasting, [Role.VALIDATE])
    site.delegate(expiring, [Role.PUBLISH], expires=site.now() + (200 << 16))  # 200 ms on
    site.delegate(revoked, [Role.PUBLISH])
    site.revoke_key(revoked, last_seq=0)
    assert site.current_roles(lasting) == {Role.VALIDATE} and site.can_read(lasting)
    assert site.current_roles(expiring) == {Role.PUBLISH}
    time.sleep(0.3)
    assert site.roles_of(expiring) == {Role.PUBLISH}
    assert site.current_roles(expiring) == frozenset() and not site.can_read(expiring)
    assert site.roles_of(revoked) == {Role.PUBLISH} and site.current_roles(revoked) == frozenset()
    assert site.current_roles(site.identity.public_key) == set(Role)  # a root
    own = site.identity.public_key
    assert site.vouching_sites(lasting) == {own} and site.vouching_sites(own) == {own}
    for gone in (expiring, revoked, Identity.generate().public_key):
        assert site.vouching_sites(gone) == frozenset()


def test_vouching_sites_are_the_roots_whose_grants_a_device_holds(open_kb):
    """Whose device a key is: a root's delegation counts where the policy trusts that root, for
    the roles it is trusted with (a site fetches blobs only for its own devices)."""
    a, b = open_kb("a"), open_kb("b")
    a.set_policy(TrustPolicy().with_root(b.identity.public_key, [Role.PUBLISH]))
    device, stranger = Identity.generate().public_key, Identity.generate().public_key
    b.delegate(device, [Role.PUBLISH])
    b.delegate(stranger, [Role.VALIDATE])  # a role b holds nowhere at a: no grant at a
    sync(b, a)
    assert a.vouching_sites(device) == {b.identity.public_key}
    assert a.vouching_sites(b.identity.public_key) == {b.identity.public_key}  # a root
    assert a.vouching_sites(stranger) == frozenset()
    a.delegate(device, [Role.VALIDATE])
    assert a.vouching_sites(device) == {a.identity.public_key, b.identity.public_key}


def test_a_delegation_lasting_a_while_ends_by_the_sites_clock(open_kb):
    """`lasting` is counted from the site's clock now: the grant holds, then it is over; asking
    for an expiry and a lasting both, or a lasting of nothing or of centuries, writes nothing."""
    site = open_kb("site")
    shift, lease = (Identity.generate().public_key for _ in range(2))
    site.delegate(shift, [Role.PUBLISH], lasting=datetime.timedelta(milliseconds=300))
    site.delegate(lease, [Role.PUBLISH], lasting=datetime.timedelta(hours=8))
    assert site.current_roles(shift) == {Role.PUBLISH} == site.current_roles(lease)
    time.sleep(0.4)
    assert site.current_roles(shift) == frozenset() and not site.can_read(shift)
    assert site.current_roles(lease) == {Role.PUBLISH}
    heads = site.heads()
    for wrong, said in (
        ({"lasting": datetime.timedelta(0)}, "lasts from 1 ms"),
        ({"lasting": datetime.timedelta(seconds=-5)}, "lasts from 1 ms"),
        ({"lasting": datetime.timedelta(days=365 * 101)}, "to 36500 days"),
        ({"lasting": datetime.timedelta(hours=1), "expires": site.now()}, "not both"),
    ):
        with pytest.raises(knowledge.RecordError, match=said):
            site.delegate(Identity.generate().public_key, [Role.PUBLISH], **wrong)
    assert site.heads() == heads


def test_withdraw_by_own_site_only(open_kb):
    a, b = open_kb("a"), open_kb("b")
    b.set_policy(TrustPolicy().with_root(a.identity.public_key))
    skill = a.skills.publish("x", "t")
    sync(a, b)
    with pytest.raises(knowledge.RecordError, match="another site"):
        b.skills.withdraw(skill.id)
    a.skills.withdraw(skill.id, "superseded")
    sync(a, b)
    assert b.skills.list() == [] and len(b.skills.list(include_withdrawn=True)) == 1


def test_checkpoint_bootstraps_a_newcomer_with_one_envelope_plus_suffix(open_kb):
    site = open_kb("site")
    for i in range(50):
        site.maps["m"].observe((i, 0), i, 0.5)
    site.checkpoint()
    site.maps["m"].observe((99, 0), "after", 0.5)
    newcomer = open_kb("new", policy=TrustPolicy().with_root(site.identity.public_key))
    envelopes = site.envelopes_since(newcomer.heads())
    assert len(envelopes) == 2 and envelopes[0][1] == knowledge.Kind.CHECKPOINT
    report = newcomer.ingest(envelopes)
    assert report.ok and len(report.accepted) == 2
    assert newcomer.snapshot() == site.snapshot()
    assert newcomer.heads() == site.heads()


def test_batch_makes_one_envelope(open_kb):
    kb = open_kb()
    with kb.batch():
        for i in range(10):
            kb.maps["m"].observe(i.__str__(), i, 0.5)
    assert kb.heads()[kb.identity.public_key_hex].seq == 1
    assert len(kb.maps["m"].cells()) == 10


def test_concurrent_writers_in_threads(open_kb):
    kb = open_kb()
    skill = kb.skills.publish("x", "t")
    errors: list[BaseException] = []

    def perceive() -> None:
        try:
            for i in range(100):
                kb.maps["m"].observe((i, 0), i, 0.5)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    def execute() -> None:
        try:
            for _ in range(100):
                kb.counters.record(skill.id, success=True)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=perceive), threading.Thread(target=execute)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(kb.maps["m"].cells()) == 100
    assert kb.counters.get(skill.id).successes == 100
    assert kb.heads()[kb.identity.public_key_hex].seq == 201


def test_readonly_open_sees_data_and_refuses_writes(tmp_path):
    me = Identity.generate()
    with knowledge.open(tmp_path / "kb.db", me) as kb:
        kb.skills.publish("x", "t")
    with knowledge.open(tmp_path / "kb.db") as reader:
        assert len(reader.skills.list()) == 1
        with pytest.raises(NotAuthorizedError):
            reader.skills.publish("y", "t")


def test_blobs_are_content_addressed(open_kb):
    kb = open_kb()
    digest = kb.blobs.put(b"weights" * 1000)
    assert kb.blobs.get(digest) == b"weights" * 1000
    assert digest in kb.blobs and kb.blobs.missing([digest, "f" * 64]) == ["f" * 64]
    with pytest.raises(knowledge.BlobError, match="hash"):
        kb.blobs.put(b"other", expected=digest)

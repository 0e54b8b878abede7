"""Security tests of `KnowledgeBase.ingest`, through the public API.

Every bad input of issue 2 has its own test. Each asserts the specific `Rejection.reason` and that
the receiving knowledge base did not change at all (views, heads, stored envelopes, equivocations).
Hypothesis then feeds random and mutated bytes into `ingest`: it never raises, never changes
anything unless the input is a genuinely valid envelope, and every rejection carries a reason.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map, merge_updates

import knowledge
from knowledge import Envelope, HybridClock, Identity, Kind, Limits, Rejection, TrustPolicy
from knowledge._clock import pack
from knowledge._envelope import HEADER_BYTES, SIGNING_CONTEXT, decode, seal
from knowledge._feed import IMMUTABLE_MAP, RECORDS_MAP, Feed, client_id_for
from knowledge._identity import SIGNATURE_BYTES
from knowledge._records import content_id, record_text

REASONS = {
    # decoding
    "malformed",
    "truncated",
    "too_large",
    "unsupported_version",
    # checks on a decoded envelope
    "equivocating_author",
    "bad_signature",
    "checkpoint_conflict",
    "gap",
    "unknown_writer",
    "unauthorized",
    "revoked_writer",
    "delegation_expired",
    "broken_chain",
    "clock_regressed",
    "clock_skew",
    "hold_conflict",
    "hold_full",
    "malformed_update",
    "foreign_client_id",
    "modifies_immutable_record",
    "oversized_record",
    "record_clock_ahead",
}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- helpers ------------------------------------------------------------------------------------


def open_site(
    identity: Identity | None = None, *, trust=(), clock=None, limits=None, path=":memory:"
):
    policy = TrustPolicy()
    for key in trust:
        policy = policy.with_root(key)
    return knowledge.open(
        path, identity or Identity.generate(), policy=policy, clock=clock, limits=limits
    )


def state(kb: knowledge.KnowledgeBase):
    """Everything a peer can observe of a knowledge base."""
    return kb.snapshot(), kb.heads(), kb.envelopes_since({}, limit=10**6), kb.equivocations()


def check_report(report: knowledge.IngestReport, n_inputs: int) -> None:
    """Every input is accounted for exactly once; every rejection names a known reason and explains
    it."""
    assert (
        len(report.accepted)
        + report.duplicates
        + len(report.rejected)
        + len(report.equivocations)
        + len(report.held)
        == n_inputs
    )
    for rejection in report.rejected:
        assert isinstance(rejection, Rejection)
        assert rejection.reason in REASONS, rejection
        assert rejection.detail
        assert 0 <= rejection.index < n_inputs
    assert [r.index for r in report.rejected] == sorted(r.index for r in report.rejected)


def assert_refused(kb: knowledge.KnowledgeBase, envelopes: list, reason: str) -> list[Rejection]:
    """Ingest `envelopes`; each must be rejected with `reason`, and nothing may change."""
    before = state(kb)
    report = kb.ingest(envelopes)
    check_report(report, len(envelopes))
    assert report.accepted == [] and report.duplicates == 0 and report.equivocations == []
    assert report.record_issues == []
    assert [r.reason for r in report.rejected] == [reason] * len(envelopes), report.rejected
    assert state(kb) == before
    return report.rejected


def accept_all(kb: knowledge.KnowledgeBase, envelopes: list[bytes]) -> knowledge.IngestReport:
    report = kb.ingest(envelopes)
    check_report(report, len(envelopes))
    assert report.rejected == [] and report.equivocations == [], report.rejected
    return report


class Writer:
    """A trusted writer whose next envelope a test can forge by hand (any update, hlc, prev,
    seq)."""

    def __init__(self, kb: knowledge.KnowledgeBase) -> None:
        self.kb = kb
        self.identity = kb.identity
        self.replica = Feed(
            self.identity.public_key
        )  # the writer's Doc, to continue its client's clocks
        self.last: Envelope | None = None
        self.sent = 0

    def envelopes(self) -> list[bytes]:
        """The writer's envelopes not yet returned, applied to the local replica as they are
        returned."""
        raws = self.kb.envelopes_since({self.identity.public_key_hex: self.sent}, limit=10**6)
        for raw in raws:
            env = decode(raw, max_bytes=1 << 30)
            self.replica.apply(env.update)
            self.last, self.sent = env, env.seq
        return raws

    def forge(
        self,
        update: bytes,
        *,
        hlc: int | None = None,
        prev: bytes | None = None,
        seq: int | None = None,
        identity: Identity | None = None,
        kind: Kind = Kind.UPDATE,
    ) -> bytes:
        assert self.last is not None
        return seal(
            identity or self.identity,
            kind,
            self.last.seq + 1 if seq is None else seq,
            self.last.hash if prev is None else prev,
            (self.last.hlc + 1 if hlc is None else hlc),
            update,
        ).raw

    def next_update(self, changes: dict[str, str]) -> bytes:
        """A well-formed update continuing the writer's own Doc (not applied to the replica)."""
        doc = Feed(self.identity.public_key)
        doc.apply(self.replica.state())
        update, _ = doc.write(changes)
        return update


@pytest.fixture
def setup():
    """A writer W (its own site root) with two envelopes held by a receiver that trusts W."""
    w_kb = open_site()
    writer = Writer(w_kb)
    w_kb.skills.publish("pick-mug", "pick")
    w_kb.maps["floor1"].observe((1, 2), {"label": "shelf"}, confidence=0.7)
    receiver = open_site(trust=[w_kb.identity.public_key])
    accept_all(receiver, writer.envelopes())
    return writer, receiver


def now_hlc() -> int:
    return pack(time.time_ns() // 1_000_000)


# --- malformed and truncated bytes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda raw: b"", "truncated"),
        (lambda raw: b"hello", "truncated"),
        (lambda raw: bytes(149), "truncated"),
        (lambda raw: bytes(400), "unsupported_version"),
        (lambda raw: b"\x01\x07" + raw[2:], "malformed"),  # unknown kind
        (lambda raw: raw + b"\x00", "malformed"),  # trailing byte
        (
            lambda raw: raw[:82] + b"\x00\x00\x00\x00" + raw[86:],
            "malformed",
        ),  # length field too small
        (lambda raw: raw[:34] + bytes(8) + raw[42:], "malformed"),  # seq 0
        (lambda raw: "a string, not bytes", "malformed"),
        (lambda raw: None, "malformed"),
        (lambda raw: 12345, "malformed"),
    ],
    ids=[
        "empty",
        "short",
        "149-zero-bytes",
        "zero-header",
        "kind",
        "trailing",
        "length",
        "seq0",
        "str",
        "none",
        "int",
    ],
)
def test_malformed_bytes(setup, make, reason):
    writer, receiver = setup
    writer.kb.counters.record("ab" * 32, success=True)
    (raw,) = writer.envelopes()
    (rejection,) = assert_refused(receiver, [make(raw)], reason)
    assert rejection.index == 0
    assert rejection.author is None and rejection.seq is None  # undecodable: no author to name


def test_truncated_envelope(setup):
    writer, receiver = setup
    writer.kb.skills.publish("walk", "locomotion")
    (raw,) = writer.envelopes()
    cuts = [
        raw[:n]
        for n in (
            1,
            50,
            HEADER_BYTES,
            HEADER_BYTES + 1,
            len(raw) // 2,
            len(raw) - SIGNATURE_BYTES,
            len(raw) - 1,
        )
    ]
    rejections = assert_refused(receiver, cuts, "truncated")
    assert [r.index for r in rejections] == list(range(len(cuts)))
    accept_all(receiver, [raw])  # the intact envelope is still welcome


def test_unsupported_version(setup):
    writer, receiver = setup
    writer.kb.skills.publish("walk", "locomotion")
    (raw,) = writer.envelopes()
    body = bytes([2]) + raw[1:-SIGNATURE_BYTES]
    resigned = body + writer.identity.sign(
        SIGNING_CONTEXT + body
    )  # a genuinely signed future envelope
    assert_refused(receiver, [bytes([2]) + raw[1:], resigned], "unsupported_version")


# --- signatures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("position", [-SIGNATURE_BYTES, -33, -1])
def test_flipped_signature_byte(setup, position):
    writer, receiver = setup
    writer.kb.skills.publish("walk", "locomotion")
    (raw,) = writer.envelopes()
    forged = bytearray(raw)
    forged[position] ^= 0x01
    (rejection,) = assert_refused(receiver, [bytes(forged)], "bad_signature")
    assert rejection.author == writer.identity.public_key_hex and rejection.seq == 3


@pytest.mark.parametrize("position", [HEADER_BYTES, HEADER_BYTES + 5, 75])  # update bytes, hlc byte
def test_flipped_signed_byte(setup, position):
    writer, receiver = setup
    writer.kb.skills.publish("walk", "locomotion")
    (raw,) = writer.envelopes()
    forged = bytearray(raw)
    forged[position] ^= 0x40
    assert_refused(receiver, [bytes(forged)], "bad_signature")


def test_resigned_by_a_different_key_claiming_the_author(setup):
    writer, receiver = setup
    writer.kb.skills.publish("walk", "locomotion")
    (raw,) = writer.envelopes()
    body = raw[:-SIGNATURE_BYTES]
    forged = body + Identity.generate().sign(SIGNING_CONTEXT + body)
    assert_refused(receiver, [forged], "bad_signature")


def test_new_envelope_signed_by_another_key_in_the_writers_name(setup):
    writer, receiver = setup
    mallory = Identity.generate()
    forged2 = writer.forge(
        writer.next_update({"revoke/" + "ab" * 32: '{"v":1,"hlc":1}'}), identity=mallory
    )
    forged2 = forged2[:2] + writer.identity.public_key + forged2[34:]
    assert_refused(receiver, [forged2], "bad_signature")


def test_bad_signature_on_an_envelope_already_held_is_not_an_equivocation(setup):
    writer, receiver = setup
    held = receiver.envelopes_since({})[0]
    forged = bytearray(held)
    forged[HEADER_BYTES] ^= 0x01  # same author and seq 1, different content, invalid signature
    assert_refused(receiver, [bytes(forged)], "bad_signature")
    assert receiver.equivocations() == []


def test_forged_envelope_below_a_checkpoint_is_not_counted_as_a_duplicate(setup):
    """A newcomer bootstrapped from a checkpoint holds no envelope bodies below it. An envelope
    there with a bad signature must be rejected (bad_signature), not reported as a harmless
    duplicate."""
    writer, receiver = setup
    held = receiver.envelopes_since({})
    newcomer = open_site(trust=[writer.identity.public_key])
    accept_all(newcomer, [writer.kb.checkpoint().raw])
    forged = bytearray(held[0])
    forged[-1] ^= 0x01
    assert_refused(newcomer, [bytes(forged)], "bad_signature")


def test_forged_checkpoint_for_a_held_seq_is_not_counted_as_a_duplicate(setup):
    """A checkpoint at a seq already held whose `prev` matches, but whose body was tampered with."""
    writer, receiver = setup
    checkpoint = bytearray(writer.kb.checkpoint().raw)  # seq 2, prev = hash of envelope 2
    checkpoint[HEADER_BYTES + 3] ^= 0x01
    assert_refused(receiver, [bytes(checkpoint)], "bad_signature")


# --- unknown, unauthorized, revoked and expired writers -----------------------------------------


def test_unknown_writer(setup):
    _writer, receiver = setup
    stranger = open_site()
    stranger.skills.publish("free-candy", "pick")
    (raw,) = stranger.envelopes_since({})
    (rejection,) = assert_refused(receiver, [raw], "unknown_writer")
    assert rejection.author == stranger.identity.public_key_hex and rejection.seq == 1


def test_delegation_without_roles_is_unauthorized():
    root, device = open_site(), open_site()
    root.delegate(device.identity.public_key, [])
    device.skills.publish("s", "t")
    receiver = open_site(trust=[root.identity.public_key])
    accept_all(receiver, root.envelopes_since({}))
    assert_refused(receiver, device.envelopes_since({}), "unauthorized")


def test_key_revocation_removes_held_envelopes_beyond_last_seq_and_refuses_new_ones():
    root, device = open_site(), open_site()
    root.delegate(device.identity.public_key, ["publish"])
    skills = [device.skills.publish(f"skill-{i}", "pick") for i in range(3)]
    d_envs = device.envelopes_since({})
    receiver = open_site(trust=[root.identity.public_key])
    accept_all(receiver, root.envelopes_since({}) + d_envs)
    assert receiver.heads()[device.identity.public_key_hex].seq == 3
    assert {s.id for s in receiver.skills.list()} == {s.id for s in skills}

    root.ingest(d_envs)  # a revocation pins the kept prefix by hash: the root must hold it
    root.revoke_key(device.identity.public_key, last_seq=1, reason="robot stolen")
    accept_all(receiver, root.envelopes_since(receiver.heads()))
    # Envelopes beyond last_seq that were already held are gone, with everything they carried.
    assert receiver.heads()[device.identity.public_key_hex].seq == 1
    assert [s.id for s in receiver.skills.list()] == [skills[0].id]
    held = [decode(r, max_bytes=1 << 30) for r in receiver.envelopes_since({})]
    assert [e.seq for e in held if e.author == device.identity.public_key] == [1]

    # ... and they are refused when offered again, as is anything new the device writes.
    (rejection,) = assert_refused(receiver, [d_envs[1]], "revoked_writer")
    assert rejection.seq == 2
    before = state(receiver)
    report = receiver.ingest(d_envs[1:])
    check_report(report, 2)
    assert report.accepted == [] and report.rejected[0].reason == "revoked_writer"
    assert {r.reason for r in report.rejected} <= {"revoked_writer", "gap"}
    assert state(receiver) == before
    device.skills.publish("after-revocation", "pick")
    report = receiver.ingest(device.envelopes_since({}))
    assert report.accepted == [] and "revoked_writer" in report.reasons()
    assert state(receiver) == before


def test_key_revocation_arriving_with_the_envelopes_in_one_batch():
    root, device = open_site(), open_site()
    root.delegate(device.identity.public_key, ["publish"])
    first = device.skills.publish("kept", "pick")
    device.skills.publish("cut", "pick")
    root.ingest(device.envelopes_since({}))
    root.revoke_key(device.identity.public_key, last_seq=1)
    receiver = open_site(trust=[root.identity.public_key])
    report = receiver.ingest(
        device.envelopes_since({}) + root.envelopes_since({}, exclude={device.identity.public_key})
    )
    check_report(report, 4)
    assert "revoked_writer" in report.reasons()
    assert [s.id for s in receiver.skills.list()] == [first.id]
    assert receiver.heads()[device.identity.public_key_hex].seq == 1


def test_expired_delegation():
    now_ms = time.time_ns() // 1_000_000
    device_time = [now_ms - 60_000]
    root = open_site()
    device = open_site(clock=HybridClock(physical_ms=lambda: device_time[0]))
    root.delegate(device.identity.public_key, ["publish"], expires=pack(now_ms - 30_000))
    early = device.skills.publish("before-expiry", "pick")
    receiver = open_site(trust=[root.identity.public_key])
    accept_all(receiver, root.envelopes_since({}) + device.envelopes_since({}))
    assert [s.id for s in receiver.skills.list()] == [early.id]

    device_time[0] = now_ms  # the device keeps writing after its delegation expired
    device.skills.publish("after-expiry", "pick")
    late = device.envelopes_since({device.identity.public_key_hex: 1})
    (rejection,) = assert_refused(receiver, late, "delegation_expired")
    assert rejection.author == device.identity.public_key_hex and rejection.seq == 2


# --- forged client ids --------------------------------------------------------------------------


def _foreign_doc(author: bytes) -> tuple[Doc, Map]:
    doc = Doc(client_id=client_id_for(author))
    return doc, doc.get(RECORDS_MAP, type=Map)


def test_forged_client_id(setup):
    """A valid, signed envelope whose update writes as another writer's Yjs client id."""
    writer, receiver = setup
    victim = Identity.generate().public_key
    _doc, records = _foreign_doc(victim)
    records["cell/floor1/1,2"] = record_text(
        {"v": 1, "hlc": 1, "value": "forged", "confidence": 1.0}
    )
    forged = writer.forge(_doc.get_update())
    (rejection,) = assert_refused(receiver, [forged], "foreign_client_id")
    assert str(client_id_for(victim)) in rejection.detail


def test_forged_client_id_in_an_incremental_update(setup):
    """The foreign structs start past clock 0 (a later transaction of the foreign Doc)."""
    writer, receiver = setup
    doc, records = _foreign_doc(Identity.generate().public_key)
    records["cell/floor1/9,9"] = record_text({"v": 1, "hlc": 1, "value": 1, "confidence": 0.1})
    state_vector = doc.get_state()
    records["cell/floor1/1,2"] = record_text(
        {"v": 1, "hlc": 2, "value": "forged", "confidence": 1.0}
    )
    forged = writer.forge(doc.get_update(state_vector))
    assert_refused(receiver, [forged], "foreign_client_id")


def test_forged_client_id_mixed_with_own_structs(setup):
    writer, receiver = setup
    own = writer.next_update(
        {"cell/floor1/3,3": record_text({"v": 1, "hlc": 5, "value": 1, "confidence": 0.5})}
    )
    doc, records = _foreign_doc(Identity.generate().public_key)
    records["cell/floor1/4,4"] = record_text({"v": 1, "hlc": 5, "value": 2, "confidence": 0.5})
    forged = writer.forge(merge_updates(own, doc.get_update()))
    assert_refused(receiver, [forged], "foreign_client_id")
    accept_all(receiver, [writer.forge(own)])  # the writer's own update alone is fine


def test_signed_but_corrupt_update_is_rejected_not_raised(setup):
    """A signed envelope whose Yjs update is corrupt (one content-type byte changed) must be
    rejected with a reason; pycrdt must not get to panic inside ingest."""
    writer, receiver = setup
    good = writer.next_update({"skill/x": '{"a":1}', "cell/m/1,2": '{"v":1}'})
    marker = (
        b"\x28\x01\x07records"  # the first struct: ContentAny (8) with a named parent "records"
    )
    assert marker in good
    corrupt = good.replace(marker, b"\x26\x01\x07records", 1)  # now claims ContentFormat (6)
    assert_refused(receiver, [writer.forge(corrupt)], "malformed_update")


@pytest.mark.parametrize(
    "update", [b"\x00", b"\xff" * 8, b"\x01\x01\x05\x00\x28\x01", b"not a yjs update"]
)
def test_signed_garbage_update(setup, update):
    writer, receiver = setup
    assert_refused(receiver, [writer.forge(update)], "malformed_update")


# --- immutable records (skills, certificates, revocations) --------------------------------------


@pytest.fixture
def certified():
    """A writer that published, certified and revoked a skill; a receiver holding all of it."""
    w_kb = open_site()
    writer = Writer(w_kb)
    skill = w_kb.skills.publish("pick-mug", "pick")
    cert = w_kb.certificates.add(skill.id, branches=64, successes=64)
    w_kb.revoke(skill.id, "drops mugs")
    receiver = open_site(trust=[w_kb.identity.public_key])
    accept_all(receiver, writer.envelopes())
    assert receiver.is_revoked(skill.id) and len(receiver.certificates.for_skill(skill.id)) == 1
    return writer, receiver, skill, cert


@pytest.mark.parametrize("target", ["skill", "cert", "revoke"])
@pytest.mark.parametrize("action", ["delete", "rewrite"])
def test_signed_update_that_modifies_an_immutable_record(certified, target, action):
    """The writer itself signs an update that deletes or rewrites its skill, certificate or
    revocation (un-revoking a skill, withdrawing a certificate after the fact): refused, nothing
    changes."""
    writer, receiver, skill, cert = certified
    key = {"skill": f"skill/{skill.id}", "cert": f"cert/{cert.id}", "revoke": f"revoke/{skill.id}"}[
        target
    ]
    text = (
        None if action == "delete" else record_text({"v": 1, "hlc": 1, "reason": "changed my mind"})
    )
    (rejection,) = assert_refused(
        receiver, [writer.forge(writer.next_update({key: text}))], "modifies_immutable_record"
    )
    assert rejection.detail


@pytest.mark.parametrize("target", ["cert", "revoke"])
def test_a_writer_never_commits_a_rewrite_of_its_immutable_records(certified, target):
    """Like an oversized envelope, an envelope that rewrites an immutable record is refused by every
    peer (modifies_immutable_record) and strands every later envelope of the writer as a gap. The
    local write path must refuse it instead of committing it (and showing a view its peers never
    will)."""
    writer, receiver, skill, cert = certified
    key = f"cert/{cert.id}" if target == "cert" else f"revoke/{skill.id}"
    with pytest.raises(knowledge.SimnetError):
        writer.kb._replica.write({key: None})
    assert writer.kb.is_revoked(skill.id) and len(writer.kb.certificates.for_skill(skill.id)) == 1
    writer.kb.skills.publish("after", "t")
    accept_all(receiver, writer.envelopes())
    assert receiver.snapshot() == writer.kb.snapshot()


def test_origin_less_reinsert_of_an_immutable_key_does_not_replace_it(certified):
    """A hand-made update from a Doc with the writer's client id that never saw the existing records
    inserts the same keys afresh (no origins, so nothing points at the old items). Whatever ingest
    does with it, the certificate, skill and revocation must stay as they are."""
    writer, receiver, skill, cert = certified
    doc = Doc(client_id=client_id_for(writer.identity.public_key))
    pad = doc.get(RECORDS_MAP, type=Map)
    with doc.transaction():
        for i in range(
            next_clock(writer)
        ):  # one clock per map entry: catch up with the writer's clock
            pad[f"cell/pad/{i}"] = "x"
    state_vector = doc.get_state()
    assert parse_clock(state_vector) == next_clock(writer)
    immutable = doc.get(IMMUTABLE_MAP, type=Map)
    immutable[f"cert/{cert.id}"] = "garbage"
    immutable[f"skill/{skill.id}"] = "garbage"
    immutable[f"revoke/{skill.id}"] = record_text({"v": 1, "hlc": 1, "reason": "rewritten"})
    forged = writer.forge(doc.get_update(state_vector))
    snapshot = receiver.snapshot()
    report = receiver.ingest([forged])
    check_report(report, 1)
    assert report.reasons() in ([], ["modifies_immutable_record"])
    assert receiver.snapshot() == snapshot
    assert receiver.is_revoked(skill.id)
    assert [c.id for c in receiver.certificates.for_skill(skill.id)] == [cert.id]
    assert receiver.skills.get(skill.id).name == "pick-mug"


def parse_clock(state_vector: bytes) -> int:
    """The clock of the single client in a one-client lib0 state vector."""
    from knowledge._yjs import _uint

    _n, pos = _uint(state_vector, 0)
    _client, pos = _uint(state_vector, pos)
    return _uint(state_vector, pos)[0]


def next_clock(writer: Writer) -> int:
    return parse_clock(writer.replica.doc.get_state())


def test_misplaced_record_is_reported_and_not_shown(setup):
    """A revocation written into the mutable root map (where it could later be rewritten) is never
    shown."""
    writer, receiver = setup
    doc = Feed(writer.identity.public_key)
    doc.apply(writer.replica.state())
    before = doc.doc.get_state()
    skill_id = receiver.skills.list()[0].id
    doc.doc.get(RECORDS_MAP, type=Map)[f"revoke/{skill_id}"] = record_text(
        {"v": 1, "hlc": 1, "reason": "x"}
    )
    forged = writer.forge(doc.doc.get_update(before))
    snapshot = receiver.snapshot()
    report = accept_all(receiver, [forged])
    assert [(i.key, i.reason.split(":")[0]) for i in report.record_issues] == [
        (f"revoke/{skill_id}", "misplaced_record")
    ]
    assert not receiver.is_revoked(skill_id)
    assert receiver.snapshot() == snapshot


# --- order, duplicates, chain, size -------------------------------------------------------------


def test_gap_out_of_order(setup):
    writer, receiver = setup
    writer.kb.skills.publish("a", "t")
    writer.kb.skills.publish("b", "t")
    e3, e4 = writer.envelopes()
    (rejection,) = assert_refused(receiver, [e4], "gap")
    assert rejection.seq == 4
    accept_all(receiver, [e3])
    accept_all(receiver, [e4])  # once the predecessor arrived, the same envelope is fine


def test_out_of_order_within_one_batch_is_sorted_out(setup):
    writer, receiver = setup
    for name in "abc":
        writer.kb.skills.publish(name, "t")
    envs = writer.envelopes()
    report = accept_all(receiver, list(reversed(envs)))
    assert [seq for _a, seq in report.accepted] == [3, 4, 5]
    assert receiver.snapshot() == writer.kb.snapshot()


def test_duplicated_envelopes(setup):
    writer, receiver = setup
    held = receiver.envelopes_since({})
    before = state(receiver)
    report = receiver.ingest(held + held)
    check_report(report, 2 * len(held))
    assert report.duplicates == 2 * len(held) and report.accepted == [] and report.rejected == []
    assert state(receiver) == before
    writer.kb.skills.publish("new", "t")
    (new,) = writer.envelopes()
    report = receiver.ingest([new, new, new])
    assert len(report.accepted) == 1 and report.duplicates == 2 and report.rejected == []


def test_broken_chain(setup):
    writer, receiver = setup
    update = writer.next_update(
        {"cell/floor1/5,5": record_text({"v": 1, "hlc": 9, "value": 0, "confidence": 1})}
    )
    assert_refused(receiver, [writer.forge(update, prev=b"\x42" * 32)], "broken_chain")


def test_clock_regressed(setup):
    writer, receiver = setup
    update = writer.next_update(
        {"cell/floor1/5,5": record_text({"v": 1, "hlc": 9, "value": 0, "confidence": 1})}
    )
    assert_refused(receiver, [writer.forge(update, hlc=writer.last.hlc)], "clock_regressed")
    assert_refused(receiver, [writer.forge(update, hlc=1)], "clock_regressed")


def test_oversized_envelope(setup):
    writer, receiver = setup
    limited = open_site(trust=[writer.identity.public_key], limits=Limits(max_envelope_bytes=2048))
    accept_all(limited, receiver.envelopes_since({}))
    writer.kb.skills.publish("big", "t", description="x" * 3000)
    (raw,) = writer.envelopes()
    assert len(raw) > 2048
    (rejection,) = assert_refused(limited, [raw], "too_large")
    assert str(len(raw)) in rejection.detail
    accept_all(receiver, [raw])  # the default limit admits it


def test_oversized_checkpoint(setup):
    writer, _receiver = setup
    checkpoint = writer.kb.checkpoint().raw
    newcomer = open_site(
        trust=[writer.identity.public_key], limits=Limits(max_checkpoint_bytes=len(checkpoint) - 1)
    )
    assert_refused(newcomer, [checkpoint], "too_large")
    accept_all(open_site(trust=[writer.identity.public_key]), [checkpoint])


def test_envelope_limit_does_not_apply_to_checkpoints_and_vice_versa(setup):
    writer, _receiver = setup
    checkpoint = writer.kb.checkpoint().raw
    newcomer = open_site(
        trust=[writer.identity.public_key], limits=Limits(max_envelope_bytes=len(checkpoint) - 1)
    )
    accept_all(newcomer, [checkpoint])


def test_a_writer_never_commits_an_envelope_its_peers_must_refuse_as_too_large():
    """Every record is under the record limit, but one batch of them makes an envelope over the
    default envelope limit. If the writer commits it, every peer refuses it (too_large) and then
    every later envelope of that writer as a gap: the feed is stuck for good. The write must be
    refused instead."""
    writer = open_site()
    with pytest.raises(knowledge.SimnetError):
        with writer.batch():
            for i in range(5):
                writer.skills.publish(f"s{i}", "t", meta={"blob": "x" * 250_000})
    writer.skills.publish("after", "t")
    receiver = open_site(trust=[writer.identity.public_key])
    report = accept_all(receiver, writer.envelopes_since({}))
    assert [s.name for s in receiver.skills.list()] == ["after"]
    assert report.accepted


# --- records that fail schema checks ------------------------------------------------------------

SKILL_REC = {"v": 1, "name": "n", "task": "t", "hlc": 1}


def _bad_records(author_hex: str) -> dict[str, tuple[str, str, str]]:
    good_skill = record_text({**SKILL_REC, "author": author_hex})
    other_author = record_text({**SKILL_REC, "author": "cd" * 32})
    return {
        "skill-id-not-hash": ("skill/" + "ab" * 32, good_skill, "invalid_record"),
        "skill-author-mismatch": (
            "skill/" + content_id(other_author),
            other_author,
            "invalid_record",
        ),
        "cell-confidence": (
            "cell/floor1/7,7",
            record_text({"v": 1, "hlc": 1, "value": 1, "confidence": 1.5}),
            "invalid_record",
        ),
        "counter-negative": (
            "counter/" + "ab" * 32,
            record_text(
                {
                    "v": 1,
                    "hlc": 1,
                    "p": {"uses": -1, "successes": 0, "failures": 0},
                    "n": {"uses": 0, "successes": 0, "failures": 0},
                }
            ),
            "invalid_record",
        ),
        "cert-successes": (
            "cert/"
            + content_id(
                c := record_text(
                    {
                        "v": 1,
                        "hlc": 1,
                        "skill": "ab" * 32,
                        "validator": author_hex,
                        "branches": 4,
                        "successes": 5,
                        "confidence": 0.95,
                    }
                )
            ),
            c,
            "invalid_record",
        ),
        "not-json": ("revoke/" + "ab" * 32, "this is not json", "invalid_record"),
        "json-array": ("withdraw/" + "ab" * 32, "[1,2,3]", "invalid_record"),
        "delegate-unknown-role": (
            "delegate/" + "ef" * 32,
            record_text({"v": 1, "hlc": 1, "roles": ["admin"]}),
            "invalid_record",
        ),
        "bad-key": (
            "cell/bad map name/1",
            record_text({"v": 1, "hlc": 1, "value": 1, "confidence": 0.5}),
            "invalid_key",
        ),
        "no-version": ("revoke/" + "ab" * 32, record_text({"hlc": 1}), "invalid_record"),
    }


@pytest.mark.parametrize("case", list(_bad_records("00" * 32)))
def test_record_failing_schema_checks(setup, case):
    writer, receiver = setup
    key, text, reason = _bad_records(writer.identity.public_key_hex)[case]
    writer.kb._replica.write({key: text})  # straight into the feed, past the API's own checks
    (raw,) = writer.envelopes()
    snapshot = receiver.snapshot()
    report = receiver.ingest([raw])
    check_report(report, 1)
    # The envelope is valid and accepted (stored and forwarded) ...
    assert report.accepted == [(writer.identity.public_key_hex, 3)] and report.rejected == []
    assert receiver.heads()[writer.identity.public_key_hex].seq == 3
    # ... its record is reported and absent from the views.
    assert [(i.author, i.key) for i in report.record_issues] == [
        (writer.identity.public_key_hex, key)
    ]
    assert report.record_issues[0].reason.startswith(reason + ":")
    assert receiver.snapshot() == snapshot


def test_newer_schema_record_is_kept_and_forwarded(setup):
    writer, receiver = setup
    future = record_text({"v": 2, "hlc": 1, "value": {"mesh": "..."}, "confidence": 0.9, "lod": 3})
    writer.kb._replica.write({"cell/floor1/8,8": future, "hologram/abc": '{"v":1}'})
    (raw,) = writer.envelopes()
    snapshot = receiver.snapshot()
    report = accept_all(receiver, [raw])
    assert sorted(i.reason.split(":")[0] for i in report.record_issues) == [
        "newer_schema",
        "unknown_type",
    ]
    assert receiver.snapshot() == snapshot
    assert raw in receiver.envelopes_since(
        {}
    )  # nothing dropped: an old site is no hole in the mesh
    third = open_site(trust=[writer.identity.public_key])
    accept_all(third, receiver.envelopes_since({}))
    assert third.heads() == receiver.heads()


# --- clocks -------------------------------------------------------------------------------------


def test_clock_too_far_ahead():
    """Beyond the hold horizon (10 minutes by default) an envelope is refused, not held."""
    ahead = open_site(
        clock=HybridClock(physical_ms=lambda: time.time_ns() // 1_000_000 + 3_600_000)
    )
    ahead.skills.publish("from-the-future", "pick")
    receiver = open_site(trust=[ahead.identity.public_key])
    (rejection,) = assert_refused(receiver, ahead.envelopes_since({}), "clock_skew")
    assert "ahead" in rejection.detail and "held up to 600000 ms" in rejection.detail
    assert receiver.held() == []
    # A site whose policy accepts a larger offset takes it.
    lenient = knowledge.open(
        ":memory:",
        Identity.generate(),
        policy=TrustPolicy(max_clock_offset_ms=4_000_000).with_root(ahead.identity.public_key),
    )
    accept_all(lenient, ahead.envelopes_since({}))


def test_clock_skew_does_not_move_the_receivers_clock():
    ahead = open_site(
        clock=HybridClock(physical_ms=lambda: time.time_ns() // 1_000_000 + 3_600_000)
    )
    ahead.skills.publish("s", "t")
    receiver = open_site(trust=[ahead.identity.public_key])
    assert_refused(receiver, ahead.envelopes_since({}), "clock_skew")
    assert receiver.now() < pack(time.time_ns() // 1_000_000 + 60_000)


# --- equivocation -------------------------------------------------------------------------------


@dataclass
class Equivocation:
    author: Identity
    a: list[bytes]
    b: list[bytes]


def _equivocate() -> Equivocation:
    """Two knowledge bases with the same identity write different seq-1 envelopes (a restored
    backup)."""
    twin = Identity.generate()
    k1, k2 = open_site(twin), open_site(twin)
    k1.skills.publish("version-a", "pick")
    k1.skills.publish("more-a", "pick")
    k2.skills.publish("version-b", "pick")
    return Equivocation(twin, k1.envelopes_since({}), k2.envelopes_since({}))


def test_equivocation_is_detected_kept_as_evidence_and_stops_the_author():
    eq = _equivocate()
    x = eq.author.public_key_hex
    k3 = open_site(trust=[eq.author.public_key])
    accept_all(k3, eq.a[:1])
    assert len(k3.skills.list()) == 1

    report = k3.ingest(eq.b[:1])
    check_report(report, 1)
    assert report.equivocations == [(x, 1)] and report.accepted == [] and report.rejected == []
    assert k3.equivocations() == [(x, 1)]
    assert k3.snapshot()["equivocators"] == [x]
    assert k3.skills.list() == []  # the author's data stops before the fork
    assert k3.heads()[x] == knowledge.Head(
        0, "0" * 64, equivocated_at=1
    )  # nothing held; the fork is known
    evidence = k3.envelopes_since({})
    assert sorted(evidence) == sorted([eq.a[0], eq.b[0]])  # both envelopes kept, and forwarded

    # Further envelopes from the equivocator are refused and change nothing.
    (rejection,) = assert_refused(k3, [eq.a[1]], "equivocating_author")
    assert rejection.author == x
    assert_refused(k3, [eq.a[0]], "equivocating_author")

    # A fourth site learns of it through envelopes_since.
    k4 = open_site(trust=[eq.author.public_key])
    report = k4.ingest(k3.envelopes_since(k4.heads()))
    check_report(report, 2)
    assert report.equivocations == [(x, 1)]
    assert k4.equivocations() == [(x, 1)]
    assert k4.snapshot() == k3.snapshot()
    assert_refused(k4, [eq.b[0]], "equivocating_author")


def test_equivocation_within_one_batch():
    eq = _equivocate()
    k3 = open_site(trust=[eq.author.public_key])
    report = k3.ingest([eq.a[0], eq.b[0], eq.a[1]])
    check_report(report, 3)
    assert report.equivocations == [(eq.author.public_key_hex, 1)]
    assert k3.skills.list() == []


def test_equivocation_later_in_the_feed_keeps_the_common_prefix():
    twin = Identity.generate()
    k1 = open_site(twin)
    common = k1.skills.publish("common", "pick")
    prefix = k1.envelopes_since({})
    k2 = open_site(twin)
    accept_all(k2, prefix)  # the twin restored the first envelope, then both write seq 2
    k2.learn_peer_heads(k1.heads())  # a forger's store takes its twin's word
    k1.skills.publish("fork-a", "pick")
    k2.skills.publish("fork-b", "pick")
    k3 = open_site(trust=[twin.public_key])
    accept_all(k3, k1.envelopes_since({}))
    report = k3.ingest(k2.envelopes_since({twin.public_key_hex: 1}))
    assert report.equivocations == [(twin.public_key_hex, 2)]
    assert [s.id for s in k3.skills.list()] == [common.id]
    assert k3.heads()[twin.public_key_hex].seq == 1


def test_equivocation_evidence_survives_a_reopen(tmp_path):
    """The evidence is durable and still forwarded after a restart (here the fork is at seq 1, so
    the author has no envelope left in the store)."""
    eq = _equivocate()
    me = Identity.generate()
    path = tmp_path / "k3.db"
    k3 = open_site(me, trust=[eq.author.public_key], path=path)
    accept_all(k3, eq.a[:1])
    assert k3.ingest(eq.b[:1]).equivocations
    k3.close()
    k3 = knowledge.open(path, me)
    try:
        assert k3.equivocations() == [(eq.author.public_key_hex, 1)]
        assert_refused(k3, [eq.a[1]], "equivocating_author")
        k4 = open_site(trust=[eq.author.public_key])
        report = k4.ingest(k3.envelopes_since(k4.heads()))
        assert report.equivocations == [(eq.author.public_key_hex, 1)]
    finally:
        k3.close()


def test_sync_with_a_peer_that_knows_an_equivocation_terminates():
    """envelopes_since: "Call again with the peer's new heads until the answer is empty" must
    terminate once the peer holds everything, evidence included."""
    eq = _equivocate()
    k3 = open_site(trust=[eq.author.public_key])
    k3.ingest(eq.a[:1] + eq.b[:1])
    k4 = open_site(trust=[eq.author.public_key])
    for _round in range(5):
        batch = k3.envelopes_since(k4.heads())
        if not batch:
            break
        k4.ingest(batch)
    assert k3.envelopes_since(k4.heads()) == []
    assert k4.equivocations() == k3.equivocations()


# --- fuzzing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    writer: Identity
    held: tuple[bytes, ...]  # envelopes the receiver holds
    fresh: tuple[bytes, ...]  # genuinely valid envelopes that would change the receiver
    other: tuple[bytes, ...]  # valid envelopes of an unknown writer

    @property
    def sources(self) -> tuple[bytes, ...]:
        return self.held + self.fresh + self.other

    def receiver(self) -> knowledge.KnowledgeBase:
        kb = open_site(trust=[self.writer.public_key])
        accept_all(kb, list(self.held))
        return kb


@functools.lru_cache(maxsize=1)
def world() -> World:
    w = open_site()
    w.skills.publish("pick-mug", "pick", description="grasp a mug")
    w.maps["floor1"].observe((1, 2), {"label": "shelf"}, confidence=0.7)
    held = w.envelopes_since({})
    skill = w.skills.list()[0]
    w.counters.record(skill.id, success=True)
    w.certificates.add(skill.id, branches=64, successes=64, randomized=["mass"])
    fresh = w.envelopes_since({w.identity.public_key_hex: 2}) + [w.checkpoint().raw]
    stranger = open_site()
    stranger.skills.publish("unknown", "pick")
    return World(w.identity, tuple(held), tuple(fresh), tuple(stranger.envelopes_since({})))


def _ingest_and_check(inputs: list) -> None:
    wd = world()
    kb = wd.receiver()
    before = state(kb)
    report = kb.ingest(inputs)  # must not raise, whatever the bytes
    check_report(report, len(inputs))
    if not any(isinstance(i, bytes) and i in wd.fresh for i in inputs):
        assert report.accepted == [] and report.equivocations == []
        assert state(kb) == before


@FUZZ
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_fuzz_random_bytes(inputs):
    _ingest_and_check(inputs)


@st.composite
def structured_garbage(draw):
    """Bytes with a plausible header (right version, kind and length) so they get past the
    decoder."""
    wd = world()
    author = draw(
        st.sampled_from([wd.writer.public_key, Identity.from_seed(b"\x07" * 32).public_key])
    )
    update = draw(st.binary(max_size=120))
    header = (
        bytes([1, draw(st.sampled_from([1, 2]))])
        + author
        + draw(st.integers(1, 6)).to_bytes(8, "big")
    )
    header += draw(st.binary(min_size=32, max_size=32)) + draw(st.integers(0, 2**64 - 1)).to_bytes(
        8, "big"
    )
    return (
        header + len(update).to_bytes(4, "big") + update + draw(st.binary(min_size=64, max_size=64))
    )


@FUZZ
@given(st.lists(structured_garbage(), min_size=1, max_size=3))
def test_fuzz_structured_garbage(inputs):
    _ingest_and_check(inputs)


@st.composite
def mutated(draw):
    wd = world()
    raw = bytearray(draw(st.sampled_from(wd.sources)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "splice"]))
        if op == "flip" and raw:
            pos = draw(st.integers(0, len(raw) - 1))
            raw[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        elif op == "truncate":
            del raw[draw(st.integers(0, len(raw))) :]
        elif op == "insert":
            pos = draw(st.integers(0, len(raw)))
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and raw:
            pos = draw(st.integers(0, len(raw) - 1))
            del raw[pos : pos + draw(st.integers(1, 8))]
        elif op == "splice":
            other = draw(st.sampled_from(wd.sources))
            raw = raw[: draw(st.integers(0, len(raw)))] + bytearray(
                other[draw(st.integers(0, len(other))) :]
            )
    out = bytes(raw)
    assume(out not in wd.sources)
    return out


@FUZZ
@given(st.lists(mutated(), min_size=1, max_size=3))
def test_fuzz_mutated_envelopes(inputs):
    _ingest_and_check(inputs)


def _flip_last_byte(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 1])


@FUZZ
@given(
    st.lists(mutated(), min_size=1, max_size=2),
    st.lists(st.sampled_from(world().sources), max_size=3),
    st.randoms(use_true_random=False),
)
@example(
    bad=[_flip_last_byte(world().fresh[1])], good=[world().fresh[2]], rnd=random.Random(0)
)  # found by hypothesis
def test_fuzz_mutated_mixed_with_valid(bad, good, rnd):
    """Bad envelopes next to good ones in one batch: the good ones behave as alone, the bad change
    nothing."""
    wd = world()
    inputs = bad + good
    rnd.shuffle(inputs)
    alone = wd.receiver()
    alone.ingest(good)
    kb = wd.receiver()
    report = kb.ingest(inputs)
    check_report(report, len(inputs))
    bad_indexes = {i for i, raw in enumerate(inputs) if raw not in wd.sources}
    assert {r.index for r in report.rejected} >= bad_indexes
    assert state(kb) == state(alone)


@FUZZ
@given(st.data())
def test_fuzz_signed_mutated_updates(data):
    """The writer itself signs a corrupted Yjs update: the bytes reach the Yjs checks; ingest must
    still never raise, and a rejected envelope must change nothing."""
    wd = world()
    kb = wd.receiver()
    held = [decode(r, max_bytes=1 << 30) for r in wd.held]
    fresh = decode(wd.fresh[0], max_bytes=1 << 30)
    update = bytearray(fresh.update)
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["set", "truncate", "insert"]))
        if op == "set" and update:
            update[data.draw(st.integers(0, len(update) - 1))] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del update[data.draw(st.integers(0, len(update))) :]
        else:
            pos = data.draw(st.integers(0, len(update)))
            update[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    raw = seal(wd.writer, Kind.UPDATE, 3, held[-1].hash, fresh.hlc, bytes(update)).raw
    before = state(kb)
    report = kb.ingest([raw])
    check_report(report, 1)
    if report.rejected:
        # a flipped digit may also make a record's text claim a later time than its envelope, or
        # break a record's limits or an immutable key: each refused by its own reason
        assert report.rejected[0].reason in {
            "malformed_update",
            "foreign_client_id",
            "record_clock_ahead",
            "oversized_record",
            "modifies_immutable_record",
        }
        assert state(kb) == before

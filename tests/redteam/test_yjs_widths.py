"""A trusted device tries to un-revoke a skill and delete a certificate with Yjs field widths (issue
#13, 2).

yrs, the Yjs core inside pycrdt, reads clocks and lengths as u32 (a clock of 2**32 + c is clock c)
and client ids as 53 bits. The device, delegated publish, validate and revoke by its site root,
signs updates whose origins, deletes, lengths, group clocks or client ids are wider than that, or
that leave gaps, point at clocks it never wrote, or cross the clock the receiver holds. Each is
refused, nothing the receiver shows changes, and after a restart the revocation and the certificate
are still there. Only the public API and the documented wire format are used: envelopes are built
and signed by hand.
"""

from __future__ import annotations

import hashlib
import struct

import pytest
from pycrdt import Doc, Map

import knowledge
from knowledge import Identity, TrustPolicy

ROOT = Identity.from_seed(b"\x21" * 32, new=True)
DEVICE = Identity.from_seed(b"\x22" * 32, new=True)
VICTIM = Identity.from_seed(b"\x23" * 32, new=True)
POLICY = TrustPolicy().with_root(ROOT.public_key, name="site-a")
HEADER = struct.Struct(
    ">BB32sQ32sQI"
)  # version, kind, author, seq, prev, hlc, update length (PROTOCOL.md)


# --- the attacker's tools: a var-uint encoder, a Yjs v1 update builder, an envelope signer --------


def var(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out) + bytes([n])


def string(value: str) -> bytes:
    return var(len(value.encode())) + value.encode()


def after(client: int, clock: int, value: str) -> bytes:
    """An item whose left origin is (client, clock): it takes that item's map entry, overwriting
    it."""
    return b"\x88" + var(client) + var(clock) + var(1) + b"\x77" + string(value)


def entry(root: str, key: str, value: str) -> bytes:
    return b"\x28" + var(1) + string(root) + string(key) + var(1) + b"\x77" + string(value)


def update(client: int, clock: int, structs=(), deletes=()) -> bytes:
    out = (
        var(1) + var(len(structs)) + var(client) + var(clock) + b"".join(structs)
        if structs
        else var(0)
    )
    if not deletes:
        return out + var(0)
    return (
        out
        + var(1)
        + var(client)
        + var(len(deletes))
        + b"".join(var(c) + var(n) for c, n in deletes)
    )


def client_id(key: bytes) -> int:
    """The writer's Yjs client id, as docs/PROTOCOL.md defines it."""
    return int.from_bytes(hashlib.sha256(b"simnet-client-id\x00" + key).digest()[:8], "big") >> 11


def sign(identity: Identity, seq: int, prev: bytes, hlc: int, yjs: bytes, kind: int = 1) -> bytes:
    body = HEADER.pack(1, kind, identity.public_key, seq, prev, hlc, len(yjs)) + yjs
    return body + identity.sign(b"simnet\x00" + body)


# --- the scene ------------------------------------------------------------------------------------


class Scene:
    """The device's feed as the attacker sees it: its envelopes, the clock of each record, its next
    clock."""

    def __init__(self, device: knowledge.KnowledgeBase, skill_id: str, cert_id: str) -> None:
        self.envelopes = device.envelopes_since({ROOT.public_key_hex: 10**6})
        self.updates = [raw[86 : 86 + struct.unpack(">I", raw[82:86])[0]] for raw in self.envelopes]
        self.client = client_id(DEVICE.public_key)
        self.clocks: dict[str, int] = {}
        doc = Doc()
        keys = [f"skill/{skill_id}", f"cert/{cert_id}", f"revoke/{skill_id}"]
        for yjs in self.updates:  # one record per envelope: its clock is the state before it
            start = self.state(doc)
            doc.apply_update(yjs)
            for key in keys:
                if key in doc.get("immutable", type=Map) and key not in self.clocks:
                    self.clocks[key] = start
        self.next = self.state(doc)
        self.skill, self.cert, self.revoke = (self.clocks[k] for k in keys)
        self.revoke_key = keys[2]
        last = self.envelopes[-1]
        self.seq, self.hlc = (
            struct.unpack(">Q", last[34:42])[0] + 1,
            struct.unpack(">Q", last[74:82])[0] + 1,
        )
        self.prev = hashlib.sha256(last).digest()

    def state(self, doc: Doc) -> int:
        sv = doc.get_state()
        return 0 if sv == b"\x00" else _read_clock(sv, self.client)

    def sealed(self, yjs: bytes) -> bytes:
        return sign(DEVICE, self.seq, self.prev, self.hlc, yjs)

    def bare_doc(self) -> Doc:
        """A plain pycrdt Doc holding the device's feed: what the attack would do without the
        checks."""
        doc = Doc()
        for yjs in self.updates:
            doc.apply_update(yjs)
        return doc


def _read_clock(state: bytes, client: int) -> int:
    def uint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = state[pos]
            value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
            if byte < 0x80:
                return value, pos

    count, pos = uint(0)
    for _ in range(count):
        who, pos = uint(pos)
        clock, pos = uint(pos)
        if who == client:
            return clock
    return 0


@pytest.fixture
def scene(tmp_path):
    """The root delegates to the device; the device publishes, certifies and revokes a skill; the
    victim site (on a file) holds all of it."""
    root = knowledge.open(":memory:", ROOT, policy=POLICY)
    device = knowledge.open(":memory:", DEVICE, policy=POLICY)
    root.delegate(DEVICE.public_key, ["publish", "validate", "revoke"])
    device.ingest(root.envelopes_since({}))
    skill = device.skills.publish("pick-mug", "pick")
    cert = device.certificates.add(skill.id, branches=64, successes=64)
    device.revoke(skill.id, "drops mugs")
    victim = knowledge.open(tmp_path / "victim.db", VICTIM, policy=POLICY)
    report = victim.ingest(root.envelopes_since({}) + device.envelopes_since({}))
    assert report.rejected == [] and victim.is_revoked(skill.id)
    assert [c.id for c in victim.certificates.for_skill(skill.id)] == [cert.id]
    yield Scene(device, skill.id, cert.id), victim, device, skill.id, cert.id
    for kb in (root, device, victim):
        kb.close()


# --- the attacks ----------------------------------------------------------------------------------

UNREVOKED = '{"hlc":1,"reason":"","v":1}'


def attacks(s: Scene) -> dict[str, tuple[bytes, str]]:
    """name: (Yjs update, the rejection reason it must get)."""
    c, n, wide = s.client, s.next, 2**32
    return {
        # widths: yrs reads each of these as a clock or client of the record
        "origin clock 2**32 + revocation": (
            update(c, n, [after(c, wide + s.revoke, UNREVOKED)]),
            "malformed_update",
        ),
        "origin client 2**53 + own": (
            update(c, n, [after(c + 2**53, s.revoke, UNREVOKED)]),
            "malformed_update",
        ),
        "origin clock 2**64 - 1": (
            update(c, n, [after(c, 2**64 - 1, UNREVOKED)]),
            "malformed_update",
        ),
        "6-byte origin clock (yrs ORs bit 35 into bit 3)": (
            update(c, n, [after(c, 2**35, UNREVOKED)]),
            "malformed_update",
        ),
        "delete clock 2**32 + revocation": (
            update(c, n, deletes=[(wide + s.revoke, 1)]),
            "malformed_update",
        ),
        "delete length 2**32 + 1 at the certificate": (
            update(c, n, deletes=[(s.cert, wide + 1)]),
            "malformed_update",
        ),
        "delete range wrapping past 2**32": (
            update(c, n, deletes=[(s.skill, wide - s.skill)]),
            "malformed_update",
        ),
        "group clock 2**32 + next": (
            update(c, wide + n, [entry("records", "cell/m/1,1", "x")]),
            "malformed_update",
        ),
        "group clock 2**32 - 1 (yrs panics)": (
            update(c, wide - 1, [entry("records", "cell/m/1,1", "x")]),
            "malformed_update",
        ),
        "group client 2**53 + own": (
            update(c + 2**53, n, [entry("records", "cell/m/1,1", "x")]),
            "malformed_update",
        ),
        "deleted length wrapping the clock": (
            update(
                c,
                n,
                [
                    b"\x21"
                    + var(1)
                    + string("records")
                    + string("cell/m/2,2")
                    + var(wide - n + s.revoke),
                    after(c, s.revoke, UNREVOKED),
                ],
            ),
            "malformed_update",
        ),
        # continuity: gaps, dangling ids, pending deletes
        "gap before the group": (
            update(c, n + 1, [entry("records", "cell/m/1,1", "x")]),
            "malformed_update",
        ),
        "origin at a clock never written": (
            update(c, n, [after(c, n + 5, UNREVOKED)]),
            "malformed_update",
        ),
        "delete of a clock not yet written": (update(c, n, deletes=[(n, 1)]), "malformed_update"),
        "group from 0 ending before the next clock": (
            update(c, 0, [b"\x00" + var(n - 1)]),
            "malformed_update",
        ),
        # a full state crossing the held clock continues from the item before it: the revocation
        "full state crossing the next clock": (
            update(c, 0, [b"\x00" + var(n + 1)]),
            "modifies_immutable_record",
        ),
        # control: the same aims in range are plain rewrites
        "origin at the revocation": (
            update(c, n, [after(c, s.revoke, UNREVOKED)]),
            "modifies_immutable_record",
        ),
        "delete of the certificate": (
            update(c, n, deletes=[(s.cert, 1)]),
            "modifies_immutable_record",
        ),
    }


def test_every_attack_is_refused_and_changes_nothing(scene):
    s, victim, _device, skill_id, cert_id = scene
    snapshot, heads = victim.snapshot(), victim.heads()
    for name, (yjs, reason) in attacks(s).items():
        report = victim.ingest([s.sealed(yjs)])
        assert report.accepted == [] and [r.reason for r in report.rejected] == [reason], (
            name,
            report.rejected,
        )
        assert report.rejected[0].detail
        assert victim.snapshot() == snapshot and victim.heads() == heads, name
    assert (
        victim.envelopes_since({ROOT.public_key_hex: 10**6, DEVICE.public_key_hex: s.seq - 1}) == []
    )
    assert victim.is_revoked(skill_id)
    assert [c.id for c in victim.certificates.for_skill(skill_id)] == [cert_id]


def test_the_width_attacks_would_work_on_a_bare_doc(scene):
    """Why these are attacks: without the checks, yrs applies them to the records they aim at."""
    s, *_ = scene
    made = attacks(s)
    doc = s.bare_doc()
    doc.apply_update(made["origin clock 2**32 + revocation"][0])
    assert doc.get("immutable", type=Map)[s.revoke_key] == UNREVOKED
    doc = s.bare_doc()
    doc.apply_update(made["delete clock 2**32 + revocation"][0])
    assert s.revoke_key not in doc.get("immutable", type=Map)
    doc = s.bare_doc()
    doc.apply_update(made["origin client 2**53 + own"][0])
    assert doc.get("immutable", type=Map)[s.revoke_key] == UNREVOKED


def test_the_record_survives_a_restart_and_the_device_can_still_write(scene, tmp_path):
    s, victim, device, skill_id, cert_id = scene
    snapshot = victim.snapshot()
    for yjs, _reason in attacks(s).values():
        victim.ingest([s.sealed(yjs)])
    victim.close()
    reopened = knowledge.open(tmp_path / "victim.db", VICTIM, policy=POLICY)
    try:
        assert reopened.snapshot() == snapshot
        assert reopened.is_revoked(skill_id)
        assert [c.id for c in reopened.certificates.for_skill(skill_id)] == [cert_id]
        device.maps["floor1"].observe(
            (1, 2), {"label": "shelf"}, confidence=0.7
        )  # continues at the next clock
        report = reopened.ingest(device.envelopes_since({DEVICE.public_key_hex: s.seq - 1}))
        assert report.rejected == [] and len(report.accepted) == 1
        assert reopened.is_revoked(skill_id)
    finally:
        reopened.close()


def test_a_later_checkpoint_that_drops_the_revocation_is_refused(scene, tmp_path):
    """A checkpoint at a seq the victim lacks is a full state from clock 0. Live, yrs skips the part
    the victim holds, so the revocation would stay; but the victim restarts from its stored
    checkpoint, so one without the revocation would un-revoke the skill at the next restart."""
    s, victim, _device, skill_id, cert_id = scene
    held = dict(s.bare_doc().get("immutable", type=Map).items())
    forged = Doc(client_id=s.client)
    immutable, records = forged.get("immutable", type=Map), forged.get("records", type=Map)
    for key in (f"skill/{skill_id}", f"cert/{cert_id}"):
        immutable[key] = held[key]
    records["cell/floor1/0,0"] = '{"v":1}'  # where the revocation was
    records["cell/floor1/0,1"] = '{"v":1}'
    state = forged.get_update()
    snapshot, heads = victim.snapshot(), victim.heads()
    checkpoint = sign(
        DEVICE, s.seq, hashlib.sha256(b"an envelope never sent").digest(), s.hlc, state, kind=2
    )
    report = victim.ingest([checkpoint])
    # A checkpoint that does not continue the author's envelopes is a fork: refused, kept as
    # evidence.
    assert [r.reason for r in report.rejected] == ["checkpoint_conflict"], report.rejected
    assert victim.equivocations() == [(DEVICE.public_key_hex, s.seq)]
    after = victim.snapshot()
    assert after["equivocators"] == [DEVICE.public_key_hex]
    assert {k: v for k, v in after.items() if k != "equivocators"} == {
        k: v for k, v in snapshot.items() if k != "equivocators"
    }
    assert victim.is_revoked(skill_id)
    assert {a: h.seq for a, h in victim.heads().items()} == {a: h.seq for a, h in heads.items()}
    victim.close()
    reopened = knowledge.open(tmp_path / "victim.db", VICTIM, policy=POLICY)
    try:
        assert reopened.is_revoked(skill_id) and reopened.snapshot() == after
    finally:
        reopened.close()

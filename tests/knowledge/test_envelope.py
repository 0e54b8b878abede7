"""Unit tests for knowledge._envelope: the signed, hash-chained wire format and its decoder."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import Envelope, EnvelopeError, Identity, Kind
from knowledge import verify_signature as verify
from knowledge._envelope import (
    HEADER_BYTES,
    MIN_BYTES,
    SIGNING_CONTEXT,
    VERSION,
    ZERO_HASH,
    decode,
    seal,
)
from knowledge._identity import SIGNATURE_BYTES

IDENTITY = Identity.from_seed(b"\x11" * 32)
OTHER = Identity.from_seed(b"\x22" * 32)
BIG = 1 << 30
DECODE_REASONS = {"malformed", "truncated", "too_large", "unsupported_version"}


def _decode_or_reason(raw: bytes, max_bytes: int = BIG) -> Envelope | str:
    try:
        return decode(raw, max_bytes=max_bytes)
    except EnvelopeError as exc:
        assert exc.reason in DECODE_REASONS, exc.reason
        assert exc.detail, "every rejection explains itself"
        assert str(exc) == f"{exc.reason}: {exc.detail}"
        return exc.reason


def _valid(seq: int = 1, update: bytes = b"12345678", kind: Kind = Kind.UPDATE) -> Envelope:
    prev = ZERO_HASH if (kind is Kind.UPDATE and seq == 1) else hashlib.sha256(b"prev").digest()
    return seal(IDENTITY, kind, seq, prev, 0x0123_4567_89AB_CDEF, update)


# --- layout -------------------------------------------------------------------------------------


def test_layout_matches_the_documented_wire_format():
    env = seal(IDENTITY, Kind.UPDATE, 7, b"\xaa" * 32, 0x1122334455667788, b"abc")
    raw = env.raw
    assert HEADER_BYTES == 86 and MIN_BYTES == 86 + 64
    assert len(raw) == 86 + 3 + 64
    assert raw[0] == VERSION == 1
    assert raw[1] == Kind.UPDATE == 1
    assert raw[2:34] == IDENTITY.public_key
    assert raw[34:42] == (7).to_bytes(8, "big")
    assert raw[42:74] == b"\xaa" * 32
    assert raw[74:82] == bytes.fromhex("1122334455667788")
    assert raw[82:86] == (3).to_bytes(4, "big")
    assert raw[86:89] == b"abc"
    assert raw[89:] == env.signature
    # The signature covers the signing context and every byte before it; the hash covers everything.
    assert verify(IDENTITY.public_key, env.signature, b"simnet\x00" + raw[:89])
    assert SIGNING_CONTEXT == b"simnet\x00"
    assert env.hash == hashlib.sha256(raw).digest()


def test_signature_does_not_verify_without_the_context():
    env = _valid()
    assert not verify(IDENTITY.public_key, env.signature, env.raw[:-SIGNATURE_BYTES])


def test_checkpoint_kind():
    env = _valid(seq=3, kind=Kind.CHECKPOINT)
    assert env.is_checkpoint
    assert env.raw[1] == 2
    decoded = decode(env.raw, max_bytes=BIG)
    assert decoded.kind is Kind.CHECKPOINT and decoded.is_checkpoint
    assert not _valid().is_checkpoint


# --- round trip (hypothesis) --------------------------------------------------------------------


@st.composite
def envelope_fields(draw):
    kind = draw(st.sampled_from(Kind))
    seq = draw(
        st.integers(1, (1 << 63) - 1)
    )  # seqs are signed 64-bit in every store: larger ones are refused
    if kind is Kind.UPDATE and seq == 1:
        prev = ZERO_HASH
    elif kind is Kind.UPDATE:
        prev = draw(st.binary(min_size=32, max_size=32).filter(lambda b: b != ZERO_HASH))
    else:
        prev = draw(st.binary(min_size=32, max_size=32))
    hlc = draw(st.integers(0, (1 << 64) - 1))
    update = draw(st.binary(max_size=300))
    return kind, seq, prev, hlc, update


@settings(max_examples=200)
@given(envelope_fields(), st.sampled_from([IDENTITY, OTHER]))
def test_seal_decode_round_trip(fields, identity):
    kind, seq, prev, hlc, update = fields
    env = seal(identity, kind, seq, prev, hlc, update)
    assert len(env.raw) == HEADER_BYTES + len(update) + SIGNATURE_BYTES
    got = decode(env.raw, max_bytes=len(env.raw))
    assert got == env
    assert (got.kind, got.author, got.seq, got.prev, got.hlc, got.update) == (
        kind,
        identity.public_key,
        seq,
        prev,
        hlc,
        update,
    )
    assert got.kind is kind
    assert got.raw == env.raw and got.hash == hashlib.sha256(env.raw).digest()
    assert got.signature_valid()


@settings(max_examples=50)
@given(envelope_fields())
def test_decode_accepts_bytearray_and_memoryview(fields):
    env = seal(IDENTITY, *fields)
    assert decode(bytearray(env.raw), max_bytes=BIG) == env
    assert decode(memoryview(env.raw), max_bytes=BIG) == env


def test_envelopes_of_different_content_have_different_hashes():
    a = seal(IDENTITY, Kind.UPDATE, 1, ZERO_HASH, 5, b"a")
    b = seal(IDENTITY, Kind.UPDATE, 1, ZERO_HASH, 5, b"b")
    c = seal(OTHER, Kind.UPDATE, 1, ZERO_HASH, 5, b"a")
    assert len({a.hash, b.hash, c.hash}) == 3


# --- mutations ----------------------------------------------------------------------------------


def test_every_single_byte_mutation_is_rejected_or_fails_its_signature():
    """Exhaustive: every position, every other byte value."""
    raw = _valid(update=b"\x01\x02").raw
    reasons: dict[str, int] = {}
    decoded_with_bad_signature = 0
    for pos in range(len(raw)):
        for value in range(256):
            if value == raw[pos]:
                continue
            mutated = raw[:pos] + bytes([value]) + raw[pos + 1 :]
            outcome = _decode_or_reason(mutated)
            if isinstance(outcome, str):
                reasons[outcome] = reasons.get(outcome, 0) + 1
            else:
                assert not outcome.signature_valid(), (pos, value)
                decoded_with_bad_signature += 1
    assert decoded_with_bad_signature > 0
    assert reasons["unsupported_version"] == 255  # every other value of the version byte
    assert {"malformed", "truncated"} <= set(reasons)


@settings(max_examples=300)
@given(envelope_fields(), st.data())
def test_random_single_byte_mutation(fields, data):
    raw = seal(IDENTITY, *fields).raw
    pos = data.draw(st.integers(0, len(raw) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda v: v != raw[pos]))
    outcome = _decode_or_reason(raw[:pos] + bytes([value]) + raw[pos + 1 :])
    if isinstance(outcome, Envelope):
        assert not outcome.signature_valid()


def test_every_truncation_is_rejected_as_truncated():
    raw = _valid(update=b"x" * 20).raw
    for length in range(len(raw)):
        assert _decode_or_reason(raw[:length]) == "truncated", length


@pytest.mark.parametrize("extra", [b"\x00", b"\xff", b"extension", bytes(64)])
def test_extension_is_rejected(extra):
    raw = _valid().raw
    assert _decode_or_reason(raw + extra) == "malformed"


def test_dropping_bytes_in_the_middle_is_rejected():
    raw = _valid(update=b"y" * 30).raw
    for pos in range(0, len(raw), 7):
        outcome = _decode_or_reason(raw[:pos] + raw[pos + 1 :])
        if isinstance(outcome, Envelope):
            assert not outcome.signature_valid(), pos


@settings(max_examples=200)
@given(st.binary(max_size=400))
def test_random_bytes_never_raise_anything_but_envelope_error(data):
    outcome = _decode_or_reason(data)
    if isinstance(outcome, Envelope):
        assert not outcome.signature_valid()


def test_length_field_larger_than_the_envelope_is_truncated():
    raw = bytearray(_valid(update=b"abc").raw)
    raw[82:86] = struct.pack(">I", 0xFFFFFFFF)
    assert _decode_or_reason(bytes(raw)) == "truncated"


def test_length_field_smaller_than_the_envelope_is_malformed():
    raw = bytearray(_valid(update=b"abcdef").raw)
    raw[82:86] = struct.pack(">I", 2)
    assert _decode_or_reason(bytes(raw)) == "malformed"


def test_mutated_update_decodes_but_signature_fails():
    env = _valid(update=b"payload!")
    raw = bytearray(env.raw)
    raw[HEADER_BYTES] ^= 0x01
    got = decode(bytes(raw), max_bytes=BIG)
    assert got.update == b"qayload!"
    assert not got.signature_valid()


def test_signature_of_another_key_fails():
    env = _valid()
    body = env.raw[:-SIGNATURE_BYTES]
    forged = body + OTHER.sign(SIGNING_CONTEXT + body)
    got = decode(forged, max_bytes=BIG)
    assert got.author == IDENTITY.public_key
    assert not got.signature_valid()


# --- size, version, kind, seq/prev rules --------------------------------------------------------


def test_too_large():
    raw = _valid(update=b"z" * 100).raw
    assert decode(raw, max_bytes=len(raw)) is not None
    with pytest.raises(EnvelopeError) as info:
        decode(raw, max_bytes=len(raw) - 1)
    assert info.value.reason == "too_large"
    assert str(len(raw)) in info.value.detail and str(len(raw) - 1) in info.value.detail


def test_too_large_is_checked_before_parsing():
    with pytest.raises(EnvelopeError) as info:
        decode(b"\x00" * 1000, max_bytes=999)
    assert info.value.reason == "too_large"


@pytest.mark.parametrize("version", [0, 2, 255])
def test_unsupported_version(version):
    raw = bytearray(_valid().raw)
    raw[0] = version
    with pytest.raises(EnvelopeError) as info:
        decode(bytes(raw), max_bytes=BIG)
    assert info.value.reason == "unsupported_version"
    assert str(version) in info.value.detail


def test_unsupported_version_even_if_signed():
    """A future-version envelope is refused by reason, not misparsed, even when its signature is
    good."""
    env = _valid()
    body = bytes([2]) + env.raw[1:-SIGNATURE_BYTES]
    raw = body + IDENTITY.sign(SIGNING_CONTEXT + body)
    with pytest.raises(EnvelopeError) as info:
        decode(raw, max_bytes=BIG)
    assert info.value.reason == "unsupported_version"


@pytest.mark.parametrize("kind", [0, 3, 255])
def test_unknown_kind_is_malformed(kind):
    raw = bytearray(_valid().raw)
    raw[1] = kind
    with pytest.raises(EnvelopeError) as info:
        decode(bytes(raw), max_bytes=BIG)
    assert info.value.reason == "malformed"
    assert "kind" in info.value.detail


def test_seq_zero_is_malformed():
    env = seal(IDENTITY, Kind.UPDATE, 0, ZERO_HASH, 1, b"")
    with pytest.raises(EnvelopeError) as info:
        decode(env.raw, max_bytes=BIG)
    assert info.value.reason == "malformed"
    assert "seq" in info.value.detail


@pytest.mark.parametrize("seq", [2**63, 2**64 - 1])
def test_seqs_beyond_signed_64_bits_are_malformed(seq):
    """Stores keep seqs as signed 64-bit integers: a larger one would crash them (it answered HTTP
    500)."""
    env = seal(IDENTITY, Kind.CHECKPOINT, seq, hashlib.sha256(b"prev").digest(), 1, b"")
    with pytest.raises(EnvelopeError) as info:
        decode(env.raw, max_bytes=BIG)
    assert info.value.reason == "malformed" and "2**63 - 1" in info.value.detail


def test_update_at_seq_1_must_have_zero_prev():
    env = seal(IDENTITY, Kind.UPDATE, 1, b"\x01" * 32, 1, b"")
    with pytest.raises(EnvelopeError) as info:
        decode(env.raw, max_bytes=BIG)
    assert info.value.reason == "malformed"
    assert "prev" in info.value.detail


def test_update_after_seq_1_must_not_have_zero_prev():
    env = seal(IDENTITY, Kind.UPDATE, 2, ZERO_HASH, 1, b"")
    with pytest.raises(EnvelopeError) as info:
        decode(env.raw, max_bytes=BIG)
    assert info.value.reason == "malformed"
    assert "prev" in info.value.detail


def test_seq_1_with_zero_prev_and_seq_2_with_a_hash_are_fine():
    first = seal(IDENTITY, Kind.UPDATE, 1, ZERO_HASH, 1, b"a")
    second = seal(IDENTITY, Kind.UPDATE, 2, first.hash, 2, b"b")
    assert decode(first.raw, max_bytes=BIG).prev == ZERO_HASH
    assert decode(second.raw, max_bytes=BIG).prev == first.hash


def test_checkpoint_at_seq_1_names_the_hash_of_envelope_1():
    first = seal(IDENTITY, Kind.UPDATE, 1, ZERO_HASH, 1, b"a")
    cp = seal(IDENTITY, Kind.CHECKPOINT, 1, first.hash, 1, b"a")
    assert decode(cp.raw, max_bytes=BIG).prev == first.hash


def test_empty_update_is_allowed():
    env = seal(IDENTITY, Kind.UPDATE, 1, ZERO_HASH, 1, b"")
    assert len(env.raw) == MIN_BYTES
    got = decode(env.raw, max_bytes=BIG)
    assert got.update == b"" and got.signature_valid()


@pytest.mark.parametrize("value", [None, "text", 12, ["list"], {"a": 1}])
def test_non_bytes_input_is_malformed(value):
    with pytest.raises(EnvelopeError) as info:
        decode(value, max_bytes=BIG)  # type: ignore[arg-type]
    assert info.value.reason == "malformed"


def test_envelope_error_carries_reason_and_detail():
    with pytest.raises(EnvelopeError) as info:
        decode(b"short", max_bytes=BIG)
    assert info.value.reason == "truncated"
    assert "5 bytes" in info.value.detail

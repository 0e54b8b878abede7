"""Envelopes and checkpoints: the signed, hash-chained units in which a writer's feed travels.

Wire format, version 1 (all integers big-endian; specified in docs/PROTOCOL.md):

    offset  size  field
    0       1     version    1
    1       1     kind       1 = update envelope, 2 = checkpoint
    2       32    author     Ed25519 public key of the writer
    34      8     seq        position in the author's feed, starting at 1
    42      32    prev       envelope: SHA-256 of the author's envelope seq-1 (seq 1: 32 zero bytes)
                             checkpoint: SHA-256 of the author's envelope `seq`, the summarized head
    74      8     hlc        hybrid logical clock timestamp (48-bit ms, 16-bit logical)
    82      4     length     byte length n of the Yjs update
    86      n     update     Yjs v1 update (envelope: one transaction;
                             checkpoint: merged state up to seq)
    86+n    64    signature  Ed25519 over b"simnet\\x00" + bytes [0, 86+n)

The hash of an envelope (what `prev` points to) is SHA-256 over all its bytes, signature included.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import IntEnum

from ._errors import EnvelopeError
from ._identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify_signature

VERSION = 1
SIGNING_CONTEXT = b"simnet\x00"
ZERO_HASH = bytes(32)
MAX_SEQ = 2**63 - 1  # stores keep seqs as signed 64-bit integers
_HEADER = struct.Struct(">BB32sQ32sQI")
HEADER_BYTES = _HEADER.size  # 86
PREV_OFFSET = struct.calcsize(
    ">BB32sQ"
)  # 42: where `prev` starts, after version, kind, author and seq
MIN_BYTES = HEADER_BYTES + SIGNATURE_BYTES


class Kind(IntEnum):
    UPDATE = 1
    CHECKPOINT = 2


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded envelope or checkpoint. `raw` is the exact signed encoding; `hash` its SHA-256."""

    kind: Kind
    author: bytes
    seq: int
    prev: bytes
    hlc: int
    update: bytes
    signature: bytes
    raw: bytes
    hash: bytes

    @property
    def is_checkpoint(self) -> bool:
        return self.kind is Kind.CHECKPOINT

    def signature_valid(self) -> bool:
        return verify_signature(
            self.author, self.signature, SIGNING_CONTEXT + self.raw[:-SIGNATURE_BYTES]
        )


def seal(
    identity: Identity, kind: Kind, seq: int, prev: bytes, hlc: int, update: bytes
) -> Envelope:
    """Encode and sign a new envelope for `identity`'s feed."""
    body = _HEADER.pack(VERSION, kind, identity.public_key, seq, prev, hlc, len(update)) + update
    signature = identity.sign(SIGNING_CONTEXT + body)
    raw = body + signature
    return Envelope(
        kind,
        identity.public_key,
        seq,
        prev,
        hlc,
        update,
        signature,
        raw,
        hashlib.sha256(raw).digest(),
    )


def decode(raw: bytes, *, max_bytes: int) -> Envelope:
    """Parse an envelope's structure (not its signature): EnvelopeError with a reason on any
    defect."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise EnvelopeError("malformed", f"expected bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > max_bytes:
        raise EnvelopeError("too_large", f"{len(raw)} bytes exceeds the limit of {max_bytes}")
    if len(raw) < MIN_BYTES:
        raise EnvelopeError(
            "truncated", f"{len(raw)} bytes is shorter than the {MIN_BYTES}-byte minimum"
        )
    version, kind, author, seq, prev, hlc, length = _HEADER.unpack_from(raw)
    if version != VERSION:
        raise EnvelopeError(
            "unsupported_version", f"envelope version {version}; this library reads {VERSION}"
        )
    if kind not in (Kind.UPDATE, Kind.CHECKPOINT):
        raise EnvelopeError("malformed", f"unknown envelope kind {kind}")
    if len(raw) != HEADER_BYTES + length + SIGNATURE_BYTES:
        raise EnvelopeError(
            "truncated" if len(raw) < HEADER_BYTES + length + SIGNATURE_BYTES else "malformed",
            f"update length field says {length} bytes "
            f"but the envelope holds {len(raw) - MIN_BYTES}",
        )
    if not 1 <= seq <= MAX_SEQ:
        raise EnvelopeError("malformed", f"seq must lie in [1, 2**63 - 1], not {seq}")
    if kind == Kind.UPDATE and (seq == 1) != (prev == ZERO_HASH):
        raise EnvelopeError("malformed", "prev must be all zeros exactly at seq 1")
    assert len(author) == PUBLIC_KEY_BYTES
    return Envelope(
        Kind(kind),
        author,
        seq,
        prev,
        hlc,
        raw[HEADER_BYTES : HEADER_BYTES + length],
        raw[-SIGNATURE_BYTES:],
        raw,
        hashlib.sha256(raw).digest(),
    )

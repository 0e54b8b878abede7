"""What travels between sites besides HTTP itself: pages of envelopes and maps of heads.

A **page** is the body of `application/x-simnet-envelopes`: the 4 bytes ``SNP1``, a 4-byte
big-endian count, then per envelope a 4-byte big-endian length and the envelope's bytes
(docs/PROTOCOL.md). Binary, not base64-in-JSON: envelopes are mostly signatures and Yjs bytes, and
the point of anti-entropy is to send little.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from knowledge import Head

from ._errors import WireError

PAGE_TYPE = "application/x-simnet-envelopes"
# A pulled page holds at most PAGE_BYTES of envelopes, a pushed one PUSH_BYTES (a larger envelope
# goes alone): a page of a thousand envelopes of up to 1 MiB each (a building's map tiles) would
# pass every receiver's cap on a body, so the feed behind it could never be sent, and cost that much
# memory. Clients read answers of 64 MiB at least; sites take request bodies of 16 MiB by default.
PAGE_BYTES = 16 << 20
PUSH_BYTES = 8 << 20
TIME_HEADER = "simnet-time"  # a site's clock, in ms since the epoch, on its every answer
# On a pull's answer: "1" when the page holds everything the site has for the heads sent (no need to
# ask again unless the caller's next request says more: checkpoints to check, forks learnt).
COMPLETE_HEADER = "simnet-complete"


def peer_time(headers: Mapping[str, str]) -> int | None:
    """The peer's clock (ms since the epoch) from its `Simnet-Time` header, if well formed."""
    value = headers.get(TIME_HEADER, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 16 else None


_MAGIC = b"SNP1"
_U32 = struct.Struct(">I")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def within(envelopes: list[bytes], max_bytes: int) -> list[bytes]:
    """The longest run of `envelopes` from the first holding at most `max_bytes` (the first alone
    when it is larger)."""
    size = 0
    for count, raw in enumerate(envelopes):
        size += len(raw)
        if count and size > max_bytes:
            return envelopes[:count]
    return envelopes


def encode_page(envelopes: Iterable[bytes]) -> bytes:
    items = list(envelopes)
    parts = [_MAGIC, _U32.pack(len(items))]
    for raw in items:
        parts += [_U32.pack(len(raw)), raw]
    return b"".join(parts)


def decode_page(body: bytes, *, max_count: int, max_envelope_bytes: int) -> list[bytes]:
    """Split a page into envelopes (unverified); WireError with a precise message if it is
    malformed."""
    if len(body) < 8 or body[:4] != _MAGIC:
        raise WireError("body is not an envelope page (expected the SNP1 magic and a count)")
    (count,) = _U32.unpack_from(body, 4)
    if count > max_count:
        raise WireError(
            f"page holds {count} envelopes; this site accepts at most {max_count} per request", 413
        )
    out, pos = [], 8
    for i in range(count):
        if pos + 4 > len(body):
            raise WireError(f"page ends inside the length of envelope {i}")
        (length,) = _U32.unpack_from(body, pos)
        pos += 4
        if length > max_envelope_bytes:
            raise WireError(
                f"envelope {i} is {length} bytes; the limit is {max_envelope_bytes}", 413
            )
        if pos + length > len(body):
            raise WireError(f"page ends inside envelope {i} ({length} bytes announced)")
        out.append(body[pos : pos + length])
        pos += length
    if pos != len(body):
        raise WireError(f"{len(body) - pos} bytes after the last envelope")
    return out


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise WireError("body nests JSON too deeply") from None


def parse_heads(value: Any, *, max_authors: int) -> dict[str, int]:
    """A heads map from JSON: {author hex: seq}; WireError naming the first bad entry."""
    if not isinstance(value, Mapping):
        raise WireError(
            "'heads' must be an object mapping author keys (64 hex digits) to seq numbers"
        )
    if len(value) > max_authors:
        raise WireError(f"'heads' names {len(value)} authors; at most {max_authors} accepted", 413)
    heads = {}
    for author, seq in value.items():
        if not isinstance(author, str) or not _HEX64.fullmatch(author):
            raise WireError(f"heads key {str(author)[:80]!r} is not 64 lowercase hex digits")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
            raise WireError(f"heads[{author[:16]}…] must be a non-negative integer, not {seq!r}")
        heads[author] = seq
    return heads


def with_hashes(heads: dict[str, int], hashes: Any) -> dict[str, Head]:
    """Heads with the envelope hashes a peer sent beside them ({author: hex}, optional for older
    peers).

    Hashes let two sites with equal seqs see that they hold different envelopes there (a fork).
    """
    if hashes is None:
        hashes = {}
    if not isinstance(hashes, Mapping):
        raise WireError(
            "'hashes' must be an object mapping author keys to envelope hashes (64 hex digits)"
        )
    out = {author: Head(seq, "") for author, seq in heads.items()}
    for author, value in hashes.items():
        if author not in out:
            raise WireError(f"'hashes' names author {str(author)[:16]}… that 'heads' does not")
        out[author] = Head(
            heads[author],
            check_hex64(value if isinstance(value, str) else "", f"hashes[{author[:16]}…]"),
        )
    return out


def check_hex64(value: str, what: str) -> str:
    if not _HEX64.fullmatch(value):
        raise WireError(f"{what} {value[:80]!r} is not 64 lowercase hex digits")
    return value


def parse_unchecked(value: Any, *, max_authors: int) -> dict[str, tuple[int, int]]:
    """The checkpoints a caller holds unchecked, from JSON: {author hex: {"seq": n, "after": k}}
    (the checkpoint's seq, and how many envelopes below it its check has replayed); optional, so
    None is none. WireError naming the first bad entry."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise WireError(
            "'unchecked' must be an object mapping author keys (64 hex digits) to "
            '{"seq": n, "after": k}'
        )
    if len(value) > max_authors:
        raise WireError(
            f"'unchecked' names {len(value)} authors; at most {max_authors} accepted", 413
        )
    out = {}
    for author, entry in value.items():
        if not isinstance(author, str) or not _HEX64.fullmatch(author):
            raise WireError(f"unchecked key {str(author)[:80]!r} is not 64 lowercase hex digits")
        seq = _seq(entry.get("seq")) if isinstance(entry, Mapping) else None
        after = _seq(entry.get("after", 0)) if isinstance(entry, Mapping) else None
        if seq is None or after is None or after >= seq:
            raise WireError(
                f'unchecked[{author[:16]}…] must be {{"seq": n, "after": k}} with '
                f"0 <= k < n < 2^63, not {str(entry)[:80]}"
            )
        out[author] = (seq, after)
    return out


def _seq(value: Any) -> int | None:
    """`value` if it is a seq (an integer in [0, 2^63)), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else None

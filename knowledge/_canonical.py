"""Canonical JSON: the one encoding that content ids, fingerprints and record texts are made of.

Sorted keys, no whitespace, UTF-8 (non-ASCII characters as themselves, not escaped), floats in
their shortest round-trip form, NaN and infinities refused. Equal JSON values give equal bytes, so
a hash of these bytes names a value: skill and certificate ids are SHA-256s of them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ._errors import CanonicalJSONError


def canonical_json(value: Any) -> bytes:
    """`value` as canonical JSON bytes; CanonicalJSONError if it has no JSON form."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
        raise CanonicalJSONError(f"value is not JSON-serializable: {exc}") from None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(value: Any) -> str:
    """The hex SHA-256 of a JSON value's canonical encoding: the value's content address."""
    return sha256_hex(canonical_json(value))

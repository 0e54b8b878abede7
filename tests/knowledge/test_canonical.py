"""Unit tests for knowledge._canonical: the one canonical JSON encoding and its hashes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import CanonicalJSONError, RecordError, canonical_json, content_hash, sha256_hex

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def test_sorted_keys_no_whitespace_unicode_as_itself():
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, {"x": -math.inf}, {1, 2}, b"bytes", object(), "\ud800"]
)
def test_values_without_a_json_form_are_refused(value):
    with pytest.raises(CanonicalJSONError):
        canonical_json(value)


def test_a_refusal_is_a_record_error_and_a_value_error():
    assert issubclass(CanonicalJSONError, RecordError) and issubclass(
        CanonicalJSONError, ValueError
    )


@settings(max_examples=200)
@given(JSON)
def test_the_encoding_parses_back_and_is_stable(value):
    data = canonical_json(value)
    assert json.loads(data) == value
    assert canonical_json(json.loads(data)) == data
    assert content_hash(value) == sha256_hex(data)


def test_record_ids_are_unchanged():
    """Skill and certificate ids hash these bytes: pinned from before the encodings merged."""
    record = {
        "v": 1,
        "name": "pick-mügé ✓",
        "task": "pick",
        "x": 1.5,
        "n": None,
        "l": [1, {"b": 2, "a": "é"}],
    }
    assert canonical_json(record).decode() == (
        '{"l":[1,{"a":"é","b":2}],"n":null,"name":"pick-mügé ✓","task":"pick","v":1,"x":1.5}'
    )
    assert content_hash(record) == (
        "8d333ee489b7a7cea7abaf82b76102586494ea906db4c4e0d85e96c21ac28298"
    )
    assert content_hash({"a": '\u2028 \x00 "\\'}) == (
        "7c43b594701c703e7e05f3efc6974c9a701ca8538b5316b023648995d18756a1"
    )


def test_an_ascii_named_robots_fingerprint_is_unchanged():
    """Fingerprints hashed ASCII-escaped JSON before; an ASCII descriptor's did not move."""
    arm = knowledge.Embodiment.from_mjcf(ROBOTS / "arm7.xml")
    assert arm.fingerprint == "ad81da2260f2f093a0ba239069d784df52402d3a5ab2d41b231f462b1206c481"
    base = knowledge.Embodiment.from_mjcf(ROBOTS / "wheeled_base.xml")
    assert base.fingerprint == "4488e99fc5984d258421b6785b2881af3b44d21b5e633d4c2684868d694ecbf6"

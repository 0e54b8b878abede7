"""federation._wire: envelope pages, JSON bodies and heads maps as they arrive off the wire."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from federation import WireError, decode_page, encode_page
from federation._wire import _MAGIC, check_hex64, parse_heads, parse_json, parse_unchecked

U32 = struct.Struct(">I")
AUTHOR = "ab" * 32
envelopes = st.lists(st.binary(max_size=300), max_size=20)


def decode(body: bytes, max_count: int = 100, max_envelope_bytes: int = 1000) -> list[bytes]:
    return decode_page(body, max_count=max_count, max_envelope_bytes=max_envelope_bytes)


def refused(body: bytes, status: int, match: str, **limits) -> WireError:
    with pytest.raises(WireError, match=match) as caught:
        decode(body, **limits)
    assert caught.value.status == status
    return caught.value


# --- pages ----------------------------------------------------------------------------------------


@given(envelopes)
def test_page_round_trip(items):
    page = encode_page(items)
    assert page[:4] == b"SNP1" and U32.unpack_from(page, 4)[0] == len(items)
    assert decode(page) == items


@given(envelopes)
def test_page_round_trip_from_any_iterable(items):
    assert decode(encode_page(iter(items))) == items


def test_empty_page_is_eight_bytes():
    assert encode_page([]) == b"SNP1\x00\x00\x00\x00"
    assert decode(encode_page([])) == []


@given(st.lists(st.binary(max_size=50), min_size=1, max_size=10), st.data())
def test_every_strict_prefix_of_a_page_is_refused(items, data):
    page = encode_page(items)
    cut = data.draw(st.integers(0, len(page) - 1))
    with pytest.raises(WireError) as caught:
        decode(page[:cut])
    assert caught.value.status == 400


@given(envelopes, st.binary(min_size=1, max_size=20))
def test_trailing_bytes_are_refused(items, extra):
    refused(encode_page(items) + extra, 400, f"{len(extra)} bytes after the last envelope")


@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_wire_error(body):
    try:
        out = decode(body)
    except WireError as exc:
        assert exc.status in (400, 413)
    else:
        assert encode_page(out) == body  # whatever decodes is exactly a page


@pytest.mark.parametrize(
    "body",
    [b"", b"SNP1", b"SNP1\x00\x00\x00", b"SNP2\x00\x00\x00\x00", b"\x00" * 8, b'{"heads": {}}'],
)
def test_bad_magic_or_short_header(body):
    refused(body, 400, "not an envelope page")


def test_truncated_length_field():
    page = encode_page([b"abc"])
    body = _MAGIC + U32.pack(2) + page[8:] + b"\x00\x00"  # envelope 1's 4-byte length is cut short
    refused(body, 400, "ends inside the length of envelope 1")


def test_truncated_envelope_body():
    body = _MAGIC + U32.pack(1) + U32.pack(10) + b"12345"
    refused(body, 400, r"ends inside envelope 0 \(10 bytes announced\)")


def test_count_larger_than_the_envelopes_present():
    refused(_MAGIC + U32.pack(3) + U32.pack(1) + b"x", 400, "ends inside the length of envelope 1")


def test_count_over_the_limit_is_413():
    refused(
        encode_page([b"x"] * 6),
        413,
        "page holds 6 envelopes; this site accepts at most 5",
        max_count=5,
    )
    assert decode(encode_page([b"x"] * 5), max_count=5) == [b"x"] * 5


def test_huge_count_is_refused_before_any_work():
    refused(_MAGIC + U32.pack(2**32 - 1), 413, "page holds 4294967295 envelopes", max_count=1000)


def test_envelope_over_the_limit_is_413():
    refused(
        encode_page([b"ok", b"y" * 11]),
        413,
        "envelope 1 is 11 bytes; the limit is 10",
        max_envelope_bytes=10,
    )
    assert decode(encode_page([b"y" * 10]), max_envelope_bytes=10) == [b"y" * 10]


def test_announced_length_over_the_limit_is_413_even_if_the_bytes_are_missing():
    refused(
        _MAGIC + U32.pack(1) + U32.pack(2**31),
        413,
        "envelope 0 is 2147483648 bytes",
        max_envelope_bytes=1 << 20,
    )


# --- JSON -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"{", b"{'heads': {}}", b"\xff\xfe", b"nul", b'{"a": 1} x'])
def test_parse_json_refuses_non_json(body):
    with pytest.raises(WireError, match="body is not JSON") as caught:
        parse_json(body)
    assert caught.value.status == 400


def test_parse_json_accepts_json():
    assert parse_json(b'{"heads": {}, "limit": 3}') == {"heads": {}, "limit": 3}


def test_parse_json_refuses_deeply_nested_json_as_a_wire_error():
    # A 16 MiB body easily holds 100,000 nested brackets; json.loads then raises RecursionError,
    # which is not a ValueError. It must still be a clean WireError (400), not an exception that
    # becomes a 500.
    with pytest.raises(WireError) as caught:
        parse_json(b"[" * 100_000 + b"]" * 100_000)
    assert caught.value.status == 400


def test_parse_json_refuses_an_integer_with_too_many_digits():
    with pytest.raises(WireError):
        parse_json(b"1" * 10_000)


# --- heads ----------------------------------------------------------------------------------------


@given(
    st.dictionaries(
        st.text("0123456789abcdef", min_size=64, max_size=64),
        st.integers(0, 2**63 - 1),
        max_size=20,
    )
)
def test_parse_heads_accepts_valid_maps(heads):
    assert parse_heads(heads, max_authors=100) == heads


@pytest.mark.parametrize("value", [[], "heads", 3, None, [[AUTHOR, 1]]])
def test_parse_heads_refuses_non_objects(value):
    with pytest.raises(WireError, match="'heads' must be an object") as caught:
        parse_heads(value, max_authors=10)
    assert caught.value.status == 400


@pytest.mark.parametrize(
    "key", ["AB" * 32, "ab" * 31, "ab" * 33, "zz" * 32, "", " " + "ab" * 32, "ab" * 32 + "\n"]
)
def test_parse_heads_refuses_bad_author_keys(key):
    with pytest.raises(WireError, match="is not 64 lowercase hex digits") as caught:
        parse_heads({key: 1}, max_authors=10)
    assert caught.value.status == 400


@pytest.mark.parametrize(
    "seq", [-1, 2**63, 1.0, "1", True, False, None, [1], {"seq": 1}, float("nan")]
)
def test_parse_heads_refuses_bad_seqs(seq):
    with pytest.raises(WireError, match=r"must be a non-negative integer") as caught:
        parse_heads({AUTHOR: seq}, max_authors=10)
    assert caught.value.status == 400


def test_parse_heads_bounds_the_number_of_authors():
    heads = {f"{i:064x}": 1 for i in range(4)}
    assert parse_heads(heads, max_authors=4) == heads
    with pytest.raises(WireError, match="names 5 authors; at most 4") as caught:
        parse_heads({**heads, "f" * 64: 1}, max_authors=4)
    assert caught.value.status == 413


def test_parse_heads_message_truncates_long_keys():
    with pytest.raises(WireError) as caught:
        parse_heads({"x" * 10_000: 1}, max_authors=10)
    assert len(str(caught.value)) < 200


def test_check_hex64():
    assert check_hex64(AUTHOR, "blob hash") == AUTHOR
    for bad in ["AB" * 32, "ab" * 31, "g" * 64, "../" + "a" * 61]:
        with pytest.raises(WireError, match="blob hash .* is not 64 lowercase hex digits"):
            check_hex64(bad, "blob hash")


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_author = st.sampled_from(["ab" * 32, "0" * 64, "AB" * 32, "x"])


@given(
    st.one_of(
        _json,
        st.dictionaries(
            _author,
            st.one_of(_json, st.fixed_dictionaries({"seq": _json}, optional={"after": _json})),
            max_size=3,
        ),
    )
)
def test_parse_unchecked_returns_valid_checks_or_raises_wire_error(value):
    """Whatever a peer sends as 'unchecked': seqs 0 <= after < seq < 2^63 by 64-hex authors, or a
    WireError (a 400), never anything else."""
    try:
        parsed = parse_unchecked(value, max_authors=10)
    except WireError as exc:
        assert exc.status == 400 and "unchecked" in str(exc)
        return
    for author, (seq, after) in parsed.items():
        assert check_hex64(author, "author") == author
        assert type(seq) is int and type(after) is int and 0 <= after < seq < 2**63

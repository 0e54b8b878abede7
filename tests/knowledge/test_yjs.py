"""Tests of knowledge._yjs, the Yjs v1 update reader, and of the feed checks built on it.

yrs (inside pycrdt) keeps clocks and lengths as u32 and client ids as 53 bits; a field wider than
that is read as another number (a clock of 2**32 is clock 0). The reader must refuse every such
field, and whatever it and the Feed accept must change in a pycrdt Doc exactly the (client, clock)
ranges the reader reported, with nothing held pending. The differential fuzz at the end checks that
against pycrdt itself, with updates written by real Docs and hostile ones built by hand.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map

from knowledge import Identity
from knowledge import _yjs as yjs
from knowledge._feed import IMMUTABLE_MAP, RECORDS_MAP, Feed
from knowledge._yjs import MAX_CLOCK, MalformedUpdate, ParsedUpdate, _uint, parse_update

AUTHOR = Identity.from_seed(b"\x03" * 32).public_key
C = Feed(AUTHOR).client_id
BOUNDARIES = [2**31, 2**32 - 1, 2**32, 2**53, 2**64 - 1]


# --- a hand encoder for Yjs v1 updates ----------------------------------------------------------


def var(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out) + bytes([n])


def text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return var(len(raw)) + raw


def any_strings(*values: str | bytes) -> bytes:
    return var(len(values)) + b"".join(b"\x77" + text(v) for v in values)


def entry(root: str | bytes, key: str | bytes, *values: str | bytes, named: int = 1) -> bytes:
    """A map entry written for the first time: Any content, a named parent, a key."""
    return b"\x28" + var(named) + text(root) + text(key) + any_strings(*values)


def after(origin: tuple[int, int], *values: str, right: tuple[int, int] | None = None) -> bytes:
    """An item after `origin` (an overwrite of that map entry): its parent comes from the origin."""
    info = 0x88 | (0x40 if right else 0)
    ids = var(origin[0]) + var(origin[1]) + (var(right[0]) + var(right[1]) if right else b"")
    return bytes([info]) + ids + any_strings(*values)


def before(right: tuple[int, int], *values: str) -> bytes:
    return b"\x48" + var(right[0]) + var(right[1]) + any_strings(*values)


def deleted(root: str, key: str, length: int) -> bytes:
    return b"\x21" + var(1) + text(root) + text(key) + var(length)


def gc(length: int) -> bytes:
    return b"\x00" + var(length)


def update(groups=(), deletes=()) -> bytes:
    """groups: (client, clock, [struct bytes]); deletes: (client, [(clock, length)])."""
    out = var(len(groups))
    for client, clock, structs in groups:
        out += var(len(structs)) + var(client) + var(clock) + b"".join(structs)
    out += var(len(deletes))
    for client, ranges in deletes:
        out += var(client) + var(len(ranges)) + b"".join(var(c) + var(n) for c, n in ranges)
    return out


def test_the_encoder_writes_what_pycrdt_writes():
    doc = Doc(client_id=C)
    doc.get(RECORDS_MAP, type=Map)["a"] = "1"
    assert update([(C, 0, [entry(RECORDS_MAP, "a", "1")])]) == doc.get_update()


# --- what the reader reports --------------------------------------------------------------------


def test_groups_structs_and_strings_of_real_updates():
    feed = Feed(AUTHOR)
    first, _ = feed.write({"skill/a": '{"v":1}', "cell/m/1": "x"})
    parsed = parse_update(first)
    assert parsed.groups == [(C, 0, 2)] and [c for _, c, _ in parsed.structs] == [0, 1]
    assert sorted(parsed.strings) == sorted(['{"v":1}', "x"])
    second, _ = feed.write({"cell/m/1": "y", "cell/m/2": "é😀"})
    parsed = parse_update(second)
    assert parsed.groups == [(C, 2, 2)] and sorted(parsed.strings) == ["y", "é😀"]
    assert parsed.deletes == [(C, 1, 1)] and (C, 1) in parsed.references
    popped, _ = feed.write({"cell/m/2": None})
    parsed = parse_update(popped)  # a pop is a delete set alone
    assert parsed.groups == [] and parsed.structs == [] and parsed.deletes == [(C, 3, 1)]
    assert parse_update(feed.state()).groups == [(C, 0, 4)]


def test_strings_include_nested_values_but_not_object_keys():
    nested = (
        b"\x28"
        + var(1)
        + text(RECORDS_MAP)
        + text("k")
        + var(1)
        + b"\x75"
        + var(2)
        + b"\x77"
        + text("in")
    )
    nested += b"\x76" + var(1) + text("key") + b"\x77" + text("deep")
    assert parse_update(update([(C, 0, [nested])])).strings == ["in", "deep"]


# --- widths: every field yrs reads narrower than the bytes say is refused -----------------------


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(MalformedUpdate, match=match):
        parse_update(data)


@pytest.mark.parametrize("clock", BOUNDARIES)
def test_group_clock_widths(clock):
    data = update([(C, clock, [entry(RECORDS_MAP, "a", "1")])])
    if clock + 1 <= MAX_CLOCK:
        assert parse_update(data).groups == [(C, clock, 1)]
    else:
        _refused(data, r"2\*\*32")


@pytest.mark.parametrize("length", BOUNDARIES)
@pytest.mark.parametrize("struct", ["deleted", "gc"])
def test_struct_length_widths(struct, length):
    made = deleted(RECORDS_MAP, "a", length) if struct == "deleted" else gc(length)
    data = update([(C, 5, [made])])
    if 5 + length <= MAX_CLOCK:
        assert parse_update(data).groups == [(C, 5, length)]
    else:
        _refused(data, r"2\*\*32")


@pytest.mark.parametrize("clock", BOUNDARIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_origin_clock_widths(side, clock):
    other = C ^ 1  # another client's clocks may lie anywhere; only their width is checked
    made = after((other, clock), "x") if side == "left" else before((other, clock), "x")
    data = update([(C, 7, [made])])
    if clock <= MAX_CLOCK:
        assert parse_update(data).references == [(other, clock)]
    else:
        _refused(data, r"2\*\*32")


def test_an_origin_clock_of_2_32_names_clock_0_in_yrs():
    """Why the widths matter: the measured behaviour this reader guards against."""
    doc = Doc()
    doc.apply_update(
        update([(C, 0, [entry(IMMUTABLE_MAP, "skill/a", "S"), entry(RECORDS_MAP, "c", "1")])])
    )
    doc.apply_update(update([(C, 2, [after((C, 2**32), "rewritten")])]))
    assert doc.get(IMMUTABLE_MAP, type=Map)["skill/a"] == "rewritten"
    doc.apply_update(update([], [(C, [(2**32 + 1, 1)])]))
    assert "c" not in doc.get(RECORDS_MAP, type=Map)


@pytest.mark.parametrize("clock", BOUNDARIES)
@pytest.mark.parametrize("length", [1, *BOUNDARIES])
def test_delete_set_widths(clock, length):
    data = update([], [(C, [(clock, length)])])
    if clock + length <= MAX_CLOCK:
        assert parse_update(data).deletes == [(C, clock, length)]
    else:
        _refused(data, r"2\*\*32")


@pytest.mark.parametrize("client", [2**53 - 1, 2**53, 2**64 - 1])
@pytest.mark.parametrize("where", ["group", "origin", "delete"])
def test_client_id_widths(where, client):
    data = {
        "group": update([(client, 0, [entry(RECORDS_MAP, "a", "1")])]),
        "origin": update([(C, 1, [after((client, 0), "x")])]),
        "delete": update([], [(client, [(0, 1)])]),
    }[where]
    if client < 2**53:
        assert client in parse_update(data).clients()
    else:
        _refused(data, r"2\*\*53")


@pytest.mark.parametrize("count", [2**32, 2**64 - 1])
def test_count_and_string_length_widths(count):
    _refused(var(count) + b"\x00", "group count")
    _refused(
        update([(C, 0, [b"\x28" + var(1) + text(RECORDS_MAP) + text("k") + var(count)])]),
        "value count",
    )
    wide_string = (
        b"\x28" + var(1) + text(RECORDS_MAP) + text("k") + var(1) + b"\x77" + var(count + 1) + b"v"
    )
    _refused(update([(C, 0, [wide_string])]), "string length")  # yrs would read a 1-byte string


def test_parent_kind_is_0_or_1():
    _refused(
        update([(C, 0, [entry(RECORDS_MAP, "k", "v", named=2**32 + 1)])]), r"2\*\*32"
    )  # yrs: 1
    _refused(update([(C, 0, [entry(RECORDS_MAP, "k", "v", named=2)])]), "parent kind 2")


def test_over_long_var_uints():
    assert (
        parse_update(b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00\x00").groups == []
    )  # 10 bytes, value 0
    _refused(b"\x80" * 10 + b"\x00\x00", "too long")


# --- structure yrs reads differently, or holds back ---------------------------------------------


@pytest.mark.parametrize(
    "data, match",
    [
        (
            update(
                [(C, 0, [entry(RECORDS_MAP, "a", "1")]), (C, 1, [entry(RECORDS_MAP, "b", "2")])]
            ),
            "two struct groups",
        ),
        (update([(C, 0, [])]), "empty"),
        (update([], [(C, [(0, 1)]), (C, [(2, 1)])]), "twice in the delete set"),
        (update([], [(C, [(0, 0)])]), "empty delete range"),
        (update([(C, 0, [gc(0)])]), "empty struct"),
        (update([(C, 0, [deleted(RECORDS_MAP, "a", 0)])]), "empty struct"),
        (
            update([(C, 0, [b"\x28" + var(1) + text(RECORDS_MAP) + text("a") + var(0)])]),
            "empty struct",
        ),
        (update([(C, 0, [b"\x20\x01"])]), "info byte"),  # yrs reads it as an item of content kind 0
        (update([(C, 0, [b"\x8a" + var(C) + var(0) + var(1)])]), "info byte"),
        (
            update(
                [(C, 0, [b"\x22" + var(1) + text(RECORDS_MAP) + text("j") + var(1) + text('"x"')])]
            ),
            "JSON",
        ),
        (
            update([(C, 0, [b"\x27" + var(1) + text(RECORDS_MAP) + text("t") + b"\x05"])]),
            "type ref 5",
        ),
        (update([(C, 3, [after((C, 3), "self")])]), "points at clock 3"),
        (
            update([(C, 3, [before((C, 4), "later"), entry(RECORDS_MAP, "b", "2")])]),
            "points at clock 4",
        ),
        (update([(C, 0, [entry(RECORDS_MAP, "k", b"\xff")])]), "not UTF-8"),
        (
            update([(C, 0, [entry(RECORDS_MAP, "k", b"\xed\xa0\x80")])]),
            "not UTF-8",
        ),  # a lone surrogate
        (update([(C, 0, [entry(RECORDS_MAP, b"\xc0\xaf", "v")])]), "not UTF-8"),
        (update([(C, 0, [entry(b"rec\xff", "k", "v")])]), "not UTF-8"),
    ],
)
def test_structure_yrs_would_read_differently(data, match):
    _refused(data, match)


# --- differential fuzz: what the reader and Feed accept changes exactly what they reported ------

KEYS = ["skill/a", "skill/b", "revoke/a", "cell/m/1", "cell/m/2", "counter/x"]


def _sv_clock(doc: Doc) -> int:
    state = doc.get_state()
    count, pos = _uint(state, 0)
    for _ in range(count):
        client, pos = _uint(state, pos)
        clock, pos = _uint(state, pos)
        if client == C:
            return clock
    return 0


def _merge(ranges) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _covers(outer, inner) -> bool:
    """Every clock of the `inner` ranges lies in the `outer` ranges."""
    outer = _merge(outer)
    return all(any(lo <= a and b <= hi for lo, hi in outer) for a, b in _merge(inner))


def _minus(ranges, removed) -> list[tuple[int, int]]:
    """The clocks of `ranges` that are not in `removed`."""
    out = []
    for lo, hi in _merge(ranges):
        for a, b in _merge(removed):
            if a < hi and lo < b:
                if lo < a:
                    out.append((lo, a))
                lo = max(lo, b)
        if lo < hi:
            out.append((lo, hi))
    return out


def _deleted(doc: Doc) -> list[tuple[int, int]]:
    return _merge(
        (clock, clock + n)
        for client, clock, n in parse_update(doc.get_update()).deletes
        if client == C
    )


@st.composite
def writer_history(draw):
    """A writer's honest updates (map entries, overwrites, pops; immutable keys written once)."""
    writer, updates = Feed(AUTHOR), []
    for _ in range(draw(st.integers(1, 5))):
        changes = {}
        for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)):
            if key.startswith(("skill/", "revoke/")):
                if writer.get(key) is None:
                    changes[key] = draw(st.text(max_size=4))
            else:
                changes[key] = draw(st.none() | st.text(max_size=4))
        made, _ = writer.write(changes)
        if made:
            updates.append(made)
    return writer, updates


CLOCK_SHIFTS = [0, 0, 0, 0, -1, 1, 2]


@st.composite
def hostile(draw, held: int):
    """An update built by hand around the feed's next clock `held`: boundary widths, gaps, overlaps,
    dangling origins, deletes beyond the state."""
    near = st.integers(0, held + 2)
    wide = st.sampled_from(BOUNDARIES) | near.map(lambda c: c + 2**32)
    mode = draw(st.sampled_from(["continues", "full state", "wild"]))
    shifted = st.sampled_from(CLOCK_SHIFTS).map(lambda d: max(held + d, 0)) | st.just(0) | wide
    clock = {"continues": held, "full state": 0}.get(mode, None)
    clock = draw(shifted) if clock is None else clock
    lengths = st.sampled_from([1, 1, 2, 0])
    if mode == "wild":
        near, lengths = near | wide, lengths | st.sampled_from(BOUNDARIES) | st.just(2**32 + 1)
    client = draw(st.sampled_from([C] * 6 + [C + 2**53, C ^ 1])) if mode == "wild" else C
    structs = []
    if mode == "full state" and held:  # its first struct ends near `held`
        span = draw(st.sampled_from([held - 1, held, held + 1]).filter(bool))
        structs.append(
            draw(
                st.sampled_from(
                    [
                        gc(span),
                        deleted(RECORDS_MAP, "cell/m/1", span),
                        entry(RECORDS_MAP, "cell/m/1", *"v" * span),
                    ]
                )
            )
        )
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["entry", "after", "before", "deleted", "gc"]))
        key = draw(st.sampled_from(KEYS))
        root = draw(st.sampled_from([IMMUTABLE_MAP, RECORDS_MAP]))
        origin = (draw(st.sampled_from([C, C, C + 2**53] if mode == "wild" else [C])), draw(near))
        if kind == "entry":
            structs.append(
                entry(root, key, *draw(st.lists(st.text(max_size=3), min_size=1, max_size=2)))
            )
        elif kind == "after":
            structs.append(after(origin, "x", right=draw(st.none() | st.just(origin))))
        elif kind == "before":
            structs.append(before(origin, "x"))
        elif kind == "deleted":
            structs.append(deleted(root, key, draw(lengths)))
        else:
            structs.append(gc(draw(lengths)))
    ranges = draw(st.lists(st.tuples(near, lengths), max_size=2))
    return update(
        [(client, clock, structs)] if structs else [], [(client, ranges)] if ranges else []
    )


def _verdict(feed: Feed, data: bytes) -> tuple[str, str] | None:
    """As ingest judges an update: (reason, detail), or None if it is accepted (and noted by the
    feed)."""
    try:
        parsed = parse_update(data)
    except MalformedUpdate as exc:
        return "malformed_update", str(exc)
    if parsed.clients() - {feed.client_id}:
        return "foreign_client_id", str(sorted(parsed.clients() - {feed.client_id}))
    odd = feed.foreign_structure(parsed)
    if odd is not None:
        return "malformed_update", odd
    rewrite = feed.check(parsed)
    return None if rewrite is None else ("modifies_immutable_record", rewrite)


def _replica(updates: list[bytes]) -> tuple[Feed, Doc]:
    feed, doc = Feed(AUTHOR), Doc()
    for made in updates:
        assert _verdict(feed, made) is None  # honest updates, in order, always pass
        doc.apply_update(made)
    return feed, doc


def _assert_changes_match(feed: Feed, doc: Doc, data: bytes) -> None:
    """`data` passed the checks of `feed` (whose state `doc` holds): applying it must advance the
    author's clock to exactly the feed's new next clock and change only the clocks it reported."""
    held = _sv_clock(doc)
    parsed = parse_update(data)
    immutable_before = dict(doc.get(IMMUTABLE_MAP, type=Map).items())
    deleted_before = _deleted(doc)
    doc.apply_update(data)
    assert _sv_clock(doc) == feed.next_clock  # nothing held back, nothing skipped over
    newly_deleted = _minus(_deleted(doc), deleted_before)
    reported = [(clock, clock + n) for _c, clock, n in parsed.deletes]
    reported += [(clock, clock + 1) for _c, clock in parsed.references]
    reported += (
        [(held - 1, feed.next_clock)]
        if any(s < held < s + n for _c, s, n in parsed.structs)
        else []
    )
    reported += [(held, feed.next_clock)]
    assert _covers(reported, newly_deleted), (newly_deleted, reported)
    assert _covers(
        _deleted(doc), [(clock, clock + n) for _c, clock, n in parsed.deletes]
    )  # none pending
    immutable_after = dict(doc.get(IMMUTABLE_MAP, type=Map).items())
    assert immutable_after.items() >= immutable_before.items()


FUZZ_EXAMPLES = int(os.environ.get("SIMNET_YJS_FUZZ_EXAMPLES", "120"))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writer_history(), st.data())
def test_differential_fuzz(history, data):
    writer, updates = history
    held = data.draw(st.integers(0, len(updates)))
    feed, doc = _replica(updates[:held])
    choice = data.draw(
        st.sampled_from(["next", "checkpoint", "later", "hostile", "hostile", "hostile"])
    )
    if choice == "next" and held < len(updates):
        candidate, honest = updates[held], True
    elif choice == "checkpoint":
        candidate, honest = writer.state(), True
    elif choice == "later" and held + 1 < len(updates):
        candidate, honest = updates[held + 1], False
    else:
        choice, candidate, honest = "hostile", data.draw(hostile(feed.next_clock)), False
    before = feed.next_clock
    verdict = _verdict(feed, candidate)
    event(f"{choice}: {' '.join(verdict[1].split()[:3]) if verdict else 'accepted'}")
    if honest:
        assert verdict is None, verdict
    if verdict is not None:
        assert verdict[1]  # says why
        assert feed.next_clock == before  # a refused update leaves the feed as it was
        return
    parsed = parse_update(candidate)
    crosses = any(s < before < s + n for _c, s, n in parsed.structs)
    overlaps = any(s < before for _c, s, _n in parsed.groups)
    event(
        f"{choice} accepted: "
        + ("crosses the next clock" if crosses else "overlaps" if overlaps else "continues")
    )
    _assert_changes_match(feed, doc, candidate)


def _read(data: bytes) -> ParsedUpdate | str:
    try:
        return parse_update(data)
    except MalformedUpdate as exc:
        return str(exc)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writer_history(), st.data())
def test_the_map_entry_shortcut_reads_as_the_general_path(history, data):
    """`_map_entry` reads the common struct in fewer steps: with it and without it, every update
    (honest, hand-built, truncated, with a byte changed) reads the same, or fails the same way."""
    _writer, updates = history
    honest = st.sampled_from(updates) if updates else st.nothing()
    candidate = data.draw(honest | hostile(data.draw(st.integers(0, 4))))
    if candidate and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(candidate) - 1))
        change = data.draw(st.sampled_from(["cut", "byte"]))
        tail = candidate[at + 1 :] if change == "byte" else b""
        candidate = candidate[:at] + bytes([data.draw(st.integers(0, 255))]) + tail
    fast = _read(candidate)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(yjs, "_map_entry", lambda data, pos: None)
        assert _read(candidate) == fast

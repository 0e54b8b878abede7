"""Unit tests for knowledge._feed: one writer's pycrdt Doc, its client id and its updates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map, merge_updates

import knowledge
from knowledge import Identity
from knowledge._envelope import ZERO_HASH
from knowledge._feed import IMMUTABLE_MAP, RECORDS_MAP, Feed, client_id_for, is_immutable
from knowledge._yjs import MalformedUpdate, parse_update

AUTHOR = Identity.from_seed(b"\x01" * 32).public_key
OTHER = Identity.from_seed(b"\x02" * 32).public_key


# --- client ids ---------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.binary(min_size=32, max_size=32))
def test_client_id_is_below_2_53_and_deterministic(author):
    cid = client_id_for(author)
    assert 0 <= cid < 2**53
    assert client_id_for(bytes(author)) == cid


def test_client_ids_differ_between_keys():
    ids = {client_id_for(Identity.generate().public_key) for _ in range(64)}
    assert len(ids) == 64


def test_client_id_uses_the_full_53_bits():
    ids = [client_id_for(Identity.generate().public_key) for _ in range(64)]
    assert max(ids) >= 2**50  # not truncated to a small range


def test_feed_doc_uses_the_derived_client_id():
    feed = Feed(AUTHOR)
    assert feed.client_id == client_id_for(AUTHOR)
    assert feed.doc.client_id == feed.client_id
    assert (feed.seq, feed.head, feed.hlc) == (0, ZERO_HASH, 0)


# --- write / apply ------------------------------------------------------------------------------


def test_write_returns_an_update_that_reproduces_the_records():
    writer = Feed(AUTHOR)
    update, changed = writer.write({"skill/x": '{"a":1}', "cell/m/1,2": '{"v":1}'})
    assert changed == {"skill/x": '{"a":1}', "cell/m/1,2": '{"v":1}'}
    assert isinstance(update, bytes) and update
    replica = Feed(AUTHOR)
    assert replica.apply(update) == changed
    assert dict(replica.items()) == dict(writer.items()) == changed
    assert replica.get("skill/x") == '{"a":1}'
    assert replica.get("missing") is None


def test_a_sequence_of_writes_replays_in_order():
    writer, replica = Feed(AUTHOR), Feed(AUTHOR)
    steps = [
        {"a": "1", "b": "2"},
        {"a": "3"},
        {"b": None},
        {"c": "4", "a": None},
    ]
    for changes in steps:
        update, changed = writer.write(changes)
        assert changed == changes
        assert replica.apply(update) == changed
        assert dict(replica.items()) == dict(writer.items())
    assert dict(replica.items()) == {"c": "4"}


def test_updates_applied_twice_change_nothing_the_second_time():
    writer, replica = Feed(AUTHOR), Feed(AUTHOR)
    update, _ = writer.write({"a": "1"})
    assert replica.apply(update) == {"a": "1"}
    assert replica.apply(update) == {}
    assert dict(replica.items()) == {"a": "1"}


def test_write_with_nothing_to_change():
    feed = Feed(AUTHOR)
    assert feed.write({}) == (b"", {})
    assert feed.write({"never-written": None}) == (b"", {})


def test_write_is_one_transaction():
    """All changes of one write() travel in one update: a replica sees all of them or none."""
    writer = Feed(AUTHOR)
    update, _ = writer.write({f"k{i}": str(i) for i in range(20)})
    replica = Feed(AUTHOR)
    assert len(replica.apply(update)) == 20


@settings(max_examples=40)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from("abcdef"), st.none() | st.text(max_size=10), min_size=1, max_size=4
        ),
        min_size=1,
        max_size=8,
    )
)
def test_any_write_sequence_reproduces_on_a_fresh_feed(steps):
    writer = Feed(AUTHOR)
    updates = [writer.write(changes)[0] for changes in steps]
    replica = Feed(AUTHOR)
    for update in updates:
        if update:
            replica.apply(update)
    assert dict(replica.items()) == dict(writer.items())
    bootstrapped = Feed(AUTHOR)
    bootstrapped.apply(writer.state())
    assert dict(bootstrapped.items()) == dict(writer.items())


def test_state_is_a_checkpoint_of_the_whole_doc():
    writer = Feed(AUTHOR)
    writer.write({"a": "1"})
    writer.write({"b": "2"})
    writer.write({"a": None})
    replica = Feed(AUTHOR)
    assert replica.apply(writer.state()) == {"b": "2"}
    # Later updates apply on top of a checkpoint.
    update, _ = writer.write({"c": "3"})
    assert replica.apply(update) == {"c": "3"}
    assert dict(replica.items()) == {"b": "2", "c": "3"}


def test_reset_forgets_everything():
    feed = Feed(AUTHOR)
    feed.write({"a": "1"})
    feed.seq, feed.head, feed.hlc = 3, b"h" * 32, 9
    feed.reset()
    assert dict(feed.items()) == {}
    assert (feed.seq, feed.head, feed.hlc) == (0, ZERO_HASH, 0)
    assert feed.doc.client_id == client_id_for(AUTHOR)
    update, changed = feed.write({"b": "2"})  # usable after reset
    assert changed == {"b": "2"}


SKILL_KEY = "skill/" + "5e" * 32
CERT_KEY = "cert/" + "ce" * 32
REVOKE_KEY = "revoke/" + "5e" * 32


def test_immutable_records_live_in_their_own_root_map():
    assert is_immutable(SKILL_KEY) and is_immutable(CERT_KEY) and is_immutable(REVOKE_KEY)
    assert not is_immutable("cell/m/1,2") and not is_immutable("counter/" + "5e" * 32)
    assert not is_immutable("withdraw/" + "5e" * 32) and not is_immutable("delegate/" + "5e" * 32)
    writer = Feed(AUTHOR)
    update, _ = writer.write({"cell/m/1,2": "1", SKILL_KEY: "s"})
    doc = Doc()
    doc.apply_update(update)
    assert dict(doc.get(RECORDS_MAP, type=Map).items()) == {"cell/m/1,2": "1"}
    assert dict(doc.get(IMMUTABLE_MAP, type=Map).items()) == {SKILL_KEY: "s"}
    assert dict(writer.items()) == {"cell/m/1,2": "1", SKILL_KEY: "s"}
    assert writer.get(SKILL_KEY) == "s" and writer.get("cell/m/1,2") == "1"


# --- immutable records: Feed.check ---------------------------------------------------------------


def _replica_with(writer: Feed, update: bytes) -> Feed:
    replica = Feed(AUTHOR)
    assert replica.check(parse_update(update)) is None
    replica.apply(update)
    return replica


def test_check_accepts_fresh_inserts_and_mutable_rewrites():
    writer = Feed(AUTHOR)
    u1, _ = writer.write({SKILL_KEY: "s", "cell/m/1,1": "a"})
    replica = _replica_with(writer, u1)
    u2, _ = writer.write({CERT_KEY: "c", "cell/m/1,1": "b", "counter/" + "5e" * 32: "n"})
    assert replica.check(parse_update(u2)) is None
    replica.apply(u2)
    u3, _ = writer.write({"cell/m/1,1": None})
    assert replica.check(parse_update(u3)) is None


def _rewrite(writer: Feed, changes: dict[str, str | None]) -> bytes:
    """The update a misbehaving writer would send: made on a copy of its Doc, outside Feed's own
    checks."""
    doc = Doc(client_id=writer.client_id)
    doc.apply_update(writer.state())
    before = doc.get_state()
    for key, text in changes.items():
        root = doc.get(
            IMMUTABLE_MAP if key.startswith(("skill/", "cert/", "revoke/")) else RECORDS_MAP,
            type=Map,
        )
        if text is None:
            del root[key]
        else:
            root[key] = text
    return doc.get_update(before)


@pytest.mark.parametrize("key", [SKILL_KEY, CERT_KEY, REVOKE_KEY])
def test_writer_refuses_to_rewrite_its_own_immutable_record(key):
    writer = Feed(AUTHOR)
    writer.write({key: "first"})
    with pytest.raises(knowledge.RecordError, match="refused by peers"):
        writer.write({key: None})


@pytest.mark.parametrize("key", [SKILL_KEY, CERT_KEY, REVOKE_KEY])
def test_check_refuses_deleting_an_immutable_record(key):
    writer = Feed(AUTHOR)
    u1, _ = writer.write({key: "first", "cell/m/1,1": "a"})
    replica = _replica_with(writer, u1)
    u2 = _rewrite(writer, {key: None})
    reason = replica.check(parse_update(u2))
    assert reason is not None and "immutable" in reason


@pytest.mark.parametrize("key", [SKILL_KEY, CERT_KEY, REVOKE_KEY])
def test_check_refuses_rewriting_an_immutable_record(key):
    writer = Feed(AUTHOR)
    writer.write({"cell/m/0,0": "pad"})
    writer.write({key: "first"})
    replica = Feed(AUTHOR)
    u0 = writer.state()
    assert replica.check(parse_update(u0)) is None
    replica.apply(u0)
    u2 = _rewrite(writer, {key: "second"})
    reason = replica.check(parse_update(u2))
    assert reason is not None and "immutable" in reason
    assert replica.get(key) == "first"  # check never applies anything


def test_a_refused_check_leaves_no_trace():
    """A refused update's new immutable insert is not remembered: the same clocks may later hold a
    mutable record (from the real next update), which stays rewritable."""
    writer = Feed(AUTHOR)
    u1, _ = writer.write({SKILL_KEY: "s"})
    replica = _replica_with(writer, u1)
    u2 = _rewrite(
        writer, {SKILL_KEY: None, CERT_KEY: "c"}
    )  # deletes one immutable record, adds another
    assert replica.check(parse_update(u2)) is not None
    honest = Feed(AUTHOR)
    honest.apply(u1)
    u3, _ = honest.write({"cell/m/1,1": "x"})  # reuses the clocks u2 used for its certificate
    assert replica.check(parse_update(u3)) is None
    replica.apply(u3)
    u4, _ = honest.write({"cell/m/1,1": "y"})  # overwrites it: points at those clocks
    assert any(c == replica.client_id for c, _clock in parse_update(u4).references)
    assert replica.check(parse_update(u4)) is None


def test_a_key_in_the_wrong_root_map_is_never_shown():
    forged = Doc(client_id=client_id_for(AUTHOR))
    forged.get(RECORDS_MAP, type=Map)[SKILL_KEY] = "mutable skill?"
    forged.get(IMMUTABLE_MAP, type=Map)["cell/m/1,1"] = "immutable cell?"
    replica = Feed(AUTHOR)
    assert replica.apply(forged.get_update()) == {}
    assert dict(replica.items()) == {}
    assert sorted(replica.misplaced) == sorted([SKILL_KEY, "cell/m/1,1"])


# --- client ids carried by real feed updates (knowledge._yjs.update_clients) ---------------------
# Ingest refuses an update that touches any client id but its author's; these are the real updates a
# Feed produces, so none of them may be refused, and foreign ones must be seen wherever their
# structs start.


def client_ids(update: bytes) -> set[int]:
    return parse_update(update).clients()


def test_client_ids_of_a_first_write():
    feed = Feed(AUTHOR)
    update, _ = feed.write({"a": "1", "b": "x" * 500})
    assert parse_update(update).writes == {feed.client_id}
    assert client_ids(update) == {feed.client_id}
    assert client_ids(feed.state()) == {feed.client_id}


def test_client_ids_of_later_writes():
    """Every update after a client's first starts at a clock > 0 (pycrdt.get_state reports nothing
    for those); the reader must still name the client."""
    feed = Feed(AUTHOR)
    feed.write({"a": "1"})
    for changes in ({"a": "2", "b": "x" * 500}, {f"k{i}": "v" for i in range(50)}):
        update, _ = feed.write(changes)
        assert parse_update(update).writes == {feed.client_id}
        assert client_ids(update) == {feed.client_id}


def test_client_ids_of_a_deletion():
    feed = Feed(AUTHOR)
    feed.write({"a": "1"})
    update, changed = feed.write({"a": None})
    assert changed == {"a": None}
    assert client_ids(update) == {feed.client_id}
    assert {c for c, _clock, _n in parse_update(update).deletes} == {feed.client_id}


def test_client_ids_of_a_checkpoint_after_edits_and_deletes():
    feed = Feed(AUTHOR)
    for changes in ({"a": "1", "b": "2"}, {"a": "3"}, {"b": None}):
        feed.write(changes)
    assert client_ids(feed.state()) == {feed.client_id}


def test_client_ids_see_a_foreign_client():
    foreign = Doc(client_id=client_id_for(OTHER))
    foreign.get(RECORDS_MAP, type=Map)["a"] = "forged"
    assert parse_update(foreign.get_update()).writes == {client_id_for(OTHER)}


def test_client_ids_see_a_foreign_client_in_an_incremental_update():
    foreign = Doc(client_id=client_id_for(OTHER))
    records = foreign.get(RECORDS_MAP, type=Map)
    records["a"] = "first"
    state = foreign.get_state()
    records["b"] = "forged"
    records["a"] = "overwritten"
    incremental = foreign.get_update(state)
    assert client_id_for(OTHER) in client_ids(incremental)


def test_client_ids_of_a_merged_update_list_every_client():
    mine, theirs = Feed(AUTHOR), Feed(OTHER)
    mine.write({"a": "0"})
    u1, _ = mine.write({"a": "1"})
    u2, _ = theirs.write({"b": "2"})
    assert parse_update(merge_updates(u1, u2)).writes == {mine.client_id, theirs.client_id}


@pytest.mark.parametrize("client_id", [0, 1, 127, 128, 2**14, 2**21 + 5, 2**35, 2**53 - 1])
def test_client_ids_decode_var_uints_of_every_width(client_id):
    doc = Doc(client_id=client_id)
    doc.get(RECORDS_MAP, type=Map)["k"] = "v"
    assert client_ids(doc.get_update()) == {client_id}


@pytest.mark.parametrize(
    "garbage", [b"", b"\xff\xff\xff", b"\x01\x01\x05\x00\x28\x01", b"not an update"]
)
def test_client_ids_of_garbage_raise_malformed_update(garbage):
    with pytest.raises(MalformedUpdate):
        parse_update(garbage)


def test_client_ids_refuse_trailing_bytes():
    update, _ = Feed(AUTHOR).write({"a": "1"})
    with pytest.raises(MalformedUpdate):
        parse_update(update + b"\x00")


@settings(max_examples=40)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from("abcdef"), st.none() | st.text(max_size=10), min_size=1, max_size=4
        ),
        min_size=1,
        max_size=8,
    )
)
def test_every_update_a_feed_writes_carries_only_its_own_client(steps):
    feed = Feed(AUTHOR)
    for changes in steps:
        update, _ = feed.write(changes)
        if update:
            assert client_ids(update) == {feed.client_id}


# --- the author's next clock: continuity and dangling ids (Feed.foreign_structure) ---------------
# yrs integrates a struct past a gap behind a hole, holds back an item whose origin it lacks, and
# keeps a delete of clocks it lacks for whatever arrives there later: a feed takes only updates that
# continue its author's clock exactly and point at nothing beyond it.


def _var(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out) + bytes([n])


def _held(*updates: bytes) -> Feed:
    """A replica that took `updates` as ingest does: structure checked, then immutable checks, then
    applied."""
    replica = Feed(AUTHOR)
    for update in updates:
        parsed = parse_update(update)
        assert replica.foreign_structure(parsed) is None and replica.check(parsed) is None
        replica.apply(update)
    return replica


def _refusal(feed: Feed, update: bytes) -> str | None:
    parsed = parse_update(update)
    return feed.foreign_structure(parsed) or feed.check(parsed)


def test_next_clock_counts_the_authors_clock_units_as_updates_pass():
    writer = Feed(AUTHOR)
    assert writer.next_clock == 0
    u1, _ = writer.write({"a": "1", SKILL_KEY: "s"})
    assert writer.next_clock == 2
    u2, _ = writer.write({"a": None})  # a pop is a delete set alone: no clock units
    assert parse_update(u2).structs == [] and writer.next_clock == 2
    u3, _ = writer.write({"a": "3"})
    replica = Feed(AUTHOR)
    for update in (u1, u2, u3):
        replica.replay(update)  # queued, not yet applied: the next clock already counts them
    assert replica.next_clock == 3
    replica.apply_queued()
    assert dict(replica.items()) == dict(writer.items())
    replica.reset()
    assert replica.next_clock == 0


def test_an_update_must_start_at_the_next_clock():
    writer = Feed(AUTHOR)
    u1, u2, u3 = (writer.write({key: "v"})[0] for key in "abc")
    replica = _held(u1)
    reason = _refusal(replica, u3)  # u2 is missing: a gap
    assert reason is not None and "start at clock 2" in reason and "next clock 1" in reason
    assert replica.next_clock == 1  # a refused update moves nothing
    assert _refusal(replica, u2) is None and replica.next_clock == 2
    replica.apply(u2)
    for again in (u1, u2):  # overlapping what is held: yrs would skip part of it
        reason = _refusal(replica, again)
        assert reason is not None and "next clock 2" in reason


def test_a_refused_immutable_rewrite_does_not_move_the_next_clock():
    writer = Feed(AUTHOR)
    u1, _ = writer.write({SKILL_KEY: "s"})
    replica = _held(u1)
    rewrite = _rewrite(writer, {SKILL_KEY: "second"})
    assert replica.foreign_structure(parse_update(rewrite)) is None
    assert "immutable" in replica.check(parse_update(rewrite))
    assert replica.next_clock == 1


def test_a_checkpoint_fits_a_fresh_feed_and_one_holding_part_of_it():
    """A full state starts at clock 0. On a feed holding part of it, yrs skips what is held; here
    the writer's overwritten items were merged into one deleted struct that crosses the replica's
    clock."""
    writer = Feed(AUTHOR)
    u1, _ = writer.write({"cell/m/1": "a"})
    writer.write({"cell/m/1": "b"})
    writer.write({"cell/m/1": "c", SKILL_KEY: "s"})
    checkpoint = writer.state()
    assert parse_update(checkpoint).structs[0][1:] == (0, 2)  # clocks 0 and 1, both overwritten
    for replica in (Feed(AUTHOR), _held(u1)):
        assert _refusal(replica, checkpoint) is None and replica.next_clock == 4
        replica.apply(checkpoint)
        assert dict(replica.items()) == dict(writer.items())


def test_a_full_state_crossing_the_next_clock_continues_from_the_item_before_it():
    """yrs integrates the part of a struct past the feed's clock as if its origin were the item just
    before that clock: here the immutable record at clock 0, which it would overwrite."""
    writer = Feed(AUTHOR)
    u1, _ = writer.write({SKILL_KEY: "s"})
    replica = _held(u1)
    c = replica.client_id
    crossing = (
        _var(1) + _var(1) + _var(c) + _var(0) + b"\x00" + _var(2) + _var(0)
    )  # GC of clocks 0..1
    reason = _refusal(replica, crossing)
    assert reason is not None and "immutable record at clock 0" in reason
    assert replica.next_clock == 1
    ends_early = (
        _var(1) + _var(1) + _var(c) + _var(0) + b"\x00" + _var(1) + _var(0)
    )  # GC of clock 0 alone
    assert "not at its next clock 2" in _refusal(_held(u1, writer.write({"a": "1"})[0]), ends_early)


def test_dangling_origins_and_deletes_are_refused():
    writer = Feed(AUTHOR)
    u1, _ = writer.write({"a": "1"})
    replica, c = _held(u1), writer.client_id
    dangling = (
        _var(1)
        + _var(1)
        + _var(c)
        + _var(1)
        + b"\x88"
        + _var(c)
        + _var(5)
        + _var(1)
        + b"\x77\x01x"
        + _var(0)
    )
    with pytest.raises(
        MalformedUpdate, match="points at clock 5"
    ):  # an item after a clock never written
        parse_update(dangling)
    beyond = (
        _var(0) + _var(1) + _var(c) + _var(1) + _var(1) + _var(1)
    )  # deletes clock 1; the feed holds 0 only
    assert "past the 1" in _refusal(replica, beyond)
    here = _var(0) + _var(1) + _var(c) + _var(1) + _var(0) + _var(1)  # deletes clock 0: held
    assert _refusal(replica, here) is None and replica.next_clock == 1


def test_deleting_what_the_same_update_writes_is_fine():
    writer = Feed(AUTHOR)
    u1, _ = writer.write({"a": "1"})
    doc = Doc(client_id=writer.client_id)
    doc.apply_update(u1)
    before = doc.get_state()
    records = doc.get(RECORDS_MAP, type=Map)
    with doc.transaction():
        records["b"] = "first"
        records["b"] = "second"  # deletes the item this very transaction wrote
    update = doc.get_update(before)
    assert any(clock >= 1 for _c, clock, _n in parse_update(update).deletes)
    replica = _held(u1)
    assert _refusal(replica, update) is None and replica.next_clock == 3


def test_a_skip_struct_is_refused():
    writer = Feed(AUTHOR)
    u1, _ = writer.write({"a": "1"})
    writer.write({"b": "2"})
    u3, _ = writer.write({"c": "3"})
    merged = merge_updates(u1, u3)  # a hole where u2 was: pycrdt marks it with a Skip struct
    assert "Skip" in Feed(AUTHOR).foreign_structure(parse_update(merged))


def test_the_next_clock_is_rebuilt_on_reopening(tmp_path):
    identity = Identity.from_seed(b"\x05" * 32, new=True)
    kb = knowledge.open(tmp_path / "site.db", identity)
    kb.skills.publish("pick-mug", "pick")
    kb.checkpoint()
    kb.maps["floor1"].observe((1, 2), {"label": "shelf"}, confidence=0.7)
    kb.maps["floor1"].observe((1, 2), {"label": "table"}, confidence=0.9)
    feed = kb._replica.feeds[identity.public_key]
    held = feed.next_clock
    assert held == _state_clock(feed)
    kb.close()
    kb = knowledge.open(tmp_path / "site.db", identity)
    try:
        feed = kb._replica.feeds[identity.public_key]
        assert feed.next_clock == held == _state_clock(feed)
    finally:
        kb.close()


def _state_clock(feed: Feed) -> int:
    from knowledge._yjs import _uint

    state = feed.doc.get_state()
    count, pos = _uint(state, 0)
    clocks = {}
    for _ in range(count):
        client, pos = _uint(state, pos)
        clocks[client], pos = _uint(state, pos)
    return clocks.get(feed.client_id, 0)


def test_the_part_of_an_immutable_insert_past_the_next_clock_is_frozen():
    """yrs gives the crossing part the key of the item before the clock, in the struct's own root:
    here a record misplaced in the mutable root becomes a shown immutable record, which must stay
    immutable."""
    forged = Doc(client_id=client_id_for(AUTHOR))
    forged.get(RECORDS_MAP, type=Map)[SKILL_KEY] = "misplaced"  # clock 0
    replica = _held(forged.get_update())
    c = replica.client_id
    named = _var(1) + _var(len(IMMUTABLE_MAP)) + IMMUTABLE_MAP.encode() + _var(1) + b"k"
    crossing = (
        _var(1)
        + _var(1)
        + _var(c)
        + _var(0)
        + b"\x28"
        + named
        + _var(2)
        + b"\x77\x01p\x77\x01q"
        + _var(0)
    )
    assert _refusal(replica, crossing) is None and replica.next_clock == 2
    replica.apply(crossing)
    assert replica.get(SKILL_KEY) == "q"  # now shown, from the immutable root
    overwrite = (
        _var(1)
        + _var(1)
        + _var(c)
        + _var(2)
        + b"\x88"
        + _var(c)
        + _var(1)
        + _var(1)
        + b"\x77\x01r"
        + _var(0)
    )
    assert "immutable record at clock 1" in _refusal(replica, overwrite)


def test_a_full_state_must_continue_what_the_feed_holds():
    """Live, yrs skips the part of a full state a feed holds; but a stored checkpoint is where the
    feed restarts from: one that lacks (or changes) an immutable record held here would drop it
    then."""
    writer = Feed(AUTHOR)
    u1, _ = writer.write({SKILL_KEY: "s", REVOKE_KEY: "r"})
    replica = _held(u1)
    for forged_revocation in (None, "other"):
        forged = Doc(client_id=writer.client_id)
        forged.get(IMMUTABLE_MAP, type=Map)[SKILL_KEY] = "s"  # clock 0, as held
        if forged_revocation is None:
            forged.get(RECORDS_MAP, type=Map)["cell/m/1,1"] = "x"  # clock 1: not the revocation
        else:
            forged.get(IMMUTABLE_MAP, type=Map)[REVOKE_KEY] = forged_revocation
        forged.get(RECORDS_MAP, type=Map)["cell/m/2,2"] = "y"
        assert "lacks or changes" in replica.lacks_held(forged.get_update())
    writer.write({"cell/m/1,1": "x"})
    assert replica.lacks_held(writer.state()) is None  # the honest one
    assert _refusal(replica, writer.state()) is None and replica.next_clock == 3


# --- export / restore (snapshots) -----------------------------------------------------------------


def test_a_restored_feed_builds_its_document_from_the_saved_state_when_first_used():
    writer = Feed(AUTHOR)
    writer.write({"cell/m/1,2": '{"v":1}', "tile/m/0,0": '{"n":0}'})
    saved = writer.export()
    assert saved["map_names"] == {"m"}
    loads = []

    def load_state():
        loads.append(1)
        return saved["state"]

    kept = {k: v for k, v in saved.items() if k != "state"}
    restored = Feed.restore(AUTHOR, kept, load_state)
    assert loads == [] and restored.next_clock == writer.next_clock  # nothing read yet
    assert dict(restored.items()) == dict(writer.items()) and loads == [1]
    assert restored.export()["state"] == writer.state() and loads == [1]  # read once
    assert dict(Feed.restore(AUTHOR, saved).items()) == dict(writer.items())

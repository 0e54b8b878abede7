"""Unit tests for knowledge._feed: one writer's pycrdt Doc, its client id and its updates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycrdt import Doc, Map, merge_updates

from knowledge._envelope import ZERO_HASH
from knowledge._feed import ROOT_MAP, Feed, client_id_for, update_client_ids
from knowledge._identity import Identity

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
    assert (feed.seq, feed.head, feed.hlc, feed.checkpoint_seq) == (0, ZERO_HASH, 0, 0)


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
        st.dictionaries(st.sampled_from("abcdef"), st.none() | st.text(max_size=10), min_size=1, max_size=4),
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
    feed.seq, feed.head, feed.hlc, feed.checkpoint_seq = 3, b"h" * 32, 9, 2
    feed.reset()
    assert dict(feed.items()) == {}
    assert (feed.seq, feed.head, feed.hlc, feed.checkpoint_seq) == (0, ZERO_HASH, 0, 0)
    assert feed.doc.client_id == client_id_for(AUTHOR)
    update, changed = feed.write({"b": "2"})  # usable after reset
    assert changed == {"b": "2"}


def test_records_live_in_the_root_map():
    writer = Feed(AUTHOR)
    update, _ = writer.write({"a": "1"})
    doc = Doc()
    doc.apply_update(update)
    assert dict(doc.get(ROOT_MAP, type=Map).items()) == {"a": "1"}


# --- update_client_ids --------------------------------------------------------------------------


def test_update_client_ids_of_a_first_write():
    feed = Feed(AUTHOR)
    update, _ = feed.write({"a": "1", "b": "x" * 500})
    assert update_client_ids(update) == {feed.client_id}
    assert update_client_ids(feed.state()) == {feed.client_id}


def test_update_client_ids_of_later_writes():
    """Every update after a client's first starts at a clock > 0. The function promises "the client ids
    whose structs a Yjs v1 update carries"; pycrdt.get_state only reports clients whose structs start at
    clock 0, so this must not rely on it alone."""
    feed = Feed(AUTHOR)
    feed.write({"a": "1"})
    for changes in ({"a": "2", "b": "x" * 500}, {f"k{i}": "v" for i in range(50)}):
        update, _ = feed.write(changes)
        assert update_client_ids(update) == {feed.client_id}


def test_update_client_ids_sees_a_foreign_client_in_an_incremental_update():
    foreign = Doc(client_id=client_id_for(OTHER))
    records = foreign.get(ROOT_MAP, type=Map)
    records["a"] = "first"
    state = foreign.get_state()
    records["b"] = "forged"
    incremental = foreign.get_update(state)
    assert client_id_for(OTHER) in update_client_ids(incremental)


def test_update_client_ids_of_a_deletion_only_update_carries_no_foreign_id():
    feed = Feed(AUTHOR)
    feed.write({"a": "1"})
    update, changed = feed.write({"a": None})
    assert changed == {"a": None}
    assert update_client_ids(update) <= {feed.client_id}


def test_update_client_ids_sees_a_foreign_client():
    foreign = Doc(client_id=client_id_for(OTHER))
    foreign.get(ROOT_MAP, type=Map)["a"] = "forged"
    update = foreign.get_update()
    assert update_client_ids(update) == {client_id_for(OTHER)}


def test_update_client_ids_of_a_merged_update_lists_every_client():
    mine, theirs = Feed(AUTHOR), Feed(OTHER)
    u1, _ = mine.write({"a": "1"})
    u2, _ = theirs.write({"b": "2"})
    assert update_client_ids(merge_updates(u1, u2)) == {mine.client_id, theirs.client_id}


@pytest.mark.parametrize("client_id", [0, 1, 127, 128, 2**14, 2**21 + 5, 2**35, 2**53 - 1])
def test_update_client_ids_decodes_var_uints_of_every_width(client_id):
    doc = Doc(client_id=client_id)
    doc.get(ROOT_MAP, type=Map)["k"] = "v"
    assert update_client_ids(doc.get_update()) == {client_id}


def test_update_client_ids_of_garbage_raises_value_error():
    with pytest.raises(ValueError):
        update_client_ids(b"\xff\xff\xff")

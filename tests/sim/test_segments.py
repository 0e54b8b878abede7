import hashlib
import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import CorruptLogError, Event
from sim.world._segments import SEGMENT_EVENTS, check, decode, rows, select


def checksum(*fields):  # as the store's: over the fields' lengths and the fields
    parts = [f if isinstance(f, bytes) else str(f).encode() for f in fields]
    return hashlib.sha256(
        b",".join(b"%d" % len(p) for p in parts) + b"|" + b"".join(parts)
    ).hexdigest()


changes = st.dictionaries(
    st.text(max_size=4),
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=6),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    max_size=2,
)
logs = st.lists(
    st.tuples(st.integers(0, 5), st.text(max_size=6), changes),
    min_size=1,
    max_size=2 * SEGMENT_EVENTS + 10,
)
few = settings(max_examples=25, deadline=None)  # each example is hundreds of events


def logged(steps, first_seq=1):
    ticks = itertools.accumulate(step for step, *_ in steps)
    events = [
        Event(seq, tick, entity, "mutate", change, "p")
        for seq, tick, (_, entity, change) in zip(itertools.count(first_seq), ticks, steps)
    ]
    return [(e, orjson.dumps(tuple(e)[1:], option=orjson.OPT_SORT_KEYS)) for e in events]


def read(table, first_seq=1, prev=""):
    for row in table:
        prev = check(checksum, "log", "west", "", row[2:], first_seq, prev)
        first_seq = row[3] + 1
    return [e for row in table for e in decode("log", row[2:])]


@few
@given(steps=logs, head=st.integers(0, 2**62))
def test_events_read_back_from_their_rows_split_at_the_cap_and_chained(steps, head):
    events = logged(steps)
    table, last = rows(checksum, "west", "", events, head, "")
    assert [row[3] - row[2] + 1 for row in table][:-1] == [SEGMENT_EVENTS] * (len(table) - 1)
    assert all(row[6] == head for row in table) and last == table[-1][-1]
    assert read(table) == [e for e, _ in events]


@few
@given(steps=logs, which=st.floats(0, 1, exclude_max=True), column=st.integers(2, 8))
def test_any_changed_column_of_any_row_is_refused(steps, which, column):
    table, _ = rows(checksum, "west", "", logged(steps), 7, "")
    at = int(which * len(table))
    row = list(table[at])
    value = row[column]  # an int, the events' text (bytes until written), a checksum
    row[column] = value + 1 if isinstance(value, int) else value + value[:1]
    table[at] = tuple(row)
    with pytest.raises(CorruptLogError, match="fails its checksum|lacks events"):
        read(table)


@few
@given(count=st.integers(SEGMENT_EVENTS + 1, 3 * SEGMENT_EVENTS))
def test_a_dropped_or_reordered_row_breaks_the_chain(count):
    events = logged([(1, "", {"i": i}) for i in range(count)])
    table, _ = rows(checksum, "west", "", events, 7, "")
    sizes = [row[3] - row[2] + 1 for row in table]
    assert sizes[:-1] == [SEGMENT_EVENTS] * (len(table) - 1) and sum(sizes) == count
    assert read(table) == [e for e, _ in events]
    with pytest.raises(CorruptLogError, match=f"lacks events 1..{SEGMENT_EVENTS}"):
        read(table[1:])
    with pytest.raises(CorruptLogError, match="lacks events"):
        read(table[::-1])


def test_a_row_that_holds_fewer_events_than_it_says_is_refused():
    table, _ = rows(checksum, "west", "", logged([(1, "", {}), (1, "", {})]), 7, "")
    row = table[0][2:-2] + ('[[1,"","mutate",{},"p"]]', table[0][-1])
    with pytest.raises(CorruptLogError, match="events 1..2 holds 1"):
        decode("log", row)


@given(
    ticks=st.lists(st.integers(0, 50), max_size=30),
    first=st.integers(0, 60),
    last=st.one_of(st.none(), st.integers(0, 60)),
)
def test_select_keeps_the_events_of_the_ticks_asked_for(ticks, first, last):
    events = [
        Event(seq, tick, "", "mutate", {}, "") for seq, tick in enumerate(sorted(ticks), start=1)
    ]
    assert select(events, first, last) == [
        e for e in events if first <= e.tick and (last is None or e.tick <= last)
    ]

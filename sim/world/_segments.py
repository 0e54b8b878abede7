"""How a log's events are stored: segments, the rows of a world's `segments` table.

A segment holds the events one commit appended to one log (at most `SEGMENT_EVENTS`): each event's
encoded JSON, joined into one JSON array, under one checksum that also covers the previous segment's
checksum, so a changed, dropped or reordered segment breaks the chain. It also carries the log's
head as its rows were taken (under the checksum; the log's own row holds the current head). The
store supplies the checksum function (salted with the world id) and the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import orjson

from .._errors import CorruptLogError

SEGMENT_EVENTS = 256  # events per segment at most: what a read of one tick decodes
# what `check` and `decode` read
COLUMNS = "first_seq, last_seq, first_tick, last_tick, head, events, checksum"
Checksum = Callable[..., str]


class Event(NamedTuple):  # a tuple: one is made for every event logged, and read back
    """One mutation of a shard: at virtual `tick`, on `entity` ("" for the shard itself), what
    changed (`kind` "mutate", "leave" or "enter" and its `change`), and who asked (`provenance`)."""

    seq: int
    tick: int
    entity: str
    kind: str
    change: dict
    provenance: str

    def to_json(self) -> dict:
        return {
            "seq": self.seq,
            "tick": self.tick,
            "entity": self.entity,
            "kind": self.kind,
            "change": self.change,
            "provenance": self.provenance,
        }


def rows(
    checksum: Checksum,
    shard: str,
    branch: str,
    events: Sequence[tuple[Event, bytes]],
    head: int,
    prev: str,
) -> tuple[list[tuple], str]:
    """The table rows of events appended to a log (with their encodings), chained from checksum
    `prev`; and the last row's checksum. A row's events are bytes (JSON text) until written."""
    out = []
    for start in range(0, len(events), SEGMENT_EVENTS):
        chunk = events[start : start + SEGMENT_EVENTS] if len(events) > SEGMENT_EVENTS else events
        text = b"[" + b",".join([encoded for _, encoded in chunk]) + b"]"
        first, last = chunk[0][0], chunk[-1][0]
        fields = (shard, branch, first.seq, last.seq, first.tick, last.tick, head)
        prev = checksum("segment", *fields, text, prev)
        out.append((*fields, text, prev))
    return out, prev


def check(
    checksum: Checksum,
    where: str,
    shard: str,
    branch: str,
    row: Sequence,
    expected_seq: int,
    prev: str,
) -> str:
    """Check a segment (its `COLUMNS`) against the seq it must start at and the checksum before it;
    its checksum."""
    first_seq, last_seq, first_tick, last_tick, head, text, stored = row
    if first_seq != expected_seq:
        raise CorruptLogError(f"{where} lacks events {expected_seq}..{first_seq - 1}")
    if stored != checksum(
        "segment", shard, branch, first_seq, last_seq, first_tick, last_tick, head, text, prev
    ):
        raise CorruptLogError(
            f"{where}: the segment of events {first_seq}..{last_seq} (ticks {first_tick}.."
            f"{last_tick}) fails its checksum; nothing was applied from it"
        )
    return stored


def decode(where: str, row: Sequence) -> list[Event]:
    """The events of a checked segment."""
    first_seq, last_seq, *_, text, _ = row
    decoded = orjson.loads(text)
    if len(decoded) != last_seq - first_seq + 1:
        raise CorruptLogError(
            f"{where}: the segment of events {first_seq}..{last_seq} holds {len(decoded)}"
        )
    return [Event(seq, *fields) for seq, fields in enumerate(decoded, start=first_seq)]


def select(events: Sequence[Event], first_tick: int, last_tick: int | None) -> list[Event]:
    """The events of a run in seq order (so in tick order) with first_tick <= tick <= last_tick."""
    out = []
    for event in events:
        if last_tick is not None and event.tick > last_tick:
            break
        if event.tick >= first_tick:
            out.append(event)
    return out

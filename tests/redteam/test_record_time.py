"""Red team, issue #13 item 4: a trusted writer stamping a record with a time far in the future.

A record carries its own `hlc`, and a semantic-map cell shows the record with the highest
(confidence, hlc, author). Before the fix nothing bound a record's hlc to its envelope's, so a
trusted device could write a cell record with hlc 2**64-1 (or 2**63, or an hour ahead) at confidence
1.0 and win that cell for ever. Now an envelope is refused ("record_clock_ahead") if any record in
its update claims a time later than the envelope's own hlc, and the envelope's hlc is bounded by the
receiver's clock-skew check ("clock_skew").

The attacker is a device D that its site A trusts (delegated publish). It signs its envelopes by
hand, with its own key (Feed.write + seal), continuing its real feed. The tests check the rejection
reason, that nothing changed at the receiver (views, heads, stored envelopes), and that an honest
later write wins the cell at every site (A, a second site B trusting A, and D itself).
"""

from __future__ import annotations

import time

import pytest

import knowledge
from knowledge import Role, TrustPolicy
from knowledge._clock import pack
from knowledge._envelope import Envelope, Kind, decode, seal
from knowledge._feed import Feed
from knowledge._records import record_text

HOUR_MS = 3_600_000
CELL = "cell/kitchen/1,1"


def env(raw: bytes) -> Envelope:
    return decode(raw, max_bytes=1 << 26)


def now_hlc(ahead_ms: int = 0) -> int:
    return pack(time.time_ns() // 1_000_000 + ahead_ms)


def cell_record(value, confidence: float, hlc: int) -> str:
    return record_text(
        {"v": 1, "hlc": hlc, "value": value, "confidence": confidence, "deleted": False}
    )


class Forger:
    """Signs the next envelopes of a writer's feed by hand (any update, any hlc), continuing its
    Doc."""

    def __init__(self, kb: knowledge.KnowledgeBase) -> None:
        self.identity = kb.identity
        self.feed = Feed(kb.identity.public_key)
        self.last: Envelope | None = None
        for raw in kb.envelopes_since({}, limit=10**6):
            e = env(raw)
            if e.author == kb.identity.public_key:
                self.feed.replay(e.update)
                self.feed.apply_queued()
                self.last = e
        assert self.last is not None

    def envelope(self, changes: dict[str, str], *, hlc: int) -> bytes:
        """The writer's next envelope (not kept: the same seq can be forged again)."""
        doc = Feed(self.identity.public_key)
        doc.replay(self.feed.state())
        doc.apply_queued()
        update, _ = doc.write(changes)
        return seal(self.identity, Kind.UPDATE, self.last.seq + 1, self.last.hash, hlc, update).raw

    def checkpoint(self, changes: dict[str, str]) -> bytes:
        """A checkpoint of the writer's feed at its head whose state also holds `changes`."""
        doc = Feed(self.identity.public_key)
        doc.replay(self.feed.state())
        doc.apply_queued()
        doc.write(changes)
        return seal(
            self.identity,
            Kind.CHECKPOINT,
            self.last.seq,
            self.last.hash,
            self.last.hlc,
            doc.state(),
        ).raw


def sync(*kbs: knowledge.KnowledgeBase) -> None:
    """Anti-entropy between every pair until nothing moves."""
    for _ in range(10):
        before = [kb.heads() for kb in kbs]
        for a in kbs:
            for b in kbs:
                if a is not b:
                    b.ingest(a.envelopes_since(b.heads(), limit=10**6))
                    if (
                        b.policy.device_of == a.identity.public_key
                    ):  # a device takes its site's word on its feed
                        b.learn_site_heads(a.heads())
        if [kb.heads() for kb in kbs] == before:
            return
    raise AssertionError("sync did not settle")


def state(kb: knowledge.KnowledgeBase):
    return kb.snapshot(), kb.heads(), kb.envelopes_since({}, limit=10**6), kb.equivocations()


@pytest.fixture
def fleet(open_kb):
    """Site A (root), site B trusting A for every role, and A's device D (publish), all in step,
    with D's honest observation of the cell at confidence 0.5."""
    a = open_kb("a")
    b = open_kb("b", policy=TrustPolicy().with_root(a.identity.public_key))
    d = open_kb("d", policy=TrustPolicy().for_device_of(a.identity.public_key))
    a.delegate(d.identity.public_key, [Role.PUBLISH])
    sync(a, d)
    d.maps["kitchen"].observe((1, 1), "honest-d", 0.5)
    sync(a, b, d)
    assert b.maps["kitchen"].get((1, 1)).value == "honest-d"
    return a, b, d


def assert_refused_everywhere(sites, raw: bytes, reason: str) -> None:
    for site in sites:
        before = state(site)
        report = site.ingest([raw])
        assert report.accepted == [] and report.equivocations == [], report
        assert [r.reason for r in report.rejected] == [reason], report.rejected
        assert (
            report.rejected[0].author == env(raw).author.hex()
            and report.rejected[0].seq == env(raw).seq
        )
        assert state(site) == before


def assert_cell_everywhere(sites, value, confidence: float) -> None:
    for site in sites:
        seen = site.maps["kitchen"].get((1, 1))
        assert seen is not None and (seen.value, seen.confidence) == (value, confidence), (
            site.identity.key_id,
            seen,
        )
        assert seen.hlc <= site.now()  # no cell in the views claims a time past this site's clock


@pytest.mark.parametrize("claimed", ["2**64-1", "2**63", "now+1h"])
def test_record_claiming_a_future_time_is_refused_and_honest_writes_still_win(fleet, claimed):
    """Attack: D signs, at an honest envelope time, a cell record with hlc 2**64-1 / 2**63 / an hour
    ahead at confidence 1.0. Every site refuses it ("record_clock_ahead") and changes nothing;
    afterwards D's own later honest write, then A's later higher-confidence write, win the cell at
    A, B and D."""
    a, b, d = fleet
    record_hlc = {"2**64-1": 2**64 - 1, "2**63": 2**63, "now+1h": now_hlc(HOUR_MS)}[claimed]
    forged = Forger(d).envelope({CELL: cell_record("forged", 1.0, record_hlc)}, hlc=d.now())
    assert_refused_everywhere([a, b], forged, "record_clock_ahead")

    d.maps["kitchen"].observe(
        (1, 1), "honest-d-later", 0.6
    )  # D's real next envelope, at the same seq
    sync(a, b, d)
    assert_cell_everywhere([a, b, d], "honest-d-later", 0.6)
    a.maps["kitchen"].observe((1, 1), "honest-a", 0.9)
    sync(a, b, d)
    assert_cell_everywhere([a, b, d], "honest-a", 0.9)
    assert a.equivocations() == b.equivocations() == []
    assert a.snapshot() == b.snapshot() == d.snapshot()


@pytest.mark.parametrize("claimed", ["2**64-1", "now+1h"])
def test_envelope_claiming_the_future_itself_is_refused_as_clock_skew(fleet, claimed):
    """Attack: the same record, with the envelope's own hlc raised to match it: the receiver's
    clock-skew bound refuses the envelope ("clock_skew") and its clock is not dragged forward."""
    a, b, d = fleet
    hlc = {"2**64-1": 2**64 - 1, "now+1h": now_hlc(HOUR_MS)}[claimed]
    forged = Forger(d).envelope({CELL: cell_record("forged", 1.0, hlc)}, hlc=hlc)
    assert_refused_everywhere([a, b], forged, "clock_skew")
    assert a.now() < now_hlc(60_000) and b.now() < now_hlc(60_000)
    a.maps["kitchen"].observe((1, 1), "honest-a", 0.9)
    sync(a, b, d)
    assert_cell_everywhere([a, b, d], "honest-a", 0.9)


@pytest.mark.parametrize(
    "key", ["cell/kitchen/1,1", "cell/other/9,9", "counter/" + "ab" * 32, "future/x"]
)
def test_any_record_of_the_update_claiming_a_later_time_refuses_the_whole_envelope(fleet, key):
    """Attack: the far-future record hides beside an honest one in the same envelope (another cell,
    a counter, a record type this version does not know): the whole envelope is refused, so the
    honest record in it does not land either."""
    a, b, d = fleet
    t = d.now()
    changes = {
        "cell/kitchen/2,2": cell_record("beside", 0.5, t),
        key: record_text({"v": 1, "hlc": 2**64 - 1}),
    }
    if key.startswith("cell/"):
        changes[key] = cell_record("forged", 1.0, 2**64 - 1)
    forged = Forger(d).envelope(changes, hlc=t)
    assert_refused_everywhere([a, b], forged, "record_clock_ahead")


def test_record_time_equal_to_its_envelope_is_accepted_and_later_writes_beat_it(fleet):
    """The bound is exact: a record stamped with its envelope's own hlc is fine (that is what honest
    writers do), and it wins only until a later write of equal confidence."""
    a, b, d = fleet
    t = d.now()
    report = a.ingest([Forger(d).envelope({CELL: cell_record("edge", 1.0, t)}, hlc=t)])
    assert report.rejected == [] and len(report.accepted) == 1 and report.record_issues == []
    sync(a, b)
    assert_cell_everywhere([a, b], "edge", 1.0)
    a.maps["kitchen"].observe((1, 1), "later", 1.0)
    sync(a, b, d)
    assert_cell_everywhere([a, b, d], "later", 1.0)


def test_record_with_a_non_integer_far_future_time_is_never_shown(fleet):
    """Attack: the future time written so that it is no JSON integer (1.8446744073709552e19, a
    string): the envelope may pass, but the record fails its schema (an integer hlc) and is listed,
    never shown."""
    a, b, d = fleet
    key = "cell/kitchen/3,3"
    for claimed in [
        "1.8446744073709552e19",
        '"18446744073709551615"',
        "1e400",
        "18446744073709551615.0",
    ]:
        text = '{"confidence":1.0,"deleted":false,"hlc":%s,"v":1,"value":"forged"}' % claimed
        raw = Forger(d).envelope({key: text}, hlc=d.now())
        for site in (a, b):
            report = site.ingest([raw])
            if report.rejected:
                assert report.rejected[0].reason in {"record_clock_ahead", "oversized_record"}, (
                    report.rejected
                )
            else:
                assert [i.key for i in report.record_issues] == [key], report
        sync(a, b, d)  # D learns its own forged envelope back from A: its feed continues after it
        for site in (a, b, d):
            assert site.maps["kitchen"].get((3, 3)) is None, claimed
        assert_cell_everywhere([a, b, d], "honest-d", 0.5)


def test_forged_checkpoint_carrying_a_future_record_is_refused_by_a_new_site(fleet, open_kb):
    """Attack: D signs a checkpoint of its feed whose state also holds the far-future cell, and
    offers it to a site C that holds nothing of D yet (so there is nothing to compare the checkpoint
    with). C must refuse it ("record_clock_ahead") and then learn D's real feed from A."""
    a, _b, d = fleet
    c = open_kb("c", policy=TrustPolicy().with_root(a.identity.public_key))
    c.ingest(
        [
            raw
            for raw in a.envelopes_since({}, limit=10**6)
            if env(raw).author == a.identity.public_key
        ]
    )
    forged = Forger(d).checkpoint({CELL: cell_record("forged", 1.0, 2**64 - 1)})
    assert_refused_everywhere([c], forged, "record_clock_ahead")
    sync(a, c)
    assert_cell_everywhere([c], "honest-d", 0.5)

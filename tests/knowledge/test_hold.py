"""Unit tests for knowledge._hold: envelopes stamped ahead of the receiver's clock are held,
durably, and applied when due; beyond the horizon or the hold's bounds they are refused with a
clear reason.

Real stores, real signatures; skew comes through the clocks' `physical_ms` seam."""

from __future__ import annotations

import time

import knowledge
from knowledge import HybridClock, Identity, Limits, TrustPolicy
from knowledge._clock import wall_ms

SECOND = 1_000


def real_ms() -> int:
    return time.time_ns() // 1_000_000


class Skewed:
    """A physical clock `offset` ms off real time; a test moves it (fixes it) by hand."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def __call__(self) -> int:
        return real_ms() + self.offset


def writer(offset: int = 0, path: str = ":memory:") -> knowledge.KnowledgeBase:
    return knowledge.open(path, Identity.generate(), clock=HybridClock(physical_ms=Skewed(offset)))


def receiver_of(
    author: knowledge.KnowledgeBase,
    *,
    path: str = ":memory:",
    clock: HybridClock | None = None,
    limits: Limits | None = None,
    identity: Identity | None = None,
) -> knowledge.KnowledgeBase:
    policy = TrustPolicy().with_root(author.identity.public_key)
    return knowledge.open(
        path, identity or Identity.generate(), policy=policy, clock=clock, limits=limits
    )


def skill_names(kb: knowledge.KnowledgeBase) -> list[str]:
    return sorted(s.name for s in kb.skills.list())


def test_an_envelope_from_the_near_future_is_held_then_applied_when_due():
    ahead = writer(offset=60 * SECOND)  # beyond the 5 s accepted offset, within the 10 min horizon
    ahead.skills.publish("early", "pick")
    ahead.skills.publish("earlier-still", "pick")
    clock = Skewed()
    receiver = receiver_of(ahead, clock=HybridClock(physical_ms=clock))

    report = receiver.ingest(ahead.envelopes_since({}))
    assert report.rejected == [] and report.accepted == [] and report.ok
    assert [(h.index, h.seq) for h in report.held] == [(0, 1), (1, 2)]  # 2 is held behind 1
    author = ahead.identity.public_key_hex
    assert [(a, s) for a, s, _due in receiver.held()] == [(author, 1), (author, 2)]
    first_due = receiver.held()[0][2]
    assert abs(first_due - (real_ms() + 55 * SECOND)) < 2 * SECOND
    assert skill_names(receiver) == [] and receiver.heads() == {}
    assert wall_ms(receiver.now()) < real_ms() + SECOND  # its clock was not dragged ahead

    # sent again before it is due: held, not refused (a writer's next sync sends it again)
    again = receiver.ingest(ahead.envelopes_since({}))
    assert [h.seq for h in again.held] == [1, 2] and again.rejected == []
    assert len(receiver.held()) == 2

    clock.offset = 56 * SECOND  # the receiver's clock reaches them
    released = receiver.release_held()
    assert released.accepted == [(author, 1), (author, 2)]
    assert receiver.held() == []
    assert skill_names(receiver) == ["earlier-still", "early"]
    assert receiver.heads()[author].seq == 2
    ahead.skills.publish("later", "pick")  # what follows is held and applied the same way
    clock.offset = 120 * SECOND
    report = receiver.ingest(ahead.envelopes_since(receiver.heads()))
    assert report.accepted == [(author, 3)] and report.held == []


def test_every_ingest_first_applies_what_fell_due():
    ahead = writer(offset=30 * SECOND)
    ahead.skills.publish("early", "pick")
    clock = Skewed()
    receiver = receiver_of(ahead, clock=HybridClock(physical_ms=clock))
    assert len(receiver.ingest(ahead.envelopes_since({})).held) == 1
    clock.offset = 26 * SECOND
    report = receiver.ingest([])
    assert report.released == [(ahead.identity.public_key_hex, 1)]
    assert skill_names(receiver) == ["early"]


def test_a_receiver_20_s_behind_holds_a_correct_writers_envelopes_and_then_takes_them():
    correct = writer()
    for name in ("a", "b", "c"):
        correct.skills.publish(name, "pick")
    behind = Skewed(-20 * SECOND)
    site = receiver_of(correct, clock=HybridClock(physical_ms=behind))
    report = site.ingest(correct.envelopes_since({}))
    assert report.rejected == [] and len(report.held) == 3
    behind.offset = -4 * SECOND  # 16 s later, its clock within 5 s of the envelopes' time
    assert len(site.release_held().accepted) == 3
    assert skill_names(site) == ["a", "b", "c"] and site.held() == []


def test_held_envelopes_survive_a_restart(tmp_path):
    ahead = writer(offset=30 * SECOND)
    ahead.skills.publish("kept", "pick")
    identity, path = Identity.generate(), str(tmp_path / "receiver.db")
    clock = Skewed()
    receiver = receiver_of(
        ahead, path=path, clock=HybridClock(physical_ms=clock), identity=identity
    )
    assert len(receiver.ingest(ahead.envelopes_since({})).held) == 1
    receiver.close()
    ahead.close()  # the writer is gone: nobody will send it again

    reopened = receiver_of(
        ahead, path=path, clock=HybridClock(physical_ms=clock), identity=identity
    )
    assert [s for _a, s, _d in reopened.held()] == [1]
    assert reopened.release_held().accepted == []  # not due yet
    clock.offset = 26 * SECOND
    assert len(reopened.release_held().accepted) == 1
    assert skill_names(reopened) == ["kept"]
    reopened.close()
    assert knowledge.open(path).held() == []  # applied, and no longer held, durably


def test_beyond_the_horizon_an_envelope_is_refused_and_a_far_future_flood_holds_nothing():
    far = writer(offset=3_600 * SECOND)
    for i in range(50):
        far.skills.publish(f"far-{i}", "pick")
    receiver = receiver_of(far)
    report = receiver.ingest(far.envelopes_since({}))
    assert report.reasons() == ["clock_skew"] + ["gap"] * 49
    assert "held up to 600000 ms" in report.rejected[0].detail
    assert receiver.held() == []


def test_a_horizon_set_by_the_policy_is_honoured():
    ahead = writer(offset=30 * SECOND)
    ahead.skills.publish("early", "pick")
    strict = TrustPolicy(hold_horizon_ms=10 * SECOND).with_root(ahead.identity.public_key)
    receiver = knowledge.open(":memory:", Identity.generate(), policy=strict)
    assert receiver.ingest(ahead.envelopes_since({})).reasons() == ["clock_skew"]
    assert TrustPolicy.from_toml(strict.to_toml()).hold_horizon_ms == 10 * SECOND


def test_the_hold_is_bounded_in_envelopes_and_bytes_and_refusals_lose_nothing():
    ahead = writer(offset=20 * SECOND)
    for i in range(6):
        ahead.skills.publish(f"s{i}", "pick")
    clock = Skewed()
    receiver = receiver_of(
        ahead, clock=HybridClock(physical_ms=clock), limits=Limits(max_held_envelopes=4)
    )
    report = receiver.ingest(ahead.envelopes_since({}))
    assert [h.seq for h in report.held] == [1, 2, 3, 4]
    assert report.reasons() == ["hold_full", "gap"]
    assert "the most this site holds" in report.rejected[0].detail

    clock.offset = 16 * SECOND  # due: the writer sends everything again, and all of it lands
    report = receiver.ingest(ahead.envelopes_since(receiver.heads()))
    assert len(report.released) == 4 and len(report.accepted) == 2
    assert len(skill_names(receiver)) == 6

    by_bytes = receiver_of(ahead, limits=Limits(max_held_bytes=1))
    assert by_bytes.ingest(ahead.envelopes_since({}))  # nothing crashes
    assert by_bytes.held() == [] and by_bytes.heads() == {}


def test_another_envelope_at_a_held_seq_is_refused_until_the_held_one_is_due():
    key = Identity.generate()
    first = knowledge.open(":memory:", key, clock=HybridClock(physical_ms=Skewed(20 * SECOND)))
    second = knowledge.open(":memory:", key, clock=HybridClock(physical_ms=Skewed(21 * SECOND)))
    first.skills.publish("one", "pick")
    second.skills.publish("other", "pick")  # the same key's seq 1, another envelope: a fork
    clock = Skewed()
    receiver = receiver_of(first, clock=HybridClock(physical_ms=clock))
    assert len(receiver.ingest(first.envelopes_since({})).held) == 1
    assert receiver.ingest(second.envelopes_since({})).reasons() == ["hold_conflict"]
    clock.offset = 17 * SECOND
    assert len(receiver.release_held().accepted) == 1
    report = receiver.ingest(second.envelopes_since({}))  # now the fork is found as any other
    assert report.equivocations == [(key.public_key_hex, 1)]


def test_a_held_envelope_found_bad_when_due_is_refused_and_dropped():
    site = knowledge.open(":memory:", Identity.generate())
    device = Identity.generate()
    site.delegate(device.public_key, ["publish"])
    robot = knowledge.open(
        ":memory:",
        device,
        policy=TrustPolicy().for_device_of(site.identity.public_key),
        clock=HybridClock(physical_ms=Skewed(20 * SECOND)),
    )
    robot.ingest(site.envelopes_since({}))
    robot.learn_site_heads(site.heads())
    robot.skills.publish("late", "pick")
    clock = Skewed()
    receiver = receiver_of(site, clock=HybridClock(physical_ms=clock))
    receiver.ingest(site.envelopes_since({}))
    assert len(receiver.ingest(robot.envelopes_since({})).held) == 1
    site.revoke_key(device.public_key, last_seq=0)  # the device is cut off before it is due
    receiver.ingest(site.envelopes_since(receiver.heads()))
    clock.offset = 16 * SECOND
    released = receiver.release_held()
    assert released.reasons() == ["revoked_writer"] and released.accepted == []
    assert receiver.held() == [] and skill_names(receiver) == []

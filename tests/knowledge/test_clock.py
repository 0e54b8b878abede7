"""Unit tests for knowledge._clock: the hybrid logical clock and its 64-bit timestamp packing."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import ClockSkewError, HybridClock
from knowledge._clock import LOGICAL_BITS, LOGICAL_MASK, MAX_TIMESTAMP, logical, pack, wall_ms

WALL = st.integers(0, (1 << 48) - 1)
LOGICAL = st.integers(0, LOGICAL_MASK)


class FakePhysical:
    """An injectable physical clock (milliseconds) that a test moves by hand."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


# --- pack / unpack ------------------------------------------------------------------------------


@given(WALL, LOGICAL)
def test_pack_unpack_round_trip(w, c):
    ts = pack(w, c)
    assert wall_ms(ts) == w
    assert logical(ts) == c
    assert 0 <= ts <= MAX_TIMESTAMP
    assert ts.bit_length() <= 64


@given(WALL, LOGICAL, WALL, LOGICAL)
def test_pack_orders_like_wall_then_logical(w1, c1, w2, c2):
    assert (pack(w1, c1) < pack(w2, c2)) == ((w1, c1) < (w2, c2))
    assert (pack(w1, c1) == pack(w2, c2)) == ((w1, c1) == (w2, c2))


@given(st.integers(0, MAX_TIMESTAMP))
def test_unpack_pack_round_trip(ts):
    assert pack(wall_ms(ts), logical(ts)) == ts


def test_pack_defaults_logical_to_zero():
    assert pack(1234) == 1234 << LOGICAL_BITS
    assert logical(pack(1234)) == 0


# --- now ---------------------------------------------------------------------------------------


def test_now_follows_physical_time():
    phys = FakePhysical(1_000_000)
    clock = HybridClock(physical_ms=phys)
    ts = clock.now()
    assert wall_ms(ts) == 1_000_000 and logical(ts) == 0
    phys.ms = 1_000_050
    ts2 = clock.now()
    assert wall_ms(ts2) == 1_000_050 and logical(ts2) == 0
    assert clock.last == ts2


def test_now_is_monotone_under_a_frozen_physical_clock():
    clock = HybridClock(physical_ms=FakePhysical(5_000))
    stamps = [clock.now() for _ in range(100)]
    assert stamps == sorted(set(stamps))
    assert [wall_ms(s) for s in stamps] == [5_000] * 100
    assert [logical(s) for s in stamps] == list(
        range(100)
    )  # the logical counter counts events in one ms


def test_now_is_monotone_when_physical_clock_goes_backwards():
    phys = FakePhysical(10_000)
    clock = HybridClock(physical_ms=phys)
    a = clock.now()
    phys.ms = 9_000  # NTP step backwards
    b = clock.now()
    c = clock.now()
    assert a < b < c
    assert (
        wall_ms(b) == 10_000 and logical(b) == 1
    )  # stays on the latest wall time, bumps the counter
    phys.ms = 10_001
    d = clock.now()
    assert (
        d > c and wall_ms(d) == 10_001 and logical(d) == 0
    )  # and resets the counter once time catches up


@settings(max_examples=50)
@given(st.lists(st.integers(0, 1_000_000), min_size=1, max_size=60))
def test_now_strictly_increases_for_any_physical_sequence(readings):
    it = iter(readings)
    current = [0]

    def physical() -> int:
        current[0] = next(it, current[0])
        return current[0]

    clock = HybridClock(physical_ms=physical)
    stamps = [clock.now() for _ in readings]
    assert all(a < b for a, b in pairwise(stamps))
    for reading, ts in zip(readings, stamps, strict=True):
        assert wall_ms(ts) >= reading  # never behind physical time


def test_now_is_monotone_across_threads():
    clock = HybridClock(physical_ms=FakePhysical(1))
    out: list[list[int]] = [[] for _ in range(4)]

    def work(i):
        for _ in range(500):
            out[i].append(clock.now())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged = [s for o in out for s in o]
    assert len(set(merged)) == len(merged) == 2000  # no timestamp handed out twice
    assert all(a < b for o in out for a, b in pairwise(o))


def test_default_physical_clock_is_system_time():
    clock = HybridClock()
    before = time.time_ns() // 1_000_000
    ts = clock.now()
    after = time.time_ns() // 1_000_000
    assert before <= wall_ms(ts) <= after


# --- check / observe / advance ------------------------------------------------------------------


def test_check_accepts_up_to_max_offset():
    clock = HybridClock(max_offset_ms=500, physical_ms=FakePhysical(100_000))
    clock.check(pack(100_500, 9))  # exactly the offset ahead: fine
    clock.check(pack(50_000))  # behind: fine
    clock.check(0)


def test_check_rejects_beyond_max_offset_and_says_how_far_ahead():
    clock = HybridClock(max_offset_ms=500, physical_ms=FakePhysical(100_000))
    with pytest.raises(ClockSkewError) as info:
        clock.check(pack(100_501))
    message = str(info.value)
    assert "501 ms ahead" in message
    assert "500 ms" in message  # the accepted offset
    with pytest.raises(ClockSkewError) as info:
        clock.check(pack(160_000))
    assert "60000 ms ahead" in str(info.value)


def test_check_does_not_move_the_clock():
    clock = HybridClock(physical_ms=FakePhysical(100_000))
    clock.check(pack(100_100))
    assert clock.last == 0
    with pytest.raises(ClockSkewError):
        clock.check(pack(10**9))
    assert clock.last == 0


def test_observe_merges_a_remote_timestamp():
    phys = FakePhysical(100_000)
    clock = HybridClock(max_offset_ms=1_000, physical_ms=phys)
    remote = pack(100_800, 7)
    clock.observe(remote)
    assert clock.last == remote
    nxt = clock.now()
    assert nxt > remote
    assert wall_ms(nxt) == 100_800 and logical(nxt) == 8


def test_observe_of_an_older_timestamp_keeps_the_clock():
    clock = HybridClock(physical_ms=FakePhysical(100_000))
    mine = clock.now()
    clock.observe(pack(50_000, 3))
    assert clock.last == mine
    assert clock.now() > mine


def test_observe_rejects_and_does_not_adopt_a_far_future_timestamp():
    clock = HybridClock(max_offset_ms=1_000, physical_ms=FakePhysical(100_000))
    mine = clock.now()
    with pytest.raises(ClockSkewError):
        clock.observe(pack(200_000))
    assert clock.last == mine
    assert wall_ms(clock.now()) == 100_000


def test_advance_merges_without_the_offset_check():
    clock = HybridClock(max_offset_ms=1_000, physical_ms=FakePhysical(100_000))
    far = pack(10**9, 2)
    clock.advance(far)  # from our own store: accepted even though it is far ahead
    assert clock.last == far
    assert clock.now() == far + 1
    clock.advance(pack(5))  # older: no effect
    assert clock.last == far + 1


def test_max_offset_is_adjustable():
    clock = HybridClock(max_offset_ms=10, physical_ms=FakePhysical(1_000))
    with pytest.raises(ClockSkewError):
        clock.check(pack(1_011))
    clock.max_offset_ms = 20
    clock.check(pack(1_011))


# --- following a site's clock (a device) --------------------------------------------------------


class FakeMonotonic(FakePhysical):
    """An injectable monotonic clock (milliseconds)."""


def test_follow_measures_the_offset_and_carries_the_reference_on_the_monotonic_clock():
    phys, mono = FakePhysical(100_000), FakeMonotonic(7)
    clock = HybridClock(physical_ms=phys, monotonic_ms=mono)
    assert clock.offset_ms() is None and clock.reference_ms() is None
    assert clock.follow(80_000) == -20_000  # the site is 20 s behind us
    phys.ms, mono.ms = 3_700_000, 1_007  # a second later our wall clock jumps an hour ahead
    assert clock.reference_ms() == 81_000  # the site's time is still known
    assert clock.offset_ms() == 81_000 - 3_700_000


def test_now_refuses_to_stamp_beyond_the_horizon_of_the_site_clock_and_stamps_nothing():
    phys, mono = FakePhysical(1_000_000), FakeMonotonic(0)
    clock = HybridClock(physical_ms=phys, monotonic_ms=mono, hold_horizon_ms=600_000)
    clock.follow(1_000_000)
    ok = clock.now()
    phys.ms = 1_000_000 + 600_000  # ahead by the horizon exactly: the site would hold it
    assert wall_ms(clock.now()) == 1_600_000
    phys.ms = 1_000_000 + 3_600_000  # an hour ahead: the site would refuse it
    last = clock.last
    with pytest.raises(ClockSkewError, match="ahead of its site's clock.*fix it"):
        clock.now()
    assert clock.last == last > ok  # nothing stamped
    phys.ms = 1_000_000  # fixed; but the timestamp stamped at +10 min stays ahead a while
    mono.ms = 1_000
    assert wall_ms(clock.now()) == 1_600_000


def test_a_clock_that_ran_ahead_refuses_until_real_time_catches_up():
    phys, mono = FakePhysical(1_000_000), FakeMonotonic(0)
    clock = HybridClock(physical_ms=phys, monotonic_ms=mono, hold_horizon_ms=10_000)
    clock.now()
    phys.ms += 60_000  # ahead by a minute, unknown to the device: it stamps one event
    clock.now()
    clock.follow(1_000_000)  # then it syncs
    phys.ms = 1_000_000  # and its clock is fixed
    with pytest.raises(ClockSkewError, match="catches up, in about 51 s"):
        clock.now()
    mono.ms, phys.ms = 50_000, 1_050_000  # 50 s later: within the horizon again
    assert wall_ms(clock.now()) == 1_060_000


def test_a_clock_that_follows_nothing_never_refuses():
    clock = HybridClock(physical_ms=FakePhysical(10**12))
    assert clock.now()


def test_a_device_refuses_to_write_while_its_clock_is_beyond_the_bound_and_recovers():
    """The device-side refusal through the knowledge base: ClockSkewError, nothing written, and
    writes resume once the clock is fixed."""
    import knowledge
    from knowledge import Identity, TrustPolicy

    site = knowledge.open(":memory:", Identity.generate())
    device = Identity.generate()
    site.delegate(device.public_key, ["publish"])
    skew = [0]
    robot = knowledge.open(
        ":memory:",
        device,
        policy=TrustPolicy().for_device_of(site.identity.public_key),
        clock=HybridClock(physical_ms=lambda: time.time_ns() // 1_000_000 + skew[0]),
    )
    robot.ingest(site.envelopes_since({}))
    robot.learn_site_heads(site.heads())
    robot.learn_site_time(site.clock.physical())
    skew[0] = 3_600_000
    with pytest.raises(ClockSkewError, match="fix it"):
        robot.skills.publish("from-the-future", "pick")
    assert robot.heads().get(device.public_key_hex) is None  # nothing written
    skew[0] = 0
    robot.skills.publish("on-time", "pick")
    assert site.ingest(robot.envelopes_since(site.heads())).accepted == [(device.public_key_hex, 1)]
    other = knowledge.open(":memory:", Identity.generate())
    other.learn_site_time(0)  # not a device: a site's time means nothing for its writes
    assert other.clock.reference_ms() is None

"""Hybrid logical clocks (Kulkarni et al. 2014) with a bound on accepted forward drift.

A timestamp is one unsigned 64-bit integer: milliseconds since the Unix epoch in the high 48 bits
and a logical counter in the low 16 bits, so timestamps compare as plain integers and encode in 8
bytes.

Two bounds govern a remote timestamp ahead of our physical clock: up to `max_offset_ms` it is
accepted at once; up to `hold_horizon_ms` its envelope is held until it is due (`due_in`); beyond,
it is refused. A device also follows its site's clock (`follow`, at each sync) and refuses to stamp
a write the site would refuse (`now`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ._errors import ClockSkewError

LOGICAL_BITS = 16
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_TIMESTAMP = (1 << 64) - 1
DEFAULT_MAX_OFFSET_MS = 5_000
DEFAULT_HOLD_HORIZON_MS = 600_000  # 10 minutes


def pack(wall_ms: int, logical: int = 0) -> int:
    return (wall_ms << LOGICAL_BITS) | logical


def wall_ms(timestamp: int) -> int:
    return timestamp >> LOGICAL_BITS


def logical(timestamp: int) -> int:
    return timestamp & LOGICAL_MASK


def _system_ms() -> int:
    return time.time_ns() // 1_000_000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class HybridClock:
    """One writer's clock: monotone, close to physical time, and never dragged ahead by a remote
    clock.

    `max_offset_ms` plays the role of CockroachDB's max clock offset: a remote timestamp more than
    that far ahead of our physical clock is never adopted (its envelope waits until it is due, or is
    refused beyond `hold_horizon_ms`), so one bad clock cannot push the fleet's time.
    """

    def __init__(
        self,
        max_offset_ms: int = DEFAULT_MAX_OFFSET_MS,
        physical_ms: Callable[[], int] = _system_ms,
        *,
        hold_horizon_ms: int = DEFAULT_HOLD_HORIZON_MS,
        monotonic_ms: Callable[[], int] = _monotonic_ms,
    ):
        self.max_offset_ms = max_offset_ms
        self.hold_horizon_ms = hold_horizon_ms
        self._physical_ms = physical_ms
        self._monotonic_ms = monotonic_ms
        self._last = 0
        # (the reference clock's ms, our monotonic ms) when last measured: see `follow`
        self._reference: tuple[int, int] | None = None
        self._lock = threading.Lock()

    @property
    def last(self) -> int:
        return self._last

    def physical(self) -> int:
        """Our physical clock, in ms since the epoch (what a site tells its peers it reads)."""
        return self._physical_ms()

    def now(self) -> int:
        """A new timestamp for a local event, greater than every timestamp seen so far.

        ClockSkewError, and nothing stamped, if it would be more than `hold_horizon_ms` ahead of the
        reference clock this clock follows (a device's site): the site would refuse it."""
        with self._lock:
            physical = self._physical_ms()
            stamp = max(self._last + 1, pack(physical))
            reference = self.reference_ms()
            if reference is not None and wall_ms(stamp) - reference > self.hold_horizon_ms:
                raise ClockSkewError(_write_refusal(wall_ms(stamp), physical, reference, self))
            self._last = stamp
            return stamp

    def follow(self, reference_ms: int) -> int:
        """Take `reference_ms` as the reference clock's time now (a device: its site's, read from
        the site's answer at a sync); return its offset from our physical clock (reference minus
        ours, ms).

        The reference is carried forward on our monotonic clock, so a later step of our physical
        clock (the fix of a wrong clock) does not change what `now` compares with."""
        with self._lock:
            self._reference = (reference_ms, self._monotonic_ms())
            return reference_ms - self._physical_ms()

    def reference_ms(self) -> int | None:
        """The reference clock's time now, as last measured and carried forward; None if never."""
        if self._reference is None:
            return None
        measured, at = self._reference
        return measured + self._monotonic_ms() - at

    def offset_ms(self) -> int | None:
        """The reference clock minus our physical clock, in ms; None if never measured."""
        reference = self.reference_ms()
        return None if reference is None else reference - self._physical_ms()

    def due_in(self, remote: int) -> int:
        """Milliseconds until `remote` is at most the accepted offset ahead of physical time (0 or
        less: it is due now)."""
        return wall_ms(remote) - self._physical_ms() - self.max_offset_ms

    def beyond_horizon(self, remote: int) -> str | None:
        """Why `remote` is too far ahead to hold, or None if it is not."""
        ahead = wall_ms(remote) - self._physical_ms()
        if ahead <= self.hold_horizon_ms:
            return None
        return (
            f"timestamp {wall_ms(remote)} ms is {ahead} ms ahead of this clock, beyond the "
            f"{self.hold_horizon_ms} ms it holds envelopes for; check the sender's clock"
        )

    def check(self, remote: int) -> None:
        """Raise ClockSkewError if `remote` is further ahead of physical time than the accepted
        offset."""
        physical = self._physical_ms()
        ahead = wall_ms(remote) - physical
        if ahead > self.max_offset_ms:
            raise ClockSkewError(
                f"timestamp {wall_ms(remote)} ms is {ahead} ms ahead of this clock "
                f"(accepted offset {self.max_offset_ms} ms); check the sender's clock"
            )

    def observe(self, remote: int) -> None:
        """Check a remote timestamp and merge it, so our next timestamp orders after it."""
        self.check(remote)
        self.advance(remote)

    def advance(self, timestamp: int) -> None:
        """Merge a timestamp already accepted (from our own store), without the offset check."""
        with self._lock:
            self._last = max(self._last, timestamp)


def _write_refusal(stamp_ms: int, physical: int, reference: int, clock: HybridClock) -> str:
    """Why a device may not write now, and what will end it."""
    ahead = stamp_ms - reference
    if physical - reference > clock.max_offset_ms:
        cause = f"this device's clock is {physical - reference} ms ahead of its site's: fix it"
    else:
        cause = (
            "this device's clock ran ahead earlier and its timestamps stay ahead until real time "
            f"catches up, in about {(ahead - clock.hold_horizon_ms) // 1000 + 1} s"
        )
    return (
        f"a write now would be stamped {ahead} ms ahead of its site's clock, beyond the "
        f"{clock.hold_horizon_ms} ms the site holds envelopes for, so the site would refuse it; "
        f"{cause} (the offset is measured at each sync)"
    )

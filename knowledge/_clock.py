"""Hybrid logical clocks (Kulkarni et al. 2014) with a bound on accepted forward drift.

A timestamp is one unsigned 64-bit integer: milliseconds since the Unix epoch in the high 48 bits
and a logical counter in the low 16 bits, so timestamps compare as plain integers and encode in 8
bytes.
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


def pack(wall_ms: int, logical: int = 0) -> int:
    return (wall_ms << LOGICAL_BITS) | logical


def wall_ms(timestamp: int) -> int:
    return timestamp >> LOGICAL_BITS


def logical(timestamp: int) -> int:
    return timestamp & LOGICAL_MASK


def _system_ms() -> int:
    return time.time_ns() // 1_000_000


class HybridClock:
    """One writer's clock: monotone, close to physical time, and never dragged ahead by a remote
    clock.

    `max_offset_ms` plays the role of CockroachDB's max clock offset: a remote timestamp more than
    that far ahead of our physical clock is rejected, not adopted, so one bad clock cannot push the
    fleet's time.
    """

    def __init__(
        self,
        max_offset_ms: int = DEFAULT_MAX_OFFSET_MS,
        physical_ms: Callable[[], int] = _system_ms,
    ):
        self.max_offset_ms = max_offset_ms
        self._physical_ms = physical_ms
        self._last = 0
        self._lock = threading.Lock()

    @property
    def last(self) -> int:
        return self._last

    def now(self) -> int:
        """A new timestamp for a local event, greater than every timestamp seen so far."""
        with self._lock:
            self._last = max(self._last + 1, pack(self._physical_ms()))
            return self._last

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

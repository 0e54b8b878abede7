"""Envelopes from the future, held durably until this site's clock reaches them.

An envelope stamped ahead of our clock by more than the accepted offset (`max_clock_offset_ms`) but
no more than the hold horizon (`hold_horizon_ms`) is most likely a clock disagreement, not an
attack: the writer's clock runs ahead, or ours behind. Refusing it would cut the writer off for as
long as the difference lasts (its later envelopes chain on it), and taking it now would drag our
clock ahead. So ingest holds it here, once its grant, chain and signature check out, in the store's
`held` table; envelopes of the same feed that follow it are held behind it. The first ingest (or
`release_held`, which a site server runs every second) after it is due checks it again from the
start and applies it. What is held survives a restart.

Holding is bounded: at most `Limits.max_held_envelopes` envelopes and `Limits.max_held_bytes`
bytes; beyond either, `hold_full`. Only envelopes a trusted writer signed are held, and a writer
keeps what a receiver refused and sends it again at a later sync, so a refusal loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._clock import HybridClock, wall_ms
from ._envelope import Envelope, decode
from ._store import Store


@dataclass(frozen=True, slots=True)
class Waiting:
    """What is kept in memory of one held envelope (its bytes stay in the store)."""

    hash: bytes
    hlc: int
    size: int


def due_ms(hlc: int, clock: HybridClock) -> int:
    """When (our clock, ms) an envelope stamped `hlc` is within the accepted offset."""
    return wall_ms(hlc) - clock.max_offset_ms


class Hold:
    """The envelopes held here, per author and seq; the store's `held` table is the durable copy."""

    def __init__(
        self, store: Store, max_envelope_bytes: int, max_envelopes: int, max_bytes: int
    ) -> None:
        self.store = store
        self.max_envelope_bytes = max_envelope_bytes
        self.max_envelopes, self.max_bytes = max_envelopes, max_bytes
        self.feeds: dict[bytes, dict[int, Waiting]] = {}
        self.bytes = 0
        self.reload()

    def reload(self) -> None:
        """Read what is held from the store (at open, and after an ingest rolled back)."""
        self.feeds, self.bytes = {}, 0
        for raw in self.store.held():
            self._remember(decode(raw, max_bytes=self.max_envelope_bytes))

    def __len__(self) -> int:
        return sum(len(waiting) for waiting in self.feeds.values())

    def find(self, author: bytes, seq: int) -> Waiting | None:
        return self.feeds.get(author, {}).get(seq)

    def tip(self, author: bytes) -> tuple[int, Waiting] | None:
        """The held envelope of `author` with the highest seq, and that seq."""
        waiting = self.feeds.get(author)
        if not waiting:
            return None
        seq = max(waiting)
        return seq, waiting[seq]

    def refusal(self, env: Envelope) -> str | None:
        """Why `env` cannot be held too (the bounds are reached), or None."""
        if len(self) >= self.max_envelopes or self.bytes + len(env.raw) > self.max_bytes:
            return (
                f"{len(self)} envelopes ({self.bytes} bytes) are held here already, the most this "
                f"site holds ({self.max_envelopes}, {self.max_bytes} bytes); send it again later"
            )
        return None

    def add(self, env: Envelope) -> None:
        """Hold `env` (inside the caller's store transaction)."""
        self.store.add_held(env.author, env.seq, env.raw)
        self._remember(env)

    def _remember(self, env: Envelope) -> None:
        self.feeds.setdefault(env.author, {})[env.seq] = Waiting(env.hash, env.hlc, len(env.raw))
        self.bytes += len(env.raw)

    def due(self, clock: HybridClock) -> list[tuple[bytes, int]]:
        """(author, seq) of every held envelope that is due by `clock`."""
        return [
            (author, seq)
            for author, waiting in self.feeds.items()
            for seq, held in waiting.items()
            if clock.due_in(held.hlc) <= 0
        ]

    def bodies(self, keys: list[tuple[bytes, int]]) -> list[bytes]:
        wanted = set(keys)
        return [raw for raw in self.store.held() if (raw[2:34], _seq(raw)) in wanted]

    def forget(self, keys: list[tuple[bytes, int]]) -> None:
        """Stop holding these (author, seq): applied, refused, or dropped."""
        with self.store.transaction():
            self.store.delete_held(keys)
        for author, seq in keys:
            held = self.feeds.get(author, {}).pop(seq, None)
            if held is not None:
                self.bytes -= held.size
            if not self.feeds.get(author, True):
                del self.feeds[author]


def _seq(raw: bytes) -> int:
    return int.from_bytes(raw[34:42], "big")

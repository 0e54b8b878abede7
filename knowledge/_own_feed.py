"""What a store knows of its own writer's feed as others hold it, so that the writer never forks it.

A key can outlive its store: a robot re-flashed with its old key, a site re-installed with its old
root key, a store restored from a backup. Its next envelope must then follow the last one its peers
hold, not the last one its store holds. So a store writes only once it has learnt how far its feed
goes, stops while a peer is known to hold more of it (`floor`), and stops for good when another
history of it exists (`fork`). Everything here is kept in the store's metadata, in the same
transaction as what taught it, so a crash never forgets it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ._errors import NotAuthorizedError
from ._store import Store

_KNOWN = "own_feed_known"  # a peer (a device's site; a root's peers) showed how far the feed goes
# The feed's extent is unknown: the store was created by a key that may have written before (one
# loaded from a file or a seed, not made by `Identity.generate` here), or envelopes of the feed
# arrived from elsewhere (the store was behind its own feed, and a pull may have been cut short).
OWN_FEED_UNKNOWN = "own_feed_unknown"
_FLOOR = "own_feed_floor"  # the newest seq of the feed known to exist elsewhere
_FORK = "own_feed_fork"  # a seq at which another envelope of the feed exists
_CONFIRMED = "own_feed_confirmed_by"  # peers whose heads showed no more of the feed than held


@dataclass
class OwnFeedMemory:
    """The in-memory part an ingest that rolls back restores."""

    floor: int
    fork: int | None
    learnt: bool
    unknown: bool
    confirmed: frozenset[bytes]


class OwnFeed:
    """The rules of `Replica.require` for the writer's own feed, and what they remember."""

    def __init__(self, store: Store, *, held: bool, device: bool, fork: int | None) -> None:
        self._store = store
        self.device = device
        self._held = held  # the store held some of the feed when opened
        self.expected: frozenset[bytes] | None = None  # peers whose heads a root waits for
        self.floor = int(store.get_meta(_FLOOR) or b"0")
        stored_fork = store.get_meta(_FORK)
        self.fork = fork if fork is not None else int(stored_fork) if stored_fork else None
        self.learnt = store.get_meta(_KNOWN) is not None
        self.unknown = store.get_meta(OWN_FEED_UNKNOWN) is not None
        raw = store.get_meta(_CONFIRMED)
        self.confirmed = (
            frozenset(bytes.fromhex(k) for k in json.loads(raw)) if raw else frozenset()
        )

    # --- what the store knows --------------------------------------------------------------------

    @property
    def known(self) -> bool:
        """Whether the store may write its feed as far as it holds it: it has learnt how far the
        feed goes (`mark_known`), or, for a device, it held some of that feed when opened and none
        arrived from elsewhere since, or, for a site root, its key did not come from a file or
        seed when it created the store (`Identity.new`) and none of its feed arrived from elsewhere.
        """
        if self.learnt:
            return True
        if self.device:
            return self._held and not self.unknown
        return not self.unknown

    def waiting_for(self) -> list[bytes]:
        """The expected peers whose heads a site root still waits for (sorted)."""
        return sorted((self.expected or frozenset()) - self.confirmed)

    def memory(self) -> OwnFeedMemory:
        return OwnFeedMemory(self.floor, self.fork, self.learnt, self.unknown, self.confirmed)

    def restore(self, saved: OwnFeedMemory) -> None:
        self.floor, self.fork = saved.floor, saved.fork
        self.learnt, self.unknown, self.confirmed = saved.learnt, saved.unknown, saved.confirmed

    # --- learning ---------------------------------------------------------------------------------

    def note(self, *, floor: int = 0, fork: int | None = None) -> None:
        """Remember that the feed goes at least to `floor` elsewhere, or forked at `fork`."""
        changed = floor > self.floor or (fork is not None and self.fork is None)
        self.floor = max(self.floor, floor)
        self.fork = self.fork if fork is None or self.fork is not None else fork
        if changed and not self._store.readonly:
            with self._store.transaction():
                self._store.set_meta(_FLOOR, str(self.floor).encode())
                if self.fork is not None:
                    self._store.set_meta(_FORK, str(self.fork).encode())

    def arrived(self) -> None:
        """An envelope of the feed came from elsewhere: the store was behind its own feed, so it
        writes again only once a peer's heads show it holds all of it. Called inside the ingest's
        transaction, so a pull cut short by a crash leaves the store waiting, not writing. Peers
        that confirmed while it waited still count: a peer holding no more of the feed than this
        store did then holds no more than it does now."""
        if self._store.readonly or (self.unknown and not self.learnt):
            return
        self.learnt, self.unknown, self.confirmed = False, True, frozenset()
        with self._store.transaction():
            self._store.delete_meta(_KNOWN)
            self._store.delete_meta(_CONFIRMED)
            self._store.set_meta(OWN_FEED_UNKNOWN, b"1")

    def mark_known(self) -> None:
        """Remember that a peer has shown how far the feed goes."""
        if not self.learnt and not self._store.readonly:
            with self._store.transaction():
                self._store.set_meta(_KNOWN, b"1")
                self._store.delete_meta(_CONFIRMED)  # they served; a later wait starts afresh
            self.learnt, self.confirmed = True, frozenset()

    def confirm(self, peer: bytes | None) -> None:
        """A peer's heads show no more of the feed than this store holds. Without expected peers
        (`expect`), any one peer is enough; with them, every one of them must have shown it, since
        a peer that never received the feed shows none of it, and one that received part shows
        only that part."""
        if self.known:
            return
        if peer is None or self.expected is None:
            self.mark_known()
            return
        if peer not in self.confirmed:
            self.confirmed = self.confirmed | {peer}
            if not self._store.readonly:
                with self._store.transaction():
                    keys = sorted(k.hex() for k in self.confirmed)
                    self._store.set_meta(_CONFIRMED, json.dumps(keys).encode())
        if not self.waiting_for():
            self.mark_known()

    def expect(self, peers: Iterable[bytes]) -> None:
        self.expected = frozenset(peers)
        if not self.known and self.confirmed and not self.waiting_for():
            self.mark_known()

    # --- the rule ---------------------------------------------------------------------------------

    def check(self, key_id: str, seq: int) -> None:
        """NotAuthorizedError if writing envelope `seq` of the feed would fork it."""
        if self.fork is not None:
            raise NotAuthorizedError(
                f"another envelope {self.fork} of key {key_id}'s feed exists: "
                "the key has two histories, and writing more would fork it further; retire this key"
            )
        if seq <= self.floor:
            raise NotAuthorizedError(
                f"key {key_id} has written up to seq {self.floor} "
                f"but this store holds only up to {seq - 1}: sync with its site to learn the feed "
                "back before writing (writing now would fork it)"
            )
        if self.known:
            return
        if self.device:
            raise NotAuthorizedError(
                f"this device's store does not know how far key {key_id}'s feed goes: "
                "sync with its site first, so that a key that wrote before (a re-flashed "
                "robot, a pull cut short) learns its feed back instead of forking it"
            )
        waiting = ", ".join(k.hex()[:16] + "…" for k in self.waiting_for())
        raise NotAuthorizedError(
            f"key {key_id}'s feed may go further elsewhere than this store holds (the store was "
            "created empty for a key loaded from a file or seed, or part of the feed came back "
            "from a peer): sync with every peer first (simnet sync)"
            + (f", still waiting for {waiting}," if waiting else "")
            + " so that the key learns its feed back instead of forking it, or restore the store"
        )

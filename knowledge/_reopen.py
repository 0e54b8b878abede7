"""How a replica is saved and reopened without replaying its history.

The envelopes are the record; a replica's feeds and views are derived from them, and replaying a
long history on every open is slow. So the replica snapshots its derived state now and then and on
close (`save`), and opening restores each feed and the views from those snapshots where they still
match the envelopes held, replaying only the envelopes after them (`open_feeds`); anything that
does not match is replayed whole, so a snapshot changes how fast a store opens, never what it
shows. `_snapshot` seals and unseals the bytes; this module decides what is saved, when, and
whether it can be used. It reaches the replica through `ReplicaState`, so it needs no import of
`_replica`.
"""

from __future__ import annotations

import functools
import logging
import pickle
from typing import Any, Protocol

from . import _snapshot
from ._clock import HybridClock
from ._errors import StoreError
from ._feed import Feed
from ._store import MEMORY, SNAPSHOT_PART, Store
from ._trust import Authority
from ._views import Views

log = logging.getLogger("knowledge")
SNAPSHOT_EVERY = 10_000  # envelopes appended before the replica is snapshotted again (at least)

FeedWritten = dict[str, tuple[int, int]]
"""One feed's keys, each with the (seq, hlc) of the envelope that last wrote it."""


class ReplicaState(Protocol):
    """The parts of a replica that saving and reopening read and rebuild."""

    feeds: dict[bytes, Feed]
    written: dict[bytes, FeedWritten]
    views: Views
    authority: Authority
    # (seq, head) of each feed's stored snapshot; the vector and grants the views were saved
    # under; envelopes appended since the last snapshot
    snapshotted: dict[bytes, tuple[int, bytes]]
    views_snapshotted: tuple[dict[bytes, tuple[int, bytes]], bytes] | None
    since_snapshot: int
    banned: dict[bytes, int]  # writers caught forking, with the seq of the first fork found

    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> HybridClock: ...
    @property
    def pending(self) -> dict[str, str | None] | None: ...

    def replay(self, feed: Feed) -> Feed: ...
    def evidence_maps(self, feed: Feed) -> set[str]: ...
    def replay_tail(self, feed: Feed, written: FeedWritten) -> dict[str, str | None]: ...
    def hash_at(self, author: bytes, seq: int) -> bytes | None: ...
    def make_authority(self) -> Authority: ...
    def refresh_trust(self, built_under: Authority | None = None) -> None: ...


def open_feeds(replica: ReplicaState) -> None:
    """Rebuild the feeds and views: from their snapshots where those match the envelopes held
    (replaying only what follows them), by replaying the store otherwise (see `_snapshot`)."""
    store = replica.store
    saved = {
        bytes.fromhex(name[5:]): _snapshot.unseal(parts, SNAPSHOT_PART)
        for name, parts in store.snapshots("feed/").items()
    }
    tails: dict[bytes, dict[str, str | None] | None] = {}  # None: replayed whole
    # and the writers caught forking whose feeds were cut to nothing: their evidence stays, and
    # so do the maps it writes (read rules withhold it by them: `ReplicaState.replay`)
    for author in sorted({*store.authors(), *replica.banned}):
        feed, changes = _restore(replica, author, saved.get(author))
        if changes is None:  # no snapshot that matches: the whole feed is replayed
            feed = replica.replay(Feed(author))
        else:  # a snapshot from before a fork was found knows nothing of its evidence
            feed.map_names |= replica.evidence_maps(feed)
        replica.feeds[author] = feed
        replica.clock.advance(feed.hlc)
        tails[author] = changes
    views = _snapshot.unseal(store.snapshot("views"), SNAPSHOT_PART)
    built_under = None
    if isinstance(views, dict) and _views_match(replica, views):
        try:
            replica.views.import_state(views["state"])
        except ValueError:
            replica.views = Views(replica.authority, replica.written)
        else:
            built_under = replica.make_authority()
            if built_under.digest() != views["authority"]:
                replica.views, built_under = Views(replica.authority, replica.written), None
            else:  # fold in what the feeds' tails changed, judged by those grants
                replica.views.authority = built_under
                for author, changes in tails.items():
                    if changes is None:  # replayed whole: all of it is new to the views
                        changes = dict(replica.feeds[author].items())
                    if changes:
                        replica.views.update(author, changes, [])
                replica.views_snapshotted = (views["vector"], views["authority"])
    replica.refresh_trust(built_under=built_under)


def _restore(
    replica: ReplicaState, author: bytes, saved: Any
) -> tuple[Feed, dict[str, str | None] | None]:
    """A feed from its snapshot plus the envelopes after it, with what those changed; (_, None)
    if the snapshot is missing, damaged, or does not match the envelopes held."""
    if not isinstance(saved, dict):
        return Feed(author), None
    try:
        at = (saved["feed"]["seq"], saved["feed"]["head"])
        feed = Feed.restore(
            author, saved["feed"], functools.partial(_state_of, replica, author, at)
        )
        written = dict(saved["written"])
    except (KeyError, TypeError, ValueError):
        return Feed(author), None
    if feed.seq < 1 or replica.hash_at(author, feed.seq) != feed.head:
        return Feed(author), None  # cut, dropped or replaced since
    replica.written[author] = written
    try:
        changes = replica.replay_tail(feed, written)
    except StoreError:
        changes = None  # the tail does not follow the snapshot (a checkpoint jumped ahead)
    if changes is None:
        replica.written.pop(author, None)
        return Feed(author), None
    replica.snapshotted[author] = at
    return feed, changes


def _state_of(replica: ReplicaState, author: bytes, at: tuple[int, bytes]) -> bytes | None:
    """The document state saved with `author`'s feed snapshot, read when the feed's document is
    first needed (opening reads only the feeds' bookkeeping); if it is gone or damaged, the
    state the envelopes held build (Yjs takes the envelopes after it again as no change)."""
    saved = _snapshot.unseal(replica.store.snapshot(f"state/{author.hex()}"), SNAPSHOT_PART)
    if isinstance(saved, dict) and saved.get("at") == at:
        state = saved.get("state")
        if state is None or isinstance(state, bytes):
            return state
    log.warning("the saved document of feed %s is unusable: replaying it", author.hex()[:16])
    return replica.replay(Feed(author)).state()


def _views_match(replica: ReplicaState, views: dict[str, Any]) -> bool:
    """Whether the saved views cover exactly the feeds restored from their snapshots."""
    try:
        vector = views["vector"]
        return all(replica.snapshotted.get(a) == at for a, at in vector.items()) and all(
            a in vector for a in replica.snapshotted
        )
    except (KeyError, TypeError, AttributeError):
        return False


def save(replica: ReplicaState) -> None:
    """Snapshot every feed changed since its last snapshot, and the views, in one transaction.
    The caller holds the replica's lock.

    Derived data only: a failure (a full disk) is logged, and the next open replays more."""
    store = replica.store
    if store.readonly or not store.is_open or store.path == MEMORY or replica.pending is not None:
        return
    vector = {a: (f.seq, f.head) for a, f in replica.feeds.items() if f.seq}
    authority = replica.authority.digest()
    if replica.views_snapshotted == (vector, authority):
        replica.since_snapshot = 0
        return
    try:
        with store.transaction():
            gone = [a for a in replica.snapshotted if a not in vector]
            store.delete_snapshots(
                [f"{kind}/{a.hex()}" for a in gone for kind in ("feed", "state")]
            )
            for author, at in vector.items():
                if replica.snapshotted.get(author) != at:
                    exported = replica.feeds[author].export()
                    state = exported.pop("state")  # apart: read when the doc is needed
                    feed = {"feed": exported, "written": replica.written.get(author, {})}
                    store.put_snapshot(f"feed/{author.hex()}", _snapshot.seal(feed))
                    saved = {"at": at, "state": state and pickle.PickleBuffer(state)}
                    store.put_snapshot(f"state/{author.hex()}", _snapshot.seal(saved))
            body = {"vector": vector, "authority": authority}
            body["state"] = replica.views.export_state()
            store.put_snapshot("views", _snapshot.seal(body))
    except Exception as exc:  # noqa: BLE001 - derived data: it must never fail a write
        log.warning("could not snapshot the replica (%s): the next open replays more", exc)
        return
    replica.snapshotted = dict(vector)
    replica.views_snapshotted = (vector, authority)
    replica.since_snapshot = 0


def appended(replica: ReplicaState, count: int) -> None:
    """Note `count` envelopes added to the feeds; snapshot once enough have been since the last
    one (at least SNAPSHOT_EVERY, and a quarter of the history: the cost stays a small constant
    per envelope, and a crash replays at most that much). The caller holds the replica's lock."""
    replica.since_snapshot += count
    if replica.since_snapshot >= SNAPSHOT_EVERY and replica.since_snapshot * 4 >= sum(
        f.seq for f in replica.feeds.values()
    ):
        save(replica)

"""A replica: one site's feeds, store, views and grants, and the operations on them that the
knowledge base's parts share.

`KnowledgeBase` composes one Replica and hands it to the collections (`kb.skills`, `kb.maps`, ...),
to retrieval and to ingest, so that none of them reaches into another's internals. It owns the
re-entrant lock that serializes access to the feeds and the store; local writes become signed
envelopes of this site's own feed here (`write`, `batch`, `put_record`), feeds are rebuilt from the
store (`replay`) and grants recomputed from the trust records (`refresh_trust`). How the replica is
saved and reopened from snapshots without replaying its history is `_reopen`'s part.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from . import _reopen
from ._activation import Activations, Standing
from ._checking import Checks
from ._clock import HybridClock
from ._envelope import Envelope, Kind, decode, seal
from ._errors import NotAuthorizedError, RecordError, StoreError, reraise_interrupts
from ._feed import ANY_MAP, Feed
from ._hold import Hold
from ._identity import Identity, key_id
from ._models import Activation, RecordIssue
from ._own_feed import OWN_FEED_UNKNOWN, OwnFeed, OwnFeedMemory
from ._policy import TrustPolicy
from ._records import (
    TRUST_PREFIXES,
    RecordType,
    Role,
    check_record,
    make_key,
    parse_key,
    record_text,
)
from ._reopen import FeedWritten
from ._store import Store
from ._trust import Authority
from ._views import Views
from ._yjs import parse_update

log = logging.getLogger("knowledge")

ForkMemory = tuple[dict[bytes, int], OwnFeedMemory, set[bytes]]
"""(banned authors, what the store knows of its own feed, checkpoints checked consistent)."""


@dataclass(frozen=True)
class Limits:
    """Hard limits on what this knowledge base accepts."""

    max_envelope_bytes: int = 1 << 20
    max_checkpoint_bytes: int = 64 << 20
    max_blob_bytes: int = 256 << 20
    max_blob_store_bytes: int | None = None  # all blobs together, partly fetched ones too
    max_held_envelopes: int = 10_000  # envelopes from the future held until due (see _hold)
    max_held_bytes: int = 64 << 20


def note_written(written: FeedWritten, changes: Mapping[str, str | None], env: Envelope) -> None:
    """Record that `env` last wrote each changed key (a deleted key is written by no one)."""
    if None not in changes.values():  # nothing deleted (a bulk write): at one go
        written.update(dict.fromkeys(changes, (env.seq, env.hlc)))
        return
    for key, text in changes.items():
        if text is None:
            written.pop(key, None)
        else:
            written[key] = (env.seq, env.hlc)


class Replica:
    """One site's replicated state; `lock` (re-entrant) serializes access to it across threads."""

    def __init__(
        self,
        store: Store,
        identity: Identity | None,
        policy: TrustPolicy | None,
        limits: Limits,
        clock: HybridClock | None,
    ) -> None:
        self.store = store
        self.identity = identity
        self.limits = limits
        self.lock = threading.RLock()
        self.pending: dict[str, str | None] | None = None
        # Our own feed as others hold it: writes wait until this store holds all of it, and stop for
        # good if a peer holds another history of it (see require).
        self._bind_identity()
        # This store's writer key; a read-only open trusts the data exactly as its writer does.
        self.own_key = identity.public_key if identity is not None else store.get_meta("identity")
        self.policy = self._load_policy(policy)
        self.clock = clock or HybridClock(
            self.policy.max_clock_offset_ms, hold_horizon_ms=self.policy.hold_horizon_ms
        )
        self.hold = Hold(
            store, limits.max_envelope_bytes, limits.max_held_envelopes, limits.max_held_bytes
        )
        self.feeds: dict[bytes, Feed] = {}
        self.banned: dict[bytes, int] = {}  # author -> the seq of its first fork found here
        for author, seq, _a, _b in store.equivocations():
            self.banned.setdefault(author, seq)  # rows come ordered by seq
        # checkpoints checked against the history held here
        self.consistent_checkpoints: set[bytes] = set()
        # checks of checkpoints held here, and of those this site took feeds from (see _checking)
        self.checks = Checks(store, limits.max_envelope_bytes, limits.max_checkpoint_bytes)
        self.authority = Authority(self.policy, self.own_key, {}, {})
        # Per author, per key: (seq, hlc) of the envelope that last wrote it; the views judge
        # records by it.
        self.written: dict[bytes, FeedWritten] = {}
        self.views = Views(self.authority, self.written)
        self.activations = Activations()
        # what is snapshotted, and how much was appended since (see `_reopen`)
        self.snapshotted: dict[bytes, tuple[int, bytes]] = {}
        self.views_snapshotted: tuple[dict[bytes, tuple[int, bytes]], bytes] | None = None
        self.since_snapshot = 0
        _reopen.open_feeds(self)
        # A store that holds nothing of its own feed may belong to a re-flashed robot or a
        # re-installed site root whose key wrote before: see `OwnFeed.known`.
        self.own = OwnFeed(
            store,
            held=bool(self.own_key) and self.own_key in self.feeds,
            device=self.policy.device_of is not None,
            fork=self.banned.get(self.own_key) if self.own_key else None,
        )
        self.on_close: list[Callable[[], None]] = []  # run under the lock before the store closes

    # --- opening ---------------------------------------------------------------------------------

    def _bind_identity(self) -> None:
        if self.identity is None or self.store.readonly:
            return
        bound = self.store.get_meta("identity")
        if bound is None:
            with self.store.transaction():
                self.store.set_meta("identity", self.identity.public_key)
                if not self.identity.new:  # the key may have a feed elsewhere: see OwnFeed
                    self.store.set_meta(OWN_FEED_UNKNOWN, b"1")
        elif bound != self.identity.public_key:
            raise StoreError(
                f"{self.store.path} belongs to key {key_id(bound)}, not {self.identity.key_id}; "
                "a store has exactly one writer identity"
            )

    def _load_policy(self, policy: TrustPolicy | None) -> TrustPolicy:
        if policy is None:
            stored = self.store.get_meta("policy")
            return (
                TrustPolicy()
                if stored is None
                else TrustPolicy.from_toml(stored.decode(), source="stored policy")
            )
        text = policy.to_toml().encode()
        if not self.store.readonly and self.store.get_meta("policy") != text:
            with self.store.transaction():  # not when it is stored already: a full disk can open
                self.store.set_meta("policy", text)
        return policy

    def replay_tail(self, feed: Feed, written: FeedWritten) -> dict[str, str | None]:
        """Replay the envelopes held after the feed's head into it; return the keys they changed.
        StoreError if they do not follow it."""
        author, changed = feed.author, {}
        for raw in self.store.envelopes(author, after=feed.seq):
            env = decode(raw, max_bytes=self.limits.max_envelope_bytes)
            if env.seq != feed.seq + 1 or env.prev != feed.head:
                raise StoreError(
                    f"store {self.store.path} is corrupt: "
                    f"feed {author.hex()[:16]} breaks at {env.seq}"
                )
            feed.replay(env.update)
            feed.seq, feed.head, feed.hlc = env.seq, env.hash, env.hlc
            changes = feed.apply_queued()
            note_written(written, changes, env)
            changed.update(changes)
        return changed

    def replay(self, feed: Feed) -> Feed:
        """Rebuild one feed from the store: its checkpoint, then its envelopes (verified when they
        came), noting which envelope last wrote each key. Callers refresh the views from the feed
        afterwards.

        Where the envelopes up to the checkpoint are held too (a writer's own feed), they are
        replayed instead, so each key keeps the envelope that wrote it (a checkpoint stamps all of
        them with its seq).
        """
        author, wrote = feed.author, set(feed.map_names)
        feed.reset()
        self.snapshotted.pop(author, None)  # rebuilt: its stored snapshot may be stale
        written = self.written[author] = {}
        checkpoint = self.store.checkpoint(author)
        if checkpoint is not None and None not in (
            self.store.envelope_hash(author, 1),
            self.store.envelope_hash(author, checkpoint[0]),
        ):
            checkpoint = None
        if checkpoint is not None:
            env = decode(checkpoint[1], max_bytes=self.limits.max_checkpoint_bytes)
            feed.replay(env.update)
            feed.seq, feed.head, feed.hlc = env.seq, env.prev, env.hlc
            note_written(written, feed.apply_queued(), env)
        self.replay_tail(feed, written)
        feed.map_names |= wrote | self.evidence_maps(feed)
        return feed

    def evidence_maps(self, feed: Feed) -> set[str]:
        """The maps the author's fork evidence held here writes to: a feed cut before its fork still
        counts as writing them, so that a private map's cells never travel as evidence to a site
        that may not read the map (read rules withhold feeds by the maps they wrote). Each branch
        is applied to a copy of the feed as rebuilt (the history before the fork). Evidence that
        cannot be read so (bytes that are no update: a fork is kept on its signature alone; a feed
        not cut before it, whose held clocks hide the branch's) counts as writing any map."""
        wrote: set[str] = set()
        if feed.author not in self.banned or feed.author == self.own_key:
            return wrote  # no fork found here; or ours: our own feed is not withheld for it
        largest = max(self.limits.max_envelope_bytes, self.limits.max_checkpoint_bytes)
        for author, seq, first, second in self.store.equivocations():
            if author != feed.author:
                continue
            if feed.seq >= seq:
                wrote.add(ANY_MAP)
                continue
            for raw in (first, second):
                try:
                    update = decode(raw, max_bytes=largest).update
                    parse_update(update)  # as strictly as any update, before pycrdt sees a byte
                    probe = Feed(feed.author)
                    probe.queue(feed.state())
                    probe.queue(update)
                    probe.apply_queued()
                except BaseException as exc:  # noqa: BLE001 - pycrdt's Rust panics are BaseException
                    reraise_interrupts(exc)
                    wrote.add(ANY_MAP)
                else:
                    wrote |= probe.map_names
        return wrote

    def make_authority(self) -> Authority:
        """Grants as the policy, the roots' delegation records, the pins' envelopes and the forks
        held here say."""
        return Authority(
            self.policy,
            self.own_key,
            *self.views.delegation_records(),
            held=self.hash_at,
            forks=self.banned,
        )

    def regrant(self) -> None:
        """Judge what follows by the grants the records and forks held now give (views included)."""
        self.authority = self.make_authority()
        self.views.authority = self.authority

    def refresh_trust(self, built_under: Authority | None = None) -> None:
        """Recompute grants from the roots' delegation records, cut feeds beyond their grants,
        rebuild views (unless they were built under the grants computed now: `built_under`).

        Delegation records count only in root feeds, and root status comes from the policy alone,
        so this settles after at most a few rounds; a cut can void or revive a pin, so grants are
        computed again after one.
        """
        authority = self.make_authority()
        while True:
            if built_under is not None and built_under == authority:
                self.views.authority = authority  # the views hold exactly this already
            else:
                self.views.rebuild(authority, ((a, f.items()) for a, f in self.feeds.items()))
            built_under = None
            settled = self.make_authority()
            if settled == authority:
                self.authority = authority
                if self.store.readonly or not self._enforce_grants():
                    return
                settled = self.make_authority()
            authority = settled

    def _enforce_grants(self) -> bool:
        """Drop envelopes beyond every grant a writer holds (key revocations, expiries) and rebuild
        its feed.

        Seq and HLC grow along a feed, so a feed lies inside its grants iff its head does. A feed
        that no grant covers from its start (its only pin names another envelope than the one held)
        is dropped whole, and peers send the kept history.
        """
        cut = False
        authority = self.authority
        for author, feed in list(self.feeds.items()):
            if author == self.own_key or not authority.knows(author) or authority.is_root(author):
                # our own feed is never cut: rewriting it would equivocate (writes stop instead)
                continue
            why = authority.admits(author, feed.seq, feed.hlc)
            if author in self.banned or why not in ("revoked_writer", "delegation_expired"):
                # a forked feed was cut at its fork already; a grant without roles hides, never cuts
                continue
            keep = 0
            checkpoint = self.store.checkpoint(author)
            if checkpoint is not None:
                cp = decode(checkpoint[1], max_bytes=self.limits.max_checkpoint_bytes)
                keep = cp.seq if authority.admits(author, cp.seq, cp.hlc, cp.prev) is None else 0
            for raw in self.store.envelopes(author, after=keep):
                env = decode(raw, max_bytes=self.limits.max_envelope_bytes)
                if authority.admits(author, env.seq, env.hlc, env.hash) is not None:
                    break
                keep = env.seq
            log.info("cutting feed %s after seq %d: %s", author.hex()[:16], keep, why)
            with self.store.transaction():
                self.store.delete_after(author, keep)
            self.replay(feed)
            cut = True
        return cut

    def save_snapshot(self) -> None:
        """Snapshot the feeds and views changed since the last snapshot (see `_reopen`)."""
        with self.lock:
            _reopen.save(self)

    def appended(self, count: int) -> None:
        """Note `count` envelopes ingested; snapshot if one is due (see `_reopen`)."""
        with self.lock:
            _reopen.appended(self, count)

    def hash_at(self, author: bytes, seq: int) -> bytes | None:
        """The hash of `author`'s envelope `seq` held here (a checkpoint at `seq` names it too)."""
        found = self.store.envelope_hash(author, seq)
        if found is None:
            head = self.store.checkpoint_head(author)  # its header only: a checkpoint can be 64 MiB
            if head is not None and head[0] == seq:
                found = head[1]
        return found

    def close(self) -> None:
        """Run the `on_close` hooks (they save derived state: skill indexes); close the store."""
        with self.lock:
            if self.store.is_open:
                for hook in self.on_close:
                    hook()
                _reopen.save(self)
            self.store.close()

    # --- local writes ----------------------------------------------------------------------------

    def require(self, role: Role | None) -> Identity:
        """The identity to write with, if it holds `role` here (None: a site root's rights) and
        writing would not fork its feed; NotAuthorizedError otherwise."""
        if self.identity is None:
            raise NotAuthorizedError("this knowledge base was opened read-only (no identity)")
        own = self.identity.public_key
        feed = self.feeds.get(own)
        seq = feed.seq + 1 if feed else 1
        self.own.check(self.identity.key_id, seq)
        if not self.authority.has_role(own, role):
            needed = role.value if role else "site root"
            hint = (
                " (no delegation from its site has arrived yet: sync first)"
                if not self.authority.knows(own)
                else ""
            )
            raise NotAuthorizedError(
                f"key {self.identity.key_id} lacks the {needed} role at this site{hint}"
            )
        refusal = self.authority.admits(own, seq, self.clock.last)
        if refusal is not None or not self.authority.has_role(own, role, seq, self.clock.last):
            raise NotAuthorizedError(
                f"key {self.identity.key_id} can no longer write: {refusal or 'revoked_writer'}"
            )
        return self.identity

    def now(self) -> int:
        """A fresh hybrid-logical-clock timestamp from this site's clock."""
        return self.clock.now()

    def write(self, changes: dict[str, str | None]) -> None:
        with self.lock:
            if self.pending is not None:
                self.pending.update(changes)
            else:
                self._commit_local(changes)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group several writes into one envelope, committed (durably) when the block exits."""
        with self.lock:
            if self.pending is not None:
                yield
                return
            self.pending = {}
            try:
                yield
                changes = self.pending
            finally:
                self.pending = None
            if changes:
                self._commit_local(changes)

    def _commit_local(self, changes: dict[str, str | None]) -> Envelope | None:
        identity = self.require_identity()
        own = identity.public_key
        feed = self.feeds.get(own) or Feed(own)
        # again, under the lock: a sync may have shown more of our feed
        self.own.check(identity.key_id, feed.seq + 1)
        try:
            update, applied = feed.write(changes)
        except BaseException:
            self.replay(
                feed
            )  # undo (pycrdt may have panicked half-way): peers would refuse this envelope
            raise
        if not applied:
            return None
        env = seal(identity, Kind.UPDATE, feed.seq + 1, feed.head, self.clock.now(), update)
        refusal = self.authority.admits(own, env.seq, env.hlc, env.hash)
        if refusal is not None:  # e.g. the delegation expired by this envelope's own time
            self.replay(feed)
            raise NotAuthorizedError(f"key {identity.key_id} can no longer write: {refusal}")
        if len(env.raw) > self.limits.max_envelope_bytes:
            self.replay(feed)  # undo: peers would refuse an envelope this large
            raise RecordError(
                f"this write makes a {len(env.raw)}-byte envelope, "
                f"over the {self.limits.max_envelope_bytes}-byte limit peers accept; "
                "put large payloads in blobs or split the batch"
            )
        try:
            with self.store.transaction():
                self.store.add_envelope(own, env.seq, env.hash, env.raw)
        except BaseException:
            self.replay(
                feed
            )  # the Doc holds a change the store does not: restore it from the store
            raise
        self.feeds[own] = feed
        feed.seq, feed.head, feed.hlc = env.seq, env.hash, env.hlc
        note_written(self.written.setdefault(own, {}), applied, env)
        issues: list[RecordIssue] = []
        self.views.update(own, applied, issues)
        if issues:
            log.warning("local records skipped by the views: %s", issues)
        if any(k.startswith(TRUST_PREFIXES) for k in applied):
            self.refresh_trust()
        _reopen.appended(self, 1)
        return env

    def put_record(
        self, rtype: RecordType, name: str, record: dict[str, Any], cell: str | None = None
    ) -> str:
        """Check a record as every receiver will (RecordError says what is wrong), then write it."""
        text = record_text(record)
        key = make_key(rtype, name, cell)
        parsed = parse_key(key)
        assert parsed is not None
        check_record(parsed, text, self.require_identity().public_key_hex)
        self.write({key: text})
        return text

    def require_identity(self) -> Identity:
        if self.identity is None:
            raise NotAuthorizedError("this knowledge base was opened read-only (no identity)")
        return self.identity

    def set_policy(self, policy: TrustPolicy) -> None:
        """Replace the trust and activation policy; views are recomputed under it."""
        with self.lock:
            self.policy = self._load_policy(policy)
            self.own.device = policy.device_of is not None
            self.clock.max_offset_ms = policy.max_clock_offset_ms
            self.clock.hold_horizon_ms = policy.hold_horizon_ms
            self.refresh_trust()

    def activation(self, skill_id: str) -> Activation:
        """Whether `skill_id` is active here, from revocations, certificates and the policy."""
        with self.lock:
            return self.activations.activation(
                self.views, self.policy.activation, self.own_site, skill_id
            )

    def standings(self, skill_id: str) -> list[Standing]:
        """The certificates of `skill_id` the policy's validators vouch for, and whether each
        counts."""
        with self.lock:
            return self.activations.standings(
                self.views, self.policy.activation, self.own_site, skill_id
            )

    def current_record(self, rtype: RecordType, name: str) -> dict[str, Any] | None:
        """This writer's current record under a key (a write pending in a batch first), parsed."""
        key = make_key(rtype, name)
        with self.lock:
            pending = self.pending.get(key) if self.pending is not None else None
            feed = self.feeds.get(self.own_key) if self.own_key else None
            text = pending or (feed.get(key) if feed is not None else None)
        return None if text is None else dict(json.loads(text))

    @property
    def own_site(self) -> bytes | None:
        """The site this knowledge base writes for: its own root, or a device's site."""
        return self.policy.device_of or self.own_key

    def fork_memory(self) -> ForkMemory:
        """What this site knows of forks, in memory: an ingest that rolls back restores it."""
        return dict(self.banned), self.own.memory(), set(self.consistent_checkpoints)

    def restore_fork_memory(self, saved: ForkMemory) -> None:
        self.banned, own, self.consistent_checkpoints = saved
        self.own.restore(own)
        self.checks.clear()  # a check finished in the rolled-back transaction is undone: redo it

    def evidence(self, author: bytes) -> list[bytes]:
        return [
            raw
            for a, _s, first, second in self.store.equivocations()
            if a == author
            for raw in (first, second)
        ]

"""The knowledge base: one site's feeds, store and views, and the replication surface.

`open()` returns a KnowledgeBase. Local writes become signed envelopes in this site's own feed;
remote envelopes enter through `ingest`, which checks everything before a byte reaches pycrdt. The
public API is safe to call from several threads: one re-entrant lock serializes access to the feeds
and the store. The state itself, and what the collections and ingest share of it, is a `Replica`
(see `_replica`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Container, Iterable, Iterator, Mapping
from typing import Any

from ._certificates import Certificates, Tasks
from ._clock import HybridClock, pack, wall_ms
from ._collections import Blobs, Counters, Skills
from ._envelope import ZERO_HASH, Envelope, Kind, seal
from ._errors import RecordError, StoreError
from ._feed import ANY_MAP
from ._hold import due_ms
from ._identity import Identity, key_id
from ._ingest import Ingestion, UpdateRejected
from ._ledger import Ledger, Outcomes
from ._maps import Maps
from ._models import Activation, Head, IngestReport
from ._pages import head_of, page_of_envelopes
from ._policy import TrustPolicy
from ._records import MAX_INT, RecordType, Role, make_key
from ._replica import Limits, Replica
from ._store import MEMORY, Store
from ._trust import Grant

log = logging.getLogger("knowledge")


def open(  # noqa: A001 - mirrors the builtin on purpose: knowledge.open(path, identity)
    path: str | os.PathLike[str],
    identity: Identity | None = None,
    *,
    policy: TrustPolicy | str | os.PathLike[str] | None = None,
    limits: Limits | None = None,
    clock: HybridClock | None = None,
) -> KnowledgeBase:
    """Open (creating if needed) the knowledge base at `path`, writing as `identity`.

    Without an identity the store is opened read-only. `policy` (a TrustPolicy or a TOML path)
    replaces the stored policy; without one the stored policy is used, or an empty one (trust only
    yourself). Use ":memory:" for a throwaway knowledge base (tests, experiments): nothing is
    durable.
    """
    if isinstance(policy, (str, os.PathLike)):
        policy = TrustPolicy.load(policy)
    store = Store(path, readonly=identity is None and str(path) != MEMORY)
    try:
        return KnowledgeBase(store, identity, policy, limits or Limits(), clock)
    except BaseException:
        store.close()
        raise


_LONGEST_DELEGATION_MS = 100 * 365 * 86_400_000  # a lasting past this is a mistake, not a lease


class KnowledgeBase:
    """One site's knowledge: its collections, its trust decisions and its replication surface."""

    def __init__(
        self,
        store: Store,
        identity: Identity | None,
        policy: TrustPolicy | None,
        limits: Limits,
        clock: HybridClock | None,
    ) -> None:
        self._replica = replica = Replica(store, identity, policy, limits, clock)
        self.skills = Skills(replica)
        self.maps = Maps(replica)
        self.counters = Counters(replica)
        self.certificates = Certificates(replica)
        self.blobs = Blobs(replica)
        self.tasks = Tasks(replica, self.blobs)
        self.outcomes = Outcomes(replica)
        self.ledger = Ledger(replica)

    @property
    def identity(self) -> Identity | None:
        return self._replica.identity

    @property
    def limits(self) -> Limits:
        return self._replica.limits

    @property
    def policy(self) -> TrustPolicy:
        return self._replica.policy

    def close(self) -> None:
        self._replica.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- local writes -----------------------------------------------------------------------------

    def now(self) -> int:
        """A fresh hybrid-logical-clock timestamp from this site's clock."""
        return self._replica.now()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group several writes into one envelope, committed (durably) when the block exits."""
        with self._replica.batch():
            yield

    def delegate(
        self,
        device: bytes,
        roles: Iterable[Role | str],
        *,
        expires: int | None = None,
        lasting: datetime.timedelta | None = None,
    ) -> None:
        """As a site root: let `device` write for this site with `roles`, until HLC `expires` or
        for `lasting` from now by this site's clock (a robot lent for a shift), if either is given.
        A delegation counts only where `device` is no root; naming this site's own key would count
        nowhere, so it is refused."""
        self._replica.require(None)
        identity = self._replica.identity
        if identity is not None and device == identity.public_key:
            raise RecordError(
                "a site cannot delegate to its own key: it is this site's root and holds every "
                "role already"
            )
        now = self.now()
        if lasting is not None:
            if expires is not None:
                raise RecordError("give a delegation's expires or its lasting, not both")
            ms = round(lasting / datetime.timedelta(milliseconds=1))
            if not 0 < ms <= _LONGEST_DELEGATION_MS:
                raise RecordError(
                    f"a delegation lasts from 1 ms to {_LONGEST_DELEGATION_MS // 86_400_000} days,"
                    f" not {lasting}"
                )
            expires = pack(wall_ms(now) + ms)
        record = {
            "v": 1,
            "hlc": now,
            "roles": sorted(Role(r).value for r in roles),
            "expires": expires,
        }
        self._replica.put_record(RecordType.DELEGATE, device.hex(), record)

    def revoke_key(self, device: bytes, last_seq: int, reason: str = "") -> None:
        """As a site root: accept `device`'s feed only up to `last_seq` (never "after time T":
        clocks lie).

        The record pins the kept prefix by the hash of the device's envelope `last_seq`, so no other
        history the device signs can displace it: this site must hold that envelope.
        """
        replica = self._replica
        replica.require(None)
        last_seq = int(last_seq)
        if not 0 <= last_seq <= MAX_INT:
            raise RecordError(f"last_seq must be an integer in [0, {MAX_INT}], not {last_seq}")
        record = {"v": 1, "hlc": self.now(), "last_seq": last_seq, "reason": reason}
        if last_seq > 0:
            with replica.lock:
                pinned = replica.hash_at(device, last_seq)
                if pinned is None:
                    held = replica.feeds[device].seq if device in replica.feeds else 0
                    raise RecordError(
                        f"this site does not hold envelope {last_seq} of key {key_id(device)} "
                        f"(it holds up to {held}); sync first, or revoke at a seq held here"
                    )
            record["last_hash"] = pinned.hex()
        replica.put_record(RecordType.KEY_REVOKE, device.hex(), record)

    def revoke(self, skill_id: str, reason: str = "") -> None:
        """Turn a skill off fleet-wide, for every site that trusts this writer to revoke.
        Irreversible."""
        replica = self._replica
        identity = replica.require(Role.REVOKE)
        key = make_key(RecordType.REVOKE, skill_id)
        with replica.lock:
            own = replica.feeds.get(identity.public_key)
            if (own is not None and own.get(key) is not None) or (
                replica.pending and key in replica.pending
            ):
                return  # already revoked by this writer; revocations are never rewritten
            replica.put_record(
                RecordType.REVOKE, skill_id, {"v": 1, "hlc": self.now(), "reason": reason}
            )

    def checkpoint(self) -> Envelope:
        """Sign the merged state of this site's own feed, so newcomers need not replay its
        history."""
        replica = self._replica
        identity = replica.require_identity()
        with replica.lock:
            feed = replica.feeds.get(identity.public_key)
            if feed is None or feed.seq == 0:
                raise StoreError("nothing to checkpoint: this site has not written anything yet")
            env = seal(identity, Kind.CHECKPOINT, feed.seq, feed.head, feed.hlc, feed.state())
            if len(env.raw) > self.limits.max_checkpoint_bytes:
                raise StoreError(
                    f"this feed's checkpoint would be {len(env.raw)} bytes, over the "
                    f"{self.limits.max_checkpoint_bytes}-byte limit peers accept: "
                    "they would refuse it"
                )
            with replica.store.transaction():
                replica.store.put_checkpoint(identity.public_key, env.seq, env.raw)
            return env

    def set_policy(self, policy: TrustPolicy) -> None:
        """Replace the trust and activation policy; views are recomputed under it."""
        self._replica.set_policy(policy)

    # --- activation -------------------------------------------------------------------------------
    def is_revoked(self, skill_id: str) -> bool:
        with self._replica.lock:
            return bool(self._replica.views.revocations(skill_id))

    def activation(self, skill_id: str) -> Activation:
        """Whether `skill_id` is active here, derived from revocations, certificates and the
        policy."""
        return self._replica.activation(skill_id)

    def is_active(self, skill_id: str) -> bool:
        return self.activation(skill_id).active

    # --- replication surface ----------------------------------------------------------------------
    def heads(self) -> dict[str, Head]:
        """Per author: the newest seq and envelope hash held here (what a peer compares against)."""
        replica = self._replica
        with replica.lock:
            heads = {
                a.hex(): Head(f.seq, f.head.hex())
                for a, f in sorted(replica.feeds.items())
                if f.seq
            }
            for author, fork in replica.banned.items():
                head = heads.get(author.hex(), Head(0, ZERO_HASH.hex()))
                heads[author.hex()] = Head(head.seq, head.hash, equivocated_at=fork)
            return dict(sorted(heads.items()))

    def envelopes_since(
        self,
        heads: Mapping[str, Head | int],
        limit: int = 1000,
        *,
        exclude: Container[bytes] = (),
        unchecked: Mapping[str, tuple[int, int]] = {},  # noqa: B006 - read, never written
        max_bytes: int | None = None,
    ) -> list[bytes]:
        """Envelopes a peer with `heads` lacks, at most `limit`, trust roots first, each feed in
        order; with `max_bytes`, none is taken once those taken reach it (the last may cross it, so
        a caller that wants at most N bytes asks for N + 1 and knows whether more was held).

        A peer that has nothing of a feed, or is behind the earliest envelope kept here, gets the
        feed's checkpoint first. Call again with the peer's new heads until the answer is empty.
        Feeds of the authors in `exclude` are left out (read rules: see `authors_writing`).

        Heads carry hashes: where the peer's head names a seq held here under another hash, the feed
        has forked, and the peer gets this site's envelope at that seq first, so it finds the fork
        too.

        `unchecked` is the peer's `unchecked_checkpoints()`: for each, if this site holds the
        author's envelopes from 1 to the checkpoint's seq, the page ends with the next of them the
        peer's check needs, so it can check the checkpoint against them.
        """
        return page_of_envelopes(
            self._replica, heads, limit, exclude=exclude, unchecked=unchecked, max_bytes=max_bytes
        )

    def unchecked_checkpoints(self) -> dict[str, tuple[int, int]]:
        """Per author whose feed this site took from a checkpoint it has not checked against the
        envelopes the checkpoint summarizes (it holds none below it): (the checkpoint's seq, how
        many of those envelopes a check under way has replayed). A sync names these to peers
        (`envelopes_since`'s `unchecked`); a peer holding the history sends it, and ingest replays
        it and compares: a checkpoint whose state is not its history's is kept as evidence of a
        fork, one that matches is checked for good."""
        with self._replica.lock:
            return {a.hex(): done for a, done in self._replica.checks.unchecked().items()}

    def learn_site_heads(self, heads: Mapping[str, Head | int]) -> None:
        """As a device (`device_of` in the policy): take these heads, from the device's own site, as
        the word on how far its own feed goes. A device's empty store writes only after this (a
        re-flashed robot would fork its feed otherwise), and no device writes while its site holds
        more of its feed than its store, or another history of it. Only the site's heads count: any
        other peer could claim a head. The federation client calls this when it syncs with the
        device's site."""
        replica = self._replica
        if self.identity is None or self.policy.device_of is None:
            return
        with replica.lock:
            their = head_of(heads, self.identity.public_key)
            seq = their.seq
            own = replica.feeds.get(self.identity.public_key)
            fork = None
            if their.hash and 0 < seq <= (own.seq if own else 0):
                ours = replica.hash_at(self.identity.public_key, seq)
                fork = seq if ours is not None and ours.hex() != their.hash else None
            replica.own.note(floor=seq, fork=fork)
            replica.own.mark_known()

    def learn_peer_heads(
        self, heads: Mapping[str, Head | int], *, peer: bytes | None = None
    ) -> None:
        """As a site root whose store does not know how far its own feed goes (one created empty
        with a key that was not generated with it: a site re-installed with its old key; or one
        that got part of its own feed back from a peer), take `peer`'s heads, read after pulling
        from it, as its word on it. A peer confirms when its heads show no more of the feed than
        the store holds, and the same envelope at that seq; one showing more, or another envelope,
        only keeps the store waiting (the feed comes back with the next pull). The store writes
        once every peer named by `expect_own_feed_from` has confirmed (a peer that never received
        the feed shows none of it, and one that received part shows only that part), or, if none
        were named, once any one has. The federation client calls this on every sync; it does
        nothing for a device, or a store that knows its feed already."""
        replica = self._replica
        if self.identity is None or self.policy.device_of is not None:
            return
        with replica.lock:
            if replica.own.known:
                return
            their = head_of(heads, self.identity.public_key)
            seq = their.seq
            own = replica.feeds.get(self.identity.public_key)
            if seq > (own.seq if own else 0):
                return
            if seq > 0 and their.hash:
                ours = replica.hash_at(self.identity.public_key, seq)
                if ours is None or ours.hex() != their.hash:
                    return
            replica.own.confirm(peer)

    def expect_own_feed_from(self, peers: Iterable[bytes]) -> None:
        """Name the peers (their root keys) whose heads a site root's store waits for before it
        writes, while it does not know how far its own feed goes (see `learn_peer_heads`). A site
        server and `simnet sync` name the site's configured peers."""
        with self._replica.lock:
            self._replica.own.expect(peers)

    def authors_writing(self, map_names: Iterable[str]) -> set[bytes]:
        """Writers whose feeds hold a cell of any of these maps: their envelopes carry that map."""
        names = set(map_names)
        with self._replica.lock:
            return {
                author
                for author, feed in self._replica.feeds.items()
                if feed.map_names & names or ANY_MAP in feed.map_names
            }

    def writes_maps(self, author: bytes, map_names: Container[str]) -> bool:
        """Whether `author`'s feed holds a cell of any of these maps (see `authors_writing`), as
        of now: read rules ask it under the lock a page of envelopes is made under."""
        with self._replica.lock:
            feed = self._replica.feeds.get(author)
            return feed is not None and any(
                name in map_names or name == ANY_MAP for name in feed.map_names
            )

    def roles_of(self, key: bytes) -> frozenset[Role] | None:
        """The roles this site grants `key` (a site root's or a delegated device's), or None if
        unknown."""
        with self._replica.lock:
            return self._replica.authority.roles(key)

    def current_roles(self, key: bytes) -> frozenset[Role]:
        """The roles `key` holds here now: a trusted root's, or a device's from delegations neither
        revoked nor expired (`roles_of` counts those too). Expiry is judged by this site's clock
        now, not by its last timestamp: a site that writes and takes in nothing keeps that timestamp
        from before a device's expiry."""
        return frozenset(role for g in self._current_grants(key) for role in g.roles)

    def vouching_sites(self, key: bytes) -> frozenset[bytes]:
        """The site roots whose current grants (as `current_roles` counts them) give `key` a role
        here: the sites whose device it is, or a root's own key for a root."""
        return frozenset(g.site for g in self._current_grants(key) if g.roles)

    def _current_grants(self, key: bytes) -> list[Grant]:
        """`key`'s grants in force now: a root's, or delegations neither revoked nor expired by
        this site's clock."""
        replica = self._replica
        with replica.lock:
            now = max(replica.clock.last, pack(replica.clock.physical()))
            return [
                g
                for g in replica.authority.grants(key)
                if g.root or (g.last_seq is None and g.admits(0, now) is None)
            ]

    def can_read(self, key: bytes) -> bool:
        """Whether `key` holds a current grant here (`current_roles`) with at least one role.
        Reading (heads, envelopes, blobs) needs one."""
        return bool(self.current_roles(key))

    def ingest(self, envelopes: Iterable[bytes]) -> IngestReport:
        """Check and apply envelopes from peers; durable when this returns. Never raises on bad
        input.

        Each envelope is accepted, a duplicate, or rejected with a reason (see `Rejection.reason`).
        Checks, in the order docs/PROTOCOL.md lists them: size, structure, equivocating author, a
        seq already held (duplicate, fork, checkpoint against the history held), grants and pins,
        continuity, signature, chain, clock, the Yjs update read as yrs reads it, client ids, feed
        structure, record limits and times, immutable records. Only then does a byte reach pycrdt.
        """
        envelopes = list(envelopes)
        with self._replica.lock:
            self._replica.require_identity()
            released = self._release_held()
            report = self._ingest(envelopes)
            report.released = released.accepted
            self._replica.appended(len(report.accepted) + len(released.accepted))
            return report

    def _ingest(self, envelopes: list[bytes], *, releasing: bool = False) -> IngestReport:
        try:
            return Ingestion(self._replica, careful=False, releasing=releasing).run(envelopes)
        except UpdateRejected:
            # A signed update that pycrdt refuses: redo the batch one update at a time.
            return Ingestion(self._replica, careful=True, releasing=releasing).run(envelopes)

    def release_held(self) -> IngestReport:
        """Apply the envelopes held here (stamped ahead of this site's clock) that are due now;
        every `ingest` does this first, and a site server every second. Each is checked again as
        if it had just arrived: its report's `accepted` lists those applied."""
        with self._replica.lock:
            if self.identity is None:
                return IngestReport()
            return self._release_held()

    def _release_held(self) -> IngestReport:
        hold = self._replica.hold
        due = hold.due(self._replica.clock)
        if not due:
            return IngestReport()
        report = self._ingest(hold.bodies(due), releasing=True)
        for refused in report.rejected:
            log.warning(
                "held envelope %s of %s refused when due: %s: %s",
                refused.seq,
                (refused.author or "?")[:16],
                refused.reason,
                refused.detail,
            )
        again = {(bytes.fromhex(h.author), h.seq) for h in report.held}  # our clock stepped back
        hold.forget([key for key in due if key not in again])
        return report

    def held(self) -> list[tuple[str, int, int]]:
        """(author, seq, due in ms of this site's clock) of every envelope held here until due."""
        replica = self._replica
        with replica.lock:
            return sorted(
                (author.hex(), seq, due_ms(waiting.hlc, replica.clock))
                for author, feed in replica.hold.feeds.items()
                for seq, waiting in feed.items()
            )

    @property
    def clock(self) -> HybridClock:
        """This knowledge base's hybrid logical clock (a device's follows its site's: see
        `learn_site_time`)."""
        return self._replica.clock

    def learn_site_time(self, site_ms: int) -> None:
        """As a device (`device_of` in the policy): take `site_ms` as its site's clock now, so that
        it refuses to write (ClockSkewError) what its site would refuse as too far in the future.
        The federation client calls this at each sync with the device's site, from the site's
        `Simnet-Time` header."""
        if self.policy.device_of is not None:
            self._replica.clock.follow(site_ms)

    def equivocations(self) -> list[tuple[str, int]]:
        """(author, seq) of every equivocation detected here; those writers' data stops at seq -
        1."""
        with self._replica.lock:
            return [(a.hex(), s) for a, s, _f, _b in self._replica.store.equivocations()]

    # --- introspection ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Every view as plain data: equal snapshots mean equal knowledge (what convergence tests
        compare)."""
        replica = self._replica
        with replica.lock:
            views = replica.views
            skills = {}
            for skill_id in sorted(str(i) for i in views.indexes(RecordType.SKILL)):
                skills[skill_id] = {
                    "withdrawn": views.withdrawn(skill_id),
                    "revoked": bool(views.revocations(skill_id)),
                    "active": self.activation(skill_id).active,
                    "certificates": [c for c, _r in views.certificates(skill_id)],
                }
            cells = {}
            for map_name in views.map_names():
                for cell in views.cells(map_name):
                    author, rec = views.cell(map_name, cell)  # type: ignore[misc]
                    cells[f"{map_name}/{cell}"] = [
                        rec["value"],
                        rec["confidence"],
                        rec["hlc"],
                        author.hex(),
                        rec.get("deleted", False),
                    ]
            counters = {}
            for skill_id in sorted(str(i) for i in views.indexes(RecordType.COUNTER)):
                counters[skill_id] = {
                    s.hex(): [c.uses, c.successes, c.failures]
                    for s, c in sorted(views.counts(skill_id).items())
                }
            return {
                "skills": skills,
                "cells": cells,
                "counters": counters,
                "revoked": sorted(str(i) for i in views.indexes(RecordType.REVOKE)),
                "equivocators": sorted(a.hex() for a in replica.banned),
            }

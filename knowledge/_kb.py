"""The knowledge base: one site's feeds, store and views, and the replication surface.

`open()` returns a KnowledgeBase. Local writes become signed envelopes in this site's own feed; remote
envelopes enter through `ingest`, which checks everything before a byte reaches pycrdt. The public API is
safe to call from several threads: one re-entrant lock serializes access to the feeds and the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._clock import HybridClock
from ._collections import Blobs, Certificates, Counters, Maps, Skills
from ._envelope import ZERO_HASH, Envelope, Kind, decode, seal
from ._errors import NotAuthorizedError, RecordError, StoreError
from ._feed import Feed
from ._identity import Identity, key_id
from ._ingest import Ingestion, UpdateRejected, note_written
from ._models import Activation, Head, IngestReport, RecordIssue
from ._policy import TrustPolicy, wilson_lower_bound
from ._records import (
    MAX_INT,
    TRUST_PREFIXES,
    RecordType,
    Role,
    canonical_json,
    check_record,
    make_key,
    parse_key,
)
from ._store import MEMORY, Store
from ._trust import Authority
from ._views import Views

log = logging.getLogger("knowledge")
_OWN_KNOWN = "own_feed_known"  # store meta: a device's store has seen its site's heads once
_OWN_FLOOR = "own_feed_floor"  # store meta: the newest seq of our own feed known to exist elsewhere
_OWN_FORK = "own_feed_fork"  # store meta: a seq at which another envelope of our own feed exists


@dataclass(frozen=True)
class Limits:
    """Hard limits on what this knowledge base accepts."""

    max_envelope_bytes: int = 1 << 20
    max_checkpoint_bytes: int = 64 << 20
    max_blob_bytes: int = 256 << 20


def open(  # noqa: A001 - mirrors the builtin on purpose: knowledge.open(path, identity)
    path: str | os.PathLike[str],
    identity: Identity | None = None,
    *,
    policy: TrustPolicy | str | os.PathLike[str] | None = None,
    limits: Limits | None = None,
    clock: HybridClock | None = None,
) -> KnowledgeBase:
    """Open (creating if needed) the knowledge base at `path`, writing as `identity`.

    Without an identity the store is opened read-only. `policy` (a TrustPolicy or a TOML path) replaces the
    stored policy; without one the stored policy is used, or an empty one (trust only yourself).
    Use ":memory:" for a throwaway knowledge base (tests, experiments): nothing is durable.
    """
    if isinstance(policy, (str, os.PathLike)):
        policy = TrustPolicy.load(policy)
    store = Store(path, readonly=identity is None and str(path) != MEMORY)
    try:
        return KnowledgeBase(store, identity, policy, limits or Limits(), clock)
    except BaseException:
        store.close()
        raise


class KnowledgeBase:
    def __init__(
        self,
        store: Store,
        identity: Identity | None,
        policy: TrustPolicy | None,
        limits: Limits,
        clock: HybridClock | None,
    ) -> None:
        self._store = store
        self.identity = identity
        self.limits = limits
        self._lock = threading.RLock()
        self._pending: dict[str, str | None] | None = None
        # Our own feed as others hold it: writes wait until this store holds all of it, and stop for good if
        # a peer holds another history of it (see _require).
        self._bind_identity()
        # This store's writer key; a read-only open trusts the data exactly as its writer does.
        self._own_key = identity.public_key if identity is not None else store.get_meta("identity")
        self.policy = self._load_policy(policy)
        self._clock = clock or HybridClock(self.policy.max_clock_offset_ms)
        self._feeds: dict[bytes, Feed] = {}
        self._banned: dict[bytes, int] = {}  # author -> the seq of its first fork found here
        for author, seq, _a, _b in store.equivocations():
            self._banned.setdefault(author, seq)  # rows come ordered by seq
        self._own_fork = (
            self._banned.get(self._own_key) if self._own_key else None
        )  # another history exists
        self._own_floor = int(store.get_meta(_OWN_FLOOR) or b"0")
        if self._own_fork is None and store.get_meta(_OWN_FORK) is not None:
            self._own_fork = int(store.get_meta(_OWN_FORK))  # type: ignore[arg-type]
        self._consistent_checkpoints: set[bytes] = (
            set()
        )  # checkpoints checked against the history held here
        self._authority = Authority(self.policy, self._own_key, {}, {})
        # Per author, per key: (seq, hlc) of the envelope that last wrote it; the views judge records by it.
        self._written: dict[bytes, dict[str, tuple[int, int]]] = {}
        self._views = Views(self._authority, self._written)
        for author in store.authors():
            self._feeds[author] = self._replay(Feed(author))
            self._clock.advance(self._feeds[author].hlc)
        self._refresh_trust()
        # A device's store that holds nothing of its own feed may belong to a re-flashed robot whose key
        # wrote before: it writes only once its site's heads have shown how far that feed goes.
        own = self._feeds.get(self._own_key) if self._own_key else None
        self._own_known = (
            self.policy.device_of is None
            or own is not None
            or store.get_meta(_OWN_KNOWN) is not None
        )
        self.skills = Skills(self)
        self.maps = Maps(self)
        self.counters = Counters(self)
        self.certificates = Certificates(self)
        self.blobs = Blobs(self)

    # --- opening ------------------------------------------------------------------------------------

    def _bind_identity(self) -> None:
        if self.identity is None or self._store.readonly:
            return
        bound = self._store.get_meta("identity")
        if bound is None:
            with self._store.transaction():
                self._store.set_meta("identity", self.identity.public_key)
        elif bound != self.identity.public_key:
            raise StoreError(
                f"{self._store.path} belongs to key {key_id(bound)}, not {self.identity.key_id}; "
                "a store has exactly one writer identity"
            )

    def _load_policy(self, policy: TrustPolicy | None) -> TrustPolicy:
        if policy is None:
            stored = self._store.get_meta("policy")
            return (
                TrustPolicy()
                if stored is None
                else TrustPolicy.from_toml(stored.decode(), source="stored policy")
            )
        if not self._store.readonly:
            with self._store.transaction():
                self._store.set_meta("policy", policy.to_toml().encode())
        return policy

    def _replay(self, feed: Feed) -> Feed:
        """Rebuild one feed from the store: its checkpoint, then its envelopes (verified when they came),
        noting which envelope last wrote each key. Callers refresh the views from the feed afterwards.

        Where the envelopes up to the checkpoint are held too (a writer's own feed), they are replayed
        instead, so each key keeps the envelope that wrote it (a checkpoint stamps all of them with its seq).
        """
        author = feed.author
        feed.reset()
        written = self._written[author] = {}
        checkpoint = self._store.checkpoint(author)
        if checkpoint is not None and None not in (
            self._store.envelope_hash(author, 1),
            self._store.envelope_hash(author, checkpoint[0]),
        ):
            checkpoint = None
        if checkpoint is not None:
            env = decode(checkpoint[1], max_bytes=self.limits.max_checkpoint_bytes)
            feed.replay(env.update)
            feed.seq, feed.head, feed.hlc = env.seq, env.prev, env.hlc
            note_written(written, feed.apply_queued(), env)
        for raw in self._store.envelopes(author, after=feed.seq):
            env = decode(raw, max_bytes=self.limits.max_envelope_bytes)
            if env.seq != feed.seq + 1 or env.prev != feed.head:
                raise StoreError(
                    f"store {self._store.path} is corrupt: feed {author.hex()[:16]} breaks at {env.seq}"
                )
            feed.replay(env.update)
            feed.seq, feed.head, feed.hlc = env.seq, env.hash, env.hlc
            note_written(written, feed.apply_queued(), env)
        return feed

    def _make_authority(self) -> Authority:
        """Grants as the policy, the roots' delegation records, the pins' envelopes and the forks held here say."""
        return Authority(
            self.policy,
            self._own_key,
            *self._views.delegation_records(),
            held=self._hash_at,
            forks=self._banned,
        )

    def _refresh_trust(self) -> None:
        """Recompute grants from the roots' delegation records, cut feeds beyond their grants, rebuild views.

        Delegation records count only in root feeds, and root status comes from the policy alone, so
        this settles after at most a few rounds; a cut can void or revive a pin, so grants are computed
        again after one.
        """
        authority = self._make_authority()
        while True:
            self._views.rebuild(authority, ((a, f.items()) for a, f in self._feeds.items()))
            settled = self._make_authority()
            if settled == authority:
                self._authority = authority
                if self._store.readonly or not self._enforce_grants():
                    return
                settled = self._make_authority()
            authority = settled

    def _enforce_grants(self) -> bool:
        """Drop envelopes beyond every grant a writer holds (key revocations, expiries) and rebuild its feed.

        Seq and HLC grow along a feed, so a feed lies inside its grants iff its head does. A feed that no
        grant covers from its start (its only pin names another envelope than the one held) is dropped
        whole, and peers send the kept history.
        """
        cut = False
        authority = self._authority
        for author, feed in list(self._feeds.items()):
            if author == self._own_key or not authority.knows(author) or authority.is_root(author):
                continue  # our own feed is never cut: rewriting it would equivocate (writes stop instead)
            why = authority.admits(author, feed.seq, feed.hlc)
            if author in self._banned or why not in ("revoked_writer", "delegation_expired"):
                continue  # a forked feed was cut at its fork already; a grant without roles hides, never cuts
            keep = 0
            checkpoint = self._store.checkpoint(author)
            if checkpoint is not None:
                cp = decode(checkpoint[1], max_bytes=self.limits.max_checkpoint_bytes)
                keep = cp.seq if authority.admits(author, cp.seq, cp.hlc, cp.prev) is None else 0
            for raw in self._store.envelopes(author, after=keep):
                env = decode(raw, max_bytes=self.limits.max_envelope_bytes)
                if authority.admits(author, env.seq, env.hlc, env.hash) is not None:
                    break
                keep = env.seq
            log.info("cutting feed %s after seq %d: %s", author.hex()[:16], keep, why)
            with self._store.transaction():
                self._store.delete_after(author, keep)
            self._replay(feed)
            cut = True
        return cut

    def _hash_at(self, author: bytes, seq: int) -> bytes | None:
        """The hash of `author`'s envelope `seq` held here (a checkpoint at `seq` names it too)."""
        found = self._store.envelope_hash(author, seq)
        if found is None:
            head = self._store.checkpoint_head(
                author
            )  # its header only: a checkpoint can be 64 MiB
            if head is not None and head[0] == seq:
                found = head[1]
        return found

    def close(self) -> None:
        with self._lock:
            if self._store.is_open:
                self.skills._retrieval.flush()
            self._store.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- local writes -------------------------------------------------------------------------------
    def _require(self, role: Role | None) -> Identity:
        if self.identity is None:
            raise NotAuthorizedError("this knowledge base was opened read-only (no identity)")
        own = self.identity.public_key
        feed = self._feeds.get(own)
        seq = feed.seq + 1 if feed else 1
        self._check_own_feed(seq)
        if not self._authority.has_role(own, role):
            needed = role.value if role else "site root"
            hint = (
                " (no delegation from its site has arrived yet: sync first)"
                if not self._authority.knows(own)
                else ""
            )
            raise NotAuthorizedError(
                f"key {self.identity.key_id} lacks the {needed} role at this site{hint}"
            )
        refusal = self._authority.admits(own, seq, self._clock.last)
        if refusal is not None or not self._authority.has_role(own, role, seq, self._clock.last):
            raise NotAuthorizedError(
                f"key {self.identity.key_id} can no longer write: {refusal or 'revoked_writer'}"
            )
        return self.identity

    def _check_own_feed(self, seq: int) -> None:
        """NotAuthorizedError if writing envelope `seq` of our own feed would fork it."""
        key_id = self.identity.key_id  # type: ignore[union-attr]
        if self._own_fork is not None:
            raise NotAuthorizedError(
                f"another envelope {self._own_fork} of key {key_id}'s feed exists: the key has two histories, and "
                "writing more would fork it further; retire this key"
            )
        if seq <= self._own_floor:
            raise NotAuthorizedError(
                f"key {key_id} has written up to seq {self._own_floor} but this store holds only up to {seq - 1}: "
                "sync with its site to learn the feed back before writing (writing now would fork it)"
            )
        if not self._own_known:
            raise NotAuthorizedError(
                f"this device's store holds nothing of key {key_id}'s feed yet: sync with its site first, so that "
                "a key that wrote before (a re-flashed robot) learns its feed back instead of forking it"
            )

    def now(self) -> int:
        """A fresh hybrid-logical-clock timestamp from this site's clock."""
        return self._clock.now()

    def _write(self, changes: dict[str, str | None]) -> None:
        with self._lock:
            if self._pending is not None:
                self._pending.update(changes)
            else:
                self._commit_local(changes)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group several writes into one envelope, committed (durably) when the block exits."""
        with self._lock:
            if self._pending is not None:
                yield
                return
            self._pending = {}
            try:
                yield
                changes = self._pending
            finally:
                self._pending = None
            if changes:
                self._commit_local(changes)

    def _commit_local(self, changes: dict[str, str | None]) -> Envelope | None:
        identity = self._require_identity()
        own = identity.public_key
        feed = self._feeds.get(own) or Feed(own)
        self._check_own_feed(
            feed.seq + 1
        )  # again, under the lock: a sync may have shown more of our feed
        try:
            update, applied = feed.write(changes)
        except BaseException:
            self._replay(
                feed
            )  # undo (pycrdt may have panicked half-way): peers would refuse this envelope
            raise
        if not applied:
            return None
        env = seal(identity, Kind.UPDATE, feed.seq + 1, feed.head, self._clock.now(), update)
        refusal = self._authority.admits(own, env.seq, env.hlc, env.hash)
        if refusal is not None:  # e.g. the delegation expired by this envelope's own time
            self._replay(feed)
            raise NotAuthorizedError(f"key {identity.key_id} can no longer write: {refusal}")
        if len(env.raw) > self.limits.max_envelope_bytes:
            self._replay(feed)  # undo: peers would refuse an envelope this large
            raise RecordError(
                f"this write makes a {len(env.raw)}-byte envelope, over the {self.limits.max_envelope_bytes}-byte "
                "limit peers accept; put large payloads in blobs or split the batch"
            )
        try:
            with self._store.transaction():
                self._store.add_envelope(own, env.seq, env.hash, env.raw)
        except BaseException:
            self._replay(
                feed
            )  # the Doc holds a change the store does not: restore it from the store
            raise
        self._feeds[own] = feed
        feed.seq, feed.head, feed.hlc = env.seq, env.hash, env.hlc
        note_written(self._written.setdefault(own, {}), applied, env)
        issues: list[RecordIssue] = []
        self._views.update(own, applied, issues)
        if issues:
            log.warning("local records skipped by the views: %s", issues)
        if any(k.startswith(TRUST_PREFIXES) for k in applied):
            self._refresh_trust()
        return env

    def _put_record(
        self, rtype: RecordType, name: str, record: dict[str, Any], cell: str | None = None
    ) -> str:
        """Check a record as every receiver will (RecordError says what is wrong), then write it."""
        text = canonical_json(record)
        key = make_key(rtype, name, cell)
        parsed = parse_key(key)
        assert parsed is not None
        check_record(parsed, text, self._require_identity().public_key_hex)
        self._write({key: text})
        return text

    def delegate(
        self, device: bytes, roles: Iterable[Role | str], *, expires: int | None = None
    ) -> None:
        """As a site root: let `device` write for this site with `roles` (until HLC `expires`, if given)."""
        self._require(None)
        record = {
            "v": 1,
            "hlc": self.now(),
            "roles": sorted(Role(r).value for r in roles),
            "expires": expires,
        }
        self._put_record(RecordType.DELEGATE, device.hex(), record)

    def revoke_key(self, device: bytes, last_seq: int, reason: str = "") -> None:
        """As a site root: accept `device`'s feed only up to `last_seq` (never "after time T": clocks lie).

        The record pins the kept prefix by the hash of the device's envelope `last_seq`, so no other
        history the device signs can displace it: this site must hold that envelope.
        """
        self._require(None)
        last_seq = int(last_seq)
        if not 0 <= last_seq <= MAX_INT:
            raise RecordError(f"last_seq must be an integer in [0, {MAX_INT}], not {last_seq}")
        record = {"v": 1, "hlc": self.now(), "last_seq": last_seq, "reason": reason}
        if last_seq > 0:
            with self._lock:
                pinned = self._hash_at(device, last_seq)
                if pinned is None:
                    held = self._feeds[device].seq if device in self._feeds else 0
                    raise RecordError(
                        f"this site does not hold envelope {last_seq} of key {key_id(device)} (it holds up to {held}); "
                        "sync first, or revoke at a seq held here"
                    )
            record["last_hash"] = pinned.hex()
        self._put_record(RecordType.KEY_REVOKE, device.hex(), record)

    def revoke(self, skill_id: str, reason: str = "") -> None:
        """Turn a skill off fleet-wide, for every site that trusts this writer to revoke. Irreversible."""
        identity = self._require(Role.REVOKE)
        key = make_key(RecordType.REVOKE, skill_id)
        with self._lock:
            own = self._feeds.get(identity.public_key)
            if (own is not None and own.get(key) is not None) or (
                self._pending and key in self._pending
            ):
                return  # already revoked by this writer; revocations are never rewritten
            self._put_record(
                RecordType.REVOKE, skill_id, {"v": 1, "hlc": self.now(), "reason": reason}
            )

    def checkpoint(self) -> Envelope:
        """Sign the merged state of this site's own feed, so newcomers need not replay its history."""
        identity = self._require_identity()
        with self._lock:
            feed = self._feeds.get(identity.public_key)
            if feed is None or feed.seq == 0:
                raise StoreError("nothing to checkpoint: this site has not written anything yet")
            env = seal(identity, Kind.CHECKPOINT, feed.seq, feed.head, feed.hlc, feed.state())
            if len(env.raw) > self.limits.max_checkpoint_bytes:
                raise StoreError(
                    f"this feed's checkpoint would be {len(env.raw)} bytes, over the "
                    f"{self.limits.max_checkpoint_bytes}-byte limit peers accept: they would refuse it"
                )
            with self._store.transaction():
                self._store.put_checkpoint(identity.public_key, env.seq, env.raw)
            return env

    def _require_identity(self) -> Identity:
        if self.identity is None:
            raise NotAuthorizedError("this knowledge base was opened read-only (no identity)")
        return self.identity

    def set_policy(self, policy: TrustPolicy) -> None:
        """Replace the trust and activation policy; views are recomputed under it."""
        with self._lock:
            self.policy = self._load_policy(policy)
            self._clock.max_offset_ms = policy.max_clock_offset_ms
            self._refresh_trust()

    # --- activation ---------------------------------------------------------------------------------
    def is_revoked(self, skill_id: str) -> bool:
        with self._lock:
            return bool(self._views.revocations(skill_id))

    def activation(self, skill_id: str) -> Activation:
        """Whether `skill_id` is active here, derived from revocations, certificates and the policy."""
        with self._lock:
            policy = self.policy.activation
            reasons: list[str] = []
            if self._views.skill(skill_id) is None:
                return Activation(skill_id, False, ("unknown skill",))
            if self._views.withdrawn(skill_id):
                reasons.append("withdrawn by its site")
            if self._views.revocations(skill_id):
                reasons.append("revoked")
            sites: set[bytes] = set()
            for cert_id, cert in self._views.certificates(skill_id):
                vouching = self._views.cert_sites(cert_id, bytes.fromhex(cert["validator"]))
                if policy.validators:
                    vouching &= policy.validators
                if not vouching:
                    continue
                lcb = wilson_lower_bound(cert["successes"], cert["branches"], policy.confidence)
                if (
                    cert["branches"] >= policy.min_branches
                    and lcb >= policy.min_lower_bound
                    and policy.required_randomization <= set(cert.get("randomized", ()))
                ):
                    sites |= vouching
            if len(sites) < policy.min_validators:
                reasons.append(
                    f"{len(sites)} of {policy.min_validators} required validator sites certify it"
                )
            qualifying = tuple(sorted(s.hex() for s in sites))
            return Activation(skill_id, not reasons, tuple(reasons) or ("active",), qualifying)

    def is_active(self, skill_id: str) -> bool:
        return self.activation(skill_id).active

    # --- replication surface ------------------------------------------------------------------------
    def heads(self) -> dict[str, Head]:
        """Per author: the newest seq and envelope hash held here (what a peer compares against)."""
        with self._lock:
            heads = {
                a.hex(): Head(f.seq, f.head.hex()) for a, f in sorted(self._feeds.items()) if f.seq
            }
            for author, fork in self._banned.items():
                head = heads.get(author.hex(), Head(0, ZERO_HASH.hex()))
                heads[author.hex()] = Head(head.seq, head.hash, equivocated_at=fork)
            return dict(sorted(heads.items()))

    def envelopes_since(
        self, heads: Mapping[str, Head | int], limit: int = 1000, *, exclude: Container[bytes] = ()
    ) -> list[bytes]:
        """Envelopes a peer with `heads` lacks, at most `limit`, trust roots first, each feed in order.

        A peer that has nothing of a feed, or is behind the earliest envelope kept here, gets the feed's
        checkpoint first. Call again with the peer's new heads until the answer is empty. Feeds of the
        authors in `exclude` are left out (read rules: see `authors_writing`).

        Heads carry hashes: where the peer's head names a seq held here under another hash, the feed has
        forked, and the peer gets this site's envelope at that seq first, so it finds the fork too.
        """
        with self._lock:
            out: list[bytes] = []
            roots = set(self._authority.roots())
            for author in sorted(
                set(self._feeds) | set(self._banned), key=lambda a: (a not in roots, a)
            ):
                if len(out) >= limit:
                    break
                if author in exclude:
                    continue
                their = heads.get(author.hex(), 0)
                their_seq = their.seq if isinstance(their, Head) else int(their)
                knows = isinstance(their, Head) and their.equivocated_at is not None
                if author in self._banned and (not knows or their_seq >= self._banned[author]):
                    out += self._evidence(
                        author
                    )  # the peer does not know of this fork (it holds past it)
                feed = self._feeds.get(author)
                if feed is None:
                    continue
                if isinstance(their, Head) and their.hash and 0 < their_seq <= feed.seq:
                    ours = self._hash_at(author, their_seq)
                    if ours is not None and ours.hex() != their.hash:
                        out.append(
                            self._store.envelope(author, their_seq)
                            or self._store.checkpoint(author)[1]
                        )  # type: ignore[index]
                if their_seq >= feed.seq:
                    continue
                checkpoint = self._store.checkpoint(author)
                has_next = self._store.envelope_hash(author, their_seq + 1) is not None
                if (
                    checkpoint is not None
                    and their_seq < checkpoint[0]
                    and (their_seq == 0 or not has_next)
                ):
                    out.append(checkpoint[1])
                    their_seq = checkpoint[0]
                out += self._store.envelopes(author, after=their_seq, limit=limit - len(out))
            return out[: max(limit, 0)]

    def learn_site_heads(self, heads: Mapping[str, Head | int]) -> None:
        """As a device (`device_of` in the policy): take these heads, from the device's own site, as the
        word on how far its own feed goes. A device's empty store writes only after this (a re-flashed robot
        would fork its feed otherwise), and no device writes while its site holds more of its feed than its
        store, or another history of it. Only the site's heads count: any other peer could claim a head.
        The federation client calls this when it syncs with the device's site."""
        if self.identity is None or self.policy.device_of is None:
            return
        with self._lock:
            their = heads.get(self.identity.public_key_hex, 0)
            seq = their.seq if isinstance(their, Head) else int(their)
            own = self._feeds.get(self.identity.public_key)
            fork = None
            if isinstance(their, Head) and their.hash and 0 < seq <= (own.seq if own else 0):
                ours = self._hash_at(self.identity.public_key, seq)
                fork = seq if ours is not None and ours.hex() != their.hash else None
            self._note_own_feed(floor=seq, fork=fork)
            if not self._own_known and not self._store.readonly:
                with self._store.transaction():
                    self._store.set_meta(_OWN_KNOWN, b"1")
                self._own_known = True

    def _note_own_feed(self, *, floor: int = 0, fork: int | None = None) -> None:
        """Remember, durably, that our own feed goes at least to `floor` elsewhere, or forked at `fork`."""
        with self._lock:
            changed = floor > self._own_floor or (fork is not None and self._own_fork is None)
            self._own_floor = max(self._own_floor, floor)
            self._own_fork = self._own_fork if fork is None or self._own_fork is not None else fork
            if changed and not self._store.readonly:
                with self._store.transaction():
                    self._store.set_meta(_OWN_FLOOR, str(self._own_floor).encode())
                    if self._own_fork is not None:
                        self._store.set_meta(_OWN_FORK, str(self._own_fork).encode())

    def authors_writing(self, map_names: Iterable[str]) -> set[bytes]:
        """Writers whose feeds hold a cell of any of these maps: their envelopes carry that map."""
        names = set(map_names)
        with self._lock:
            return {author for author, feed in self._feeds.items() if feed.map_names & names}

    def roles_of(self, key: bytes) -> frozenset[Role] | None:
        """The roles this site grants `key` (a site root's or a delegated device's), or None if unknown."""
        with self._lock:
            return self._authority.roles(key)

    def can_read(self, key: bytes) -> bool:
        """Whether `key` holds a current grant here: a trusted root, or a device delegated at least one role
        whose delegation is neither revoked nor expired. Reading (heads, envelopes, blobs) needs one."""
        with self._lock:
            return any(
                g.roles
                and (g.root or (g.last_seq is None and g.admits(0, self._clock.last) is None))
                for g in self._authority.grants(key)
            )

    def _evidence(self, author: bytes) -> list[bytes]:
        return [
            raw
            for a, _s, first, second in self._store.equivocations()
            if a == author
            for raw in (first, second)
        ]

    def ingest(self, envelopes: Iterable[bytes]) -> IngestReport:
        """Check and apply envelopes from peers; durable when this returns. Never raises on bad input.

        Each envelope is accepted, a duplicate, or rejected with a reason (see `Rejection.reason`).
        Checks, in the order docs/PROTOCOL.md lists them: size, structure, equivocating author, a seq
        already held (duplicate, fork, checkpoint against the history held), grants and pins, continuity,
        signature, chain, clock, the Yjs update read as yrs reads it, client ids, feed structure, record
        limits and times, immutable records. Only then does a byte reach pycrdt.
        """
        envelopes = list(envelopes)
        with self._lock:
            self._require_identity()
            try:
                return Ingestion(self, careful=False).run(envelopes)
            except UpdateRejected:
                # A signed update that pycrdt refuses: redo the batch one update at a time to isolate it.
                return Ingestion(self, careful=True).run(envelopes)

    def equivocations(self) -> list[tuple[str, int]]:
        """(author, seq) of every equivocation detected here; those writers' data stops at seq - 1."""
        with self._lock:
            return [(a.hex(), s) for a, s, _f, _b in self._store.equivocations()]

    # --- introspection ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Every view as plain data: equal snapshots mean equal knowledge (what convergence tests compare)."""
        with self._lock:
            views = self._views
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
                "equivocators": sorted(a.hex() for a in self._banned),
            }

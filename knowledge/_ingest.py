"""One `ingest` call: check every envelope, store the good ones, fold them into the feeds and views.

Checks run envelope by envelope and cost what they must (verification dominates); every check, "does
not rewrite an immutable record" included, reads the envelope's own bytes, so outcomes do not depend
on how envelopes are batched. Each update is applied in its own Doc transaction, so the site knows
which envelope last wrote each key (records are judged by that envelope's grant); the views fold one
author's consecutive envelopes once. If pycrdt refuses a signed update anyway, the whole call is
redone in careful mode, rolling back and isolating the update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import repeat

from ._checking import CheckpointCheck
from ._clock import wall_ms
from ._envelope import Envelope, Kind, decode
from ._errors import EnvelopeError, StoreError, reraise_interrupts
from ._feed import Feed
from ._hold import due_ms
from ._models import Held, IngestReport, RecordIssue, Rejection
from ._records import TRUST_PREFIXES
from ._recordtext import record_refusal
from ._replica import Replica, note_written
from ._verify import Verdicts
from ._yjs import MalformedUpdate, parse_update

log = logging.getLogger("knowledge")

# Rejections that an envelope later in the same batch can cure (its predecessor, its delegation).
RETRYABLE = frozenset({"gap", "unknown_writer"})


class UpdateRejected(Exception):
    """pycrdt refused a batch of signed updates; the caller retries in careful mode."""


class Ingestion:
    def __init__(self, replica: Replica, *, careful: bool, releasing: bool = False) -> None:
        self.replica = replica
        self.careful = careful
        self.releasing = releasing  # these are held envelopes fallen due: check them afresh
        self.report = IngestReport()
        self.trust_dirty = False
        self.touched: set[bytes] = set()
        # feeds a checkpoint jumped ahead of: rebuilt from the store at the end
        self.restamp: set[bytes] = set()
        # The current run of one author's envelopes: their updates are queued as they pass the
        # checks, applied in one transaction, and the keys they changed folded into the views once,
        # when it ends.
        self.current: Feed | None = None
        self.current_changes: dict[str, str | None] = {}
        self.rows: list[tuple[bytes, int, bytes, bytes]] = []  # accepted envelopes not yet inserted
        self.verdicts = Verdicts(())

    def run(self, envelopes: list[bytes]) -> IngestReport:
        replica, report = self.replica, self.report
        decoded: list[tuple[int, Envelope]] = []
        for index, raw in enumerate(envelopes):
            try:
                limit = (
                    replica.limits.max_checkpoint_bytes
                    if _is_checkpoint(raw)
                    else replica.limits.max_envelope_bytes
                )
                decoded.append((index, decode(raw, max_bytes=limit)))
            except EnvelopeError as exc:
                report.rejected.append(Rejection(index, exc.reason, exc.detail))
        # What a rolled-back call must restore besides the feeds: what it learnt of forks, in
        # memory.
        before = replica.fork_memory()
        roots = set(replica.authority.roots())  # first: their delegations admit devices after them
        decoded.sort(
            key=lambda item: (
                item[1].author not in roots,
                item[1].author,
                item[1].seq,
                -item[1].kind,
            )
        )
        self.verdicts = Verdicts([e for _i, e in decoded if self._will_verify(e)])
        try:
            with replica.store.transaction():
                pending = decoded
                while pending:
                    retry = [(i, e, r) for i, e in pending if (r := self._one(i, e)) is not None]
                    self._end_run()
                    cured = [(i, e) for i, e, r in retry if r.reason in RETRYABLE]
                    if len(retry) == len(pending) or not cured:
                        report.rejected += [r for *_x, r in retry]
                        break
                    report.rejected += [r for *_x, r in retry if r.reason not in RETRYABLE]
                    pending = cured
                for author in self.restamp:  # as a reopen sees them: keys the checkpoint stamped
                    replica.replay(replica.feeds[author])
                    replica.views.reset_author(author, replica.feeds[author].items())
                if self.trust_dirty:
                    replica.refresh_trust()
        except BaseException as exc:
            replica.views.loaded.clear()
            replica.views.plain.clear()
            if isinstance(exc, StoreError):  # the disk, not a bug: its message says it all
                log.error("ingest failed (%s); restoring the feeds it touched from the store", exc)
            elif not isinstance(exc, UpdateRejected):
                log.exception("ingest failed; restoring the feeds it touched from the store")
            replica.restore_fork_memory(before)
            replica.hold.reload()
            for author in self.touched:  # the transaction rolled back: so must the in-memory feeds
                if author in replica.feeds:
                    replica.replay(replica.feeds[author])
            replica.refresh_trust()
            raise
        replica.views.maps.prepared.clear()  # tiles checked here that the views did not show
        replica.views.loaded.clear()  # likewise records
        replica.views.plain.clear()
        report.rejected.sort(key=lambda r: r.index)
        return report

    def _will_verify(self, env: Envelope) -> bool:
        """Whether `_one` will verify `env` unless something before it in the call changes that:
        an update of a writer known here, banned for nothing, past what this site holds."""
        replica, author = self.replica, env.author
        feed = replica.feeds.get(author)
        return (
            env.kind is Kind.UPDATE
            and env.seq > (feed.seq if feed else 0)
            and author not in replica.banned
            and replica.authority.knows(author)
        )

    def _apply(self, feed: Feed, env: Envelope) -> None:
        try:
            changes = feed.apply_queued()
        except BaseException as exc:
            reraise_interrupts(exc)  # pycrdt raises ValueError, or a Rust panic (a BaseException)
            raise UpdateRejected(str(exc)) from exc
        refusal = self.replica.views.maps.admit(feed.author, changes)
        if refusal is not None:  # careful mode refuses this envelope alone
            raise UpdateRejected(f"{refusal[0]}: {refusal[1]}")
        self._note(feed, env, changes)

    def _undo(self, feed: Feed) -> None:
        """Take the update just applied out of `feed` again: rebuilt from the store, where what
        this run changed before it stays (a delegation may need a trust refresh)."""
        self._end_run()
        self.replica.replay(feed)
        self.replica.views.reset_author(feed.author, feed.items())
        self.current, self.current_changes = None, {}

    def _note(self, feed: Feed, env: Envelope, changes: dict[str, str | None]) -> None:
        note_written(self.replica.written.setdefault(feed.author, {}), changes, env)
        self.current_changes.update(changes)

    def _store_rows(self) -> None:
        if self.rows:
            self.replica.store.add_envelopes(self.rows)
            self.rows = []

    def _end_run(self) -> None:
        self._store_rows()
        feed, changes = self.current, self.current_changes
        self.current, self.current_changes = None, {}
        if feed is not None:
            self.report.record_issues += [
                RecordIssue(feed.author.hex(), k, "misplaced_record: wrong root map")
                for k in feed.misplaced
            ]
            feed.misplaced.clear()
            if changes:
                self._fold(feed, changes)

    def _fold(self, feed: Feed, changes: dict[str, str | None]) -> None:
        replica = self.replica
        replica.views.update(feed.author, changes, self.report.record_issues)
        if replica.authority.is_root(feed.author) and any(
            map(str.startswith, changes, repeat(TRUST_PREFIXES))
        ):
            # a delegation changed: later envelopes in this batch are judged by the new grants
            self._regrant()

    def _regrant(self) -> None:
        self.replica.regrant()
        self.trust_dirty = True

    def _one(self, index: int, env: Envelope) -> Rejection | None:
        replica, report, author = self.replica, self.report, env.author

        def reject(reason: str, detail: str) -> Rejection:
            return Rejection(index, reason, detail, author.hex(), env.seq)

        if self.current is not None and self.current.author != author:
            self._end_run()
        pins = replica.authority.pins(author)
        if (
            author in replica.banned
            and replica.authority.admits(author, env.seq, env.hlc) == "equivocating_author"
        ):
            return reject(
                "equivocating_author",
                f"writer equivocated at seq {replica.banned[author]}; refused",
            )
        feed = replica.feeds.get(author)
        have = feed.seq if feed else 0
        if env.seq <= have:
            self._store_rows()  # the lookup below must see this batch's envelopes too
            stored = replica.hash_at(author, env.seq)
            check = replica.checks.next_for(env, stored)
            if check is not None:
                return self._check_below(env, check, reject)
            if not env.is_checkpoint and stored == env.hash:
                report.duplicates += 1  # the very bytes held here: no need to verify again
                return None
            if not self.verdicts.valid(env):
                return reject("bad_signature", "signature does not verify for this author")
            if stored is None:
                report.duplicates += 1  # covered by a checkpoint held here
                return None
            if env.is_checkpoint:
                if env.hash in replica.consistent_checkpoints:
                    report.duplicates += (
                        1  # this very checkpoint was checked against the history here
                    )
                    return None
                conflict = replica.checks.conflict_with_history(env, stored)
                if conflict is None:
                    replica.consistent_checkpoints.add(env.hash)
                    report.duplicates += 1
                    return None
                self._end_run()
                self._equivocation(env, pins, report=False)
                return reject("checkpoint_conflict", conflict)
            self._end_run()
            self._equivocation(env, pins)
            return None
        # Cheap refusals first: nothing is verified or stored for them.
        refusal = replica.authority.admits(
            author,
            env.seq,
            env.hlc,
            env.prev if env.is_checkpoint else env.hash,
            checkpoint=env.is_checkpoint,
        )
        if refusal == "unknown_writer":
            return reject(
                refusal, f"key {author.hex()[:16]}… is neither a trusted root nor delegated by one"
            )
        if refusal is not None:
            pins_note = " (a key revocation takes the kept history only as the envelopes it pins)"
            return reject(
                refusal,
                "no grant the writer holds covers "
                f"{'checkpoint' if env.is_checkpoint else 'envelope'} "
                f"{env.seq}{pins_note if refusal == 'revoked_writer' else ''}",
            )
        for seq, pinned in pins:
            if (
                env.seq == seq
                and env.hash == pinned
                and feed is not None
                and feed.seq == seq - 1  # it follows what is held
                and env.prev != feed.head
                and self.verdicts.valid(env)
            ):
                # the pinned envelope does not follow what is held: that is another history
                self._drop_feed(feed)
                return reject(
                    "broken_chain",
                    f"the history held here is not the one pinned at {seq}: dropped, "
                    "the pinned one is taken when it comes",
                )
        waiting = replica.hold.find(author, env.seq)
        if waiting is not None and waiting.hash == env.hash and not self.releasing:
            report.held.append(Held(index, author.hex(), env.seq, due_ms(env.hlc, replica.clock)))
            return None  # held here already
        if env.kind is Kind.UPDATE and env.seq > have + 1:
            if author == replica.own_key and self.verdicts.valid(
                env
            ):  # proof that our key wrote beyond this store
                replica.own.note(floor=env.seq)
            tip = replica.hold.tip(author)
            if tip is not None and env.seq == tip[0] + 1 and env.prev == tip[1].hash:
                return self._hold(index, env, tip[1].hlc, reject)  # behind a held envelope
            return reject("gap", f"seq {env.seq} but this site holds only up to {have}")
        if not self.verdicts.valid(env):
            return reject("bad_signature", "signature does not verify for this author")
        feed = feed or Feed(author)
        if env.kind is Kind.UPDATE and env.prev != feed.head:
            return reject(
                "broken_chain", f"prev does not match the hash of envelope {env.seq - 1} held here"
            )
        if env.hlc <= feed.hlc:
            return reject("clock_regressed", "timestamp is not after the author's previous one")
        if replica.clock.due_in(env.hlc) > 0:
            return self._hold(index, env, feed.hlc, reject)
        try:
            parsed = parse_update(env.update)
        except MalformedUpdate as exc:
            return reject("malformed_update", f"not a Yjs v1 update: {exc}")
        foreign = parsed.clients() - {feed.client_id}
        if foreign:
            return reject(
                "foreign_client_id",
                f"update touches client ids {sorted(foreign)} not owned by its author",
            )
        odd = feed.foreign_structure(parsed)
        if odd is not None:
            return reject("malformed_update", odd)
        bad_record = record_refusal(parsed, env.hlc, replica.views.loaded, replica.views.plain)
        if bad_record is not None:
            return reject(*bad_record)
        if env.is_checkpoint and have:
            lost = feed.lacks_held(env.update)
            if lost is not None:  # signed envelopes and a signed checkpoint that disagree: a fork
                self._end_run()
                first = replica.store.envelope(author, have) or replica.store.checkpoint(author)[1]  # type: ignore[index]
                self._record_fork(author, env.seq, first, env.raw)  # the fork lies ahead: no cut
                return reject("checkpoint_conflict", lost)
        rewrite = feed.check(parsed)
        if rewrite is not None:
            return reject("modifies_immutable_record", rewrite)
        self.touched.add(author)
        if self.current is not feed:
            self._end_run()
            self.current = feed
        if self.careful:
            try:
                changes = feed.apply(env.update)
            except BaseException as exc:
                reraise_interrupts(exc)  # pycrdt raises ValueError, or a Rust panic
                self._undo(feed)
                return reject("malformed_update", f"pycrdt refused the update: {exc}")
            refused = self.replica.views.maps.admit(feed.author, changes)
            if refused is not None:  # a tile record every receiver refuses (see _tiles)
                self._undo(feed)
                return reject(*refused)
            self._note(feed, env, changes)
        else:
            feed.queue(env.update)
            self._apply(feed, env)
        replica.clock.advance(env.hlc)
        if env.is_checkpoint:
            replica.store.put_checkpoint(author, env.seq, env.raw)
            feed.seq, feed.head, feed.hlc = env.seq, env.prev, env.hlc
            if have:
                self.restamp.add(author)
        else:
            self.rows.append((author, env.seq, env.hash, env.raw))
            feed.seq, feed.head, feed.hlc = env.seq, env.hash, env.hlc
        replica.feeds[author] = feed
        if author == replica.own_key:
            replica.own.arrived()  # this store was behind its own feed: see OwnFeed.arrived
        report.accepted.append((author.hex(), env.seq))
        if any(seq == env.seq for seq, _pinned in pins):
            self.trust_dirty = (
                True  # an envelope at a pinned seq may void a pin that names another one
            )
        return None

    def _hold(
        self, index: int, env: Envelope, after: int, reject: Callable[[str, str], Rejection]
    ) -> Rejection | None:
        """Hold `env`, stamped ahead of our clock by more than the accepted offset, until it is due
        (see `_hold`); or refuse it: too far ahead, a checkpoint, not after the envelope it
        follows, another envelope held at its seq, or the hold is full."""
        replica = self.replica
        if not self.verdicts.valid(env):
            return reject("bad_signature", "signature does not verify for this author")
        if env.hlc <= after:
            return reject("clock_regressed", "timestamp is not after the author's previous one")
        ahead = wall_ms(env.hlc) - replica.clock.physical()
        if env.is_checkpoint or ahead > replica.clock.hold_horizon_ms:
            return reject(
                "clock_skew",
                f"timestamp {wall_ms(env.hlc)} ms is {ahead} ms ahead of this clock (accepted "
                f"offset {replica.clock.max_offset_ms} ms; "
                + (
                    "checkpoints are not held"
                    if env.is_checkpoint
                    else f"held up to {replica.clock.hold_horizon_ms} ms ahead"
                )
                + "); check the sender's clock",
            )
        held = replica.hold.find(env.author, env.seq)
        due = due_ms(env.hlc, replica.clock)
        if held is not None and held.hash == env.hash:  # released, but our clock stepped back
            self.report.held.append(Held(index, env.author.hex(), env.seq, due))
            return None
        if held is not None:
            return reject(
                "hold_conflict",
                f"another envelope {env.seq} of this author is held here until it is due",
            )
        full = replica.hold.refusal(env)
        if full is not None:
            return reject("hold_full", full)
        replica.hold.add(env)
        self.report.held.append(Held(index, env.author.hex(), env.seq, due))
        log.info("holding envelope %d of %s until %d", env.seq, env.author.hex()[:16], due)
        return None

    def _check_below(
        self, env: Envelope, check: CheckpointCheck, reject: Callable[[str, str], Rejection]
    ) -> Rejection | None:
        """Replay `env` into the check of the checkpoint held here (see `_checking`); at the
        checkpoint's seq, store the envelope (the checkpoint is checked) or, if the state differs,
        keep both as evidence of a fork and cut the feed before it."""
        replica, author = self.replica, env.author
        if not self.verdicts.valid(env):
            return reject("bad_signature", "signature does not verify for this author")
        try:
            refused = check.take(env, record_refusal)
        except BaseException as exc:
            reraise_interrupts(exc)  # pycrdt raises ValueError, or a Rust panic (a BaseException)
            replica.checks.drop(author)
            return reject("malformed_update", f"pycrdt refused the update: {exc}")
        if refused is not None:
            return reject(*refused)
        self.report.verified += 1
        if not check.complete:
            return None
        checkpoint, differs = replica.checks.finish(author)
        if differs is None:
            self.rows.append((author, env.seq, env.hash, env.raw))  # the mark: checked for good
            self._store_rows()
            return None
        log.warning("checkpoint of %s at seq %d: %s", author.hex()[:16], env.seq, differs)
        self._end_run()
        self.report.equivocations.append((author.hex(), env.seq))
        self._record_fork(author, env.seq, env.raw, checkpoint.raw)
        if author != replica.own_key:  # our own feed is never cut: our writes stop instead
            self._cut(author, env.seq - 1)
        return None

    def _drop_feed(self, feed: Feed) -> None:
        self._end_run()
        self._cut(feed.author, 0)

    def _cut(self, author: bytes, keep: int) -> None:
        """Drop `author`'s envelopes after `keep` and rebuild its feed (grants may change with
        it)."""
        self.replica.store.delete_after(author, keep)
        self.replica.replay(self.replica.feeds[author])
        self.touched.add(author)
        self.trust_dirty = True

    def _equivocation(
        self, env: Envelope, pins: list[tuple[int, bytes]], *, report: bool = True
    ) -> None:
        """Two valid envelopes, same author and seq: keep both, cut the feed before the fork, refuse
        the author.

        A revoked writer whose kept prefix is pinned is not cut where this site holds the pinned
        history (the fork cannot displace it), nor refused: what it still lacks of that history may
        arrive.
        """
        replica, author = self.replica, env.author
        held = replica.store.checkpoint(author)
        first = replica.store.envelope(author, env.seq) or (
            held[1] if held and held[0] == env.seq else None
        )
        assert first is not None
        log.warning("equivocation by %s at seq %d", author.hex()[:16], env.seq)
        if report:
            self.report.equivocations.append((author.hex(), env.seq))
        self._record_fork(author, env.seq, first, env.raw)
        if author == replica.own_key:
            return  # our own feed is never cut: our writes stop instead
        if pins and all(
            replica.hash_at(author, seq) == pinned for seq, pinned in pins if seq >= env.seq
        ):  # the pinned history is held here: the other branch is evidence, nothing more
            feed = replica.feeds[author]
            feed.map_names |= replica.evidence_maps(feed)
            return
        self._cut(author, env.seq - 1)

    def _record_fork(self, author: bytes, seq: int, first: bytes, second: bytes) -> None:
        """Keep two signed, conflicting pieces of `author`'s feed as evidence; refuse the author
        from `seq` on (judging later envelopes in this batch knowing of it); stop our own writes if
        it is our key."""
        replica = self.replica
        replica.store.add_equivocation(author, seq, first, second)
        replica.banned[author] = min(replica.banned.get(author, seq), seq)
        if author == replica.own_key:
            replica.own.note(fork=seq)
        self._regrant()


def _is_checkpoint(raw: object) -> bool:
    return (
        isinstance(raw, (bytes, bytearray, memoryview))
        and len(raw) > 1
        and raw[1] == Kind.CHECKPOINT
    )

"""Checkpoints checked against the envelopes they summarize.

A checkpoint at a seq whose envelopes are held here is compared with them at once
(`Checks.conflict_with_history`). A site that took a writer's feed from its checkpoint at seq n
holds no envelopes below n, so nothing there shows that the checkpoint's state is the one the
writer's envelopes 1..n reach: a writer could sign a checkpoint that names its real head n over
another state. Such a checkpoint is **unchecked** (the envelope at its seq is not held). A sync
names it to the peer; a peer holding the envelopes 1..n sends them (`Checks.history`), a page at a
time from where the check stands, and ingest replays them here in a document of their own, apart
from the feed (`CheckpointCheck`): each signed by the author, chained by hash from seq 1, read as
strictly as any envelope. Envelope n is the one the checkpoint names (ingest sees to that), and the
state reached must equal the checkpoint's, byte for byte as Yjs encodes it. Then envelope n is
stored, which marks the checkpoint checked for good (it is never named again); a state that differs
is the writer signing two histories, kept as evidence like any fork.

Progress is kept in memory only (a restart starts a check over); a check costs one document the
size of the feed, and what a peer sends for it is bounded by the page.
"""

from __future__ import annotations

from collections.abc import Callable

from ._envelope import Envelope, Kind, decode
from ._errors import reraise_interrupts
from ._feed import Feed
from ._store import Store
from ._yjs import MalformedUpdate, ParsedUpdate, parse_update

RecordRefusal = Callable[[ParsedUpdate, int], "tuple[str, str] | None"]


class CheckpointCheck:
    """The check of one author's checkpoint at `seq` (naming envelope hash `prev`) under way: the
    envelopes 1..`feed.seq` replayed so far."""

    def __init__(self, author: bytes, seq: int, prev: bytes) -> None:
        self.seq, self.prev = seq, prev
        self.feed = Feed(author)

    @property
    def complete(self) -> bool:
        return self.feed.seq == self.seq

    def take(self, env: Envelope, record_refusal: RecordRefusal) -> tuple[str, str] | None:
        """Replay the next envelope (its signature verified) into the check; (reason, detail) if it
        is refused, and then the check is as it was. pycrdt may still raise (a Rust panic is a
        BaseException): the caller then drops the check."""
        feed = self.feed
        if env.prev != feed.head:
            return (
                "broken_chain",
                f"envelope {env.seq} does not follow the envelopes 1..{feed.seq} checked so far "
                f"below the checkpoint at {self.seq}",
            )
        if env.hlc <= feed.hlc:
            return "clock_regressed", "timestamp is not after the author's previous one"
        try:
            parsed = parse_update(env.update)
        except MalformedUpdate as exc:
            return "malformed_update", f"not a Yjs v1 update: {exc}"
        foreign = parsed.clients() - {feed.client_id}
        if foreign:
            return (
                "foreign_client_id",
                f"update touches client ids {sorted(foreign)} not owned by its author",
            )
        odd = feed.foreign_structure(parsed)
        if odd is not None:
            return "malformed_update", odd
        refused = record_refusal(parsed, env.hlc)
        if refused is not None:
            return refused
        rewrite = feed.check(parsed)  # the last check: it notes the update's immutable records
        if rewrite is not None:
            return "modifies_immutable_record", rewrite
        feed.apply(env.update)
        feed.seq, feed.head, feed.hlc = env.seq, env.hash, env.hlc
        return None


class Checks:
    """One site's checkpoint checks: against the history held, and those under way, by author."""

    def __init__(self, store: Store, max_envelope_bytes: int, max_checkpoint_bytes: int) -> None:
        self.store = store
        self.max_envelope_bytes, self.max_checkpoint_bytes = (
            max_envelope_bytes,
            max_checkpoint_bytes,
        )
        self.under_way: dict[bytes, CheckpointCheck] = {}

    def unchecked(self) -> dict[bytes, tuple[int, int]]:
        """Per author whose checkpoint held here is unchecked: (its seq, envelopes checked)."""
        out = {}
        for author, seq, prev in sorted(self.store.unchecked_checkpoints()):
            check = self.under_way.get(author)
            mine = check is not None and (check.seq, check.prev) == (seq, prev)
            out[author] = (seq, check.feed.seq if check is not None and mine else 0)
        return out

    def history(
        self, author: bytes, seq: int, after: int, limit: int, max_bytes: int | None = None
    ) -> list[bytes]:
        """For a peer's check of `author`'s checkpoint at `seq`: the envelopes after `after` up to
        it, at most `limit` (and about `max_bytes`: see `Store.envelopes`), if this site holds them
        in an unbroken run from 1 (else none)."""
        if not 0 <= after < seq or limit < 1 or self.store.envelope_hash(author, 1) is None:
            return []
        rows = self.store.envelopes(
            author, after=after, limit=min(seq - after, limit), max_bytes=max_bytes
        )
        for count, raw in enumerate(rows):  # a feed may have jumped a checkpoint ahead: a hole
            if decode(raw, max_bytes=self.max_envelope_bytes).seq != after + count + 1:
                return rows[:count]
        if after + len(rows) == seq - 1 < after + limit:  # the feed was cut at a fork at seq?
            rows += [
                raw  # its envelope there, kept as evidence: what a site forked at seq checks with
                for a, at, *pair in self.store.equivocations()
                if a == author and at == seq
                for raw in pair
                if raw[1] == Kind.UPDATE
            ]
        return rows

    def next_for(self, env: Envelope, stored: bytes | None) -> CheckpointCheck | None:
        """The check that `env`, at a seq this site holds (`stored`: the hash held there, if any),
        is the next envelope for, started at seq 1; None if there is none."""
        author = env.author
        if env.is_checkpoint or stored not in (None, env.hash):
            return None  # another envelope at a seq held here: the fork rules judge it
        check = self.under_way.get(author)
        if check is None and env.seq != 1:
            return None
        head = self.store.checkpoint_head(author)
        if head is None or self.store.envelope_hash(author, head[0]) is not None:
            self.under_way.pop(author, None)  # no checkpoint here, or one checked already
            return None
        if check is None or (check.seq, check.prev) != head:  # none yet, or for a replaced one
            check = self.under_way[author] = CheckpointCheck(author, *head)
        return check if env.seq == check.feed.seq + 1 else None

    def finish(self, author: bytes) -> tuple[Envelope, str | None]:
        """End `author`'s complete check: the checkpoint it checked, and why its state is not the
        one the envelopes reach (None: it is)."""
        check = self.under_way.pop(author)
        held = self.store.checkpoint(author)
        assert held is not None and held[0] == check.seq
        checkpoint = decode(held[1], max_bytes=self.max_checkpoint_bytes)
        return checkpoint, _differs(checkpoint, check.feed, f"the envelopes 1..{check.seq}")

    def conflict_with_history(self, env: Envelope, stored: bytes) -> str | None:
        """Why a checkpoint at a seq held here (`stored`: the hash held there) is not the author's
        own history, or None if it is.

        Its `prev` must name the envelope held at its seq, and its state must be exactly the state
        the envelopes held here reach at that seq (Yjs encodes equal documents to equal bytes).
        """
        if stored != env.prev:
            return f"checkpoint names another envelope {env.seq} than the one held here"
        author, store = env.author, self.store
        held, after = Feed(author), 0
        checkpoint = store.checkpoint(author)
        if checkpoint is not None:
            if checkpoint[0] > env.seq:
                return None  # this site holds no history below its own checkpoint to compare with
            held.replay(decode(checkpoint[1], max_bytes=self.max_checkpoint_bytes).update)
            after = checkpoint[0]
        for raw in store.envelopes(author, after=after, limit=env.seq - after):
            held.replay(decode(raw, max_bytes=self.max_envelope_bytes).update)
        held.apply_queued()
        claimed = Feed(author)
        try:
            parsed = parse_update(env.update)  # as strictly as any envelope, before pycrdt sees it
        except MalformedUpdate as exc:
            return f"checkpoint's update is unreadable: {exc}"
        odd = claimed.foreign_structure(parsed)
        if parsed.clients() - {claimed.client_id} or odd is not None:
            return (
                "checkpoint's update is no state of this author's feed: "
                f"{odd or 'foreign client ids'}"
            )
        return _differs(env, held, f"the envelopes 1..{env.seq} held here")

    def drop(self, author: bytes) -> None:
        self.under_way.pop(author, None)

    def clear(self) -> None:
        self.under_way.clear()


def _differs(checkpoint: Envelope, held: Feed, what: str) -> str | None:
    claimed = Feed(checkpoint.author)
    try:
        claimed.apply(checkpoint.update)
    except BaseException as exc:
        reraise_interrupts(exc)  # pycrdt raises ValueError, or a Rust panic (a BaseException)
        return f"checkpoint's update is unreadable: {exc}"
    if claimed.state() != held.state():
        return f"checkpoint's state differs from {what}"
    return None

"""A page of envelopes a peer lacks: what `KnowledgeBase.envelopes_since` answers a pull with,
bounded by a count and by bytes (a page of a thousand map-tile envelopes would be near a GiB)."""

from __future__ import annotations

from collections.abc import Container, Mapping

from ._models import Head
from ._replica import Replica


def page_of_envelopes(
    replica: Replica,
    heads: Mapping[str, Head | int],
    limit: int,
    *,
    exclude: Container[bytes],
    unchecked: Mapping[str, tuple[int, int]],
    max_bytes: int | None,
) -> list[bytes]:
    """See `KnowledgeBase.envelopes_since`."""
    with replica.lock:
        out: list[bytes] = []
        budget = _Budget(max_bytes)
        roots = set(replica.authority.roots())
        for author in sorted(
            set(replica.feeds) | set(replica.banned),
            key=lambda a: (a not in roots, a),
        ):
            if len(out) >= limit or budget.spent(out):
                break
            if author in exclude:
                continue
            their = head_of(heads, author)
            their_seq, knows = their.seq, their.equivocated_at is not None
            if author in replica.banned and (not knows or their_seq >= replica.banned[author]):
                # the peer does not know of this fork (it holds past it)
                out += replica.evidence(author)
            feed = replica.feeds.get(author)
            if feed is None:
                continue
            if their.hash and 0 < their_seq <= feed.seq:
                ours = replica.hash_at(author, their_seq)
                if ours is not None and ours.hex() != their.hash:
                    held = replica.store.envelope(author, their_seq)
                    if held is None:  # hash_at found it in the checkpoint, which is at that seq
                        at_seq = replica.store.checkpoint(author)
                        assert at_seq is not None
                        held = at_seq[1]
                    out.append(held)
            if their_seq >= feed.seq:
                continue
            checkpoint = replica.store.checkpoint(author)
            has_next = replica.store.envelope_hash(author, their_seq + 1) is not None
            if (
                checkpoint is not None
                and their_seq < checkpoint[0]
                and (their_seq == 0 or not has_next)
            ):
                out.append(checkpoint[1])
                their_seq = checkpoint[0]
            out += replica.store.envelopes(
                author, after=their_seq, limit=limit - len(out), max_bytes=budget.left(out)
            )
        for name, (seq, after) in unchecked.items():
            author = bytes.fromhex(name)
            if budget.spent(out):
                break
            if len(out) < limit and author in replica.feeds and author not in exclude:
                out += replica.checks.history(
                    author, seq, after, limit - len(out), max_bytes=budget.left(out)
                )
        return list(dict.fromkeys(out))[: max(limit, 0)]  # evidence may be history too


def head_of(heads: Mapping[str, Head | int], author: bytes) -> Head:
    """A peer's head of `author`'s feed; a bare seq (callers may give one) names no hash."""
    their = heads.get(author.hex(), 0)
    return their if isinstance(their, Head) else Head(int(their), "")


class _Budget:
    """The bytes of a page of envelopes as it grows (`max_bytes` None: no limit)."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes, self.size, self.counted = max_bytes, 0, 0

    def left(self, page: list[bytes]) -> int | None:
        """Bytes left before `page` reaches the limit (None: no limit)."""
        if self.max_bytes is None:
            return None
        self.size += sum(map(len, page[self.counted :]))
        self.counted = len(page)
        return self.max_bytes - self.size

    def spent(self, page: list[bytes]) -> bool:
        left = self.left(page)
        return left is not None and left <= 0

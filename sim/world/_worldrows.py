"""The records of a world's store that its callers hold: checkpoints, and logs' extents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Checkpoint:
    """A shard's state on arrival at `tick`, before that tick's events: template, patch, state
    row."""

    tick: int
    template: str  # source hash
    model_hash: str
    patch: list
    state: bytes

    def to_json(self) -> dict:
        return {
            "tick": self.tick,
            "template": self.template,
            "model_hash": self.model_hash,
            "patch": self.patch,
            "state": self.state,
        }


# a tuple: its row and checksum are rewritten at every commit that advances it
class Log(NamedTuple):
    """A log's extent: its history runs from `base_tick` (a fork's tick, or where pruning left the
    canonical log) to `head`; events up to `anchor_seq` (tick `anchor_tick`) were pruned, and
    `anchor` is the checksum of their last segment, which the first remaining segment chains from;
    `tip` is the checksum of its newest segment (its anchor while it has none)."""

    shard: str
    branch: str
    base_tick: int
    head: int
    label: str
    anchor_seq: int = 0
    anchor_tick: int = 0
    anchor: str = ""
    tip: str = ""

    def with_head(self, head: int) -> Log:
        """This log with its head moved (what `_replace` does, at a fraction of its cost: a log's
        head and tip move at every commit)."""
        return Log(self.shard, self.branch, self.base_tick, head, *self[4:])

    def with_tip(self, tip: str) -> Log:
        return Log(*self[:8], tip)

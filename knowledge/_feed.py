"""One writer's feed as held at this site: its pycrdt Doc, its head, and what the last change touched."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from pycrdt import Doc, Map, MapEvent, TransactionEvent, get_state

from ._envelope import ZERO_HASH

ROOT_MAP = "records"


def client_id_for(author: bytes) -> int:
    """The Yjs client id of a writer: 53 bits of a hash of its key (Yjs ids must stay below 2**53)."""
    return int.from_bytes(hashlib.sha256(b"simnet-client-id\x00" + author).digest()[:8], "big") >> 11


def update_client_ids(update: bytes) -> set[int]:
    """The client ids whose structs a Yjs v1 update carries (from `pycrdt.get_state`)."""
    state = get_state(update)  # lib0 encoding: count, then (client, clock) var-uint pairs
    ids, pos = set(), 0
    count, pos = _read_var_uint(state, pos)
    for _ in range(count):
        client, pos = _read_var_uint(state, pos)
        _clock, pos = _read_var_uint(state, pos)
        ids.add(client)
    return ids


def _read_var_uint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


class Feed:
    """The replica of one author's Doc. Only the author's own Feed is ever written locally."""

    def __init__(self, author: bytes) -> None:
        self.author = author
        self.client_id = client_id_for(author)
        self.seq = 0
        self.head = ZERO_HASH
        self.hlc = 0
        self.checkpoint_seq = 0  # history up to here came from a checkpoint, not envelopes
        self._new_doc()

    def _new_doc(self) -> None:
        self.doc = Doc(client_id=self.client_id, allow_multithreading=True)
        self.records = self.doc.get(ROOT_MAP, type=Map)
        self._changes: dict[str, str | None] = {}
        self._staged: list[bytes] = []
        self._last_update: bytes | None = None
        self.records.observe(self._on_records)
        self.doc.observe(self._on_transaction)

    def reset(self) -> None:
        """Forget everything (before rebuilding the feed from the store)."""
        self.seq, self.head, self.hlc, self.checkpoint_seq = 0, ZERO_HASH, 0, 0
        self._new_doc()

    def _on_records(self, event: MapEvent) -> None:
        for key, change in event.keys.items():
            self._changes[key] = None if change["action"] == "delete" else change["newValue"]

    def _on_transaction(self, event: TransactionEvent) -> None:
        self._last_update = event.update

    def _drain(self) -> dict[str, str | None]:
        changes, self._changes = self._changes, {}
        return changes

    def apply(self, update: bytes) -> dict[str, str | None]:
        """Apply a verified update; return {key: new JSON text or None if deleted} for what changed."""
        self.doc.apply_update(update)
        return self._drain()

    def stage(self, update: bytes) -> None:
        """Queue a verified update; `flush` applies everything queued in one transaction."""
        self._staged.append(update)

    def flush(self) -> dict[str, str | None]:
        """Apply the queued updates in one Doc transaction (one change event, not one per update)."""
        staged, self._staged = self._staged, []
        with self.doc.transaction():
            for update in staged:
                self.doc.apply_update(update)
        return self._drain()

    def write(self, changes: dict[str, str | None]) -> tuple[bytes, dict[str, str | None]]:
        """Make `changes` in one local transaction; return its Yjs update and the keys it changed."""
        self._last_update = None
        with self.doc.transaction():
            for key, text in changes.items():
                if text is None:
                    self.records.pop(key, None)
                else:
                    self.records[key] = text
        update = self._last_update or b""
        return update, self._drain()

    def state(self) -> bytes:
        """The whole Doc as one update (the body of a checkpoint)."""
        return self.doc.get_update()

    def items(self) -> Iterator[tuple[str, str]]:
        yield from self.records.items()

    def get(self, key: str) -> str | None:
        return self.records.get(key)

"""A world's durable store: shards, entities, templates, event logs, checkpoints, branches and
migrations, as rows of its files (`_worldfiles`: SQLite, a redo file, transactions), every row under
a SHA-256 checksum. This process is the only writer, so what it has read or written stays true until
a rollback: the store remembers logs' extents, chains and recent events instead of reading them
again.

Each log (a shard's canonical one, or a branch's) is append-only, stored as segments (`_segments`):
the events one commit appended in one row under one checksum, which also covers the previous
segment's checksum. Ticks never decrease along a log. The log's own row holds its head (the tick its
engine has reached) and its tip (the checksum of its newest segment), under the row's checksum;
every commit that moves either rewrites the row (in the redo file, where that costs a few µs). So a
changed, dropped or reordered segment is found before anything is built from it, the newest one too.

Logging is on the path of every setpoint a twin receives, so an event costs little until its commit:
an appended event is encoded (orjson, sorted keys; nothing re-encodes it, the checksum covers the
stored text) and waits in memory, as do moved heads and new checkpoints, until the transaction takes
their rows.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

from knowledge import canonical_json, sha256_hex

from .._errors import CorruptCheckpointError, CorruptLogError, CorruptWorldError, WorldError
from . import _segments as segments
from ._segments import Event
from ._worldfiles import WorldFiles
from ._worldrows import Checkpoint, Log

CANONICAL = ""  # the branch key of a shard's canonical log
# Events per log at least kept in memory after this process appended them: the engine's next advance
# takes them from here; older ones are read back from their segments. Not more: each cached event is
# a dozen objects the garbage collector walks again and again (with 4096, a tenth of what logging
# costs).
_RECENT = 256
# Segments are kept in log order by their one index, (shard, branch, last_tick, first_seq): both
# grow along a log. (A rowid table: a segment of a few kB stays in one page, where a WITHOUT ROWID
# row would overflow.)
_LAST = "ORDER BY last_tick DESC, first_seq DESC LIMIT 1"
_SQLITE_INT_MAX = 2**63 - 1  # ticks and heads are SQLite integers
_ORJSON = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY


class WorldStore(WorldFiles):
    """A world's rows; one process at a time (an exclusive lock beside the file)."""

    def __init__(self, path: str | Path, *, create: bool, fsync: bool = False) -> None:
        self._logs: dict[tuple[str, str], Log] = {}  # with its head as of now
        # logs whose row (head, tip) changed, not yet written
        self._unsaved: set[tuple[str, str]] = set()
        self._last: dict[tuple[str, str], tuple[int, int]] = {}  # (seq, tick) of its last event
        # events this process appended (its own bytes)
        self._recent: dict[tuple[str, str], list[Event]] = {}
        # appended, encoded, not yet written
        self._pending: dict[tuple[str, str], list[tuple[Event, bytes]]] = {}
        self._pending_checkpoints: dict[tuple[str, str], list[tuple]] = {}  # rows not yet written
        # which may fold the redo file in: after the above
        super().__init__(path, create=create, fsync=fsync)

    def _take_pending(self) -> tuple[list[tuple], list[tuple], list[tuple]]:
        """The rows of what this transaction appended, advanced and checkpointed since they were
        last taken: segments, their logs' heads and tips, checkpoints."""
        new = []
        for key, events in self._pending.items():  # their logs loaded by `append`
            log = self._logs[key]
            written, tip = segments.rows(self._checksum, *key, events, log.head, log.tip)
            new += written
            self._logs[key] = log.with_tip(tip)
            self._unsaved.add(key)
        heads = []
        for key in self._unsaved:  # the logs' rows: heads and tips
            log = self._logs[key]
            heads.append((log.head, log.tip, self._checksum("log", *log), *key))
        checkpoints = [row for rows in self._pending_checkpoints.values() for row in rows]
        self._pending, self._pending_checkpoints = {}, {}
        self._unsaved.clear()
        return new, heads, checkpoints

    def _holds_pending(self, log: tuple[str, str] | None) -> bool:
        return log in self._pending or log in self._unsaved or log in self._pending_checkpoints

    def _per_log(self) -> tuple[dict[tuple[str, str], Any], ...]:
        """What this process remembers per log, besides `_unsaved`."""
        return self._logs, self._last, self._recent, self._pending, self._pending_checkpoints

    def _forget_all(self) -> None:
        self._unsaved.clear()
        for cache in self._per_log():
            cache.clear()

    # ---- meta, shards, entities, templates ----

    def add_shard(self, name: str, scene: str) -> None:
        self._execute(
            "INSERT INTO shards VALUES (?, ?, ?)",
            (name, scene, self._checksum("shard", name, scene)),
        )

    def shards(self) -> dict[str, str]:
        out = {}
        for name, scene, checksum in self._rows(
            "SELECT name, scene, checksum FROM shards ORDER BY name"
        ):
            if checksum != self._checksum("shard", name, scene):
                raise CorruptWorldError(
                    f"{self.path}: the scene of shard {name!r} fails its checksum"
                )
            out[name] = scene
        return out

    def put_entity(self, data: dict) -> None:
        text = canonical_json(data).decode()
        self._execute(
            "INSERT OR REPLACE INTO entities VALUES (?, ?, ?)",
            (data["name"], text, self._checksum("entity", text)),
        )

    def entities(self) -> list[dict]:
        out = []
        for name, text, checksum in self._rows(
            "SELECT name, data, checksum FROM entities ORDER BY name"
        ):
            if checksum != self._checksum("entity", text):
                raise CorruptWorldError(f"{self.path}: entity {name!r} fails its checksum")
            out.append(json.loads(text))
        return out

    def put_template(self, xml: str, model_hash: str) -> str:
        source_hash = sha256_hex(xml.encode())
        self._execute(
            "INSERT OR IGNORE INTO templates VALUES (?, ?, ?, ?)",
            (
                source_hash,
                xml,
                model_hash,
                self._checksum("template", source_hash, xml, model_hash),
            ),
        )
        return source_hash

    def template(self, source_hash: str) -> tuple[str, str]:
        """(xml, model_hash) of a stored template."""
        rows = self._rows(
            "SELECT xml, model_hash, checksum FROM templates WHERE hash = ?", (source_hash,)
        )
        if not rows:
            raise CorruptWorldError(f"{self.path}: template {source_hash[:12]} is missing")
        xml, model_hash, checksum = rows[0]
        if (
            checksum != self._checksum("template", source_hash, xml, model_hash)
            or sha256_hex(xml.encode()) != source_hash
        ):
            raise CorruptWorldError(f"{self.path}: template {source_hash[:12]} fails its checksum")
        return xml, model_hash

    # ---- logs (canonical and branches) ----

    def add_log(self, log: Log) -> None:
        """A new log, with no segments yet."""
        log = log._replace(tip=log.anchor)
        self._insert_log(log)
        key = log.shard, log.branch
        self._logs[key], self._last[key] = log, (log.anchor_seq, log.anchor_tick)

    def _insert_log(self, log: Log) -> None:
        row = (*log, self._checksum("log", *log))
        self._execute("INSERT INTO logs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def set_head(self, shard: str, branch: str, head: int) -> None:
        """Move a log's head (inside a `transaction()`); its row is written when the transaction
        commits."""
        assert self._in_transaction, "set_head outside a transaction"
        if type(head) is not int or not 0 <= head <= _SQLITE_INT_MAX:
            raise WorldError(
                f"log {_log_name(shard, branch)}: head {head!r} is not an int in 0..2**63-1"
            )
        self._logs[shard, branch] = self.log(shard, branch).with_head(head)
        self._unsaved.add((shard, branch))

    def prune(self, shard: str, branch: str, tick: int) -> None:
        """Forget a log's history before `tick` (one of its checkpoints): its earlier checkpoints
        and the segments that end before it; the log's base moves to `tick` and its anchor to the
        last one dropped."""
        self._sql_mode()
        log = self.log(shard, branch)
        last = self._rows(
            f"SELECT last_seq, last_tick, checksum FROM segments WHERE shard = ? AND branch = ? "
            f"AND last_tick < ? {_LAST}",
            (shard, branch, tick),
        )
        anchor = last[0] if last else (log.anchor_seq, log.anchor_tick, log.anchor)
        self._execute(
            "DELETE FROM segments WHERE shard = ? AND branch = ? AND last_tick < ?",
            (shard, branch, tick),
        )
        self._execute(
            "DELETE FROM checkpoints WHERE shard = ? AND branch = ? AND tick < ?",
            (shard, branch, tick),
        )
        self._execute("DELETE FROM logs WHERE shard = ? AND branch = ?", (shard, branch))
        self._insert_log(
            log._replace(
                base_tick=tick, anchor_seq=anchor[0], anchor_tick=anchor[1], anchor=anchor[2]
            )
        )
        self._forget(shard, branch)  # read back as written

    def delete_log(self, shard: str, branch: str) -> None:
        """A branch's log, checkpoints and all, gone."""
        for table in ("segments", "checkpoints", "logs"):
            self._execute(f"DELETE FROM {table} WHERE shard = ? AND branch = ?", (shard, branch))
        self._forget(shard, branch)

    def _forget(self, shard: str, branch: str) -> None:
        self._unsaved.discard((shard, branch))
        for cache in self._per_log():
            cache.pop((shard, branch), None)

    def log(self, shard: str, branch: str) -> Log:
        """A log's extent; KeyError if there is no such log."""
        key = shard, branch
        if key not in self._logs:
            rows = self._rows("SELECT * FROM logs WHERE shard = ? AND branch = ?", key, log=key)
            if not rows:
                raise KeyError(key)
            log = self._checked_log(rows[0])
            self._read_tail(log)
            self._logs[key] = log
        return self._logs[key]

    def _read_tail(self, log: Log) -> None:
        """Read and check a log's newest segment against its tip: caches its last event."""
        key = log.shard, log.branch
        rows = self._rows(
            f"SELECT {segments.COLUMNS} FROM segments WHERE shard = ? AND branch = ? "
            f"ORDER BY last_tick DESC, first_seq DESC LIMIT 2",
            key,
            log=key,
        )
        newest = log.anchor
        if rows:
            last, *before = rows
            expected, prev = (
                (before[0][1] + 1, before[0][-1]) if before else (log.anchor_seq + 1, log.anchor)
            )
            newest = segments.check(self._checksum, self._where(*key), *key, last, expected, prev)
        if newest != log.tip:
            raise CorruptLogError(
                f"{self._where(*key)}: its newest segment is missing, or is not the one its row "
                f"records"
            )
        self._last[key] = (last[1], last[3]) if rows else (log.anchor_seq, log.anchor_tick)

    def _where(self, shard: str, branch: str) -> str:
        return f"{self.path}: log {_log_name(shard, branch)}"

    def logs(self, shard: str | None = None) -> list[Log]:
        """The branches' logs (of one shard, or of all)."""
        rows = self._rows(
            "SELECT shard, branch FROM logs WHERE branch != '' AND (? IS NULL OR shard = ?) "
            "ORDER BY shard, branch",
            (shard, shard),
        )
        return [self.log(*row) for row in rows]

    def _checked_log(self, row: tuple) -> Log:
        *fields, checksum = row
        if checksum != self._checksum("log", *fields):
            raise CorruptLogError(
                f"{self.path}: the row of log {_log_name(fields[0], fields[1])} (its head, "
                f"anchor and newest segment) fails its checksum"
            )
        return Log(*fields)

    # ---- events ----

    def append(
        self, shard: str, branch: str, events: Sequence[tuple[int, str, str, dict, str]]
    ) -> list[Event]:
        """Append (tick, entity, kind, change, provenance) events inside a `transaction()`; ticks
        must not go back. They are written when the transaction commits, or before a read of their
        log's segments."""
        assert self._in_transaction, "append outside a transaction"
        if not events:
            return []
        key = shard, branch
        last = self._last.get(key)
        seq, last_tick = last if last is not None else self.last_event(shard, branch)
        out, pending = [], []
        for event in events:
            tick = event[0]
            # anything else (a numpy integer) would not read back as it was checksummed, nor fit in
            # SQLite
            if type(tick) is not int or not last_tick <= tick <= _SQLITE_INT_MAX:
                _refuse_tick(shard, branch, tick, last_tick)
            try:  # encoded now, so that an event that cannot be stored is refused here, alone
                encoded = orjson.dumps(event, option=_ORJSON)
            except orjson.JSONEncodeError as exc:
                raise WorldError(
                    f"log {_log_name(shard, branch)}: "
                    f"the event at tick {tick} cannot be stored: {exc}"
                ) from None
            seq += 1
            stored = Event(seq, *event)
            out.append(stored)
            pending.append((stored, encoded))
            last_tick = tick
        if key in self._pending:
            self._pending[key] += pending
        else:
            self._pending[key] = pending
        self._last[key] = (seq, last_tick)
        recent = self._recent.get(key)
        if recent is None:
            self._recent[key] = out[:]
        else:
            recent += out
            if len(recent) > 2 * _RECENT:  # trimmed now and then: a list's front is dear to cut
                del recent[:-_RECENT]
        return out

    def last_event(self, shard: str, branch: str) -> tuple[int, int]:
        """(seq, tick) of a log's last event, (0, 0) if it has none."""
        if (shard, branch) not in self._last:
            self._read_tail(self.log(shard, branch))
        return self._last[shard, branch]

    def last_seq(self, shard: str, branch: str, until_tick: int) -> int:
        """The seq of a log's last event at or before a tick (0 if none)."""
        # the first segment that goes past the tick holds the answer if it starts at or before it;
        # else the segment before it ends with the answer
        past = self._rows(
            "SELECT first_seq, first_tick FROM segments "
            "WHERE shard = ? AND branch = ? AND last_tick > ? "
            "ORDER BY last_tick, first_seq LIMIT 1",
            (shard, branch, until_tick),
            log=(shard, branch),
        )
        if past and past[0][1] <= until_tick:
            upto = self.events(shard, branch, after_seq=past[0][0] - 1, last_tick=until_tick)
            return upto[-1].seq
        before = self._rows(
            "SELECT last_seq FROM segments "
            f"WHERE shard = ? AND branch = ? AND last_tick <= ? {_LAST}",
            (shard, branch, until_tick),
            log=(shard, branch),
        )
        return before[0][0] if before else self.log(shard, branch).anchor_seq

    def events(
        self,
        shard: str,
        branch: str,
        *,
        first_tick: int = 0,
        last_tick: int | None = None,
        after_seq: int = 0,
    ) -> list[Event]:
        """Events with first_tick <= tick <= last_tick and seq > after_seq, in order, from segments
        each verified against its checksum and its predecessor's: CorruptLogError before anything is
        returned. (What this process appended it serves from memory: those are its own bytes.)"""
        last_seq, last = self.last_event(shard, branch)
        if after_seq >= last_seq or first_tick > last:
            return []
        recent = self._recent.get((shard, branch))
        if recent and recent[0].seq <= after_seq + 1 and recent[-1].seq == last_seq:
            return segments.select(recent[after_seq + 1 - recent[0].seq :], first_tick, last_tick)
        rows = []
        with contextlib.closing(
            self._cursor(
                f"SELECT {segments.COLUMNS} FROM segments WHERE shard = ? "
                f"AND branch = ? AND last_tick >= ? AND last_seq > ? ORDER BY last_tick, first_seq",
                (shard, branch, first_tick, after_seq),
                log=(shard, branch),
            )
        ) as cursor:
            for row in cursor:
                if last_tick is not None and row[2] > last_tick:
                    # segments start later and later: no need to read on to the end of the log
                    break
                rows.append(row)
        if not rows:
            return []
        where = self._where(shard, branch)
        before = self._rows(
            f"SELECT last_seq, checksum FROM segments WHERE shard = ? AND branch = ? "
            f"AND (last_tick, first_seq) < (?, ?) {_LAST}",
            (shard, branch, rows[0][3], rows[0][0]),
            log=(shard, branch),
        )
        log = self.log(shard, branch)
        expected, prev = (
            (before[0][0] + 1, before[0][1]) if before else (log.anchor_seq + 1, log.anchor)
        )
        out: list[Event] = []
        for row in rows:  # every one checked before any is decoded
            prev = segments.check(self._checksum, where, shard, branch, row, expected, prev)
            expected = row[1] + 1
        for row in rows:
            out += segments.decode(where, row)
        return segments.select([e for e in out if e.seq > after_seq], first_tick, last_tick)

    # ---- checkpoints ----

    def put_checkpoints(self, shard: str, branch: str, checkpoints: Sequence[Checkpoint]) -> None:
        """Add checkpoints (inside a `transaction()`; one already stored at a tick is kept)."""
        assert self._in_transaction, "put_checkpoints outside a transaction"
        for cp in checkpoints:
            patch = canonical_json(cp.patch).decode()
            checksum = self._checksum(
                "checkpoint",
                shard,
                branch,
                cp.tick,
                cp.template,
                cp.model_hash,
                patch,
                sha256_hex(cp.state),
            )
            self._pending_checkpoints.setdefault((shard, branch), []).append(
                (shard, branch, cp.tick, cp.template, cp.model_hash, patch, cp.state, checksum)
            )

    def checkpoint(self, shard: str, branch: str, at_or_before: int) -> Checkpoint | None:
        rows = self._rows(
            "SELECT tick, template, model_hash, patch, state, checksum FROM checkpoints "
            "WHERE shard = ? AND branch = ? AND tick <= ? ORDER BY tick DESC LIMIT 1",
            (shard, branch, at_or_before),
            log=(shard, branch),
        )
        return self._checked_checkpoint(shard, branch, rows[0]) if rows else None

    def checkpoints(self, shard: str, branch: str, first: int, last: int) -> list[Checkpoint]:
        rows = self._rows(
            "SELECT tick, template, model_hash, patch, state, checksum FROM checkpoints "
            "WHERE shard = ? AND branch = ? AND tick >= ? AND tick <= ? ORDER BY tick",
            (shard, branch, first, last),
            log=(shard, branch),
        )
        return [self._checked_checkpoint(shard, branch, r) for r in rows]

    def _checked_checkpoint(self, shard: str, branch: str, row: tuple) -> Checkpoint:
        tick, template, model_hash, patch, state, checksum = row
        state = bytes(state) if isinstance(state, (bytes, memoryview)) else b""
        if checksum != self._checksum(
            "checkpoint", shard, branch, tick, template, model_hash, patch, sha256_hex(state)
        ):
            raise CorruptCheckpointError(
                f"{self.path}: the checkpoint of {_log_name(shard, branch)} at tick "
                f"{tick} fails its checksum; nothing was restored from it"
            )
        return Checkpoint(tick, template, model_hash, json.loads(patch), state)

    def count_checkpoints(self, shard: str, branch: str) -> int:
        return self._rows(
            "SELECT count(*) FROM checkpoints WHERE shard = ? AND branch = ?",
            (shard, branch),
            log=(shard, branch),
        )[0][0]

    # ---- migrations ----

    def add_migration(self, data: dict) -> None:
        text = canonical_json(data).decode()
        self._execute(
            "INSERT INTO migrations VALUES (?, ?, ?)",
            (data["id"], text, self._checksum("migration", text)),
        )

    def migrations(self) -> list[dict]:
        out = []
        for ident, text, checksum in self._rows(
            "SELECT id, data, checksum FROM migrations ORDER BY rowid"
        ):
            if checksum != self._checksum("migration", text):
                raise CorruptWorldError(f"{self.path}: migration {ident} fails its checksum")
            out.append(json.loads(text))
        return out


def _refuse_tick(shard: str, branch: str, tick: object, last_tick: int) -> NoReturn:
    """WorldError for an event tick a log cannot take (off the path of every event)."""
    where = f"log {_log_name(shard, branch)}"
    if type(tick) is not int or not 0 <= tick <= _SQLITE_INT_MAX:
        raise WorldError(f"{where}: tick {tick!r} is not an int in 0..2**63-1")
    raise WorldError(f"{where}: event at tick {tick} after tick {last_tick}")


def _log_name(shard: str, branch: str) -> str:
    """How messages name a log: its shard, then its branch or "canonical"."""
    return f"{shard}/{branch or 'canonical'}"

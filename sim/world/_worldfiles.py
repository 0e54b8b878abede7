"""A world's files and their transactions: one SQLite file (WAL, every row under a SHA-256
checksum), a redo file beside it (`_redo`) for the commits of a running twin, and a lock: one
process at a time.

Logging is on the path of every setpoint a twin receives, so a commit must be cheap. What a
transaction appends, the heads it moves and the checkpoints it adds wait in memory (in the store on
top, `_worldstore`) until it ends; then they become rows (segments, heads, checkpoints). A
transaction that wrote nothing else, a twin's usual commit, writes those rows as one record of the
redo file, one `write()`; they reach the SQLite tables when the redo file is folded in (at
`FOLD_BYTES`, on close, on open after a crash). Any other transaction commits through SQLite: it
begins there as soon as it writes another table, or reads a log whose rows are in the redo file or
in memory, after folding the redo file in and writing the rows so far. So every read sees all that
was committed and all that its own transaction wrote, and a running twin's reads (its own recent
events, other logs) leave its commits in the redo file. A transaction in which a write to the files
failed commits nothing, even if its caller caught the error. Commits are durable against a killed
process; with `fsync` also against power loss.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import sqlite3
import threading
import uuid
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from .._errors import CorruptWorldError, WorldError, WorldFullError, WorldLockedError
from ._redo import FOLD_BYTES, Record, RedoFile, is_full

_logger = logging.getLogger(__name__)
# /1 logged one row per event; /2 kept heads in log rows only; /3 had no redo file; /4 no
# newest-segment checksum
FORMAT = "simnet.world/5"
_JOINED = contextlib.nullcontext()  # an inner transaction: reusable, it does nothing
# the setting holding the number of the last redo record folded into the tables
_FOLDED = "redo_folded"
_WAL_CHECKPOINT_S = 5.0  # each WAL checkpoint syncs the file and stalls the writer ~25 ms here
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS templates (hash TEXT PRIMARY KEY, xml TEXT NOT NULL,
    model_hash TEXT NOT NULL, checksum TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shards (name TEXT PRIMARY KEY, scene TEXT NOT NULL,
    checksum TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entities (name TEXT PRIMARY KEY, data TEXT NOT NULL,
    checksum TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS logs (shard TEXT NOT NULL, branch TEXT NOT NULL,
    base_tick INTEGER NOT NULL, head INTEGER NOT NULL, label TEXT NOT NULL,
    anchor_seq INTEGER NOT NULL, anchor_tick INTEGER NOT NULL, anchor TEXT NOT NULL,
    tip TEXT NOT NULL, checksum TEXT NOT NULL, PRIMARY KEY (shard, branch));
CREATE TABLE IF NOT EXISTS segments (shard TEXT NOT NULL, branch TEXT NOT NULL,
    first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, first_tick INTEGER NOT NULL,
    last_tick INTEGER NOT NULL, head INTEGER NOT NULL, events TEXT NOT NULL,
    checksum TEXT NOT NULL, UNIQUE (shard, branch, last_tick, first_seq));
CREATE TABLE IF NOT EXISTS checkpoints (shard TEXT NOT NULL, branch TEXT NOT NULL,
    tick INTEGER NOT NULL, template TEXT NOT NULL, model_hash TEXT NOT NULL, patch TEXT NOT NULL,
    state BLOB NOT NULL, checksum TEXT NOT NULL, PRIMARY KEY (shard, branch, tick)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS migrations (id TEXT PRIMARY KEY, data TEXT NOT NULL,
    checksum TEXT NOT NULL);
"""


class WorldFiles(abc.ABC):
    """A world's files, its transactions and its settings; `WorldStore` says what the rows are."""

    _folding: int | None  # the redo record the fold of this transaction reached
    _failure: BaseException | None  # the first failure of this transaction

    def __init__(self, path: str | Path, *, create: bool, fsync: bool = False) -> None:
        self.path = Path(path)
        self._redo: RedoFile | None = None
        self._in_redo: set[tuple[str, str]] = set()  # logs with rows in unfolded redo records
        # the transaction under way: whether it began in SQLite, the record its fold reached, its
        # first failure
        self._in_transaction, self._in_sqlite, self._folding, self._failure = (
            False,
            False,
            None,
            None,
        )
        redo = Path(f"{self.path}-redo")
        if create == self.path.exists():
            raise WorldError(f"{self.path} {'already exists' if create else 'holds no world'}")
        if create:
            check_folder(self.path)
        if create and redo.exists() and redo.stat().st_size == 0:
            redo.unlink()  # left by a create that died before it wrote anything
        if create and redo.exists():
            raise WorldError(
                f"{redo} is in the way: commits of a world whose file is gone; move it away first"
            )
        try:
            self._lock = open(str(self.path) + ".lock", "a+")  # noqa: SIM115 - held while open
        except OSError as exc:
            raise _os_error(self.path, exc, "create" if create else "open") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise WorldLockedError(
                f"{self.path} is open in another process; close it there first"
            ) from None
        try:
            self._open(create, fsync, redo)
        except BaseException:
            if self._redo is not None:  # the fold that failed is not tried again on the way out
                self._redo.unfolded = False
            if create:
                self.discard()  # nothing left of a world that was not made
            else:
                self.close()
            raise

    def _open(self, create: bool, fsync: bool, redo: Path) -> None:
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            if (
                not create
                and not self._db.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'meta'"
                ).fetchone()
            ):
                # another program's database, or an empty file: refused before anything is written
                raise CorruptWorldError(f"{self.path} holds no world (no meta table)")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            if create:
                self.id = str(uuid.uuid4())
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [("format", FORMAT), ("id", self.id), ("fsync", json.dumps(bool(fsync)))],
                )
                self._put_meta(_FOLDED, 0)
                self._db.execute("COMMIT")
            meta = dict(self._db.execute("SELECT key, value FROM meta"))
        except sqlite3.OperationalError as exc:  # a full disk, a read-only file, an I/O error
            raise self._store_error(exc, "created" if create else "opened") from None
        except sqlite3.DatabaseError as exc:
            raise CorruptWorldError(f"{self.path} is not a readable world: {exc}") from None
        if meta.get("format") != FORMAT:
            raise CorruptWorldError(f"{self.path}: unknown world format {meta.get('format')!r}")
        self.id = meta["id"]
        fsync = json.loads(meta["fsync"])
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        # WAL checkpoints (which fsync) run beside the writer, not inside one of its commits
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._stop = threading.Event()
        self._checkpointer = threading.Thread(
            target=self._checkpoint_wal, name=f"wal {self.path.name}", daemon=True
        )
        self._checkpointer.start()
        self._redo = RedoFile(redo, self.id, fsync=fsync, folded=self.meta(_FOLDED))
        if self._redo.unfolded:
            self.fold()  # what the last session committed there, if it did not close

    def fold(self) -> None:
        """Write the redo file's records into the tables now (reads do it first themselves)."""
        with self.transaction():
            self._sql_mode()

    def close(self) -> None:
        if (
            self._redo is not None
            and self._redo.unfolded
            and getattr(self, "_db", None) is not None
        ):
            try:
                self.fold()
            except Exception as exc:  # noqa: BLE001 - they stay in the redo file: the next open folds them
                _logger.warning(
                    "%s: the redo file was not folded in on close (%s); the next open will",
                    self.path,
                    exc,
                )
        if getattr(self, "_checkpointer", None) is not None:
            self._stop.set()
            self._checkpointer.join()
            del self._checkpointer
        if getattr(self, "_db", None) is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
            del self._db  # closed
        if self._redo is not None:
            self._redo.close()
        if not self._lock.closed:
            self._lock.close()

    def discard(self) -> None:
        """Close a world that was not made, and remove its files: nothing is left of it."""
        self.close()
        for leftover in ("", "-wal", "-shm", "-redo", ".lock"):
            Path(f"{self.path}{leftover}").unlink(missing_ok=True)

    def _checkpoint_wal(self) -> None:
        """Copy committed pages from the WAL into the database every few seconds, on a connection of
        its own."""
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(_WAL_CHECKPOINT_S):
                with contextlib.suppress(sqlite3.Error):  # busy now: the next round catches up
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    def transaction(self) -> contextlib.AbstractContextManager:
        """All or nothing: the outermost one commits (inner ones join it, at no cost: a batch of
        events). A transaction in which a write to the files failed commits nothing, even if the
        caller caught the error."""
        return _JOINED if self._in_transaction else self._transaction()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        assert self._redo is not None  # an open world's files
        self._in_transaction, self._in_sqlite, self._folding, self._failure = (
            True,
            False,
            None,
            None,
        )
        try:
            if self._redo.size >= FOLD_BYTES:
                self._sql_mode()  # this one commits through SQLite, with the redo file folded in
            yield
            if self._failure is not None:
                raise WorldError(
                    f"{self.path}: nothing of this commit was kept: "
                    f"it failed earlier ({self._failure})"
                )
            if self._in_sqlite:
                if not self._db.in_transaction:  # SQLite ended it after an error the caller caught
                    raise WorldError(
                        f"{self.path}: nothing of this commit was kept: SQLite rolled it back"
                    )
                self._write_rows(*self._take_pending())
                self._db.execute("COMMIT")
            else:
                segments, heads, checkpoints = self._take_pending()
                if segments or heads or checkpoints:
                    # logs marked first: an interrupt after the write keeps it
                    self._in_redo.update(
                        [row[:2] for row in segments + checkpoints] + [row[3:] for row in heads]
                    )
                    self._redo.append(*_record(segments, heads, checkpoints))
        except BaseException as exc:
            self._forget_all()  # what it remembers may have been rolled back
            if self._db.in_transaction:  # SQLite ends some failed transactions itself (a full disk)
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            mapped = self._store_error(exc)
            if mapped is exc:
                raise
            raise mapped from None
        finally:
            self._in_transaction = False
        if self._folding is not None:  # committed: the redo file's records are in the tables now
            self._redo.folded_to(self._folding)
            self._in_redo.clear()

    def _store_error(self, exc: BaseException, done: str = "") -> BaseException:
        """The world's error for a failure of its files; `done`: "opened" or "created" when the
        failure was opening or creating them."""
        if isinstance(exc, sqlite3.OperationalError):  # a full disk, an I/O error
            if done:  # opening or creating the world
                full = "the disk is full: " if is_full(exc) else ""
                return (WorldFullError if full else WorldError)(
                    f"{self.path}: the world cannot be {done}: {full}{exc}"
                )
            if is_full(exc):
                return WorldFullError(
                    f"{self.path}: the store could not write ({exc}): the disk is full; "
                    "nothing of this commit was kept. Free space and retry"
                )
            return WorldError(
                f"{self.path}: the store could not write ({exc}); nothing of this commit was kept"
            )
        if isinstance(exc, sqlite3.DatabaseError):  # the files disagree (a fold's rows, a bad page)
            return CorruptWorldError(f"{self.path}: {exc}")
        return exc

    def _sql_mode(self) -> None:
        """Make this transaction commit through SQLite (it writes another table, or reads a log the
        redo file or memory holds rows of): begin it there, fold the redo file in, and write the
        rows this transaction made so far. Outside a transaction: fold. A failure here fails the
        whole transaction."""
        if not self._in_transaction:
            if self._redo is not None and self._redo.unfolded:
                self.fold()
            return
        if self._failure is not None:
            raise WorldError(
                f"{self.path}: this commit already failed ({self._failure}); "
                "nothing of it will be kept"
            )
        assert self._redo is not None
        with self._writing():
            if not self._in_sqlite:
                self._db.execute("BEGIN IMMEDIATE")
                self._in_sqlite = True
                if self._redo.unfolded:
                    self._fold()
            self._write_rows(*self._take_pending())

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a write to the files: an SQLite error becomes the store's, and a failure fails the
        transaction it is in, even if the caller catches it."""
        try:
            yield
        except BaseException as exc:
            mapped = self._store_error(exc)
            if self._in_transaction:
                self._failure = mapped
            if mapped is exc:
                raise
            raise mapped from None

    def _fold(self) -> None:
        """Insert the redo file's unfolded records and record the last one's number (as of this
        transaction)."""
        # as the SQLite file says: an interrupt between a fold's commit and `folded_to` leaves the
        # redo file behind
        assert self._redo is not None
        self._redo.folded = max(self._redo.folded, self.meta(_FOLDED))
        records = self._redo.unfolded_records()
        for record in records:
            self._write_rows(*self._record_rows(record))
        last = records[-1].n if records else self._redo.folded
        self._put_meta(_FOLDED, last)
        self._folding = last

    def _record_rows(self, record: Record) -> tuple[list[tuple], list[tuple], list[tuple]]:
        """The rows of a redo record: segments, heads, checkpoints (what `_record` stored)."""
        if record.blobs is None:  # redo format 1: all JSON, events as text, states in base64
            meta = record.meta
            return (
                [(*row[:7], row[7].encode(), row[8]) for row in meta["segments"]],
                meta["heads"],
                [(*row[:6], base64.b64decode(row[6]), row[7]) for row in meta["checkpoints"]],
            )
        segments, heads, checkpoints = record.meta
        if len(record.blobs) != len(segments) + len(checkpoints):
            raise CorruptWorldError(
                f"{self.path}-redo: commit {record.n} holds {len(record.blobs)} blobs, not "
                f"{len(segments) + len(checkpoints)}"
            )
        events, states = record.blobs[: len(segments)], record.blobs[len(segments) :]
        return (
            [(*row[:7], text, row[7]) for row, text in zip(segments, events, strict=True)],
            heads,
            [(*row[:6], state, row[6]) for row, state in zip(checkpoints, states, strict=True)],
        )

    def _write_rows(
        self,
        segments: Sequence[Sequence],
        heads: Sequence[Sequence],
        checkpoints: Sequence[Sequence],
    ) -> None:
        if segments:  # their events as text, as read back
            self._db.executemany(
                "INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(*row[:7], row[7].decode(), row[8]) for row in segments],
            )
        if heads:
            self._db.executemany(
                "UPDATE logs SET head = ?, tip = ?, checksum = ? WHERE shard = ? AND branch = ?",
                heads,
            )
        if checkpoints:
            self._db.executemany(
                "INSERT OR IGNORE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)", checkpoints
            )

    def _checksum(self, table: str, *fields: str | int | bytes) -> str:
        """SHA-256 over the world id and the fields (text as UTF-8), after their lengths
        (unambiguous, and cheap)."""
        parts = [table.encode(), self.id.encode()]
        parts += [field if type(field) is bytes else str(field).encode() for field in fields]
        # lists: join takes them without a copy; the parts hashed as they are, not copied together
        digest = hashlib.sha256(b"%s|" % b",".join([b"%d" % len(p) for p in parts]))
        for part in parts:
            digest.update(part)
        return digest.hexdigest()

    def _rows(
        self, sql: str, args: Sequence[Any] = (), log: tuple[str, str] | None = None
    ) -> list[tuple]:
        return list(self._cursor(sql, args, log))

    def _cursor(
        self, sql: str, args: Sequence[Any] = (), log: tuple[str, str] | None = None
    ) -> Generator[tuple, None, None]:
        """Rows one by one, as read. A read of `log`'s head, segments or checkpoints sees all that
        was committed and all that this transaction wrote: if the redo file or this transaction
        holds rows of that log, they are written into the tables first (and the transaction commits
        through SQLite)."""
        if log in self._in_redo or self._holds_pending(log):
            self._sql_mode()
        try:
            yield from self._db.execute(sql, args)
        except sqlite3.DatabaseError as exc:
            raise CorruptWorldError(f"{self.path}: {exc}") from None

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        """A write to a table the redo file does not carry (inside a `transaction()`, so that the
        writes of one change commit together): this transaction commits through SQLite. A write that
        fails fails it."""
        assert self._in_transaction, "a write outside a transaction"
        self._sql_mode()
        with self._writing():
            self._db.execute(sql, args)

    def set_meta(self, key: str, value: Any) -> None:
        assert self._in_transaction, "set_meta outside a transaction"
        self._sql_mode()
        with self._writing():
            self._put_meta(key, value)

    def _put_meta(self, key: str, value: Any) -> None:
        text = json.dumps(value)
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, text))
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            (f"{key}.checksum", self._checksum("meta", key, text)),
        )

    def meta(self, key: str) -> Any:
        rows = dict(
            self._rows("SELECT key, value FROM meta WHERE key IN (?, ?)", (key, f"{key}.checksum"))
        )
        if key not in rows or rows.get(f"{key}.checksum") != self._checksum("meta", key, rows[key]):
            raise CorruptWorldError(
                f"{self.path}: world setting {key!r} is missing or fails its checksum"
            )
        return json.loads(rows[key])

    # ---- what the store on top holds in memory ----

    @abc.abstractmethod
    def _take_pending(self) -> tuple[list[tuple], list[tuple], list[tuple]]:
        """The rows this transaction made since they were last taken: segments, heads,
        checkpoints."""

    @abc.abstractmethod
    def _holds_pending(self, log: tuple[str, str] | None) -> bool:
        """Whether this transaction holds rows of `log` not yet taken."""

    @abc.abstractmethod
    def _forget_all(self) -> None:
        """Forget what is remembered of the files: a transaction was rolled back."""


def _record(
    segments: list[tuple], heads: list[tuple], checkpoints: list[tuple]
) -> tuple[list, list[bytes]]:
    """A commit's rows as a redo record: the segments' events and the checkpoints' states as blobs,
    the other fields as its JSON."""
    return (
        [
            [row[:7] + row[8:] for row in segments],
            heads,
            [row[:6] + row[7:] for row in checkpoints],
        ],
        [row[7] for row in segments] + [row[6] for row in checkpoints],
    )


def check_folder(path: Path) -> None:
    """A new world's folder must exist (as for `sqlite3.connect`, nothing creates it): WorldError
    naming it if it does not."""
    folder = path.absolute().parent
    if not folder.is_dir():
        raise WorldError(
            f"cannot create the world {path}: the folder {folder} "
            f"{'is not a folder' if folder.exists() else 'does not exist'}; create it first"
        )


def _os_error(path: Path, exc: OSError, doing: str) -> WorldError:
    """The world's error for a file the system refused (a read-only folder, a full disk)."""
    where = f" ({exc.filename})" if exc.filename else ""
    if is_full(exc):
        return WorldFullError(
            f"cannot {doing} the world {path}: the disk is full ({exc.strerror}{where})"
        )
    return WorldError(f"cannot {doing} the world {path}: {exc.strerror or exc}{where}")

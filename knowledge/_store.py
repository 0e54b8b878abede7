"""The durable store: one SQLite file per site in WAL mode with synchronous commits.

It holds envelopes, checkpoints, blobs, equivocation evidence and small metadata. Everything else
(views, indexes) is derived and rebuilt from it; snapshots of the derived state (`_snapshot`) are
kept here too, so that opening need not rebuild it, and are ignored when they do not match. A
write is acknowledged only after `commit` returns.

Blobs are stored in parts of `BLOB_PART` bytes (table `blob_parts`), so that one can be read a part
at a time (`blob_size`, `blob_part`) without loading it whole: SQLite reads a column value whole,
and its incremental blob I/O needs a rowid table. Stores written before kept each blob in one row
(table `blobs`); a writer moves those into parts when it opens the store, and reads fall back to
them meanwhile.

A store that cannot be written says why, naming its path: `StoreReadOnlyError` when its file, its
folder or its file system is read-only, `StoreFullError` when the disk is full (SQLITE_FULL,
ENOSPC, a quota or a file-size limit), a plain `StoreError` for anything else (an I/O error, a
corrupt file), as `_storage_errors` reads SQLite's and the OS's codes. A transaction that fails is
rolled back whole, so a write that raised was not made and the store is as it was; the next write
succeeds once the cause is gone.

A store can still be read where it cannot be written. A reader needs the write-ahead log's index
(`-shm`) beside the file, which SQLite cannot create in a read-only folder or file system, or on a
full disk; there, if no writer has left a log (`-wal`) with anything in it, the file holds the
whole store and is opened immutable. (A running writer keeps a log; one that starts while such a
reader reads is not seen by it: what it reads is the store as it was.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO
from urllib.parse import quote

from ._envelope import PREV_OFFSET
from ._errors import StoreError, StoreLockedError
from ._storage_errors import storage_error

MEMORY = ":memory:"
BLOB_PART = (
    256 << 10
)  # bytes per stored part of a blob (the last part holds the rest); fixed for a store

_SCHEMA = """
CREATE TABLE IF NOT EXISTS envelopes (
    author BLOB NOT NULL, seq INTEGER NOT NULL, hash BLOB NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (author, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    author BLOB PRIMARY KEY, seq INTEGER NOT NULL, body BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobs (hash BLOB PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blob_parts (
    hash BLOB NOT NULL, part INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (hash, part)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS equivocations (
    author BLOB NOT NULL, seq INTEGER NOT NULL, first BLOB NOT NULL, second BLOB NOT NULL,
    PRIMARY KEY (author, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blob_partials (
    hash BLOB NOT NULL, start INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (hash, start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS held (
    author BLOB NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (author, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    name TEXT NOT NULL, part INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (name, part)) WITHOUT ROWID;
"""
SNAPSHOT_PART = 8 << 20  # bytes per stored part of a snapshot (SQLite reads a value whole)
# What a reader meets when SQLite cannot create the write-ahead log's index beside the file: a
# read-only folder or file system, a full disk.
_NO_LOG_INDEX = frozenset(
    {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL}
)


class Store:
    """SQLite access for one knowledge base. Callers serialize access (the KnowledgeBase holds a
    lock)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        self._lock_file: TextIO | None = None
        try:
            if self.path == MEMORY:
                self._db = sqlite3.connect(MEMORY, isolation_level=None, check_same_thread=False)
            elif readonly:
                if not Path(self.path).exists():
                    raise StoreError(f"no knowledge base at {self.path}")
                self._db = self._connect_readonly()
            else:
                self._take_writer_lock()
                with contextlib.suppress(FileNotFoundError):  # SQLite would open it read-only
                    os.close(os.open(self.path, os.O_RDWR))
                self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
            self._db.execute("PRAGMA busy_timeout=5000")
            if not readonly:
                self._split_whole_blobs()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise storage_error(self.path, exc, "read" if readonly else "open") from exc
        except BaseException:
            self.close()
            raise

    def _connect_readonly(self) -> sqlite3.Connection:
        """A read-only connection; immutable when the folder or file system is read-only and no
        writer has left a write-ahead log (see the module's docstring)."""
        resolved = Path(self.path).resolve()
        uri = f"file:{quote(str(resolved))}?mode=ro"
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # opens the log's index
            return db
        except sqlite3.OperationalError as exc:
            db.close()
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _NO_LOG_INDEX:
                raise
            wal = Path(f"{resolved}-wal")
            if wal.exists() and wal.stat().st_size:
                raise storage_error(self.path, exc, "read") from exc  # its log must be read
        db = sqlite3.connect(
            f"{uri}&immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except BaseException:
            db.close()
            raise
        return db

    def _take_writer_lock(self) -> None:
        lock_path = self.path + ".lock"
        try:
            self._lock_file = open(lock_path, "a+")  # noqa: SIM115 - held for the store's lifetime
        except OSError as exc:
            raise storage_error(self.path, exc, "open") from None
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise StoreLockedError(
                f"{self.path} is already open for writing by another process; "
                "only one process may write as an identity (a second writer would equivocate). "
                "Open it read-only or stop the other one."
            ) from None

    @property
    def is_open(self) -> bool:
        return getattr(self, "_db", None) is not None

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            del self._db  # closed: `is_open` is False, and a later use fails
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; when the outermost block returns, its writes are on disk.

        If the block or the commit fails, the whole transaction is rolled back: an SQLite error
        (a full disk, a read-only file, an I/O error) leaves it as a StoreError (see
        `storage_error`)."""
        if self._db.in_transaction:
            yield  # nested: the outermost block commits or rolls back
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite ends some failed transactions itself (a full disk), and keeps others open
                # (a failed COMMIT): none may stay open, or the next write would join it
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc, "write") from exc

    # --- metadata -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def set_meta(self, key: str, value: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def delete_meta(self, key: str) -> None:
        self._db.execute("DELETE FROM meta WHERE key=?", (key,))

    # --- envelopes ------------------------------------------------------------------------------
    def add_envelope(self, author: bytes, seq: int, hash_: bytes, body: bytes) -> None:
        self._db.execute("INSERT INTO envelopes VALUES (?, ?, ?, ?)", (author, seq, hash_, body))

    def add_envelopes(self, rows: list[tuple[bytes, int, bytes, bytes]]) -> None:
        """Many (author, seq, hash, body) rows in one statement (ingest writes a run at a time)."""
        self._db.executemany("INSERT INTO envelopes VALUES (?, ?, ?, ?)", rows)

    def envelope_hash(self, author: bytes, seq: int) -> bytes | None:
        row = self._db.execute(
            "SELECT hash FROM envelopes WHERE author=? AND seq=?", (author, seq)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def envelope(self, author: bytes, seq: int) -> bytes | None:
        row = self._db.execute(
            "SELECT body FROM envelopes WHERE author=? AND seq=?", (author, seq)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def envelopes(
        self, author: bytes, after: int = 0, limit: int = -1, max_bytes: int | None = None
    ) -> list[bytes]:
        """`author`'s envelopes after seq `after`, in order, at most `limit`; with `max_bytes`, read
        only until those read reach it (the last may cross it)."""
        rows = self._db.execute(
            "SELECT body FROM envelopes WHERE author=? AND seq>? ORDER BY seq LIMIT ?",
            (author, after, limit),
        )
        if max_bytes is None:
            return [bytes(r[0]) for r in rows]
        out, size = [], 0
        for (body,) in rows:
            if size >= max_bytes:
                break
            out.append(bytes(body))
            size += len(body)
        return out

    def authors(self) -> list[bytes]:
        rows = self._db.execute("SELECT author FROM envelopes UNION SELECT author FROM checkpoints")
        return sorted(bytes(r[0]) for r in rows)

    def delete_after(self, author: bytes, seq: int) -> None:
        """Drop an author's envelopes after `seq` (and a checkpoint beyond it)."""
        self._db.execute("DELETE FROM envelopes WHERE author=? AND seq>?", (author, seq))
        self._db.execute("DELETE FROM checkpoints WHERE author=? AND seq>?", (author, seq))
        # they may cover what was dropped
        self.delete_snapshots([f"feed/{author.hex()}", f"state/{author.hex()}"])

    def count_envelopes(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM envelopes").fetchone()[0]

    # --- checkpoints ----------------------------------------------------------------------------
    def put_checkpoint(self, author: bytes, seq: int, body: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?)", (author, seq, body))

    def checkpoint(self, author: bytes) -> tuple[int, bytes] | None:
        row = self._db.execute(
            "SELECT seq, body FROM checkpoints WHERE author=?", (author,)
        ).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    def unchecked_checkpoints(self) -> list[tuple[bytes, int, bytes]]:
        """(author, seq, prev) of every checkpoint whose own envelope (at its seq) is not held: no
        history here shows that its state is its author's (see `_checking`)."""
        rows = self._db.execute(
            f"SELECT author, seq, substr(body, {PREV_OFFSET + 1}, 32) FROM checkpoints c "
            "WHERE NOT EXISTS (SELECT 1 FROM envelopes e WHERE e.author=c.author AND e.seq=c.seq)"
        )
        return [(bytes(a), s, bytes(p)) for a, s, p in rows]

    def checkpoint_head(self, author: bytes) -> tuple[int, bytes] | None:
        """(seq, prev) of an author's checkpoint: the head it summarizes, read from its header
        alone."""
        row = self._db.execute(
            f"SELECT seq, substr(body, {PREV_OFFSET + 1}, 32) FROM checkpoints WHERE author=?",
            (author,),
        ).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    # --- blobs ----------------------------------------------------------------------------------
    def put_blob(self, hash_: bytes, data: bytes) -> None:
        """Store a blob in parts (nothing if it is stored already); all parts or none."""
        if not self.has_blob(hash_):
            with self.transaction():
                self._insert_parts(hash_, data)

    def _insert_parts(self, hash_: bytes, data: bytes) -> None:
        view = memoryview(data)  # parts are slices of it: no copies
        self._db.executemany(
            "INSERT INTO blob_parts VALUES (?, ?, ?)",
            [
                (hash_, i, view[start : start + BLOB_PART])
                for i, start in enumerate(range(0, max(len(view), 1), BLOB_PART))
            ],
        )

    def blob(self, hash_: bytes) -> bytes | None:
        """A blob's bytes, whole (see `blob_part` to read one a part at a time)."""
        parts = [
            bytes(r[0])
            for r in self._db.execute(
                "SELECT data FROM blob_parts WHERE hash=? ORDER BY part", (hash_,)
            )
        ]
        if parts:
            return b"".join(parts)
        row = self._db.execute("SELECT data FROM blobs WHERE hash=?", (hash_,)).fetchone()
        return None if row is None else bytes(row[0])

    def has_blob(self, hash_: bytes) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM blob_parts WHERE hash=? AND part=0", (hash_,)
            ).fetchone()
            is not None
            or self._db.execute("SELECT 1 FROM blobs WHERE hash=?", (hash_,)).fetchone() is not None
        )

    def blob_size(self, hash_: bytes) -> int | None:
        """A blob's length in bytes, without reading it; None if it is not stored."""
        count, size = self._db.execute(
            "SELECT COUNT(*), SUM(length(data)) FROM blob_parts WHERE hash=?", (hash_,)
        ).fetchone()
        if count:
            return size
        row = self._db.execute("SELECT length(data) FROM blobs WHERE hash=?", (hash_,)).fetchone()
        return None if row is None else row[0]

    def blob_part(self, hash_: bytes, index: int) -> bytes | None:
        """Part `index` (0, 1, ...) of a blob: at most BLOB_PART bytes; None past its last part or
        if the blob is not stored. Concatenated in order, the parts are the blob."""
        row = self._db.execute(
            "SELECT data FROM blob_parts WHERE hash=? AND part=?", (hash_, index)
        ).fetchone()
        if row is not None:
            return bytes(row[0])
        if (
            index < 0
            or self._db.execute("SELECT 1 FROM blob_parts WHERE hash=?", (hash_,)).fetchone()
        ):
            return None
        whole = self._db.execute(
            "SELECT data FROM blobs WHERE hash=?", (hash_,)
        ).fetchone()  # an old, unsplit one
        if whole is None or (index and index * BLOB_PART >= len(whole[0])):
            return None
        return bytes(whole[0][index * BLOB_PART : (index + 1) * BLOB_PART])

    def _split_whole_blobs(self) -> None:
        """Move blobs stored whole (by earlier versions) into parts, one blob per transaction."""
        while (
            row := self._db.execute("SELECT hash, data FROM blobs LIMIT 1").fetchone()
        ) is not None:
            hash_, data = bytes(row[0]), row[1]
            with self.transaction():
                self._db.execute("DELETE FROM blob_parts WHERE hash=?", (hash_,))
                self._insert_parts(hash_, data)
                self._db.execute("DELETE FROM blobs WHERE hash=?", (hash_,))

    def blob_hashes(self) -> list[bytes]:
        """Every stored blob's hash, in order."""
        rows = self._db.execute(
            "SELECT hash FROM blob_parts WHERE part=0 UNION SELECT hash FROM blobs ORDER BY 1"
        )
        return [bytes(r[0]) for r in rows]

    def blob_bytes(self) -> int:
        """Bytes held in blobs, whole and partly fetched (what a blob quota counts)."""
        tables = (
            ("blob_parts", "blobs", "blob_partials")
            if self._partials()
            else ("blob_parts", "blobs")
        )
        return sum(
            self._db.execute(f"SELECT COALESCE(SUM(length(data)), 0) FROM {table}").fetchone()[0]
            for table in tables
        )

    def _partials(self) -> bool:
        """Whether the store has the table of partly fetched blobs (a store written by an earlier
        version and opened read-only does not)."""
        return (
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='blob_partials'"
            ).fetchone()
            is not None
        )

    def delete_blob(self, hash_: bytes) -> None:
        """Drop a blob, and any partly fetched copy of it."""
        with self.transaction():
            for table in ("blob_parts", "blobs", "blob_partials"):
                self._db.execute(f"DELETE FROM {table} WHERE hash=?", (hash_,))

    # --- blobs being fetched: their first bytes, kept so that a fetch cut short resumes ----------
    def partial_hashes(self) -> list[bytes]:
        if not self._partials():
            return []
        rows = self._db.execute("SELECT DISTINCT hash FROM blob_partials ORDER BY hash")
        return [bytes(r[0]) for r in rows]

    def partial_size(self, hash_: bytes) -> int:
        if not self._partials():
            return 0
        return self._db.execute(
            "SELECT COALESCE(SUM(length(data)), 0) FROM blob_partials WHERE hash=?", (hash_,)
        ).fetchone()[0]

    def partial_blob(self, hash_: bytes) -> bytes | None:
        """The bytes fetched so far, in order; None if they are not contiguous from byte 0."""
        out = bytearray()
        for start, data in self._db.execute(
            "SELECT start, data FROM blob_partials WHERE hash=? ORDER BY start", (hash_,)
        ):
            if start != len(out):
                return None
            out += data
        return bytes(out)

    def add_partial(self, hash_: bytes, start: int, data: bytes) -> None:
        with self.transaction():
            self._db.execute("INSERT INTO blob_partials VALUES (?, ?, ?)", (hash_, start, data))

    def drop_partial(self, hash_: bytes) -> None:
        with self.transaction():
            self._db.execute("DELETE FROM blob_partials WHERE hash=?", (hash_,))

    # --- equivocation evidence ------------------------------------------------------------------
    def add_equivocation(self, author: bytes, seq: int, first: bytes, second: bytes) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO equivocations VALUES (?, ?, ?, ?)", (author, seq, first, second)
        )

    def equivocations(self) -> list[tuple[bytes, int, bytes, bytes]]:
        rows = self._db.execute(
            "SELECT author, seq, first, second FROM equivocations ORDER BY author, seq"
        )
        return [(bytes(a), s, bytes(f), bytes(b)) for a, s, f, b in rows]

    # --- envelopes held until they are due (see _hold) ------------------------------------------
    def add_held(self, author: bytes, seq: int, body: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO held VALUES (?, ?, ?)", (author, seq, body))

    def delete_held(self, keys: list[tuple[bytes, int]]) -> None:
        self._db.executemany("DELETE FROM held WHERE author=? AND seq=?", keys)

    def held(self) -> list[bytes]:
        try:
            return [bytes(r[0]) for r in self._db.execute("SELECT body FROM held")]
        except sqlite3.OperationalError:  # a store from before this table, opened read-only
            return []

    # --- snapshots of derived state (see _snapshot): checked on load, dropped when stale --------
    def put_snapshot(self, name: str, pieces: Sequence[bytes | memoryview]) -> None:
        """Replace the snapshot `name` by `pieces`, each in parts of its own of at most
        SNAPSHOT_PART bytes (an empty piece takes one empty part); within the caller's
        transaction."""
        self._db.execute("DELETE FROM snapshots WHERE name=?", (name,))
        parts = []
        for piece in pieces:
            view = memoryview(piece).cast("B")
            parts += [
                view[at : at + SNAPSHOT_PART] for at in range(0, max(len(view), 1), SNAPSHOT_PART)
            ]
        self._db.executemany(
            "INSERT INTO snapshots VALUES (?, ?, ?)", [(name, i, p) for i, p in enumerate(parts)]
        )

    def snapshot(self, name: str) -> list[bytes] | None:
        """The parts of the snapshot `name`, in order (None if there is none)."""
        try:
            parts = [
                r[0]
                for r in self._db.execute(
                    "SELECT data FROM snapshots WHERE name=? ORDER BY part", (name,)
                )
            ]
        except sqlite3.OperationalError:  # a store from before this table, opened read-only
            return None
        return parts or None

    def snapshots(self, prefix: str) -> dict[str, list[bytes]]:
        """The parts of every snapshot whose name starts with `prefix`, by name."""
        out: dict[str, list[bytes]] = {}
        try:
            rows = self._db.execute(
                "SELECT name, data FROM snapshots WHERE name >= ? AND name < ? ORDER BY name, part",
                (prefix, prefix + "\U0010ffff"),
            )
            for name, data in rows:
                out.setdefault(name, []).append(data)
        except sqlite3.OperationalError:  # a store from before this table, opened read-only
            return {}
        return out

    def delete_snapshots(self, names: list[str] | None = None) -> None:
        """Drop these snapshots (all of them if `names` is None)."""
        with contextlib.suppress(sqlite3.OperationalError):  # no table: nothing to drop
            if names is None:
                self._db.execute("DELETE FROM snapshots")
            else:
                self._db.executemany("DELETE FROM snapshots WHERE name=?", [(n,) for n in names])

"""The durable store: one SQLite file per site in WAL mode with synchronous commits.

It holds envelopes, checkpoints, blobs, equivocation evidence and small metadata. Everything else
(views, indexes) is derived and rebuilt from it. A write is acknowledged only after `commit`
returns.

Blobs are stored in parts of `BLOB_PART` bytes (table `blob_parts`), so that one can be read a part
at a time (`blob_size`, `blob_part`) without loading it whole: SQLite reads a column value whole,
and its incremental blob I/O needs a rowid table. Stores written before kept each blob in one row
(table `blobs`); a writer moves those into parts when it opens the store, and reads fall back to
them meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from ._envelope import PREV_OFFSET
from ._errors import StoreError, StoreLockedError

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
"""


class Store:
    """SQLite access for one knowledge base. Callers serialize access (the KnowledgeBase holds a
    lock)."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        self._lock_file = None
        try:
            if self.path == MEMORY:
                self._db = sqlite3.connect(MEMORY, isolation_level=None, check_same_thread=False)
            elif readonly:
                if not Path(self.path).exists():
                    raise StoreError(f"no knowledge base at {self.path}")
                uri = f"file:{Path(self.path).resolve()}?mode=ro"
                self._db = sqlite3.connect(
                    uri, uri=True, isolation_level=None, check_same_thread=False
                )
            else:
                self._take_writer_lock()
                self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
            self._db.execute("PRAGMA busy_timeout=5000")
            if not readonly:
                self._split_whole_blobs()
        except sqlite3.Error as exc:
            self.close()
            raise StoreError(f"cannot open store {self.path}: {exc}") from None

    def _take_writer_lock(self) -> None:
        lock_path = self.path + ".lock"
        try:
            self._lock_file = open(lock_path, "a+")  # noqa: SIM115 - held for the store's lifetime
        except OSError as exc:
            raise StoreError(f"cannot open store {self.path}: {exc.strerror}") from None
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
            self._db = None
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; when the outermost block returns, its writes are on disk."""
        if self._db.in_transaction:
            yield  # nested: the outermost block commits or rolls back
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- metadata -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def set_meta(self, key: str, value: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

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

    def envelopes(self, author: bytes, after: int = 0, limit: int = -1) -> list[bytes]:
        rows = self._db.execute(
            "SELECT body FROM envelopes WHERE author=? AND seq>? ORDER BY seq LIMIT ?",
            (author, after, limit),
        )
        return [bytes(r[0]) for r in rows]

    def authors(self) -> list[bytes]:
        rows = self._db.execute("SELECT author FROM envelopes UNION SELECT author FROM checkpoints")
        return sorted(bytes(r[0]) for r in rows)

    def delete_after(self, author: bytes, seq: int) -> None:
        """Drop an author's envelopes after `seq` (and a checkpoint beyond it)."""
        self._db.execute("DELETE FROM envelopes WHERE author=? AND seq>?", (author, seq))
        self._db.execute("DELETE FROM checkpoints WHERE author=? AND seq>?", (author, seq))

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
        return sum(
            self._db.execute(f"SELECT COALESCE(SUM(length(data)), 0) FROM {table}").fetchone()[0]
            for table in ("blob_parts", "blobs", "blob_partials")
        )

    def delete_blob(self, hash_: bytes) -> None:
        """Drop a blob, and any partly fetched copy of it."""
        with self.transaction():
            for table in ("blob_parts", "blobs", "blob_partials"):
                self._db.execute(f"DELETE FROM {table} WHERE hash=?", (hash_,))

    # --- blobs being fetched: their first bytes, kept so that a fetch cut short resumes ----------
    def partial_hashes(self) -> list[bytes]:
        rows = self._db.execute("SELECT DISTINCT hash FROM blob_partials ORDER BY hash")
        return [bytes(r[0]) for r in rows]

    def partial_size(self, hash_: bytes) -> int:
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

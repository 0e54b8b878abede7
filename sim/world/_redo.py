"""A world's redo file: the commits of a running twin, one record each, written with one `write()`.

A twin commits about once a second: the window's events, the head it advanced to, the checkpoints it
crossed. As an SQLite transaction that is ~25 µs of locking and WAL frames; as a record appended to
this file, ~1 µs. The store folds the records into its SQLite file in one transaction now and then
(when the file reaches `FOLD_BYTES`, before anything else is written or read from the tables they
touch, and on close); the SQLite file remembers the number of the last record folded (`folded`), so
a record is folded exactly once even if the process dies between the fold's commit and the file's
truncation.

A record is a header (a marker of its format, its payload's length, a CRC-32 of the world id, the
marker and that length, and a CRC-32 of the world id and the payload) and the payload: a small JSON
head (its number, the lengths of its blobs, and what the caller gave to store with them) followed by
the blobs as they are (a twin's segment text and checkpoint states: no escaping, no base64). The
rows in a record carry SHA-256 checksums of their own, checked when they are read from the tables;
the record's CRC-32 finds a torn or damaged record. Records of redo format 1 (a SHA-256 of the world
id and a JSON payload, nothing raw: before the marker) are still read, so a world that an older
simnet left with unfolded commits opens and folds them; a marker of another format is refused,
naming it. A record is durable against a killed process once `append` returns (it is in the
kernel's page cache), and against power loss too if the world was created with `fsync`. A record the
file ends inside, with a sound header or with too few bytes left for one, was being written when its
writer died: it was never acknowledged, and is cut off; so is a tail of zero bytes (blocks a power
loss allocated but never wrote), and a last record whose payload fails its checksum (a power loss
that kept its length, not all its bytes; as SQLite ends its WAL at a bad last frame; logged).
Anything else that fails a check (a header, a record with more after it, a number out of sequence)
is corruption: an error, and the file is left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import sqlite3
import struct
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from .._errors import CorruptLogError, WorldError, WorldFullError

_logger = logging.getLogger(__name__)
FOLD_BYTES = (
    4 << 20
)  # as SQLite's own WAL: folded at about 4 MiB (~900 of a twin's commits; ~17 ms to fold)
_LENGTH = struct.Struct("<Q")
_MARK = b"SIMREDO"  # then the format's number: a record of format 1 has no marker (its bytes 4..7
# are the high bytes of a length under 4 GiB: zeros)
FORMAT = 2
# marker and format, payload length, CRC-32 of world id, marker and length, CRC-32 of world id and
# payload
_HEADER = struct.Struct("<8sQII")
_HEAD_LENGTH = struct.Struct("<I")  # the payload's JSON head, before the blobs
# format 1: payload length, CRC-32 of world id and length, SHA-256 of world id and JSON payload
_HEADER_1 = struct.Struct("<QI32s")


class Record(NamedTuple):
    """A record read back: its number, what was stored with its blobs, and the blobs (None: a record
    of format 1, whose `meta` is its whole JSON payload)."""

    n: int
    meta: Any
    blobs: list[bytes] | None


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def is_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk is full: SQLITE_FULL, or an OSError ENOSPC, EDQUOT or EFBIG."""
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in _FULL


class RedoFile:
    """The redo file beside a world's SQLite file; one writer (the store holds the world's lock).

    `folded` is the number of the last record in the SQLite file, as the SQLite file says; `last`
    the number of the last record written or folded; `unfolded` whether the file may hold records
    after `folded`."""

    def __init__(self, path: Path, world_id: str, *, fsync: bool, folded: int) -> None:
        self.path = path
        self.folded = self.last = folded
        self._salt = world_id.encode()
        # the salt's share of each record's checksums, computed once: a CRC-32 resumes from it (the
        # same value as over salt + bytes)
        self._salt_crc = zlib.crc32(self._salt)
        self._mark = _MARK + bytes([FORMAT])
        self._mark_crc = zlib.crc32(self._mark, self._salt_crc)
        self._fsync = fsync
        try:
            created = not path.exists()
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if (
                fsync and created
            ):  # the file's name must survive power loss too, not only its records
                directory = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
            self.size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise WorldError(f"{path} cannot be opened ({exc})") from None
        self.unfolded = self.size > 0
        # the payloads of the records after `folded`, if this process wrote them all (None: the file
        # holds others): a fold takes them from here, its own bytes, instead of reading and checking
        # the file again (bytes, which the garbage collector does not walk)
        self._kept: list[bytes] | None = None if self.unfolded else []

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unfolded_records(self) -> list[Record]:
        """The records after `folded`, checked, in order (their numbers run on from it); a torn tail
        (its writer died) is cut off the file."""
        if (
            self._kept is not None and len(self._kept) == self.last - self.folded
        ):  # none lost track of
            return [_parsed(payload) for payload in self._kept]
        try:
            data = os.pread(self._fd, self.size, 0)
        except OSError as exc:  # closed after a write it could not undo
            raise WorldError(f"{self.path} cannot be read ({exc}); it is kept as it is") from None
        out: list[Record] = []
        at = 0
        while at < len(data):
            if not any(memoryview(data)[at:]):
                self._cut(at)  # blocks a power loss allocated but never wrote
                break
            found = self._header(data, at)
            if found is None:
                self._cut(at)  # never acknowledged: its writer died in the middle of it
                break
            start, end, sound = found
            if not sound(data[start:end]):
                if end == len(data):  # the last record: see above
                    _logger.warning(
                        "%s: the last commit (byte %d) fails its checksum and is cut off, "
                        "as a torn write (a power loss while it was written)",
                        self.path,
                        at,
                    )
                    self._cut(at)
                    break
                raise CorruptLogError(
                    f"{self.path}: the commit at byte {at} fails its checksum; nothing was applied "
                    f"from it or after it"
                )
            try:
                record = (_parsed if start - at == _HEADER.size else _parsed_1)(data[start:end])
            except (ValueError, TypeError, KeyError, struct.error):
                raise CorruptLogError(
                    f"{self.path}: the commit at byte {at} passes its checksum but cannot be read"
                ) from None
            if out and record.n <= self.folded:
                raise CorruptLogError(
                    f"{self.path}: commit {record.n} comes after commit {out[-1].n}"
                )
            if record.n > self.folded:
                expected = out[-1].n + 1 if out else self.folded + 1
                if record.n != expected:
                    raise CorruptLogError(
                        f"{self.path}: commit {expected} is missing (found {record.n})"
                    )
                out.append(record)
            at = end
        if self.last > (out[-1].n if out else self.folded):  # this process wrote it: not torn
            raise CorruptLogError(
                f"{self.path}: commit {self.last} is missing (the file ends before it)"
            )
        return out

    def _header(self, data: bytes, at: int) -> tuple[int, int, Callable[[bytes], bool]] | None:
        """Where the payload of the record at `at` starts and ends, and its check; None if the file
        ends inside it (torn). CorruptLogError if its header fails its checksum."""
        if at + _HEADER.size > len(data):  # too few bytes left for any header
            return None
        if data[at : at + len(_MARK)] == _MARK:
            mark, length, check, crc = _HEADER.unpack_from(data, at)
            if check != zlib.crc32(_LENGTH.pack(length), zlib.crc32(mark, self._salt_crc)):
                raise self._bad_header(at)
            if mark != self._mark:
                raise CorruptLogError(
                    f"{self.path}: the commit at byte {at} is in redo format {mark[-1]}, which "
                    f"this simnet does not read (it writes format {FORMAT}); open the world with "
                    "the simnet that wrote it, which folds its commits in"
                )
            start = at + _HEADER.size
            return (
                (start, start + length, lambda payload: zlib.crc32(payload, self._salt_crc) == crc)
                if start + length <= len(data)
                else None
            )
        if any(data[at + 4 : at + 8]):  # the high bytes of a format-1 length: a damaged marker
            raise self._bad_header(at)
        if at + _HEADER_1.size > len(data):  # too few bytes left for a header of format 1
            return None
        length, check, digest = _HEADER_1.unpack_from(data, at)
        if check != zlib.crc32(_LENGTH.pack(length), self._salt_crc):
            raise self._bad_header(at)
        start = at + _HEADER_1.size
        return (
            (start, start + length, lambda p: hashlib.sha256(self._salt + p).digest() == digest)
            if start + length <= len(data)
            else None
        )

    def _bad_header(self, at: int) -> CorruptLogError:
        return CorruptLogError(
            f"{self.path}: the header of the commit at byte {at} fails its checksum; nothing was "
            "applied from it or after it"
        )

    def _cut(self, at: int) -> None:
        try:
            os.ftruncate(self._fd, at)
        except OSError as exc:
            raise WorldError(
                f"{self.path}: its torn last commit cannot be cut off ({exc})"
            ) from None
        self.size = at

    def append(self, meta: Any, blobs: Sequence[bytes] = ()) -> None:
        """Write the next record: `meta` (anything JSON holds) and `blobs` (stored as they are);
        when this returns it is durable. If it fails (a full disk, an interrupt), the file is as it
        was, or closed if it cannot be put back (nothing is written after a torn record)."""
        try:
            head = orjson.dumps([self.last + 1, [len(blob) for blob in blobs], meta])
        except TypeError as exc:  # orjson.JSONEncodeError
            raise WorldError(
                f"{self.path}: the commit cannot be stored ({exc}); nothing of it was kept"
            ) from None
        payload = b"".join([_HEAD_LENGTH.pack(len(head)), head, *blobs])
        data = (
            _HEADER.pack(
                self._mark,
                len(payload),
                zlib.crc32(_LENGTH.pack(len(payload)), self._mark_crc),
                zlib.crc32(payload, self._salt_crc),
            )
            + payload
        )
        start, end, number = self.size, self.size + len(data), self.last + 1
        self.unfolded = True  # before the write: at worst a fold finds nothing new
        try:  # an interrupt anywhere in here takes the record back too
            written = os.pwrite(self._fd, data, start)
            self.size, self.last = end, number
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write: the disk is full")
            if self._fsync:
                os.fdatasync(self._fd)
        except BaseException as exc:
            try:
                os.ftruncate(self._fd, start)  # no torn record left before the next one
            except OSError:
                self.close()
                raise WorldError(
                    f"{self.path}: the commit could not be written ({exc}), nor taken back; "
                    "the file is closed, and the commit may be found "
                    "when the world is opened again"
                ) from None
            self.size, self.last = start, number - 1
            if isinstance(exc, OSError):
                raise (WorldFullError if is_full(exc) else WorldError)(
                    f"{self.path}: the commit could not be written ({exc}); nothing of it was kept"
                ) from None
            raise
        if self._kept is not None:
            self._kept.append(payload)

    def folded_to(self, last: int) -> None:
        """The SQLite file now holds every record up to `last`: empty the file (if that fails, the
        next fold skips what is folded)."""
        self.folded = self.last = last
        self.unfolded = False
        self._kept = []
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            self.size = 0


def _parsed(payload: bytes) -> Record:
    """A checked payload of the current format: its JSON head, then its blobs."""
    (length,) = _HEAD_LENGTH.unpack_from(payload)
    n, lengths, meta = orjson.loads(payload[_HEAD_LENGTH.size : _HEAD_LENGTH.size + length])
    blobs, at = [], _HEAD_LENGTH.size + length
    for size in lengths:
        blobs.append(payload[at : at + size])
        at += size
    return Record(n, meta, blobs)


def _parsed_1(payload: bytes) -> Record:
    """A checked payload of format 1: JSON, its number under "n"."""
    record = orjson.loads(payload)
    return Record(record.pop("n"), record, None)

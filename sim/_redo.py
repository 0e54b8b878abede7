"""A world's redo file: the commits of a running twin, one record each, written with one `write()`.

A twin commits about once a second: the window's events, the head it advanced to, the checkpoints it
crossed. As an SQLite transaction that is ~25 µs of locking and WAL frames; as a record appended to this
file, ~1 µs. The store folds the records into its SQLite file in one transaction now and then (when the
file grows past `FOLD_BYTES`, before anything else is written or read from the tables they touch, and
on close); the SQLite file remembers the number of the last record folded, so a record is folded
exactly once even if the process dies between the fold's commit and the file's truncation.

A record is a header (its payload's length, a CRC-32 of that length, and a SHA-256 over the world id
and the payload) and the payload (the rows to insert, as JSON). It is durable against a killed process
once `append` returns (it is in the kernel's page cache), and against power loss too if the world was
created with `fsync`. A record the file ends inside, with a sound header or with too few bytes left for
one, was being written when its writer died: it was never acknowledged, and is cut off. Anything else
that fails a check (a header, or a whole record) is corruption: an error, and the file is left as it is.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

import orjson

from ._errors import CorruptLogError, WorldError

FOLD_BYTES = 4 << 20  # as SQLite's own WAL: folded at about 4 MiB (a few thousand commits; ~30 ms to fold)
_LENGTH = struct.Struct("<Q")
_HEADER = struct.Struct("<QI32s")  # payload length, CRC-32 of that length, SHA-256 of world id and payload


class RedoFile:
    """The redo file beside a world's SQLite file; one writer (the store holds the world's lock)."""

    def __init__(self, path: Path, world_id: str, *, fsync: bool) -> None:
        self.path = path
        self._salt = world_id.encode()
        self._fsync = fsync
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def records(self) -> list[dict]:
        """Every whole record, checked, in order; a torn last record (its writer died) is cut off the file."""
        try:
            data = os.pread(self._fd, self.size, 0)
        except OSError as exc:  # closed after a write it could not undo
            raise WorldError(f"{self.path} cannot be read ({exc}); it is kept as it is") from None
        out, at = [], 0
        while at < len(data):
            if at + _HEADER.size <= len(data):
                length, check, digest = _HEADER.unpack_from(data, at)
                if check != zlib.crc32(_LENGTH.pack(length)):
                    raise CorruptLogError(f"{self.path}: the header of the commit at byte {at} fails its checksum; "
                                          f"nothing was applied from it or after it")
            if at + _HEADER.size > len(data) or at + _HEADER.size + length > len(data):
                os.ftruncate(self._fd, at)  # never acknowledged: its writer died in the middle of it
                self.size = at
                break
            payload = data[at + _HEADER.size:at + _HEADER.size + length]
            if hashlib.sha256(self._salt + payload).digest() != digest:
                raise CorruptLogError(f"{self.path}: the commit at byte {at} fails its checksum; nothing was applied "
                                      f"from it or after it")
            out.append(orjson.loads(payload))
            at += _HEADER.size + length
        return out

    def append(self, record: dict) -> None:
        """Write one record; when this returns it is durable. On failure (a full disk) the file is as it was."""
        payload = orjson.dumps(record)
        data = _HEADER.pack(len(payload), zlib.crc32(_LENGTH.pack(len(payload))),
                            hashlib.sha256(self._salt + payload).digest()) + payload
        try:
            if os.pwrite(self._fd, data, self.size) != len(data):
                raise OSError("short write: the disk is full")
            if self._fsync:
                os.fdatasync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self.size)  # no torn record left before the next one
            except OSError:
                self.close()  # the file may now end in a torn record: nothing more is written to it
            raise WorldError(f"{self.path}: the commit could not be written ({exc}); nothing of it was kept") from None
        self.size += len(data)

    def clear(self) -> None:
        """Empty the file (its records are folded)."""
        os.ftruncate(self._fd, 0)
        self.size = 0

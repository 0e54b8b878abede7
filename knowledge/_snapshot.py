"""Snapshots of a replica's derived state, so a store opens without replaying its history.

A snapshot is derived data, never the record: the envelopes are. Each feed's snapshot holds its
document's encoded state and its bookkeeping (head, clocks, immutable ranges, which envelope last
wrote each key); the views' snapshot holds the merged views, the heads they cover and a digest of
the grants they were judged by. Reopening from them is `_reopen`'s; a snapshot is used only when

- it is intact: each piece's CRC-32 matches, and it was written by this very code (a fingerprint
  of the modules that derive the state, of pycrdt's version and of Python's: another version's
  snapshot is ignored, and the store is replayed once and snapshotted again);
- it matches the envelopes held: the envelope held at the snapshot's seq has the snapshot's head
  hash (a feed cut or replaced since is replayed), and the views cover exactly the feeds' snapshots
  and the grants computed now.

Anything else falls back to replaying the store, so a snapshot can make opening faster but never
change what it shows. Bodies are pickles read by an unpickler that constructs only builtin
containers and record types: a store's bytes cannot run code.

Large binary values (a document's state, the map views' columns) are wrapped in
`pickle.PickleBuffer` and kept out of the pickle, each a piece of its own that the store keeps in
parts of its own: loading hands them to the unpickler where they lie, copied once from SQLite, so
opening a store with ten million map cells reads its columns without copying them around.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import io
import pickle
import struct
import sys
import zlib
from collections import defaultdict
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from ._records import RecordType, Role

FORMAT = b"simnet-snapshot-v2\x00"
_COUNT = struct.Struct(">I")
_PIECE = struct.Struct(">QI")  # a piece's length and CRC-32
# The modules whose code decides what a snapshot holds: a change to any of them invalidates it.
_DERIVING = (
    "_snapshot",
    "_feed",
    "_yjs",
    "_records",
    "_views",
    "_mapview",
    "_mapstate",
    "_cellrows",
    "_recordtext",
    "_tiles",
    "_trust",
    "_policy",
    "_replica",
    "_reopen",
    "_canonical",
    "_envelope",
)
_ALLOWED: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("collections", "defaultdict"): defaultdict,
    (RecordType.__module__, "RecordType"): RecordType,
    (Role.__module__, "Role"): Role,
}


@functools.cache
def fingerprint() -> bytes:
    """What a snapshot's reader must share with its writer: this code, pycrdt, Python."""
    digest = hashlib.sha256(FORMAT)
    digest.update(sys.version.encode())
    try:
        digest.update(metadata.version("pycrdt").encode())
    except metadata.PackageNotFoundError:  # pragma: no cover - pycrdt is a dependency
        digest.update(b"pycrdt?")
    package = __name__.rpartition(".")[0]
    for name in _DERIVING:
        module = importlib.import_module(f"{package}.{name}")
        try:
            digest.update(Path(module.__file__ or "").read_bytes())
        except OSError:  # no source (a frozen install): the distribution's version stands for it
            from ._version import __version__

            digest.update(f"{name}:{__version__}".encode())
    return digest.digest()


def seal(value: Any) -> list[bytes | memoryview]:
    """`value` as the pieces of a snapshot: a head (format, fingerprint, the length and CRC-32 of
    each other piece), its pickle, and each buffer the pickle keeps out of band."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    pieces: list[bytes | memoryview] = [data, *(b.raw() for b in buffers)]
    head = [FORMAT, fingerprint(), _COUNT.pack(len(pieces))]
    head += [_PIECE.pack(len(memoryview(p).cast("B")), zlib.crc32(p)) for p in pieces]
    return [b"".join(head), *pieces]


def unseal(parts: Sequence[bytes] | None, part_bytes: int) -> Any | None:
    """The value sealed in a snapshot stored as `parts` (each piece of `seal` in parts of at most
    `part_bytes`), or None if it is absent, damaged or from other code."""
    if not parts:
        return None
    head, top = parts[0], len(FORMAT) + 32
    if head[: len(FORMAT)] != FORMAT or head[len(FORMAT) : top] != fingerprint():
        return None
    try:
        (count,) = _COUNT.unpack_from(head, top)
        pieces_of = list(_PIECE.iter_unpack(head[top + _COUNT.size :]))
    except struct.error:
        return None
    if not count or len(pieces_of) != count:
        return None
    pieces: list[bytes] = []
    at = 1
    for length, crc in pieces_of:  # a piece takes ceil(length / part_bytes) parts, at least one
        taken = max(1, -(-length // part_bytes))
        within = parts[at : at + taken]
        at += taken
        piece = within[0] if len(within) == 1 else b"".join(within)
        if len(piece) != length or zlib.crc32(piece) != crc:
            return None
        pieces.append(piece)
    if at != len(parts):
        return None
    collecting = gc.isenabled()
    gc.disable()  # many new containers, none garbage: the cyclic collector would only slow it
    try:
        return _Unpickler(io.BytesIO(pieces[0]), buffers=pieces[1:]).load()
    except Exception:  # noqa: BLE001 - whatever is wrong with it, it is not used
        return None
    finally:
        if collecting:
            gc.enable()


class _Unpickler(pickle.Unpickler):
    """Builds builtin values, sets, defaultdicts and record types only."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a snapshot")
        return found

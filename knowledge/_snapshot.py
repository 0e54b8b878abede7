"""Snapshots of a replica's derived state, so a store opens without replaying its history.

A snapshot is derived data, never the record: the envelopes are. Each feed's snapshot holds its
document's encoded state and its bookkeeping (head, clocks, immutable ranges, which envelope last
wrote each key); the views' snapshot holds the merged views, the heads they cover and a digest of
the grants they were judged by. A snapshot is used only when

- it is intact: its checksum matches, and it was written by this very code (a fingerprint of the
  modules that derive the state, of pycrdt's version and of Python's: another version's snapshot is
  ignored, and the store is replayed once and snapshotted again);
- it matches the envelopes held: the envelope held at the snapshot's seq has the snapshot's head
  hash (a feed cut or replaced since is replayed), and the views cover exactly the feeds' snapshots
  and the grants computed now.

Anything else falls back to replaying the store, so a snapshot can make opening faster but never
change what it shows. Bodies are pickles read by an unpickler that constructs only builtin
containers and record types: a store's bytes cannot run code.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import io
import pickle
import sys
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

from ._records import RecordType, Role

FORMAT = b"simnet-snapshot-v1\x00"
# The modules whose code decides what a snapshot holds: a change to any of them invalidates it.
_DERIVING = (
    "_snapshot",
    "_feed",
    "_yjs",
    "_records",
    "_views",
    "_mapview",
    "_tiles",
    "_trust",
    "_policy",
    "_replica",
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


def seal(value: Any) -> bytes:
    """`value` as a snapshot body: format, fingerprint, checksum, pickle."""
    data = pickle.dumps(value, protocol=5)
    return FORMAT + fingerprint() + hashlib.sha256(data).digest() + data


def unseal(body: bytes | None) -> Any | None:
    """The value sealed in `body`, or None if it is absent, damaged or from other code."""
    if body is None:
        return None
    head = len(FORMAT)
    if body[:head] != FORMAT or body[head : head + 32] != fingerprint():
        return None
    checksum, data = body[head + 32 : head + 64], memoryview(body)[head + 64 :]
    if hashlib.sha256(data).digest() != checksum:
        return None
    collecting = gc.isenabled()
    gc.disable()  # many new containers, none garbage: the cyclic collector would only slow it
    try:
        return _Unpickler(io.BytesIO(data)).load()
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

"""The snapshot codec (knowledge._snapshot): pieces split into parts and rejoined where they lie,
and nothing in a store's bytes can run code. Reopening from snapshots: test_reopen.py."""

from __future__ import annotations

import ast
import pickle
import shutil
import struct
import zlib
from pathlib import Path

from knowledge import _snapshot


def test_a_snapshot_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path),))

    data = pickle.dumps(Evil())
    head = _snapshot.FORMAT + _snapshot.fingerprint() + struct.pack(">I", 1)
    forged = [head + struct.pack(">QI", len(data), zlib.crc32(data)), data]
    assert _snapshot.unseal(forged, 1 << 20) is None
    assert tmp_path.exists()


def test_pieces_kept_apart_are_loaded_where_they_lie():
    """A buffer wrapped in a PickleBuffer is a piece of its own, split into parts and rejoined."""
    big, small = bytes(range(256)) * 40, b"xyz"
    value = {"big": pickle.PickleBuffer(big), "small": pickle.PickleBuffer(small), "n": 1}
    pieces = _snapshot.seal(value)
    parts = []
    for piece in pieces:
        piece = bytes(piece)
        parts += [piece[at : at + 1000] for at in range(0, max(len(piece), 1), 1000)]
    loaded = _snapshot.unseal(parts, 1000)
    assert loaded == {"big": big, "small": small, "n": 1}
    assert loaded["small"] is parts[-1]  # one part: the very bytes handed in
    assert _snapshot.unseal(parts[:-1], 1000) is None
    assert _snapshot.unseal(parts + [b""], 1000) is None
    assert _snapshot.unseal(parts[:-1] + [b"xyZ"], 1000) is None
    assert _snapshot.unseal([parts[0][:-1], *parts[1:]], 1000) is None


# Modules the deriving ones import that decide nothing a snapshot holds, each for its reason.
_NOT_DERIVING = {
    "_activation": "activation is derived from the views on every call, never stored",
    "_checking": "checkpoint checks compare envelopes; they store nothing in the views",
    "_clock": "clock readings",
    "_errors": "exception classes",
    "_field": "the field ledger is computed from the views on a call",
    "_hold": "envelopes from the future wait in their own table",
    "_identity": "keys and signatures: what `_envelope` verifies",
    "_models": "the public result types",
    "_own_feed": "what this writer knows of its own feed elsewhere, in its own table",
    "_storage_errors": "exception classes",
    "_store": "the SQLite tables, not what is derived from them",
    "_version": "the distribution's name and version",
    "stats": "statistics for activation and the ledger, computed per call",
}


def _imports(module: str) -> set[str]:
    """The knowledge modules `module` imports relatively."""
    root = Path(_snapshot.__file__).parent
    names: set[str] = set()
    for node in ast.walk(ast.parse((root / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return {name for name in names if (root / f"{name}.py").exists()}


def test_every_module_the_deriving_ones_import_is_fingerprinted_or_said_not_to_derive():
    """A change to a module that shapes the views must invalidate old snapshots: a module the
    derivation reaches is in `_DERIVING`, or named here with why it shapes nothing stored."""
    reached, todo = set(), list(_snapshot._DERIVING)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += _imports(module)
    assert reached - set(_snapshot._DERIVING) == set(_NOT_DERIVING)

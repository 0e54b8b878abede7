"""The snapshot codec (knowledge._snapshot): pieces split into parts and rejoined where they lie,
and nothing in a store's bytes can run code. Reopening from snapshots: test_reopen.py."""

from __future__ import annotations

import pickle
import shutil
import struct
import zlib

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

"""The ingest pipeline's own mechanics: batching never changes the outcome, and careful mode
isolates an update pycrdt refuses (security cases are in test_ingest_security.py)."""

from __future__ import annotations

import base64
import json
import random
import zlib

import numpy as np
import pytest

import knowledge
from knowledge import Identity, TrustPolicy
from knowledge._feed import Feed


@pytest.fixture
def writers():
    keys = [Identity.generate() for _ in range(3)]
    policy = TrustPolicy()
    for key in keys:
        policy = policy.with_root(key.public_key)
    kbs = [knowledge.open(":memory:", key, policy=policy) for key in keys]
    for i, kb in enumerate(kbs):
        skill = kb.skills.publish(f"s{i}", "t")
        for j in range(30):
            kb.maps["m"].observe((j % 7, i), j, 0.5)
            kb.counters.record(skill.id, success=j % 2 == 0)
    yield policy, [e for kb in kbs for e in kb.envelopes_since({}, limit=1000)]
    for kb in kbs:
        kb.close()


def test_any_batching_gives_the_same_knowledge(writers):
    policy, envelopes = writers
    whole = knowledge.open(":memory:", Identity.generate(), policy=policy)
    assert whole.ingest(envelopes).ok
    rng = random.Random(3)
    for _ in range(5):
        pieces = knowledge.open(":memory:", Identity.generate(), policy=policy)
        stream = list(envelopes)
        while stream:
            cut = rng.randint(1, 20)
            pieces.ingest(stream[:cut])
            stream = stream[cut:]
        assert pieces.snapshot() == whole.snapshot()


def test_a_refused_batch_is_redone_one_update_at_a_time(writers, monkeypatch):
    """Inject the fault careful mode exists for: pycrdt refusing a transaction of queued updates."""
    policy, envelopes = writers
    reference = knowledge.open(":memory:", Identity.generate(), policy=policy)
    reference.ingest(envelopes)
    calls = []
    original = Feed.apply_queued

    def refuse_once(self):
        calls.append(self.author)
        if len(calls) == 1:
            raise ValueError("injected: pycrdt refuses this batch")
        return original(self)

    monkeypatch.setattr(Feed, "apply_queued", refuse_once)
    careful = knowledge.open(":memory:", Identity.generate(), policy=policy)
    report = careful.ingest(envelopes)
    assert calls, "the batched path ran first"
    assert report.ok and len(report.accepted) == len(envelopes)
    monkeypatch.undo()
    assert careful.snapshot() == reference.snapshot()
    assert careful.heads() == reference.heads()


# --- tile records a receiver refuses (their checks: test_tiles.py) ------------------------------


def _tile_text(columns=(), **fields) -> str:
    """A tile record of two cells, with some of its columns or fields changed."""
    packed = {
        "idx": ("<u2", [0, 5]),
        "conf": ("<f8", [0.5, 0.9]),
        "hlc": ("<u8", [1, 2]),
        "code": ("<u4", [0, 0]),
        "deleted": ("u1", [0, 0]),
    }
    for name, value in dict(columns).items():
        packed[name] = (packed[name][0], value)
    conf = packed.pop("conf")
    raw = b"".join(np.array(v, dtype).tobytes() for dtype, v in packed.values())
    record = {"v": 1, "hlc": 2, "n": 2, "values": ["wall"]}
    record["cells"] = base64.b64encode(zlib.compress(raw)).decode()
    record["confidence"] = base64.b64encode(np.array(conf[1], conf[0]).tobytes()).decode()
    record.update(fields)
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(
    ("text", "reason", "detail"),
    [
        (_tile_text({"conf": [0.5, float("nan")]}), "invalid_tile", "confidence nan"),
        (_tile_text({"conf": [0.5, float("inf")]}), "invalid_tile", "confidence inf"),
        (_tile_text({"idx": [0, 4096]}), "invalid_tile", "outside the tile"),
        (_tile_text(n=5000), "oversized_tile", "at most 4096 cells"),
        (_tile_text(cells="AAAA"), "invalid_tile", "no base64 of zlib"),
        (_tile_text(n=3), "invalid_tile", "holds 16 bytes, not 3 float64"),
        (_tile_text(hlc=1), "record_clock_ahead", "later than its tile record's"),
        (_tile_text(values="wall"), "invalid_tile", "'values' must be a list"),
    ],
)
def test_a_bad_tile_record_is_refused_with_its_reason_and_changes_nothing(text, reason, detail):
    writer, good_writer = Identity.generate(), Identity.generate()
    policy = TrustPolicy().with_root(writer.public_key).with_root(good_writer.public_key)
    with (
        knowledge.open(":memory:", writer) as bad,
        knowledge.open(":memory:", good_writer) as good,
        knowledge.open(":memory:", Identity.generate(), policy=policy) as site,
    ):
        bad.maps["m"].observe_many([(0, 0)], ["fine"], 0.5)
        bad._replica.write({"tile/m/1,1": text})  # as a writer that skips its own checks
        good.maps["m"].observe_many([(0, 0)], ["other"], 0.5)
        envelopes = bad.envelopes_since({}) + good.envelopes_since({})
        report = site.ingest(envelopes)
        (refused,) = report.rejected
        assert (refused.reason, refused.seq) == (reason, 2)
        assert detail in refused.detail and "tile/m/1,1" in refused.detail
        assert len(report.accepted) == 2  # the other envelopes
        assert site.heads()[writer.public_key_hex].seq == 1
        assert site.maps["m"].region((0, 0), (200, 200)).values.tolist() in (["fine"], ["other"])


def test_a_bulk_write_of_cells_shows_at_a_site_as_at_its_writer():
    """A batch of cell records takes ingest's column path (`PlainCells`); the writer's own view
    took the general one: both show the same cells, named ones and tombstones included."""
    writer = Identity.generate()
    policy = TrustPolicy().with_root(writer.public_key)
    with knowledge.open(":memory:", writer, policy=policy) as kb:
        cells = kb.maps["m"]
        with kb.batch():
            for x in range(150):
                cells.observe((x, x % 3), {"occupied": x % 2 == 0}, 0.25 + x % 3 / 4)
        with kb.batch():
            cells.observe("door", "[" * 70, 0.5)  # a cell named otherwise, a value of brackets
            cells.observe((1, 1), None, 1.0)
            cells.delete((2, 2), 0.75)
        expected = cells.cells(include_deleted=True)
        envelopes = kb.envelopes_since({}, limit=100)
    with knowledge.open(":memory:", Identity.generate(), policy=policy) as site:
        assert site.ingest(envelopes).ok
        assert site.maps["m"].cells(include_deleted=True) == expected
        assert len(expected) == 151

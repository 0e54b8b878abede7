"""The ingest pipeline's own mechanics: batching never changes the outcome, and careful mode
isolates an update pycrdt refuses (security cases are in test_ingest_security.py)."""

from __future__ import annotations

import random

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

"""Tests of knowledge._pages: a pull's page of envelopes bounded by bytes as well as by count.

A peer pulling page after page, each at most `max_bytes` (one envelope larger than that goes alone),
ends with every envelope exactly once, whatever their sizes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import Identity


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4000), min_size=1, max_size=12),
    max_bytes=st.integers(1, 9000),
    limit=st.integers(1, 5),
)
def test_pages_bounded_by_bytes_bring_every_envelope_once(sizes, max_bytes, limit):
    writer = Identity.from_seed(b"\x01" * 32, new=True)
    with knowledge.open(":memory:", writer) as site, knowledge.open(":memory:", writer) as peer:
        for k, size in enumerate(sizes):
            site.skills.publish(f"skill-{k}", "t", description="x" * size)
        everything = site.envelopes_since({}, limit=10_000)
        received: list[bytes] = []
        while page := site.envelopes_since(peer.heads(), limit, max_bytes=max_bytes):
            assert len(page) <= limit
            assert len(page) == 1 or sum(map(len, page[:-1])) < max_bytes  # only the last crosses
            report = peer.ingest(page)
            assert not report.rejected, report.rejected
            received += page
    assert received == everything

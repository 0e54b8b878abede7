"""Blobs on demand, at the seam: `kb.blobs.fetch` over `BlobSource`s (stored first, then each source
in turn, verified by hash), resuming after a source that stopped midway, the store's blob quota, and
garbage collection of the blobs only withdrawn or revoked skills name.

The sources here are plain implementations of the protocol, over bytes in memory; federation's
`PeerBlobSource` over real HTTP is tested in tests/federation/test_blobs.py.
"""

from __future__ import annotations

import hashlib
import logging
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

import knowledge
from knowledge import BlobError, BlobQuotaError, IncomingBlob, Limits, TrustPolicy
from knowledge._store import BLOB_PART

DATA = os.urandom(3 * BLOB_PART + 1234)  # four stored parts, the last one short
DIGEST = hashlib.sha256(DATA).hexdigest()


class Source:
    """Holds some blobs; sends from the offset asked for, in `chunk`-byte writes, and stops with a
    BlobError after `cut` bytes of one answer (a connection that drops)."""

    def __init__(self, name: str, blobs: dict[str, bytes], *, chunk: int = 65536, cut=None):
        self.name, self.blobs, self.chunk, self.cut = name, blobs, chunk, cut
        self.asked: list[int] = []  # the offset of each request
        self.sent = 0

    def fetch_blob(self, blob: IncomingBlob) -> bool:
        data = self.blobs.get(blob.hash)
        self.asked.append(blob.offset)
        if data is None:
            return False
        blob.expect(len(data))
        rest, sent = data[blob.offset :], 0
        for i in range(0, len(rest), self.chunk):
            piece = rest[i : i + self.chunk]
            if self.cut is not None and sent + len(piece) > self.cut:
                piece = piece[: self.cut - sent]
                blob.write(piece)
                self.sent += len(piece)
                self.cut = None  # the next answer goes through
                raise BlobError(f"{self.name}: the connection dropped")
            blob.write(piece)
            sent += len(piece)
            self.sent += len(piece)
        return True


def liar(name: str = "liar") -> Source:
    return Source(name, {DIGEST: DATA[:-1] + bytes([DATA[-1] ^ 1])})


def test_a_stored_blob_is_returned_without_asking_a_source(open_kb):
    kb = open_kb()
    digest = kb.blobs.put(DATA)
    source = Source("peer", {})
    assert kb.blobs.fetch(digest, sources=[source]) == DATA and source.asked == []


def test_sources_are_asked_in_turn_and_a_lying_one_is_skipped_and_reported(open_kb, caplog):
    kb = open_kb()
    absent, lying, honest = Source("absent", {}), liar(), Source("honest", {DIGEST: DATA})
    for source in (absent, lying, honest):
        kb.blobs.add_source(source)
    with caplog.at_level(logging.WARNING, "knowledge"):
        assert kb.blobs.fetch(DIGEST) == DATA
    assert kb.blobs.get(DIGEST) == DATA and DIGEST in kb.blobs
    assert absent.asked == [0] and lying.asked == [0] and honest.asked == [0]
    assert "liar sent bytes that do not hash to it; refused" in caplog.text
    assert kb.blobs.stored_bytes() == len(DATA)  # the lie left nothing behind
    assert kb.blobs.sources == (absent, lying, honest)


def test_a_blob_no_source_has_is_a_one_line_error_naming_each_source(open_kb):
    kb = open_kb()
    with pytest.raises(BlobError, match="not stored here, and there is nowhere to fetch it"):
        kb.blobs.fetch(DIGEST)
    with pytest.raises(BlobError) as caught:
        kb.blobs.fetch(DIGEST, sources=[Source("b", {}), liar("c")])
    message = str(caught.value)
    assert "\n" not in message
    assert "b: does not hold it" in message and "c: sent bytes that do not hash to it" in message
    assert DIGEST not in kb.blobs and kb.blobs.stored_bytes() == 0
    with pytest.raises(knowledge.RecordError, match="64 lowercase hex"):
        kb.blobs.fetch("not-a-hash")


def test_a_fetch_cut_short_resumes_after_the_bytes_that_arrived_even_after_a_reopen(tmp_path):
    me = knowledge.Identity.generate()
    cut = BLOB_PART + 5000  # past one stored part, into the next
    with knowledge.open(tmp_path / "kb.db", me) as kb:
        flaky = Source("flaky", {DIGEST: DATA}, cut=cut)
        with pytest.raises(BlobError, match=f"{cut} bytes are held: fetching again resumes"):
            kb.blobs.fetch(DIGEST, sources=[flaky])
        assert DIGEST not in kb.blobs and kb.blobs.stored_bytes() == cut
    with knowledge.open(tmp_path / "kb.db", me) as kb:  # the process stopped; the bytes stayed
        other = Source("other", {DIGEST: DATA})
        assert kb.blobs.fetch(DIGEST, sources=[other]) == DATA
        assert other.asked == [cut] and other.sent == len(DATA) - cut  # only the rest moved
        assert kb.blobs.stored_bytes() == len(DATA)  # the partial bytes became the blob


def test_a_cut_source_is_followed_by_the_next_which_resumes(open_kb):
    kb = open_kb()
    first, second = Source("first", {DIGEST: DATA}, cut=1000), Source("second", {DIGEST: DATA})
    assert kb.blobs.fetch(DIGEST, sources=[first, second]) == DATA
    assert second.asked == [1000] and first.sent + second.sent == len(DATA)


def test_bad_bytes_held_from_an_earlier_source_do_not_condemn_an_honest_one(open_kb):
    kb = open_kb()
    bad = Source("bad", {DIGEST: bytes(len(DATA))}, cut=BLOB_PART)  # zeros, then it drops
    honest = Source("honest", {DIGEST: DATA})
    assert kb.blobs.fetch(DIGEST, sources=[bad, honest]) == DATA
    assert honest.asked == [BLOB_PART, 0]  # the resumed whole failed its hash: again from byte 0


def test_a_read_only_store_fetches_into_memory_and_keeps_nothing(tmp_path):
    with knowledge.open(tmp_path / "kb.db", knowledge.Identity.generate()):
        pass
    with knowledge.open(tmp_path / "kb.db") as reader:
        flaky = Source("flaky", {DIGEST: DATA}, cut=5000)
        with pytest.raises(BlobError, match="5000 bytes are held"):
            reader.blobs.fetch(DIGEST, sources=[flaky])
        assert reader.blobs.fetch(DIGEST, sources=[flaky]) == DATA  # resumed, in this process
        assert flaky.asked == [0, 5000] and DIGEST not in reader.blobs


def test_the_quota_refuses_a_blob_that_does_not_fit_and_keeps_nothing_of_it(open_kb):
    kb = open_kb(limits=Limits(max_blob_store_bytes=len(DATA) + 100))
    small = kb.blobs.put(b"x" * 200)
    assert kb.blobs.quota == len(DATA) + 100 and kb.blobs.stored_bytes() == 200
    honest, spare = Source("honest", {DIGEST: DATA}), Source("spare", {DIGEST: DATA})
    with pytest.raises(BlobQuotaError, match="does not fit in the store's blob quota: .*free"):
        kb.blobs.fetch(DIGEST, sources=[honest, spare])
    assert honest.sent == 0 and spare.asked == []  # refused before a byte moved; no one else asked
    assert DIGEST not in kb.blobs and kb.blobs.stored_bytes() == 200
    with pytest.raises(BlobQuotaError):
        kb.blobs.put(DATA)
    assert kb.blobs.stored_bytes() == 200
    assert kb.blobs.put(b"x" * 200) == small  # a blob stored already takes no more room
    kb.blobs.set_quota(None)
    assert kb.blobs.fetch(DIGEST, sources=[honest]) == DATA
    with pytest.raises(BlobError, match="number of bytes"):
        kb.blobs.set_quota(-1)


def test_a_source_that_never_says_the_size_is_held_to_the_quota_as_bytes_come(open_kb):
    class Unsized(Source):
        def fetch_blob(self, blob: IncomingBlob) -> bool:
            blob.write(DATA[: BLOB_PART + 10])  # kept: one part is flushed as it comes
            blob.write(DATA[BLOB_PART + 10 :])
            return True

    kb = open_kb(limits=Limits(max_blob_store_bytes=BLOB_PART * 2))
    with pytest.raises(BlobQuotaError):
        kb.blobs.fetch(DIGEST, sources=[Unsized("unsized", {})])
    assert kb.blobs.stored_bytes() == 0  # what was kept before the refusal is gone too


def test_a_source_is_checked_against_the_size_it_states(open_kb):
    class Overlong(Source):
        def fetch_blob(self, blob: IncomingBlob) -> bool:
            blob.expect(10)
            blob.write(b"y" * 11)
            return True

    class Short(Source):
        def fetch_blob(self, blob: IncomingBlob) -> bool:
            blob.expect(len(DATA))
            blob.write(DATA[:100])
            return True

    kb = open_kb()
    with pytest.raises(BlobError) as caught:
        kb.blobs.fetch(DIGEST, sources=[Overlong("long", {}), Short("short", {})])
    assert "more than the 10 bytes it said" in str(caught.value)
    assert f"ended after 100 of {len(DATA)} bytes" in str(caught.value)


def test_one_fetch_per_blob_at_a_time(open_kb):
    import threading

    kb = open_kb()
    started, release = threading.Event(), threading.Event()

    class Slow(Source):
        def fetch_blob(self, blob: IncomingBlob) -> bool:
            started.set()
            release.wait(10)
            return super().fetch_blob(blob)

    slow = Slow("slow", {DIGEST: DATA})
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(kb.blobs.fetch(DIGEST, sources=[slow])))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    started.wait(10)
    release.set()
    for t in threads:
        t.join(10)
    assert results == [DATA] * 3 and slow.asked == [0]  # the others found it stored


def test_setup_is_deferred_until_a_blob_is_stored_or_fetched(open_kb):
    kb = open_kb()
    calls = []

    def setup():
        calls.append(1)
        kb.blobs.add_source(Source("late", {DIGEST: DATA}))
        kb.blobs.set_quota(1 << 30)

    kb.blobs.defer_setup(setup)
    assert DIGEST not in kb.blobs and kb.blobs.list() == [] and calls == []
    assert kb.blobs.fetch(DIGEST) == DATA and calls == [1]
    kb.blobs.put(b"more")
    assert calls == [1] and kb.blobs.quota == 1 << 30
    with pytest.raises(TypeError, match="not a BlobSource"):
        kb.blobs.add_source(object())


def test_garbage_is_what_only_withdrawn_or_revoked_skills_name(open_kb):
    kb = open_kb()
    live, shared, withdrawn, revoked, loose = (
        kb.blobs.put(bytes([i]) * (1000 + i)) for i in range(5)
    )
    kb.skills.publish("live", "pick", blobs=[live, shared])
    gone = kb.skills.publish("withdrawn", "pick", blobs=[withdrawn, shared])
    bad = kb.skills.publish("revoked", "pick", policy={"kind": "mlp", "weights": revoked})
    kb.skills.withdraw(gone.id)
    kb.revoke(bad.id)
    before = kb.blobs.stored_bytes()
    assert kb.blobs.collect_garbage() == {withdrawn: 1002, revoked: 1003}
    assert kb.blobs.stored_bytes() == before - 1002 - 1003
    assert sorted(kb.blobs.list()) == sorted([live, shared, loose])  # a loose blob is kept
    with pytest.raises(BlobError, match="not stored"):
        kb.blobs.get(revoked)
    assert kb.blobs.collect_garbage() == {}


def test_the_files_of_held_tasks_and_certified_tasks_are_never_garbage(open_kb):
    kb = open_kb()
    mesh, certified_mesh, weights = (kb.blobs.put(bytes([i]) * 500) for i in range(3))
    task = {"name": "reach", "assets": {"link.stl": mesh}}
    kb.tasks.publish(task)
    gone = kb.skills.publish(
        "old", "pick", policy={"kind": "mlp", "weights": weights}, blobs=[mesh, certified_mesh]
    )
    other_task = {"name": "push", "assets": {"puck.obj": certified_mesh}}
    record = {"task": {"hash": knowledge.content_hash(other_task), "definition": other_task}}
    kb.certificates.add(gone.id, branches=1, successes=1, evaluation=record)
    kb.revoke(gone.id)  # its blobs are garbage, but for the files the tasks still name
    assert kb.blobs.is_named(mesh) and kb.blobs.is_named(certified_mesh)
    assert not kb.blobs.is_named(weights) and not kb.blobs.is_named(DIGEST)
    assert kb.blobs.collect_garbage() == {weights: 500}
    assert mesh in kb.blobs and certified_mesh in kb.blobs


def test_garbage_collection_drops_the_partial_bytes_no_live_skill_needs(open_kb):
    kb = open_kb()
    wanted = hashlib.sha256(b"wanted").hexdigest()
    kb.skills.publish("live", "pick", blobs=[wanted])
    for blob_hash in (wanted, DIGEST):  # two fetches cut short: a live skill's, and a stray one
        with pytest.raises(BlobError):
            kb.blobs.fetch(blob_hash, sources=[Source("x", {blob_hash: DATA}, cut=777)])
    assert kb.blobs.stored_bytes() == 2 * 777
    assert kb.blobs.collect_garbage(dry_run=True) == {DIGEST: 777}
    assert kb.blobs.collect_garbage() == {DIGEST: 777}
    assert kb.blobs.stored_bytes() == 777  # the live skill's fetch can still resume


def test_a_blob_short_of_room_collects_the_garbage_first(open_kb):
    kb = open_kb(limits=Limits(max_blob_store_bytes=len(DATA) + 1000))
    old = kb.blobs.put(b"o" * 1000)
    replaced = kb.skills.publish("v1", "pick", blobs=[old])
    kb.revoke(replaced.id)  # its weights are garbage now, but kept until room is needed
    kb.blobs.put(b"k" * 400)  # loose: never collected
    assert kb.blobs.stored_bytes() == 1400
    assert kb.blobs.fetch(DIGEST, sources=[Source("honest", {DIGEST: DATA})]) == DATA
    assert old not in kb.blobs and kb.blobs.stored_bytes() == 400 + len(DATA)
    with pytest.raises(BlobQuotaError):  # nothing left to collect: refused as before
        kb.blobs.put(b"n" * 2000)
    stale = kb.blobs.put(b"s" * 500)  # fits: 600 bytes were free
    gone = kb.skills.publish("v2", "pick", blobs=[stale])
    kb.skills.withdraw(gone.id)
    assert kb.blobs.put(b"p" * 550) and stale not in kb.blobs  # put collects too


def test_a_store_of_an_earlier_version_opened_read_only_counts_its_blobs(tmp_path):
    """Such a store has no table of partly fetched blobs (only a writer creates it)."""
    import sqlite3

    with knowledge.open(tmp_path / "kb.db", knowledge.Identity.generate()) as kb:
        kb.blobs.put(b"old" * 100)
    with sqlite3.connect(tmp_path / "kb.db") as db:
        db.execute("DROP TABLE blob_partials")
    with knowledge.open(tmp_path / "kb.db") as reader:
        assert reader.blobs.stored_bytes() == 300
        assert reader.blobs.collect_garbage(dry_run=True) == {}


def test_garbage_collection_needs_a_writable_store(tmp_path):
    with knowledge.open(tmp_path / "kb.db", knowledge.Identity.generate()):
        pass
    with knowledge.open(tmp_path / "kb.db") as reader, pytest.raises(knowledge.SimnetError):
        reader.blobs.collect_garbage()


def test_garbage_follows_the_views_of_trusted_writers(open_kb):
    """A revocation only counts from a writer trusted to revoke: another site's blob stays."""
    a, b = open_kb("a"), open_kb("b")
    b.set_policy(TrustPolicy().with_root(a.identity.public_key, ["publish"]))
    weights = a.blobs.put(b"w" * 100)
    skill = a.skills.publish("s", "pick", blobs=[weights])
    b.ingest(a.envelopes_since({}))
    b.blobs.put(b"w" * 100)
    assert b.blobs.collect_garbage() == {}
    b.revoke(skill.id)  # b's own revocation counts for b
    assert b.blobs.collect_garbage() == {weights: 100}


@given(
    data=st.binary(min_size=1, max_size=3 * BLOB_PART),
    cuts=st.lists(st.integers(min_value=0, max_value=3 * BLOB_PART), max_size=4),
    chunk=st.integers(min_value=997, max_value=BLOB_PART + 7),
)
def test_any_sequence_of_cuts_moves_each_byte_once_and_assembles_the_blob(
    open_kb, data, cuts, chunk
):
    """However a blob's answers are chunked and cut, every byte crosses once and the blob comes out
    whole: what a cut answer delivered is never asked for again."""
    kb = open_kb(os.urandom(8).hex())
    digest = hashlib.sha256(data).hexdigest()
    sources = [
        Source(f"s{i}", {digest: data}, chunk=chunk, cut=c % len(data)) for i, c in enumerate(cuts)
    ]
    sources.append(Source("last", {digest: data}, chunk=chunk))
    assert kb.blobs.fetch(digest, sources=sources) == data
    assert sum(s.sent for s in sources) == len(data)
    assert kb.blobs.stored_bytes() == len(data)


def test_is_named_follows_every_change_of_what_names_a_blob(open_kb):
    """`is_named` keeps the names it walked until a record that can change them arrives: asked
    after each change, from this writer and from a peer, it answers as a fresh walk does."""
    kb, peer = open_kb("site"), open_kb("peer")
    kb.set_policy(
        TrustPolicy().with_root(kb.identity.public_key).with_root(peer.identity.public_key)
    )
    weights, mesh, asset, theirs = (kb.blobs.put(bytes([i]) * 700) for i in range(4))
    assert not any(kb.blobs.is_named(b) for b in (weights, mesh, asset, theirs))
    skill = kb.skills.publish("arm", "pick", policy={"kind": "mlp", "weights": weights})
    assert kb.blobs.is_named(weights) and not kb.blobs.is_named(mesh)
    kb.tasks.publish({"name": "reach", "assets": {"link.stl": mesh}})
    assert kb.blobs.is_named(mesh) and not kb.blobs.is_named(asset)
    task = {"name": "push", "assets": {"puck.obj": asset}}
    record = {"task": {"hash": knowledge.content_hash(task), "definition": task}}
    kb.certificates.add(skill.id, branches=1, successes=1, evaluation=record)
    assert kb.blobs.is_named(asset)
    kb.revoke(skill.id)
    assert not kb.blobs.is_named(weights) and kb.blobs.is_named(asset)
    peer.skills.publish("theirs", "pick", blobs=[theirs])
    kb.ingest(peer.envelopes_since(kb.heads()))
    assert kb.blobs.is_named(theirs)

"""Unit tests for knowledge._store: the SQLite store (WAL, synchronous commits, one writer
process)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import knowledge
from knowledge import Identity, NotAuthorizedError, StoreError, StoreLockedError
from knowledge._store import MEMORY, Store

REPO = Path(__file__).resolve().parents[2]

CHILD_WRITER = """
import sys, knowledge
path, keyfile = sys.argv[1], sys.argv[2]
try:
    kb = knowledge.open(path, knowledge.Identity.load(keyfile))
except knowledge.StoreLockedError as exc:
    print("LOCKED:", exc)
    sys.exit(3)
kb.skills.publish("from-child", "pick")
kb.close()
print("WROTE")
"""

CHILD_READER = """
import sys, knowledge
kb = knowledge.open(sys.argv[1])
print(sorted(s.name for s in kb.skills.list()))
kb.close()
"""


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def plain_connection(path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


@pytest.fixture
def keyfile(tmp_path):
    identity = Identity.generate()
    path = tmp_path / "site.key"
    identity.save(path)
    return path, identity


# --- durability settings ------------------------------------------------------------------------


def test_store_file_is_in_wal_mode_with_synchronous_full(tmp_path):
    path = tmp_path / "site.db"
    kb = knowledge.open(path, Identity.generate())
    try:
        kb.skills.publish("a", "t")
        assert kb._replica.store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert kb._replica.store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        with plain_connection(
            path
        ) as other:  # WAL is a property of the file, seen by any connection
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        kb.close()


def test_acknowledged_write_is_visible_to_another_connection_at_once(tmp_path):
    path = tmp_path / "site.db"
    kb = knowledge.open(path, Identity.generate())
    try:
        kb.skills.publish("a", "t")
        kb.maps["m"].observe((1, 2), "x", 0.5)
        other = plain_connection(path)
        try:
            assert other.execute("SELECT COUNT(*) FROM envelopes").fetchone()[0] == 2
        finally:
            other.close()
    finally:
        kb.close()


def test_reopen_restores_everything(tmp_path):
    path = tmp_path / "site.db"
    identity = Identity.generate()
    with knowledge.open(path, identity) as kb:
        skill = kb.skills.publish("a", "t")
        kb.counters.record(skill.id, success=True)
        before = (kb.snapshot(), kb.heads())
    with knowledge.open(path, identity) as kb:
        assert (kb.snapshot(), kb.heads()) == before


# --- one writer process -------------------------------------------------------------------------


def test_second_writer_in_another_process_is_locked_out_until_close(tmp_path, keyfile):
    path = tmp_path / "site.db"
    key_path, identity = keyfile
    kb = knowledge.open(path, identity)
    kb.skills.publish("from-parent", "pick")
    child = run_child(CHILD_WRITER, str(path), str(key_path))
    assert child.returncode == 3, child.stdout + child.stderr
    assert "LOCKED:" in child.stdout and str(path) in child.stdout
    kb.close()
    child = run_child(CHILD_WRITER, str(path), str(key_path))
    assert child.returncode == 0, child.stdout + child.stderr
    assert "WROTE" in child.stdout
    with knowledge.open(path, identity) as kb:
        assert sorted(s.name for s in kb.skills.list()) == ["from-child", "from-parent"]


def test_second_writer_in_the_same_process_is_locked_out(tmp_path):
    path = tmp_path / "site.db"
    identity = Identity.generate()
    first = knowledge.open(path, identity)
    try:
        with pytest.raises(StoreLockedError) as info:
            knowledge.open(path, identity)
        assert str(path) in str(info.value)
        assert "read-only" in str(info.value)  # says what to do instead
    finally:
        first.close()
    knowledge.open(path, identity).close()


def test_store_locked_error_is_a_store_error():
    assert issubclass(StoreLockedError, StoreError)


def test_lock_is_released_when_the_writer_process_dies(tmp_path, keyfile):
    path = tmp_path / "site.db"
    key_path, identity = keyfile
    code = CHILD_WRITER.replace("kb.close()\n", "import os; os._exit(0)\n")
    child = run_child(code, str(path), str(key_path))
    assert child.returncode == 0, child.stderr
    with knowledge.open(path, identity) as kb:
        assert [s.name for s in kb.skills.list()] == ["from-child"]


# --- readers ------------------------------------------------------------------------------------


def test_read_only_open_works_alongside_a_writer(tmp_path):
    path = tmp_path / "site.db"
    writer = knowledge.open(path, Identity.generate())
    try:
        skill = writer.skills.publish("a", "t")
        reader = knowledge.open(path)
        try:
            assert reader.identity is None
            assert [s.id for s in reader.skills.list()] == [skill.id]
            assert reader.heads() == writer.heads()
            writer.skills.publish("b", "t")  # the writer keeps writing while a reader is open
            second_reader = knowledge.open(path)
            assert len(second_reader.skills.list()) == 2
            second_reader.close()
        finally:
            reader.close()
    finally:
        writer.close()


def test_read_only_open_in_another_process_alongside_a_writer(tmp_path):
    path = tmp_path / "site.db"
    writer = knowledge.open(path, Identity.generate())
    try:
        writer.skills.publish("a", "t")
        child = run_child(CHILD_READER, str(path))
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "['a']"
    finally:
        writer.close()


def test_read_only_refuses_every_write(tmp_path):
    path = tmp_path / "site.db"
    with knowledge.open(path, Identity.generate()) as writer:
        skill = writer.skills.publish("a", "t")
        envelopes = writer.envelopes_since({})
    reader = knowledge.open(path)
    try:
        before = (reader.snapshot(), reader.heads())
        attempts = [
            lambda: reader.skills.publish("b", "t"),
            lambda: reader.skills.withdraw(skill.id),
            lambda: reader.maps["m"].observe((1, 1), "x", 0.5),
            lambda: reader.maps["m"].delete((1, 1), 0.5),
            lambda: reader.counters.record(skill.id, success=True),
            lambda: reader.certificates.add(skill.id, branches=64, successes=64),
            lambda: reader.revoke(skill.id, "no"),
            lambda: reader.delegate(Identity.generate().public_key, ["publish"]),
            lambda: reader.revoke_key(Identity.generate().public_key, 0),
            lambda: reader.ingest(envelopes),
            lambda: reader.blobs.put(b"weights"),
            lambda: reader.checkpoint(),
        ]
        for attempt in attempts:
            with pytest.raises(NotAuthorizedError) as info:
                attempt()
            assert "read-only" in str(info.value)
        assert (reader.snapshot(), reader.heads()) == before
    finally:
        reader.close()
    with plain_connection(path) as other:
        assert other.execute("SELECT COUNT(*) FROM envelopes").fetchone()[0] == 1
        assert other.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


def test_read_only_open_of_a_missing_store(tmp_path):
    path = tmp_path / "missing.db"
    with pytest.raises(StoreError) as info:
        knowledge.open(path)
    assert str(path) in str(info.value)
    assert not path.exists()


# --- identity binding ---------------------------------------------------------------------------


def test_store_is_bound_to_its_identity(tmp_path):
    path = tmp_path / "site.db"
    owner, stranger = Identity.generate(), Identity.generate()
    knowledge.open(path, owner).close()
    with pytest.raises(StoreError) as info:
        knowledge.open(path, stranger)
    assert not isinstance(info.value, StoreLockedError)
    assert str(path) in str(info.value)
    assert stranger.key_id in str(info.value)
    # The failed open released the writer lock: the owner can open it again.
    with knowledge.open(path, owner) as kb:
        kb.skills.publish("still mine", "t")


def test_wrong_identity_message_names_the_owner_by_key_id(tmp_path):
    """The message should name both keys the same way (key_id), so a human can compare them."""
    path = tmp_path / "site.db"
    owner, stranger = Identity.generate(), Identity.generate()
    knowledge.open(path, owner).close()
    with pytest.raises(StoreError) as info:
        knowledge.open(path, stranger)
    assert owner.key_id in str(info.value)


# --- opening failures ---------------------------------------------------------------------------


def test_not_a_database_is_a_store_error_and_releases_the_lock(tmp_path):
    path = tmp_path / "site.db"
    path.write_bytes(b"this is not an sqlite database, just some text" * 100)
    identity = Identity.generate()
    with pytest.raises(StoreError) as info:
        knowledge.open(path, identity)
    assert not isinstance(info.value, StoreLockedError)
    assert str(path) in str(info.value)
    with pytest.raises(StoreError) as info:  # again: not "locked", the lock was released
        knowledge.open(path, identity)
    assert not isinstance(info.value, StoreLockedError)


def test_missing_directory_is_a_store_error(tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "site.db"
    with pytest.raises(StoreError) as info:
        knowledge.open(path, Identity.generate())
    assert str(path) in str(info.value)


# --- transactions -------------------------------------------------------------------------------


def test_transaction_commits_on_return(tmp_path):
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        with store.transaction():
            store.set_meta("k", b"v")
        with plain_connection(path) as other:
            assert other.execute("SELECT value FROM meta WHERE key='k'").fetchone()[0] == b"v"
    finally:
        store.close()


def test_transaction_rolls_back_on_error(tmp_path):
    store = Store(tmp_path / "s.db")
    try:
        with pytest.raises(RuntimeError), store.transaction():
            store.set_meta("k", b"v")
            store.add_envelope(b"a" * 32, 1, b"h" * 32, b"body")
            raise RuntimeError("boom")
        assert store.get_meta("k") is None
        assert store.count_envelopes() == 0
    finally:
        store.close()


def test_nested_transaction_commits_only_with_the_outermost(tmp_path):
    path = tmp_path / "s.db"
    store = Store(path)
    other = plain_connection(path)
    try:
        with store.transaction():
            store.set_meta("outer", b"1")
            with store.transaction():
                store.set_meta("inner", b"2")
            # The inner block returned, but nothing is committed until the outer block does.
            assert (
                other.execute(
                    "SELECT COUNT(*) FROM meta WHERE key IN ('outer','inner')"
                ).fetchone()[0]
                == 0
            )
            assert store.get_meta("inner") == b"2"  # visible inside the transaction
        assert (
            other.execute("SELECT COUNT(*) FROM meta WHERE key IN ('outer','inner')").fetchone()[0]
            == 2
        )
    finally:
        other.close()
        store.close()


def test_nested_transaction_error_rolls_back_everything(tmp_path):
    store = Store(tmp_path / "s.db")
    try:
        with pytest.raises(ValueError), store.transaction():
            store.set_meta("outer", b"1")
            with store.transaction():
                store.set_meta("inner", b"2")
                raise ValueError("inner fails")
        assert store.get_meta("outer") is None and store.get_meta("inner") is None
        with store.transaction():  # the store is usable afterwards
            store.set_meta("after", b"3")
        assert store.get_meta("after") == b"3"
    finally:
        store.close()


def test_outer_error_rolls_back_a_completed_inner_block(tmp_path):
    store = Store(tmp_path / "s.db")
    try:
        with pytest.raises(KeyError), store.transaction():
            with store.transaction():
                store.set_meta("inner", b"2")
            raise KeyError("outer fails after the inner block")
        assert store.get_meta("inner") is None
    finally:
        store.close()


# --- the store's tables -------------------------------------------------------------------------


@pytest.fixture
def store():
    s = Store(MEMORY)
    yield s
    s.close()


def test_envelopes_table(store):
    a, b = b"a" * 32, b"b" * 32
    with store.transaction():
        for seq in (1, 2, 3):
            store.add_envelope(a, seq, bytes([seq]) * 32, b"body%d" % seq)
        store.add_envelope(b, 1, b"x" * 32, b"b1")
    assert store.envelope(a, 2) == b"body2"
    assert store.envelope(a, 4) is None
    assert store.envelope_hash(a, 3) == b"\x03" * 32
    assert store.envelope_hash(b, 2) is None
    assert store.envelopes(a) == [b"body1", b"body2", b"body3"]
    assert store.envelopes(a, after=1) == [b"body2", b"body3"]
    assert store.envelopes(a, after=1, limit=1) == [b"body2"]
    assert store.authors() == [a, b]
    assert store.count_envelopes() == 4
    with pytest.raises(sqlite3.IntegrityError):  # one envelope per (author, seq)
        store.add_envelope(a, 2, b"z" * 32, b"other")
    with store.transaction():
        store.delete_after(a, 1)
    assert store.envelopes(a) == [b"body1"]
    assert store.count_envelopes() == 2


def test_checkpoints_table(store):
    a = b"a" * 32
    assert store.checkpoint(a) is None
    with store.transaction():
        store.put_checkpoint(a, 5, b"cp5")
        store.put_checkpoint(a, 9, b"cp9")  # one checkpoint per author: the newest replaces
    assert store.checkpoint(a) == (9, b"cp9")
    assert store.authors() == [a]  # an author known only by its checkpoint is still an author
    with store.transaction():
        store.delete_after(a, 9)
    assert store.checkpoint(a) == (9, b"cp9")
    with store.transaction():
        store.delete_after(a, 8)
    assert store.checkpoint(a) is None


def test_blobs_table(store):
    with store.transaction():
        store.put_blob(b"h" * 32, b"data")
        store.put_blob(b"h" * 32, b"ignored")  # content-addressed: stored once
    assert store.blob(b"h" * 32) == b"data"
    assert store.has_blob(b"h" * 32) and not store.has_blob(b"i" * 32)
    assert store.blob(b"i" * 32) is None


def test_equivocations_table(store):
    a = b"a" * 32
    with store.transaction():
        store.add_equivocation(a, 3, b"first", b"second")
        store.add_equivocation(a, 3, b"first", b"third")  # evidence for (author, seq) is kept once
    assert store.equivocations() == [(a, 3, b"first", b"second")]


def test_meta_table(store):
    assert store.get_meta("x") is None
    with store.transaction():
        store.set_meta("x", b"1")
        store.set_meta("x", b"2")
    assert store.get_meta("x") == b"2"


def test_close_is_idempotent(tmp_path):
    s = Store(tmp_path / "s.db")
    s.close()
    s.close()

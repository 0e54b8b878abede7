"""Unit tests for knowledge._store: the SQLite store (WAL, synchronous commits, one writer
process)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import knowledge
from knowledge import (
    Identity,
    NotAuthorizedError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreReadOnlyError,
    TrustPolicy,
)
from knowledge._store import MEMORY, Store

REPO = Path(__file__).resolve().parents[2]

CHILD_WRITER = """
import sys, knowledge
path, keyfile = sys.argv[1], sys.argv[2]
try:
    kb = knowledge.open(path, knowledge.Identity.load(keyfile, new=True))
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
    assert str(info.value) == (
        f"cannot open the store {path}: its folder {path.parent} does not exist"
    )
    assert not (tmp_path / "no").exists()


# --- disks that refuse writes: read-only, full ------------------------------------------------


def names(kb) -> list[str]:
    return sorted(s.name for s in kb.skills.list())


def test_a_read_only_store_file_is_read_and_refuses_a_writer(tmp_path, read_only):
    path = tmp_path / "site.db"
    identity = Identity.generate()
    with knowledge.open(path, identity) as kb:
        kb.skills.publish("kept", "pick")
    read_only(path)
    with pytest.raises(StoreReadOnlyError) as info:
        knowledge.open(path, identity)
    assert str(info.value) == (
        f"cannot write the store {path}: the file {path} is read-only "
        "(it can still be opened read-only)"
    )
    with knowledge.open(path) as reader:  # reading needs no write access
        assert names(reader) == ["kept"]


def test_a_store_in_a_read_only_folder_is_read_and_refuses_writers(tmp_path, read_only):
    """SQLite cannot create the write-ahead log's files in the folder: a writer is refused, naming
    the folder; a reader opens the file immutable (no writer can have it open) and reads it."""
    folder = tmp_path / "site"
    folder.mkdir()
    path, identity = folder / "site.db", Identity.generate()
    with knowledge.open(path, identity) as kb:
        kb.skills.publish("kept", "pick")
    files = sorted(folder.iterdir())
    read_only(folder)
    expected = re.escape(f"its folder {folder} is read-only")
    for store in (path, folder / "new.db"):  # an existing store, a new one
        with pytest.raises(StoreReadOnlyError, match=expected):
            knowledge.open(store, identity)
    with knowledge.open(path) as reader:
        assert names(reader) == ["kept"]
    assert sorted(folder.iterdir()) == files  # nothing created, nothing changed


READ_ONLY_MOUNT = """
import subprocess, sys
from pathlib import Path
import knowledge
path, identity = Path(sys.argv[1]) / "site.db", knowledge.Identity.generate()
with knowledge.open(path, identity) as kb:
    kb.skills.publish("kept", "pick")
subprocess.run(["mount", "-o", "remount,ro", sys.argv[1]], check=True)
try:
    knowledge.open(path, identity)
except knowledge.StoreReadOnlyError as exc:
    print(exc)
with knowledge.open(path) as reader:
    print(sorted(s.name for s in reader.skills.list()))
"""


def test_a_store_on_a_read_only_file_system_is_read_and_refuses_a_writer(small_disk):
    done = small_disk(READ_ONLY_MOUNT)
    assert done.returncode == 0, done.stderr
    refused, listed = done.stdout.splitlines()
    assert refused.startswith("cannot write the store ") and "mounted read-only" in refused
    assert listed == "['kept']"


def limit_pages(kb, extra: int | None = 0) -> None:
    """A full disk as SQLite sees it: no page beyond the file's current size (None: no limit)."""
    db = kb._replica.store._db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {1 << 30 if extra is None else pages + extra}")


def test_a_full_store_keeps_what_it_acknowledged_and_writes_again_once_there_is_space(tmp_path):
    """SQLITE_FULL for real (the store may not grow): every kind of write is refused with
    StoreFullError naming the store, changes nothing on disk or in memory, and succeeds as it is
    once there is space; reopened, the store holds exactly what was acknowledged."""
    path, identity, peer = tmp_path / "site.db", Identity.generate(), Identity.generate()
    remote = knowledge.open(":memory:", peer)
    for i in range(20):
        remote.skills.publish(f"remote-{i}", "pick", description="r" * 3000)
    kb = knowledge.open(path, identity, policy=TrustPolicy().with_root(peer.public_key))
    kept = kb.skills.publish("kept", "pick")
    weights = os.urandom(300_000)
    writes = {
        "publish": lambda: kb.skills.publish("big", "pick", description="x" * 3900),
        "blob": lambda: kb.blobs.put(weights),
        "ingest": lambda: kb.ingest(remote.envelopes_since({})),
    }
    limit_pages(kb)
    before = (kb.heads(), kb.snapshot(), names(kb))
    for what, write in writes.items():
        with pytest.raises(StoreFullError) as info:
            write()
        assert str(info.value).startswith(f"cannot write the store {path}: the disk is full"), what
        assert isinstance(info.value, StoreError)
        assert (kb.heads(), kb.snapshot(), names(kb)) == before, what
    assert kb.blobs.size(knowledge.sha256_hex(weights)) is None
    assert not kb._replica.store._db.in_transaction
    limit_pages(kb, None)  # space again: the same writes go through
    for write in writes.values():
        write()
    acknowledged = (kb.heads(), names(kb))
    kb.close()
    with knowledge.open(path) as reader:
        assert (reader.heads(), names(reader)) == acknowledged
        assert len(names(reader)) == 22 and kept.name in names(reader)
        assert reader.blobs.get(knowledge.sha256_hex(weights)) == weights


def test_a_full_disk_rolls_back_the_whole_transaction(tmp_path):
    """Statements before the one the disk refused are taken back too: nothing of it is kept, and no
    transaction is left open for the next write to join."""
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StoreFullError), store.transaction():
            store.set_meta("small", b"v")  # fits in a page the file has
            store.put_blob(b"h" * 32, b"x" * 100_000)  # does not
        assert not store._db.in_transaction and store.get_meta("small") is None
        store._db.execute("PRAGMA max_page_count = 1073741823")
        with store.transaction():
            store.set_meta("after", b"w")
        with plain_connection(path) as other:
            rows = other.execute("SELECT key FROM meta").fetchall()
            assert ("after",) in rows and ("small",) not in rows
    finally:
        store.close()


FULL_DISK = """
import os, sys
from pathlib import Path
import knowledge
disk = Path(sys.argv[1])
path, identity = disk / "site.db", knowledge.Identity.generate()
kb = knowledge.open(path, identity)
kept = kb.skills.publish("kept", "pick")
fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT)
try:
    while True:  # fill the disk
        os.write(fd, bytes(4096))
except OSError as exc:
    print("ballast:", exc.strerror)
os.close(fd)
before = kb.heads()
for write in (
    lambda: kb.skills.publish("lost", "pick", description="x" * 3900),
    lambda: kb.blobs.put(os.urandom(300_000)),
):
    try:
        write()
        print("written on a full disk")
    except knowledge.StoreFullError as exc:
        print(exc)
assert kb.heads() == before and [s.name for s in kb.skills.list()] == ["kept"]
(disk / "ballast").unlink()  # space again
kb.skills.publish("after", "pick", description="x" * 3900)
kb.close()
with knowledge.open(path) as reader:
    print(sorted(s.name for s in reader.skills.list()))
"""


def test_a_full_file_system_for_real(small_disk):
    """A tmpfs filled to the last byte (ENOSPC under SQLite): StoreFullError, nothing acknowledged
    lost, and writes go on once a file is removed."""
    done = small_disk(FULL_DISK, size_kb=2048)
    assert done.returncode == 0, done.stderr
    ballast, *refused, listed = done.stdout.splitlines()
    assert ballast == "ballast: No space left on device"
    assert len(refused) == 2 and all(
        line.startswith("cannot write the store ") and "the disk is full" in line
        for line in refused
    ), refused
    assert listed == "['after', 'kept']"


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

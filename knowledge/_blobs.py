"""Blobs on demand: fetching the blobs a knowledge base lacks, and letting go of the ones nothing
held needs (no live skill's weights, no task's scene assets).

Knowledge defines the seam and other packages fill it: a `BlobSource` is a place to fetch blobs
from (federation's `PeerBlobSource` is one peer over HTTP). `kb.blobs.fetch` tries what is stored,
then each source in turn. A source writes the bytes into an `IncomingBlob`, which keeps them as they
come (in the store, a part at a time, when the store is writable; in memory otherwise) so that a
fetch cut short resumes where it stopped, from the same source or another: a blob is addressed by
its content, so any honest source sends the same bytes. Nothing counts until the whole hashes to the
blob's name; bytes that do not are dropped and the source is reported, and the next one is asked.

The store's blob quota (`Limits.max_blob_store_bytes`) counts every stored byte of every blob,
partly fetched ones too. A blob that would not fit first makes room by collecting the garbage (the
blobs only withdrawn or revoked skills name: `collect_garbage`); if it still does not fit it is
refused (`BlobQuotaError`) before any of its bytes are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

from ._errors import BlobError, BlobQuotaError, SimnetError
from ._records import RecordType, check_skill_id, task_assets
from ._replica import Replica
from ._store import BLOB_PART

log = logging.getLogger("knowledge")


@runtime_checkable
class BlobSource(Protocol):
    """A place to fetch blobs from; `name` says which in messages.

    `fetch_blob(blob)` writes the bytes of `blob.hash` from `blob.offset` on into `blob` (saying
    the blob's whole size with `blob.expect` first, when it knows it) and returns True, or returns
    False when it has no such blob. When it fails midway it raises a `SimnetError`: the bytes
    written stay, and the next attempt resumes after them. A source that can only send the blob
    from its first byte calls `blob.restart()` first. It lets the `BlobError`s of `blob` propagate.
    """

    name: str

    def fetch_blob(self, blob: IncomingBlob) -> bool: ...


class _Held:
    """Where an incoming blob's bytes are kept: the store's partial-blob table, or memory (a store
    opened read-only, which keeps nothing)."""

    def __init__(self, replica: Replica, blob_hash: str, memory: dict[str, bytearray]) -> None:
        self.replica, self.hash, self.key = replica, blob_hash, bytes.fromhex(blob_hash)
        writable = replica.identity is not None and not replica.store.readonly
        self.memory = None if writable else memory.setdefault(blob_hash, bytearray())

    def size(self) -> int:
        if self.memory is not None:
            return len(self.memory)
        with self.replica.lock:
            return self.replica.store.partial_size(self.key)

    def keep(self, start: int, data: bytes) -> None:
        if self.memory is not None:
            self.memory += data
            return
        with self.replica.lock:
            self.replica.store.add_partial(self.key, start, data)

    def read(self) -> bytes | None:
        if self.memory is not None:
            return bytes(self.memory)
        with self.replica.lock:
            return self.replica.store.partial_blob(self.key)

    def drop(self) -> None:
        if self.memory is not None:
            self.memory.clear()
            return
        with self.replica.lock:
            self.replica.store.drop_partial(self.key)


class IncomingBlob:
    """A blob being fetched: a `BlobSource` writes its bytes here, in order, from `offset` on.

    Bytes are kept a store part at a time as they come (and the rest when the source stops), so a
    fetch cut short resumes after the last byte that arrived. `expect` and `write` refuse a blob
    over the size limit (`BlobError`) or one that would not fit in the store's quota
    (`BlobQuotaError`: nothing of it is kept), before keeping its bytes.
    """

    def __init__(self, held: _Held, *, max_bytes: int, room: int | None) -> None:
        self.hash = held.hash
        self.size: int | None = None  # the whole blob's length, once the source has said it
        self.received = 0  # bytes written in this attempt
        self.refused: BlobQuotaError | None = None
        self._held, self._max, self._room = held, max_bytes, room
        self._kept = held.size()
        self._buffer = bytearray()

    @property
    def offset(self) -> int:
        """Bytes held so far: what a source sends next is the blob from this byte on."""
        return self._kept + len(self._buffer)

    def expect(self, size: int) -> None:
        """The blob's whole length as the source states it (checked against what arrives)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BlobError(f"blob {self.hash[:16]}…: {size!r} is not a size")
        if size < self.offset:
            raise BlobError(
                f"blob {self.hash[:16]}…: the source says it has {size} bytes; "
                f"{self.offset} are held already"
            )
        self._check(size)
        self.size = size

    def write(self, data: bytes) -> None:
        """The next bytes of the blob."""
        end = self.offset + len(data)
        if self.size is not None and end > self.size:
            raise BlobError(
                f"blob {self.hash[:16]}…: the source sent more than the {self.size} bytes it said"
            )
        self._check(end)
        self._buffer += data
        self.received += len(data)
        if len(self._buffer) >= BLOB_PART:
            self.flush()

    def restart(self) -> None:
        """Forget the bytes held: the source sends the blob from its first byte."""
        self._buffer.clear()
        self._held.drop()
        self._kept = 0

    def flush(self) -> None:
        """Keep the bytes written so far (a fetch that stops here resumes after them)."""
        if self._buffer:
            self._held.keep(self._kept, bytes(self._buffer))
            self._kept += len(self._buffer)
            self._buffer.clear()

    def _check(self, size: int) -> None:
        if size > self._max:
            raise BlobError(
                f"blob {self.hash[:16]}… of {size} bytes exceeds the limit of {self._max}"
            )
        if self._room is not None and size > self._room:
            self.refused = BlobQuotaError(
                f"blob {self.hash[:16]}… of {size} bytes does not fit in the store's blob quota: "
                f"{max(self._room, 0)} bytes are free; collect garbage or raise the quota"
            )
            raise self.refused


class Fetching:
    """One knowledge base's blob sources, quota and fetches in flight (`kb.blobs` uses it)."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica
        self.sources: list[BlobSource] = []
        self.quota = replica.limits.max_blob_store_bytes
        self._setups: list[Callable[[], None]] = []
        self._memory: dict[str, bytearray] = {}  # partly fetched blobs of a read-only store
        self._flights: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._setup_lock = threading.RLock()  # a setup may read the quota or sources it sets

    def defer(self, setup: Callable[[], None]) -> None:
        self._setups.append(setup)

    def ready(self) -> None:
        """Run the deferred setups (each once; one that fails runs again next time)."""
        with self._setup_lock:
            while self._setups:
                setup = self._setups.pop(0)
                try:
                    setup()
                except BaseException:
                    self._setups.insert(0, setup)
                    raise

    def make_room(self, blob_hash: str, size: int) -> None:
        """Collect garbage if a blob of `size` bytes would not fit in the quota as it stands."""
        room = self.room(blob_hash)
        if room is not None and size > room and not self._replica.store.readonly:
            self.collect()

    def collect(self) -> int:
        """Collect the garbage (`collect_garbage`) to make room under the quota; bytes freed."""
        freed = sum(collect_garbage(self._replica).values())
        if freed:
            log.info(
                "blob quota: freed %d bytes of blobs only withdrawn or revoked skills use", freed
            )
        return freed

    def room(self, blob_hash: str) -> int | None:
        """How large `blob_hash` may be to fit in the quota (its own partial bytes count as free);
        None without a quota."""
        if self.quota is None:
            return None
        replica = self._replica
        with replica.lock:
            store = replica.store
            return self.quota - store.blob_bytes() + store.partial_size(bytes.fromhex(blob_hash))

    @contextlib.contextmanager
    def flight(self, blob_hash: str) -> Iterator[None]:
        """One fetch of a blob at a time: a second waits for the first (then finds it stored)."""
        with self._lock:
            lock = self._flights.setdefault(blob_hash, threading.Lock())
        with lock:
            yield

    def fetch(self, blob_hash: str, sources: Iterable[BlobSource]) -> bytes:
        replica = self._replica
        with self.flight(blob_hash):
            data = self._stored(blob_hash)
            if data is not None:
                return data
            self.ready()
            sources = list(sources)
            if not sources:
                raise BlobError(
                    f"blob {blob_hash[:16]}… is not stored here, and there is nowhere to fetch it "
                    "from (no blob sources)"
                )
            failures = []
            for source in sources:
                outcome = self._attempt(blob_hash, source)
                if isinstance(outcome, bytes):
                    return outcome
                failures.append(f"{_name(source)}: {outcome}")
            held = _Held(replica, blob_hash, self._memory).size()
            if not held:
                self._memory.pop(blob_hash, None)
            resume = f"; {held} bytes are held: fetching again resumes after them" if held else ""
            raise BlobError(
                f"blob {blob_hash[:16]}… is not stored here and no source could supply it "
                f"({'; '.join(failures)}){resume}"
            )

    def _stored(self, blob_hash: str) -> bytes | None:
        """The blob's bytes if stored here and intact; a corrupt copy is dropped, to fetch again."""
        replica = self._replica
        with replica.lock:
            data = replica.store.blob(bytes.fromhex(blob_hash))
            if data is None or hashlib.sha256(data).hexdigest() == blob_hash:
                return data
            if replica.identity is None:
                return None  # read-only: fetch a sound copy into memory
            log.warning("stored blob %s… is corrupt: dropped, to be fetched again", blob_hash[:16])
            replica.store.delete_blob(bytes.fromhex(blob_hash))
            return None

    def _attempt(self, blob_hash: str, source: BlobSource) -> bytes | str:
        """Fetch from one source: the blob's bytes (stored now), or why it could not supply them.
        A blob the quota refuses is tried once more if collecting the garbage frees room."""
        try:
            return self._attempt_once(blob_hash, source)
        except BlobQuotaError:
            if not self.collect():
                raise
        return self._attempt_once(blob_hash, source)

    def _attempt_once(self, blob_hash: str, source: BlobSource) -> bytes | str:
        for _ in range(2):  # a second time from byte 0 if the bytes held before were the bad ones
            held = _Held(self._replica, blob_hash, self._memory)
            room = None if held.memory is not None else self.room(blob_hash)
            blob = IncomingBlob(held, max_bytes=self._replica.limits.max_blob_bytes, room=room)
            resumed = blob.offset
            try:
                found = source.fetch_blob(blob)
            except SimnetError as exc:
                if blob.refused is not None:
                    held.drop()
                    raise blob.refused from None
                blob.flush()
                return str(exc)
            if blob.refused is not None:  # a source that swallowed the refusal
                held.drop()
                raise blob.refused
            blob.flush()
            if not found:
                return "does not hold it"
            if blob.size is not None and blob.offset < blob.size:
                return f"its answer ended after {blob.offset} of {blob.size} bytes"
            data = held.read()
            if data is not None and hashlib.sha256(data).hexdigest() == blob_hash:
                self._keep(blob_hash, held, data)
                return data
            held.drop()
            if not resumed:
                break
        log.warning(
            "blob %s…: %s sent bytes that do not hash to it; refused", blob_hash[:16], _name(source)
        )
        return "sent bytes that do not hash to it (refused)"

    def _keep(self, blob_hash: str, held: _Held, data: bytes) -> None:
        """Store a fetched blob in place of its partial bytes (a read-only store keeps nothing)."""
        if held.memory is not None:
            self._memory.pop(blob_hash, None)
            return
        replica = self._replica
        with replica.lock:
            room = self.room(blob_hash)
            if room is not None and len(data) > room:  # another blob took the room meanwhile
                replica.store.drop_partial(held.key)
                raise BlobQuotaError(
                    f"blob {blob_hash[:16]}… of {len(data)} bytes no longer fits in the store's "
                    f"blob quota ({max(room, 0)} bytes free); it was not stored"
                )
            with replica.store.transaction():
                replica.store.put_blob(held.key, data)
                replica.store.drop_partial(held.key)


def _name(source: object) -> str:
    return str(getattr(source, "name", None) or type(source).__name__)


def collect_garbage(replica: Replica, *, dry_run: bool = False) -> dict[str, int]:
    """Delete the blobs only withdrawn or revoked skills name, and partial bytes of blobs nothing
    live names; the bytes freed per blob (with `dry_run`, what would be)."""
    live, dead = named_blobs(replica)
    freed = {}
    with replica.lock:
        store = replica.store
        partial = set() if store.readonly else {h.hex() for h in store.partial_hashes()}
    for blob_hash in sorted((dead | partial) - live):
        key = bytes.fromhex(blob_hash)
        with replica.lock:
            whole = (store.blob_size(key) or 0) if blob_hash in dead else 0
            size = whole + (store.partial_size(key) if blob_hash in partial else 0)
            if size and not dry_run:
                if whole:
                    store.delete_blob(key)
                else:
                    store.drop_partial(key)
            if size:
                freed[blob_hash] = size
    return freed


def named_blobs(replica: Replica) -> tuple[set[str], set[str]]:
    """(live, dead): the blobs that skills still in use, held tasks and the tasks of held
    certificates name (weights, scene assets), and those that withdrawn or revoked skills name. A
    blob may be in both (then it is live); one nothing names is in neither."""
    live: set[str] = set()
    dead: set[str] = set()
    with replica.lock:
        views = replica.views
        for skill_id in (str(i) for i in views.indexes(RecordType.SKILL)):
            record = views.skill(skill_id)
            if record is None:
                continue
            policy = record.get("policy")
            weights = policy.get("weights") if isinstance(policy, dict) else None
            named = {b for b in [*(record.get("blobs") or ()), weights] if _is_hash(b)}
            gone = views.withdrawn(skill_id) or bool(views.revocations(skill_id))
            (dead if gone else live).update(named)
        live |= task_blobs(replica)
    return live, dead


def task_blobs(replica: Replica) -> set[str]:
    """The assets of every task held here, as a record or in a certificate's evaluation record
    (tasks are never withdrawn: a certificate of them stays checkable)."""
    named: set[str] = set()
    with replica.lock:
        views = replica.views
        for task_hash in views.indexes(RecordType.TASK):
            record = views.task(str(task_hash))
            if record is not None:
                named.update(task_assets(record.get("definition")).values())
        for cert_id in views.indexes(RecordType.CERT):
            evaluation = (views.certificate(str(cert_id)) or {}).get("evaluation")
            task = evaluation.get("task") if isinstance(evaluation, dict) else None
            if isinstance(task, dict):
                named.update(task_assets(task.get("definition")).values())
    return named


def _is_hash(value: object) -> bool:
    try:
        check_skill_id(value)
    except SimnetError:
        return False
    return True

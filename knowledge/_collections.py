"""The typed collections a KnowledgeBase exposes: kb.skills, kb.maps[name], kb.counters,
kb.certificates, kb.blobs. Each is handed the knowledge base's Replica, and only that."""

from __future__ import annotations

import builtins
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._blobs import BlobSource, Fetching, collect_garbage, named_blobs
from ._canonical import content_hash
from ._errors import BlobError, BlobQuotaError, RecordError, UnknownSkillError
from ._models import Counts, QueryResult, Skill
from ._records import (
    COUNTER_FIELDS,
    MAX_INT,
    RecordType,
    Role,
    check_skill_id,
)
from ._replica import Replica

if TYPE_CHECKING:
    from .embodiment._descriptors import Embodiment
    from .embodiment._encoders import Encoder
    from .embodiment._retrieval import EmbodimentInput, Retrieval


class Skills:
    """The skill library: immutable, content-addressed records, withdrawable by their own site.

    Annotations in this class say `builtins.list`: inside it, `list` is the method below.
    """

    def __init__(self, replica: Replica) -> None:
        self._replica = replica
        self._retrieval: Retrieval | None = None  # the embodiment side loads on the first query

    def publish(
        self,
        name: str,
        task: str,
        *,
        description: str = "",
        policy: Mapping[str, Any] | None = None,
        embodiments: Iterable[Mapping[str, Any]] = (),
        preconditions: Iterable[str] = (),
        postconditions: Iterable[str] = (),
        parents: Iterable[str] = (),
        blobs: Iterable[str] = (),
        meta: Mapping[str, Any] | None = None,
        tasks: Iterable[str] = (),
    ) -> Skill:
        """Publish a skill; returns it with its id (the SHA-256 of its record). Durable on return.

        `embodiments` is the scope: `Embodiment.to_dict()` of each body the skill is for (what
        `query` reads). `tasks` names the task definitions it is meant for, by content hash
        (`kb.tasks.publish`): any site can then evaluate it, and a certificate counts only for one
        of them.
        """
        replica = self._replica
        identity = replica.require(Role.PUBLISH)
        record = {
            "v": 1,
            "name": name,
            "task": task,
            "description": description,
            "policy": dict(policy) if policy is not None else None,
            "embodiments": [dict(e) for e in embodiments],
            "preconditions": list(preconditions),
            "postconditions": list(postconditions),
            "parents": list(parents),
            "blobs": list(blobs),
            "meta": dict(meta) if meta is not None else None,
            "author": identity.public_key_hex,
            **({"tasks": [check_skill_id(t, "task hash") for t in tasks]} if tasks else {}),
            "hlc": replica.now(),
        }
        skill_id = content_hash(record)
        replica.put_record(RecordType.SKILL, skill_id, record)
        return Skill.from_record(skill_id, record)

    def get(self, skill_id: str) -> Skill:
        """The skill with this id (withdrawn and revoked ones too); UnknownSkillError if none."""
        with self._replica.lock:
            record = self._replica.views.skill(skill_id)
        if record is None:
            raise UnknownSkillError(f"no skill {skill_id!r} in this knowledge base")
        return Skill.from_record(skill_id, record)

    def __contains__(self, skill_id: object) -> bool:
        with self._replica.lock:
            return isinstance(skill_id, str) and self._replica.views.skill(skill_id) is not None

    def list(
        self, *, task: str | None = None, active_only: bool = False, include_withdrawn: bool = False
    ) -> builtins.list[Skill]:
        """Skills in id order, filtered by task family, activation under this site's policy,
        withdrawal."""
        replica = self._replica
        with replica.lock:
            out = []
            for skill_id in sorted(str(i) for i in replica.views.indexes(RecordType.SKILL)):
                record = replica.views.skill(skill_id)
                if record is None or (task is not None and record["task"] != task):
                    continue
                if not include_withdrawn and replica.views.withdrawn(skill_id):
                    continue
                if active_only and not replica.activation(skill_id).active:
                    continue
                out.append(Skill.from_record(skill_id, record))
            return out

    def query(
        self,
        embodiment: EmbodimentInput,
        *,
        task: str | None = None,
        k: int = 10,
        active_only: bool = True,
        min_certified_branches: int = 0,
        encoder: Encoder | None = None,
    ) -> builtins.list[QueryResult]:
        """The k skills whose scope holds the bodies nearest to `embodiment` (an Embodiment, an MJCF
        or URDF path, or MJCF text), nearest first, filtered by task family, activation here and
        total certified branches. Withdrawn skills and skills without a valid scope descriptor are
        never found."""
        return self._engine().query(
            embodiment,
            task=task,
            k=k,
            active_only=active_only,
            min_certified_branches=min_certified_branches,
            encoder=encoder,
        )

    def describe(
        self,
        path: str | os.PathLike[str],
        *,
        urdf: bool | None = None,
        floating_base: bool | None = None,
        package_path: Iterable[str | os.PathLike[str]] | None = None,
        balance_inertia: bool = False,
    ) -> Embodiment:
        """A robot file's descriptor, read through this store's descriptor cache as `query` reads
        one (a second process asking with unchanged files does not wait for MuJoCo). URDF when
        `urdf` says so, else by the `.urdf` or `.xacro` suffix; the other options are
        `Embodiment.from_urdf`'s (`floating_base` is `from_mjcf`'s too; the others are an
        EmbodimentError for an MJCF file)."""
        return self._engine().describe(
            path,
            urdf=urdf,
            floating_base=floating_base,
            package_path=package_path,
            balance_inertia=balance_inertia,
        )

    def _engine(self) -> Retrieval:
        """The retrieval engine, made on the first query: MuJoCo and FAISS are imported then."""
        from .embodiment._retrieval import Retrieval

        with self._replica.lock:
            if self._retrieval is None:
                self._retrieval = Retrieval(self._replica)
                self._replica.on_close.append(self._retrieval.flush)
            return self._retrieval

    def withdraw(self, skill_id: str, reason: str = "") -> None:
        """Remove a skill this site published from the library (revocation is the fleet-wide
        switch)."""
        replica = self._replica
        identity = replica.require(Role.PUBLISH)
        self.get(skill_id)  # an unknown id raises here
        with replica.lock:
            ours = replica.views.skill_sites(skill_id) & replica.authority.sites(
                identity.public_key, Role.PUBLISH
            )
        if not ours:
            raise RecordError(
                f"skill {skill_id[:16]}… was published by another site; revoke it instead"
            )
        replica.put_record(
            RecordType.WITHDRAW, skill_id, {"v": 1, "hlc": replica.now(), "reason": reason}
        )


class Counters:
    """PN-counters of uses, successes and failures per skill and site."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def record(self, skill_id: str, *, success: bool | None = None, uses: int = 1) -> None:
        """Count `uses` runs of a skill here; with `success`, also count them as successes or
        failures."""
        delta = Counts(uses, uses if success is True else 0, uses if success is False else 0)
        self.adjust(skill_id, delta)

    def adjust(self, skill_id: str, delta: Counts) -> None:
        """Add a (possibly negative) correction to this writer's counts."""
        replica = self._replica
        check_skill_id(skill_id)
        replica.require(Role.PUBLISH)
        with replica.lock:
            rec = replica.current_record(RecordType.COUNTER, skill_id) or {
                "v": 1,
                "hlc": 0,
                "p": dict.fromkeys(COUNTER_FIELDS, 0),
                "n": dict.fromkeys(COUNTER_FIELDS, 0),
            }
            for field in COUNTER_FIELDS:
                change = getattr(delta, field)
                rec["p" if change > 0 else "n"][field] += abs(change)
                if rec["p"][field] > MAX_INT or rec["n"][field] > MAX_INT:
                    raise RecordError(f"counter {field} of {skill_id[:16]}… would exceed 2**53 - 1")
            rec["hlc"] = replica.now()
            replica.put_record(RecordType.COUNTER, skill_id, rec)

    def get(self, skill_id: str) -> Counts:
        """The fleet-wide totals this site knows of."""
        return sum(self.per_site(skill_id).values(), Counts())

    def per_site(self, skill_id: str) -> dict[str, Counts]:
        with self._replica.lock:
            return {
                site.hex(): c for site, c in sorted(self._replica.views.counts(skill_id).items())
            }


class Blobs:
    """Content-addressed large payloads (policy weights, meshes): stored once, verified on every
    read, fetched on demand from the sources attached (see `fetch`), within the store's quota."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica
        self._fetching = Fetching(replica)
        # `named_blobs`' live set, and the views and position it was computed at: it walks every
        # skill, task and certificate, and `is_named` runs on every blob a peer or device sends
        self._named: tuple[object, tuple[int, int], set[str]] | None = None

    def put(self, data: bytes, *, expected: str | None = None) -> str:
        """Store bytes; returns their SHA-256 hex. With `expected`, refuse bytes that do not hash to
        it."""
        data = bytes(data)
        if len(data) > self._replica.limits.max_blob_bytes:
            raise BlobError(
                f"blob of {len(data)} bytes exceeds the limit of "
                f"{self._replica.limits.max_blob_bytes}"
            )
        digest = hashlib.sha256(data).digest()
        if expected is not None and digest.hex() != expected:
            raise BlobError(
                f"blob bytes hash to {digest.hex()[:16]}…, not the expected {expected[:16]}…"
            )
        replica = self._replica
        replica.require_identity()
        self._fetching.ready()
        self._fetching.make_room(digest.hex(), len(data))
        with replica.lock, replica.store.transaction():
            if not replica.store.has_blob(digest):
                room = self._fetching.room(digest.hex())
                if room is not None and len(data) > room:
                    raise BlobQuotaError(
                        f"blob of {len(data)} bytes does not fit in the store's blob quota: "
                        f"{max(room, 0)} bytes are free; collect garbage or raise the quota"
                    )
            replica.store.put_blob(digest, data)
        return digest.hex()

    def get(self, blob_hash: str) -> bytes:
        check_skill_id(blob_hash, "blob hash")
        with self._replica.lock:
            data = self._replica.store.blob(bytes.fromhex(blob_hash))
        if data is None:
            raise BlobError(f"blob {blob_hash[:16]}… is not stored here")
        if hashlib.sha256(data).hexdigest() != blob_hash:
            raise BlobError(f"stored blob {blob_hash[:16]}… is corrupt (hash mismatch)")
        return data

    def size(self, blob_hash: str) -> int | None:
        """A stored blob's length in bytes, without reading it; None if it is not stored here."""
        check_skill_id(blob_hash, "blob hash")
        with self._replica.lock:
            return self._replica.store.blob_size(bytes.fromhex(blob_hash))

    def part(self, blob_hash: str, index: int) -> bytes | None:
        """Part `index` (0, 1, ...) of a stored blob, so that a server streams it instead of holding
        it whole; None past its last part. Unverified: the reader hashes the parts (as `get` does
        the whole)."""
        check_skill_id(blob_hash, "blob hash")
        with self._replica.lock:
            return self._replica.store.blob_part(bytes.fromhex(blob_hash), index)

    def __contains__(self, blob_hash: object) -> bool:
        if not isinstance(blob_hash, str):
            return False
        with self._replica.lock:
            return self._replica.store.has_blob(bytes.fromhex(blob_hash))

    def is_named(self, blob_hash: str) -> bool:
        """Whether something held here needs the blob: a live skill (its weights or blobs), a task
        or the task of a certificate (its scene assets). What a site accepts when a peer gives it a
        blob (`PUT /v1/blobs`), and never collects as garbage."""
        check_skill_id(blob_hash, "blob hash")
        with self._replica.lock:
            views = self._replica.views
            position = views.naming_position()
            if self._named is None or self._named[:2] != (views, position):
                self._named = (views, position, named_blobs(self._replica)[0])
            return blob_hash in self._named[2]

    def missing(self, hashes: Iterable[str]) -> list[str]:
        """Of `hashes`, those not stored here (what to fetch from a peer)."""
        return [h for h in hashes if h not in self]

    # --- on demand ------------------------------------------------------------------------------
    def fetch(self, blob_hash: str, *, sources: Iterable[BlobSource] | None = None) -> bytes:
        """The blob's bytes: stored here, or fetched from the first source that has them (the
        attached `sources`, or these), verified by hash and stored (a read-only store keeps them
        in memory only, until they are whole).

        A source that fails midway leaves its bytes held, and the next source, or the next fetch,
        resumes after them; a source whose bytes do not hash to the blob is logged and skipped.
        BlobError naming each source's failure if none supplies it; BlobQuotaError (nothing kept)
        if it would not fit in the quota.
        """
        check_skill_id(blob_hash, "blob hash")
        fetching = self._fetching
        return fetching.fetch(blob_hash, fetching.sources if sources is None else sources)

    @property
    def sources(self) -> tuple[BlobSource, ...]:
        """Where `fetch` looks for a blob it lacks, in order."""
        self._fetching.ready()
        return tuple(self._fetching.sources)

    def add_source(self, source: BlobSource) -> None:
        if not isinstance(source, BlobSource):
            raise TypeError(f"{source!r} is not a BlobSource (a name and fetch_blob)")
        self._fetching.sources.append(source)

    def defer_setup(self, setup: Callable[[], None]) -> None:
        """Call `setup()` once, before this collection first stores, fetches or lists its sources:
        how the top of a program attaches sources and a quota (`SiteHome` does) without paying
        for their imports when no blob is touched."""
        self._fetching.defer(setup)

    @property
    def quota(self) -> int | None:
        """The most bytes all blobs together may take in the store (None: no quota)."""
        self._fetching.ready()
        return self._fetching.quota

    def set_quota(self, max_bytes: int | None) -> None:
        """Replace the quota (`Limits.max_blob_store_bytes`) for as long as this store is open;
        blobs stored already stay."""
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise BlobError(f"a blob quota is a number of bytes, not {max_bytes!r}")
        self._fetching.quota = max_bytes

    def stored_bytes(self) -> int:
        """Bytes the store holds in blobs, partly fetched ones included (what the quota counts)."""
        with self._replica.lock:
            return self._replica.store.blob_bytes()

    def list(self) -> list[str]:
        """The hashes of every blob stored here, in order."""
        with self._replica.lock:
            return [h.hex() for h in self._replica.store.blob_hashes()]

    def collect_garbage(self, *, dry_run: bool = False) -> dict[str, int]:
        """Delete the blobs that only withdrawn or revoked skills name, and the partly fetched
        bytes of any blob nothing held names; returns the bytes freed per blob (with `dry_run`,
        what would be, deleting nothing). A whole blob nothing names is kept (a publisher's before
        its record, one a device asked for), and so is one a live skill or a held task names
        (`is_named`)."""
        if not dry_run:
            self._replica.require_identity()
        return collect_garbage(self._replica, dry_run=dry_run)

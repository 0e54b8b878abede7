"""The validation side of a knowledge base: kb.certificates (certificates and their spot checks) and
kb.tasks (task definitions as replicated data)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from typing import Any

from ._activation import AWAITS_CHECK
from ._canonical import content_hash, sha256_hex
from ._collections import Blobs
from ._errors import BlobError, RecordError, UnknownTaskError
from ._models import Certificate, SpotCheck
from ._records import RecordType, Role, check_skill_id, task_assets
from ._replica import Replica


class Certificates:
    """Signed evaluation records naming the skill they certify, and the spot checks that re-ran
    them (grow-only)."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def add(
        self,
        skill_id: str,
        *,
        branches: int,
        successes: int,
        confidence: float = 0.95,
        randomized: Iterable[str] = (),
        evaluation: Mapping[str, Any] | None = None,
        probe: Mapping[str, Any] | None = None,
    ) -> Certificate:
        """Certify a skill with an evaluation's outcome; `evaluation` holds what is needed to re-run
        it (`sim.certify` writes one from a simulator evaluation: by default activation counts no
        other), `probe` the worst region an adversarial probe found (`sim.probe`)."""
        replica = self._replica
        identity = replica.require(Role.VALIDATE)
        check_skill_id(skill_id)
        record = {
            "v": 1,
            "skill": skill_id,
            "validator": identity.public_key_hex,
            "hlc": replica.now(),
            "branches": branches,
            "successes": successes,
            "confidence": confidence,
            "randomized": sorted(set(randomized)),
            "evaluation": dict(evaluation) if evaluation is not None else None,
            **({"probe": dict(probe)} if probe is not None else {}),
        }
        cert_id = content_hash(record)
        replica.put_record(RecordType.CERT, cert_id, record)
        return Certificate.from_record(cert_id, record)

    def for_skill(self, skill_id: str) -> builtins.list[Certificate]:
        with self._replica.lock:
            return [
                Certificate.from_record(c, r) for c, r in self._replica.views.certificates(skill_id)
            ]

    def get(self, cert_id: str) -> Certificate:
        """The certificate with this id; KeyError if none is held here."""
        with self._replica.lock:
            record = self._replica.views.certificate(cert_id)
        if record is None:
            raise KeyError(f"no certificate {cert_id!r} in this knowledge base")
        return Certificate.from_record(cert_id, record)

    # --- spot checks and disputes ---------------------------------------------------------------
    def check(
        self,
        certificate: Certificate,
        *,
        reproduced: bool,
        branches: Iterable[int],
        detail: str = "",
        evidence: Mapping[str, Any] | None = None,
    ) -> SpotCheck:
        """Sign the verdict of re-running `branches` of `certificate` here (the writer needs the
        validate role). `reproduced=False` is a dispute: it replicates with its `evidence` (the
        branches' recorded and re-run outcomes) for every site to weigh under its own policy."""
        replica = self._replica
        identity = replica.require(Role.VALIDATE)
        record = {
            "v": 1,
            "certificate": check_skill_id(certificate.id, "certificate id"),
            "skill": certificate.skill,
            "validator": certificate.validator,
            "checker": identity.public_key_hex,
            "hlc": replica.now(),
            "verdict": "reproduced" if reproduced else "disputed",
            "branches": sorted(set(branches)),
            "detail": detail[:1000],
            "evidence": dict(evidence) if evidence is not None else None,
        }
        check_id = content_hash(record)
        replica.put_record(RecordType.CHECK, check_id, record)
        return SpotCheck.from_record(check_id, record)

    def checks(self, cert_id: str) -> builtins.list[SpotCheck]:
        """Every spot check of a certificate held here, by checkers trusted to validate."""
        with self._replica.lock:
            found = self._replica.views.checks(cert_id)
            return [SpotCheck.from_record(i, r) for i, _, r, _ in found]

    def disputes(self, validator: str | None = None) -> builtins.list[SpotCheck]:
        """Disputes (spot checks that did not reproduce) against `validator`'s certificates, or
        against anyone's."""
        views = self._replica.views
        with self._replica.lock:
            found = views.all_disputes() if validator is None else views.disputes(validator)
            return [SpotCheck.from_record(i, r) for i, _, r, _ in found]

    def awaiting_check(self) -> builtins.list[Certificate]:
        """Certificates this site's policy counts only after a spot check here, that have none yet:
        of skills neither revoked nor withdrawn, meeting every other requirement (what a validator
        service re-runs)."""
        replica = self._replica
        out = []
        with replica.lock:
            if not replica.policy.activation.spot_checks:
                return []
            views = replica.views
            for skill_id in sorted(str(i) for i in views.indexes(RecordType.SKILL)):
                if views.revocations(skill_id) or views.withdrawn(skill_id):
                    continue
                out += [
                    Certificate.from_record(s.cert_id, s.record)
                    for s in replica.standings(skill_id)
                    if s.why == AWAITS_CHECK
                ]
        return out


class Tasks:
    """Task definitions as replicated data, never code: each is named by the SHA-256 of its
    definition's canonical JSON, so a skill names the tasks it is meant for (`skills.publish(...,
    tasks=...)`) and any site can evaluate it (`sim.Task(kb.tasks.get(hash))`).

    A definition's "assets" field (relative file name -> blob sha256) names the files its scene
    loads (meshes, textures, heightfields): they travel as blobs, so the task's hash covers them
    and any site can fetch them (`kb.blobs.fetch`) and re-run it."""

    def __init__(self, replica: Replica, blobs: Blobs) -> None:
        self._replica = replica
        self._blobs = blobs

    def publish(
        self,
        definition: Mapping[str, Any],
        *,
        name: str | None = None,
        assets: Mapping[str, bytes] | None = None,
    ) -> str:
        """Store a task definition as a record; returns its hash. A definition held already (from
        any writer) is not written again. `assets` (name -> bytes) are files the definition names
        in its "assets" field: each is stored as a blob first. RecordError if the definition is no
        JSON object, too large for a record (256 KiB) or its "assets" field is not a mapping of
        names to hashes; BlobError if bytes given do not hash to their name's hash, or a file it
        names is neither given nor stored here (nobody could re-run the task)."""
        replica = self._replica
        replica.require(Role.PUBLISH)
        definition = dict(definition)
        named = _asset_field(definition)
        given = dict(assets or {})
        unknown = sorted(set(given) - set(named))
        if unknown:
            raise BlobError(f"asset {unknown[0]!r} is not named in the definition's assets")
        for file, data in sorted(given.items()):  # all checked before any is stored
            digest = sha256_hex(data)
            if digest != named[file]:
                raise BlobError(
                    f"asset {file!r}: its bytes hash to {digest[:16]}…, not {named[file][:16]}…"
                )
        for file, blob in sorted(named.items()):
            if file not in given and blob not in self._blobs:
                raise BlobError(
                    f"asset {file!r} ({blob[:16]}…) is not stored here: pass its bytes in assets="
                )
        for data in given.values():
            self._blobs.put(data)
        task_hash = content_hash(definition)
        if task_hash in self:
            return task_hash
        label = name if name is not None else str(definition.get("name") or task_hash[:12])
        record = {"v": 1, "hlc": replica.now(), "name": label[:200], "definition": definition}
        replica.put_record(RecordType.TASK, task_hash, record)
        return task_hash

    def assets(self, task_hash: str) -> dict[str, str]:
        """The files a held task carries: relative name -> blob sha256 (empty if it loads none);
        UnknownTaskError if no trusted writer's record has it."""
        return task_assets(self.get(task_hash))

    def get(self, task_hash: str) -> dict[str, Any]:
        """The definition with this hash; UnknownTaskError if no trusted writer's record has it."""
        check_skill_id(task_hash, "task hash")
        with self._replica.lock:
            record = self._replica.views.task(task_hash)
        if record is None:
            raise UnknownTaskError(f"no task definition {task_hash[:16]}… in this knowledge base")
        return dict(record["definition"])

    def name(self, task_hash: str) -> str:
        with self._replica.lock:
            record = self._replica.views.task(task_hash)
        if record is None:
            raise UnknownTaskError(f"no task definition {task_hash[:16]}… in this knowledge base")
        return str(record["name"])

    def __contains__(self, task_hash: object) -> bool:
        with self._replica.lock:
            return isinstance(task_hash, str) and self._replica.views.task(task_hash) is not None

    def list(self) -> builtins.list[str]:
        """The hashes of every task definition held here, in order."""
        with self._replica.lock:
            return sorted(str(i) for i in self._replica.views.indexes(RecordType.TASK))


def _asset_field(definition: dict[str, Any]) -> dict[str, str]:
    """A definition's "assets" field, checked: a mapping of names to blob hashes (or absent)."""
    assets = definition.get("assets", {})
    if not isinstance(assets, dict) or task_assets(definition) != assets:
        raise RecordError("field 'definition.assets' must map file names to blob sha256 hashes")
    return assets

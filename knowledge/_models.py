"""Plain, immutable values the public API returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class Skill:
    """An immutable, content-addressed skill record as published by its author."""

    id: str
    name: str
    task: str
    author: str
    hlc: int
    description: str = ""
    policy: dict[str, Any] | None = None
    embodiments: tuple[dict[str, Any], ...] = ()
    preconditions: tuple[str, ...] = ()
    postconditions: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()
    blobs: tuple[str, ...] = ()
    meta: dict[str, Any] | None = None
    tasks: tuple[str, ...] = ()  # content hashes of the task definitions it is meant for

    @classmethod
    def from_record(cls, skill_id: str, rec: dict[str, Any]) -> Skill:
        return cls(
            id=skill_id,
            name=rec["name"],
            task=rec["task"],
            author=rec["author"],
            hlc=rec["hlc"],
            description=rec.get("description", ""),
            policy=rec.get("policy"),
            embodiments=tuple(rec.get("embodiments", ())),
            preconditions=tuple(rec.get("preconditions", ())),
            postconditions=tuple(rec.get("postconditions", ())),
            parents=tuple(rec.get("parents", ())),
            blobs=tuple(rec.get("blobs", ())),
            meta=rec.get("meta"),
            tasks=tuple(rec.get("tasks", ())),
        )


@dataclass(frozen=True, slots=True)
class Observation:
    """The winning value of a semantic-map cell: highest (confidence, hlc, author)."""

    map: str
    cell: str
    value: Any
    confidence: float
    hlc: int
    author: str
    deleted: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class MapRegion:
    """The winning observations of the cells in a box of a map, as columns (row i is one cell):
    `cells` (n x d coordinates), `values`, `confidence`, `hlc`, `deleted`, and `author`, an index
    into `authors` (hex keys). Rows come tile by tile, in each tile in row-major order."""

    map: str
    cells: np.ndarray  # int64, n x d
    values: np.ndarray  # objects: each cell's JSON value (None for a tombstone)
    confidence: np.ndarray  # float64
    hlc: np.ndarray  # uint64
    author: np.ndarray  # uint32 indices into `authors`
    authors: tuple[str, ...]
    deleted: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.cells)

    def observation(self, i: int) -> Observation:
        """Row `i` as an Observation."""
        return Observation(
            self.map,
            ",".join(str(int(c)) for c in self.cells[i]),
            self.values[i],
            float(self.confidence[i]),
            int(self.hlc[i]),
            self.authors[int(self.author[i])],
            bool(self.deleted[i]),
        )


@dataclass(frozen=True, slots=True)
class Counts:
    uses: int = 0
    successes: int = 0
    failures: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.uses + other.uses, self.successes + other.successes, self.failures + other.failures
        )


@dataclass(frozen=True, slots=True)
class Certificate:
    """A validator's signed evaluation of a skill (the record lives in the validator's feed)."""

    id: str
    skill: str
    validator: str
    hlc: int
    branches: int
    successes: int
    confidence: float
    randomized: tuple[str, ...]
    evaluation: dict[str, Any] | None
    probe: dict[str, Any] | None = None  # the worst region an adversarial probe found, if run

    @classmethod
    def from_record(cls, cert_id: str, rec: dict[str, Any]) -> Certificate:
        return cls(
            id=cert_id,
            skill=rec["skill"],
            validator=rec["validator"],
            hlc=rec["hlc"],
            branches=rec["branches"],
            successes=rec["successes"],
            confidence=float(rec["confidence"]),
            randomized=tuple(rec.get("randomized", ())),
            evaluation=rec.get("evaluation"),
            probe=rec.get("probe"),
        )


@dataclass(frozen=True, slots=True)
class SpotCheck:
    """A site's re-run of some branches of another validator's certificate, signed by the checker.

    `reproduced=False` makes it a dispute: it replicates with its evidence, the certificate stops
    counting wherever the checker is trusted to validate, and enough disputes against one validator
    stop its certificates counting too (`ActivationPolicy.distrust_after_disputes`).
    """

    id: str
    certificate: str
    skill: str
    validator: str
    checker: str
    hlc: int
    reproduced: bool
    branches: tuple[int, ...]
    detail: str = ""
    evidence: dict[str, Any] | None = None

    @classmethod
    def from_record(cls, check_id: str, rec: dict[str, Any]) -> SpotCheck:
        return cls(
            id=check_id,
            certificate=rec["certificate"],
            skill=rec["skill"],
            validator=rec["validator"],
            checker=rec["checker"],
            hlc=rec["hlc"],
            reproduced=rec["verdict"] == "reproduced",
            branches=tuple(rec["branches"]),
            detail=rec.get("detail", ""),
            evidence=rec.get("evidence"),
        )


@dataclass(frozen=True, slots=True)
class Activation:
    """Whether a skill is active under this site's policy, and why (derived on every call, never
    stored)."""

    skill: str
    active: bool
    reasons: tuple[str, ...]
    qualifying_sites: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CertificateSummary:
    """How strongly a skill is certified here: certificates from trusted validators, their total
    branches, and the best Wilson lower bound on success among them at the policy's confidence."""

    count: int = 0
    branches: int = 0
    best_lower_bound: float = 0.0


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A skill found by embodiment: `distance` from the query body to the nearest body of its scope,
    which is `skill.embodiments[scope]`, in the space of the encoder named `ranked_by`."""

    distance: float
    skill: Skill
    activation: Activation
    certificates: CertificateSummary
    scope: int
    ood: float | None = None
    """How far the query body lies from what the learned encoder was trained on (above 1: out of
    distribution); None for an encoder without the notion (the feature encoder)."""
    ranked_by: str = ""
    """The encoder whose distance ranks the result: the one asked for, or its fallback (the
    feature encoder, "morphology-features") when the query body was out of distribution."""


@dataclass(frozen=True, slots=True)
class Head:
    """The newest envelope this site holds from one author; `equivocated_at` if the author forked
    there (its feed then stops at the seq before, and this site already holds the evidence)."""

    seq: int
    hash: str
    equivocated_at: int | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    """One envelope `ingest` refused: its position in the input, its author and seq if decodable,
    and why."""

    index: int
    reason: str
    detail: str
    author: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class Held:
    """An envelope `ingest` holds, durably, until its time comes: its timestamp is ahead of this
    site's clock by more than the accepted offset but within the hold horizon. It is checked again,
    and applied or refused like any envelope, at the first ingest or release once this site's clock
    reaches `due_ms`."""

    index: int
    author: str
    seq: int
    due_ms: int  # this site's clock, ms since the epoch


@dataclass(frozen=True, slots=True)
class RecordIssue:
    """A record inside an accepted envelope that the views skip: invalid, unauthorized or from a
    newer schema."""

    author: str
    key: str
    reason: str


@dataclass
class IngestReport:
    """What `ingest` did: every input envelope is accepted, a duplicate, or rejected with a
    reason."""

    accepted: list[tuple[str, int]] = field(default_factory=list)
    duplicates: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    record_issues: list[RecordIssue] = field(default_factory=list)
    equivocations: list[tuple[str, int]] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)  # from the future: applied when due
    released: list[tuple[str, int]] = field(default_factory=list)  # held before, applied now
    # envelopes below a checkpoint held here, replayed to check it (see `unchecked_checkpoints`)
    verified: int = 0

    @property
    def ok(self) -> bool:
        return not self.rejected and not self.equivocations

    def reasons(self) -> list[str]:
        return [r.reason for r in self.rejected]

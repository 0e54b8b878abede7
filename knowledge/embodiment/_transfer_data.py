"""Transfer outcomes: how often a skill made for one body succeeded on another.

This is what a learned encoder trains on and is judged by. It comes either from a dataset file (the
simulator's `simnet encoder dataset` writes one) or from a knowledge base, where every certificate
is such a measurement: its skill's `embodiments` scope names the source bodies, and the task in its
evaluation record carries the scene of the body it ran on.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import EmbodimentError, SimnetError
from ._descriptors import Embodiment
from ._encoders import Encoder

if TYPE_CHECKING:
    from .._kb import KnowledgeBase

log = logging.getLogger(__name__)

FORMAT = "simnet.transfer/1"


class TransferDataError(SimnetError, ValueError):
    """A transfer dataset file is malformed, or holds too little to train or evaluate on."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """`successes` of `trials` when the skill made for `bodies[source]` ran on `bodies[target]`."""

    source: int
    target: int
    task: str
    successes: int
    trials: int

    @property
    def rate(self) -> float:
        return self.successes / self.trials


@dataclass(frozen=True)
class TransferDataset:
    """Bodies (distinct by fingerprint) and measured transfers between them, per task family."""

    bodies: tuple[Embodiment, ...]
    transfers: tuple[Transfer, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_outcomes(
        cls,
        outcomes: Iterable[tuple[Embodiment, Embodiment, str, int, int]],
        meta: Mapping[str, Any] | None = None,
    ) -> TransferDataset:
        """(source, target, task, successes, trials) tuples; repeated pairs of one task are
        summed."""
        index: dict[str, int] = {}
        bodies: list[Embodiment] = []
        totals: dict[tuple[int, int, str], list[int]] = {}
        for source, target, task, successes, trials in outcomes:
            if not 0 <= successes <= trials or trials < 1:
                raise TransferDataError(
                    f"{successes} successes of {trials} trials is not a measurement"
                )
            ends = []
            for body in (source, target):
                if body.fingerprint not in index:
                    index[body.fingerprint] = len(bodies)
                    bodies.append(body)
                ends.append(index[body.fingerprint])
            total = totals.setdefault((ends[0], ends[1], task), [0, 0])
            total[0] += successes
            total[1] += trials
        transfers = tuple(Transfer(s, t, task, k, n) for (s, t, task), (k, n) in totals.items())
        return cls(tuple(bodies), transfers, dict(meta or {}))

    @classmethod
    def from_knowledge_base(cls, kb: KnowledgeBase) -> TransferDataset:
        """Every certificate the views show (from trusted validators) as measured transfers.

        Certificates whose record carries no scene MuJoCo can compile here, and scope entries that
        are not descriptors, are skipped (logged at debug level).
        """
        outcomes = []
        targets: dict[str, Embodiment | None] = {}
        for skill in kb.skills.list(include_withdrawn=True):
            sources = []
            for scope in skill.embodiments:
                try:
                    sources.append(Embodiment.from_dict(scope))
                except EmbodimentError as exc:
                    log.debug("skill %s…: scope skipped: %s", skill.id[:16], exc)
            for certificate in kb.certificates.for_skill(skill.id) if sources else ():
                target = _record_body(certificate.evaluation, targets)
                if target is not None:
                    outcomes += [
                        (s, target, skill.task, certificate.successes, certificate.branches)
                        for s in sources
                    ]
        return cls.from_outcomes(outcomes, {"source": "knowledge base certificates"})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(body.name for body in self.bodies)

    @property
    def classes(self) -> dict[str, str]:
        """The class of each body that the dataset's meta records one for, by name (`simnet
        encoder dataset` records each robot's: arm, quadruped, humanoid, ...): what
        `train_encoder(classes=...)` contrasts."""
        return {
            robot["name"]: robot["class"]
            for robot in self.meta.get("robots", ())
            if isinstance(robot, dict)
            and isinstance(robot.get("name"), str)
            and isinstance(robot.get("class"), str)
        }

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted({t.task for t in self.transfers}))

    def rates(self, task: str) -> np.ndarray:
        """(sources, targets) success rates of one task family; NaN where nothing was measured."""
        out = np.full((len(self.bodies), len(self.bodies)), np.nan)
        for t in self.transfers:
            if t.task == task:
                out[t.source, t.target] = t.rate
        return out

    def subset(self, keep: Sequence[int]) -> TransferDataset:
        """The bodies at `keep` and the transfers among them only."""
        new = {old: i for i, old in enumerate(keep)}
        transfers = tuple(
            Transfer(new[t.source], new[t.target], t.task, t.successes, t.trials)
            for t in self.transfers
            if t.source in new and t.target in new
        )
        return TransferDataset(tuple(self.bodies[i] for i in keep), transfers, self.meta)

    def split(
        self, fraction: float, *, seed: int = 0, by: str = "fingerprint"
    ) -> tuple[list[int], list[int]]:
        """(training, held-out) body indices: a body is held out by a hash of its fingerprint (or,
        `by="name"`, of its name) and `seed`, so a body stays on its side however the dataset
        around it grows.

        A fingerprint changes whenever a reader describes the body differently, so across
        versions of the readers bodies cross the line. Names do not: where they tell robots apart
        (as a generated population's `arm-12` do), `by="name"` keeps the split, and one name's
        bodies (one robot's descriptions) fall on one side together. So names that do not tell
        robots apart make them one: MJCF without a `model` is "MuJoCo Model", and every robot so
        named lands on one side. A body with no name is refused (ValueError).
        """
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"the held-out fraction must be in [0, 1), got {fraction}")
        if by not in ("fingerprint", "name"):
            raise ValueError(f"split by 'fingerprint' or 'name', not {by!r}")
        if by == "name" and not all(self.names):
            raise ValueError("split by name: a body has no name (split by fingerprint instead)")
        held = [
            int.from_bytes(hashlib.sha256(f"{seed}:{getattr(b, by)}".encode()).digest()[:8], "big")
            < fraction * 2**64
            for b in self.bodies
        ]
        return [i for i, h in enumerate(held) if not h], [i for i, h in enumerate(held) if h]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "meta": dict(self.meta),
            "bodies": [b.to_dict() for b in self.bodies],
            "transfers": [
                [t.source, t.target, t.task, t.successes, t.trials] for t in self.transfers
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> TransferDataset:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TransferDataError(f"not a transfer dataset: the format must be {FORMAT!r}")
        try:
            bodies = tuple(Embodiment.from_dict(b) for b in data["bodies"])
            transfers = tuple(
                Transfer(int(s), int(t), str(task), int(k), int(n))
                for s, t, task, k, n in data["transfers"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TransferDataError(f"malformed transfer dataset: {exc}") from exc
        for t in transfers:
            if not (
                0 <= t.source < len(bodies)
                and 0 <= t.target < len(bodies)
                and 0 <= t.successes <= t.trials
                and t.trials >= 1
            ):
                raise TransferDataError(f"malformed transfer dataset: transfer {t} is out of range")
        return cls(bodies, transfers, dict(data.get("meta") or {}))

    def save(self, path: str | os.PathLike[str]) -> None:
        """JSON, gzip-compressed when the name ends in .gz."""
        text = json.dumps(self.to_json(), separators=(",", ":")).encode()
        Path(path).write_bytes(gzip.compress(text, mtime=0) if str(path).endswith(".gz") else text)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TransferDataset:
        raw = Path(path).read_bytes()
        try:
            return cls.from_json(
                json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
            )
        except (OSError, ValueError, EmbodimentError) as exc:
            if isinstance(exc, TransferDataError):
                raise
            raise TransferDataError(f"{path}: not a transfer dataset: {exc}") from exc


def _record_body(record: Any, seen: dict[str, Embodiment | None]) -> Embodiment | None:
    """The body an evaluation record ran on: the scene of its task definition, compiled here."""
    try:
        scene = record["task"]["definition"]["scene"]
    except (KeyError, TypeError):
        return None
    if not isinstance(scene, str) or not scene.lstrip().startswith("<"):
        return None  # MJCF text only: a peer's record must never name a file to read here
    if scene not in seen:
        try:
            seen[scene] = Embodiment.from_mjcf(scene)
        except EmbodimentError as exc:
            log.debug("certificate scene skipped: %s", exc)
            seen[scene] = None
    return seen[scene]


# -- judging an encoder ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BodyScore:
    """How well one encoder's distances rank the skills of one task family on one target body."""

    body: str
    task: str
    spearman: float
    """Rank correlation of -distance with measured success over the other bodies' skills (NaN if all
    tie)."""
    recall_at_k: float
    """Of the skills that succeed at least `threshold` here, the share in the k nearest (of at most
    k)."""
    skills: int


@dataclass(frozen=True)
class EncoderReport:
    encoder: str
    scores: tuple[BodyScore, ...]
    k: int
    threshold: float

    @property
    def spearman(self) -> float:
        """Mean over target bodies whose skills do not all score alike."""
        values = [s.spearman for s in self.scores if not math.isnan(s.spearman)]
        return float(np.mean(values)) if values else math.nan

    @property
    def recall_at_k(self) -> float:
        """Mean over target bodies where some skill reaches the threshold."""
        values = [s.recall_at_k for s in self.scores if not math.isnan(s.recall_at_k)]
        return float(np.mean(values)) if values else math.nan

    def to_json(self) -> dict[str, Any]:
        """JSON-safe: undefined figures (NaN) become null."""
        return {
            "encoder": self.encoder,
            "spearman": _finite(self.spearman),
            f"recall_at_{self.k}": _finite(self.recall_at_k),
            "threshold": self.threshold,
            "bodies": [
                {
                    "body": s.body,
                    "task": s.task,
                    "spearman": _finite(s.spearman),
                    f"recall_at_{self.k}": _finite(s.recall_at_k),
                    "skills": s.skills,
                }
                for s in self.scores
            ],
        }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def distances(dataset: TransferDataset, encoder: Encoder) -> np.ndarray:
    """(bodies, bodies) distances as a query ranks by them: in the encoder's space (its metric),
    `guarded` by its guard's where it has one."""
    table = _pairwise(encoder.encode_many(dataset.bodies), encoder.metric)
    if encoder.guard is None:
        return table
    guard = encoder.guard
    return encoder.guarded(table, _pairwise(guard.encode_many(dataset.bodies), guard.metric))


def _pairwise(vectors: np.ndarray, metric: str) -> np.ndarray:
    vectors = vectors.astype(np.float64)
    if metric == "cosine":
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return 1.0 - vectors @ vectors.T
    squared = (vectors**2).sum(1)
    return np.sqrt(np.maximum(squared[:, None] + squared[None, :] - 2 * vectors @ vectors.T, 0.0))


def evaluate_encoder(
    dataset: TransferDataset,
    encoder: Encoder,
    targets: Sequence[int] | None = None,
    *,
    k: int = 5,
    threshold: float = 0.8,
) -> EncoderReport:
    """Score an encoder on `targets` (default: every body): for each target and task family, rank
    the skills of every other body measured on it by distance, and compare with their measured
    success."""
    table = distances(dataset, encoder)
    scores = []
    for task in dataset.tasks:
        rates = dataset.rates(task)
        for t in range(len(dataset.bodies)) if targets is None else targets:
            sources = [
                s for s in range(len(dataset.bodies)) if s != t and not math.isnan(rates[s, t])
            ]
            if len(sources) < 2:
                continue
            success, near = rates[sources, t], -table[sources, t]
            good = success >= threshold
            top = np.argsort(-near, kind="stable")[:k]
            recall = good[top].sum() / min(k, good.sum()) if good.any() else math.nan
            scores.append(
                BodyScore(
                    dataset.bodies[t].name,
                    task,
                    spearman(near, success),
                    float(recall),
                    len(sources),
                )
            )
    return EncoderReport(f"{encoder.name} {encoder.version}", tuple(scores), k, threshold)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties share their mean rank); NaN when either side is
    constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]

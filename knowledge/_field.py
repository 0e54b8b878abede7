"""Predict, then verify: a calibration ledger of certificates against what happened in the field.

A certificate predicts how a skill does: its success rate with an interval, and, from the per-branch
outcomes of its evaluation record, distributions of continuous outcomes (``steps`` to the end of an
episode, ``total_reward``). Robots report what happened as outcome records (kb.outcomes: one
cumulative record per writer and skill, as cheap as a counter). The ledger scores predictions
against outcomes per (site, embodiment, task family): Brier and log score, interval coverage, and
CRPS for each continuous outcome both sides name; `calibration_png` draws it.

The field test: at each site, over that site's own robots' outcomes of a skill, the log likelihood
ratio of "the success rate is `field_margin` below the certificates' lower bound" to "it is the
lower bound" (`knowledge.stats.shortfall_log_ratio`). Past log(1/field_alpha) the skill is suspended
there: for a skill as good as its certificates say, that happens with probability at most
field_alpha however long it is watched, and for one that is worse it happens as soon as the
evidence allows. `kb.ledger.publish_suspensions()` signs the verdict, with its evidence, as a
suspension record that replicates; other sites follow it only if their policy says so
(`follow_suspensions`), from writers whose certificates they count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._policy import ActivationPolicy
from ._records import RecordType
from ._views import Views
from .stats import clopper_pearson_interval, crps, shortfall_log_ratio, wilson_lower_bound

CONTINUOUS = ("steps", "total_reward")  # the evaluation record's continuous per-branch outcomes


@dataclass(frozen=True)
class Prediction:
    """What the certificates that count here predict for a skill, pooled."""

    skill: str
    branches: int
    successes: int
    lower: float  # Wilson lower bound at the policy's confidence: what activation promised
    interval: tuple[float, float]  # two-sided 95% Clopper-Pearson
    values: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.successes / self.branches


@dataclass(frozen=True)
class FieldOutcomes:
    """What one site's robots of one body reported for a skill."""

    skill: str
    site: str
    embodiment: str
    trials: int
    successes: int
    values: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class FieldTest:
    """The sequential test on a site's own field outcomes of a skill against its promise."""

    skill: str
    trials: int
    successes: int
    promised: float
    suspect: float
    log_ratio: float
    threshold: float

    @property
    def suspended(self) -> bool:
        return self.log_ratio >= self.threshold

    @property
    def detail(self) -> str:
        return (
            f"field success {self.successes}/{self.trials} against a promised lower bound of "
            f"{self.promised:.3f}: log likelihood ratio {self.log_ratio:.2f} of "
            f"{self.threshold:.2f} needed to suspend"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "successes": self.successes,
            "promised": self.promised,
            "suspect": self.suspect,
            "log_ratio": self.log_ratio,
            "threshold": self.threshold,
        }


@dataclass(frozen=True)
class LedgerRow:
    """Scores of the predictions for one (site, embodiment, task family), over its skills."""

    site: str
    embodiment: str
    task: str
    skills: int
    trials: int
    successes: int
    brier: float
    log_score: float
    coverage: float  # skills whose field rate lies in their certificates' interval
    crps: Mapping[str, float] = field(default_factory=dict)
    points: tuple[tuple[float, float], ...] = ()  # (predicted rate, field rate) per skill


def prediction(
    counting: list[dict[str, Any]], policy: ActivationPolicy, skill_id: str
) -> Prediction | None:
    """The pooled prediction of the certificates that count here (their records), or None."""
    if not counting:
        return None
    n = sum(c["branches"] for c in counting)
    k = sum(c["successes"] for c in counting)
    values: dict[str, list[float]] = {name: [] for name in CONTINUOUS}
    for cert in counting:
        outcomes = (cert.get("evaluation") or {}).get("outcomes")
        for name in CONTINUOUS:
            if isinstance(outcomes, dict) and isinstance(outcomes.get(name), list):
                values[name] += [float(v) for v in outcomes[name]]
    return Prediction(
        skill_id,
        n,
        k,
        wilson_lower_bound(k, n, policy.confidence),
        clopper_pearson_interval(k, n, 0.95),
        {name: tuple(v) for name, v in values.items() if v},
    )


def field_outcomes(views: Views, skill_id: str) -> list[FieldOutcomes]:
    """Per (site, embodiment): the outcomes its writers reported (a writer two sites vouch for is
    filed under the smaller site key, as counters are)."""
    grouped: dict[tuple[bytes, str], list[dict[str, Any]]] = {}
    for _author, record, sites in views.by_author(RecordType.OUTCOME, skill_id):
        grouped.setdefault((min(sites), record["embodiment"]), []).append(record)
    out = []
    for (site, embodiment), records in sorted(grouped.items()):
        values: dict[str, list[float]] = {}
        for record in records:
            for name, series in record.get("values", {}).items():
                values.setdefault(name, []).extend(float(v) for v in series)
        out.append(
            FieldOutcomes(
                skill_id,
                site.hex(),
                embodiment,
                sum(r["trials"] for r in records),
                sum(r["successes"] for r in records),
                {name: tuple(v) for name, v in values.items()},
            )
        )
    return out


def field_test(
    predicted: Prediction, outcomes: list[FieldOutcomes], site: bytes, policy: ActivationPolicy
) -> FieldTest | None:
    """The field test over `site`'s own outcomes; None without a promise to test or outcomes."""
    own = [o for o in outcomes if o.site == site.hex()]
    trials = sum(o.trials for o in own)
    if not trials or predicted.lower <= 0.0:
        return None
    promised = min(predicted.lower, 1 - 1e-6)
    suspect = max(promised - policy.field_margin, 1e-6)
    successes = sum(o.successes for o in own)
    return FieldTest(
        predicted.skill,
        trials,
        successes,
        promised,
        suspect,
        shortfall_log_ratio(successes, trials, promised, suspect),
        math.log(1 / policy.field_alpha),
    )


def suspension(
    views: Views,
    policy: ActivationPolicy,
    own_site: bytes | None,
    skill_id: str,
    counting: list[dict[str, Any]],
) -> str | None:
    """Why the skill is suspended here, or None: this site's field test, or (with
    `follow_suspensions`) a suspension record by a writer whose certificates count here."""
    if policy.field_check and own_site is not None:
        outcomes = field_outcomes(views, skill_id)
        # the prediction is built only for a skill with field outcomes: activation is a hot path
        predicted = prediction(counting, policy, skill_id) if outcomes else None
        test = None if predicted is None else field_test(predicted, outcomes, own_site, policy)
        if test is not None and test.suspended:
            return f"suspended here: {test.detail}"
    if policy.follow_suspensions:
        for author, record, sites in views.by_author(RecordType.SUSPEND, skill_id):
            counted = sites & policy.validators if policy.validators else sites
            if record["suspended"] and counted and own_site not in sites:
                return f"suspended by {author.hex()[:12]}…: {record.get('reason', '')}"
    return None


def ledger_row(
    key: tuple[str, str, str], pairs: list[tuple[Prediction, FieldOutcomes]]
) -> LedgerRow:
    site, embodiment, task = key
    trials = sum(f.trials for _, f in pairs)
    successes = sum(f.successes for _, f in pairs)
    brier = log_score = 0.0
    covered = 0
    scores: dict[str, list[float]] = {}
    for predicted, found in pairs:
        p = min(max(predicted.rate, 1e-6), 1 - 1e-6)
        failures = found.trials - found.successes
        brier += found.successes * (1 - p) ** 2 + failures * p**2
        log_score -= found.successes * math.log(p) + failures * math.log(1 - p)
        low, high = predicted.interval
        covered += low <= found.successes / found.trials <= high
        for name, observed in found.values.items():
            samples = predicted.values.get(name)
            if samples:
                scores.setdefault(name, []).extend(crps(samples, y) for y in observed)
    return LedgerRow(
        site,
        embodiment,
        task,
        len(pairs),
        trials,
        successes,
        brier / trials,
        log_score / trials,
        covered / len(pairs),
        {name: math.fsum(v) / len(v) for name, v in scores.items()},
        tuple((p.rate, f.successes / f.trials) for p, f in pairs),
    )

"""Binomial statistics for certifying success rates: confidence bounds, SPRT, fixed-N sizes, McNemar.

Pure Python (no scipy): the few special functions needed are computed to double precision here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from knowledge import wilson_lower_bound


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _beta_quantile(q: float, a: float, b: float) -> float:
    """x with I_x(a, b) = q, by bisection (I is monotone in x)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return betainc(k, n - k + 1, p)


def _check(successes: int, n: int, confidence: float) -> None:
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes}/{n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def wilson_lower(successes: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Wilson score lower bound on the success rate."""
    _check(successes, n, confidence)
    return wilson_lower_bound(
        successes, n, confidence
    )  # the one activation recomputes, so they agree


def clopper_pearson_lower(successes: int, n: int, confidence: float = 0.95) -> float:
    """One-sided exact (Clopper–Pearson) lower bound on the success rate."""
    _check(successes, n, confidence)
    if successes == 0:
        return 0.0
    return _beta_quantile(1 - confidence, successes, n - successes + 1)


def clopper_pearson_interval(
    successes: int, n: int, confidence: float = 0.99
) -> tuple[float, float]:
    """Two-sided exact interval: where a re-run elsewhere must land to count as consistent."""
    _check(successes, n, confidence)
    alpha = (1 - confidence) / 2
    lo = 0.0 if successes == 0 else _beta_quantile(alpha, successes, n - successes + 1)
    hi = 1.0 if successes == n else _beta_quantile(1 - alpha, successes + 1, n - successes)
    return lo, hi


@dataclass(frozen=True)
class SPRT:
    """Wald's sequential test of H0: p = p0 (reject the skill) against H1: p = p1 (accept it).

    `alpha` bounds the chance of accepting a skill whose rate is p0, `beta` of rejecting one at p1.
    Outcomes are examined one by one in branch order, so the decision does not depend on how many
    branches ran at once; an evaluation's branch count truncates the test ("undecided").
    """

    p0: float
    p1: float
    alpha: float = 0.05
    beta: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.p0 < self.p1 < 1.0:
            raise ValueError(f"SPRT needs 0 < p0 < p1 < 1, got p0={self.p0}, p1={self.p1}")
        if not (0.0 < self.alpha < 0.5 and 0.0 < self.beta < 0.5):
            raise ValueError(f"SPRT error rates must be in (0, 0.5), got {self.alpha}, {self.beta}")

    def decide(self, outcomes: Sequence[bool]) -> tuple[str, int]:
        """("accept" | "reject" | "undecided", number of outcomes the decision used)."""
        upper = math.log((1 - self.beta) / self.alpha)
        lower = math.log(self.beta / (1 - self.alpha))
        win = math.log(self.p1 / self.p0)
        loss = math.log((1 - self.p1) / (1 - self.p0))
        llr = 0.0
        for i, ok in enumerate(outcomes, start=1):
            llr += win if ok else loss
            if llr >= upper:
                return "accept", i
            if llr <= lower:
                return "reject", i
        return "undecided", len(outcomes)

    def to_json(self) -> dict:
        return {"p0": self.p0, "p1": self.p1, "alpha": self.alpha, "beta": self.beta}

    @classmethod
    def from_json(cls, data: dict) -> SPRT:
        return cls(float(data["p0"]), float(data["p1"]), float(data["alpha"]), float(data["beta"]))


def fixed_sample_size(p0: float, p1: float, alpha: float = 0.05, beta: float = 0.05) -> int:
    """Smallest n of a one-shot test (accept iff successes >= c) with the same error rates as SPRT."""
    for n in range(1, 100_000):
        c = next((c for c in range(n + 2) if binom_sf(c, n, p0) <= alpha), n + 1)
        if binom_sf(c, n, p1) >= 1 - beta:
            return n
    raise ArithmeticError("no fixed-N test below 100000 branches")


def mcnemar_p(candidate_only: int, incumbent_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs of a paired comparison."""
    n = candidate_only + incumbent_only
    if n == 0:
        return 1.0
    k = min(candidate_only, incumbent_only)
    # P(X <= k) = 1 - P(X >= k + 1) for X ~ Binomial(n, 1/2)
    return min(1.0, 2 * (1.0 - binom_sf(k + 1, n, 0.5)))

"""Binomial statistics for certifying success rates: confidence bounds, SPRT, fixed-N sizes,
McNemar (a public module: `from knowledge.stats import SPRT`).

Activation (a certificate's Wilson bound) and the simulator's evaluations compute with these same
functions, so the bound an evaluation reports is the bound every site's activation recomputes.
Pure Python (no scipy): the few special functions needed are computed to double precision here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "SPRT",
    "betainc",
    "binom_sf",
    "clopper_pearson_interval",
    "clopper_pearson_lower",
    "fixed_sample_size",
    "mcnemar_p",
    "normal_quantile",
    "wilson_lower_bound",
]


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


def wilson_lower_bound(successes: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided Wilson score lower bound on a binomial success rate; 0.0 without trials.

    ValueError if `successes` is not in [0, trials] or `confidence` not in (0, 1).
    """
    if trials <= 0:
        return 0.0
    _check(successes, trials, confidence)
    if successes == 0:
        return 0.0
    z = normal_quantile(confidence)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = p + z * z / (2 * trials)
    margin = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, (centre - margin) / denom)


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


def shortfall_log_ratio(successes: int, trials: int, promised: float, suspect: float) -> float:
    """The log likelihood ratio of "the success rate is `suspect`" to "it is `promised`" after
    `successes` of `trials`. For a skill as good as promised, the chance that it ever exceeds
    log(1/alpha), however long outcomes are watched, is at most alpha (Ville's inequality): the
    field test suspends at that threshold."""
    if not 0.0 < suspect < promised < 1.0:
        raise ValueError(f"need 0 < suspect < promised < 1, got {suspect}, {promised}")
    failures = trials - successes
    return successes * math.log(suspect / promised) + failures * math.log(
        (1 - suspect) / (1 - promised)
    )


def crps(samples: Sequence[float], observed: float) -> float:
    """The continuous ranked probability score of the empirical distribution of `samples` for the
    value `observed` (lower is better; in the units of the value): E|X - y| - E|X - X'| / 2."""
    xs = sorted(samples)
    n = len(xs)
    if not n:
        raise ValueError("crps needs at least one sample")
    spread = sum((2 * i - n + 1) * x for i, x in enumerate(xs)) * 2 / (n * n)
    return math.fsum(abs(x - observed) for x in xs) / n - spread / 2


def fixed_sample_size(p0: float, p1: float, alpha: float = 0.05, beta: float = 0.05) -> int:
    """Smallest n of a one-shot test (accept iff successes >= c) with SPRT's error rates."""
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


def normal_quantile(p: float) -> float:
    """Φ⁻¹(p): Acklam's rational approximation refined by one Halley step (double precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"normal_quantile needs 0 < p < 1, got {p}")
    a = (
        -3.969683028665376e01,
        2.209460984245205e02,
        -2.759285104469687e02,
        1.383577518672690e02,
        -3.066479806614716e01,
        2.506628277459239e00,
    )
    b = (
        -5.447609879822406e01,
        1.615858368580409e02,
        -1.556989798598866e02,
        6.680131188771972e01,
        -1.328068155288572e01,
    )
    c = (
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e00,
        -2.549732539343734e00,
        4.374664141464968e00,
        2.938163982698783e00,
    )
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    low = 0.02425
    if p < low:
        q = math.sqrt(-2 * math.log(p))
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    elif p <= 1 - low:
        q = p - 0.5
        r = q * q
        x = (
            (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
            * q
            / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
        )
    else:
        q = math.sqrt(-2 * math.log(1 - p))
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    e = 0.5 * math.erfc(-x / math.sqrt(2)) - p
    u = e * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
    return x - u / (1 + x * u / 2)

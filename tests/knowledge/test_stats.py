"""Unit tests for knowledge.stats: Wilson and Clopper-Pearson bounds, the binomial tail, the
normal quantile, SPRT, fixed-N sample sizes and McNemar's test."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge.stats import (
    SPRT,
    betainc,
    binom_sf,
    clopper_pearson_interval,
    clopper_pearson_lower,
    fixed_sample_size,
    mcnemar_p,
    normal_quantile,
    wilson_lower_bound,
)

# --- Wilson lower bound -------------------------------------------------------------------------


def _reference_wilson(successes: int, trials: int, confidence: float) -> float:
    z = NormalDist().inv_cdf(confidence)
    p = successes / trials
    n = trials
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / (1 + z * z / n))


def test_wilson_known_value_64_of_64():
    assert wilson_lower_bound(64, 64, 0.95) == pytest.approx(0.9594, abs=1e-4)


def test_wilson_known_values():
    # 95% one-sided: z = 1.6449
    assert wilson_lower_bound(8, 10, 0.95) == pytest.approx(0.5408, abs=1e-4)
    assert wilson_lower_bound(50, 100, 0.95) == pytest.approx(0.4188, abs=1e-4)
    # 97.5% one-sided is the lower end of the textbook two-sided 95% Wilson interval:
    # 7/10 -> [0.3968, 0.8922], 8/10 -> [0.4902, 0.9433]
    assert wilson_lower_bound(7, 10, 0.975) == pytest.approx(0.3968, abs=1e-4)
    assert wilson_lower_bound(8, 10, 0.975) == pytest.approx(0.4902, abs=1e-4)


@pytest.mark.parametrize("trials", [1, 2, 10, 35, 64, 1000])
@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.95, 0.99, 0.999])
def test_wilson_zero_successes_is_zero(trials, confidence):
    assert wilson_lower_bound(0, trials, confidence) == pytest.approx(0.0, abs=1e-12)
    assert wilson_lower_bound(0, trials, confidence) >= 0.0


@pytest.mark.parametrize("trials", [0, -1])
def test_wilson_no_trials_is_zero(trials):
    assert wilson_lower_bound(0, trials, 0.95) == 0.0


@settings(max_examples=200)
@given(st.integers(1, 2000), st.data(), st.floats(0.5, 0.9999))
def test_wilson_monotone_in_successes_and_below_the_rate(trials, data, confidence):
    s = data.draw(st.integers(0, trials - 1))
    low = wilson_lower_bound(s, trials, confidence)
    high = wilson_lower_bound(s + 1, trials, confidence)
    assert 0.0 <= low <= high <= 1.0
    assert low <= s / trials + 1e-12
    assert high <= (s + 1) / trials + 1e-12


@settings(max_examples=200)
@given(st.integers(1, 2000), st.data(), st.floats(0.5, 0.9999))
def test_wilson_matches_a_reference_implementation(trials, data, confidence):
    s = data.draw(st.integers(0, trials))
    assert wilson_lower_bound(s, trials, confidence) == pytest.approx(
        _reference_wilson(s, trials, confidence), abs=1e-9
    )


@settings(max_examples=100)
@given(st.integers(1, 500), st.data())
def test_wilson_higher_confidence_is_more_conservative(trials, data):
    s = data.draw(st.integers(0, trials))
    strict, usual, loose = (wilson_lower_bound(s, trials, c) for c in (0.99, 0.95, 0.8))
    assert strict <= usual + 1e-12 and usual <= loose + 1e-12


def test_wilson_grows_with_more_evidence_at_the_same_rate():
    bounds = [wilson_lower_bound(n, n, 0.95) for n in (8, 16, 32, 64, 128)]
    assert bounds == sorted(bounds) and bounds[0] < bounds[-1] < 1.0


# --- the simulator's certification statistics ---------------------------------------------------


def test_known_lower_bounds_for_64_of_64():
    assert clopper_pearson_lower(64, 64, 0.95) == pytest.approx(0.05 ** (1 / 64), abs=1e-12)
    assert round(clopper_pearson_lower(64, 64, 0.95), 3) == 0.954
    assert round(wilson_lower_bound(64, 64, 0.95), 3) == 0.959


def test_59_straight_successes_certify_095_and_58_do_not():
    assert clopper_pearson_lower(59, 59) >= 0.95
    assert clopper_pearson_lower(58, 58) < 0.95


def test_clopper_pearson_interval_matches_published_values():
    low, high = clopper_pearson_interval(5, 10, 0.95)
    assert low == pytest.approx(0.187086, abs=1e-6)
    assert high == pytest.approx(0.812914, abs=1e-6)
    assert clopper_pearson_interval(0, 10, 0.95)[0] == 0.0
    assert clopper_pearson_interval(10, 10, 0.95)[1] == 1.0


def test_bounds_are_zero_without_successes_and_reject_bad_input():
    assert clopper_pearson_lower(0, 20) == 0.0
    assert wilson_lower_bound(0, 20) == 0.0
    with pytest.raises(ValueError):
        wilson_lower_bound(5, 4)
    with pytest.raises(ValueError):
        wilson_lower_bound(-1, 4)
    with pytest.raises(ValueError):
        wilson_lower_bound(1, 2, confidence=1.0)
    with pytest.raises(ValueError):
        clopper_pearson_lower(1, 2, confidence=1.0)


def test_normal_quantile_and_incomplete_beta():
    assert normal_quantile(0.95) == pytest.approx(1.6448536269514722, abs=1e-14)
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-15)
    assert normal_quantile(1e-9) == pytest.approx(-5.997807015007686, abs=1e-9)
    # I_x(a, b) = 1 - I_{1-x}(b, a), and the binomial tail agrees with a direct sum
    assert betainc(3.5, 2.0, 0.3) == pytest.approx(1 - betainc(2.0, 3.5, 0.7), abs=1e-14)
    direct = sum(math.comb(20, j) * 0.3**j * 0.7 ** (20 - j) for j in range(7, 21))
    assert binom_sf(7, 20, 0.3) == pytest.approx(direct, rel=1e-12)


def test_fixed_sample_size_for_085_vs_095():
    assert fixed_sample_size(0.85, 0.95, 0.05, 0.05) == 93


def test_sprt_decisions():
    test = SPRT(0.85, 0.95, 0.05, 0.05)
    upper = math.log(0.95 / 0.05)
    win = math.log(0.95 / 0.85)
    assert test.decide([True] * 100) == ("accept", math.ceil(upper / win))
    lower = math.log(0.05 / 0.95)
    loss = math.log(0.05 / 0.15)
    assert test.decide([False] * 10) == ("reject", math.ceil(lower / loss))
    assert test.decide([True] * 5 + [False]) == ("undecided", 6)
    # one failure among many successes delays acceptance
    decision, n = test.decide([False] + [True] * 100)
    assert decision == "accept" and n > math.ceil(upper / win)
    assert SPRT.from_json(test.to_json()) == test
    with pytest.raises(ValueError):
        SPRT(0.9, 0.8)


def test_mcnemar():
    assert mcnemar_p(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(3, 3) == 1.0


# --- properties -----------------------------------------------------------------------------------


@settings(max_examples=200)
@given(st.floats(1e-12, 1 - 1e-12))
def test_normal_quantile_inverts_the_normal_cdf(p):
    assert NormalDist().cdf(normal_quantile(p)) == pytest.approx(p, rel=1e-9, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.data(), st.floats(0.5, 0.999))
def test_exact_bounds_hold_the_observed_rate(n, data, confidence):
    s = data.draw(st.integers(0, n))
    exact = clopper_pearson_lower(s, n, confidence)
    assert 0.0 <= exact <= s / n + 1e-12
    assert 0.0 <= wilson_lower_bound(s, n, confidence) <= s / n + 1e-12
    low, high = clopper_pearson_interval(s, n, confidence)
    assert 0.0 <= low <= s / n <= high <= 1.0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.data(), st.floats(0.01, 0.99))
def test_binomial_tail_matches_a_direct_sum(n, data, p):
    k = data.draw(st.integers(-1, n + 1))
    direct = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(max(k, 0), n + 1))
    assert binom_sf(k, n, p) == pytest.approx(min(direct, 1.0), rel=1e-9, abs=1e-12)


@settings(max_examples=100)
@given(st.lists(st.booleans(), max_size=200))
def test_sprt_uses_no_more_outcomes_than_it_was_given(outcomes):
    decision, used = SPRT(0.85, 0.95).decide(outcomes)
    assert decision in ("accept", "reject", "undecided") and 0 <= used <= len(outcomes)
    assert decision != "undecided" or used == len(outcomes)

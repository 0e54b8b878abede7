import math

import pytest

from knowledge._policy import normal_quantile
from sim._stats import betainc, binom_sf, mcnemar_p
from sim.evaluation import (
    SPRT,
    clopper_pearson_interval,
    clopper_pearson_lower,
    fixed_sample_size,
    wilson_lower,
)


def test_known_lower_bounds_for_64_of_64():
    assert clopper_pearson_lower(64, 64, 0.95) == pytest.approx(0.05 ** (1 / 64), abs=1e-12)
    assert round(clopper_pearson_lower(64, 64, 0.95), 3) == 0.954
    assert round(wilson_lower(64, 64, 0.95), 3) == 0.959


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
    assert wilson_lower(0, 20) == 0.0
    with pytest.raises(ValueError):
        wilson_lower(5, 4)
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

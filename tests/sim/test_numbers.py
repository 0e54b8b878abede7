import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from knowledge import canonical_json, content_hash
from sim._numbers import finite_floats, is_number


def test_canonical_json_sorts_keys_and_drops_whitespace():
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_is_number_excludes_bools_and_non_finite():
    assert is_number(1) and is_number(2.5)
    assert not is_number(True) and not is_number(math.inf) and not is_number("1")


@given(
    st.lists(
        st.one_of(
            st.floats(),
            st.integers(-(2**1100), 2**1100),
            st.booleans(),
            st.none(),
            st.text(max_size=2),
            st.floats(width=32).map(np.float32),
            st.integers(-(2**62), 2**62).map(np.int64),
        ),
        max_size=6,
    )
)
def test_finite_floats_keeps_exactly_the_finite_real_numbers(values):
    def one(value):
        if isinstance(value, (bool, str)) or value is None:
            return None
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) else None

    expected = [one(v) for v in values]
    out = finite_floats(values)
    assert out == (None if None in expected else expected)
    assert out is None or all(type(f) is float for f in out)

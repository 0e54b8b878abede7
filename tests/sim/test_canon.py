import math

import pytest

from sim._canon import canonical_json, content_hash, is_number


def test_canonical_json_sorts_keys_and_drops_whitespace():
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_is_number_excludes_bools_and_non_finite():
    assert is_number(1) and is_number(2.5)
    assert not is_number(True) and not is_number(math.inf) and not is_number("1")

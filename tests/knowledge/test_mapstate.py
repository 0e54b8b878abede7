"""A map's interned values (knowledge._mapstate): one code per value, whichever way it arrives
(parsed, or as JSON text in any spelling) and however often the lookup caches start over."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import _mapstate
from knowledge._canonical import canonical_json
from knowledge._mapstate import MapState

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def _reordered(value):
    """An equal value whose dicts list their keys the other way round (another repr)."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(value)}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


def _intern_all(m: MapState, values: list, spelled: list[bool], flip: bool) -> list[int]:
    """Each value's code, given parsed or as JSON text (spaced) as `spelled` says; `flip` spells
    each the other way (keys in the other order, sorted in texts)."""
    return [
        (
            m.code_of_text(json.dumps(_reordered(v) if flip else v, sort_keys=flip))
            if as_text
            else m.code_of(_reordered(v) if flip else v)
        )
        for v, as_text in zip(values, spelled, strict=True)
    ]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(JSON, min_size=1, max_size=30),
    spelled=st.lists(st.booleans(), min_size=30, max_size=30),
    cap=st.sampled_from([1, 2, 3, 1 << 16]),
    data=st.data(),
)
def test_equal_values_get_one_code_and_the_palette_gives_them_back(values, spelled, cap, data):
    values += data.draw(st.lists(st.sampled_from(values), max_size=20))  # some written again
    spelled = (spelled * 2)[: len(values)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_mapstate, "_MAX_SEEN", cap)  # tiny caps: the caches start over often
        m = MapState()
        codes = _intern_all(m, values, spelled, flip=False)
        again = _intern_all(m, values, [not s for s in spelled], flip=True)
    assert codes == again
    texts = [canonical_json(v) for v in values]
    for i, code in enumerate(codes):
        for j, other in enumerate(codes):
            assert (code == other) == (texts[i] == texts[j])
        assert canonical_json(m.values[code]) == texts[i]
        assert m.palette()[code] is m.values[code]
    assert sorted(m.codes.values()) == list(range(len(m.values)))  # dense: no code skipped


def test_code_zero_is_the_tombstones_null():
    m = MapState()
    assert m.code_of(None) == 0 and m.code_of_text("null") == 0 and m.values[0] is None
    assert m.code_of({"a": 1}) == m.code_of_text('{ "a" : 1 }') == 1
    assert list(m.palette()) == [None, {"a": 1}]

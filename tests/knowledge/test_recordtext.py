"""Tests of knowledge._recordtext: the limits every record obeys, and the one parse of a record.

The common case takes a few C-speed passes instead of the character-by-character scan and the
careful parse; property tests hold it to exactly what those give, on texts built to sit at the
edges (deep brackets, long digit runs, exponents, constants, escapes, non-ASCII, lone surrogates).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge._canonical import canonical_json
from knowledge._errors import RecordError
from knowledge._records import plain_cell
from knowledge._recordtext import (
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    PlainCells,
    _careful_load,
    _scan_limits,
    load_record,
    parse_plain,
    record_limits,
    record_refusal,
)
from knowledge._yjs import ParsedUpdate

PIECES = [
    '{"a":',
    '"b"',
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "1",
    "0.5",
    "-2",
    "1e5",
    "1E400",
    "9" * MAX_NUMBER_CHARS,
    "9" * (MAX_NUMBER_CHARS + 1),
    "NaN",
    "Infinity",
    "-Infinity",
    '"\\ud800"',
    '"\\u00e9"',
    '"é"',
    '"\ud800"',
    "true",
    "null",
    " ",
    '"x\\"y"',
    '"[[["',
]


@st.composite
def record_texts(draw):
    """A record's JSON with edge pieces spliced in, or a nest of brackets around one."""
    value = draw(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
            max_leaves=6,
        )
    )
    text = json.dumps({"hlc": draw(st.integers(0, 2**64 - 1)), "v": 1, "value": value})
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + "".join(draw(st.lists(st.sampled_from(PIECES), max_size=4))) + text[at:]
    if draw(st.integers(0, 4)) == 0:
        depth = draw(st.integers(MAX_DEPTH - 2, MAX_DEPTH + 2))
        text = '{"a":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"
    return text


def _outcome(load, text: str) -> object:
    try:
        return load(text)
    except RecordError as exc:
        return str(exc)


@settings(max_examples=600, deadline=None)
@given(record_texts())
def test_the_common_case_agrees_with_the_scans(text):
    assert record_limits(text) == _scan_limits(text)
    plain = parse_plain(text)
    if _scan_limits(text) is None:
        careful = _outcome(_careful_load, text)
        assert plain is None or plain == careful
        assert _outcome(load_record, text) == careful
    else:
        assert plain is None  # nothing beyond the limits is parsed
        assert isinstance(_outcome(load_record, text), str)


def test_plain_records_are_parsed_at_one_go_and_others_are_left_to_the_careful_parse():
    text = '{"confidence":0.5,"deleted":false,"hlc":7,"v":1,"value":{"occupied":true}}'
    assert parse_plain(text) == json.loads(text)
    for other in ['{"a":1e400}', '{"a":NaN}', '{"a":"\\ud800"}', "[1]", ' {"a":1}', '{"a":1} ']:
        assert parse_plain(other) is None
    with pytest.raises(RecordError, match="beyond a 64-bit float"):
        load_record('{"a":1e400}')
    assert load_record('{"a":1} ') == {"a": 1}


def test_the_screen_hands_each_parse_to_the_views_and_refuses_as_before():
    ok = '{"hlc":5,"v":1}'
    odd = '{"hlc":5,"v":NaN}'  # kept (the views report it), its time still counted
    loaded: dict = {}
    assert record_refusal(ParsedUpdate(strings=[ok, odd, "not json"]), 5, loaded) is None
    assert loaded == {ok: {"hlc": 5, "v": 1}}
    ahead = record_refusal(ParsedUpdate(strings=['{"hlc":6,"v":NaN}']), 5)
    assert ahead is not None and ahead[0] == "record_clock_ahead"
    deep = '{"a":' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"
    refused = record_refusal(ParsedUpdate(strings=[deep]), 5)
    assert refused == ("oversized_record", f"record nests {MAX_DEPTH + 1} deep; the limit is 64")


@settings(max_examples=300, deadline=None)
@given(st.lists(record_texts(), max_size=6), st.integers(0, 2**64 - 1))
def test_the_screen_of_an_update_is_the_screen_of_each_record(texts, hlc):
    together: dict = {}
    verdict = record_refusal(ParsedUpdate(strings=texts), hlc, together)
    alone: dict = {}
    for text in texts:
        one = record_refusal(ParsedUpdate(strings=[text]), hlc, alone)
        if one is not None:
            assert verdict == one  # the first refusal is the update's
            return
    assert verdict is None and together == alone


# values of the shape the columns take (`_CELL`), and others near them
SIMPLE = st.none() | st.booleans() | st.integers(-999, 999) | st.text("ab ,:{}[]0", max_size=4)
SIMPLE |= st.floats(-99, 99).map(lambda x: round(x, 2))
SCALARS = SIMPLE | st.integers(-(10**45), 10**45) | st.text(max_size=4) | st.floats()
SCALARS = SCALARS.filter(lambda x: x == x and x not in (float("inf"), float("-inf")))


def usually(common, odd):
    """`common` seven times in eight, else `odd`."""
    return st.integers(0, 7).flatmap(lambda n: odd if n == 0 else common)


@st.composite
def cell_texts(draw):
    """A cell record's text as writers make it (canonical JSON), or nearly: fields of other types,
    beyond their ranges, missing, extra, nested values, other spacing, edge pieces spliced in."""
    flat = st.dictionaries(st.text("ab:,{", max_size=3), SIMPLE, max_size=3)
    record = {
        "confidence": draw(
            usually(
                st.floats(0, 1).map(lambda x: round(x, 4)),
                st.floats(-0.5, 1.5) | st.sampled_from([0, 1, -0.0, True]),
            )
        ),
        "hlc": draw(usually(st.integers(0, 2**64 - 1), st.sampled_from([2**64, -1, 1.5, False]))),
        "v": draw(usually(st.just(1), st.sampled_from([2, 1.0, "1"]))),
        "value": draw(
            usually(
                SIMPLE | flat,
                st.recursive(
                    SCALARS | st.floats(0, 1),
                    lambda inner: (
                        st.dictionaries(st.text(max_size=3), inner) | st.lists(inner, max_size=2)
                    ),
                ),
            )
        ),
    }
    if draw(st.booleans()):
        record["deleted"] = draw(usually(st.booleans(), st.just(None)))
    if draw(st.integers(0, 9)) == 0:
        record[draw(st.sampled_from(["note", "hlc", "a"]))] = 1
    if draw(st.integers(0, 9)) == 0:
        text = json.dumps(record, sort_keys=draw(st.booleans()))
    else:
        text = canonical_json(record).decode()
    if draw(st.integers(0, 9)) == 0:
        at = draw(st.integers(0, len(text)))
        pieces = st.sampled_from([*PIECES, "\x00", '}\x00{"confidence":0.5', '"', "\\"])
        text = text[:at] + "".join(draw(st.lists(pieces, max_size=3))) + text[at:]
    return text


@settings(max_examples=600, deadline=None)
@given(st.lists(cell_texts(), min_size=1, max_size=4), st.integers(0, 2**64 - 1))
def test_cell_records_read_as_columns_are_what_their_parse_gives(texts, hlc):
    cells = PlainCells()
    times = cells.read(texts)
    if times is None:
        assert not cells.at and not cells.texts  # took nothing
    else:
        for text, time in zip(texts, times, strict=True):
            row = cells.at[text]
            assert record_limits(text) is None
            record = load_record(text)
            assert cells.record(row) == record and time == record["hlc"]
            read = (cells.conf[row], cells.hlc[row], cells.deleted[row], cells.values[row])
            assert [type(x) for x in read] == [float, int, bool, str]
            assert plain_cell(record) == (*read[:3], json.loads(read[3]))
    # the screen says the same with the columns as without
    with_columns = record_refusal(ParsedUpdate(strings=texts), hlc, {}, PlainCells())
    assert with_columns == record_refusal(ParsedUpdate(strings=texts), hlc, {})


BULK_VALUE = SIMPLE | st.dictionaries(st.text("ab_ ", max_size=4), SIMPLE, max_size=3)
BULK_CELL = st.fixed_dictionaries(
    {
        "confidence": st.floats(0, 1).map(lambda x: round(x, 3)),
        "hlc": st.integers(0, 2**64 - 1),
        "v": st.just(1),
        "value": BULK_VALUE,
    },
    optional={"deleted": st.booleans()},
).map(lambda record: canonical_json(record).decode())


@settings(max_examples=300, deadline=None)
@given(st.lists(BULK_CELL, min_size=1, max_size=8), st.integers(0, 2**64 - 1))
def test_a_bulk_writes_cells_always_take_the_columns_and_read_as_their_parse(texts, hlc):
    """Every batch of cell records as writers make them goes by the columns (the test above meets
    that path in a few of its draws), and the columns are what the careful parse gives."""
    cells = PlainCells()
    times = cells.read(texts)
    assert times is not None
    for text, time in zip(texts, times, strict=True):
        row = cells.at[text]
        record = _careful_load(text)
        assert time == record["hlc"] and cells.record(row) == record
        read = (cells.conf[row], cells.hlc[row], cells.deleted[row], json.loads(cells.values[row]))
        assert plain_cell(record) == read
    assert record_refusal(ParsedUpdate(strings=texts), hlc, {}, PlainCells()) == record_refusal(
        ParsedUpdate(strings=texts), hlc, {}
    )


def test_a_bulk_writes_cell_records_are_read_as_columns_and_a_late_one_refused():
    texts = [
        canonical_json({"confidence": 0.5, "deleted": d, "hlc": t, "v": 1, "value": v}).decode()
        for t, d, v in [(3, False, {"occupied": True}), (4, True, None), (5, False, "wall")]
    ]
    texts.append('{"confidence":1.0,"hlc":6,"v":1,"value":-2.5}')  # no "deleted": not deleted
    cells = PlainCells()
    assert record_refusal(ParsedUpdate(strings=texts), 6, {}, cells) is None
    assert cells.hlc == [3, 4, 5, 6] and cells.deleted == [False, True, False, False]
    assert cells.values == ['{"occupied":true}', "null", '"wall"', "-2.5"]
    late = record_refusal(ParsedUpdate(strings=texts), 5, {}, PlainCells())
    assert late == ("record_clock_ahead", "a record claims time 6, later than its envelope's 5")
    nested = texts[:1] + ['{"confidence":0.5,"hlc":1,"v":1,"value":{"a":{"b":1}}}']
    assert PlainCells().read(nested) is None  # the general path takes it
    brackets = '{"confidence":0.5,"hlc":1,"v":1,"value":"%s"}' % ("[" * (MAX_DEPTH + 1))
    assert cells.read([brackets]) == [1] and cells.record(4) == json.loads(brackets)
    long = '{"confidence":0.5,"hlc":1,"v":1,"value":1%s}' % ("0" * MAX_NUMBER_CHARS)
    assert PlainCells().read([long]) is None and record_limits(long) is not None

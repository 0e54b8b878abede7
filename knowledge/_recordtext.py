"""A record's text: the limits every record obeys, checked before anything deep is parsed, and its
parse; what ingest reads of the records of an update before applying it.

Records are JSON objects in strings (see `_records`). A receiver holds every string an update
writes to the limits (size, nesting, digits) before parsing any, so a record nested 20,000 deep or
holding a 500-digit number never reaches a JSON parser. Most records are plain ASCII with short
numbers: `parse_plain` takes those in a few C-speed passes, and ingest hands its parses to the
views (`Views.loaded`) so that each record is parsed once.
"""

from __future__ import annotations

import json
import math
import re
from itertools import repeat
from json.scanner import make_scanner
from typing import Any

from ._errors import RecordError
from ._yjs import ParsedUpdate

MAX_RECORD_BYTES = 256 * 1024
MAX_DEPTH = 64  # JSON nesting a record may have: checked before anything deep is parsed
MAX_NUMBER_CHARS = 40  # a run of digits longer than this is no number a record needs
_STRINGS = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.S)  # possessive: linear even on unclosed strings
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_BRACKETS = re.compile(r"[\[\]{}]")
_LONG_NUMBER = re.compile(r"[0-9]{%d,}" % (MAX_NUMBER_CHARS + 1))
# Every digit as "0" and every exponent letter as "e": digit runs and exponents found by `in`.
_NUMERALS = bytes.maketrans(b"0123456789E", b"0000000000e")
_LONG_RUN = b"0" * (MAX_NUMBER_CHARS + 1)


def record_limits(text: str) -> str | None:
    """Why a record's text is beyond what any record may be (size, nesting, number length), or None.

    These limits hold for every record type, known or not, so a receiver checks them before parsing
    anything: a record nested 20,000 deep or with a 500-digit number never reaches the JSON parser.
    """
    if (
        text.isascii()
        and len(text) <= MAX_RECORD_BYTES
        and text.count("[") + text.count("{") <= MAX_DEPTH
        and _LONG_RUN not in text.encode().translate(_NUMERALS)
    ):
        # the common case, at C speed: no more brackets than the depth allowed (strings included),
        # no long digit run anywhere (removing strings cannot make one: a quote stays between)
        return None
    return _scan_limits(text)


def _scan_limits(text: str) -> str | None:
    """`record_limits`, read character by character (what the common case saves)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "record holds a lone UTF-16 surrogate: it is no UTF-8 text (Yjs would panic on it)"
    if size > MAX_RECORD_BYTES:
        return f"record of {size} bytes exceeds {MAX_RECORD_BYTES}"
    bare = _STRINGS.sub('""', text)
    depth = deepest = 0
    for bracket in _BRACKETS.findall(bare):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return f"record nests {deepest} deep; the limit is {MAX_DEPTH}"
    if _LONG_NUMBER.search(bare):
        return f"record holds a number of more than {MAX_NUMBER_CHARS} digits"
    return None


def parse_plain(text: str) -> dict[str, Any] | None:
    """What `load_record(text)` gives, if `text` is a JSON object of the kind records mostly are:
    ASCII, no more brackets than the nesting allowed, no long digit run (so within every limit),
    no exponent, constant or escape (so plain parsing is as strict as the careful one). None for
    any other text: `record_limits` and `load_record` judge it."""
    return _object(text) if _plain(text) else None


def _plain(text: str) -> bool:
    """ASCII, with no escape, constant, exponent or digit run beyond the limit (see `parse_plain`);
    true of several texts joined by a NUL iff true of each."""
    if not text.isascii() or "\\u" in text or "NaN" in text or "Infinity" in text:
        return False
    numerals = text.encode().translate(_NUMERALS)
    return _LONG_RUN not in numerals and b"0e" not in numerals


def _object(text: str) -> dict[str, Any] | None:
    """`parse_plain` of a text `_plain` holds true of."""
    if len(text) > MAX_RECORD_BYTES or text.count("[") + text.count("{") > MAX_DEPTH:
        return None
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return value if end == len(text) and type(value) is dict else None


def load_record(text: str, *, within_limits: bool = False) -> dict[str, Any]:
    """Parse a record's JSON object within the limits every record obeys (`within_limits`: the
    caller checked them already); RecordError says what is wrong."""
    if not isinstance(text, str):
        raise RecordError(f"record value must be a JSON string, not {type(text).__name__}")
    plain = parse_plain(text)
    if plain is not None:
        return plain
    refusal = None if within_limits else record_limits(text)
    if refusal is not None:
        raise RecordError(refusal)
    return _careful_load(text)


def _careful_load(text: str) -> dict[str, Any]:
    """`load_record` of a text within the limits, whatever it holds (what `parse_plain` saves)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        if _SURROGATE_ESCAPE.search(
            text
        ):  # an escaped lone surrogate is valid JSON but no text at all
            json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise RecordError(
            "record holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"record is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RecordError("a record must be a JSON object")
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not standard JSON")


# What makes plain parsing differ from `load_record`'s careful one: an exponent (an infinite
# float: digit runs are at most MAX_NUMBER_CHARS long, so only an exponent overflows), NaN or
# Infinity (constants), a \u escape (a lone surrogate). Without them, the C scanner alone decides.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_SCAN = make_scanner(_DECODER)  # type: ignore[arg-type]  # typeshed: it takes a decoder


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond a 64-bit float")
    return value


def record_refusal(
    parsed: ParsedUpdate,
    hlc: int,
    loaded: dict[str, dict[str, Any]] | None = None,
    cells: PlainCells | None = None,
) -> tuple[str, str] | None:
    """(reason, detail) if a record the update writes is beyond every record's limits, or claims a
    time later than its envelope's (which would win its map cell for ever); None if every record is
    fine. Each record parsed is left in `loaded` for the views (`Views.loaded`); or, if every one
    is a cell record as writers make them, read into `cells` (`Views.plain`).

    Records of types this version does not know are held to the same rules, so nothing deep is
    parsed.
    """
    times = None if cells is None else cells.read(parsed.strings)
    if times is not None:  # every record a plain cell record (a bulk write's)
        ahead = [t for t in times if t > hlc]
        return None if not ahead else _clock_ahead(ahead[0], hlc)
    plain = _plain("\x00".join(parsed.strings))  # most updates' records, at one go
    records = _objects(parsed.strings) if plain else None
    if records is not None:  # every record a plain object: their times, at one go too
        if loaded is not None:
            loaded.update(zip(parsed.strings, records, strict=True))
        claims = [record.get("hlc") for record in records]
        late: list[int] = [c for c in claims if type(c) is int and c > hlc]  # (ints or bools)
        return None if not late else _clock_ahead(late[0], hlc)
    for text in parsed.strings:
        record: Any = _object(text) if plain else parse_plain(text)
        if record is None:
            refusal = record_limits(text)
            if refusal is not None:
                return "oversized_record", refusal
            try:
                record = load_record(text, within_limits=True)
            except RecordError:  # the views will say why; its time counts all the same
                try:
                    record = json.loads(text)
                except ValueError:
                    continue  # not a record this version can read: kept, forwarded, reported
            else:
                if loaded is not None:
                    loaded[text] = record
        elif loaded is not None:
            loaded[text] = record
        claimed = record.get("hlc") if isinstance(record, dict) else None
        if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed > hlc:
            return _clock_ahead(claimed, hlc)
    return None


def _clock_ahead(claimed: int, hlc: int) -> tuple[str, str]:
    return "record_clock_ahead", f"a record claims time {claimed}, later than its envelope's {hlc}"


def _objects(texts: list[str]) -> list[dict[str, Any]] | None:
    """`_object` of each of `texts` (which `_plain` holds true of), if every one is a plain JSON
    object; else None (the caller goes text by text). The checks and parses as `_object` makes
    them, a pass each over the lot."""
    if not texts or max(map(len, texts)) > MAX_RECORD_BYTES:
        return None
    if (
        max(map(str.count, texts, repeat("["))) + max(map(str.count, texts, repeat("{")))
        > MAX_DEPTH
    ):
        return None  # (some text may be within the depth even so: `_object` judges it)
    try:
        values, ends = zip(*map(_SCAN, texts, repeat(0)), strict=True)
    except (StopIteration, ValueError, RecursionError):
        return None
    if list(ends) != list(map(len, texts)) or not all(type(v) is dict for v in values):
        return None
    return list(values)


# A cell record as writers make it (canonical JSON of the shape `_records.plain_cell` reads: keys
# sorted, no spaces), its value a scalar or an object of scalars: (confidence, deleted, hlc, the
# value's JSON text). A text this matches is one JSON object of exactly these keys, ASCII, with no
# escape, exponent or number of more than MAX_NUMBER_CHARS digits: within every record limit but
# size, and its plain parse is its careful one.
_DIGITS = r"(?:0|[1-9][0-9]{0,%d})" % (MAX_NUMBER_CHARS - 1)
_STR = r'"[ !#-\[\]-~]*"'  # printable ASCII but quote and backslash
_SCALAR = rf"(?:{_STR}|-?{_DIGITS}(?:\.[0-9]{{1,{MAX_NUMBER_CHARS}}})?|true|false|null)"
_VALUE = rf"(?:{_SCALAR}|\{{(?:{_STR}:{_SCALAR}(?:,{_STR}:{_SCALAR})*)?\}})"
_CELL = re.compile(
    rf'\{{"confidence":(-?{_DIGITS}\.[0-9]{{1,{MAX_NUMBER_CHARS}}}),(?:"deleted":(true|false),)?'
    rf'"hlc":({_DIGITS}),"v":1,"value":({_VALUE})\}}'
)
_CELL_START = '{"confidence":'
MAX_TIMESTAMP = 2**64 - 1  # as `_records` (which reads records through this module)


class PlainCells:
    """Cell records of the common shape read at ingest, as columns: by text, what
    `_records.plain_cell` gives of its parse, the value as its JSON text. The views take bulk
    writes' cells from here without parsing a record (`MapViews.put_plain`)."""

    __slots__ = ("at", "texts", "conf", "hlc", "deleted", "values")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.at: dict[str, int] = {}  # a record's text -> its row in the columns
        self.texts: list[str] = []
        self.conf: list[float] = []
        self.hlc: list[int] = []
        self.deleted: list[bool] = []
        self.values: list[str] = []

    def read(self, texts: list[str]) -> list[int] | None:
        """Take `texts` if every one is such a record within the limits `plain_cell` checks; their
        times. None, taking nothing, otherwise."""
        if not texts or not texts[0].startswith(_CELL_START):
            return None  # (other records: not worth a pass)
        found = [m.groups() for m in map(_CELL.fullmatch, texts) if m is not None]
        if len(found) < len(texts) or max(map(len, texts)) > MAX_RECORD_BYTES:
            return None
        conf_texts, deleted, hlc_texts, values = zip(*found, strict=True)
        conf, hlc = list(map(float, conf_texts)), list(map(int, hlc_texts))
        if min(conf) < 0.0 or max(conf) > 1.0 or max(hlc) > MAX_TIMESTAMP:
            return None
        start = len(self.texts)
        self.at.update(zip(texts, range(start, start + len(texts)), strict=True))
        self.texts += texts
        self.conf += conf
        self.hlc += hlc
        self.deleted += [d == "true" for d in deleted]
        self.values += values
        return hlc

    def record(self, row: int) -> dict[str, Any]:
        """The record at `row`, parsed (as `load_record` gives it)."""
        return load_record(self.texts[row], within_limits=True)

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
    parsed: ParsedUpdate, hlc: int, loaded: dict[str, dict[str, Any]] | None = None
) -> tuple[str, str] | None:
    """(reason, detail) if a record the update writes is beyond every record's limits, or claims a
    time later than its envelope's (which would win its map cell for ever); None if every record is
    fine. Each record parsed is left in `loaded` for the views (`Views.loaded`).

    Records of types this version does not know are held to the same rules, so nothing deep is
    parsed.
    """
    plain = _plain("\x00".join(parsed.strings))  # most updates' records, at one go
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
            return (
                "record_clock_ahead",
                f"a record claims time {claimed}, later than its envelope's {hlc}",
            )
    return None

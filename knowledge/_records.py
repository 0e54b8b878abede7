"""Record types stored in a feed, their keys and their schema checks.

Every feed's pycrdt Doc holds two root Maps (``immutable`` and ``records``: see `_feed`), from key
to a JSON string. The key's first segment names the record type (``skill/<id>``,
``cell/<map>/<cell>``, ...). Immutable records (skills, certificates) are content-addressed: their
id is the SHA-256 of the exact UTF-8 bytes of their JSON string, so a verifier never has to
re-canonicalize. Types this version does not know, and records with a higher schema version ``v``,
are kept and forwarded but skipped by the views (mixed-version fleets).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ._canonical import canonical_json, content_hash, sha256_hex
from ._errors import RecordError
from ._recordtext import MAX_DEPTH as MAX_DEPTH
from ._recordtext import MAX_NUMBER_CHARS as MAX_NUMBER_CHARS
from ._recordtext import MAX_RECORD_BYTES as MAX_RECORD_BYTES
from ._recordtext import load_record
from ._recordtext import record_limits as record_limits

SCHEMA_VERSION = 1
MAX_TEXT = 4000
MAX_INT = 2**53 - 1  # counts must survive JSON parsers that use float64
MAX_TIMESTAMP = (
    2**64 - 1
)  # HLC timestamps are unsigned 64-bit integers: parse JSON integers exactly
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAP_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_CELL_CHARS = 256
TILE_CELLS = 4096  # the most cells a tile record holds (see _tiles)
TILE_EDGE = {1: 4096, 2: 64, 3: 16}  # cells along each axis of a tile, by number of coordinates
COORD_MIN, COORD_MAX = -(2**31), 2**31 - 1  # the coordinates of cells that tiles hold
_TILE_NAME = re.compile(r"(?:0|-?[1-9][0-9]{0,9})(?:,(?:0|-?[1-9][0-9]{0,9})){0,2}")


class Role(str, Enum):
    """What a writer may do; a site root delegates roles to its device keys."""

    PUBLISH = "publish"
    VALIDATE = "validate"
    REVOKE = "revoke"


ALL_ROLES = frozenset(Role)


class RecordType(str, Enum):
    SKILL = "skill"
    WITHDRAW = "withdraw"
    CELL = "cell"
    TILE = "tile"
    COUNTER = "counter"
    CERT = "cert"
    REVOKE = "revoke"
    DELEGATE = "delegate"
    KEY_REVOKE = "keyrevoke"
    TASK = "task"
    CHECK = "check"
    OUTCOME = "outcome"
    SUSPEND = "suspend"


# The role a writer needs for its records of each type to count; None: only a trusted site root.
REQUIRED_ROLE: dict[RecordType, Role | None] = {
    RecordType.SKILL: Role.PUBLISH,
    RecordType.WITHDRAW: Role.PUBLISH,
    RecordType.CELL: Role.PUBLISH,
    RecordType.TILE: Role.PUBLISH,
    RecordType.COUNTER: Role.PUBLISH,
    RecordType.CERT: Role.VALIDATE,
    RecordType.REVOKE: Role.REVOKE,
    RecordType.DELEGATE: None,
    RecordType.KEY_REVOKE: None,
    RecordType.TASK: Role.PUBLISH,
    RecordType.CHECK: Role.VALIDATE,
    RecordType.OUTCOME: Role.PUBLISH,
    RecordType.SUSPEND: Role.VALIDATE,
}

COUNTER_FIELDS = ("uses", "successes", "failures")
TRUST_PREFIXES = (RecordType.DELEGATE.value + "/", RecordType.KEY_REVOKE.value + "/")
# Records that, once written, are never replaced or removed: a feed that tries is refused.
IMMUTABLE_PREFIXES = tuple(
    t.value + "/"
    for t in (
        RecordType.SKILL,
        RecordType.CERT,
        RecordType.REVOKE,
        RecordType.TASK,
        RecordType.CHECK,
    )
)
MAX_FIELD_VALUES = 512  # the most recent values of each continuous outcome an outcome record keeps
VERDICTS = ("reproduced", "disputed")  # a spot check's outcome; a disputed check is a dispute


def record_text(record: Any) -> str:
    """A record as the string a feed stores: its canonical JSON (CanonicalJSONError if none)."""
    return canonical_json(record).decode()


def content_id(text: str) -> str:
    """The id of an immutable record: the SHA-256 of its text's exact UTF-8 bytes."""
    return sha256_hex(text.encode())


def cell_key(cell: str | tuple[int, ...] | list[int]) -> str:
    """The string form of a map cell: strings as they are, integer tuples as "x,y[,z]"."""
    if isinstance(cell, str):
        text = cell
    elif (
        isinstance(cell, (tuple, list))
        and cell
        and all(isinstance(c, int) and not isinstance(c, bool) for c in cell)
    ):
        text = ",".join(str(c) for c in cell)
    else:
        raise RecordError(f"a map cell is a string or a tuple of ints, not {cell!r}")
    if not 0 < len(text) <= MAX_CELL_CHARS:
        raise RecordError(f"a map cell name has 1 to {MAX_CELL_CHARS} characters, not {len(text)}")
    return text


def is_map_name(name: str) -> bool:
    return isinstance(name, str) and _MAP_NAME.fullmatch(name) is not None


def check_map_name(name: str) -> str:
    if not is_map_name(name):
        raise RecordError(
            f"map name {name!r} must be 1-128 characters of letters, digits and . _ : -"
        )
    return name


def check_skill_id(value: Any, what: str = "skill id") -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise RecordError(f"{what} must be 64 lowercase hex digits, not {value!r}")
    return value


def task_assets(definition: Any) -> dict[str, str]:
    """The files a task definition carries by hash (its "assets": relative name -> blob sha256).
    Read leniently, as views read records: entries that are not a name and a hash are skipped (the
    simulator refuses such a task when it compiles it)."""
    assets = definition.get("assets") if isinstance(definition, dict) else None
    if not isinstance(assets, dict):
        return {}
    return {
        name: blob
        for name, blob in assets.items()
        if isinstance(name, str) and isinstance(blob, str) and _HEX64.fullmatch(blob)
    }


@dataclass(frozen=True, slots=True)
class ParsedKey:
    type: RecordType
    name: str  # the id, device key or skill id; for cells and tiles the map name
    cell: str | None = None  # a cell's name; a tile's coordinates ("3,-1")


def parse_key(key: str) -> ParsedKey | None:
    """Split a records-map key; None for a type this version does not know (skipped, not an
    error)."""
    head, _, rest = key.partition("/")
    try:
        rtype = RecordType(head)
    except ValueError:
        return None
    if rtype is RecordType.CELL:
        name, sep, cell = rest.partition("/")
        if not sep:
            raise RecordError(f"cell key {key!r} lacks a cell name")
        return ParsedKey(rtype, check_map_name(name), cell_key(cell))
    if rtype is RecordType.TILE:
        name, sep, tile = rest.partition("/")
        if not sep or not _TILE_NAME.fullmatch(tile):
            raise RecordError(f"tile key {key!r} does not end in 1 to 3 integer tile coordinates")
        coords = [int(c) for c in tile.split(",")]
        edge = TILE_EDGE[len(coords)]
        if not all(COORD_MIN // edge <= c <= COORD_MAX // edge for c in coords):
            raise RecordError(f"tile key {key!r} lies beyond 32-bit cell coordinates")
        return ParsedKey(rtype, check_map_name(name), tile)
    if rtype in (RecordType.DELEGATE, RecordType.KEY_REVOKE):
        return ParsedKey(rtype, check_skill_id(rest, "device key"))
    return ParsedKey(rtype, check_skill_id(rest))


def make_key(rtype: RecordType, name: str, cell: str | None = None) -> str:
    return f"{rtype.value}/{name}" if cell is None else f"{rtype.value}/{name}/{cell}"


# --- field checks ---------------------------------------------------------------------------------


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError(f"{what} must be a JSON object")
    return value


def _int(rec: dict[str, Any], field: str, lo: int = 0, hi: int = MAX_INT) -> int:
    value = rec.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise RecordError(f"field {field!r} must be an integer in [{lo}, {hi}], not {value!r}")
    return value


def _float(rec: dict[str, Any], field: str, lo: float, hi: float) -> float:
    value = rec.get(field)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(float(value))
    ):
        raise RecordError(f"field {field!r} must be a finite number, not {value!r}")
    if not lo <= value <= hi:
        raise RecordError(f"field {field!r} must lie in [{lo}, {hi}], not {value!r}")
    return float(value)


def _text(rec: dict[str, Any], field: str, lo: int = 0, hi: int = MAX_TEXT) -> str:
    value = rec.get(field, "" if lo == 0 else None)
    if not isinstance(value, str) or not lo <= len(value) <= hi:
        raise RecordError(
            f"field {field!r} must be a string of {lo} to {hi} characters, not {value!r:.80}"
        )
    return value


def _texts(
    rec: dict[str, Any], field: str, item_check: Callable[[str, str], object] | None = None
) -> list[str]:
    value = rec.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecordError(f"field {field!r} must be a list of strings")
    if item_check is not None:
        for item in value:
            item_check(item, f"an entry of {field!r}")
    return value


def _optional_obj(rec: dict[str, Any], field: str) -> None:
    value = rec.get(field)
    if value is not None and not isinstance(value, dict):
        raise RecordError(f"field {field!r} must be a JSON object or absent")


class FutureVersion(Exception):
    """A record of a newer schema version: kept and forwarded, skipped by this version's views."""


def _version(rec: dict[str, Any]) -> None:
    v = _int(rec, "v", 1)
    if v > SCHEMA_VERSION:
        raise FutureVersion(v)


def plain_cell(rec: dict[str, Any]) -> tuple[float, int, bool, Any] | None:
    """(confidence, hlc, deleted, value) of a parsed cell record of the shape writers make (version
    1, a float confidence), which `check_record` accepts: the checks at one go, for bulk ingest.
    None for any other shape: `check_record` judges those."""
    hlc, confidence, deleted = rec.get("hlc"), rec.get("confidence"), rec.get("deleted", False)
    if (
        rec.get("v") == 1
        and type(rec["v"]) is int
        and type(hlc) is int
        and 0 <= hlc <= MAX_TIMESTAMP
        and type(confidence) is float
        and 0.0 <= confidence <= 1.0
        and type(deleted) is bool
        and "value" in rec
    ):
        return confidence, hlc, deleted, rec["value"]
    return None


def check_record(
    key: ParsedKey,
    text: str,
    author_hex: str,
    *,
    within_limits: bool = False,
    loaded: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Parse and check one record written by `author_hex` (`loaded`: what `load_record(text)`
    gave); RecordError says what is wrong."""
    rec = load_record(text, within_limits=within_limits) if loaded is None else loaded
    _version(rec)
    _int(rec, "hlc", 0, MAX_TIMESTAMP)
    t = key.type
    if t in (RecordType.SKILL, RecordType.CERT, RecordType.CHECK) and content_id(text) != key.name:
        raise RecordError(f"{t.value} id {key.name[:16]}… is not the SHA-256 of its record")
    if t is RecordType.SKILL:
        if rec.get("author") != author_hex:
            raise RecordError("a skill record's author must be the feed's author")
        _text(rec, "name", 1, 200)
        _text(rec, "task", 1, 100)
        _text(rec, "description")
        _optional_obj(rec, "policy")
        _optional_obj(rec, "meta")
        _texts(rec, "preconditions")
        _texts(rec, "postconditions")
        _texts(rec, "parents", check_skill_id)
        _texts(rec, "blobs", check_skill_id)
        _texts(rec, "tasks", check_skill_id)
        embodiments = rec.get("embodiments", [])
        if not isinstance(embodiments, list) or not all(isinstance(e, dict) for e in embodiments):
            raise RecordError("field 'embodiments' must be a list of JSON objects")
    elif t is RecordType.CERT:
        if rec.get("validator") != author_hex:
            raise RecordError("a certificate's validator must be the feed's author")
        check_skill_id(rec.get("skill"))
        branches = _int(rec, "branches", 1)
        _int(rec, "successes", 0, branches)
        _float(rec, "confidence", 0.5, 0.999999)
        _texts(rec, "randomized")
        _optional_obj(rec, "evaluation")
        _optional_obj(rec, "probe")
    elif t is RecordType.TASK:
        _text(rec, "name", 1, 200)
        definition = _obj(rec.get("definition"), "field 'definition'")
        if content_hash(definition) != key.name:
            raise RecordError(
                f"task {key.name[:16]}… is not the SHA-256 of its definition's canonical JSON"
            )
    elif t is RecordType.CHECK:
        if rec.get("checker") != author_hex:
            raise RecordError("a spot check's checker must be the feed's author")
        check_skill_id(rec.get("certificate"), "certificate id")
        check_skill_id(rec.get("skill"))
        check_skill_id(rec.get("validator"), "validator key")
        verdict = rec.get("verdict")
        if verdict not in VERDICTS:
            raise RecordError(f"field 'verdict' is one of {VERDICTS}, not {verdict!r:.40}")
        rerun = rec.get("branches")
        if not isinstance(rerun, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= MAX_INT for b in rerun
        ):
            raise RecordError("field 'branches' must be a list of branch indices")
        _text(rec, "detail", 0, 1000)
        _optional_obj(rec, "evidence")
    elif t is RecordType.OUTCOME:
        _text(rec, "embodiment", 1, 128)
        trials = _int(rec, "trials", 1)
        _int(rec, "successes", 0, trials)
        values = _obj(rec.get("values", {}), "field 'values'")
        for name, series in values.items():
            if not isinstance(series, list) or len(series) > MAX_FIELD_VALUES:
                raise RecordError(f"values[{name!r}] must be a list of at most {MAX_FIELD_VALUES}")
            if not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) <= 1e12
                for x in series
            ):
                raise RecordError(f"values[{name!r}] must hold finite numbers within ±1e12")
    elif t is RecordType.SUSPEND:
        if not isinstance(rec.get("suspended"), bool):
            raise RecordError("field 'suspended' must be true or false (false lifts it)")
        _text(rec, "reason", 0, 1000)
        _optional_obj(rec, "evidence")
    elif t in (RecordType.WITHDRAW, RecordType.REVOKE):
        _text(rec, "reason", 0, 1000)
    elif t is RecordType.CELL:
        _float(rec, "confidence", 0.0, 1.0)
        if not isinstance(rec.get("deleted", False), bool):
            raise RecordError("field 'deleted' must be a boolean")
        if "value" not in rec:
            raise RecordError("a cell observation needs a 'value' (null for a deletion)")
    elif t is RecordType.TILE:
        _int(rec, "n")  # at most TILE_CELLS: decoding says so (oversized_tile)
        for field in ("cells", "confidence"):
            if not isinstance(rec.get(field), str):
                raise RecordError(f"field {field!r} must be a string (base64 of packed columns)")
        if not isinstance(rec.get("values"), list):
            raise RecordError("field 'values' must be a list (the tile's distinct cell values)")
    elif t is RecordType.COUNTER:
        for part in ("p", "n"):
            counts = _obj(rec.get(part), f"field {part!r}")
            for field in COUNTER_FIELDS:
                _int(counts, field)
    elif t is RecordType.DELEGATE:
        roles = _texts(rec, "roles")
        unknown = set(roles) - {r.value for r in Role}
        if unknown:
            raise RecordError(f"unknown roles {sorted(unknown)}")
        if rec.get("expires") is not None:
            _int(rec, "expires", 0, MAX_TIMESTAMP)
    elif t is RecordType.KEY_REVOKE:
        _int(rec, "last_seq")
        if "last_hash" in rec:  # pins the kept prefix; records written before version 0.2 lack it
            check_skill_id(rec["last_hash"], "last_hash (the hash of the last envelope kept)")
        _text(rec, "reason", 0, 1000)
    return rec


def policy_key(policy: Any) -> str | None:
    """What a skill's policy runs, as one string, for revocations to follow it under any record:
    an MLP's weights hash (the architecture and a `skill_hash` only restate them), an entry point's
    group, name, distribution and version, else the canonical JSON of the whole policy (None: no
    policy). Extra keys a loader ignores do not make another behaviour."""
    if not isinstance(policy, dict) or not policy:
        return None
    kind = policy.get("kind")
    if kind == "mlp" and isinstance(policy.get("weights"), str):
        return f"mlp:{policy['weights']}"
    if kind == "entry_point":
        fields = ("group", "name", "distribution", "version")
        return "entry_point:" + canonical_json([policy.get(f) for f in fields]).decode()
    try:
        return canonical_json(policy).decode()
    except RecordError:
        return None

"""Unit tests for knowledge._records: record keys, schema checks, canonical JSON and content ids."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import RecordError, content_hash
from knowledge._records import (
    MAX_CELL_CHARS,
    MAX_RECORD_BYTES,
    MAX_TIMESTAMP,
    FutureVersion,
    ParsedKey,
    RecordType,
    Role,
    cell_key,
    check_map_name,
    check_record,
    check_skill_id,
    content_id,
    make_key,
    parse_key,
    record_text,
)

AUTHOR = "ab" * 32
OTHER = "cd" * 32
SKILL_ID = "ee" * 32
DEVICE = "0f" * 32


def skill_record(**overrides):
    rec = {
        "v": 1,
        "name": "pick-mug",
        "task": "pick",
        "description": "grasp a mug by its handle",
        "policy": {"kind": "mlp", "weights": "ff" * 32},
        "embodiments": [{"fingerprint": "x"}],
        "preconditions": ["mug visible"],
        "postconditions": ["mug held"],
        "parents": [SKILL_ID],
        "blobs": ["aa" * 32],
        "meta": {"k": 1},
        "author": AUTHOR,
        "hlc": 12345,
    }
    rec.update(overrides)
    return rec


def cert_record(**overrides):
    rec = {
        "v": 1,
        "skill": SKILL_ID,
        "validator": AUTHOR,
        "hlc": 99,
        "branches": 64,
        "successes": 60,
        "confidence": 0.95,
        "randomized": ["mass", "friction"],
        "evaluation": {"seed": 7},
    }
    rec.update(overrides)
    return rec


def cell_record(**overrides):
    rec = {"v": 1, "hlc": 5, "value": {"label": "shelf"}, "confidence": 0.8, "deleted": False}
    rec.update(overrides)
    return rec


def counter_record(**overrides):
    rec = {
        "v": 1,
        "hlc": 5,
        "p": {"uses": 3, "successes": 2, "failures": 1},
        "n": {"uses": 0, "successes": 0, "failures": 0},
    }
    rec.update(overrides)
    return rec


def reason_record(**overrides):
    rec = {"v": 1, "hlc": 5, "reason": "it drops mugs"}
    rec.update(overrides)
    return rec


def delegate_record(**overrides):
    rec = {"v": 1, "hlc": 5, "roles": ["publish", "validate"], "expires": None}
    rec.update(overrides)
    return rec


def keyrevoke_record(**overrides):
    rec = {"v": 1, "hlc": 5, "last_seq": 3, "reason": "lost robot"}
    rec.update(overrides)
    return rec


TASK_DEFINITION = {"format": "simnet.task/1", "name": "reach", "horizon": 50}


def task_record(**overrides):
    rec = {"v": 1, "hlc": 5, "name": "reach", "definition": TASK_DEFINITION}
    rec.update(overrides)
    return rec


def check_record_of(**overrides):
    rec = {
        "v": 1,
        "hlc": 5,
        "certificate": "c1" * 32,
        "skill": SKILL_ID,
        "validator": OTHER,
        "checker": AUTHOR,
        "verdict": "disputed",
        "branches": [3, 17],
        "detail": "2 of 2 re-run branches differ",
        "evidence": {"recorded": [1, 1], "rerun": [0, 0]},
    }
    rec.update(overrides)
    return rec


def outcome_record(**overrides):
    rec = {
        "v": 1,
        "hlc": 5,
        "embodiment": "arm7",
        "trials": 10,
        "successes": 7,
        "values": {"steps": [41, 38.5]},
    }
    rec.update(overrides)
    return rec


def suspend_record(**overrides):
    rec = {"v": 1, "hlc": 5, "suspended": True, "reason": "field 3/20", "evidence": {"trials": 20}}
    rec.update(overrides)
    return rec


def tile_record(**overrides):
    rec = {"v": 1, "hlc": 5, "n": 0, "cells": "eAEDAAAAAAE=", "confidence": "", "values": []}
    rec.update(overrides)
    return rec


BUILDERS = {
    RecordType.SKILL: skill_record,
    RecordType.CERT: cert_record,
    RecordType.CELL: cell_record,
    RecordType.COUNTER: counter_record,
    RecordType.WITHDRAW: reason_record,
    RecordType.REVOKE: reason_record,
    RecordType.DELEGATE: delegate_record,
    RecordType.KEY_REVOKE: keyrevoke_record,
    RecordType.TASK: task_record,
    RecordType.CHECK: check_record_of,
    RecordType.OUTCOME: outcome_record,
    RecordType.SUSPEND: suspend_record,
    RecordType.TILE: tile_record,
}


def keyed(rtype: RecordType, rec, *, text: str | None = None) -> tuple[ParsedKey, str]:
    """The parsed key and JSON text of a record; content-addressed types get their true id."""
    text = record_text(rec) if text is None else text
    if rtype in (RecordType.SKILL, RecordType.CERT, RecordType.CHECK):
        key = make_key(rtype, content_id(text))
    elif rtype is RecordType.TASK:
        key = make_key(rtype, content_hash(rec.get("definition", {})))
    elif rtype is RecordType.CELL:
        key = make_key(rtype, "floor1", "12,7")
    elif rtype is RecordType.TILE:
        key = make_key(rtype, "floor1", "0,-1")
    elif rtype in (RecordType.DELEGATE, RecordType.KEY_REVOKE):
        key = make_key(rtype, DEVICE)
    else:
        key = make_key(rtype, SKILL_ID)
    parsed = parse_key(key)
    assert parsed is not None
    return parsed, text


def check(
    rtype: RecordType, rec=None, *, text: str | None = None, author: str = AUTHOR, **overrides
):
    rec = BUILDERS[rtype](**overrides) if rec is None else rec
    parsed, text = keyed(rtype, rec, text=text)
    return check_record(parsed, text, author)


def rejects(rtype: RecordType, *fragments: str, author: str = AUTHOR, **overrides) -> str:
    with pytest.raises(RecordError) as info:
        check(rtype, author=author, **overrides)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --- valid records ------------------------------------------------------------------------------


@pytest.mark.parametrize("rtype", list(RecordType))
def test_valid_record_of_every_type(rtype):
    rec = BUILDERS[rtype]()
    assert check(rtype, rec) == rec


def test_minimal_skill_record():
    rec = {"v": 1, "name": "n", "task": "t", "author": AUTHOR, "hlc": 0}
    assert check(RecordType.SKILL, rec) == rec


def test_minimal_cell_tombstone():
    rec = {"v": 1, "hlc": 1, "value": None, "confidence": 0, "deleted": True}
    assert check(RecordType.CELL, rec) == rec


def test_delegation_without_roles_or_expiry_is_valid():
    assert check(RecordType.DELEGATE, {"v": 1, "hlc": 1}) == {"v": 1, "hlc": 1}
    assert check(RecordType.DELEGATE, roles=[], expires=MAX_TIMESTAMP)["expires"] == MAX_TIMESTAMP


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", -1), ("n", 2**53), ("n", True), ("cells", 5), ("confidence", None), ("values", {})],
)
def test_tile_record_fields(field, value):
    rejects(RecordType.TILE, repr(field), **{field: value})


def test_hlc_bounds():
    assert check(RecordType.CELL, hlc=0)["hlc"] == 0
    assert check(RecordType.CELL, hlc=MAX_TIMESTAMP)["hlc"] == MAX_TIMESTAMP


# --- common fields: v and hlc -------------------------------------------------------------------


@pytest.mark.parametrize("rtype", list(RecordType))
@pytest.mark.parametrize("version", [2, 7, 2**40])
def test_newer_schema_version_is_future_version(rtype, version):
    with pytest.raises(FutureVersion) as info:
        check(rtype, v=version)
    assert info.value.args[0] == version


@pytest.mark.parametrize("rtype", list(RecordType))
def test_newer_schema_version_skips_the_other_checks(rtype):
    """A v2 record may have fields this version does not know or require: FutureVersion, not
    RecordError."""
    with pytest.raises(FutureVersion):
        check(rtype, {"v": 2, "hlc": 1, "something_new": [1, 2, 3]})


@pytest.mark.parametrize("rtype", list(RecordType))
@pytest.mark.parametrize("version", [0, -1, 1.0, "1", True, None])
def test_bad_schema_version(rtype, version):
    rejects(rtype, "'v'", v=version)


@pytest.mark.parametrize("rtype", list(RecordType))
def test_missing_schema_version(rtype):
    rec = BUILDERS[rtype]()
    del rec["v"]
    with pytest.raises(RecordError):
        check(rtype, rec)


@pytest.mark.parametrize("rtype", list(RecordType))
@pytest.mark.parametrize("hlc", [-1, MAX_TIMESTAMP + 1, 1.5, "5", None, False])
def test_bad_hlc(rtype, hlc):
    rejects(rtype, "'hlc'", hlc=hlc)


@pytest.mark.parametrize("rtype", list(RecordType))
def test_missing_hlc(rtype):
    rec = BUILDERS[rtype]()
    del rec["hlc"]
    with pytest.raises(RecordError):
        check(rtype, rec)


# --- not JSON, oversized ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "not json", "{", '{"v": 1,}', "[1, 2]", "1", '"str"', "null"])
def test_non_json_or_non_object(text):
    with pytest.raises(RecordError):
        check_record(parse_key(make_key(RecordType.REVOKE, SKILL_ID)), text, AUTHOR)


@pytest.mark.parametrize("value", [b"{}", None, 5, {"v": 1}])
def test_record_value_must_be_a_string(value):
    with pytest.raises(RecordError):
        check_record(parse_key(make_key(RecordType.REVOKE, SKILL_ID)), value, AUTHOR)  # type: ignore[arg-type]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_numbers_are_refused(literal):
    """NaN/Infinity are not JSON (RFC 8259). Python's json.loads accepts them; the record check must
    not, or a view holds a NaN (NaN != NaN: two sites with the same envelopes no longer compare
    equal, and record_text refuses to re-encode the record)."""
    text = '{"confidence":0.5,"deleted":false,"hlc":1,"v":1,"value":%s}' % literal
    with pytest.raises(RecordError):
        check(RecordType.CELL, text=text)
    skill_text = record_text(skill_record(meta={"x": 1})).replace('{"x":1}', '{"x":%s}' % literal)
    with pytest.raises(RecordError):
        check(RecordType.SKILL, text=skill_text)


def test_oversized_record():
    rec = reason_record(reason="")
    rec["pad"] = "x" * MAX_RECORD_BYTES
    message = rejects(RecordType.REVOKE, str(MAX_RECORD_BYTES), **{"pad": "x" * MAX_RECORD_BYTES})
    assert "exceeds" in message


def test_record_just_under_the_limit_is_fine():
    base = record_text(reason_record(pad=""))
    pad = "x" * (MAX_RECORD_BYTES - len(base))
    text = record_text(reason_record(pad=pad))
    assert len(text.encode()) == MAX_RECORD_BYTES
    assert check(RecordType.REVOKE, text=text)["pad"] == pad


def test_oversized_record_is_measured_in_bytes():
    """MAX_RECORD_BYTES is a byte limit: a record of multi-byte characters over it is refused
    too."""
    base = record_text(reason_record(pad=""))
    pad = "é" * (
        (MAX_RECORD_BYTES - len(base)) // 2 + 16
    )  # fewer characters than the limit, more bytes
    text = record_text(reason_record(pad=pad))
    assert len(text) < MAX_RECORD_BYTES < len(text.encode())
    with pytest.raises(RecordError):
        check(RecordType.REVOKE, text=text)


# --- skills -------------------------------------------------------------------------------------


def test_skill_id_must_be_the_hash_of_the_record():
    text = record_text(skill_record())
    wrong = parse_key(make_key(RecordType.SKILL, SKILL_ID))
    with pytest.raises(RecordError) as info:
        check_record(wrong, text, AUTHOR)
    assert "SHA-256" in str(info.value)


def test_skill_id_covers_exact_bytes_not_the_parsed_value():
    """Same JSON value, different text (spacing): the id is of the exact text, so it must not
    match."""
    rec = skill_record()
    canonical = record_text(rec)
    spaced = json.dumps(rec, sort_keys=True)
    assert json.loads(spaced) == json.loads(canonical) and spaced != canonical
    with pytest.raises(RecordError):
        check_record(parse_key(make_key(RecordType.SKILL, content_id(canonical))), spaced, AUTHOR)
    assert (
        check_record(parse_key(make_key(RecordType.SKILL, content_id(spaced))), spaced, AUTHOR)
        == rec
    )


def test_skill_author_must_be_the_feed_author():
    rejects(RecordType.SKILL, "author", author=OTHER)
    rejects(RecordType.SKILL, "author", **{"author": OTHER})
    rec = skill_record()
    del rec["author"]
    with pytest.raises(RecordError):
        check(RecordType.SKILL, rec)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", ""),
        ("name", "x" * 201),
        ("name", 5),
        ("name", None),
        ("name", ["n"]),
        ("task", ""),
        ("task", "x" * 101),
        ("task", 1.0),
        ("description", "x" * 4001),
        ("description", 3),
        ("description", None),
        ("policy", "weights.bin"),
        ("policy", [1]),
        ("policy", 3),
        ("meta", "m"),
        ("meta", [1]),
        ("preconditions", "a"),
        ("preconditions", [1]),
        ("preconditions", {"a": 1}),
        ("postconditions", [None]),
        ("parents", ["not-a-hash"]),
        ("parents", [SKILL_ID.upper()]),
        ("parents", [SKILL_ID[:-1]]),
        ("parents", "x"),
        ("blobs", ["zz" * 32]),
        ("blobs", [5]),
        ("embodiments", {"a": 1}),
        ("embodiments", ["e"]),
        ("embodiments", [[1]]),
        ("embodiments", "e"),
    ],
)
def test_skill_bad_field(field, value):
    rejects(RecordType.SKILL, repr(field), **{field: value})


@pytest.mark.parametrize("field", ["name", "task"])
def test_skill_required_text_fields(field):
    rec = skill_record()
    del rec[field]
    with pytest.raises(RecordError) as info:
        check(RecordType.SKILL, rec)
    assert repr(field) in str(info.value)


def test_skill_text_limits_are_inclusive():
    assert (
        check(RecordType.SKILL, name="x" * 200, task="t" * 100, description="d" * 4000)["name"]
        == "x" * 200
    )


def test_skill_null_policy_and_meta_are_fine():
    assert check(RecordType.SKILL, policy=None, meta=None)["policy"] is None


# --- certificates -------------------------------------------------------------------------------


def test_cert_id_must_be_the_hash_of_the_record():
    text = record_text(cert_record())
    with pytest.raises(RecordError):
        check_record(parse_key(make_key(RecordType.CERT, SKILL_ID)), text, AUTHOR)


def test_cert_validator_must_be_the_feed_author():
    rejects(RecordType.CERT, "validator", author=OTHER)
    rejects(RecordType.CERT, "validator", validator=OTHER)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("skill", "abc"),
        ("skill", None),
        ("skill", SKILL_ID.upper()),
        ("skill", 5),
        ("branches", 0),
        ("branches", -5),
        ("branches", 2**53),
        ("branches", 64.0),
        ("branches", True),
        ("successes", -1),
        ("successes", 65),
        ("successes", "60"),
        ("confidence", 0.49),
        ("confidence", 1.0),
        ("confidence", 0.9999995),
        ("confidence", "0.95"),
        ("confidence", None),
        ("confidence", True),
        ("randomized", "mass"),
        ("randomized", [1]),
        ("evaluation", "seed=7"),
        ("evaluation", [7]),
    ],
)
def test_cert_bad_field(field, value):
    with pytest.raises(RecordError):
        check(RecordType.CERT, **{field: value})


def test_task_key_is_the_hash_of_its_definition_not_of_the_record():
    rec = task_record()
    assert check(RecordType.TASK, rec)["definition"] == TASK_DEFINITION
    text = record_text(rec)
    with pytest.raises(RecordError, match="not the SHA-256 of its definition"):
        check_record(parse_key(make_key(RecordType.TASK, content_id(text))), text, AUTHOR)


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", ""), ("name", "x" * 201), ("name", 7), ("definition", "reach"), ("definition", [1])],
)
def test_task_bad_field(field, value):
    with pytest.raises(RecordError):
        check(RecordType.TASK, **{field: value})


def test_skill_names_tasks_by_hash():
    assert check(RecordType.SKILL, tasks=["ab" * 32])["tasks"] == ["ab" * 32]
    with pytest.raises(RecordError, match="tasks"):
        check(RecordType.SKILL, tasks=["reach"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("checker", OTHER),
        ("certificate", "c1"),
        ("skill", None),
        ("validator", "xyz"),
        ("verdict", "maybe"),
        ("verdict", True),
        ("branches", "3,17"),
        ("branches", [-1]),
        ("branches", [True]),
        ("branches", [1.5]),
        ("detail", "x" * 1001),
        ("evidence", [1]),
    ],
)
def test_check_bad_field(field, value):
    with pytest.raises(RecordError):
        check(RecordType.CHECK, **{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("embodiment", ""),
        ("trials", 0),
        ("successes", 11),
        ("successes", -1),
        ("values", [1]),
        ("values", {"steps": "41"}),
        ("values", {"steps": [True]}),
        ("values", {"steps": [1e13]}),
        ("values", {"steps": [0.0] * 513}),
    ],
)
def test_outcome_bad_field(field, value):
    with pytest.raises(RecordError):
        check(RecordType.OUTCOME, **{field: value})


@pytest.mark.parametrize(
    ("field", "value"), [("suspended", None), ("suspended", 1), ("evidence", 3)]
)
def test_suspend_bad_field(field, value):
    with pytest.raises(RecordError):
        check(RecordType.SUSPEND, **{field: value})


def test_a_reproduced_check_needs_no_evidence():
    rec = check(RecordType.CHECK, verdict="reproduced", evidence=None, detail="")
    assert rec["verdict"] == "reproduced"


def test_cert_successes_up_to_branches():
    assert check(RecordType.CERT, successes=64)["successes"] == 64
    assert check(RecordType.CERT, successes=0)["successes"] == 0
    assert check(RecordType.CERT, confidence=0.5)["confidence"] == 0.5
    assert check(RecordType.CERT, confidence=0.999999)["confidence"] == 0.999999


# --- cells --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("confidence", -0.01),
        ("confidence", 1.01),
        ("confidence", "high"),
        ("confidence", None),
        ("confidence", False),
        ("deleted", "yes"),
        ("deleted", 0),
        ("deleted", None),
    ],
)
def test_cell_bad_field(field, value):
    rejects(RecordType.CELL, repr(field), **{field: value})


def test_cell_needs_a_value():
    rec = cell_record()
    del rec["value"]
    with pytest.raises(RecordError) as info:
        check(RecordType.CELL, rec)
    assert "value" in str(info.value)


def test_cell_value_may_be_any_json():
    for value in [None, 1, "x", [1, {"a": None}], {"nested": {"deep": [1.5]}}, True]:
        assert check(RecordType.CELL, value=value)["value"] == value


def test_cell_deleted_defaults_to_false():
    rec = cell_record()
    del rec["deleted"]
    assert check(RecordType.CELL, rec) == rec


# --- counters -----------------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["p", "n"])
@pytest.mark.parametrize("field", ["uses", "successes", "failures"])
@pytest.mark.parametrize("value", [-1, 2**53, 1.5, "1", None, True])
def test_counter_bad_count(part, field, value):
    rec = counter_record()
    rec[part] = dict(rec[part], **{field: value})
    with pytest.raises(RecordError) as info:
        check(RecordType.COUNTER, rec)
    assert repr(field) in str(info.value)


@pytest.mark.parametrize("part", ["p", "n"])
def test_counter_parts_must_be_objects(part):
    rejects(RecordType.COUNTER, repr(part), **{part: [1, 2, 3]})
    rec = counter_record()
    del rec[part]
    with pytest.raises(RecordError):
        check(RecordType.COUNTER, rec)


def test_counter_missing_field():
    rec = counter_record()
    del rec["p"]["failures"]
    with pytest.raises(RecordError):
        check(RecordType.COUNTER, rec)


def test_counter_maximum():
    big = {"uses": 2**53 - 1, "successes": 2**53 - 1, "failures": 0}
    assert check(RecordType.COUNTER, p=big)["p"] == big


# --- withdrawals and revocations ----------------------------------------------------------------


@pytest.mark.parametrize("rtype", [RecordType.WITHDRAW, RecordType.REVOKE])
@pytest.mark.parametrize("reason", ["x" * 1001, 5, None, ["r"]])
def test_bad_reason(rtype, reason):
    rejects(rtype, "'reason'", reason=reason)


@pytest.mark.parametrize("rtype", [RecordType.WITHDRAW, RecordType.REVOKE])
def test_reason_is_optional(rtype):
    assert check(rtype, {"v": 1, "hlc": 1}) == {"v": 1, "hlc": 1}
    assert check(rtype, reason="x" * 1000)["reason"] == "x" * 1000


# --- delegations and key revocations ------------------------------------------------------------


@pytest.mark.parametrize("roles", [["admin"], ["publish", "root"], ["PUBLISH"], ["publish "]])
def test_delegation_unknown_roles(roles):
    message = rejects(RecordType.DELEGATE, "unknown roles", roles=roles)
    assert str(sorted(set(roles) - {"publish"})) in message


@pytest.mark.parametrize("roles", ["publish", [1], None, {"publish": True}])
def test_delegation_roles_must_be_a_list_of_strings(roles):
    rejects(RecordType.DELEGATE, "'roles'", roles=roles)


def test_delegation_every_known_role():
    roles = sorted(r.value for r in Role)
    assert check(RecordType.DELEGATE, roles=roles)["roles"] == roles


@pytest.mark.parametrize("expires", [-1, MAX_TIMESTAMP + 1, 1.5, "tomorrow", True])
def test_delegation_bad_expiry(expires):
    rejects(RecordType.DELEGATE, "'expires'", expires=expires)


@pytest.mark.parametrize("last_seq", [-1, 2**53, 1.0, "3", None, False])
def test_key_revocation_bad_last_seq(last_seq):
    rejects(RecordType.KEY_REVOKE, "'last_seq'", last_seq=last_seq)


def test_key_revocation_last_seq_zero_and_reason_limits():
    assert check(RecordType.KEY_REVOKE, last_seq=0)["last_seq"] == 0
    rejects(RecordType.KEY_REVOKE, "'reason'", reason="r" * 1001)


# --- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["widget/abc", "future-type/x/y", "", "nothing", "SKILL/" + SKILL_ID, "skills/x"]
)
def test_parse_key_unknown_type_is_none(key):
    assert parse_key(key) is None


def test_parse_key_known_types():
    assert parse_key("skill/" + SKILL_ID) == ParsedKey(RecordType.SKILL, SKILL_ID)
    assert parse_key("cert/" + SKILL_ID) == ParsedKey(RecordType.CERT, SKILL_ID)
    assert parse_key("withdraw/" + SKILL_ID) == ParsedKey(RecordType.WITHDRAW, SKILL_ID)
    assert parse_key("revoke/" + SKILL_ID) == ParsedKey(RecordType.REVOKE, SKILL_ID)
    assert parse_key("counter/" + SKILL_ID) == ParsedKey(RecordType.COUNTER, SKILL_ID)
    assert parse_key("delegate/" + DEVICE) == ParsedKey(RecordType.DELEGATE, DEVICE)
    assert parse_key("keyrevoke/" + DEVICE) == ParsedKey(RecordType.KEY_REVOKE, DEVICE)
    assert parse_key("cell/floor1/12,7") == ParsedKey(RecordType.CELL, "floor1", "12,7")
    assert parse_key("cell/floor1/a/b") == ParsedKey(RecordType.CELL, "floor1", "a/b")
    assert parse_key("tile/floor1/3,-1") == ParsedKey(RecordType.TILE, "floor1", "3,-1")
    assert parse_key("tile/f/-524288") == ParsedKey(RecordType.TILE, "f", "-524288")
    assert parse_key("tile/f/0,0,134217727") == ParsedKey(RecordType.TILE, "f", "0,0,134217727")


@pytest.mark.parametrize(
    "key",
    [
        "skill/",
        "skill",
        "skill/xyz",
        "skill/" + SKILL_ID.upper(),
        "skill/" + SKILL_ID + "0",
        "cert/" + SKILL_ID[:-1],
        "delegate/nothex",
        "keyrevoke/" + DEVICE[:10],
        "cell/floor1",
        "cell/floor1/",
        "cell//1,2",
        "cell/bad name/1",
        "cell/m/" + "x" * (MAX_CELL_CHARS + 1),
        "revoke/" + SKILL_ID + "/extra",
        "tile/floor1",
        "tile/floor1/",
        "tile/floor1/a,b",
        "tile/floor1/01,2",  # one spelling per tile
        "tile/floor1/-0,2",
        "tile/floor1/1,2,3,4",  # tiles hold cells of 1 to 3 coordinates
        "tile/floor1/1, 2",
        "tile/floor1/33554432,0",  # beyond 32-bit cells: 2**31 / 64
        "tile/floor1/-524289",  # -2**31 / 4096 - 1
        "tile/bad name/1,2",
    ],
)
def test_parse_key_malformed_known_type(key):
    with pytest.raises(RecordError):
        parse_key(key)


@pytest.mark.parametrize(
    "rtype", [t for t in RecordType if t not in (RecordType.CELL, RecordType.TILE)]
)
def test_make_key_parse_key_round_trip(rtype):
    assert parse_key(make_key(rtype, SKILL_ID)) == ParsedKey(rtype, SKILL_ID)


def test_make_key_cell():
    assert make_key(RecordType.CELL, "m", "1,2") == "cell/m/1,2"
    assert parse_key(make_key(RecordType.CELL, "m", "1,2")) == ParsedKey(
        RecordType.CELL, "m", "1,2"
    )


def test_check_skill_id():
    assert check_skill_id(SKILL_ID) == SKILL_ID
    for bad in ["", SKILL_ID[:-1], SKILL_ID + "a", SKILL_ID.upper(), "g" * 64, None, 5, b"e" * 64]:
        with pytest.raises(RecordError):
            check_skill_id(bad)
    with pytest.raises(RecordError) as info:
        check_skill_id("nope", "blob hash")
    assert "blob hash" in str(info.value)


def test_check_skill_id_refuses_a_trailing_newline():
    """`$` in a Python regex also matches before a final newline: "<64 hex>\\n" must not pass as an
    id (bytes.fromhex ignores whitespace, so "delegate/<key>\\n" would alias "delegate/<key>")."""
    with pytest.raises(RecordError):
        check_skill_id(SKILL_ID + "\n")
    with pytest.raises(RecordError):
        parse_key("delegate/" + DEVICE + "\n")
    with pytest.raises(RecordError):
        parse_key("revoke/" + SKILL_ID + "\n")


# --- cells and map names ------------------------------------------------------------------------


def test_cell_key_forms():
    assert cell_key("kitchen") == "kitchen"
    assert cell_key((12, 7)) == "12,7"
    assert cell_key([1, 2, 3]) == "1,2,3"
    assert cell_key((-4, 0)) == "-4,0"
    assert cell_key((5,)) == "5"
    assert cell_key("x" * MAX_CELL_CHARS) == "x" * MAX_CELL_CHARS


@pytest.mark.parametrize(
    "cell",
    [
        "",
        "x" * (MAX_CELL_CHARS + 1),
        (),
        [],
        (1.0, 2),
        (True, 1),
        (1, "2"),
        None,
        5,
        {"x": 1},
        (1, None),
    ],
)
def test_cell_key_rejects(cell):
    with pytest.raises(RecordError):
        cell_key(cell)


def test_cell_key_of_many_ints_over_the_limit():
    with pytest.raises(RecordError):
        cell_key(tuple(range(100)))


@pytest.mark.parametrize("name", ["floor1", "a", "A.b_c:d-e", "x" * 128, "0"])
def test_map_name_valid(name):
    assert check_map_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 129, "a b", "a/b", "étage", "m\t", None, 5])
def test_map_name_invalid(name):
    with pytest.raises(RecordError) as info:
        check_map_name(name)
    assert "map name" in str(info.value)


def test_map_name_refuses_a_trailing_newline():
    """Same `$`-before-newline bug as for ids: "floor1\\n" is not letters, digits and . _ : -."""
    with pytest.raises(RecordError):
        check_map_name("floor1\n")
    with pytest.raises(RecordError):
        parse_key("cell/floor1\n/1,2")


# --- canonical JSON and content ids (hypothesis) ------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def _reorder(value, rng: random.Random):
    """The same JSON value with every dict's insertion order shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _reorder(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_reorder(v, rng) for v in value]
    return value


@settings(max_examples=200)
@given(JSON, st.integers(0, 2**32))
def test_canonical_json_is_stable_under_key_reordering(value, seed):
    text = record_text(value)
    again = record_text(_reorder(value, random.Random(seed)))
    assert again == text
    assert content_id(again) == content_id(text)


@settings(max_examples=200)
@given(JSON)
def test_canonical_json_is_deterministic_and_parses_back(value):
    text = record_text(value)
    assert record_text(value) == text
    assert record_text(json.loads(text)) == text
    assert json.loads(text) == value


@settings(max_examples=100)
@given(st.dictionaries(st.text(max_size=10), st.integers(), min_size=1, max_size=10))
def test_canonical_json_has_sorted_keys_and_no_spaces(value):
    text = record_text(value)
    assert list(json.loads(text)) == sorted(value)
    assert text == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_canonical_json_keeps_unicode_and_is_compact():
    assert record_text({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    assert record_text([1, {"z": None, "y": True}]) == '[1,{"y":true,"z":null}]'


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), {"x": float("-inf")}, {1, 2}, b"bytes", object()]
)
def test_canonical_json_refuses_non_json(value):
    with pytest.raises(RecordError):
        record_text(value)


def test_content_id_is_sha256_of_utf8():
    assert content_id("é") == hashlib.sha256("é".encode()).hexdigest()
    assert len(content_id("")) == 64


@settings(max_examples=100)
@given(st.text(max_size=50), st.text(max_size=50))
def test_content_id_distinguishes_texts(a, b):
    assert (content_id(a) == content_id(b)) == (a == b)


@settings(max_examples=100)
@given(st.integers(0, 2**32))
def test_skill_record_id_stable_under_reordering(seed):
    rec = skill_record()
    text = record_text(_reorder(rec, random.Random(seed)))
    parsed = parse_key(make_key(RecordType.SKILL, content_id(record_text(rec))))
    assert check_record(parsed, text, AUTHOR) == rec

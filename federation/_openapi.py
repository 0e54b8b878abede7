"""The OpenAPI description of a site (`GET /v1/openapi.json`).

Paths, summaries and examples come from the endpoint docstrings (Starlette's SchemaGenerator reads
them); this module adds what a client generator needs besides: the JSON schemas of requests and
answers, the request-signature security scheme on every signed route, and the one error shape.
"""

from __future__ import annotations

import copy
from typing import Any

from starlette.routing import BaseRoute, Route
from starlette.schemas import SchemaGenerator

from ._wire import PAGE_TYPE

_HEX64: dict[str, Any] = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}
_HEADS: dict[str, Any] = {
    "heads": {"type": "object", "additionalProperties": _COUNT, "description": "author -> seq"},
    "hashes": {
        "type": "object",
        "additionalProperties": _HEX64,
        "description": "author -> SHA-256 of the envelope at that seq (forks show as a difference)",
    },
    "equivocators": {"type": "array", "items": _HEX64, "description": "authors caught forking"},
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["error", "detail"],
        "properties": {
            "error": {"type": "string", "description": "a code: bad_request, forbidden, busy, ..."},
            "detail": {"type": "string", "description": "what was wrong, in words"},
        },
    },
    "Health": {
        "type": "object",
        "properties": {"status": {"type": "string"}, "name": {"type": "string"}, "key": _HEX64},
    },
    "Heads": {"type": "object", "required": ["heads"], "properties": _HEADS},
    "SyncRequest": {
        "type": "object",
        "properties": {**_HEADS, "limit": {"type": "integer", "minimum": 1}},
    },
    "PushResult": {
        "type": "object",
        "properties": {
            "accepted": _COUNT,
            "duplicates": _COUNT,
            "rejected": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": _COUNT,
                        "reason": {"type": "string"},
                        "detail": {"type": "string"},
                    },
                },
            },
            "equivocations": {
                "type": "array",
                "items": {"type": "object", "properties": {"author": _HEX64, "seq": _COUNT}},
            },
            **_HEADS,
        },
    },
    "Status": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "key": _HEX64,
            **{
                name: _COUNT
                for name in (
                    "skills",
                    "active_skills",
                    "certificates",
                    "revocations",
                    "equivocations",
                    "writers",
                    "envelopes",
                )
            },
            "peers": {"type": "array", "items": {"type": "object"}},
            "validator": {
                "nullable": True,  # no "type": an object, or null where no validator has run
                "description": "the validator's state file as `simnet status --json` shows it "
                "(docs/OPERATIONS.md); null where no validator has run here",
                "properties": {
                    "state": {"type": "string", "description": "idle, busy, stopped, unreadable"},
                    "queue": {"type": "array", "items": {"type": "object"}},
                    "failed": {"type": "array", "items": {"type": "object"}},
                    "waiting": {"type": "array", "items": {"type": "object"}},
                    **{
                        name: _COUNT
                        for name in ("queued", "certificates", "spot_checks", "disputes")
                    },
                    "branches_per_s": {"type": "number", "minimum": 0},
                },
            },
        },
    },
    "Page": {
        "type": "string",
        "format": "binary",
        "description": "SNP1 magic, u32 count, then per envelope a u32 length and its bytes",
    },
}

SECURITY_SCHEMES = {
    "simnet": {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": "`Simnet key=<64 hex>, ts=<ms>, nonce=<32 hex>, sig=<128 hex>`: Ed25519 by "
        "the caller's key over the method, path, body hash, timestamp, nonce and the receiving "
        "site's key (see docs/PROTOCOL.md). Stale timestamps and reused nonces are refused.",
    }
}

# (path, method) -> (request body schema, 200 answer schema); PAGE_TYPE marks a binary page
_BODIES: dict[tuple[str, str], tuple[str | None, str | None]] = {
    ("/v1/health", "get"): (None, "Health"),
    ("/v1/sync", "post"): ("SyncRequest", PAGE_TYPE),
    ("/v1/heads", "get"): (None, "Heads"),
    ("/v1/envelopes", "post"): (PAGE_TYPE, "PushResult"),
    ("/v1/status", "get"): (None, "Status"),
}

_GENERATOR = SchemaGenerator({"openapi": "3.0.3", "info": {"title": "simnet site", "version": "1"}})


def describe(routes: list[BaseRoute]) -> dict[str, Any]:
    """The site's OpenAPI document for these routes (their endpoints carry `role`, see _server)."""
    document = copy.deepcopy(_GENERATOR.get_schema(routes=routes))
    document["components"] = {"schemas": SCHEMAS, "securitySchemes": SECURITY_SCHEMES}
    roles = {r.path: getattr(r.endpoint, "role", None) for r in routes if isinstance(r, Route)}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            _complete(operation, *_BODIES.get((path, method), (None, None)), roles.get(path))
    return document


def _complete(
    operation: dict[str, Any], request: str | None, answer: str | None, role: str | None
) -> None:
    responses = operation.setdefault("responses", {})
    if answer is not None:
        ok = responses.setdefault("200", {"description": "OK"})
        ok["content"] = {_media(answer): {"schema": _schema(answer)}}
    if request is not None:
        body = operation.setdefault("requestBody", {"content": {}})
        examples = body.get("content", {}).get(_media(request), {})
        body["content"] = {_media(request): {**examples, "schema": _schema(request)}}
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    responses["4XX"] = {"description": "Refused, changing nothing", "content": error}
    responses["5XX"] = {
        "description": (
            "The site could not answer, changing nothing: 500 internal_error, 503 busy or "
            "unavailable (its store cannot be written), 507 insufficient_storage (its disk is full)"
        ),
        "content": error,
    }
    if role is not None:
        operation["security"] = [{"simnet": []}]
        what = "this site's own key" if role == "admin" else "a key holding a grant here"
        operation["description"] = f"Signed requests only, by {what}."


def _media(schema: str) -> str:
    return PAGE_TYPE if schema == PAGE_TYPE else "application/json"


def _schema(schema: str) -> dict[str, Any]:
    name = "Page" if schema == PAGE_TYPE else schema
    return {"$ref": f"#/components/schemas/{name}"}

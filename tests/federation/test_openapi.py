"""/v1/openapi.json: a valid OpenAPI 3 document whose schemas describe what the site really
answers."""

from __future__ import annotations

import asyncio

import httpx
import jsonschema
from openapi_spec_validator import validate

from federation import PAGE_TYPE, encode_page

SIGNED = {"/v1/sync", "/v1/heads", "/v1/envelopes", "/v1/blobs/{hash}", "/v1/status"}
ADMIN = {"/v1/admin/sync", "/v1/admin/revoke", "/v1/admin/delegate", "/v1/admin/revoke-key"}


def get(site, path: str, identity=None) -> httpx.Response:
    async def go():
        if identity is None:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=site.app), base_url="http://site"
            ) as client:
                return await client.get(path)
        async with site.client(identity) as client:
            return await client.get(path)

    return asyncio.run(go())


def answer_schema(document: dict, name: str) -> dict:
    """A component schema, with its references resolvable by jsonschema."""
    return {**document["components"]["schemas"][name], "components": document["components"]}


def test_the_document_is_valid_openapi_and_marks_every_signed_route(make_site):
    document = get(make_site("a"), "/v1/openapi.json").json()
    validate(document)
    secured = {
        path
        for path, operations in document["paths"].items()
        if all(op.get("security") == [{"simnet": []}] for op in operations.values())
    }
    assert secured == SIGNED | ADMIN
    assert document["components"]["securitySchemes"]["simnet"]["in"] == "header"


def test_the_schemas_describe_real_answers(make_site):
    a = make_site("a")
    b = make_site("b", trust=(a.key,))
    document = get(b, "/v1/openapi.json").json()
    a.kb.skills.publish("pick-mug", "pick")
    raws = a.kb.envelopes_since({})

    async def push():
        async with b.client(a.identity) as client:
            return await client.post(
                "/v1/envelopes",
                content=encode_page([*raws, raws[0][:-1] + bytes([raws[0][-1] ^ 1])]),
                headers={"content-type": PAGE_TYPE},
            )

    pushed = asyncio.run(push()).json()
    assert pushed["accepted"] == 1 and len(pushed["rejected"]) == 1
    jsonschema.validate(pushed, answer_schema(document, "PushResult"))
    jsonschema.validate(get(b, "/v1/heads", a.identity).json(), answer_schema(document, "Heads"))
    jsonschema.validate(get(b, "/v1/status", a.identity).json(), answer_schema(document, "Status"))
    jsonschema.validate(get(b, "/v1/health").json(), answer_schema(document, "Health"))
    refused = get(b, "/v1/heads")  # unsigned
    assert refused.status_code == 401
    jsonschema.validate(refused.json(), answer_schema(document, "Error"))

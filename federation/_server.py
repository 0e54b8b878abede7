"""A site's HTTP server: an ASGI application (Starlette) over one knowledge base.

Every endpoint but /v1/health, /v1/ready, /metrics and the OpenAPI description needs a signed
request (see `_auth`) from a key holding a current grant here (`KnowledgeBase.can_read`; the admin
endpoints, `_admin`: this site's own key). How each endpoint authenticates and answers errors is
`_endpoint`'s; bad requests change nothing. The knowledge-base work runs in worker threads so the
event loop keeps answering. The blob endpoints are `_blob_routes`'.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from knowledge import Head, IngestReport

from ._admin import admin_delegate, admin_revoke, admin_revoke_key, admin_sync
from ._auth import answer_signature
from ._blob_routes import BLOB_TYPE, blob, upload_blob
from ._endpoint import CatchAll, ClockHeader, endpoint, error_response, request_target
from ._errors import WireError
from ._metrics import CONTENT_TYPE as METRICS_TYPE
from ._openapi import describe
from ._page import render
from ._site import Site
from ._status import knowledge_counts, read_validator_state
from ._wire import (
    COMPLETE_HEADER,
    PAGE_BYTES,
    PAGE_TYPE,
    check_hex64,
    decode_page,
    encode_page,
    parse_heads,
    parse_json,
    parse_unchecked,
    with_hashes,
    within,
)

log = logging.getLogger("federation")
# Pages compress at level 1: a page of 212 skill envelopes (114 KB) came to 44 KB in 0.8 ms, against
# 42 KB in 2.2 ms at level 9 (Starlette's default); a busy site spends its CPU on the latter.
GZIP_LEVEL = 1


@endpoint(None)
async def health(request: Request, site: Site, body: bytes) -> Response:
    """
    summary: Liveness, the site's name and its root key (unauthenticated).
    responses: {"200": {description: '{"status": "ok", "name": ..., "key": ...}'}}
    """
    return JSONResponse({"status": "ok", "name": site.config.name, "key": site.key.hex()})


@endpoint(None)
async def ready(request: Request, site: Site, body: bytes) -> Response:
    """
    summary: >-
      Readiness (unauthenticated): 200 once the site serves and, if it gossips, its gossip loop
      runs.
    responses:
      "200": {description: '{"status": "ready"}'}
      "503": {description: '{"error": "not_ready", "detail": what is missing}'}
    """
    if site.closed:
        return error_response(503, "not_ready", "the site is shutting down")
    if site.gossip is not None and not site.gossip.running:
        return error_response(503, "not_ready", "the gossip loop is not running")
    return JSONResponse({"status": "ready"})


@endpoint(None)
async def metrics(request: Request, site: Site, body: bytes) -> Response:
    """
    summary: >-
      Prometheus metrics (unauthenticated): counters of requests, rounds and envelopes; gauges of
      what the site holds.
    responses: {"200": {description: Prometheus text exposition format.}}
    """
    exposition = await run_in_threadpool(site.metrics.exposition)
    return Response(exposition, media_type=METRICS_TYPE)


@endpoint("read")
async def sync(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Pull. Send your heads, get the envelopes you lack (one page).
    requestBody:
      content:
        application/json:
          example:
            {"heads": {"<author hex>": 12}, "hashes": {"<author hex>": "<hash of envelope 12>"},
             "unchecked": {"<author hex>": {"seq": 10, "after": 0}}, "limit": 1000}
    responses:
      "200":
        description: >-
          A page (application/x-simnet-envelopes). Call again with new heads until empty; an
          answer with `Simnet-Complete: 1` holds everything this site has for the heads sent.
      "400": {description: Malformed JSON or heads.}
      "503":
        description: >-
          No turn for a sync within the queue's limits; retry after Retry-After seconds.
    """
    request_json = parse_json(body)
    if not isinstance(request_json, dict):
        raise WireError("body must be a JSON object with 'heads' (and optionally 'limit')")
    seqs = parse_heads(request_json.get("heads", {}), max_authors=1 << 20)
    hashed = with_hashes(
        seqs, request_json.get("hashes")
    )  # a hash that differs here reveals a fork
    equivocators = request_json.get("equivocators", [])
    if not isinstance(equivocators, list) or not all(isinstance(a, str) for a in equivocators):
        raise WireError("'equivocators' must be a list of author keys (64 hex digits)")
    heads: dict[str, Head | int] = dict(hashed)
    for author in {
        check_hex64(a, "equivocator") for a in equivocators
    }:  # forks the caller knows of
        heads[author] = Head(
            seqs.get(author, 0), hashed[author].hash if author in hashed else "", equivocated_at=1
        )
    unchecked = parse_unchecked(request_json.get("unchecked"), max_authors=1 << 20)
    limit = request_json.get("limit", site.config.limits.max_page)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise WireError(f"'limit' must be a positive integer, not {limit!r}")
    limit = min(limit, site.config.limits.max_page)
    async with site.sync_turn():
        page, complete = await run_in_threadpool(_page_for, site, caller, heads, limit, unchecked)
    site.metrics.envelopes_out.labels("answer").inc(len(page))
    headers = {COMPLETE_HEADER: "1"} if complete else None
    return Response(encode_page(page), media_type=PAGE_TYPE, headers=headers)


@endpoint("read")
async def heads(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: >-
      The newest seq this site holds per author, and its envelope's hash (what you would push
      against).
    responses:
      "200":
        description: >-
          Heads, hashes and the authors caught forking; signed by the site (Simnet-Signature), so
          a writer learning how far its own feed goes can take it as this site's word.
    """
    body = json.dumps(await run_in_threadpool(_visible_heads, site, caller)).encode()
    authorization = request.headers.get("authorization")
    signature = answer_signature(
        site.identity, request.method, request_target(request), authorization, body
    )
    return Response(body, media_type="application/json", headers=signature)


def _page_for(
    site: Site,
    caller: bytes,
    heads: dict[str, Head | int],
    limit: int,
    unchecked: dict[str, tuple[int, int]],
) -> tuple[list[bytes], bool]:
    """The page a pull answers with (at most `limit` envelopes and `PAGE_BYTES`), and whether it
    holds everything this site has for `heads` (one envelope more is asked for to know; not claimed
    while a fork is known here, whose evidence can stand in for history). One worker-thread call:
    a busy site's every hop between the event loop and a thread costs."""
    withheld = site.withheld_from(caller)
    page = site.kb.envelopes_since(
        heads, limit + 1, exclude=withheld, unchecked=unchecked, max_bytes=PAGE_BYTES
    )
    held_all = len(page) <= limit and sum(map(len, page)) < PAGE_BYTES  # no bound cut it
    return within(page[:limit], PAGE_BYTES), held_all and not site.kb.equivocations()


def _ingest_page(
    site: Site, caller: bytes, page: list[bytes]
) -> tuple[IngestReport, dict[str, Any]]:
    """A pushed page applied, and the heads the caller sees after it (one worker-thread call)."""
    return site.kb.ingest(page), _visible_heads(site, caller)


def _visible_heads(site: Site, caller: bytes) -> dict[str, Any]:
    """{"heads": {author: seq}, "hashes": {author: hash}, "equivocators": [...]}, without the feeds
    withheld from this caller."""
    withheld = {a.hex() for a in site.withheld_from(caller)}
    heads = {a: h for a, h in site.kb.heads().items() if a not in withheld}
    return {
        "heads": {a: h.seq for a, h in heads.items()},
        "hashes": {a: h.hash for a, h in heads.items() if h.seq},
        "equivocators": [a for a, h in heads.items() if h.equivocated_at is not None],
    }


@endpoint("push")
async def envelopes(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Push. Send a page of envelopes; each is checked and applied or refused with a reason.
    requestBody: {content: {application/x-simnet-envelopes: {}}}
    responses:
      "200":
        description: >-
          {"accepted": n, "duplicates": n, "rejected": [{"index", "reason", "detail"}],
          "held": [{"index", "due"}], "heads": {...}}; held envelopes are applied when due.
      "400": {description: Malformed page.}
      "413": {description: Too many or too large envelopes.}
    """
    if request.headers.get("content-type", "").split(";")[0].strip() != PAGE_TYPE:
        raise WireError(f"content-type must be {PAGE_TYPE}", 415)
    limits = site.kb.limits
    page = decode_page(
        body, max_count=site.config.limits.max_page, max_envelope_bytes=limits.max_checkpoint_bytes
    )
    async with site.sync_turn():
        report, current = await run_in_threadpool(_ingest_page, site, caller, page)
    site.metrics.ingested(report, "push")
    return JSONResponse(
        {
            "accepted": len(report.accepted),
            "duplicates": report.duplicates,
            "rejected": [
                {"index": r.index, "reason": r.reason, "detail": r.detail} for r in report.rejected
            ],
            "equivocations": [{"author": a, "seq": s} for a, s in report.equivocations],
            "held": [{"index": h.index, "due": h.due_ms} for h in report.held],
            **current,
        }
    )


@endpoint("read")
async def status(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: >-
      Counts of what this site knows, its peers' sync state, and its validator's queue (null where
      no validator has run).
    responses: {"200": {description: 'Site status as JSON.'}}
    """
    counts = await run_in_threadpool(knowledge_counts, site.kb)
    validator = await run_in_threadpool(read_validator_state, site.config.home)
    peers = site.gossip.states() if site.gossip is not None else []
    return JSONResponse(
        {
            "name": site.config.name,
            "key": site.key.hex(),
            **counts,
            "peers": peers,
            "validator": validator,
        }
    )


@endpoint(None)
async def status_page(request: Request, site: Site, body: bytes) -> Response:
    """
    summary: The site's status page in HTML (unauthenticated, for loopback clients only).
    responses:
      "200": {description: "Peers, skills with their activation, forks caught, latest refusals."}
      "403": {description: The client is not on this machine.}
    """
    client = request.client.host if request.client else ""
    if client not in ("127.0.0.1", "::1", "localhost"):
        return error_response(
            403, "forbidden", "the status page is served to this machine only (use an SSH tunnel)"
        )
    host = request.headers.get("host")
    if host is not None and not _loopback_name(host):
        return error_response(
            403,
            "forbidden",
            f"the status page is served to this machine only, under a loopback name (Host "
            f"127.0.0.1 or localhost), not under Host {host[:80]!r}",
        )
    return HTMLResponse(await run_in_threadpool(render, site))


def _loopback_name(host: str) -> bool:
    """Whether a `Host` header names this machine. A web page the operator's browser opened can
    rebind its own name to 127.0.0.1 (DNS rebinding) and read the status page as same-origin; its
    requests come from loopback, but under its name."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
    except ValueError:
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


async def openapi(request: Request) -> Response:
    return JSONResponse(describe(request.app.routes))


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer in the same JSON shape as every other refusal."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return error_response(
        exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail)
    )


def create_app(
    site: Site,
    *,
    lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> Starlette:
    """The ASGI application for `site` (serve it with uvicorn; `simnet serve` does)."""
    routes = [
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/status", status_page, methods=["GET"]),
        Route("/v1/sync", sync, methods=["POST"]),
        Route("/v1/heads", heads, methods=["GET"]),
        Route("/v1/envelopes", envelopes, methods=["POST"]),
        Route("/v1/blobs/{hash}", blob, methods=["GET"]),
        Route("/v1/blobs/{hash}", upload_blob, methods=["PUT"]),
        Route("/v1/status", status, methods=["GET"]),
        Route("/v1/admin/sync", admin_sync, methods=["POST"]),
        Route("/v1/admin/revoke", admin_revoke, methods=["POST"]),
        Route("/v1/admin/delegate", admin_delegate, methods=["POST"]),
        Route("/v1/admin/revoke-key", admin_revoke_key, methods=["POST"]),
        Route("/v1/openapi.json", openapi, methods=["GET"], include_in_schema=False),
    ]
    gzip = Middleware(
        GZipMiddleware,
        minimum_size=1024,  # blobs are opaque (and streamed with their length)
        compresslevel=GZIP_LEVEL,
        exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, BLOB_TYPE),
    )
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(CatchAll),
            Middleware(ClockHeader, clock=site.kb.clock.physical),
            gzip,
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.site = site
    return app


__all__ = ["create_app"]

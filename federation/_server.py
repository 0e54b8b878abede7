"""A site's HTTP server: an ASGI application (Starlette) over one knowledge base.

Every endpoint but /v1/health and the OpenAPI description needs a signed request (see `_auth`) from a
key holding a current grant here (`KnowledgeBase.can_read`; the admin endpoints: this site's own key).
Bad requests get a 4xx with a JSON body ``{"error": code, "detail": message}`` and change nothing — a
write the knowledge base refuses too (403 `not_authorized` when the writer lacks the right, 400 for an
invalid record, 404 for an unknown skill, 409 `conflict` for any other refusal); a store that cannot be
written answers 503; an unexpected failure is logged and answered 500 in the same shape. The
knowledge-base work runs in worker threads so the event loop keeps answering. Blobs are sent a stored part
at a time, as fast as the client takes them in (the connection layer, `_http`, drops a client that stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from knowledge import (
    EmbodimentError,
    EnvelopeError,
    Head,
    IdentityError,
    KnowledgeBase,
    NotAuthorizedError,
    PolicyError,
    RecordError,
    Role,
    SimnetError,
    StoreError,
    UnknownSkillError,
)

from ._auth import RequestVerifier
from ._config import SiteConfig
from ._errors import AuthError, FederationError, WireError
from ._metrics import CONTENT_TYPE as METRICS_TYPE
from ._metrics import SiteMetrics
from ._openapi import describe
from ._wire import (
    PAGE_TYPE,
    check_hex64,
    decode_page,
    encode_page,
    parse_heads,
    parse_json,
    with_hashes,
)

log = logging.getLogger("federation")
BLOB_TYPE = "application/octet-stream"

Handler = Callable[[Request], Awaitable[Response]]
_WIRE_CODES = {400: "bad_request", 413: "too_large", 415: "unsupported_media_type"}
_AUTH_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    429: "too_many_requests",
    503: "unavailable",
}


class Site:
    """What a running server holds: the configuration, the knowledge base, the request verifier."""

    def __init__(self, config: SiteConfig, kb: KnowledgeBase) -> None:
        if kb.identity is None:
            raise FederationError("a site server needs a knowledge base opened with the site's key")
        self.config = config
        self.kb = kb
        self.key = kb.identity.public_key
        self.verifier = RequestVerifier(self.key, path=config.replay_path)
        self.syncs = asyncio.Semaphore(config.limits.max_concurrent_syncs)
        self.gossip: Any = None  # set by the gossip scheduler when it runs
        self.closed = False
        self.metrics = SiteMetrics(kb, lambda: self.gossip.states() if self.gossip else [])

    def close(self) -> None:
        """Close the replay log and the knowledge base (idempotent)."""
        self.closed = True
        self.verifier.close()
        self.kb.close()

    def withheld_from(self, caller: bytes) -> set[bytes]:
        return withheld_from(self.config, self.kb, caller)


def withheld_from(config: SiteConfig, kb: KnowledgeBase, caller: bytes) -> set[bytes]:
    """Feeds `caller` may not receive (by pull or push): those holding a private map it cannot read."""
    private = {m for rule in config.private if caller not in rule.readers for m in rule.maps}
    return kb.authors_writing(private) if private else set()


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise WireError(f"Content-Length {declared[:40]!r} is not a number")
        if int(declared) > limit:
            raise WireError(f"body of {declared} bytes exceeds the limit of {limit}", 413)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise WireError(f"body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
    except ClientDisconnect:
        raise WireError(f"the connection closed after {size} bytes of the body") from None
    return b"".join(chunks)


def endpoint(role: str | None) -> Callable[[Callable[..., Awaitable[Response]]], Handler]:
    """Wrap a handler: authenticate and authorize, read the body within limits, map errors to 4xx.

    `role` is "read" (a key holding a current grant here: see `KnowledgeBase.can_read`), "push" (the
    same: only admitted peers may push), "admin" (this site's own key), or None (no authentication).
    Everything about the caller that the header shows is checked before a byte of the body is read
    (see `_authenticate`); an unexpected exception is logged and answered 500, never raised.
    """

    def wrap(handler: Callable[..., Awaitable[Response]]) -> Handler:
        async def run(request: Request) -> Response:
            site: Site = request.app.state.site
            response = await answer(request, site)
            site.metrics.requests.labels(handler.__name__, str(response.status_code)).inc()
            return response

        async def answer(request: Request, site: Site) -> Response:
            try:
                if role is None:  # unauthenticated: its body, if any, is never read
                    return await handler(request, site, b"")
                caller, body = await _authenticate(request, site, role)
                return await handler(request, site, body, caller)
            except WireError as exc:
                return _error(exc.status, _WIRE_CODES.get(exc.status, "bad_request"), str(exc))
            except AuthError as exc:
                return _error(exc.status, _AUTH_CODES.get(exc.status, "auth"), str(exc))
            except TimeoutError:
                return _error(
                    408, "timeout", f"request not received within {site.config.limits.timeout_s} s"
                )
            except SimnetError as exc:  # the knowledge base refused a well-formed request
                return _refusal(request, exc)
            except Exception as exc:  # noqa: BLE001 - a bug or a failing disk: answer, log, keep serving
                log.error(
                    "%s %s failed: %s: %s",
                    request.method,
                    request.url.path,
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )
                return _error(
                    500,
                    "internal_error",
                    f"the site failed to handle this request ({type(exc).__name__}); "
                    "it is logged there",
                )

        run.__doc__ = handler.__doc__
        run.role = role  # type: ignore[attr-defined] # the OpenAPI description marks signed routes
        return run

    return wrap


def _refusal(request: Request, exc: SimnetError) -> JSONResponse:
    """The answer to an error the knowledge base raised on purpose: a 4xx naming it (503 for the store)."""
    if isinstance(exc, NotAuthorizedError):  # the writer lacks the role, or may not write now
        return _error(403, "not_authorized", str(exc))
    if isinstance(exc, UnknownSkillError):
        return _error(404, "not_found", str(exc.args[0] if exc.args else exc))
    if isinstance(exc, (RecordError, IdentityError, EnvelopeError, PolicyError, EmbodimentError)):
        return _error(
            400, "bad_request", str(exc)
        )  # a well-formed request asking for an invalid write
    if isinstance(exc, StoreError):  # the disk, not the caller: say so, and log it here
        log.error("%s %s: the store failed: %s", request.method, request.url.path, exc)
        return _error(
            503,
            "unavailable",
            f"the site cannot write its store now ({type(exc).__name__}); it is logged there",
        )
    return _error(409, "conflict", str(exc))  # refused in the knowledge base's current state


async def _read(request: Request, site: Site) -> bytes:
    async with asyncio.timeout(site.config.limits.timeout_s):
        return await _body(request, site.config.limits.max_body_bytes)


async def _authenticate(request: Request, site: Site, role: str) -> tuple[bytes, bytes]:
    """(caller, body). In order: the header's form, timestamp window and unused nonce (401); the caller's
    right to `role` (403); only then the body (408/413); the signature over it (401); and the nonce's
    durable record (401 if a simultaneous copy won, 429 if too many, 503 if it cannot be written)."""
    claim = site.verifier.claim(request.headers.get("authorization"))
    if role == "admin":
        if claim.key != site.key:
            raise AuthError("only this site's own key may use the admin endpoints", 403)
    elif not await run_in_threadpool(site.kb.can_read, claim.key):
        raise AuthError(await run_in_threadpool(_no_grant, site, claim.key), 403)
    body = await _read(request, site)
    target = request.scope["raw_path"].decode("latin-1")
    if request.scope.get("query_string"):
        target += "?" + request.scope["query_string"].decode("latin-1")
    site.verifier.check(claim, request.method, target, body)
    await run_in_threadpool(site.verifier.remember, claim)
    return claim.key, body


def _no_grant(site: Site, key: bytes) -> str:
    """Why `key` may not read or push here, and what it would need."""
    who, roles = f"key {key.hex()[:16]}…", site.kb.roles_of(key)
    need = "reading and pushing need a current grant: a trusted site root, or a device delegated at least one role"
    if roles is None:
        return f"{who} is not trusted by this site's policy; {need}"
    if not roles:
        return f"{who} is delegated no roles here; {need}"
    return f"{who} holds no current grant here: its delegation was revoked or has expired; {need}"


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
    summary: Readiness (unauthenticated) - 200 once the store is open and, if it gossips, the gossip loop runs.
    responses:
      "200": {description: '{"status": "ready"}'}
      "503": {description: '{"error": "not_ready", "detail": what is missing}'}
    """
    if site.closed:
        return _error(503, "not_ready", "the site is shutting down")
    if site.gossip is not None and not site.gossip.running:
        return _error(503, "not_ready", "the gossip loop is not running")
    return JSONResponse({"status": "ready"})


@endpoint(None)
async def metrics(request: Request, site: Site, body: bytes) -> Response:
    """
    summary: Prometheus metrics (unauthenticated) - counters of requests, rounds and envelopes; gauges of what the site holds.
    responses: {"200": {description: Prometheus text exposition format.}}
    """
    exposition = await run_in_threadpool(site.metrics.exposition)
    return Response(exposition, media_type=METRICS_TYPE)


@endpoint("read")
async def sync(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Pull. Send your heads, get the envelopes you lack (one page).
    requestBody: {content: {application/json: {example: {"heads": {"<author hex>": 12}, "hashes": {"<author hex>": "<hash of envelope 12>"}, "limit": 1000}}}}
    responses:
      "200": {description: 'A page (application/x-simnet-envelopes). Call again with new heads until empty.'}
      "400": {description: Malformed JSON or heads.}
      "503": {description: Too many syncs at once; retry later.}
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
    limit = request_json.get("limit", site.config.limits.max_page)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise WireError(f"'limit' must be a positive integer, not {limit!r}")
    limit = min(limit, site.config.limits.max_page)
    if site.syncs.locked():
        return _error(503, "busy", "too many syncs in progress; retry later")
    async with site.syncs:
        withheld = await run_in_threadpool(site.withheld_from, caller)
        page = await run_in_threadpool(site.kb.envelopes_since, heads, limit, exclude=withheld)
    site.metrics.envelopes_out.labels("answer").inc(len(page))
    return Response(encode_page(page), media_type=PAGE_TYPE)


@endpoint("read")
async def heads(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: The newest seq this site holds per author, and its envelope's hash (what you would push against).
    responses: {"200": {description: '{"heads": {"<author hex>": seq}, "hashes": {"<author hex>": "<hash>"}, "equivocators": ["<author hex>"]}'}}
    """
    return JSONResponse(await run_in_threadpool(_visible_heads, site, caller))


def _visible_heads(site: Site, caller: bytes) -> dict[str, Any]:
    """{"heads": {author: seq}, "hashes": {author: hash}, "equivocators": [...]}, without the feeds withheld
    from this caller."""
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
      "200": {description: '{"accepted": n, "duplicates": n, "rejected": [{"index", "reason", "detail"}], "heads": {...}}'}
      "400": {description: Malformed page.}
      "413": {description: Too many or too large envelopes.}
    """
    if request.headers.get("content-type", "").split(";")[0].strip() != PAGE_TYPE:
        raise WireError(f"content-type must be {PAGE_TYPE}", 415)
    limits = site.kb.limits
    page = decode_page(
        body, max_count=site.config.limits.max_page, max_envelope_bytes=limits.max_checkpoint_bytes
    )
    if site.syncs.locked():
        return _error(503, "busy", "too many syncs in progress; retry later")
    async with site.syncs:
        report = await run_in_threadpool(site.kb.ingest, page)
        current = await run_in_threadpool(_visible_heads, site, caller)
    site.metrics.ingested(report, "push")
    return JSONResponse(
        {
            "accepted": len(report.accepted),
            "duplicates": report.duplicates,
            "rejected": [
                {"index": r.index, "reason": r.reason, "detail": r.detail} for r in report.rejected
            ],
            "equivocations": [{"author": a, "seq": s} for a, s in report.equivocations],
            **current,
        }
    )


@endpoint("read")
async def blob(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: A blob by its SHA-256 (streamed). The receiver verifies the hash.
    parameters: [{name: hash, in: path, required: true, schema: {type: string}}]
    responses: {"200": {description: The blob's bytes.}, "404": {description: Not stored here.}}
    """
    blob_hash = check_hex64(request.path_params["hash"], "blob hash")
    size = await run_in_threadpool(site.kb.blobs.size, blob_hash)
    if size is None:
        return _error(404, "not_found", f"blob {blob_hash[:16]}… is not stored here")
    return BlobResponse(site.kb, blob_hash, size)


def _blob_part(kb: KnowledgeBase, blob_hash: str, index: int, digest: Any) -> bytes | None:
    part = kb.blobs.part(blob_hash, index)
    if part is not None:
        digest.update(part)
    return part


class BlobResponse(StreamingResponse):
    """A stored blob, read and sent a part at a time (`knowledge._store.BLOB_PART` bytes) as the client takes
    it in: each send waits while the connection's buffer is full, so a client that reads slowly or not at all
    holds one part here, never the blob (and `_http` drops it when it stalls). The parts are hashed as they
    go and the last is sent only if the whole matches its hash: a corrupt stored blob is logged and its
    answer cut short (the connection is closed), never delivered complete."""

    def __init__(self, kb: KnowledgeBase, blob_hash: str, size: int) -> None:
        super().__init__((), media_type=BLOB_TYPE, headers={"content-length": str(size)})
        self.kb, self.blob_hash, self.size = kb, blob_hash, size

    async def stream_response(self, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        digest, sent, held = hashlib.sha256(), 0, b""
        for index in range(1 << 40):
            try:
                part = await run_in_threadpool(_blob_part, self.kb, self.blob_hash, index, digest)
            except Exception as exc:  # noqa: BLE001 - the store failed (or closed, at shutdown) mid-answer
                log.error(
                    "blob %s…: reading its part %d failed (%s: %s): its answer was cut short",
                    self.blob_hash[:16],
                    index,
                    type(exc).__name__,
                    exc,
                )
                return
            if part is None:
                break
            if index:
                await send({"type": "http.response.body", "body": held, "more_body": True})
            held = part
            sent += len(part)
            if sent > self.size:
                break
        if sent != self.size or digest.hexdigest() != self.blob_hash:
            log.error(
                "stored blob %s… is corrupt (%d bytes, %d expected, or a hash mismatch): its answer was cut "
                "short",
                self.blob_hash[:16],
                sent,
                self.size,
            )
            return  # without the end of the body: the server closes the connection
        await send({"type": "http.response.body", "body": held, "more_body": False})


@endpoint("read")
async def status(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Counts of what this site knows, and its peers' sync state.
    responses: {"200": {description: 'Site status as JSON.'}}
    """
    counts = await run_in_threadpool(knowledge_counts, site.kb)
    peers = site.gossip.states() if site.gossip is not None else []
    return JSONResponse({"name": site.config.name, "key": site.key.hex(), **counts, "peers": peers})


def knowledge_counts(kb: KnowledgeBase) -> dict[str, int]:
    skills = kb.skills.list(include_withdrawn=True)
    return {
        "skills": len(skills),
        "active_skills": sum(kb.is_active(s.id) for s in skills),
        "certificates": sum(len(kb.certificates.for_skill(s.id)) for s in skills),
        "revocations": sum(kb.is_revoked(s.id) for s in skills),
        "equivocations": len(kb.equivocations()),
        "writers": len(kb.heads()),
        "envelopes": sum(h.seq for h in kb.heads().values()),
    }


@endpoint("admin")
async def admin_sync(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Run a sync round now, with one named peer or with every peer (this site's key only).
    requestBody: {content: {application/json: {example: {"peer": "site-b"}}}}
    """
    data = parse_json(body or b"{}")
    name = data.get("peer") if isinstance(data, dict) else None
    if site.gossip is None:
        return _error(409, "no_gossip", "this server runs without a gossip scheduler")
    try:
        reports = await site.gossip.sync_now(name)
    except FederationError as exc:
        return _error(404, "unknown_peer", str(exc))
    return JSONResponse({"reports": reports})


@endpoint("admin")
async def admin_revoke(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Revoke a skill as this site (this site's key only).
    requestBody: {content: {application/json: {example: {"skill": "<64 hex>", "reason": "..."}}}}
    """
    data = parse_json(body)
    if not isinstance(data, dict) or not isinstance(data.get("skill"), str):
        raise WireError(
            "body must be a JSON object with 'skill' (64 hex digits) and optionally 'reason'"
        )
    check_hex64(data["skill"], "skill id")
    await run_in_threadpool(site.kb.revoke, data["skill"], str(data.get("reason", "")))
    return JSONResponse({"revoked": data["skill"]})


@endpoint("admin")
async def admin_delegate(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Delegate roles to a device key (this site's key only).
    requestBody: {content: {application/json: {example: {"device": "<64 hex>", "roles": ["publish"]}}}}
    """
    data = parse_json(body)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("device"), str)
        or not isinstance(data.get("roles"), list)
    ):
        raise WireError(
            "body must be a JSON object with 'device' (64 hex digits) and 'roles' (a list)"
        )
    try:
        roles = [Role(r) for r in data["roles"]]
    except ValueError as exc:
        raise WireError(f"{exc}; roles are publish, validate, revoke") from None
    device = bytes.fromhex(check_hex64(data["device"], "device key"))
    await run_in_threadpool(lambda: site.kb.delegate(device, roles))
    return JSONResponse({"delegated": data["device"], "roles": [r.value for r in roles]})


@endpoint("admin")
async def admin_revoke_key(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Stop accepting a device's feed after a given seq (this site's key only).
    requestBody: {content: {application/json: {example: {"device": "<64 hex>", "last_seq": 41, "reason": "lost"}}}}
    """
    data = parse_json(body)
    last_seq = data.get("last_seq") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("device"), str)
        or not isinstance(last_seq, int)
        or isinstance(last_seq, bool)
        or last_seq < 0
    ):
        raise WireError(
            "body must be a JSON object with 'device' (64 hex digits) and 'last_seq' (an integer >= 0)"
        )
    device = bytes.fromhex(check_hex64(data["device"], "device key"))
    await run_in_threadpool(site.kb.revoke_key, device, last_seq, str(data.get("reason", "")))
    return JSONResponse({"revoked_key": data["device"], "last_seq": last_seq})


async def openapi(request: Request) -> Response:
    return JSONResponse(describe(request.app.routes))


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer in the same JSON shape as every other refusal."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return _error(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))


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
        Route("/v1/sync", sync, methods=["POST"]),
        Route("/v1/heads", heads, methods=["GET"]),
        Route("/v1/envelopes", envelopes, methods=["POST"]),
        Route("/v1/blobs/{hash}", blob, methods=["GET"]),
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
        exclude_content_types=(*DEFAULT_EXCLUDED_CONTENT_TYPES, BLOB_TYPE),
    )
    app = Starlette(
        routes=routes,
        middleware=[gzip],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.site = site
    return app


__all__ = ["Site", "create_app", "knowledge_counts", "withheld_from"]

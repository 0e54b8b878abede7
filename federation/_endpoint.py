"""How every endpoint answers: authentication and authorization before the body is read, limits on
the body, and errors mapped to a 4xx with a JSON body ``{"error": code, "detail": message}``.

A write the knowledge base refuses is a 4xx too (403 `not_authorized` when the writer lacks the
right, 400 for an invalid record, 404 for an unknown skill, 409 `conflict` for any other refusal); a
store whose disk is full answers 507 `insufficient_storage`, one that cannot be written for another
reason (read-only, an I/O error) 503 `unavailable`: the write was not made, and reads go on being
served. An unexpected failure is logged and answered 500 `internal_error` in the same shape, and the
server keeps serving. Every answer is counted in the site's metrics by handler and status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from knowledge import (
    EmbodimentError,
    EnvelopeError,
    IdentityError,
    NotAuthorizedError,
    PolicyError,
    RecordError,
    SimnetError,
    StoreError,
    StoreFullError,
    UnknownSkillError,
)

from ._errors import AuthError, BusyError, WireError
from ._site import Site
from ._wire import TIME_HEADER

log = logging.getLogger("federation")

Handler = Callable[[Request], Awaitable[Response]]
_WIRE_CODES = {400: "bad_request", 413: "too_large", 415: "unsupported_media_type"}
_AUTH_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    429: "too_many_requests",
    503: "unavailable",
    507: "insufficient_storage",
}


# What is never answered: the process or the task is being stopped.
FATAL = (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError)


def error_response(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


def internal_error(method: str, path: str, exc: BaseException) -> JSONResponse:
    """Log an unexpected failure with its traceback; the 500 that answers it, without details."""
    log.error("%s %s failed: %s: %s", method, path, type(exc).__name__, exc, exc_info=exc)
    return error_response(
        500,
        "internal_error",
        f"the site failed to handle this request ({type(exc).__name__}); it is logged there",
    )


class CatchAll:
    """ASGI middleware, outermost: whatever escapes the app (a route outside `endpoint`, a
    middleware, a panic) is logged and answered as JSON 500 `internal_error`, never with Starlette's
    plain-text page; the server goes on serving. A failure after the answer began (a streamed blob)
    is logged and the answer cut short: the connection is closed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except BaseException as exc:
            if isinstance(exc, FATAL):
                raise
            answer = internal_error(scope.get("method", ""), scope.get("path", ""), exc)
            if not started:
                await answer(scope, receive, send)


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
    (see `_authenticate`); an unexpected exception (any but those in FATAL) is logged and answered
    500, never raised.
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
            except BusyError as exc:
                busy = error_response(503, "busy", str(exc))
                busy.headers["retry-after"] = str(exc.retry_after)
                return busy
            except WireError as exc:
                return error_response(
                    exc.status, _WIRE_CODES.get(exc.status, "bad_request"), str(exc)
                )
            except AuthError as exc:
                return error_response(exc.status, _AUTH_CODES.get(exc.status, "auth"), str(exc))
            except TimeoutError:
                return error_response(
                    408, "timeout", f"request not received within {site.config.limits.timeout_s} s"
                )
            except SimnetError as exc:  # the knowledge base refused a well-formed request
                return _refusal(request, exc)
            except BaseException as exc:  # a bug, a failing disk, a panic: answer, log, go on
                if isinstance(exc, FATAL):
                    raise
                return internal_error(request.method, request.url.path, exc)

        run.__doc__ = handler.__doc__
        run.role = role  # type: ignore[attr-defined] # the OpenAPI description marks signed routes
        return run

    return wrap


def request_target(request: Request) -> str:
    """The path and query as the client signed them (`SimnetAuth` signs the raw target)."""
    target = request.scope["raw_path"].decode("latin-1")
    if request.scope.get("query_string"):
        target += "?" + request.scope["query_string"].decode("latin-1")
    return target


def _refusal(request: Request, exc: SimnetError) -> JSONResponse:
    """The answer to an error the knowledge base raised on purpose: a 4xx naming it (507 for a full
    disk, 503 for another failure of the store)."""
    if isinstance(exc, NotAuthorizedError):  # the writer lacks the role, or may not write now
        return error_response(403, "not_authorized", str(exc))
    if isinstance(exc, UnknownSkillError):
        return error_response(404, "not_found", str(exc.args[0] if exc.args else exc))
    if isinstance(exc, (RecordError, IdentityError, EnvelopeError, PolicyError, EmbodimentError)):
        return error_response(
            400, "bad_request", str(exc)
        )  # a well-formed request asking for an invalid write
    if isinstance(exc, StoreError):  # the disk, not the caller: say so, and log it here
        log.error("%s %s: the store failed: %s", request.method, request.url.path, exc)
        if isinstance(exc, StoreFullError):
            return error_response(
                507,
                "insufficient_storage",
                "the site's disk is full: nothing of this request was stored; retry later",
            )
        return error_response(
            503,
            "unavailable",
            f"the site cannot write its store now ({type(exc).__name__}); it is logged there",
        )
    return error_response(
        409, "conflict", str(exc)
    )  # refused in the knowledge base's current state


async def _read(request: Request, site: Site) -> bytes:
    async with asyncio.timeout(site.config.limits.timeout_s):
        return await _body(request, site.config.limits.max_body_bytes)


async def _authenticate(request: Request, site: Site, role: str) -> tuple[bytes, bytes]:
    """(caller, body). In order: the header's form, timestamp window and unused nonce (401); the
    caller's right to `role` (403); only then the body (408/413); the signature over it (401); and
    the nonce's durable record (401 if a simultaneous copy won, 429 if too many, 503 if it cannot be
    written, 507 if the disk is full)."""
    claim = site.verifier.claim(request.headers.get("authorization"))
    if role == "admin":
        if claim.key != site.key:
            raise AuthError("only this site's own key may use the admin endpoints", 403)
    elif not await run_in_threadpool(site.kb.can_read, claim.key):
        raise AuthError(await run_in_threadpool(_no_grant, site, claim.key), 403)
    body = await _read(request, site)
    site.verifier.check(claim, request.method, request_target(request), body)
    await run_in_threadpool(site.verifier.remember, claim)
    return claim.key, body


def _no_grant(site: Site, key: bytes) -> str:
    """Why `key` may not read or push here, and what it would need."""
    who, roles = f"key {key.hex()[:16]}…", site.kb.roles_of(key)
    need = (
        "reading and pushing need a current grant: "
        "a trusted site root, or a device delegated at least one role"
    )
    if roles is None:
        return f"{who} is not trusted by this site's policy; {need}"
    if not roles:
        return f"{who} is delegated no roles here; {need}"
    return f"{who} holds no current grant here: its delegation was revoked or has expired; {need}"


class ClockHeader:
    """ASGI middleware: every answer carries the site's clock, `Simnet-Time: <unix ms>`, read as
    the answer starts, so a client measures the offset between its clock and the site's (a device
    refuses to write what its site would refuse; see `KnowledgeBase.learn_site_time`)."""

    def __init__(self, app: ASGIApp, clock: Callable[[], int]) -> None:
        self.app, self.clock = app, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                stamp = (TIME_HEADER.encode(), str(self.clock()).encode())
                message = {**message, "headers": [*message.get("headers", ()), stamp]}
            await send(message)

        await self.app(scope, receive, stamped)

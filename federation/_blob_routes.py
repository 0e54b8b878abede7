"""The blob endpoints: `GET /v1/blobs/{hash}` streams a stored blob (for a device it delegated, a
site fetches one it lacks from its peers first) and `PUT /v1/blobs/{hash}` takes a blob that a held
skill or task names.

Blobs are sent a stored part at a time, as fast as the client takes them in (the connection layer,
`_http`, drops a client that stops), and are hashed on the way out, so a corrupt stored blob is
never delivered whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import threading
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from knowledge import BlobError, BlobQuotaError, KnowledgeBase, Role

from ._blobs import fetch_for_device, parse_range
from ._endpoint import endpoint, error_response
from ._errors import BusyError, WireError
from ._site import DEVICE_FETCHES, Site
from ._wire import check_hex64

log = logging.getLogger("federation")
BLOB_TYPE = "application/octet-stream"


@endpoint("read")
async def blob(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: >-
      A blob by its SHA-256 (streamed; one byte range with Range: bytes=N-). The receiver verifies
      the hash. For a device it delegated, a site fetches a blob it lacks from its peers first,
      if a skill or task held here names it.
    parameters: [{name: hash, in: path, required: true, schema: {type: string}}]
    responses:
      "200": {description: The blob's bytes.}
      "206": {description: The bytes of the range asked for (Content-Range says which).}
      "404": {description: "Not stored here (nor, for a device, named here or at any peer)."}
      "416": {description: The range starts past the blob's end.}
      "504": {description: "A device's blob is still being fetched from the peers; ask again."}
      "507": {description: A device's blob does not fit in this site's blob quota.}
    """
    blob_hash = check_hex64(request.path_params["hash"], "blob hash")
    size = await run_in_threadpool(site.kb.blobs.size, blob_hash)
    if size is None and site.config.peers and await run_in_threadpool(_is_own_device, site, caller):
        if not await run_in_threadpool(site.kb.blobs.is_named, blob_hash):
            return error_response(
                404,
                "not_found",
                f"blob {blob_hash[:16]}… is not stored here, and no skill or task held here names "
                "it: a site fetches for its devices only the blobs its records name",
            )
        fetched = await _fetch_for_device(site, blob_hash, caller)
        if isinstance(fetched, Response):
            return fetched
        size = fetched
    if size is None:
        return error_response(404, "not_found", f"blob {blob_hash[:16]}… is not stored here")
    try:
        span = parse_range(request.headers.get("range"), size)
    except WireError as exc:
        if exc.status != 416:
            raise
        refused = error_response(416, "range_not_satisfiable", str(exc))
        refused.headers["content-range"] = f"bytes */{size}"
        return refused
    return BlobResponse(site.kb, blob_hash, size, span)


@endpoint("push")
async def upload_blob(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: >-
      Give this site a blob that a live skill or a task it holds names (a device uploads the
      weights of a skill it published, or the scene assets of a task, after pushing the record's
      envelope). The caller needs the publish role here; the body must hash to the path's hash and
      fit in the body limit and the site's blob quota.
    parameters: [{name: hash, in: path, required: true, schema: {type: string}}]
    requestBody:
      content: {application/octet-stream: {schema: {type: string, format: binary}}}
    responses:
      "200": {description: Held already; nothing changed.}
      "201": {description: Stored.}
      "400": {description: The body does not hash to the blob hash.}
      "403": {description: The caller lacks the publish role here.}
      "404": {description: "No live skill or task here names the blob (push its record first)."}
      "507": {description: The blob does not fit in this site's blob quota.}
    """
    blob_hash = check_hex64(request.path_params["hash"], "blob hash")
    kb = site.kb
    if Role.PUBLISH not in await run_in_threadpool(kb.current_roles, caller):
        return error_response(
            403, "not_authorized", "uploading a blob needs a current grant of the publish role here"
        )
    if not await run_in_threadpool(kb.blobs.is_named, blob_hash):
        return error_response(
            404,
            "not_found",
            f"no live skill or task held here names blob {blob_hash[:16]}…: push its envelope "
            "first (a blob that only withdrawn or revoked skills name is not taken)",
        )
    if await run_in_threadpool(kb.blobs.size, blob_hash) is not None:
        return JSONResponse({"stored": False, "bytes": len(body)})
    try:
        await run_in_threadpool(functools.partial(kb.blobs.put, body, expected=blob_hash))
    except BlobQuotaError as exc:
        return error_response(507, "insufficient_storage", str(exc))
    except BlobError as exc:
        return error_response(400, "bad_request", str(exc))
    return JSONResponse({"stored": True, "bytes": len(body)}, status_code=201)


def _is_own_device(site: Site, caller: bytes) -> bool:
    """A device this site delegated (not a site root): the only callers it fetches blobs for.
    Another site's devices get what is held, as sites do: a root trusted here could delegate any
    number of keys, each of them taking a fetch turn, and answer none of the fetches itself."""
    return caller != site.key and site.key in site.kb.vouching_sites(caller)


async def _fetch_for_device(site: Site, blob_hash: str, caller: bytes) -> int | Response:
    """The size of a blob fetched now from this site's peers, or the answer saying why not.

    The fetch runs on a thread of its own, at most `DEVICE_FETCHES` at once (503 `busy` beyond):
    on the server's shared worker threads, which every signed request needs, a device asking
    many times while a peer never answered held them all until the deadline and stalled the
    site. A request for a blob already being fetched waits for that fetch, and a device starts
    one fetch at a time (503 `busy` while its last is under way): one device asking again and
    again, while a peer never answered, took every turn and kept the site's other devices out."""
    outcome = site.fetching.get(blob_hash) or _start_fetch(site, blob_hash, caller)
    try:  # past the deadline the fetch goes on in its thread, and stores the blob when done
        async with asyncio.timeout(site.config.limits.sync_deadline_s):
            return await asyncio.shield(outcome)
    except TimeoutError:
        return error_response(
            504, "timeout", f"blob {blob_hash[:16]}… is still being fetched from this site's peers"
        )
    except BlobQuotaError as exc:
        return error_response(507, "insufficient_storage", str(exc))
    except BlobError as exc:
        return error_response(404, "not_found", str(exc))


def _start_fetch(site: Site, blob_hash: str, caller: bytes) -> asyncio.Future[int]:
    """Start fetching a blob for the device `caller` in a thread of its own; the future of its
    size. BusyError if the device's last fetch is under way or every turn is taken."""
    if caller in site.fetching_for:
        raise BusyError("a blob this device asked for is still being fetched; retry later")
    if not site.device_fetches.acquire(blocking=False):
        raise BusyError(
            f"this site is fetching {DEVICE_FETCHES} blobs for its devices already; retry later"
        )
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[int] = loop.create_future()
    site.fetching[blob_hash] = outcome
    site.fetching_for.add(caller)

    def done(future: asyncio.Future[int]) -> None:
        site.fetching.pop(blob_hash, None)
        site.fetching_for.discard(caller)
        if not future.cancelled():  # retrieved here: one that ends after its requests timed out
            future.exception()  # is logged by nobody, not as never retrieved

    outcome.add_done_callback(done)

    def fetch() -> None:
        try:
            size = fetch_for_device(site.config, site.kb, blob_hash)
        except BaseException as exc:  # noqa: BLE001 - handed to the requests that asked
            _settle(loop, outcome, exc)
        else:
            _settle(loop, outcome, size)
        finally:
            site.device_fetches.release()

    threading.Thread(target=fetch, name="device-blob-fetch", daemon=True).start()
    return outcome


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[int], value: Any) -> None:
    """Hand a fetch's size or exception to the request awaiting it (none once the loop closed)."""

    def settle() -> None:
        if future.done():
            return
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    with contextlib.suppress(RuntimeError):  # the server stopped meanwhile
        loop.call_soon_threadsafe(settle)


def _blob_part(kb: KnowledgeBase, blob_hash: str, index: int, digest: Any) -> bytes | None:
    part = kb.blobs.part(blob_hash, index)
    if part is not None:
        digest.update(part)
    return part


class BlobResponse(StreamingResponse):
    """A stored blob, read and sent a part at a time (`knowledge._store.BLOB_PART` bytes) as the
    client takes it in: each send waits while the connection's buffer is full, so a client that
    reads slowly or not at all holds one part here, never the blob (and `_http` drops it when it
    stalls). The parts are hashed as they go and the last is sent only if the whole matches its
    hash: a corrupt stored blob is logged and its answer cut short (the connection is closed), never
    delivered complete. With a `span` [start, end) only those bytes are sent (206), but every part
    is read and hashed all the same."""

    def __init__(
        self, kb: KnowledgeBase, blob_hash: str, size: int, span: tuple[int, int] | None = None
    ) -> None:
        start, end = span or (0, size)
        headers = {"content-length": str(end - start), "accept-ranges": "bytes"}
        if span is not None:
            headers["content-range"] = f"bytes {start}-{end - 1}/{size}"
        super().__init__(
            (), status_code=206 if span else 200, media_type=BLOB_TYPE, headers=headers
        )
        self.kb, self.blob_hash, self.size, self.start, self.end = kb, blob_hash, size, start, end

    async def stream_response(self, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        digest, read, held = hashlib.sha256(), 0, None
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
            piece = part[max(self.start - read, 0) : max(self.end - read, 0)]
            read += len(part)
            if piece:
                if held is not None:
                    await send({"type": "http.response.body", "body": held, "more_body": True})
                held = piece
            if read > self.size:
                break
        if read != self.size or digest.hexdigest() != self.blob_hash:
            log.error(
                "stored blob %s… is corrupt (%d bytes, %d expected, or a hash mismatch): "
                "its answer was cut short",
                self.blob_hash[:16],
                read,
                self.size,
            )
            return  # without the end of the body: the server closes the connection
        await send({"type": "http.response.body", "body": held or b"", "more_body": False})

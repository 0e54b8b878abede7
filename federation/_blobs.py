"""Blobs from peers: each peer a `knowledge.BlobSource` over its `GET /v1/blobs/{sha256}`.

`kb.blobs.fetch` asks the sources in turn and checks the hash; a `PeerBlobSource` only moves bytes.
A fetch that holds the first bytes of a blob already asks for the rest (`Range: bytes=N-`), so a
connection cut midway costs only what had not arrived. The request is signed like every other
(`SimnetAuth`) and held to the same deadline as a sync round; a busy peer (503, 429) is asked again
as `sync_with` would.

`attach_site_peers(home, kb)` attaches a site's peers (from its simnet.toml) and its blob quota to
a knowledge base opened from its home: the `simnet` command names it in `knowledge.cli.BLOB_SETUP`,
so `simnet certify` and the other simulator commands fetch the weights they lack without `sim`
importing federation. The server fetches for its devices (`fetch_for_device`): a device asks its
site, the site asks its peers; a site asking a site gets only what that site holds, so requests
never go round in circles.
"""

from __future__ import annotations

import re
import ssl
import time

import httpx

from knowledge import BlobError, Identity, IncomingBlob, KnowledgeBase, SiteHome

from ._auth import SimnetAuth
from ._calls import DEADLINE_FACTOR, Deadline, Watchdog, client_verify, retry_after
from ._client import API
from ._config import CONFIG_FILE, SiteConfig
from ._errors import PeerError, WireError

MAX_ERROR_BODY = 64 << 10  # bytes of a refusal's body read for its message
_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20})")
_RANGE = re.compile(r"bytes=(\d{0,20})-(\d{0,20})")


class PeerBlobSource:
    """One peer as a place to fetch blobs from (a `knowledge.BlobSource`); `bytes_received` counts
    the blob bytes it has brought in, over every fetch."""

    def __init__(
        self,
        name: str,
        url: str,
        peer_key: bytes,
        identity: Identity,
        *,
        timeout: float = 30.0,
        deadline: float | None = None,
        verify: ssl.SSLContext | bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.name, self.url, self.peer_key, self.identity = (
            name,
            url.rstrip("/"),
            peer_key,
            identity,
        )
        self.timeout = timeout
        self.deadline = DEADLINE_FACTOR * timeout if deadline is None else deadline
        self.verify, self.transport = verify, transport
        self.bytes_received = 0

    def __repr__(self) -> str:
        return f"PeerBlobSource({self.name!r}, {self.url!r})"

    def fetch_blob(self, blob: IncomingBlob) -> bool:
        """Write the blob's bytes from `blob.offset` on into `blob`; False if the peer lacks it."""
        url = f"{self.url}{API}/blobs/{blob.hash}"
        limit = Deadline(url, self.deadline)
        auth = SimnetAuth(self.identity, self.peer_key)
        with (
            Watchdog(limit) as watchdog,
            httpx.Client(
                auth=auth,
                verify=client_verify(url, self.verify),
                transport=self.transport,
                follow_redirects=False,
            ) as client,
        ):
            busy, restarted = 0, False
            while True:
                headers = {"accept-encoding": "identity"}
                if blob.offset:
                    headers["range"] = f"bytes={blob.offset}-"
                try:
                    with client.stream(
                        "GET",
                        url,
                        headers=headers,
                        timeout=min(self.timeout, max(limit.remaining(), 0.001)),
                        extensions={"trace": watchdog.trace},
                    ) as answer:
                        wait = retry_after(answer, busy, limit.remaining())
                        if wait is not None:
                            busy += 1
                            time.sleep(wait)
                            continue
                        if answer.status_code == 416 and blob.offset and not restarted:
                            restarted = True  # it holds fewer bytes than we do: ours are not its
                            blob.restart()
                            continue
                        return self._take(answer, blob, limit)
                except httpx.HTTPError as exc:
                    if watchdog.fired or limit.remaining() <= 0:
                        raise limit.error() from None
                    raise PeerError(f"cannot fetch blob from {self.name} ({url}): {exc}") from exc

    def _take(self, answer: httpx.Response, blob: IncomingBlob, limit: Deadline) -> bool:
        status, size = answer.status_code, None
        if status == 404:
            return False
        if status not in (200, 206):
            raise _refusal(answer, self.name)
        if status == 206:
            start, whole = _content_range(answer.headers.get("content-range", ""), self.name)
            size = whole
            if start != blob.offset:
                raise PeerError(
                    f"{self.name} sent blob bytes from {start}, not from {blob.offset} as asked"
                )
        else:
            if blob.offset:
                blob.restart()  # the peer ignored the range: the whole blob comes
            declared = answer.headers.get("content-length", "")
            if declared.isdigit() and len(declared) < 20:
                size = int(declared)
        if size is not None:
            blob.expect(size)
        for chunk in answer.iter_bytes():
            blob.write(chunk)
            self.bytes_received += len(chunk)
            limit.check()
        return True


def _refusal(answer: httpx.Response, name: str) -> PeerError:
    body = b""
    for chunk in answer.iter_bytes():
        body += chunk
        if len(body) > MAX_ERROR_BODY:
            break
    try:
        detail = httpx.Response(answer.status_code, content=body).json().get("detail", "")
    except (ValueError, AttributeError):
        detail = body[:200].decode("utf-8", "replace")
    return PeerError(
        f"{name} answered {answer.status_code}: {detail}", answer.status_code, "blob_refused"
    )


def _content_range(value: str, name: str) -> tuple[int, int]:
    """(first byte, whole size) from a Content-Range header."""
    match = _CONTENT_RANGE.fullmatch(value.strip())
    if match is None or int(match[1]) > int(match[2]) or int(match[2]) >= int(match[3]):
        raise PeerError(f"{name} sent a partial answer with Content-Range {value[:80]!r}")
    return int(match[1]), int(match[3])


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """A `Range` header as [start, end) of a blob of `size` bytes; None for the whole blob.

    One range only (`bytes=N-`, `bytes=N-M`, `bytes=-N`): WireError 400 for anything else, 416 when
    it starts past the end."""
    if value is None:
        return None
    match = _RANGE.fullmatch(value.strip())
    if match is None or not (match[1] or match[2]):
        raise WireError(
            f"Range {value[:80]!r} is not one byte range (bytes=N-, bytes=N-M, bytes=-N)"
        )
    beyond = WireError(f"Range {value[:80]!r} starts past the blob's {size} bytes", 416)
    if not match[1]:  # the last N bytes
        if not int(match[2]) or not size:
            raise beyond
        return max(size - int(match[2]), 0), size
    start, end = int(match[1]), size
    if match[2]:
        if int(match[2]) < start:
            raise WireError(f"Range {value[:80]!r} ends before it starts")
        end = min(int(match[2]) + 1, size)
    if start >= size:
        raise beyond
    return start, end


def peer_sources(config: SiteConfig, identity: Identity) -> list[PeerBlobSource]:
    """A source per peer in `config`, in its order, signing as `identity`."""
    limits = config.limits
    verify = config.tls.client_context()
    return [
        PeerBlobSource(
            p.name,
            p.url,
            p.key,
            identity,
            timeout=limits.timeout_s,
            deadline=limits.sync_deadline_s,
            verify=verify,
        )
        for p in config.peers
    ]


def apply_quota(config: SiteConfig, kb: KnowledgeBase) -> None:
    """simnet.toml's `[limits] max_blob_store_bytes` (0: none) as the store's blob quota."""
    if config.limits.max_blob_store_bytes:
        kb.blobs.set_quota(config.limits.max_blob_store_bytes)


def attach_site_peers(home: SiteHome, kb: KnowledgeBase) -> None:
    """Let `kb`, opened from a site's home, fetch the blobs it lacks from the site's peers (signing
    as the site) within the site's blob quota. A home without simnet.toml gets nothing."""
    if not (home.path / CONFIG_FILE).exists():
        return
    config = SiteConfig.load(home.path)
    apply_quota(config, kb)
    identity = kb.identity or Identity.load(config.key_path)
    for source in peer_sources(config, identity):
        kb.blobs.add_source(source)


def fetch_for_device(config: SiteConfig, kb: KnowledgeBase, blob_hash: str) -> int:
    """Fetch a blob a device asked for from this site's peers; its size. BlobError if none has
    it."""
    if kb.identity is None:
        raise BlobError("a site fetches blobs with its own key")
    kb.blobs.fetch(blob_hash, sources=peer_sources(config, kb.identity))
    size = kb.blobs.size(blob_hash)
    if size is None:
        raise BlobError(f"blob {blob_hash[:16]}… was fetched but is not stored")
    return size

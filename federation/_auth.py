"""Request authentication between sites: every request is signed by the caller's Ed25519 key.

    Authorization: Simnet key=<64 hex>, ts=<unix ms>, nonce=<32 hex>, sig=<128 hex>

The signature covers, one per line: ``simnet-request-v1``, the method, the path with its query, the
SHA-256 of the body (hex), the timestamp, the nonce, and the *audience* — the public key of the site the
request is meant for — so a captured request is useless against any other site, or after the time
window, or a second time (the server remembers nonces for the window).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator

import httpx

from knowledge import Identity
from knowledge._identity import verify

from ._errors import AuthError

SCHEME = "Simnet"
DEFAULT_WINDOW_MS = 30_000
_HEADER = re.compile(
    r"Simnet key=(?P<key>[0-9a-f]{64}), ts=(?P<ts>[0-9]{1,16}), nonce=(?P<nonce>[0-9a-f]{32}), sig=(?P<sig>[0-9a-f]{128})"
)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def signed_message(method: str, target: str, body: bytes, ts: int, nonce: str, audience: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(["simnet-request-v1", method.upper(), target, digest, str(ts), nonce, audience.hex()]).encode()


class SimnetAuth(httpx.Auth):
    """httpx authentication that signs each request for one audience (the peer's public key)."""

    requires_request_body = True

    def __init__(self, identity: Identity, audience: bytes) -> None:
        self.identity = identity
        self.audience = audience

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        ts, nonce = _now_ms(), os.urandom(16).hex()
        target = request.url.raw_path.decode("ascii")
        signature = self.identity.sign(signed_message(request.method, target, request.content, ts, nonce, self.audience))
        request.headers["Authorization"] = (
            f"{SCHEME} key={self.identity.public_key_hex}, ts={ts}, nonce={nonce}, sig={signature.hex()}"
        )
        yield request


class RequestVerifier:
    """Checks signed requests addressed to `audience`; remembers nonces for the time window."""

    def __init__(
        self,
        audience: bytes,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        max_nonces: int = 200_000,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.audience = audience
        self.window_ms = window_ms
        self.max_nonces = max_nonces
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()  # (key, nonce) -> expiry, oldest first
        self._lock = threading.Lock()

    def verify(self, method: str, target: str, body: bytes, header: str | None) -> bytes:
        """The caller's public key, or AuthError (401) saying what is wrong."""
        if not header:
            raise AuthError("request is not signed: send an 'Authorization: Simnet key=…, ts=…, nonce=…, sig=…' header")
        match = _HEADER.fullmatch(header.strip())
        if match is None:
            raise AuthError("Authorization header is not of the form 'Simnet key=<hex64>, ts=<ms>, nonce=<hex32>, sig=<hex128>'")
        key, ts, nonce = bytes.fromhex(match["key"]), int(match["ts"]), match["nonce"]
        now = self._clock()
        if abs(now - ts) > self.window_ms:
            raise AuthError(f"request timestamp is {abs(now - ts)} ms from this site's clock (window {self.window_ms} ms)")
        message = signed_message(method, target, body, ts, nonce, self.audience)
        if not verify(key, bytes.fromhex(match["sig"]), message):
            raise AuthError("request signature does not verify (wrong key, altered request, or meant for another site)")
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now:
                self._seen.popitem(last=False)
            if (match["key"], nonce) in self._seen:
                raise AuthError("request replayed: this nonce was already used")
            if len(self._seen) >= self.max_nonces:
                raise AuthError("too many requests in the replay window; retry later", 429)
            self._seen[(match["key"], nonce)] = now + 2 * self.window_ms
        return key

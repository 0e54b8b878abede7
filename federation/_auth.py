"""Request authentication between sites: every request is signed by the caller's Ed25519 key.

    Authorization: Simnet key=<64 hex>, ts=<unix ms>, nonce=<32 hex>, sig=<128 hex>

The signature covers, one per line: ``simnet-request-v1``, the method, the path with its query, the
SHA-256 of the body (hex), the timestamp, the nonce, and the *audience* — the public key of the site
the request is meant for — so a captured request is useless against any other site or after the
window.

**No signed request is accepted twice**, not even across a restart. A request is accepted only if
its timestamp is within `window_ms` of this site's clock and its (key, nonce) has not been accepted
before. Every accepted (key, nonce) is remembered until the site's clock passes acceptance time + 2
windows (by then the timestamp, at most one window ahead of the clock, is stale); the memory is a
dict, and — when the verifier has a `path` (a server's does: <home>/replay.db) — also a SQLite
table, written and fsync'd before the request is handled and read back at startup. So after a
restart, crash or power loss, a captured request is either stale or its nonce is on disk. Cost: one
small synced insert per accepted request (~0.5 ms), rows pruned as they expire. Client clocks may be
off by up to the window either way: the expiry depends on this site's clock only. (A *server* clock
that steps back by more than a window after expired rows were pruned could reopen the window of an
old request; keep it NTP slewed, not stepped.)

A server checks in two steps so that nothing is read before the caller is known: `claim(header)`
(the header's form, the time window, and that the nonce is unused) before the body, then after the
body `check(claim, ...)` (the signature over the body's hash) and `remember(claim)` (the atomic,
durable record of the nonce). `verify` does all three.

**Answers a client acts on are signed too.** A site root re-installed with its old key, or a device,
learns how far its own feed goes from its peers' heads; an unsigned answer would let whoever answers
at a peer's address (plain HTTP, a spoofed or reassigned address) say "none" and make it write its
old seqs again: a fork. So `GET /v1/heads` carries `Simnet-Signature: <128 hex>`, the site's
signature over ``simnet-answer-v1``, the request's method and path, the SHA-256 of its whole
Authorization header (so an answer to another caller reusing the nonce does not pass) and the
SHA-256 of the body (`answer_message`); the client takes heads as the peer's word only if
`answer_signed_by` the key it meant to reach.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from knowledge import Identity, verify_signature

from ._errors import AuthError, FederationError
from ._wire import peer_time

SCHEME = "Simnet"
DEFAULT_WINDOW_MS = 30_000
_HEADER = re.compile(
    r"Simnet key=(?P<key>[0-9a-f]{64}), ts=(?P<ts>[0-9]{1,16}), "
    r"nonce=(?P<nonce>[0-9a-f]{32}), sig=(?P<sig>[0-9a-f]{128})"
)
_SIG = re.compile(r"[0-9a-f]{128}")
ANSWER_HEADER = "Simnet-Signature"  # a site's signature over its answer: see `answer_message`
_PRUNE_EVERY = 1000  # expired rows are deleted from disk after this many have expired in memory


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def signed_message(
    method: str, target: str, body: bytes, ts: int, nonce: str, audience: bytes
) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(
        ["simnet-request-v1", method.upper(), target, digest, str(ts), nonce, audience.hex()]
    ).encode()


def answer_message(method: str, target: str, authorization: str, body: bytes) -> bytes:
    """What a site signs to vouch for an answer: the request it answers (method, path, the SHA-256
    of its whole Authorization header: the caller's key, time, nonce and signature, so an answer
    to another caller's request reusing a nonce does not pass for it) and the SHA-256 of the
    answer's body."""
    request = hashlib.sha256(authorization.encode()).hexdigest()
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(["simnet-answer-v1", method.upper(), target, request, digest]).encode()


def answer_signature(
    identity: Identity, method: str, target: str, authorization: str | None, body: bytes
) -> dict[str, str]:
    """The `ANSWER_HEADER` a site adds to its answer to a signed request (none if unsigned)."""
    if authorization is None or not _HEADER.fullmatch(authorization):
        return {}
    return {ANSWER_HEADER: identity.sign(answer_message(method, target, authorization, body)).hex()}


def answer_signed_by(response: httpx.Response, key: bytes | None) -> bool:
    """Whether `key` signed this answer to the very request it answers (see `answer_message`):
    what an answer says can be taken as that peer's word, not whoever answered at its address."""
    authorization = response.request.headers.get("authorization", "")
    signature = response.headers.get(ANSWER_HEADER, "")
    if key is None or not _HEADER.fullmatch(authorization) or not _SIG.fullmatch(signature):
        return False
    target = response.request.url.raw_path.decode("ascii")
    message = answer_message(response.request.method, target, authorization, response.content)
    return verify_signature(key, bytes.fromhex(signature), message)


class SimnetAuth(httpx.Auth):
    """httpx authentication that signs each request for one audience (the peer's public key).

    A request the peer refuses (401) while its `Simnet-Time` shows the two clocks more than half the
    peer's window apart is signed again, once, with the timestamp read on the peer's clock, and
    later requests keep that correction: a device whose clock is off still reaches its site, and
    learns the site's time there. `now_ms` is this side's clock (a test may skew it)."""

    requires_request_body = True

    def __init__(
        self, identity: Identity, audience: bytes, *, now_ms: Callable[[], int] | None = None
    ) -> None:
        self.identity = identity
        self.audience = audience
        self.now_ms = now_ms or _now_ms
        self.offset_ms = 0  # the peer's clock minus ours, once a refusal has shown it

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        response = yield self._sign(request)
        theirs = peer_time(response.headers) if response.status_code == 401 else None
        if theirs is not None:
            offset = theirs - self.now_ms()
            if abs(offset - self.offset_ms) > DEFAULT_WINDOW_MS // 2:
                self.offset_ms = offset
                yield self._sign(request)

    def _sign(self, request: httpx.Request) -> httpx.Request:
        ts, nonce = self.now_ms() + self.offset_ms, os.urandom(16).hex()
        target = request.url.raw_path.decode("ascii")
        signature = self.identity.sign(
            signed_message(request.method, target, request.content, ts, nonce, self.audience)
        )
        request.headers["Authorization"] = (
            f"{SCHEME} key={self.identity.public_key_hex}, ts={ts}, "
            f"nonce={nonce}, sig={signature.hex()}"
        )
        return request


@dataclass(frozen=True)
class Claim:
    """A well-formed, fresh, unused Authorization header, before its signature is checked."""

    key: bytes
    ts: int
    nonce: str
    sig: bytes

    @property
    def id(self) -> tuple[str, str]:
        return self.key.hex(), self.nonce


class RequestVerifier:
    """Checks signed requests addressed to `audience`; remembers accepted nonces (on disk with
    `path`)."""

    def __init__(
        self,
        audience: bytes,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        max_nonces: int = 200_000,
        clock: Callable[[], int] = _now_ms,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.audience = audience
        self.window_ms = window_ms
        self.max_nonces = max_nonces
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], int] = (
            OrderedDict()
        )  # (key, nonce) -> expiry, oldest first
        self._expired = 0
        self._lock = threading.Lock()
        self._db_lock = threading.Lock()
        self._group = threading.Condition()  # guards the group commit below
        self._open_batch = _Batch()  # the nonces waiting for the next commit
        self._committing = False
        self._db: sqlite3.Connection | None = None
        self._durable = path is not None
        if path is not None:
            self._open(Path(path))

    def _open(self, path: Path) -> None:
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS seen (key TEXT NOT NULL, nonce TEXT NOT NULL,"
                " expires INTEGER NOT NULL, PRIMARY KEY (key, nonce)) WITHOUT ROWID"
            )
            db.execute("DELETE FROM seen WHERE expires < ?", (self._clock(),))
            for key, nonce, expires in db.execute(
                "SELECT key, nonce, expires FROM seen ORDER BY expires"
            ):
                self._seen[(key, nonce)] = expires
        except sqlite3.Error as exc:
            raise FederationError(
                f"cannot open the log of accepted requests {path}: {exc}"
            ) from None
        self._db = db

    def close(self) -> None:
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def verify(self, method: str, target: str, body: bytes, header: str | None) -> bytes:
        """The caller's public key, or AuthError (401, or 429/503/507) saying what is wrong."""
        claim = self.claim(header)
        self.check(claim, method, target, body)
        self.remember(claim)
        return claim.key

    def claim(self, header: str | None) -> Claim:
        """The header's form, its time window, and that its nonce is unused (cheap: no signature
        yet)."""
        if not header:
            raise AuthError(
                "request is not signed: "
                "send an 'Authorization: Simnet key=…, ts=…, nonce=…, sig=…' header"
            )
        match = _HEADER.fullmatch(header.strip())
        if match is None:
            raise AuthError(
                "Authorization header is not of the form "
                "'Simnet key=<hex64>, ts=<ms>, nonce=<hex32>, sig=<hex128>'"
            )
        claim = Claim(
            bytes.fromhex(match["key"]),
            int(match["ts"]),
            match["nonce"],
            bytes.fromhex(match["sig"]),
        )
        now = self._clock()
        if abs(now - claim.ts) > self.window_ms:
            raise AuthError(
                f"request timestamp is {abs(now - claim.ts)} ms from this site's clock "
                f"(window {self.window_ms} ms)"
            )
        with self._lock:
            if claim.id in self._seen:
                raise AuthError("request replayed: this nonce was already used")
        return claim

    def check(self, claim: Claim, method: str, target: str, body: bytes) -> None:
        """The signature over the request as received."""
        message = signed_message(method, target, body, claim.ts, claim.nonce, self.audience)
        if not verify_signature(claim.key, claim.sig, message):
            raise AuthError(
                "request signature does not verify "
                "(wrong key, altered request, or meant for another site)"
            )

    def remember(self, claim: Claim) -> None:
        """Record the nonce as used — atomically (one of two simultaneous copies wins) and
        durably: this returns once the nonce is on disk."""
        now = self._clock()
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now:
                self._seen.popitem(last=False)
                self._expired += 1
            if claim.id in self._seen:
                raise AuthError("request replayed: this nonce was already used")
            if len(self._seen) >= self.max_nonces:
                raise AuthError("too many requests in the replay window; retry later", 429)
            expires = now + 2 * self.window_ms
            self._seen[claim.id] = expires
            prune = self._expired >= _PRUNE_EVERY
            if prune:
                self._expired = 0
        if not self._durable:
            return
        error = self._record((*claim.id, expires), now if prune else None)
        if error is not None:
            with self._lock:
                self._seen.pop(claim.id, None)
            full = (getattr(error, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL
            raise AuthError(
                f"cannot record the request's nonce ({error}); retry later", 507 if full else 503
            ) from None

    def _record(self, row: tuple[str, str, int], prune_before: int | None) -> sqlite3.Error | None:
        """Write `row` to the log, in a group commit: the nonces of requests that arrive while one
        commit is being synced go into the next, one fsync for them all (a busy site's requests
        would otherwise queue for one fsync each). Not under `self._lock`: `claim` on the event
        loop must not wait for a sync. The error that kept the row off the disk, if any."""
        with self._group:
            batch = self._open_batch
            batch.rows.append(row)
            if prune_before is not None:
                batch.prune_before = prune_before
            while not batch.done and self._committing:
                self._group.wait()
            if batch.done:  # a commit led by another request took this row
                return batch.error
            self._committing, self._open_batch = True, _Batch()  # this request leads the commit
        try:
            self._commit(batch)
        except BaseException as exc:  # not a database error (memory, a bug): still not on disk
            batch.error = sqlite3.OperationalError(f"the replay log was not written: {exc!r}")
            raise
        finally:
            with self._group:
                batch.done, self._committing = True, False
                self._group.notify_all()
        return batch.error

    def _commit(self, batch: _Batch) -> None:
        """Every row of the batch in one transaction, or none. (A row can only be on disk already
        if this site's clock stepped back: it is replaced, so that it alone does not fail the
        batch.)"""
        with self._db_lock:
            db = self._db
            try:
                if db is None:
                    raise sqlite3.ProgrammingError(
                        "the replay log is closed (the site is shutting down)"
                    )
                db.execute("BEGIN")
                db.executemany("INSERT OR REPLACE INTO seen VALUES (?, ?, ?)", batch.rows)
                if batch.prune_before is not None:
                    db.execute("DELETE FROM seen WHERE expires < ?", (batch.prune_before,))
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                batch.error = exc
                if db is not None and db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")


@dataclass
class _Batch:
    """The nonces of one group commit of the replay log."""

    rows: list[tuple[str, str, int]] = field(default_factory=list)
    prune_before: int | None = None
    done: bool = False
    error: sqlite3.Error | None = None

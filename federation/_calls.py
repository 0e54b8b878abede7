"""How a round's HTTP calls are made, whichever driver makes them: the round's wall-clock deadline
and the watchdog that enforces it on blocked sockets, answers read up to a cap, waits after a busy
answer (503, 429), and the TLS context a client verifies peers with.

Building an `httpx` client with `verify=True` loads the CA bundle: tens of milliseconds of CPU, as
much as a whole uncontended round on loopback, paid by every round and every blob fetch.
`default_context()` loads it once per process and is shared (an `ssl.SSLContext` is safe to share
between clients and threads); a client for an http:// peer needs no anchors at all.
"""

from __future__ import annotations

import functools
import heapq
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable

import httpx

from ._errors import PeerError

log = logging.getLogger("federation")

WIRE_BYTES = "simnet.wire_bytes"
DEADLINE_FACTOR = 4  # a round's default deadline, in multiples of the per-operation timeout
MAX_RETRIES = 8  # a busy peer (503, 429) is asked again up to this many times per request
RETRY_BASE_S = 0.25  # the first wait when a busy peer says nothing of when to come back
RETRY_CAP_S = 10.0  # no single wait is longer, whatever Retry-After says


@functools.cache
def default_context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's anchors, or SSL_CERT_FILE / SSL_CERT_DIR as
    set when first called), built once per process."""
    return httpx.create_ssl_context()


@functools.cache
def plain_context() -> ssl.SSLContext:
    """A context for clients that never speak TLS (an http:// peer, no redirects followed): building
    it loads nothing."""
    return httpx.create_ssl_context(verify=False)


def client_verify(url: str, verify: ssl.SSLContext | bool) -> ssl.SSLContext:
    """The context a client for `url` gets for `verify`: the caller's, or one built once."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if not url.lower().startswith("https://"):
        return plain_context()
    return default_context() if verify else plain_context()


class Body:
    """An answer's body, read as it arrives (decoded, so a compressed bomb hits the cap too), up to
    a cap."""

    def __init__(self, method: str, url: str, cap: int) -> None:
        self.method, self.url, self.cap, self.data = method, url, cap, bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.cap:
            raise PeerError(
                f"{self.method} {self.url}: the answer exceeds {self.cap} bytes; refused",
                code="too_large",
            )

    def response(self, answer: httpx.Response) -> httpx.Response:
        """The answer with its body in memory; the number of bytes on the wire kept aside."""
        headers = [
            (k, v)
            for k, v in answer.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx.Response(
            answer.status_code,
            headers=headers,
            content=bytes(self.data),
            request=answer.request,
            extensions={WIRE_BYTES: answer.num_bytes_downloaded},
        )


def retry_after(response: httpx.Response, attempt: int, remaining: float) -> float | None:
    """Seconds to wait before asking again, if the peer said it is busy (503, 429) and the round has
    time left and retries; else None (the answer stands). Honours Retry-After (in seconds),
    otherwise backs off exponentially from `RETRY_BASE_S`; either way with jitter, so waiting
    clients spread."""
    if response.status_code not in (429, 503) or attempt >= MAX_RETRIES:
        return None
    try:
        base = float(response.headers.get("retry-after", ""))
    except ValueError:
        base = RETRY_BASE_S * 2**attempt
    wait = min(max(base, 0.0), RETRY_CAP_S) * random.uniform(1.0, 1.5)
    return wait if wait < remaining else None


class Deadline:
    """A round's wall-clock limit (`time.monotonic`)."""

    def __init__(self, url: str, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(
                f"a sync round's deadline must be more than 0 seconds, not {seconds!r}"
            )
        self.url, self.seconds = url, seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def error(self) -> PeerError:
        return PeerError(
            f"the sync round with {self.url} did not finish within its deadline "
            f"of {self.seconds:g} s (the peer answers too slowly); abandoned",
            code="deadline",
        )

    def check(self) -> None:
        if self.remaining() <= 0:
            raise self.error()


class Watchdog:
    """Shuts down every socket a blocking round opened once its deadline passes, so that a read or
    write blocked in the kernel returns (it fails, and the round with it). Sockets are learnt from
    httpcore's `trace` extension as they connect. Every round's watchdog waits on one shared
    thread (`_ALARMS`): a thread started per round costs a busy peer as much as a request."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.sockets: list[socket.socket] = []
        self.fired = False
        self._lock = threading.Lock()
        self._alarm: list | None = None

    def trace(self, event: str, info: dict) -> None:
        if event == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                with self._lock:
                    self.sockets.append(sock)
                    if self.fired:
                        shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self.sockets:
                shut(sock)

    def __enter__(self) -> Watchdog:
        self._alarm = _ALARMS.add(self.deadline.at, self._fire)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._alarm is not None:
            _ALARMS.cancel(self._alarm)


class _Alarms:
    """Callbacks due at `time.monotonic()` instants, run on one daemon thread (started when first
    needed, and again in a forked child). A cancelled alarm is dropped when it comes due."""

    def __init__(self) -> None:
        self._due: list[list] = []  # heap of [at, order, callback or None once cancelled]
        self._order = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, at: float, callback: Callable[[], None]) -> list:
        with self._changed:
            self._order += 1
            alarm = [at, self._order, callback]
            heapq.heappush(self._due, alarm)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="deadlines", daemon=True)
                self._thread.start()
            elif self._due[0] is alarm:
                self._changed.notify()  # due before whatever the thread waits for
        return alarm

    def cancel(self, alarm: list) -> None:
        with self._changed:
            alarm[2] = None

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._due and self._due[0][2] is None:
                    heapq.heappop(self._due)
                if not self._due:
                    self._changed.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                callback = heapq.heappop(self._due)[2]
            try:
                callback()
            except Exception:  # one round's alarm failing must not stop the others'
                log.exception("a sync round's deadline alarm failed")


_ALARMS = _Alarms()


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already


def deadline_s(deadline: float | None, timeout: float) -> float:
    return DEADLINE_FACTOR * timeout if deadline is None else deadline

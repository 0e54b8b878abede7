"""The connection layer under the app: a deadline for request headers, a cap on connections, quiet
logs.

uvicorn (0.54, h11) arms no timer while it waits for a request's headers: its keep-alive timer runs
only between a response and the next byte. A connection that sends half a request line and stops
lives for ever, and a few hundred of them exhaust the process's file descriptors — whereupon
asyncio's accept loop logs a traceback per attempt, thousands a second. (`limit_concurrency` does
not help: it answers 503 to new *requests* while too many connections are open, so idle connections
lock honest callers out.)

`guarded_protocol(header_timeout, max_connections)` is uvicorn's H11Protocol with three additions:

- **Header deadline.** While no request is being handled — a new connection, or a kept-alive one
  from its first byte after a response — the request line and headers must arrive within
  `header_timeout` seconds of that moment (not of the last byte: trickling does not extend it), or
  the connection is closed. The bytes of a body the app refused without reading count as waiting
  too. Once the headers are in, the app bounds the body (`[limits] timeout_s`).
- **Connection cap.** At most `max_connections` connections; one more closes the connection that has
  been idle (waiting for headers, or kept alive) longest, or, if every connection is busy, itself.
- **Send deadline.** An answer is written as the client takes it in: when the socket's buffer is
  full, uvicorn holds the app's next send (so an app that streams, like the blob endpoint, holds one
  part per connection). If the client then takes in nothing for `send_timeout` seconds (by default
  the header deadline) — the buffer does not drain to its low-water mark — the connection is
  dropped, buffer and all, and the app's answer sees a disconnect. A stalled reader holds neither
  memory nor a connection slot for long; an honest slow one needs only to read ~48 KiB per
  `send_timeout`.

`connection_cap(limit)` lowers the cap to what the process's open-file limit leaves room for, and
`RateLimited` is a logging filter: the first record of a kind goes through, then at most one per
interval, saying how many were held back and without their tracebacks.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("federation.http")
ACCEPT_BATCH = (
    64  # the listen backlog, and how many sockets asyncio accepts per turn of the event loop
)
IN_FLIGHT = (
    4 * ACCEPT_BATCH
)  # accepted sockets not yet seen by connection_made, or closed but not yet freed
RESERVED_FILES = 64  # for the stores, logs, blobs and outgoing connections of the gossip scheduler


def connection_cap(limit: int) -> int:
    """`limit`, lowered so that the connections, those in flight and a reserve fit the open-file
    limit (raised first to the hard limit, as far as 65536)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return limit
    cap = max(1, min(limit, soft - IN_FLIGHT - RESERVED_FILES))
    if cap < limit:
        log.warning(
            "this process may open %d files: at most %d connections (raise `ulimit -n` for more)",
            soft,
            cap,
        )
    return cap


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with a header deadline and a connection cap (see the module docstring)."""

    header_timeout: float = 10.0
    max_connections: int = 512
    send_timeout: float = 10.0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.idle_since = time.monotonic()
        self.deadline: Any = None
        self.stall: Any = None  # the send deadline's timer, while the transport's buffer is full
        if len(self.connections) > self.max_connections:
            idle = [
                c
                for c in self.connections
                if c is not self
                and isinstance(c, GuardedH11Protocol)
                and c.idle
                and not c.transport.is_closing()
            ]
            victim = min(idle, key=lambda c: c.idle_since, default=self)
            log.warning(
                "%d connections open (the limit): closed the longest idle one", self.max_connections
            )
            victim.transport.close()
        self._watch()

    @property
    def idle(self) -> bool:
        """No request of this connection is in the app (waiting for headers, or kept alive)."""
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()
        # idle again, kept alive by uvicorn's timer until the next byte: no deadline yet
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self._unstall()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The transport's buffer is full (the client is not reading fast enough): arm the send
        deadline."""
        super().pause_writing()
        if self.stall is None and not self.transport.is_closing():
            self.stall = self.loop.call_later(self.send_timeout, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unstall()

    def _unstall(self) -> None:
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None

    def _stalled(self) -> None:
        self.stall = None
        log.info(
            "dropped a connection whose client took in none of its answer for %.1f s",
            self.send_timeout,
        )
        # not close(): that would wait for the full buffer to drain, i.e. for ever
        self.transport.abort()

    def _watch(self) -> None:
        """Arm the header deadline while waiting for headers; disarm it while the app has the
        request."""
        if self.transport.is_closing() or not self.idle:
            self._stop()
        elif self.deadline is None and self.timeout_keep_alive_task is None:
            self.deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _stop(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        self.deadline = None
        if not self.transport.is_closing():
            log.info(
                "closed a connection whose request headers did not arrive within %.1f s",
                self.header_timeout,
            )
            self.transport.close()


def guarded_protocol(
    header_timeout: float, max_connections: int, send_timeout: float | None = None
) -> type[GuardedH11Protocol]:
    """A GuardedH11Protocol class with these limits (uvicorn's `Config(http=...)` takes a class);
    the send deadline is the header deadline unless given."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout": header_timeout,
            "max_connections": max_connections,
            "send_timeout": header_timeout if send_timeout is None else send_timeout,
        },
    )


class RateLimited(logging.Filter):
    """Per kind of record (logger, level, message template, and its first argument if a string, such
    as a peer's name): the first passes, then one per `interval` seconds, which says how many were
    held back; repeats lose their traceback (kept: the exception's one-line summary)."""

    MAX_KINDS = 1000

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._kinds: dict[
            tuple[str, int, str, str], list[float | int]
        ] = {}  # kind -> [last passed, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        first = record.args[0] if isinstance(record.args, tuple) and record.args else None
        subject = first if isinstance(first, str) else ""
        kind = (record.name, record.levelno, str(record.msg).split("\n", 1)[0][:200], subject[:100])
        now = time.monotonic()
        seen = self._kinds.get(kind)
        if seen is None:
            if len(self._kinds) >= self.MAX_KINDS:
                self._kinds.clear()
            self._kinds[kind] = [now, 0]
            return True
        if now - seen[0] < self.interval:
            seen[1] += 1
            return False
        held, seen[0], seen[1] = seen[1], now, 0
        message = record.getMessage().split("\n", 1)[0]
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message += f" ({type(exc).__name__}: {exc})"
        if held:
            message += f" [and {held} more like it in the last {self.interval:.0f} s]"
        record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = (
            message,
            (),
            None,
            None,
            None,
        )
        return True


LIMITED_LOGGERS = ("asyncio", "uvicorn.error", "federation", "federation.gossip", "federation.http")


def limit_logs(interval: float = 10.0) -> None:
    """Rate-limit the records of the loggers a server's input can make noisy (once per process)."""
    for name in LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimited) for f in logger.filters):
            logger.addFilter(RateLimited(interval))

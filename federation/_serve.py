"""Run a site: open its knowledge base, start the gossip scheduler, serve HTTP with uvicorn.

`serve(home)` binds the listen address from simnet.toml (port 0 picks a free port), records the URL
and process id in <home>/serve.json so the CLI can find the running server, and removes it on exit.
Connections get a header deadline and a cap (`_http`), and noisy loggers are rate-limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

import knowledge
from knowledge import SiteHome

from ._blobs import apply_quota, attach_site_peers
from ._config import SiteConfig
from ._errors import ConfigError
from ._gossip import Gossip
from ._http import ACCEPT_BATCH, connection_cap, guarded_protocol, limit_logs
from ._server import create_app
from ._site import Site
from ._status import SERVE_FILE

log = logging.getLogger("federation")
SERVICE_STOP_S = 60.0  # how long shutdown waits for a service (the validator ends its wave)


# Tests only: milliseconds added to this process's knowledge clock (its HLC and the Simnet-Time it
# answers with; request signatures keep the system clock), to run a site whose clock is off.
TEST_CLOCK_OFFSET = "SIMNET_TEST_CLOCK_OFFSET_MS"


def open_site(home: Path) -> Site:
    config = SiteConfig.load(home)
    identity = knowledge.Identity.load(config.key_path)
    kb = knowledge.open(
        config.store_path, identity, policy=config.policy_path, clock=_test_clock(config)
    )
    apply_quota(config, kb)
    return Site(config, kb)


def serve(
    home: str | os.PathLike[str],
    *,
    gossip: bool = True,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    services: Iterable[Service] = (),
) -> None:
    """Serve the site in `home` until interrupted (SIGINT/SIGTERM shut it down cleanly).

    HTTPS when simnet.toml's [tls] names a certificate and key, or `tls_cert` and `tls_key` do.
    Each of `services` (`SiteHome.service`) runs in a thread on the site's knowledge base, which
    then fetches the blobs it lacks from the site's peers; shutdown stops it before the store
    closes.
    """
    home = Path(home)
    site = open_site(home)
    if (tls_cert is None) != (tls_key is None):
        site.close()
        raise ConfigError("HTTPS needs both a certificate and its key")
    if tls_cert is not None:
        tls = replace(site.config.tls, cert=Path(tls_cert), key=Path(tls_key))  # type: ignore[arg-type]
        site.config = replace(site.config, tls=tls)
    tls = site.config.tls
    host, port = site.config.host_port
    try:
        sock = _listen(host, port)
    except BaseException:
        site.close()
        raise
    url = f"{'https' if tls.serving else 'http'}://{host}:{sock.getsockname()[1]}"

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if gossip:
            site.gossip = Gossip(site)
            site.gossip.start()
        releasing = asyncio.create_task(site.release_held())
        running = _start_services(home, site, services)
        served = {"url": url, "pid": os.getpid(), "cert": str(tls.cert) if tls.cert else None}
        (home / SERVE_FILE).write_text(json.dumps(served))
        log.info("site %s (%s) serving on %s", site.config.name, knowledge.key_id(site.key), url)
        try:
            yield
        finally:
            (home / SERVE_FILE).unlink(missing_ok=True)
            await asyncio.to_thread(_stop_services, running)
            releasing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await releasing
            if site.gossip is not None:
                await site.gossip.stop()
            site.close()  # uvicorn re-raises SIGTERM after shutdown: close the store while we can

    app = create_app(site, lifespan=lifespan)
    limits = site.config.limits
    protocol = guarded_protocol(limits.header_timeout_s, connection_cap(limits.max_connections))
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=5,
        access_log=False,
        http=protocol,
        backlog=ACCEPT_BATCH,
        ssl_certfile=tls.cert,
        ssl_keyfile=tls.key,
    )
    limit_logs()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        site.close()  # idempotent; covers a failed start
        sock.close()


Service = Callable[[SiteHome, knowledge.KnowledgeBase, threading.Event], None]


def _start_services(
    home: Path, site: Site, services: Iterable[Service]
) -> list[tuple[threading.Thread, threading.Event]]:
    running: list[tuple[threading.Thread, threading.Event]] = []
    for service in services:
        if not running:
            attach_site_peers(SiteHome(home), site.kb)
        stop = threading.Event()
        thread = threading.Thread(
            target=_run_service,
            args=(service, SiteHome(home), site.kb, stop),
            name=getattr(service, "__name__", "service"),
            daemon=True,
        )
        thread.start()
        running.append((thread, stop))
    return running


def _run_service(
    service: Service, home: SiteHome, kb: knowledge.KnowledgeBase, stop: threading.Event
) -> None:
    try:
        service(home, kb, stop)
    except Exception:  # a failing service is logged; the site goes on serving and gossiping
        log.exception("service %s stopped with an error", getattr(service, "__name__", service))


def _stop_services(running: list[tuple[threading.Thread, threading.Event]]) -> None:
    for _, stop in running:
        stop.set()
    for thread, _ in running:
        thread.join(timeout=SERVICE_STOP_S)
        if thread.is_alive():
            log.warning("service %s did not stop in %g s", thread.name, SERVICE_STOP_S)


def _test_clock(config: SiteConfig) -> knowledge.HybridClock | None:
    """The knowledge clock skewed by `TEST_CLOCK_OFFSET`, if the environment sets it (tests)."""
    offset = os.environ.get(TEST_CLOCK_OFFSET)
    if not offset:
        return None
    policy = knowledge.TrustPolicy.load(config.policy_path)
    return knowledge.HybridClock(
        policy.max_clock_offset_ms,
        lambda: time.time_ns() // 1_000_000 + int(offset),
        hold_horizon_ms=policy.hold_horizon_ms,
    )


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket. Created with IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on
    connections accepted from such a socket, and without it every kept-alive request waits ~40 ms
    for a delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(ACCEPT_BATCH)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} "
            "(is another server using it? change [site] listen in simnet.toml)"
        ) from None
    return sock

"""Fixtures for the federation unit tests: real sites (real keys, real SQLite, the real ASGI app).

- `make_site(name, ...)` builds a site home (key, trust.toml, simnet.toml, store) and returns a
  `LocalSite`: its config, knowledge base, `federation.Site` and ASGI app, plus an in-process
  signing client (`site.client(identity)`, httpx over ASGITransport).
- `make_device(site)` is a robot's knowledge base delegated by a site.
- `serve_app(app)` serves an ASGI app with uvicorn on a loopback port in a thread (real HTTP).
- `serve_process(home)` runs the real `simnet serve` for a home as a separate process.
- `cli(home, *args)` runs the real `simnet` entry point (`knowledge.cli.run`) in-process.
- `Fault` wraps an httpx transport to rewrite responses (the one fake: to inject faults).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from starlette.applications import Starlette

import knowledge
from federation import GossipConfig, ServerLimits, SimnetAuth, Site, SiteConfig, create_app
from federation._config import PrivateMaps
from knowledge import Identity, Role, TrustPolicy

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class LocalSite:
    name: str
    home: Path
    identity: Identity
    config: SiteConfig
    kb: knowledge.KnowledgeBase
    site: Site
    app: Starlette

    @property
    def key(self) -> bytes:
        return self.identity.public_key

    def trust(self, *keys: bytes, roles=tuple(Role)) -> None:
        """Trust these site roots for `roles`: in trust.toml and in the open knowledge base."""
        policy = TrustPolicy.load(self.config.policy_path)
        for key in keys:
            policy = policy.with_root(key, roles)
        self.config.policy_path.write_text(policy.to_toml())
        self.kb.set_policy(policy)

    def client(
        self, identity: Identity | None = None, transport: httpx.AsyncBaseTransport | None = None
    ) -> httpx.AsyncClient:
        """An in-process client for this site's app, signing as `identity` (default: the site's
        key)."""
        return httpx.AsyncClient(
            transport=transport or httpx.ASGITransport(app=self.app),
            base_url="http://site",
            auth=SimnetAuth(identity or self.identity, self.key),
        )


@pytest.fixture
def make_site(tmp_path):
    opened: list[knowledge.KnowledgeBase] = []
    sites: list[Site] = []

    def _make(
        name: str,
        *,
        limits: ServerLimits | None = None,
        gossip: GossipConfig | None = None,
        private: tuple[PrivateMaps, ...] = (),
        trust: tuple[bytes, ...] = (),
    ) -> LocalSite:
        home = tmp_path / name
        home.mkdir()
        identity = Identity.generate()
        config = SiteConfig(
            home,
            name=name,
            listen="127.0.0.1:0",
            limits=limits or ServerLimits(),
            gossip=gossip or GossipConfig(),
            private=list(private),
        )
        identity.save(config.key_path)
        policy = TrustPolicy()
        for key in trust:
            policy = policy.with_root(key)
        config.policy_path.write_text(policy.to_toml())
        config.save()
        kb = knowledge.open(config.store_path, identity, policy=config.policy_path)
        opened.append(kb)
        site = Site(config, kb)
        sites.append(site)
        return LocalSite(name, home, identity, config, kb, site, create_app(site))

    yield _make
    for site in sites:
        site.verifier.close()
    for kb in opened:
        kb.close()


@pytest.fixture
def make_device():
    """make_device(site, roles=("publish",)) -> a robot's in-memory knowledge base delegated by
    `site`."""
    opened: list[knowledge.KnowledgeBase] = []

    def _make(site: LocalSite, roles=(Role.PUBLISH,)) -> knowledge.KnowledgeBase:
        device = Identity.generate()
        site.kb.delegate(device.public_key, roles)
        kb = knowledge.open(":memory:", device, policy=TrustPolicy().for_device_of(site.key))
        kb.ingest(site.kb.envelopes_since(kb.heads(), limit=100_000))
        kb.learn_site_heads(site.kb.heads())  # a device writes once it has seen its site's heads
        opened.append(kb)
        return kb

    yield _make
    for kb in opened:
        kb.close()


_RESERVED: list[socket.socket] = []


def free_port() -> int:
    """A loopback port for a server to listen on later: bound here, never listening, for the rest of
    this process. Nothing else takes it meanwhile (not a test on another xdist worker, not a
    client's ephemeral port), while a server binding it with SO_REUSEADDR (`simnet serve`,
    asyncio's start_server) can, and can again after a restart."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _RESERVED.append(sock)
    return sock.getsockname()[1]


@pytest.fixture
def serve_app():
    """serve_app(app, port=0) -> URL: uvicorn serving `app` on loopback in a thread until
    teardown."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def _serve(app, port: int = 0) -> str:
        sock = socket.create_server(("127.0.0.1", port))
        server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread))
        _wait(lambda: server.started, 10, "uvicorn to start")
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield _serve
    for server, _ in running:
        server.should_exit = True
    for _, thread in running:
        thread.join(10)


@dataclass
class ServeProcess:
    home: Path
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return json.loads((self.home / "serve.json").read_text())["url"]


class _Servers:
    """Starts `simnet serve` processes and stops them all at close()."""

    def __init__(self) -> None:
        self.started: list[ServeProcess] = []

    def __call__(self, home: Path) -> ServeProcess:
        log = home / f"serve-{len(self.started)}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [*SIMNET, "--home", str(home), "serve"], stdout=out, stderr=subprocess.STDOUT
            )
        served = ServeProcess(home, process, log)
        self.started.append(served)

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(
                    f"simnet serve exited with {process.returncode}:\n{log.read_text()}"
                )
            try:
                # a liveness probe only (an HTTPS site's certificate is the tests' business)
                probe = httpx.get(f"{served.url}/v1/health", timeout=1, verify=False)
                return probe.status_code == 200
            except (OSError, ValueError, KeyError, httpx.HTTPError):
                return False

        _wait(up, 60, "simnet serve to answer /v1/health")
        return served

    def close(self) -> None:
        for served in self.started:
            if served.process.poll() is None:
                served.process.send_signal(signal.SIGTERM)
        for served in self.started:
            served.process.wait(30)


@pytest.fixture
def serve_process():
    """serve_process(home) -> ServeProcess: the real `simnet serve` for `home`, stopped at
    teardown."""
    servers = _Servers()
    yield servers
    servers.close()


@pytest.fixture(scope="module")
def module_serve_process():
    """serve_process for module-scoped fixtures (one server shared by a module's tests)."""
    servers = _Servers()
    yield servers
    servers.close()


@dataclass
class CliResult:
    code: int
    out: str
    err: str
    traceback: str | None = None

    @property
    def json(self):
        return json.loads(self.out)


@pytest.fixture(scope="session")
def cli():
    """cli(home, *args) -> CliResult of the real `simnet` entry point (knowledge.cli.run),
    in-process.

    An exception escaping `run()` is what a user would see as a traceback: it is recorded in
    `result.traceback` (never raised), so tests can assert there is none.
    """
    from knowledge.cli import run

    def _run(home: Path, *args: str) -> CliResult:
        runner = CliRunner()
        argv = sys.argv
        with runner.isolation() as (out, err, _):
            sys.argv = ["simnet", "--home", str(home), *args]
            tb = None
            try:
                run()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - a traceback the user would see
                tb, code = traceback.format_exc(), 1
            finally:
                sys.argv = argv
                sys.stdout.flush()
                sys.stderr.flush()
            return CliResult(code, out.getvalue().decode(), err.getvalue().decode(), tb)

    return _run


@dataclass
class Fault:
    """An httpx transport (sync or async) that passes requests through and rewrites some responses.

    `rewrite(request, status, headers, body) -> (status, headers, body)` or None to keep the
    response. `requests` records (method, path) of everything sent.
    """

    inner: httpx.BaseTransport | httpx.AsyncBaseTransport
    rewrite: Callable[[httpx.Request, int, dict, bytes], tuple[int, dict, bytes] | None] = (
        lambda *a: None
    )
    requests: list[tuple[str, str]] = field(default_factory=list)

    def _apply(
        self, request: httpx.Request, response: httpx.Response, body: bytes
    ) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-encoding")
        }
        changed = self.rewrite(request, response.status_code, headers, body)
        status, headers, body = (
            changed if changed is not None else (response.status_code, headers, body)
        )
        return httpx.Response(status, headers=headers, content=body, request=request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        body = response.read()
        return self._apply(request, response, body)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        return self._apply(request, response, body)

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _SyncFault(Fault, httpx.BaseTransport):
    pass


class _AsyncFault(Fault, httpx.AsyncBaseTransport):
    pass


@pytest.fixture
def fault():
    """fault(inner, rewrite=None) -> a fault-injecting transport wrapping `inner` (sync or
    async)."""

    def _make(inner, rewrite=None):
        cls = _AsyncFault if isinstance(inner, httpx.AsyncBaseTransport) else _SyncFault
        return cls(inner, rewrite) if rewrite is not None else cls(inner)

    return _make

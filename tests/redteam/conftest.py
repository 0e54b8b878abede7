"""Live sites for the red-team tests: real `simnet serve` processes on loopback ports, attacked from
outside.

- `live(name, limits=..., interval_s=..., nofile=...)` makes a site home (`simnet init`) and returns
  a `Live` site, not yet started: `.start(*flags)` (e.g. "--validate"), `.stop(signal)`, `.url`,
  `.pid`, `.heads()` (asked as the site's own key), `.client(identity)`, `.log_text()` and
  `.assert_no_traceback()`. All are stopped at teardown. `module_live` is the same for
  module-scoped fixtures.
- `signed(identity, audience, method, target, body)` builds an Authorization header by hand, and
  `assert_refused(response, status, code, *phrases)` checks a JSON refusal.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from federation import GossipConfig, ServerLimits, SimnetAuth, SiteConfig
from federation._auth import signed_message
from knowledge import Identity

from ..conftest import simnet_here

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]


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


def wait_until(predicate, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def signed(
    identity: Identity,
    audience: bytes,
    method: str,
    target: str,
    body: bytes = b"",
    *,
    ts: int | None = None,
    nonce: str | None = None,
) -> str:
    ts = time.time_ns() // 1_000_000 if ts is None else ts
    nonce = nonce or os.urandom(16).hex()
    sig = identity.sign(signed_message(method, target, body, ts, nonce, audience))
    return f"Simnet key={identity.public_key_hex}, ts={ts}, nonce={nonce}, sig={sig.hex()}"


def assert_refused(response: httpx.Response, status: int, code: str, *phrases: str) -> str:
    """The response is `status` with {"error": code, "detail": ...} naming every phrase; returns the
    detail."""
    assert response.status_code == status, (response.status_code, response.text[:300])
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] == code, body
    for phrase in phrases:
        assert phrase in body["detail"], (phrase, body["detail"])
    return body["detail"]


class Live:
    """One site home and, while running, its `simnet serve` process (its output kept in
    serve-N.log)."""

    def __init__(self, home: Path, nofile: int | None) -> None:
        self.home = home
        self.nofile = nofile
        self.key = Identity.load(home / "site.key")
        self.process: subprocess.Popen | None = None
        self.logs: list[Path] = []

    @property
    def config(self) -> SiteConfig:
        return SiteConfig.load(self.home)

    @property
    def url(self) -> str:
        return json.loads((self.home / "serve.json").read_text())["url"]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def start(self, *flags: str) -> Live:
        """`simnet serve` for this home, with `flags` (e.g. "--validate")."""
        (self.home / "serve.json").unlink(missing_ok=True)
        log = self.home / f"serve-{len(self.logs)}.log"
        self.logs.append(log)
        limit = self.nofile

        def limit_files() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [*SIMNET, "--home", str(self.home), "-v", "serve", *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=limit_files,
            )
        wait_until(self.healthy, 60, f"{self.home.name} to answer /v1/health")
        return self

    def healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"{self.home.name} exited with {self.process.returncode}:\n{self.log_text()}"
            )
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)
        self.process = None

    def client(self, identity: Identity | None = None, timeout: float = 10) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            auth=SimnetAuth(identity or self.key, self.key.public_key),
            timeout=timeout,
        )

    def heads(self) -> dict:
        with self.client() as client:
            return client.get("/v1/heads").raise_for_status().json()

    def status(self) -> dict:
        with self.client() as client:
            return client.get("/v1/status").raise_for_status().json()

    def log_text(self) -> str:
        return "".join(log.read_text(errors="replace") for log in self.logs if log.exists())

    def assert_no_traceback(self) -> None:
        text = self.log_text()
        assert "Traceback" not in text, text[-4000:]


class Sites:
    """Makes site homes under `root` (`simnet init`, then the given limits and gossip); stops them
    at close()."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[Live] = []

    def __call__(
        self,
        name: str,
        *,
        limits: ServerLimits | None = None,
        interval_s: float = 3600.0,
        max_backoff_s: float = 2.0,
        nofile: int | None = None,
    ) -> Live:
        home = self.root / name
        listen = f"127.0.0.1:{free_port()}"
        simnet_here(home, "init", "--name", name, "--listen", listen)
        config = SiteConfig.load(home)
        config.gossip = GossipConfig(interval_s=interval_s, jitter=0.2, max_backoff_s=max_backoff_s)
        config.limits = limits or ServerLimits()
        config.save()
        site = Live(home, nofile)
        self.made.append(site)
        return site

    def close(self) -> None:
        for site in self.made:
            site.stop()


@pytest.fixture
def live(tmp_path):
    """live(name, limits=None, interval_s=3600, max_backoff_s=2, nofile=None) -> a Live site, not
    started."""
    sites = Sites(tmp_path)
    yield sites
    sites.close()


@pytest.fixture(scope="module")
def module_live(tmp_path_factory):
    """`live` for module-scoped fixtures."""
    sites = Sites(tmp_path_factory.mktemp("live"))
    yield sites
    sites.close()

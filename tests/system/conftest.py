"""Real sites for system tests: `simnet init` + `simnet serve` as separate processes on loopback
ports."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import knowledge
from federation import GossipConfig, SimnetAuth, SiteConfig
from knowledge import Identity

from ..conftest import simnet_here

SIMNET = [sys.executable, "-c", "from knowledge.cli import run; run()"]


def simnet(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*SIMNET, "--home", str(home), *args], capture_output=True, text=True, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"simnet {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
        )
    return result


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


def wait_until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@dataclass
class SiteProcess:
    """One site: its home directory, key, port, and (when running) its `simnet serve` process."""

    name: str
    home: Path
    port: int
    key: Identity
    process: subprocess.Popen | None = None
    log: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *flags: str) -> None:
        """`simnet serve` for this site, with `flags` (e.g. "--validate")."""
        log = self.home / f"serve-{len(self.log)}.log"
        self.log.append(log)
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [*SIMNET, "--home", str(self.home), "-v", "serve", *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        # 60 s, as the red-team sites wait: the suite runs two workers per core, and a restarted
        # validator starting beside the documents, mypy and a pip install took more than 30 s
        wait_until(self.healthy, 60, f"{self.name} to answer /v1/health")

    def healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}:\n{self.log[-1].read_text()}"
            )
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)
        self.process = None

    def client(self, identity: Identity | None = None) -> httpx.Client:
        """An httpx client signing as `identity` (default: the site's own key) for this site."""
        return httpx.Client(
            base_url=self.url,
            auth=SimnetAuth(identity or self.key, self.key.public_key),
            timeout=30,
        )

    def status(self) -> dict:
        with self.client() as c:
            return c.get("/v1/status").raise_for_status().json()

    def heads(self, identity: Identity | None = None) -> dict:
        with self.client(identity) as c:
            return c.get("/v1/heads").raise_for_status().json()["heads"]


class Fleet:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sites: dict[str, SiteProcess] = {}

    def add(self, name: str, *, interval_s: float = 0.3) -> SiteProcess:
        home, port = self.root / name, free_port()
        simnet_here(home, "init", "--name", name, "--listen", f"127.0.0.1:{port}")
        config = SiteConfig.load(home)
        config.gossip = GossipConfig(interval_s=interval_s, jitter=0.2, max_backoff_s=2.0)
        config.save()
        site = SiteProcess(name, home, port, Identity.load(home / "site.key"))
        self.sites[name] = site
        return site

    def connect(
        self, a: SiteProcess, b: SiteProcess, roles: str = "publish,validate,revoke"
    ) -> None:
        """a syncs with b and trusts b's root for `roles` (call both ways for a symmetric link)."""
        simnet_here(
            a.home, "peer", "add", b.name, b.url, "--key", b.key.public_key_hex, "--trust", roles
        )

    def trust(self, a: SiteProcess, b: SiteProcess, roles=tuple(knowledge.Role)) -> None:
        """a trusts b's root for `roles` (without syncing with b directly); before a starts."""
        policy = knowledge.TrustPolicy.load(a.home / "trust.toml").with_root(
            b.key.public_key, roles, name=b.name
        )
        (a.home / "trust.toml").write_text(policy.to_toml())

    def mesh(self, roles: str = "publish,validate,revoke") -> None:
        for a in self.sites.values():
            for b in self.sites.values():
                if a is not b:
                    self.connect(a, b, roles)

    def stop(self) -> None:
        for site in self.sites.values():
            site.stop()


@pytest.fixture
def fleet(tmp_path):
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.stop()


def device_kb(
    site: SiteProcess, roles: str = "publish", path: Path | str = ":memory:"
) -> knowledge.KnowledgeBase:
    """A robot's knowledge base: a new key delegated by `site` (through `simnet device add`)."""
    device = Identity.generate()
    simnet_here(site.home, "device", "add", device.public_key_hex, "--roles", roles)
    policy = knowledge.TrustPolicy().with_root(site.key.public_key, name=site.name)
    return knowledge.open(path, device, policy=policy)


def served_url(home: Path) -> str:
    return json.loads((home / "serve.json").read_text())["url"]


@pytest.fixture
def make_device():
    """make_device(site, roles="publish") -> a robot's in-memory KnowledgeBase delegated by
    `site`."""
    opened = []

    def _make(
        site: SiteProcess, roles: str = "publish", path: Path | str = ":memory:"
    ) -> knowledge.KnowledgeBase:
        kb = device_kb(site, roles, path)
        opened.append(kb)
        return kb

    yield _make
    for kb in opened:
        kb.close()


@pytest.fixture
def run_simnet():
    """run_simnet(home, *args, check=True) -> CompletedProcess of the real `simnet` command."""
    return simnet


@pytest.fixture
def wait():
    """wait(predicate, timeout=60, what=...) polls until the predicate holds."""
    return wait_until


# --- request-level fixtures (tests/system/test_requests.py, test_fuzz_sync.py) --------------------

import federation  # noqa: E402 - appended section
from federation import ServerLimits, encode_page  # noqa: E402


@pytest.fixture(scope="module")
def module_fleet(tmp_path_factory):
    """A Fleet shared by one module's tests (sites started once, many requests against them)."""
    fleet = Fleet(tmp_path_factory.mktemp("fleet"))
    yield fleet
    fleet.stop()


@dataclass
class PreparedSite:
    """A running site with small limits, a trusted peer root, a robot whose feed it holds, and a
    blob.

    `held_page(n)`: a page of envelopes the site already holds (pushing it changes nothing);
    `fresh(n)`: a page of valid envelopes the site does not hold yet (accepting it would change
    state).
    """

    site: SiteProcess
    # a site root the site trusts for every role (not the site itself: no admin rights)
    peer: Identity
    device: knowledge.KnowledgeBase  # a robot delegated by the site
    blob: str
    blob_data: bytes
    limits: ServerLimits

    def snapshot(self) -> tuple[dict, dict]:
        return self.site.heads(), self.site.status()

    def held(self, n: int = 5) -> list[bytes]:
        """Up to n envelopes (the site's delegation first, then the robot's) that the site holds."""
        from knowledge._envelope import decode

        heads = self.site.heads()
        out = []
        for raw in self.device.envelopes_since({}, limit=10_000):
            envelope = decode(raw, max_bytes=1 << 26)
            if envelope.seq <= heads.get(envelope.author.hex(), 0):
                out.append(raw)
        return out[:n]

    def held_page(self, n: int = 5) -> bytes:
        return encode_page(self.held(n))

    def fresh(self, n: int = 1) -> bytes:
        page = self.device.envelopes_since(self.site.heads(), limit=n)
        assert len(page) == n, "the prepared robot ran out of unsent envelopes"
        return encode_page(page)


@pytest.fixture(scope="module")
def prepared_site(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("prepared"))
    site = fleet.add("a", interval_s=3600)  # gossip idle: only the tests' requests change anything
    config = SiteConfig.load(site.home)
    limits = ServerLimits(max_body_bytes=2 << 20, max_page=20, timeout_s=10.0)
    config.limits = limits
    config.save()
    peer = Identity.generate()
    fleet_policy = knowledge.TrustPolicy.load(site.home / "trust.toml").with_root(
        peer.public_key, name="peer"
    )
    (site.home / "trust.toml").write_text(fleet_policy.to_toml())
    blob_data = bytes(range(256)) * 1200
    robot = Identity.generate()
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        blob = kb.blobs.put(blob_data)  # before the server holds the store
        kb.delegate(robot.public_key, [knowledge.Role.PUBLISH])  # what `simnet device add` does
    site.start()
    device = knowledge.open(
        ":memory:", robot, policy=knowledge.TrustPolicy().for_device_of(site.key.public_key)
    )
    federation.sync_with(device, site.url, site.key.public_key)  # the robot learns its delegation
    for i in range(5):
        device.skills.publish(f"held-{i}", "pick")
    device.maps["lobby"].observe((1, 1), "door", 0.5)
    federation.sync_with(device, site.url, site.key.public_key)
    for i in range(60):  # written but never sent: what a refused request must not deliver
        device.skills.publish(f"unsent-{i}", "pick")
    yield PreparedSite(site, peer, device, blob, blob_data, limits)
    device.close()
    fleet.stop()


@pytest.fixture
def early_device():
    """early_device(site, roles=("publish",)) -> a robot's in-memory knowledge base, delegated by
    `site` on its store before the site starts (what `simnet device add` does without a server)."""
    opened = []

    def _make(site: SiteProcess, roles=(knowledge.Role.PUBLISH,)) -> knowledge.KnowledgeBase:
        assert site.process is None, "delegate before the site's server holds its store"
        robot = Identity.generate()
        kb = knowledge.open(
            ":memory:", robot, policy=knowledge.TrustPolicy().for_device_of(site.key.public_key)
        )
        opened.append(kb)
        with knowledge.open(
            site.home / "site.db", site.key, policy=site.home / "trust.toml"
        ) as store:
            store.delegate(robot.public_key, roles)
            kb.ingest(store.envelopes_since(kb.heads(), limit=100_000))
            kb.learn_site_heads(store.heads())  # a device writes once it has seen its site's heads
        return kb

    yield _make
    for kb in opened:
        kb.close()

"""Slow peers and slow readers: what trickles or stalls costs the one round or connection it stalls.

- A hostile peer process answers one byte at a time, each within the per-read timeout, in the body
  (of /v1/sync) or in the response headers. A gossiping site abandons every such round at `[limits]
  sync_deadline_s` and backs off, while an honest peer's news still reaches it within a few
  intervals and admin syncs with the honest peer answer at once; `federation.sync_with` (blocking)
  ends at its deadline too.
- Clients that ask a real server for a large blob and read nothing hold neither the blob's memory
  (blobs are streamed a stored part at a time) nor their connections for long (dropped at the send
  deadline); an honest reader meanwhile gets the whole blob. Blobs stored whole by earlier versions
  are split into parts when the server opens the store; a corrupt one is never delivered complete.
- A write the knowledge base refuses through an admin endpoint (NotAuthorizedError) is a 403, not a
  500.

Run as a script (`python test_slow_peers.py BODY_PORT HEADERS_PORT LIFETIME_S`), this module is the
dripping peer: it exits by itself after LIFETIME_S seconds, and each answer stops after MAX_DRIPS
bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import federation
import knowledge
from federation import PeerConfig, ServerLimits
from knowledge import Identity, Role, TrustPolicy

DRIP_S = 0.3  # one byte per DRIP_S: far inside the victim's per-read timeout
MAX_DRIPS = 400  # per answer (2 minutes at most): the hostile peer stops by itself
READ_TIMEOUT = 2.0  # [limits] timeout_s at the victim
DEADLINE = 2.0  # [limits] sync_deadline_s at the victim
SEND_TIMEOUT = 1.5  # [limits] header_timeout_s at the blob site: also its send deadline
MB = 1 << 20


# --- the dripping peer ----------------------------------------------------------------------------


async def drip_peer(body_port: int, headers_port: int, lifetime: float) -> None:
    """Two listeners: on body_port every answer is a 200 whose body trickles; on headers_port the
    status line comes, then the headers trickle and never end."""

    def handler(mode: str):
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                length = next(
                    (
                        int(line.split(":")[1])
                        for line in head.split("\r\n")
                        if line.lower().startswith("content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if mode == "body":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-simnet-envelopes\r\n"
                        b"content-length: 100000\r\n\r\nS"
                    )
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\n"
                        b"content-type: application/x-simnet-envelopes\r\nx-drip: "
                    )
                print(f"dripping {mode} {path}", flush=True)
                for _ in range(MAX_DRIPS):
                    await writer.drain()
                    await asyncio.sleep(DRIP_S)
                    writer.write(b"\x00" if mode == "body" else b"a")
            except (
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                ConnectionError,
                IndexError,
                ValueError,
            ):
                pass
            finally:
                writer.close()

        return answer

    servers = [
        await asyncio.start_server(handler("body"), "127.0.0.1", body_port),
        await asyncio.start_server(handler("headers"), "127.0.0.1", headers_port),
    ]
    print("listening", flush=True)
    await asyncio.sleep(lifetime)
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def drip(tmp_path_factory):
    """(body_url, headers_url, log path) of a dripping peer process, stopped at teardown (or by
    itself)."""
    from .conftest import free_port, wait_until

    log = tmp_path_factory.mktemp("drip") / "drip.log"
    body_port, headers_port = free_port(), free_port()
    with open(log, "w") as out:
        peer = subprocess.Popen(
            [sys.executable, __file__, str(body_port), str(headers_port), "120"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "listening" in log.read_text(), 30, "the dripping peer to listen")
        yield f"http://127.0.0.1:{body_port}", f"http://127.0.0.1:{headers_port}", log
    finally:
        peer.send_signal(signal.SIGTERM)
        peer.wait(10)


def drips(log: Path, mode: str) -> int:
    return sum(line.startswith(f"dripping {mode}") for line in log.read_text().splitlines())


# --- gossip and sync_with against the dripping peer -----------------------------------------------


def test_a_dripping_peer_costs_only_its_own_rounds(live, drip):
    from .conftest import wait_until

    body_url, headers_url, log = drip
    with ThreadPoolExecutor(2) as pool:
        victim, honest = pool.map(
            lambda make: make(),
            [
                lambda: live(
                    "victim",
                    limits=ServerLimits(timeout_s=READ_TIMEOUT, sync_deadline_s=DEADLINE),
                    interval_s=0.2,
                    max_backoff_s=1.0,
                ),
                lambda: live("honest"),
            ],
        )
    victim_policy = TrustPolicy.load(victim.home / "trust.toml")
    (victim.home / "trust.toml").write_text(
        victim_policy.with_root(honest.key.public_key, tuple(Role), name="honest").to_toml()
    )
    (honest.home / "trust.toml").write_text(
        TrustPolicy.load(honest.home / "trust.toml")
        .with_root(victim.key.public_key, name="victim")
        .to_toml()
    )
    config = victim.config
    config.peers = [
        PeerConfig("drip-body", body_url, Identity.generate().public_key),
        PeerConfig("drip-headers", headers_url, Identity.generate().public_key),
        PeerConfig("honest", f"http://{honest.config.listen}", honest.key.public_key),
    ]
    config.save()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda site: site.start(), [honest, victim]))

    # Rounds with the dripping peer are under way (each would last MAX_DRIPS * DRIP_S = 2 minutes)
    # ...
    wait_until(
        lambda: drips(log, "body") and drips(log, "headers"),
        20,
        "rounds with both dripping listeners",
        step=0.1,
    )
    # ... and news at the honest peer still arrives within a few intervals.
    device = Identity.generate()
    with honest.client() as client:
        client.post(
            "/v1/admin/delegate", json={"device": device.public_key_hex, "roles": ["publish"]}
        ).raise_for_status()
    started = time.monotonic()
    wait_until(
        lambda: honest.key.public_key.hex() in victim.heads()["heads"],
        10,
        "the honest peer's write to reach the victim",
        step=0.05,
    )
    converged = time.monotonic() - started

    with victim.client(timeout=30) as client:
        started = time.monotonic()
        answer = client.post("/v1/admin/sync", json={"peer": "honest"})
        honest_sync = time.monotonic() - started
        assert answer.status_code == 200 and answer.json()["reports"][0]["ok"] is True, answer.text
        started = time.monotonic()
        answer = client.post("/v1/admin/sync", json={"peer": "drip-body"})
        drip_sync = time.monotonic() - started
    [report] = answer.json()["reports"]
    assert answer.status_code == 200 and report["ok"] is False
    assert f"did not finish within its deadline of {DEADLINE:g} s" in report["error"], report
    # at most: the scheduled round it waits for, then its own; each ends at the deadline
    assert DEADLINE - 0.1 <= drip_sync <= 2 * DEADLINE + 3, drip_sync
    assert honest_sync < 3, honest_sync
    print(
        f"\nconverged in {converged:.2f} s; "
        f"admin sync: honest {honest_sync:.2f} s, dripping {drip_sync:.2f} s"
    )

    def states() -> dict[str, dict]:
        return {s["name"]: s for s in victim.status()["peers"]}

    wait_until(
        lambda: all(states()[name]["failures"] for name in ("drip-body", "drip-headers")),
        3 * DEADLINE + 2,
        "a failed round with each dripping listener",
        step=0.1,
    )
    states = states()
    for name in ("drip-body", "drip-headers"):
        assert "deadline" in states[name]["last_error"], states[name]
        assert states[name]["last_success"] is None
    assert states["honest"]["failures"] == 0 and states["honest"]["rounds"] >= 2
    assert victim.healthy() and honest.healthy()
    victim.assert_no_traceback()
    assert "sync with drip-body failed (the sync round with" in victim.log_text()


@pytest.mark.parametrize("mode", ["body", "headers"])
def test_sync_with_ends_at_its_deadline(drip, mode):
    body_url, headers_url, log = drip
    url = body_url if mode == "body" else headers_url
    before = drips(log, mode)
    with knowledge.open(":memory:", Identity.generate()) as kb:
        started = time.monotonic()
        with pytest.raises(federation.PeerError) as caught:
            federation.sync_with(
                kb, url, Identity.generate().public_key, timeout=READ_TIMEOUT, deadline=1.0
            )
        took = time.monotonic() - started
    assert caught.value.code == "deadline" and "deadline of 1 s" in str(caught.value)
    assert 0.9 <= took < 2.0, took  # the sockets are shut at the deadline: no read runs on past it
    assert drips(log, mode) >= before + 1  # it was the dripping answer that ran out of time


def test_rounds_at_once_each_end_at_their_own_deadline(drip):
    """The rounds of one process share one thread that watches their deadlines: a round with a
    shorter deadline, started after one with a longer, still ends at its own."""
    body_url, headers_url, _ = drip

    def round_with(url: str, delay: float, deadline: float) -> tuple[str | None, float]:
        time.sleep(delay)
        with knowledge.open(":memory:", Identity.generate()) as kb:
            started = time.monotonic()
            try:
                federation.sync_with(
                    kb, url, Identity.generate().public_key, timeout=READ_TIMEOUT, deadline=deadline
                )
            except federation.PeerError as exc:
                return exc.code, time.monotonic() - started
            return None, time.monotonic() - started

    with ThreadPoolExecutor(3) as pool:
        long = pool.submit(round_with, body_url, 0.0, 3.0)
        short = pool.submit(round_with, headers_url, 0.3, 1.0)
        other = pool.submit(round_with, body_url, 0.3, 1.5)
        (long_code, long_s), (short_code, short_s), (other_code, other_s) = (
            long.result(),
            short.result(),
            other.result(),
        )
    assert long_code == short_code == other_code == "deadline"
    assert 0.9 <= short_s < 1.8, short_s
    assert 1.4 <= other_s < 2.3, other_s
    assert 2.9 <= long_s < 3.8, long_s


# --- a blob site and its slow readers -------------------------------------------------------------


class BlobSite:
    def __init__(self, site, big: bytes, legacy: bytes, corrupt: str, reader: Identity) -> None:
        self.site, self.big, self.legacy, self.corrupt, self.reader = (
            site,
            big,
            legacy,
            corrupt,
            reader,
        )
        self.big_hash = hashlib.sha256(big).hexdigest()
        self.legacy_hash = hashlib.sha256(legacy).hexdigest()

    def rss_mb(self) -> float:
        for line in open(f"/proc/{self.site.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def get(self, blob_hash: str, timeout: float = 30) -> httpx.Response:
        with self.site.client(self.reader, timeout=timeout) as client:
            return client.get(f"/v1/blobs/{blob_hash}")


@pytest.fixture(scope="module")
def blob_site(module_live):
    """A running site holding a 32 MiB blob (stored in parts), and two blobs a store of an earlier
    version held whole: one intact, one whose bytes do not match its hash; and a device key that may
    read there."""
    site = module_live("blobs", limits=ServerLimits(header_timeout_s=SEND_TIMEOUT))
    big, legacy = os.urandom(32 * MB), os.urandom(600 << 10)
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        assert kb.blobs.put(big) == hashlib.sha256(big).hexdigest()
    corrupt = hashlib.sha256(b"what the hash promises").hexdigest()
    with sqlite3.connect(
        site.home / "site.db"
    ) as db:  # the layout of earlier versions: one row per blob
        db.executemany(
            "INSERT INTO blobs VALUES (?, ?)",
            [
                (hashlib.sha256(legacy).digest(), legacy),
                (bytes.fromhex(corrupt), b"something else"),
            ],
        )
    site.start()
    reader = Identity.generate()
    with site.client() as client:
        client.post(
            "/v1/admin/delegate", json={"device": reader.public_key_hex, "roles": ["publish"]}
        ).raise_for_status()
    return BlobSite(site, big, legacy, corrupt, reader)


def stalled_reader(ps: BlobSite) -> socket.socket:
    """A connection that asks for the big blob, reads the answer's head, and then reads nothing."""
    host, port = ps.site.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    from .conftest import signed

    target = f"/v1/blobs/{ps.big_hash}"
    sock.sendall(
        f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: "
        f"{signed(ps.reader, ps.site.key.public_key, 'GET', target)}\r\n\r\n".encode()
    )
    head = b""
    sock.settimeout(10)
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1024)
        assert chunk, head
        head += chunk
    assert (
        head.startswith(b"HTTP/1.1 200") and f"content-length: {32 * MB}".encode() in head.lower()
    ), head
    return sock


def drained(sock: socket.socket, limit_s: float) -> tuple[bool, int]:
    """Read what the connection still yields, until it ends (EOF or reset) or `limit_s` passes:
    (ended, bytes read)."""
    deadline, total = time.monotonic() + limit_s, 0
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except ConnectionError:
            return True, total
        if not chunk:
            return True, total
        total += len(chunk)
    return False, total


def test_readers_that_read_nothing_hold_neither_the_blob_nor_their_connections(blob_site):
    ps = blob_site
    first = ps.get(ps.big_hash)  # warm up: the store's page cache, the allocator, a worker thread
    assert first.status_code == 200 and first.content == ps.big
    assert "content-encoding" not in first.headers and first.headers["content-length"] == str(
        32 * MB
    )
    before = ps.rss_mb()

    readers = [stalled_reader(ps) for _ in range(8)]  # 8 x 32 MiB would be 256 MiB held whole
    try:
        time.sleep(0.3)
        during = ps.rss_mb()
        started = time.monotonic()
        honest = ps.get(ps.big_hash)  # an honest reader meanwhile gets all of it, at once
        fetch = time.monotonic() - started
        assert (
            honest.status_code == 200 and hashlib.sha256(honest.content).hexdigest() == ps.big_hash
        )
        assert ps.site.healthy()
        print(
            f"\nserver RSS {before:.0f} MB -> {during:.0f} MB with 8 stalled 32 MiB answers; "
            f"honest fetch {fetch:.2f} s"
        )
        assert during - before < 40, (before, during)

        time.sleep(SEND_TIMEOUT + 0.5)  # still reading nothing, past the send deadline
        ends = [drained(sock, 8) for sock in readers]
        assert all(ended for ended, _ in ends), ends  # dropped by the server ...
        assert all(total < 32 * MB for _, total in ends), ends  # ... not served to the end
    finally:
        for sock in readers:
            sock.close()
    assert (
        "dropped a connection whose client took in none of its answer for 1.5 s"
        in ps.site.log_text()
    )
    assert ps.get(ps.big_hash).status_code == 200
    ps.site.assert_no_traceback()


def test_blobs_stored_whole_by_earlier_versions_are_split_and_served(blob_site):
    ps = blob_site
    answer = ps.get(ps.legacy_hash)
    assert answer.status_code == 200 and answer.content == ps.legacy
    with sqlite3.connect(f"file:{ps.site.home / 'site.db'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT COUNT(*) FROM blobs").fetchone() == (
            0,
        )  # moved when the server opened it
        parts = db.execute(
            "SELECT COUNT(*), SUM(length(data)) FROM blob_parts WHERE hash=?",
            (bytes.fromhex(ps.legacy_hash),),
        ).fetchone()
    assert parts == (3, len(ps.legacy))  # 600 KiB in 256 KiB parts
    with knowledge.open(
        ":memory:", ps.reader, policy=TrustPolicy().for_device_of(ps.site.key.public_key)
    ) as kb:
        report = federation.sync_with(
            kb, ps.site.url, ps.site.key.public_key, blobs=[ps.legacy_hash]
        )
        assert report.blobs == 1 and kb.blobs.get(ps.legacy_hash) == ps.legacy


def test_a_corrupt_stored_blob_is_never_delivered_complete(blob_site):
    ps = blob_site
    with pytest.raises(httpx.RemoteProtocolError):  # the answer's head, then the connection closes
        ps.get(ps.corrupt)
    with knowledge.open(
        ":memory:", ps.reader, policy=TrustPolicy().for_device_of(ps.site.key.public_key)
    ) as kb:
        with pytest.raises(federation.PeerError):
            federation.sync_with(kb, ps.site.url, ps.site.key.public_key, blobs=[ps.corrupt])
        assert ps.corrupt not in kb.blobs
    assert f"stored blob {ps.corrupt[:16]}… is corrupt" in ps.site.log_text()
    assert ps.site.healthy() and ps.get(ps.legacy_hash).status_code == 200
    ps.site.assert_no_traceback()


# --- a refused write through an admin endpoint ----------------------------------------------------


def test_a_write_the_knowledge_base_refuses_is_403_not_500(live):
    """A robot serving its own store (trust.toml: device of its site) that holds no grant yet: its
    own admin writes are refused by the knowledge base (NotAuthorizedError), and answered 403 with
    the reason."""
    from .conftest import assert_refused

    robot = live("robot")
    home_site = Identity.generate()
    (robot.home / "trust.toml").write_text(
        TrustPolicy().for_device_of(home_site.public_key).to_toml()
    )
    robot.start()
    with robot.client() as client:
        for path, body in [
            ("/v1/admin/revoke", {"skill": "ab" * 32, "reason": "drops things"}),
            ("/v1/admin/delegate", {"device": "cd" * 32, "roles": ["publish"]}),
            ("/v1/admin/revoke-key", {"device": "cd" * 32, "last_seq": 0}),
        ]:
            detail = assert_refused(
                client.post(path, json=body), 403, "not_authorized", robot.key.key_id
            )
            assert "sync" in detail  # what to do about it
    assert robot.healthy()  # and it keeps serving
    robot.assert_no_traceback()
    assert "ERROR" not in robot.log_text()


if __name__ == "__main__":
    asyncio.run(drip_peer(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))

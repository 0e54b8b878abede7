"""A device's blob requests cannot stall its site.

A device asking its site for a blob the site lacks (one a skill held there names) makes the site
fetch it from its peers, in a worker thread, for up to `sync_deadline_s`. Before the fix those
fetches ran on the server's shared pool of worker threads (40), which every signed request also
needs (the caller's grant is looked up there): a robot holding any role that asked 50 times at
once for a blob named by its own skill, while one of the site's peers was unreachable (a black
hole: connected, never answering), kept every thread busy until the deadline, and the site
answered nobody, its own key included, for as long as the robot kept asking.

Now a site fetches at most a few blobs for its devices at once, on threads of its own; a request
beyond that is answered 503 `busy` with Retry-After, and everything else is served meanwhile.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

import federation
import knowledge
from federation import PeerConfig, ServerLimits, SimnetAuth
from knowledge import Identity, TrustPolicy

from ..conftest import simnet_here
from .conftest import assert_refused, wait_until
from .test_new_surfaces import device

DEADLINE_S = 15.0  # [limits] sync_deadline_s and timeout_s at the site: how long a fetch may take
ASKS = 80  # concurrent requests for the blob: more than the server's shared pool of threads


def test_a_device_asking_many_times_for_a_blob_no_peer_sends_does_not_stall_its_site(
    live, tmp_path
):
    """Attack: a robot publishes a skill naming a blob nobody holds, then asks its site for it 50
    times at once while the site's only peer is a black hole. The site must go on answering its
    own key's signed requests at once, and answer the robot's requests, which share one fetch
    (each waiting for it holds no thread), 404 or 504 when it ends or they time out, never 500."""
    hole = socket.socket()  # accepts connections (the kernel does) and never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)
    site = live("site", limits=ServerLimits(timeout_s=DEADLINE_S, sync_deadline_s=DEADLINE_S))
    config = site.config
    hole_url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    config.peers.append(PeerConfig("hole", hole_url, Identity.generate().public_key))
    config.save()
    site.start()

    robot_key = Identity.generate()
    simnet_here(site.home, "device", "add", robot_key.public_key_hex, "--roles", "publish")
    policy = TrustPolicy().for_device_of(site.key.public_key)
    robot = knowledge.open(tmp_path / "robot.db", robot_key, policy=policy)
    federation.sync_with(robot, site.url, site.key.public_key)
    blob = os.urandom(32).hex()
    robot.skills.publish("needs-a-blob", "pick", blobs=[blob])
    federation.sync_with(robot, site.url, site.key.public_key)
    robot.close()

    def ask(_: int) -> int:
        auth = SimnetAuth(robot_key, site.key.public_key)
        with httpx.Client(base_url=site.url, auth=auth, timeout=4 * DEADLINE_S) as client:
            return client.get(f"/v1/blobs/{blob}").status_code

    with ThreadPoolExecutor(ASKS) as pool:
        asked = [pool.submit(ask, i) for i in range(ASKS)]
        time.sleep(3.0)  # every request has arrived; the first fetch waits on the black hole
        start = time.monotonic()
        with site.client(timeout=4 * DEADLINE_S) as client:
            assert client.get("/v1/heads").status_code == 200
        waited = time.monotonic() - start
        statuses = sorted(f.result() for f in asked)
    hole.close()

    assert waited < DEADLINE_S / 3, (
        f"the site's own heads took {waited:.1f} s while the robot asked"
    )
    assert set(statuses) <= {404, 504}, statuses  # the fetch ended (no peer sent it), or they
    # timed out; a fetch that outlived its requests ends, and frees its turn: the peer gone, the
    # robot is told at once that no peer has the blob
    wait_until(lambda: ask(0) == 404, 4 * DEADLINE_S, "the robot's request to be answered 404")
    site.assert_no_traceback()


def sites_with_an_honest_blob(live, tmp_path, hole: socket.socket, hole_key: bytes, trust: str):
    """Sites a and b, serving, peers of each other (a trusts b to publish, b a to validate), a's
    limits at `DEADLINE_S`; `hole` is a's peer too, after b, with `hole_key` (trusted for `trust`
    when given). A robot of b publishes a skill naming a blob b holds; a holds the skill, not the
    blob. Returns a, b and the blob's hash."""
    a = live("a", limits=ServerLimits(timeout_s=DEADLINE_S, sync_deadline_s=DEADLINE_S))
    b = live("b")
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet_here(site.home, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    hole_url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    if trust:
        simnet_here(
            a.home, "peer", "add", "hole", hole_url, "--key", hole_key.hex(), "--trust", trust
        )
    else:
        config = a.config
        config.peers.append(PeerConfig("hole", hole_url, hole_key))
        config.save()
    a.start(), b.start()
    publisher = device(b, tmp_path, "publisher", "publish")
    weights = publisher.blobs.put(os.urandom(4096))
    publisher.skills.publish("honest", "pick", blobs=[weights])
    federation.sync_with(publisher, b.url, b.key.public_key, push_blobs=[weights])
    publisher.close()
    simnet_here(a.home, "sync", "b")
    return a, b, weights


def honest_fetch_while_asked(a, tmp_path, askers: list[tuple[Identity, str]], blob: str):
    """A robot of a fetches `blob` through a (federation.sync_with) while each (key, blob) of
    `askers` asks a for its blob from a thread of its own, again as soon as it is answered (or in
    3 s): the robot's store, how long its fetch took, and the statuses the askers got."""
    stop = threading.Event()
    answers: list[int] = []

    def ask(key: Identity, wanted: str) -> None:
        with httpx.Client(base_url=a.url, auth=SimnetAuth(key, a.key.public_key)) as client:
            while not stop.is_set():
                try:
                    answers.append(client.get(f"/v1/blobs/{wanted}", timeout=3.0).status_code)
                except httpx.TimeoutException:
                    pass

    honest = device(a, tmp_path, "honest", "publish")
    with ThreadPoolExecutor(len(askers)) as pool:
        for key, wanted in askers:
            pool.submit(ask, key, wanted)
        time.sleep(2.0)  # every turn is taken
        started = time.monotonic()
        try:
            federation.sync_with(honest, a.url, a.key.public_key, blobs=[blob])
        finally:
            took = time.monotonic() - started
            stop.set()
    return honest, took, answers


def test_one_device_cannot_take_every_fetch_from_its_sites_other_devices(live, tmp_path):
    """Attack: a robot publishes a skill naming a blob nobody holds and asks its site for it from
    8 threads, again as soon as each is answered, while one of the site's peers is a black hole.
    Before the fix every ask took one of the site's 4 fetch turns (each waited for the one
    before, then asked every peer again), so another robot of the site asking for a blob that a
    peer holds was told `busy` until its client gave up. Now a device holds one turn at a time,
    and asks for a blob being fetched share that fetch: the other robot gets its blob at once."""
    hole = socket.socket()  # accepts connections (the kernel does) and never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)
    a, b, weights = sites_with_an_honest_blob(live, tmp_path, hole, os.urandom(32), "")
    attacker = device(a, tmp_path, "attacker", "publish")
    missing, another = os.urandom(32).hex(), os.urandom(32).hex()
    attacker.skills.publish("needs-a-blob", "pick", blobs=[missing, another])
    federation.sync_with(attacker, a.url, a.key.public_key)
    attacker_key = attacker.identity
    attacker.close()

    honest, took, _ = honest_fetch_while_asked(a, tmp_path, [(attacker_key, missing)] * 8, weights)
    with httpx.Client(auth=SimnetAuth(attacker_key, a.key.public_key)) as client:
        second = client.get(f"{a.url}/v1/blobs/{another}", timeout=DEADLINE_S)
    hole.close()

    assert weights in honest.blobs, "the honest robot did not get its blob"
    assert took < DEADLINE_S / 2, f"the honest robot waited {took:.1f} s for its blob"
    # the attacker's other blob waits for its first: refused at once, to ask again later
    assert_refused(second, 503, "busy", "a blob this device asked for is still being fetched")
    assert second.headers["retry-after"] == "1"
    honest.close()
    a.assert_no_traceback(), b.assert_no_traceback()


def test_a_peer_cannot_take_every_fetch_with_devices_of_its_own(live, tmp_path):
    """Attack: a site root that a trusts to publish, whose server never answers (a black hole at
    its address), delegates four device keys, publishes a skill naming four blobs only it could
    send, and each device asks a for one of them again and again. Its devices hold a grant at a
    (its delegation, capped by its roles there), so a fetched the blobs for them from its peers:
    the hostile root too, which never answers, a turn a device, every turn for as long as they
    asked, and a's own robot was told `busy` until its client gave up. A site fetches only for
    the devices it delegated itself; another site's devices are answered from what is held."""
    hole = socket.socket()  # the hostile root's address: accepts connections, never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)
    hostile_key = Identity.generate()
    a, b, weights = sites_with_an_honest_blob(
        live, tmp_path, hole, hostile_key.public_key, "publish"
    )
    hostile = knowledge.open(tmp_path / "hostile.db", hostile_key)
    devices = [Identity.generate() for _ in range(4)]
    for robot in devices:
        hostile.delegate(robot.public_key, ["publish"])
    missing = [os.urandom(32).hex() for _ in devices]  # a blob for each: a fetch each
    hostile.skills.publish("needs-blobs", "pick", blobs=missing)
    federation.sync_with(hostile, a.url, a.key.public_key)  # a pulls nothing from the hole
    hostile.close()

    askers = list(zip(devices * 2, missing * 2, strict=True))
    honest, took, answers = honest_fetch_while_asked(a, tmp_path, askers, weights)
    hole.close()

    assert weights in honest.blobs, "the honest robot did not get its blob"
    assert took < DEADLINE_S / 2, f"the honest robot waited {took:.1f} s for its blob"
    assert answers and set(answers) == {404}, sorted(set(answers))  # a holds no such blob
    honest.close()
    a.assert_no_traceback(), b.assert_no_traceback()

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
    a = live("a", limits=ServerLimits(timeout_s=DEADLINE_S, sync_deadline_s=DEADLINE_S))
    b = live("b")  # a peer of a that holds the honest blob
    for site, other, roles in ((a, b, "publish"), (b, a, "validate")):
        url, key = f"http://{other.config.listen}", other.key.public_key_hex
        simnet_here(site.home, "peer", "add", other.home.name, url, "--key", key, "--trust", roles)
    config = a.config  # the black hole after b: a fetch asks b first, then waits on the hole
    hole_url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    config.peers.append(PeerConfig("hole", hole_url, Identity.generate().public_key))
    config.save()
    a.start(), b.start()

    publisher = device(b, tmp_path, "publisher", "publish")
    weights = publisher.blobs.put(os.urandom(4096))
    publisher.skills.publish("honest", "pick", blobs=[weights])
    federation.sync_with(publisher, b.url, b.key.public_key, push_blobs=[weights])
    publisher.close()
    simnet_here(a.home, "sync", "b")  # a holds the honest skill, not its blob

    attacker = device(a, tmp_path, "attacker", "publish")
    missing, another = os.urandom(32).hex(), os.urandom(32).hex()
    attacker.skills.publish("needs-a-blob", "pick", blobs=[missing, another])
    federation.sync_with(attacker, a.url, a.key.public_key)
    attacker_key = attacker.identity
    attacker.close()
    stop = threading.Event()

    def hammer(_: int) -> None:
        auth = SimnetAuth(attacker_key, a.key.public_key)
        with httpx.Client(base_url=a.url, auth=auth, timeout=3.0) as client:
            while not stop.is_set():
                try:
                    client.get(f"/v1/blobs/{missing}")
                except httpx.TimeoutException:
                    pass

    honest = device(a, tmp_path, "honest", "publish")
    with ThreadPoolExecutor(8) as pool:
        for i in range(8):
            pool.submit(hammer, i)
        time.sleep(2.0)  # every turn is taken
        started = time.monotonic()
        try:
            federation.sync_with(honest, a.url, a.key.public_key, blobs=[weights])
        finally:
            took = time.monotonic() - started
            with httpx.Client(auth=SimnetAuth(attacker_key, a.key.public_key)) as client:
                second = client.get(f"{a.url}/v1/blobs/{another}", timeout=DEADLINE_S)
            stop.set()
    hole.close()

    # the attacker's other blob waits for its first: refused at once, to ask again later
    assert_refused(second, 503, "busy", "a blob this device asked for is still being fetched")
    assert second.headers["retry-after"] == "1"

    assert weights in honest.blobs, "the honest robot did not get its blob"
    assert took < DEADLINE_S / 2, f"the honest robot waited {took:.1f} s for its blob"
    honest.close()
    a.assert_no_traceback(), b.assert_no_traceback()

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
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

import federation
import knowledge
from federation import PeerConfig, ServerLimits, SimnetAuth
from knowledge import Identity, TrustPolicy

from ..conftest import simnet_here
from .conftest import wait_until

DEADLINE_S = 15.0  # [limits] sync_deadline_s and timeout_s at the site: how long a fetch may take
ASKS = 80  # concurrent requests for the blob: more than the server's shared pool of threads


def test_a_device_asking_many_times_for_a_blob_no_peer_sends_does_not_stall_its_site(
    live, tmp_path
):
    """Attack: a robot publishes a skill naming a blob nobody holds, then asks its site for it 50
    times at once while the site's only peer is a black hole. The site must go on answering its
    own key's signed requests at once, and refuse the surplus requests 503 `busy`, never 500."""
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
    assert set(statuses) <= {503, 504}, statuses
    assert 503 in statuses  # the surplus was turned away, not queued
    # the fetches that outlived their requests end, and free their turns: the peer gone, the
    # robot is told at once that no peer has the blob
    wait_until(lambda: ask(0) == 404, 4 * DEADLINE_S, "the robot's request to be answered 404")
    site.assert_no_traceback()

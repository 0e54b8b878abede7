"""Blobs on demand across real sites: `simnet serve` processes on loopback ports, the real `simnet`
command in subprocesses, real keys and signatures.

A validator site holds a skill's record (synced) but not its weights: `simnet certify` fetches them
from its peers, refusing a peer whose answer is corrupt (a proxy that flips a byte: the one fake,
there to inject that fault) and taking them from the next; a skill whose weights no peer holds is a
one-line error; an auditor's `simnet verify` (a read-only store) fetches them into memory.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import httpx
import pytest
import uvicorn

import knowledge
import sim


def flipping_proxy(target: str):
    """An ASGI app that forwards every request to `target` as it came (signature and all) and
    flips the last byte of every whole blob it answers."""

    async def app(scope, receive, send):
        assert scope["type"] == "http"
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        path = scope["raw_path"].decode()
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode()
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k != b"host"]
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.request(
                scope["method"], target + path, content=body, headers=headers
            )
        content = answer.content
        if path.startswith("/v1/blobs/") and answer.status_code == 200 and content:
            content = content[:-1] + bytes([content[-1] ^ 1])
        dropped = ("content-length", "content-encoding", "transfer-encoding")
        out = [(k.encode(), v.encode()) for k, v in answer.headers.items() if k not in dropped]
        out.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": content})

    return app


@pytest.fixture
def proxy():
    """proxy(target) -> URL of a flipping proxy in front of `target`, served until teardown."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def _start(target: str) -> str:
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(flipping_proxy(target), lifespan="off", log_level="warning")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield _start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def test_sites_fetch_the_weights_they_evaluate_from_their_peers(fleet, run_simnet, proxy):
    pub, val, aud = fleet.add("pub"), fleet.add("val"), fleet.add("aud")
    nowhere = hashlib.sha256(b"weights no site holds").hexdigest()
    with knowledge.open(pub.home / "site.db", pub.key, policy=pub.home / "trust.toml") as kb:
        skill = sim.publish_skill(kb, sim.load_skill("arm_reach_good"), "reach", "r")
        skill_id, weights = skill.id, skill.policy["weights"]
        spec = sim.load_skill("arm_reach_good").spec.to_json()
        policy = {"kind": "mlp", "architecture": spec, "weights": nowhere}
        kb.skills.publish("ghost", "r", policy=policy, blobs=[nowhere])
    fleet.connect(pub, val)  # pub serves val and aud, and trusts their certificates
    fleet.connect(pub, aud)
    pub.start()
    liar = proxy(pub.url)
    run_simnet(val.home, "peer", "add", "liar", liar, "--key", pub.key.public_key_hex)
    fleet.connect(val, pub)
    fleet.connect(aud, pub)
    run_simnet(val.home, "sync", "pub")  # the records arrive; blobs are fetched on demand

    certified = run_simnet(
        val.home, "certify", "reach", "--task", "arm_reach", "--branches", "16", check=False
    )
    assert certified.returncode == 0, certified.stderr
    assert f"certified {skill_id[:16]}" in certified.stdout
    assert f"blob {weights[:16]}…: liar sent bytes that do not hash to it; refused" in (
        certified.stderr
    )
    with knowledge.open(val.home / "site.db") as kb:
        assert kb.blobs.get(weights) == sim.load_skill("arm_reach_good").weights

    ghost = run_simnet(val.home, "certify", "ghost", "--task", "arm_reach", check=False)
    assert ghost.returncode == 1 and "Traceback" not in ghost.stderr
    assert ghost.stderr.strip().splitlines() == [
        f"Error: blob {nowhere[:16]}… is not stored here and no source could supply it "
        "(liar: does not hold it; pub: does not hold it)"
    ]

    run_simnet(val.home, "sync", "pub")  # the certificate reaches pub, then aud
    fleet.trust(aud, val)
    run_simnet(aud.home, "sync", "pub")
    verified = run_simnet(aud.home, "verify", "reach", check=False)
    assert verified.returncode == 0, verified.stderr
    assert " valid: " in verified.stdout
    with knowledge.open(aud.home / "site.db") as kb:
        assert weights not in kb.blobs  # a read-only store fetched them into memory only

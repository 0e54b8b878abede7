"""Poison never stops gossip (issue #13, 5): a hostile peer process answers a gossiping site with
garbage pages, signed poison envelopes, malformed and gigantic JSON, broken HTTP, errors, resets and
stalls; the site's scheduler survives every one of them and keeps syncing with an honest peer — a
revocation made there still arrives — and its own server answers the same poison with a 4xx or a
list of rejections, never a 5xx.

Run as a script (`python test_gossip_survival.py PORT KEYDIR`), this module is the hostile peer.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import federation
import knowledge
from federation import PAGE_TYPE, PeerConfig, ServerLimits, encode_page
from knowledge import Identity, Role, TrustPolicy

POISON_KEYS = 3  # hostile site roots the victim trusts to publish: one poison envelope each


# --- the hostile peer -----------------------------------------------------------------------------


def poison_envelopes(keys: list[Identity]) -> list[bytes]:
    """Validly signed first envelopes whose contents are poison: JSON 20,000 deep, a 5,000-digit
    number, and bytes that are no Yjs update at all."""
    from pycrdt import Doc, Map

    from knowledge._clock import pack
    from knowledge._envelope import ZERO_HASH, Kind, seal
    from knowledge._feed import client_id_for

    now = time.time_ns() // 1_000_000
    contents = [
        ("immutable", "skill/" + "ab" * 32, "[" * 20_000 + "]" * 20_000),
        ("records", "cell/yard/1,1", '{"v":1,"value":' + "9" * 5000 + "}"),
    ]
    out = []
    for key, (root, name, text) in zip(keys[:2], contents, strict=True):  # keys[2]: random bytes
        doc = Doc(client_id=client_id_for(key.public_key))
        with doc.transaction():
            doc.get(root, type=Map)[name] = text
        out.append(seal(key, Kind.UPDATE, 1, ZERO_HASH, pack(now), doc.get_update()).raw)
    out.append(seal(keys[2], Kind.UPDATE, 1, ZERO_HASH, pack(now), os.urandom(64)).raw)
    return out


def http(
    status: int, body: bytes, content_type: str = "application/json", extra: str = ""
) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def scenarios(poison: bytes) -> list[dict[str, bytes | None]]:
    """What the hostile peer answers, per round: to /v1/sync, and (if the round gets there) to
    /v1/heads and /v1/envelopes. None: close the connection without a word; b"stall": headers, then
    nothing."""
    empty, heads = http(200, encode_page([]), PAGE_TYPE), http(200, b'{"heads": {}}')
    return [
        {"sync": http(200, b"<html>not a page</html>", PAGE_TYPE)},
        {"sync": http(200, b"SNP1\xff\xff\xff\xff", PAGE_TYPE)},  # four billion envelopes announced
        {"sync": http(200, b"SNP1\x00\x00\x00\x01\xff\xff\xff\xf0", PAGE_TYPE)},  # one of 4 GB
        {"sync": http(200, poison, PAGE_TYPE)},
        {"sync": http(500, b"<h1>Internal Server Error</h1>", "text/html")},
        {"sync": None},
        {"sync": b"HTTP/1.1 2OO OK\r\n\r\n\x00\xff"},
        {"sync": b"stall"},
        {"sync": http(200, b"\x1f\x8b not gzip at all", PAGE_TYPE, "content-encoding: gzip\r\n")},
        {
            "sync": http(
                200, gzip.compress(b"\0" * (80 << 20)), PAGE_TYPE, "content-encoding: gzip\r\n"
            )
        },  # a bomb
        {"sync": empty, "heads": http(200, b"[" * 200_000 + b"]" * 200_000)},
        {
            "sync": empty,
            "heads": http(200, b'{"heads": {"' + b"ab" * 32 + b'": ' + b"9" * 5000 + b"}}"),
        },
        {"sync": empty, "heads": http(200, b'{"heads": {"' + b"ab" * 32 + b'": 1e999}}')},
        {"sync": empty, "heads": http(200, b'{"heads": {}, "hashes": 5}')},
        {
            "sync": empty,
            "heads": http(
                200, b'{"heads": {"' + b"ab" * 32 + b'": 1}, "equivocators": [[1], {"a": 2}]}'
            ),
        },
        {
            "sync": empty,
            "heads": heads,
            "envelopes": http(200, b'{"accepted": 1e30, "rejected": [{"index": -5}]}'),
        },
        {
            "sync": empty,
            "heads": heads,
            "envelopes": http(200, json.dumps({"accepted": 0, "heads": [1]}).encode()),
        },
    ]


async def hostile(port: int, keydir: Path) -> None:
    keys = [Identity.load(keydir / f"poison-{i}.key") for i in range(POISON_KEYS)]
    plan = scenarios(encode_page(poison_envelopes(keys)))
    current = {"round": -1}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1].split("?")[0]
                length = next(
                    (
                        int(line.split(":")[1])
                        for line in head.split("\r\n")
                        if line.lower().startswith("content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                kind = path.removeprefix("/v1/").split("/")[0]
                if kind == "sync":
                    current["round"] += 1
                    print(f"served {current['round'] % len(plan)}", flush=True)
                reply = plan[current["round"] % len(plan)].get(
                    kind, http(404, b'{"error": "not_found"}')
                )
                if reply is None:
                    return
                if reply == b"stall":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nSNP1")
                    await asyncio.sleep(60)
                    return
                writer.write(reply)
                await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            ValueError,
            IndexError,
        ):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


# --- the test -------------------------------------------------------------------------------------


def test_a_hostile_peer_never_stops_gossip_with_an_honest_one(live, tmp_path):
    from .conftest import free_port, wait_until

    keys = [Identity.generate() for _ in range(POISON_KEYS)]
    for i, key in enumerate(keys):
        key.save(tmp_path / f"poison-{i}.key")
    port = free_port()
    hostile_log = tmp_path / "hostile.log"
    with open(hostile_log, "w") as out:
        peer = subprocess.Popen(
            [sys.executable, __file__, str(port), str(tmp_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with ThreadPoolExecutor(2) as pool:  # slow steps at once: `simnet init` twice
            victim, honest = pool.map(
                lambda make: make(),
                [
                    lambda: live(
                        "victim",
                        limits=ServerLimits(timeout_s=2.0),
                        interval_s=0.1,
                        max_backoff_s=0.2,
                    ),
                    lambda: live("honest"),
                ],
            )
        policy = TrustPolicy.load(victim.home / "trust.toml").with_root(
            honest.key.public_key, tuple(Role), name="honest"
        )
        for i, key in enumerate(keys):
            policy = policy.with_root(key.public_key, [Role.PUBLISH], name=f"poison-{i}")
        (victim.home / "trust.toml").write_text(policy.to_toml())
        (honest.home / "trust.toml").write_text(
            TrustPolicy.load(honest.home / "trust.toml")
            .with_root(victim.key.public_key, name="victim")
            .to_toml()
        )
        config = victim.config
        hostile_url = (
            f"http://127.0.0.1:{port}"  # twice: two rounds in three are the hostile peer's
        )
        config.peers = [
            PeerConfig("hostile", hostile_url, keys[0].public_key),
            PeerConfig("hostile-too", hostile_url, keys[1].public_key),
            PeerConfig("honest", f"http://{honest.config.listen}", honest.key.public_key),
        ]
        config.save()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda site: site.start(), [honest, victim]))
        wait_until(lambda: "listening" in hostile_log.read_text(), 30, "the hostile peer to listen")

        robot = knowledge.open(
            ":memory:", Identity.generate(), policy=TrustPolicy().with_root(honest.key.public_key)
        )
        with honest.client() as client:
            client.post(
                "/v1/admin/delegate",
                json={"device": robot.identity.public_key_hex, "roles": ["publish"]},
            ).raise_for_status()
        federation.sync_with(robot, honest.url, honest.key.public_key)
        skill = robot.skills.publish("walk", "locomotion").id
        federation.sync_with(robot, honest.url, honest.key.public_key)
        robot.close()

        plan = len(scenarios(b""))
        served = lambda: {
            line for line in hostile_log.read_text().splitlines() if line.startswith("served")
        }
        wait_until(
            lambda: len(served()) == plan,
            45,
            f"the hostile peer to serve all {plan} poisons",
            step=0.2,
        )
        assert victim.status()["skills"] == 1  # learnt from the honest peer meanwhile
        with honest.client() as client:
            client.post(
                "/v1/admin/revoke", json={"skill": skill, "reason": "drops things"}
            ).raise_for_status()
        wait_until(
            lambda: victim.status()["revocations"] == 1,
            20,
            "the revocation to reach the victim",
            step=0.2,
        )

        states = {s["name"]: s for s in victim.status()["peers"]}
        assert states["hostile"]["failures"] >= 1 and states["hostile"]["last_error"]
        assert states["honest"]["last_success"] is not None and states["honest"]["rounds"] >= 2
        assert_server_refuses_poison(victim, keys[0], poison_envelopes(keys))
        assert victim.healthy() and honest.healthy()
        victim.assert_no_traceback()
        honest.assert_no_traceback()
    finally:
        peer.kill()
        peer.wait(10)


def assert_server_refuses_poison(site, who: Identity, poison: list[bytes]) -> None:
    """The same poison, sent to the victim's own server by a root it trusts: 4xx or a 200 listing
    rejections, never a 5xx."""
    from .conftest import signed

    bodies = [
        ("POST", "/v1/envelopes", encode_page(poison), PAGE_TYPE),
        (
            "POST",
            "/v1/sync",
            b'{"heads": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "application/json",
        ),
        (
            "POST",
            "/v1/sync",
            b'{"heads": {"' + b"ab" * 32 + b'": ' + b"9" * 5000 + b"}}",
            "application/json",
        ),
        ("POST", "/v1/sync", b'{"heads": {}, "limit": 1e999}', "application/json"),
    ]
    for method, path, body, content_type in bodies:
        headers = {
            "authorization": signed(who, site.key.public_key, method, path, body),
            "content-type": content_type,
        }
        response = httpx.request(method, site.url + path, content=body, headers=headers, timeout=30)
        assert response.status_code < 500, (path, response.status_code, response.text[:300])
        if path == "/v1/envelopes":
            assert response.status_code == 200 and response.json()["accepted"] == 0, response.text[
                :500
            ]


if __name__ == "__main__":
    asyncio.run(hostile(int(sys.argv[1]), Path(sys.argv[2])))

"""A feed of large envelopes can always be pulled: a site's page holds at most
`federation._wire.PAGE_BYTES` of envelopes, however many `limit` allows, and a pushed page
at most `PUSH_BYTES`.

A building-scale map written with `observe_many` is envelopes of up to 7/8 MiB of tiles each. A
site that answered a pull with up to 1,000 of them (one page, up to a GiB) sent more than any
client reads in one answer (`max(max_blob_bytes, 64 MiB)`): the client refused the answer, the
round failed, and every later round failed the same way, so the feed behind it was never pulled.
Here a real `simnet serve` holds 72 MiB of map tiles and a robot (a blob store capped at 16 MiB, so
it reads answers of up to 64 MiB) pulls them.
"""

from __future__ import annotations

import httpx
import numpy as np

import federation
import knowledge
from knowledge import Identity, Limits, Role, TrustPolicy

MB = 1 << 20
BLOCK = 512  # cells along each side of one observe_many call: 64 tiles, about 4 MiB


def test_a_feed_of_large_envelopes_is_pulled_in_pages_that_fit(live):
    site = live("mapped")
    robot_key = Identity.generate()
    rng = np.random.default_rng(7)
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        kb.delegate(robot_key.public_key, [Role.PUBLISH])
        building = kb.maps["building"]
        for i in range(20):
            xs, ys = np.meshgrid(np.arange(i * BLOCK, (i + 1) * BLOCK), np.arange(BLOCK))
            cells = np.stack([xs.ravel(), ys.ravel()], 1)
            values = rng.integers(0, 40, len(cells))
            building.observe_many(cells, values, rng.random(len(cells)), palette=list(range(40)))
        head = kb.heads()[site.key.public_key_hex].seq
        written = sum(map(len, kb.envelopes_since({}, limit=10_000)))
    assert written > 72 * MB  # more than the robot reads in one answer (64 MiB)
    site.start()
    policy = TrustPolicy().with_root(site.key.public_key)
    with knowledge.open(
        ":memory:", robot_key, policy=policy, limits=Limits(max_blob_bytes=16 * MB)
    ) as robot:
        report = federation.sync_with(robot, site.url, site.key.public_key, timeout=60)
        assert robot.heads()[site.key.public_key_hex].seq == head, report
        assert report.pulled == head
    assert site.healthy()
    site.assert_no_traceback()


def test_a_robots_feed_of_large_envelopes_is_pushed_in_pages_the_site_takes(live, tmp_path):
    """The push side: a robot's page was bounded by count only, so a robot holding 40 MiB of map
    tiles built a 40 MiB page in memory and sent it to a site that takes bodies of 16 MiB (413),
    then halved the count of a page its byte size, not its count, had made too large, and built
    and sent again. Now every pushed page is at most `federation._wire.PUSH_BYTES`: none refused."""
    site = live("mapping")
    robot_key = Identity.generate()
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        kb.delegate(robot_key.public_key, [Role.PUBLISH])
    site.start()
    policy = TrustPolicy().with_root(site.key.public_key)
    rng = np.random.default_rng(8)
    with knowledge.open(tmp_path / "robot.db", robot_key, policy=policy) as robot:
        federation.sync_with(robot, site.url, site.key.public_key, timeout=60)  # learns its feed
        for i in range(10):
            xs, ys = np.meshgrid(np.arange(i * BLOCK, (i + 1) * BLOCK), np.arange(BLOCK))
            cells = np.stack([xs.ravel(), ys.ravel()], 1)
            values = rng.integers(0, 40, len(cells))
            robot.maps["building"].observe_many(
                cells, values, rng.random(len(cells)), palette=list(range(40))
            )
        seq = robot.heads()[robot_key.public_key_hex].seq
        report = federation.sync_with(robot, site.url, site.key.public_key, timeout=60)
        assert report.pushed == seq and report.bytes_sent > 32 * MB, report
        assert site.heads()["heads"][robot_key.public_key_hex] == seq
    metrics = httpx.get(f"{site.url}/metrics", timeout=10).text
    refused = [line for line in metrics.splitlines() if 'status="413"' in line]
    assert not refused, refused
    site.assert_no_traceback()

"""A feed of large envelopes can always be pulled: a site's page holds at most
`federation._server.PAGE_BYTES` of envelopes, however many `limit` allows.

A building-scale map written with `observe_many` is envelopes of up to 7/8 MiB of tiles each. A
site that answered a pull with up to 1,000 of them (one page, up to a GiB) sent more than any
client reads in one answer (`max(max_blob_bytes, 64 MiB)`): the client refused the answer, the
round failed, and every later round failed the same way, so the feed behind it was never pulled.
Here a real `simnet serve` holds 72 MiB of map tiles and a robot (a blob store capped at 16 MiB, so
it reads answers of up to 64 MiB) pulls them.
"""

from __future__ import annotations

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

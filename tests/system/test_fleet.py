"""Sites as real `simnet serve` processes: gossip convergence, partitions, crashes mid-sync."""

from __future__ import annotations

import signal
import threading

import federation


def skills_at(site) -> int:
    return site.status()["skills"]


def test_three_sites_converge_through_gossip(fleet, make_device, wait):
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    fleet.connect(a, b)
    fleet.connect(b, a)
    fleet.connect(b, c)
    fleet.connect(c, b)  # a line: a <-> b <-> c; news from a reaches c only through b
    fleet.trust(c, a)  # but c trusts a's writers
    for site in (a, b, c):
        site.start()
    robot = make_device(a)
    federation.sync_with(robot, a.url, a.key.public_key)
    skill = robot.skills.publish("walk", "locomotion")
    robot.maps["yard"].observe((1, 2), {"label": "gate"}, 0.9)
    assert federation.sync_with(robot, a.url, a.key.public_key).pushed == 2
    wait(lambda: skills_at(c) == 1, 60, "the skill to reach c through b")
    heads = [s.heads() for s in (a, b, c)]
    assert heads[0] == heads[1] == heads[2]
    # c's own robot reads the map written at a
    reader = make_device(c)
    reader.set_policy(
        reader.policy.with_root(a.key.public_key)
    )  # robots trust what their site trusts
    federation.sync_with(reader, c.url, c.key.public_key)
    assert reader.maps["yard"].get((1, 2)).value == {"label": "gate"}
    assert skill.id in reader.skills


def test_partitioned_site_catches_up(fleet, make_device, wait):
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    fleet.mesh()
    for site in (a, b, c):
        site.start()
    c.stop()  # partition: c is down while the others learn things
    robot = make_device(a)
    federation.sync_with(robot, a.url, a.key.public_key)
    for i in range(20):
        robot.skills.publish(f"skill-{i}", "pick")
    federation.sync_with(robot, a.url, a.key.public_key)
    wait(lambda: skills_at(b) == 20, 60, "b to learn the skills")
    c.start()  # the partition heals
    wait(lambda: skills_at(c) == 20, 60, "c to catch up")
    assert a.heads() == b.heads() == c.heads()


def test_site_killed_mid_sync_loses_nothing_acknowledged(fleet, make_device, wait, tmp_path):
    a = fleet.add("a", interval_s=3600)  # no gossip: this test drives the syncs
    a.start()
    robot = make_device(a, path=tmp_path / "robot.db")
    federation.sync_with(robot, a.url, a.key.public_key)
    for i in range(3000):
        robot.maps["floor"].observe((i, 0), i, 0.5)
    envelopes = robot.envelopes_since({}, limit=10_000)
    acknowledged: list[int] = []  # highest seq of the robot's feed in each answered (durable) page

    def push() -> None:
        with a.client(robot.identity) as client:
            for start in range(0, len(envelopes), 50):
                try:
                    answer = client.post(
                        "/v1/envelopes",
                        content=federation.encode_page(envelopes[start : start + 50]),
                        headers={"content-type": federation.PAGE_TYPE},
                    )
                except Exception:  # noqa: BLE001 - the server was killed: stop pushing
                    return
                if answer.status_code != 200:
                    return
                acknowledged.append(answer.json()["heads"][robot.identity.public_key_hex])

    pusher = threading.Thread(target=push)
    pusher.start()
    wait(
        lambda: a.heads().get(robot.identity.public_key_hex, 0) > 300,
        60,
        "the push to be under way",
    )
    a.stop(signal.SIGKILL)  # mid-sync
    pusher.join(60)
    a.start()
    held = a.heads().get(robot.identity.public_key_hex, 0)
    assert acknowledged and held >= max(acknowledged), (
        held,
        acknowledged,
    )  # everything acknowledged survived
    assert held < len(envelopes)  # the kill really came mid-sync
    report = federation.sync_with(robot, a.url, a.key.public_key, page=1000)  # and sync resumes
    assert (
        a.heads()[robot.identity.public_key_hex] == robot.heads()[robot.identity.public_key_hex].seq
    )
    assert report.refused_by_peer == 0

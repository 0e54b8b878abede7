"""Skewed clocks over real HTTP: `simnet serve` processes on loopback ports, devices with real
SQLite stores whose clocks are skewed through their clock's `physical_ms` seam, a site's clock
through `SIMNET_TEST_CLOCK_OFFSET_MS` (a test-only seam of `simnet serve`).

Envelopes stamped ahead of a site's clock are held there (durably: across a restart) and applied
when due; a device refuses to write what its site would refuse; sync reports say why envelopes
were refused; nothing is lost once the clocks agree."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

import knowledge
from federation import sync_with
from federation._serve import TEST_CLOCK_OFFSET
from knowledge import ClockSkewError, HybridClock, Identity, TrustPolicy


class Skewed:
    """A physical clock `offset` ms off real time; the test moves it (fixes it) by hand."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset


def open_device(site, path: Path, identity: Identity, clock: Skewed, policy: TrustPolicy):
    return knowledge.open(
        path,
        identity,
        policy=policy.for_device_of(site.key.public_key),
        clock=HybridClock(
            policy.max_clock_offset_ms, clock, hold_horizon_ms=policy.hold_horizon_ms
        ),
    )


def site_skills(site) -> list[str]:
    with knowledge.open(site.home / "site.db") as kb:  # read-only, beside the running server
        return sorted(s.name for s in kb.skills.list())


def test_a_site_20_s_behind_holds_a_correct_writers_envelopes_then_accepts_them(
    fleet, run_simnet, wait, monkeypatch, tmp_path
):
    site = fleet.add("behind", interval_s=3600)
    robot_key = Identity.generate()
    run_simnet(site.home, "device", "add", robot_key.public_key_hex, "--roles", "publish")
    monkeypatch.setenv(TEST_CLOCK_OFFSET, "-20000")
    site.start()
    robot = open_device(site, tmp_path / "robot.db", robot_key, Skewed(), TrustPolicy())
    root = site.key.public_key
    first = sync_with(robot, site.url, root)
    assert first.clock_offset_ms is not None and -22_000 < first.clock_offset_ms < -18_000

    for name in ("a", "b", "c"):
        robot.skills.publish(name, "pick")  # 20 s ahead of the site: held there, not refused
    report = sync_with(robot, site.url, root)
    assert (report.pushed, report.held_by_peer, report.refused_by_peer) == (0, 3, 0)
    assert report.refused_by_peer_reasons == {}
    again = sync_with(robot, site.url, root)  # sent again until due: held again, never refused
    assert (again.held_by_peer, again.refused_by_peer) == (3, 0)

    site.stop()  # held durably: a restart keeps them, and the robot need not send them again
    site.start()
    me = robot_key.public_key_hex
    wait(lambda: site.heads().get(me) == 3, 30, "the held envelopes to be applied when due")
    assert site_skills(site) == ["a", "b", "c"]
    last = sync_with(robot, site.url, root)
    assert (last.pushed, last.held_by_peer, last.refused_by_peer) == (0, 0, 0)
    robot.close()


def test_a_device_ahead_beyond_the_bound_is_refused_writes_then_recovers_with_nothing_lost(
    fleet, wait, run_simnet, tmp_path
):
    """Small bounds keep it quick: envelopes up to 1 s ahead are taken, up to 4 s ahead held."""
    bounds = TrustPolicy(max_clock_offset_ms=1_000, hold_horizon_ms=4_000)
    site = fleet.add("site", interval_s=3600)
    trust = TrustPolicy.load(site.home / "trust.toml")
    (site.home / "trust.toml").write_text(
        replace(trust, max_clock_offset_ms=1_000, hold_horizon_ms=4_000).to_toml()
    )
    robot_key, path = Identity.generate(), tmp_path / "robot.db"
    run_simnet(site.home, "device", "add", robot_key.public_key_hex, "--roles", "publish")
    site.start()
    root, me = site.key.public_key, robot_key.public_key_hex
    clock = Skewed()
    robot = open_device(site, path, robot_key, clock, bounds)
    sync_with(robot, site.url, root)
    robot.skills.publish("before", "pick")
    assert sync_with(robot, site.url, root).pushed == 1

    clock.offset = 60_000  # its clock jumps a minute ahead: it knows its site's time, so it stops
    with pytest.raises(ClockSkewError, match="fix it"):
        robot.skills.publish("never-written", "pick")

    # A reboot forgets the site's time; 8 s ahead, the robot writes before it syncs again.
    robot.close()
    clock.offset = 8_000
    robot = open_device(site, path, robot_key, clock, bounds)
    robot.skills.publish("blind-1", "pick")
    robot.skills.publish("blind-2", "pick")
    report = sync_with(robot, site.url, root)
    assert report.pushed == 0 and report.refused_by_peer == 2
    assert report.refused_by_peer_reasons == {"clock_skew": 1, "gap": 1}
    assert report.clock_offset_ms is not None and report.clock_offset_ms < -7_000
    with pytest.raises(ClockSkewError, match="fix it"):
        robot.skills.publish("still-ahead", "pick")

    clock.offset = 0  # fixed: its last timestamp stays ahead until real time catches up
    with pytest.raises(ClockSkewError, match="catches up"):
        robot.skills.publish("too-soon", "pick")

    def written() -> bool:
        try:
            robot.skills.publish("after-fix", "pick")
        except ClockSkewError:
            return False
        return True

    wait(written, 15, "the robot to write again")
    report = sync_with(robot, site.url, root)
    assert report.refused_by_peer == 0 and report.pushed + report.held_by_peer == 3
    wait(lambda: site.heads().get(me) == 4, 15, "every envelope of the robot at its site")
    assert site_skills(site) == ["after-fix", "before", "blind-1", "blind-2"]
    robot.skills.publish("on-time", "pick")
    assert sync_with(robot, site.url, root).pushed == 1
    robot.close()

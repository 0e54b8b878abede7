"""The site commands of `simnet` (federation.cli, knowledge.cli), run through the real entry point.

Commands run in-process through `knowledge.cli.run` (the console script); "with a server running"
means a real `simnet serve` process for the same home, which the commands find and go through.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import knowledge
from federation import (
    PAGE_TYPE,
    PeerConfig,
    PrivateMaps,
    SimnetAuth,
    SiteConfig,
    encode_page,
    sync_with,
)
from knowledge import Identity, Role, TrustPolicy

KEY = "ab" * 32


def ok(result):
    assert result.code == 0 and result.traceback is None, (
        result.code,
        result.out,
        result.err,
        result.traceback,
    )
    return result


def fails(result, message: str):
    """A clean failure: non-zero exit, the message on stdout/stderr, and no traceback."""
    assert result.traceback is None, result.traceback
    assert result.code != 0, (result.out, result.err)
    assert "Traceback" not in result.err + result.out
    assert message in result.err + result.out, (result.out, result.err)
    return result


@pytest.fixture
def site(tmp_path, cli):
    """A site initialised by `simnet init` (listening on any free port when served)."""
    home = tmp_path / "a"
    ok(cli(home, "init", "--name", "a", "--listen", "127.0.0.1:0"))
    return home


@dataclass
class Served:
    home: Path
    url: str
    skills: list[str]


@pytest.fixture(scope="module")
def served(tmp_path_factory, cli, module_serve_process):
    """A site with three skills and its real `simnet serve` running, shared by this module's
    tests."""
    home = tmp_path_factory.mktemp("served") / "s"
    ok(cli(home, "init", "--name", "s", "--listen", "127.0.0.1:0"))
    skills = publish(home, "walk", "grasp", "climb")
    return Served(home, module_serve_process(home).url, skills)


def site_key(home) -> Identity:
    return Identity.load(home / "site.key")


def publish(home, *names: str) -> list[str]:
    """Publish skills as the site itself, on its store (no server running)."""
    with knowledge.open(home / "site.db", site_key(home), policy=home / "trust.toml") as kb:
        return [kb.skills.publish(name, "pick").id for name in names]


def readonly(home) -> knowledge.KnowledgeBase:
    return knowledge.open(home / "site.db")


def signed(home, url: str, identity: Identity | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=url,
        auth=SimnetAuth(identity or site_key(home), site_key(home).public_key),
        timeout=30,
    )


# --- init -----------------------------------------------------------------------------------------


def test_init_creates_key_store_policy_and_config(tmp_path, cli):
    home = tmp_path / "site-a"
    result = ok(cli(home, "init", "--name", "alpha", "--listen", "127.0.0.1:7099"))
    assert {"simnet.toml", "site.db", "site.key", "trust.toml"} <= {p.name for p in home.iterdir()}
    assert stat.S_IMODE(os.stat(home / "site.key").st_mode) == 0o600
    key = site_key(home)
    assert key.public_key_hex in result.out and key.key_id in result.out
    config = SiteConfig.load(home)
    assert (config.name, config.listen, config.peers) == ("alpha", "127.0.0.1:7099", [])
    assert TrustPolicy.load(home / "trust.toml").roots == TrustPolicy().roots
    with readonly(home) as kb:
        assert kb.heads() == {}


def test_init_names_the_site_after_its_directory(tmp_path, cli):
    ok(cli(tmp_path / "depot-7", "init"))
    assert SiteConfig.load(tmp_path / "depot-7").name == "depot-7"


def test_init_refuses_a_second_init_and_keeps_the_key(site, cli):
    key = (site / "site.key").read_bytes()
    fails(cli(site, "init"), "already holds a site (simnet.toml exists)")
    assert (site / "site.key").read_bytes() == key


# --- peers ----------------------------------------------------------------------------------------


def test_peer_add_list_remove(site, cli):
    ok(cli(site, "peer", "add", "b", "http://127.0.0.1:7071/", "--key", KEY))
    assert ok(cli(site, "peer", "list", "--json")).json == [
        {"name": "b", "url": "http://127.0.0.1:7071", "key": KEY}
    ]
    assert "never synced" in ok(cli(site, "peer", "list")).out
    ok(
        cli(site, "peer", "add", "b", "http://127.0.0.1:7072", "--key", KEY)
    )  # same name: replaced, not doubled
    ok(cli(site, "peer", "add", "c", "https://c.example", "--key", "cd" * 32))
    assert [(p.name, p.url) for p in SiteConfig.load(site).peers] == [
        ("b", "http://127.0.0.1:7072"),
        ("c", "https://c.example"),
    ]
    assert "peer b removed" in ok(cli(site, "peer", "remove", "b")).out
    assert [p["name"] for p in ok(cli(site, "peer", "list", "--json")).json] == ["c"]
    ok(cli(site, "peer", "remove", "c"))
    assert ok(cli(site, "peer", "list", "--json")).json == []
    assert "no peers" in ok(cli(site, "peer", "list")).out


def test_peer_add_with_trust_writes_the_policy(site, cli):
    result = ok(
        cli(
            site,
            "peer",
            "add",
            "b",
            "http://127.0.0.1:7071",
            "--key",
            KEY,
            "--trust",
            "publish, validate",
        )
    )
    assert "trusting b for publish, validate" in result.out
    [root] = [r for r in TrustPolicy.load(site / "trust.toml").roots if r.key == bytes.fromhex(KEY)]
    assert set(root.roles) == {Role.PUBLISH, Role.VALIDATE}


def test_peer_add_asks_a_running_server_for_its_key(site, cli, served):
    result = ok(cli(site, "peer", "add", "s", served.url))
    s_key = site_key(served.home).public_key
    assert f"peer s says its key is {s_key.hex()}" in result.out
    assert SiteConfig.load(site).peers == [PeerConfig("s", served.url, s_key)]


def test_peer_add_without_key_and_no_server_fails_cleanly(site, cli):
    fails(cli(site, "peer", "add", "b", "http://127.0.0.1:9"), "pass --key")
    assert SiteConfig.load(site).peers == []


@pytest.mark.parametrize(
    "key, message", [("xyz", "is not hex"), ("abcd", "has 2 bytes, expected 32")]
)
def test_peer_add_with_a_bad_key_fails_cleanly(site, cli, key, message):
    fails(cli(site, "peer", "add", "b", "http://127.0.0.1:7071", "--key", key), message)
    assert SiteConfig.load(site).peers == []


def test_peer_add_with_an_unknown_role_fails_cleanly_and_adds_nothing(site, cli):
    policy = (site / "trust.toml").read_text()
    fails(
        cli(
            site,
            "peer",
            "add",
            "b",
            "http://127.0.0.1:7071",
            "--key",
            KEY,
            "--trust",
            "publish,admin",
        ),
        "admin",
    )
    assert SiteConfig.load(site).peers == []  # half an operation is worse than none
    assert (site / "trust.toml").read_text() == policy


def test_peer_remove_unknown(site, cli):
    fails(cli(site, "peer", "remove", "nobody"), "no peer named 'nobody'")


# --- status ---------------------------------------------------------------------------------------


def test_status_json_without_a_server(site, cli):
    ok(cli(site, "peer", "add", "b", "http://127.0.0.1:7071", "--key", KEY))
    publish(site, "walk", "run")
    data = ok(cli(site, "status", "--json")).json
    key = site_key(site)
    assert (data["name"], data["key"], data["key_id"], data["server"]) == (
        "a",
        key.public_key_hex,
        key.key_id,
        None,
    )
    assert {
        k: data[k]
        for k in (
            "skills",
            "active_skills",
            "certificates",
            "revocations",
            "equivocations",
            "writers",
            "envelopes",
        )
    } == {
        "skills": 2,
        "active_skills": 0,
        "certificates": 0,
        "revocations": 0,
        "equivocations": 0,
        "writers": 1,
        "envelopes": 2,
    }
    [peer] = data["peers"]
    assert (peer["name"], peer["url"], peer["last_success"], peer["lag_s"]) == (
        "b",
        "http://127.0.0.1:7071",
        None,
        None,
    )
    human = ok(cli(site, "status")).out
    assert (
        "site a" in human
        and "not running" in human
        and "skills 2" in human
        and "never synced" in human
    )


def test_status_says_which_feeds_private_maps_withhold_and_warns_of_the_sites_own(site, cli):
    """A peer's entry lists the feeds withheld from it (those writing a private map it may not
    read); when one is the site's own, its revocations and delegations go with it, so status warns,
    naming the peers."""
    ok(cli(site, "peer", "add", "b", "http://127.0.0.1:7071", "--key", KEY))
    ok(cli(site, "peer", "add", "c", "http://127.0.0.1:7072", "--key", "cd" * 32))
    config = SiteConfig.load(site)
    config.private.append(PrivateMaps(("floor-3",), (bytes.fromhex("cd" * 32),)))
    config.save()
    robot = Identity.generate()
    ok(cli(site, "device", "add", robot.public_key_hex))
    with knowledge.open(
        ":memory:", robot, policy=TrustPolicy().with_root(site_key(site).public_key)
    ) as r:
        with readonly(site) as kb:
            r.ingest(kb.envelopes_since({}, limit=1000))
        r.maps["floor-3"].observe((0, 0), 1, 0.5)
        with knowledge.open(site / "site.db", site_key(site), policy=site / "trust.toml") as kb:
            kb.ingest(r.envelopes_since(kb.heads(), limit=1000))
    data = ok(cli(site, "status", "--json")).json
    assert [(p["name"], p["withheld"]) for p in data["peers"]] == [
        ("b", [robot.public_key_hex]),
        ("c", []),
    ]
    assert data["own_feed_withheld_from"] == []
    human = ok(cli(site, "status")).out
    assert "1 feeds withheld (private maps)" in human and "WARNING" not in human

    with knowledge.open(site / "site.db", site_key(site), policy=site / "trust.toml") as kb:
        kb.maps["floor-3"].observe((1, 0), 1, 0.5)
    data = ok(cli(site, "status", "--json")).json
    assert data["peers"][0]["withheld"] == sorted(
        [robot.public_key_hex, site_key(site).public_key_hex]
    )
    assert data["own_feed_withheld_from"] == ["b"]
    assert "WARNING: this site's own key wrote a private map" in ok(cli(site, "status")).out


def test_status_json_names_the_running_server(served, cli):
    data = ok(cli(served.home, "status", "--json")).json
    with readonly(served.home) as kb:
        held = len(kb.skills.list(include_withdrawn=True))
    assert data["server"] == served.url and data["skills"] == held >= 3
    assert served.url in ok(cli(served.home, "status")).out


# --- skills ---------------------------------------------------------------------------------------


def test_skills_list_and_show_json(site, cli):
    walk, grasp = publish(site, "walk", "grasp")
    rows = ok(cli(site, "skills", "list", "--json")).json
    assert {r["id"]: (r["name"], r["task"], r["active"], r["revoked"]) for r in rows} == {
        walk: ("walk", "pick", False, False),
        grasp: ("grasp", "pick", False, False),
    }
    assert ok(cli(site, "skills", "list", "--json", "--task", "none")).json == []
    assert ok(cli(site, "skills", "list", "--json", "--active")).json == []
    human = ok(cli(site, "skills", "list")).out
    assert walk[:16] in human and "inactive" in human
    shown = ok(cli(site, "skills", "show", walk[:12].upper(), "--json")).json  # a prefix, any case
    assert shown["skill"]["id"] == walk and shown["skill"]["name"] == "walk"
    assert (shown["active"], shown["revoked"], shown["certificates"]) == (False, False, [])
    assert shown["reasons"] and shown["counts"]
    assert f"id        {walk}" in ok(cli(site, "skills", "show", walk)).out


def two_skills_with_a_common_prefix(home) -> tuple[str, list[str]]:
    ids: list[str] = []
    while True:  # at most 17 skills before two share their first hex digit
        ids += publish(home, f"skill-{len(ids)}")
        firsts = [i[0] for i in ids]
        for digit in firsts:
            if firsts.count(digit) >= 2:
                return digit, [i for i in ids if i.startswith(digit)]


def test_skills_show_ambiguous_or_unknown_prefix_fails_cleanly(site, cli):
    digit, matching = two_skills_with_a_common_prefix(site)
    fails(
        cli(site, "skills", "show", digit),
        f"{len(matching)} skills match '{digit}'; give more of the id",
    )
    fails(cli(site, "skills", "show", "zz"), "0 skills match 'zz'")


def test_skills_commands_without_a_site_fail_cleanly(tmp_path, cli):
    fails(cli(tmp_path / "nothing", "skills", "list"), "no knowledge base in")


# --- revoke ---------------------------------------------------------------------------------------


def test_revoke_without_a_server_writes_the_local_store(site, cli):
    walk, other = publish(site, "walk", "other")
    assert f"revoked {walk}" in ok(cli(site, "revoke", walk[:10], "--reason", "falls over")).out
    with readonly(site) as kb:
        assert kb.is_revoked(walk) and not kb.is_revoked(other)
    assert ok(cli(site, "status", "--json")).json["revocations"] == 1


def test_revoke_ambiguous_prefix_revokes_nothing(site, cli):
    digit, matching = two_skills_with_a_common_prefix(site)
    fails(cli(site, "revoke", digit), f"{len(matching)} skills match")
    fails(cli(site, "revoke", "zz"), "0 skills match")
    with readonly(site) as kb:
        assert not any(kb.is_revoked(s) for s in matching)


def test_revoke_with_a_server_goes_through_the_admin_endpoint(served, cli):
    walk = served.skills[0]
    me = site_key(served.home).public_key_hex
    with signed(served.home, served.url) as client:
        before = (
            client.get("/v1/heads").json()["heads"][me],
            client.get("/v1/status").json()["revocations"],
        )
    ok(cli(served.home, "revoke", walk[:10], "--reason", "falls over"))
    with signed(served.home, served.url) as client:
        after = (
            client.get("/v1/heads").json()["heads"][me],
            client.get("/v1/status").json()["revocations"],
        )
    assert after == (
        before[0] + 1,
        before[1] + 1,
    )  # one envelope, written by the server (the store's one writer)
    with readonly(served.home) as kb:
        assert kb.is_revoked(walk)


# --- devices --------------------------------------------------------------------------------------


def test_device_add_and_revoke_without_a_server(site, cli):
    device = Identity.generate()
    out = ok(cli(site, "device", "add", device.public_key_hex, "--roles", "publish,validate")).out
    assert f"device {device.key_id} may now publish, validate" in out
    with readonly(site) as kb:
        assert kb.roles_of(device.public_key) == frozenset({Role.PUBLISH, Role.VALIDATE})
    robot = knowledge.open(
        ":memory:", device, policy=TrustPolicy().for_device_of(site_key(site).public_key)
    )
    with readonly(site) as kb:
        robot.ingest(
            kb.envelopes_since(robot.heads(), limit=10_000)
        )  # the robot learns its delegation
        robot.learn_site_heads(kb.heads())  # ... and that the site holds nothing of its own feed
    for i in range(4):
        robot.skills.publish(f"s{i}", "pick")
    # A revocation pins the kept prefix by hash: the site must hold it first.
    fails(
        cli(site, "device", "revoke", device.public_key_hex, "--last-seq", "2"),
        "does not hold envelope 2",
    )
    with knowledge.open(site / "site.db", site_key(site), policy=site / "trust.toml") as kb:
        kb.ingest(robot.envelopes_since(kb.heads(), limit=2))
    assert (
        "revoked after seq 2"
        in ok(cli(site, "device", "revoke", device.public_key_hex, "--last-seq", "2")).out
    )
    with knowledge.open(site / "site.db", site_key(site), policy=site / "trust.toml") as kb:
        report = kb.ingest(robot.envelopes_since(kb.heads(), limit=10_000))
    robot.close()
    assert len(report.accepted) == 0
    assert [r.reason for r in report.rejected] == ["revoked_writer", "revoked_writer"]


def test_a_device_added_for_a_while_loses_its_grant_when_it_ends(site, cli):
    """`--expires-in` ends the grant by the site's clock; the output says until when. A duration
    that is none is refused before anything is written."""
    with readonly(site) as kb:
        heads = kb.heads()
    for wrong in ("8", "h", "-3h", "0s", "2w", "1e400d", "nans"):
        fails(cli(site, "device", "add", KEY, "--expires-in", wrong), "is no duration")
    with readonly(site) as kb:
        assert kb.heads() == heads
    device = Identity.generate()
    out = ok(cli(site, "device", "add", device.public_key_hex, "--expires-in", "1s")).out
    assert f"device {device.key_id} may now publish until " in out and " UTC" in out
    with readonly(site) as kb:
        assert kb.current_roles(device.public_key) == {Role.PUBLISH}
    time.sleep(1.2)
    with readonly(site) as kb:
        assert kb.current_roles(device.public_key) == frozenset()


def test_device_add_refuses_the_sites_own_key_and_says_what_a_roots_delegation_does(site, cli):
    """A delegation naming the site's own key would count nowhere: refused, nothing written. One
    naming a root of the site's policy counts only where that key is no root: said so, not "may
    now"."""
    with readonly(site) as kb:
        heads = kb.heads()
    fails(
        cli(site, "device", "add", site_key(site).public_key_hex),
        "cannot delegate to its own key",
    )
    with readonly(site) as kb:
        assert kb.heads() == heads
    ok(cli(site, "peer", "add", "b", "http://127.0.0.1:7071", "--key", KEY, "--trust", "publish"))
    out = ok(cli(site, "device", "add", KEY, "--roles", "publish,validate")).out
    assert "a root of this site's trust policy" in out and "may now" not in out
    with readonly(site) as kb:  # the root's roles here stay the policy's
        assert kb.current_roles(bytes.fromhex(KEY)) == frozenset({Role.PUBLISH})


def test_a_device_added_for_a_while_through_the_server_loses_its_grant(served, cli):
    """Through the running server, `--expires-in` reaches the admin endpoint, which refuses a
    lasting that is no number of seconds > 0 (400, nothing written)."""
    device = Identity.generate()
    with signed(served.home, served.url) as client:
        heads = client.get("/v1/heads").json()
        for wrong in (0, -1, "8h", True, [60]):
            body = {"device": device.public_key_hex, "roles": ["publish"], "lasting_s": wrong}
            refused = client.post("/v1/admin/delegate", json=body)
            assert refused.status_code == 400 and "lasting_s" in refused.json()["detail"]
        assert client.get("/v1/heads").json() == heads
    ok(cli(served.home, "device", "add", device.public_key_hex, "--expires-in", "2s"))
    with signed(served.home, served.url, device) as as_device:
        assert as_device.get("/v1/heads").status_code == 200
        time.sleep(2.2)
        refused = as_device.get("/v1/heads")
        assert refused.status_code == 403 and "expired" in refused.json()["detail"]


def test_device_add_and_revoke_with_a_server(served, cli):
    site = served.home
    device = Identity.generate()
    with signed(site, served.url, device) as as_device:
        assert as_device.get("/v1/heads").status_code == 403  # unknown to the site
        ok(cli(site, "device", "add", device.public_key_hex))
        assert as_device.get("/v1/heads").status_code == 200  # the server holds the delegation
    robot = knowledge.open(
        ":memory:", device, policy=TrustPolicy().with_root(site_key(site).public_key)
    )
    sync_with(robot, served.url, site_key(site).public_key)
    robot.skills.publish("first", "pick")
    assert sync_with(robot, served.url, site_key(site).public_key).pushed == 1
    ok(cli(site, "device", "revoke", device.public_key_hex, "--last-seq", "1", "--reason", "lost"))
    robot.skills.publish("second", "pick")
    with signed(site, served.url) as client:  # offered by the site's own key: refused on its merits
        answer = client.post(
            "/v1/envelopes",
            content=encode_page(robot.envelopes_since({}, limit=100)),
            headers={"content-type": PAGE_TYPE},
        ).json()
    assert answer["accepted"] == 0 and [r["reason"] for r in answer["rejected"]] == [
        "revoked_writer"
    ]
    robot.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["device", "add", "nothex"], "is not hex"),
        (["device", "add", KEY, "--roles", "publish,fly"], "fly"),
        (["device", "revoke", "nothex", "--last-seq", "1"], "is not hex"),
        (["device", "revoke", KEY], "--last-seq"),
        (
            ["device", "revoke", KEY, "--last-seq", "-1"],
            "-1",
        ),  # a seq is never negative: not a record to sign
    ],
)
def test_device_bad_input_fails_cleanly(site, cli, args, message):
    with readonly(site) as kb:
        heads_before = kb.heads()
    fails(cli(site, *args), message)
    with readonly(site) as kb:
        assert kb.heads() == heads_before


# --- sync -----------------------------------------------------------------------------------------


def test_sync_unknown_peer_fails_cleanly(site, cli):
    fails(cli(site, "sync", "nobody"), "no peer named 'nobody'")


def test_sync_unknown_peer_through_the_server_fails_cleanly(served, cli):
    fails(cli(served.home, "sync", "nobody"), "nobody")


def test_sync_with_and_without_a_server(tmp_path, site, cli, serve_process):
    other = tmp_path / "b"
    ok(cli(other, "init", "--name", "b", "--listen", "127.0.0.1:0"))
    [skill] = publish(other, "from-b")
    b_key = site_key(other).public_key_hex
    ok(
        cli(
            other,
            "peer",
            "add",
            "a",
            "http://127.0.0.1:9",
            "--key",
            site_key(site).public_key_hex,
            "--trust",
            "publish",
        )
    )  # b lets a read
    b = serve_process(other)
    ok(cli(site, "peer", "add", "b", b.url, "--key", b_key, "--trust", "publish"))

    [report] = ok(
        cli(site, "sync", "--json")
    ).json  # no server at a: the command opens a's store itself
    assert (report["peer"], report["ok"], report["pulled"]) == ("b", True, 1)
    with readonly(site) as kb:
        assert skill in {s.id for s in kb.skills.list()}

    serve_process(site)
    [report] = ok(cli(site, "sync", "b", "--json")).json  # through a's running server
    assert (report["peer"], report["ok"], report["pulled"]) == ("b", True, 0)
    status = ok(cli(site, "status", "--json")).json
    [peer] = status["peers"]
    assert peer["last_success"] is not None and peer["lag_s"] >= 0 and status["skills"] == 1
    assert "pulled" in ok(cli(site, "sync")).out


def test_sync_failure_exits_non_zero(site, cli):
    ok(cli(site, "peer", "add", "b", "http://127.0.0.1:9", "--key", KEY))
    result = cli(site, "sync", "--json")
    assert result.code == 1 and result.traceback is None
    [report] = result.json
    assert report["ok"] is False and "cannot reach" in report["error"]


def test_serve_on_a_port_in_use_is_one_line(tmp_path, cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home = tmp_path / "s"
        ok(cli(home, "init", "--name", "s", "--listen", f"127.0.0.1:{port}"))
        fails(cli(home, "serve"), f"cannot listen on 127.0.0.1:{port}")
    with knowledge.open(home / "site.db", site_key(home)):  # the failed start let go of the store
        pass


# --- serve --detach, stop, key -------------------------------------------------------------------


def test_serve_detach_returns_once_the_server_answers_and_stop_stops_it(site, cli):
    out = ok(cli(site, "serve", "--detach")).out
    served = json.loads((site / "serve.json").read_text())
    try:
        assert served["url"] in out and f"pid {served['pid']}" in out
        assert httpx.get(f"{served['url']}/v1/health", timeout=5).status_code == 200
        assert ok(cli(site, "status", "--json")).json["server"] == served["url"]
        fails(cli(site, "serve", "--detach"), "a server already runs")
    finally:
        stopped = cli(site, "stop")
    ok(stopped)
    assert f"pid {served['pid']}" in stopped.out and not (site / "serve.json").exists()
    assert exited(served["pid"])
    with knowledge.open(site / "site.db", site_key(site)):  # it let go of the store
        pass
    assert "serving on" in (site / "serve.log").read_text()  # its output went to the log
    fails(cli(site, "stop"), "no server is running")


def exited(pid: int) -> bool:
    """Gone, or a zombie: the detached server is a child of this test process, which reaps it
    late (from a shell, `simnet serve --detach` exits at once and the server is init's child)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_serve_detach_says_why_the_server_did_not_start(tmp_path, cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home = tmp_path / "s"
        ok(cli(home, "init", "--name", "s", "--listen", f"127.0.0.1:{port}"))
        fails(cli(home, "serve", "--detach"), f"cannot listen on 127.0.0.1:{port}")
    assert not (home / "serve.json").exists()


def test_serve_detach_in_a_folder_without_a_site_fails_before_starting(tmp_path, cli):
    fails(cli(tmp_path / "nowhere", "serve", "--detach"), "simnet.toml")
    assert not (tmp_path / "nowhere" / "serve.log").exists()


def test_key_prints_the_public_key_peers_add(site, cli):
    assert ok(cli(site, "key")).out.strip() == site_key(site).public_key_hex

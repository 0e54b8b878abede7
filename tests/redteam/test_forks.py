"""Class 3 over the wire: forks that used to stay hidden are found by sites talking over real HTTP.

A writer that two sites trust signs two different envelopes at one seq and gives one to each site.
Their heads used to compare seqs only, so they kept different views for ever. Now heads carry
hashes: the sites find the fork on their first sync, keep both envelopes as evidence, stop taking
the writer, and show the same knowledge. A robot re-flashed with its old key and an empty store
learns its feed back from its site before it writes, instead of forking it. A site that took a feed
from a checkpoint whose state is not the writer's history finds out from a peer holding the history,
and an honest checkpoint is checked once.
"""

from __future__ import annotations

import signal

import pytest

import federation
import knowledge
from federation._wire import PAGE_TYPE, decode_page, encode_page
from knowledge import Identity, Kind, NotAuthorizedError, Role, TrustPolicy
from knowledge._envelope import seal

from ..conftest import simnet_here
from .conftest import assert_refused


def simnet(site, *args: str) -> str:
    """`simnet --home SITE ARGS` through the real entry point in this process
    (tests/conftest.simnet_here): its stdout, or AssertionError with its stderr if it fails. The
    command reaches the running sites over HTTP as a `simnet` process would; what these tests are
    about is between the sites, which stay separate `simnet serve` processes."""
    return simnet_here(site.home, *args)


def trust(site, key: bytes, roles=(Role.PUBLISH,)) -> None:
    path = site.home / "trust.toml"
    path.write_text(TrustPolicy.load(path).with_root(key, roles, name=key.hex()[:8]).to_toml())


def test_two_sites_holding_different_envelopes_at_one_seq_find_the_fork_on_their_first_sync(
    live, tmp_path
):
    writer = Identity.generate()
    a, b = live("a"), live("b")
    for site, other in ((a, b), (b, a)):
        trust(site, writer.public_key)
        trust(
            site, other.key.public_key
        )  # before start: a running site reads its policy when it opens
    a.start(), b.start()
    simnet(a, "peer", "add", "b", b.url, "--key", b.key.public_key_hex)
    simnet(b, "peer", "add", "a", a.url, "--key", a.key.public_key_hex)

    first = knowledge.open(tmp_path / "first.db", writer)  # the writer's two stores, one key
    first.skills.publish("common", "pick")
    second = knowledge.open(tmp_path / "second.db", writer)
    second.ingest(first.envelopes_since({}))
    second.learn_peer_heads(first.heads())  # a forger's store takes its twin's word
    first.skills.publish("branch-a", "pick")
    second.skills.publish("branch-b", "pick")
    federation.sync_with(first, a.url, a.key.public_key)
    federation.sync_with(second, b.url, b.key.public_key)
    heads_a, heads_b = a.heads(), b.heads()
    assert heads_a["heads"][writer.public_key_hex] == heads_b["heads"][writer.public_key_hex] == 2
    assert heads_a["hashes"][writer.public_key_hex] != heads_b["hashes"][writer.public_key_hex]

    simnet(a, "sync", "b")  # equal seqs: only the hashes tell
    simnet(b, "sync", "a")
    for site in (a, b):
        heads = site.heads()
        assert heads["equivocators"] == [writer.public_key_hex]
        assert heads["heads"][writer.public_key_hex] == 1  # the writer's feed stops before the fork
        assert site.status()["skills"] == 1
        site.assert_no_traceback()
    first.close(), second.close()


def test_a_reflashed_robot_learns_its_feed_back_from_its_site_before_it_writes(live, tmp_path):
    site = live("site").start()
    robot = Identity.generate()
    simnet(site, "device", "add", robot.public_key_hex, "--roles", "publish")
    policy = TrustPolicy().for_device_of(site.key.public_key)
    with knowledge.open(tmp_path / "old.db", robot, policy=policy) as old:
        with pytest.raises(NotAuthorizedError, match="sync with its site first"):
            old.skills.publish("before any sync", "pick")
        federation.sync_with(old, site.url, site.key.public_key)
        for i in range(3):
            old.skills.publish(f"skill-{i}", "pick")
        assert federation.sync_with(old, site.url, site.key.public_key).pushed == 3

    with knowledge.open(
        tmp_path / "reflashed.db", robot, policy=policy
    ) as new:  # same key, empty store
        with pytest.raises(NotAuthorizedError, match="sync with its site first"):
            new.skills.publish("would fork", "pick")
        report = federation.sync_with(
            new, site.url, site.key.public_key, page=2
        )  # small pages: several rounds
        assert report.pulled >= 3
        assert new.heads()[robot.public_key_hex].seq == 3
        new.skills.publish("after restore", "pick")
        assert federation.sync_with(new, site.url, site.key.public_key).pushed == 1
    heads = site.heads()
    assert heads["heads"][robot.public_key_hex] == 4 and heads["equivocators"] == []
    assert site.status()["skills"] == 4
    site.assert_no_traceback()


def test_a_site_root_reinstalled_with_its_old_key_and_an_empty_store_learns_its_feed_back(live):
    """...from every configured peer: one that never received the feed (c, added later) shows
    none of it, and must not let the root start again at seq 1."""
    a, b, c = live("a"), live("b"), live("c")
    for site in (a, b, c):
        for other in (a, b, c):
            if other is not site:
                trust(site, other.key.public_key)
    for site in (a, b, c):
        site.start()
    simnet(a, "peer", "add", "b", b.url, "--key", b.key.public_key_hex)
    simnet(b, "peer", "add", "a", a.url, "--key", a.key.public_key_hex)
    for _ in range(3):
        simnet(a, "device", "add", Identity.generate().public_key_hex, "--roles", "publish")
    simnet(a, "sync")
    assert b.heads()["heads"][a.key.public_key_hex] == 3
    simnet(a, "peer", "add", "c", c.url, "--key", c.key.public_key_hex)  # a peer added since
    simnet(c, "peer", "add", "a", a.url, "--key", a.key.public_key_hex)

    a.stop()  # the root's store is lost; its key is restored; `simnet serve` makes a new store
    for path in a.home.glob("site.db*"):
        path.unlink()
    a.start()
    assert a.key.public_key_hex not in a.heads()["heads"]

    def refused(waiting_for: str) -> None:
        with pytest.raises(AssertionError) as failed:  # it fails (exits non-zero), and says why
            simnet(a, "device", "add", Identity.generate().public_key_hex)
        stderr = str(failed.value)
        assert "Traceback" not in stderr, stderr
        assert "sync with every peer first" in stderr and "403" in stderr, stderr
        assert waiting_for in stderr, stderr

    refused(waiting_for=b.key.public_key_hex[:16])
    simnet(a, "sync", "c")  # c never held the feed: it shows none, which proves nothing
    assert a.key.public_key_hex not in a.heads()["heads"]  # nothing written: no seq 1 to fork
    refused(waiting_for=b.key.public_key_hex[:16])

    simnet(a, "sync", "b")  # its own feed comes back, and with every peer heard, the right to write
    assert a.heads()["heads"][a.key.public_key_hex] == 3
    simnet(a, "device", "add", Identity.generate().public_key_hex, "--roles", "publish")
    assert a.heads()["heads"][a.key.public_key_hex] == 4
    simnet(a, "sync")
    for site in (a, b, c):
        heads = site.heads()
        assert heads["heads"][a.key.public_key_hex] == 4 and heads["equivocators"] == []
        site.assert_no_traceback()


def forged_and_real(tmp_path, writer_key):
    """The writer's history in one store, and its checkpoint over another state naming the real
    head: a map cell the history never wrote."""
    real = knowledge.open(tmp_path / "real.db", writer_key)
    real.skills.publish("real", "pick")
    real.maps["m"].observe((1, 1), "mug", confidence=0.5)
    twin = knowledge.open(tmp_path / "twin.db", writer_key)
    twin.ingest(real.envelopes_since({}))
    twin.learn_peer_heads(real.heads())  # a forger's store takes its twin's word
    twin.maps["m"].observe((1, 1), "not a mug", confidence=0.5)
    feed = twin._replica.feeds[writer_key.public_key]
    head = real.heads()[writer_key.public_key_hex]
    forged = seal(
        writer_key, Kind.CHECKPOINT, head.seq, bytes.fromhex(head.hash), feed.hlc, feed.state()
    )
    twin.close()
    return real, forged


def push(site, identity, envelopes) -> dict:
    with site.client(identity) as client:
        answer = client.post(
            "/v1/envelopes", content=encode_page(envelopes), headers={"content-type": PAGE_TYPE}
        )
    return answer.raise_for_status().json()


def test_a_site_bootstrapped_from_a_forged_checkpoint_finds_the_fork_and_every_site_learns_it(
    live, tmp_path
):
    """s and t take the writer's feed from its forged checkpoint; p holds the real history; t
    syncs only with s."""
    writer = Identity.generate()
    s, p, t = live("s"), live("p"), live("t")
    for site in (s, p, t):
        trust(site, writer.public_key)
        for other in (s, p, t):
            if other is not site:
                trust(site, other.key.public_key)
        site.start()
    simnet(s, "peer", "add", "p", p.url, "--key", p.key.public_key_hex)
    simnet(t, "peer", "add", "s", s.url, "--key", s.key.public_key_hex)
    real, forged = forged_and_real(tmp_path, writer)
    federation.sync_with(real, p.url, p.key.public_key)  # the honest holder gets the history
    for site in (s, t):
        assert push(site, writer, [forged.raw])["accepted"] == 1  # bootstrapped from the forgery
    hashes = {site: site.heads()["hashes"][writer.public_key_hex] for site in (s, p, t)}
    assert len(set(hashes.values())) == 1  # the same head everywhere: nothing in heads tells

    simnet(s, "sync", "p")  # s names its unchecked checkpoint; p sends the history; s pushes back
    simnet(t, "sync", "s")  # s sends t the history before the fork and the envelope at it
    for site in (s, p, t):
        heads = site.heads()
        assert heads["equivocators"] == [writer.public_key_hex]
        assert heads["heads"][writer.public_key_hex] == 1, (site.home.name, heads)
        site.assert_no_traceback()
    for site in (s, t):
        site.stop()
        with knowledge.open(site.home / "site.db") as view:  # read-only: what the site shows
            assert view.maps["m"].get((1, 1)) is None  # neither the forged cell nor the real one
            assert [x.name for x in view.skills.list()] == ["real"]
            assert view.unchecked_checkpoints() == {}
    real.close()


def test_an_honest_checkpoint_is_checked_over_the_wire_once_and_not_asked_about_again(
    live, tmp_path
):
    writer, newcomer = Identity.generate(), Identity.generate()
    p = live("p")
    trust(p, writer.public_key)
    trust(p, newcomer.public_key)  # a site that may read from p
    p.start()
    real = knowledge.open(tmp_path / "real.db", writer)
    for i in range(5):
        real.skills.publish(f"skill-{i}", "pick")
    federation.sync_with(real, p.url, p.key.public_key)
    policy = TrustPolicy().with_root(writer.public_key).with_root(p.key.public_key)
    with knowledge.open(tmp_path / "new.db", newcomer, policy=policy) as site:
        site.ingest([real.checkpoint().raw])
        assert site.unchecked_checkpoints() == {writer.public_key_hex: (5, 0)}
        first = federation.sync_with(site, p.url, p.key.public_key, page=2)
        assert first.verified == 5 and first.pulled == 0 and not first.rejected
        assert site.unchecked_checkpoints() == {}
        assert len(site.skills.list()) == 5 and site.equivocations() == []
        again = federation.sync_with(site, p.url, p.key.public_key)
        assert again.verified == again.pulled == 0
        assert again.bytes_received < first.bytes_received / 4  # nothing below the checkpoint
    assert p.heads()["equivocators"] == []
    p.assert_no_traceback()
    real.close()


def test_a_sync_naming_unchecked_checkpoints_badly_is_refused_with_400(live):
    p = live("p").start()
    with p.client() as client:
        for unchecked, phrase in (
            ([1, 2], "'unchecked' must be an object"),
            ({"zz": {"seq": 2}}, "is not 64 lowercase hex digits"),
            ({"ab" * 32: {"seq": 2, "after": 2}}, "0 <= k < n"),
            ({"ab" * 32: {"seq": True}}, "0 <= k < n"),
            ({"ab" * 32: 5}, "0 <= k < n"),
        ):
            answer = client.post("/v1/sync", json={"heads": {}, "unchecked": unchecked})
            assert_refused(answer, 400, "bad_request", phrase)
        answer = client.post("/v1/sync", json={"heads": {}, "unchecked": {"ab" * 32: {"seq": 9}}})
        assert answer.status_code == 200  # a checkpoint nobody here holds the history of
    p.assert_no_traceback()


def _private_site(live, reader: Identity, trusted: tuple[Identity, ...] = ()):
    """A site whose map "vault" only `reader` may receive, trusting `trusted` (before it starts:
    a running site reads its policy when it opens)."""
    site = live("private")
    for identity in trusted:
        trust(site, identity.public_key)
    config = site.config
    config.private = [federation.PrivateMaps(("vault",), (reader.public_key,))]
    config.save()
    return site.start()


def _served(site, identity: Identity) -> bytes:
    """Every byte of every envelope `site` serves `identity` asking from nothing, evidence of
    forks included."""
    with site.client(identity) as client:
        answer = client.post("/v1/sync", json={"heads": {}, "limit": 1000}).raise_for_status()
    return b"".join(decode_page(answer.content, max_count=1000, max_envelope_bytes=1 << 26))


def test_a_reflashed_robot_writing_a_private_map_gets_its_own_feed_back(live, tmp_path):
    """The map's read rule withholds its writers' feeds from everyone but its readers, and the
    writer is no reader: it used to be withheld from itself, so a re-flashed robot wrote seq 1
    again and forked its own feed."""
    reader, robot = Identity.generate(), Identity.generate()
    site = _private_site(live, reader)
    simnet(site, "device", "add", robot.public_key_hex, "--roles", "publish")
    policy = TrustPolicy().for_device_of(site.key.public_key)
    with knowledge.open(tmp_path / "old.db", robot, policy=policy) as old:
        federation.sync_with(old, site.url, site.key.public_key)
        old.maps["vault"].observe((1, 1), {"code": "SECRET-ONE"}, confidence=0.9)
        assert federation.sync_with(old, site.url, site.key.public_key).pushed == 1
    with knowledge.open(tmp_path / "new.db", robot, policy=policy) as new:
        federation.sync_with(new, site.url, site.key.public_key)
        assert new.heads()[robot.public_key_hex].seq == 1
        new.maps["vault"].observe((2, 2), {"code": "SECRET-TWO"}, confidence=0.9)
        assert federation.sync_with(new, site.url, site.key.public_key).pushed == 1
    with site.client(robot) as client:  # (the site's own key is no reader of the vault)
        heads = client.get("/v1/heads").raise_for_status().json()
    assert heads["heads"][robot.public_key_hex] == 2 and heads["equivocators"] == []


def test_a_private_maps_writer_that_forks_its_feed_leaks_no_cell_as_evidence(live, tmp_path):
    """A fork is kept as evidence and shown to every peer, but the evidence of a private map's
    writer is its feed: it goes to the map's readers only. Before, cutting the feed at the fork
    forgot that it wrote the map, and the evidence carried both branches' cells to a peer that may
    not read it."""
    reader, robot, peer = Identity.generate(), Identity.generate(), Identity.generate()
    site = _private_site(live, reader, trusted=(peer, reader))  # the peer is no reader
    simnet(site, "device", "add", robot.public_key_hex, "--roles", "publish")
    policy = TrustPolicy().for_device_of(site.key.public_key)
    one = knowledge.open(tmp_path / "one.db", robot, policy=policy)
    two = knowledge.open(tmp_path / "two.db", robot, policy=policy)
    for store, secret in ((one, "SECRET-ONE"), (two, "SECRET-TWO")):
        federation.sync_with(store, site.url, site.key.public_key)  # both see an empty feed
        store.maps["vault"].observe((1, 1), {"code": secret}, confidence=0.9)
    for store in (one, two):  # each one's seq 1, pushed as a forger would: without pulling
        answer = push(site, robot, store.envelopes_since({}))
        store.close()
    assert answer["equivocators"] == [robot.public_key_hex]  # as the robot is shown its feed

    assert b"SECRET" not in _served(site, peer)
    site.stop(signal.SIGKILL)  # and after a crash, rebuilt from the store
    site.start()
    assert b"SECRET" not in _served(site, peer)
    served = _served(site, reader)
    assert b"SECRET-ONE" in served and b"SECRET-TWO" in served  # the evidence, to its reader
    site.assert_no_traceback()

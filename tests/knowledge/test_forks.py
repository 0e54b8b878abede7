"""Forks are found, not hidden: heads carry hashes, checkpoints are checked against the history they
claim (where it is held, and where a feed was taken from a checkpoint, once a peer sends the
history), and a writer that lost its store learns its own feed back before it writes (issue 13,
class 3).

Each test plays the forking writer with the public API, then lets honest sites exchange heads and
envelopes exactly as the federation does (`heads` then `envelopes_since` then `ingest`).
"""

from __future__ import annotations

import pytest

import knowledge
from knowledge import Identity, Kind, NotAuthorizedError, TrustPolicy
from knowledge._envelope import decode, seal


def open_site(identity=None, *, trust=(), path=":memory:", policy=None):
    policy = policy or TrustPolicy()
    for key in trust:
        policy = policy.with_root(key)
    return knowledge.open(path, identity or Identity.generate(), policy=policy)


def sync(a, b):
    """Both directions, a few rounds, as gossip does: each side sends what the other's heads
    lack."""
    for _ in range(3):
        b.ingest(a.envelopes_since(b.heads(), limit=10_000, unchecked=b.unchecked_checkpoints()))
        a.ingest(b.envelopes_since(a.heads(), limit=10_000, unchecked=a.unchecked_checkpoints()))
        for device, site in (
            (a, b),
            (b, a),
        ):  # a device takes its own site's heads as the word on its feed
            if device.policy.device_of == site.identity.public_key:
                device.learn_site_heads(site.heads())


def forked_writer(tmp_path):
    """A writer whose key signs two different envelopes 2: one store per history."""
    key = Identity.generate()
    first = open_site(key, path=tmp_path / "first.db")
    first.skills.publish("common", "pick")
    shared = first.envelopes_since({})
    second = open_site(key, path=tmp_path / "second.db")
    second.ingest(shared)
    second.learn_peer_heads(first.heads())  # a forger's store: it takes its twin's word
    first.skills.publish("branch-a", "pick")
    second.skills.publish("branch-b", "pick")
    return key, first, second


def test_sites_holding_different_envelopes_at_one_seq_both_find_the_fork(tmp_path):
    key, first, second = forked_writer(tmp_path)
    one, two = open_site(trust=[key.public_key]), open_site(trust=[key.public_key])
    one.ingest(first.envelopes_since({}))
    two.ingest(second.envelopes_since({}))
    assert one.heads()[key.public_key_hex].seq == two.heads()[key.public_key_hex].seq == 2
    sync(one, two)  # equal seqs: only the hashes differ
    for site in (one, two):
        assert site.equivocations() == [(key.public_key_hex, 2)]
        assert site.heads()[key.public_key_hex].equivocated_at == 2
        assert [s.name for s in site.skills.list()] == ["common"]
    assert one.snapshot() == two.snapshot()
    third = open_site(
        trust=[key.public_key]
    )  # a site that saw neither branch learns of the fork too
    sync(one, third)
    assert third.equivocations() == [(key.public_key_hex, 2)]


def test_a_site_behind_on_a_forked_feed_finds_the_fork(tmp_path):
    key, first, second = forked_writer(tmp_path)
    second.skills.publish("branch-b-more", "pick")
    one, two = open_site(trust=[key.public_key]), open_site(trust=[key.public_key])
    one.ingest(first.envelopes_since({}))
    two.ingest(second.envelopes_since({}))
    sync(
        one, two
    )  # one holds seq 2, two seq 3: two's answer to one's head must show its envelope 2
    for site in (one, two):
        assert site.equivocations() == [(key.public_key_hex, 2)]


def test_a_checkpoint_whose_state_is_not_its_history_is_an_equivocation(tmp_path):
    key = Identity.generate()
    writer = open_site(key)
    writer.skills.publish("real", "pick")
    writer.maps["m"].observe((1, 1), "mug", confidence=0.5)
    honest = open_site(trust=[key.public_key])
    honest.ingest(writer.envelopes_since({}))
    forger = open_site(key)  # the writer's key in a second store: its feed, then some other state
    forger.ingest(writer.envelopes_since({}))
    forger.learn_peer_heads(writer.heads())
    forger.maps["m"].observe((1, 1), "not a mug", confidence=0.5)
    other_state = forger._replica.feeds[key.public_key].state()
    head = writer.heads()[key.public_key_hex]
    forged = seal(
        key,
        Kind.CHECKPOINT,
        head.seq,
        bytes.fromhex(head.hash),
        writer._replica.feeds[key.public_key].hlc,
        other_state,
    )
    report = honest.ingest([forged.raw])
    assert (
        report.reasons() == ["checkpoint_conflict"] and "state differs" in report.rejected[0].detail
    )
    assert honest.equivocations() == [(key.public_key_hex, head.seq)]
    assert honest.snapshot()["equivocators"] == [key.public_key_hex]
    assert honest.heads()[key.public_key_hex].seq == head.seq - 1  # the feed stops before the fork
    genuine = writer.checkpoint()
    fresh = open_site(trust=[key.public_key])
    fresh.ingest(writer.envelopes_since({}))
    assert (
        fresh.ingest([genuine.raw]).duplicates == 1
    )  # the author's real checkpoint agrees with its history
    assert fresh.equivocations() == []


def test_a_checkpoint_naming_another_envelope_is_kept_as_evidence_and_spread(tmp_path):
    key, first, second = forked_writer(tmp_path)
    checkpoint = second.checkpoint()
    one = open_site(trust=[key.public_key])
    one.ingest(first.envelopes_since({}))
    report = one.ingest([checkpoint.raw])
    assert report.reasons() == ["checkpoint_conflict"]
    assert one.equivocations() == [(key.public_key_hex, 2)]
    two = open_site(trust=[key.public_key])
    two.ingest(first.envelopes_since({}))
    sync(one, two)
    assert two.equivocations() == [(key.public_key_hex, 2)]


def test_a_reflashed_device_learns_its_feed_back_before_it_writes(tmp_path):
    root = open_site(path=tmp_path / "site.db")
    robot = Identity.generate()
    policy = TrustPolicy().for_device_of(root.identity.public_key)
    old = open_site(robot, policy=policy, path=tmp_path / "old.db")
    root.delegate(robot.public_key, ["publish"])
    with pytest.raises(NotAuthorizedError, match="sync with its site first"):
        old.skills.publish(
            "before any sync", "pick"
        )  # a device's empty store may be a re-flashed robot's
    sync(root, old)
    for i in range(3):
        old.skills.publish(f"skill-{i}", "pick")
    root.ingest(old.envelopes_since(root.heads()))
    old.close()

    new = open_site(robot, policy=policy, path=tmp_path / "new.db")  # same key, empty store
    new.ingest(
        root.envelopes_since(new.heads(), limit=2)
    )  # a first page: the delegation and one envelope
    new.learn_site_heads(root.heads())  # its site holds more of its own feed than this store
    with pytest.raises(NotAuthorizedError, match="learn the feed back"):
        new.skills.publish("would fork", "pick")
    sync(root, new)
    assert new.heads()[robot.public_key_hex] == root.heads()[robot.public_key_hex]
    new.skills.publish("after restore", "pick")
    assert root.ingest(new.envelopes_since(root.heads())).accepted == [(robot.public_key_hex, 4)]
    assert root.equivocations() == []


def test_a_site_root_reinstalled_with_its_old_key_learns_its_feed_back_before_it_writes(tmp_path):
    """A root's store created by a key loaded from a file (not generated with it) may be a site
    re-installed with its old key: it writes only once a peer's heads show no more of its feed than
    it holds, so it pulls its feed back instead of forking it."""
    key = Identity.generate()
    key.save(tmp_path / "site.key")
    old = open_site(key, path=tmp_path / "old.db")  # born with the key: writes at once
    peer = open_site(trust=[key.public_key])
    for i in range(3):
        old.skills.publish(f"skill-{i}", "pick")
    peer.ingest(old.envelopes_since({}))
    old.close()

    def reinstalled(name):
        return open_site(Identity.load(tmp_path / "site.key"), path=tmp_path / name)

    new = reinstalled("new.db")  # the old key, an empty store
    with pytest.raises(NotAuthorizedError, match=r"sync with every peer first \(simnet sync\)"):
        new.skills.publish("would fork", "pick")
    new.learn_site_heads(peer.heads())  # a device's rule: nothing for a root
    new.ingest(peer.envelopes_since(new.heads(), limit=1))  # a first page: envelope 1
    new.learn_peer_heads(peer.heads())  # the peer holds more: still waiting
    forged = peer.heads() | {
        key.public_key_hex: knowledge.Head(1, "00" * 32)
    }  # another envelope at the seq held: not the word on our feed either
    new.learn_peer_heads(forged)
    new.close()
    new = reinstalled("new.db")  # the wait is kept in the store
    with pytest.raises(NotAuthorizedError, match="sync with every peer first"):
        new.skills.publish("would fork", "pick")
    new.ingest(peer.envelopes_since(new.heads()))
    new.learn_peer_heads(peer.heads())
    new.close()
    new = reinstalled("new.db")  # and so is what it learnt
    new.skills.publish("after restore", "pick")
    assert peer.ingest(new.envelopes_since(peer.heads())).accepted == [(key.public_key_hex, 4)]
    assert peer.equivocations() == [] and new.equivocations() == []

    vouched = open_site(Identity.load(tmp_path / "site.key", new=True), path=tmp_path / "v.db")
    vouched.skills.publish("the caller vouched the key never wrote", "pick")  # and so it forks
    unused = tmp_path / "unused.key"
    Identity.generate().save(unused)
    fresh = open_site(Identity.load(unused), path=tmp_path / "fresh.db")
    fresh.learn_peer_heads(peer.heads())  # a peer that holds none of its feed: it may write
    fresh.skills.publish("first", "pick")


def test_a_device_whose_pull_of_its_own_feed_was_cut_short_waits_for_its_site(tmp_path):
    """A re-flashed robot's store pulled part of its own feed and stopped (a crash) before it saw
    its site's heads: what it holds is not proof that it holds everything, so it waits."""
    root = open_site(path=tmp_path / "site.db")
    robot = Identity.generate()
    policy = TrustPolicy().for_device_of(root.identity.public_key)
    old = open_site(robot, policy=policy, path=tmp_path / "old.db")
    root.delegate(robot.public_key, ["publish"])
    sync(root, old)
    for i in range(3):
        old.skills.publish(f"skill-{i}", "pick")
    root.ingest(old.envelopes_since(root.heads()))
    old.close()

    new = open_site(robot, policy=policy, path=tmp_path / "new.db")
    new.ingest(root.envelopes_since(new.heads(), limit=2))  # the delegation and envelope 1
    assert new.heads()[robot.public_key_hex].seq == 1
    new.close()  # the crash: its site's heads never arrived
    new = open_site(robot, policy=policy, path=tmp_path / "new.db")
    with pytest.raises(NotAuthorizedError, match="does not know how far"):
        new.skills.publish("would fork at 2", "pick")
    sync(root, new)
    new.skills.publish("after the pull", "pick")
    assert root.ingest(new.envelopes_since(root.heads())).accepted == [(robot.public_key_hex, 4)]
    assert root.equivocations() == []


def test_a_restored_root_that_gets_part_of_its_feed_back_waits_for_every_peer(tmp_path):
    """A site root's store restored from a backup is behind its own feed; the first envelope of
    it that arrives from a peer makes it wait again, until every expected peer shows no more."""
    key = Identity.generate()
    site = open_site(key, path=tmp_path / "site.db")
    site.skills.publish("before the backup", "pick")
    site.close()
    (tmp_path / "backup.db").write_bytes((tmp_path / "site.db").read_bytes())
    site = open_site(key, path=tmp_path / "site.db")
    ahead, behind = open_site(trust=[key.public_key]), open_site(trust=[key.public_key])
    for i in range(3):
        site.skills.publish(f"after the backup {i}", "pick")
    ahead.ingest(site.envelopes_since({}))  # seq 1..4
    behind.ingest(site.envelopes_since({})[:2])  # seq 1..2
    site.close()

    restored = open_site(key, path=tmp_path / "backup.db")  # holds seq 1, and knew its feed
    restored.expect_own_feed_from([ahead.identity.public_key, behind.identity.public_key])
    restored.ingest(behind.envelopes_since(restored.heads()))  # seq 2 comes back
    restored.learn_peer_heads(behind.heads(), peer=behind.identity.public_key)
    with pytest.raises(NotAuthorizedError, match=ahead.identity.public_key_hex[:16]):
        restored.skills.publish("would fork at 3", "pick")  # the old rule wrote here, and forked
    restored.close()
    restored = open_site(key, path=tmp_path / "backup.db")  # the wait, and who confirmed, are kept
    restored.expect_own_feed_from([ahead.identity.public_key, behind.identity.public_key])
    with pytest.raises(NotAuthorizedError, match="still waiting for"):
        restored.skills.publish("would fork at 3", "pick")
    restored.ingest(ahead.envelopes_since(restored.heads()))
    restored.learn_peer_heads(ahead.heads(), peer=ahead.identity.public_key)
    restored.skills.publish("after every peer", "pick")
    assert ahead.ingest(restored.envelopes_since(ahead.heads())).accepted == [
        (key.public_key_hex, 5)
    ]
    assert ahead.equivocations() == []


def test_a_writer_whose_key_already_forked_stops_writing(tmp_path):
    key, first, second = forked_writer(tmp_path)
    site = open_site(trust=[key.public_key])
    site.ingest(second.envelopes_since({}))
    first.ingest(site.envelopes_since(first.heads()))  # the site shows first its other envelope 2
    assert first.equivocations() == [(key.public_key_hex, 2)]
    with pytest.raises(NotAuthorizedError, match="two histories"):
        first.skills.publish("more", "pick")
    assert decode(second.envelopes_since({})[-1], max_bytes=1 << 20).seq == 2


def test_a_checkpoint_ahead_of_the_held_feed_must_continue_it(tmp_path):
    key, first, second = forked_writer(tmp_path)  # first: 1, 2a; second: 1, 2b
    second.skills.publish("branch-b-more", "pick")
    site = open_site(trust=[key.public_key])
    site.ingest(first.envelopes_since({}))  # holds 1, 2a
    forged = second.checkpoint()  # seq 3 of the other history: other content at the clocks of 2a
    report = site.ingest([forged.raw])
    assert (
        report.reasons() == ["checkpoint_conflict"]
        and "lacks or changes" in report.rejected[0].detail
    )
    assert site.equivocations() == [(key.public_key_hex, 3)]
    assert sorted(s.name for s in site.skills.list()) == [
        "branch-a",
        "common",
    ]  # nothing taken from it

    first.skills.publish("branch-a-more", "pick")
    honest = open_site(trust=[key.public_key])
    honest.ingest(first.envelopes_since({})[:1])  # holds 1 only
    assert honest.ingest([first.checkpoint().raw]).accepted == [(key.public_key_hex, 3)]
    assert sorted(s.name for s in honest.skills.list()) == ["branch-a", "branch-a-more", "common"]


def test_a_key_that_forks_at_two_seqs_leaves_every_site_at_the_earlier_fork():
    """A site that found the later fork first learns of the earlier one from a peer's evidence:
    evidence goes to every peer that holds past the fork, not only to peers that know of no fork at
    all."""
    key = Identity.generate()
    x = open_site(key)
    for i in (1, 2):
        x.maps["m"].observe((i, 0), f"x{i}", 0.5)
    y = open_site(key)
    y.ingest(x.envelopes_since({}))  # y: 1..2, then its own 3
    y.learn_peer_heads(x.heads())
    for i in (3, 4):
        x.maps["m"].observe((i, 0), f"x{i}", 0.5)
    y.maps["m"].observe((3, 0), "y3", 0.5)
    z = open_site(key)
    z.ingest(x.envelopes_since({}))  # z: x's 1..4, then its own 5
    z.learn_peer_heads(x.heads())
    x.maps["m"].observe((5, 0), "x5", 0.5)
    z.maps["m"].observe((5, 0), "z5", 0.5)
    a, c = open_site(trust=[key.public_key]), open_site(trust=[key.public_key])
    a.ingest(x.envelopes_since({})), a.ingest(z.envelopes_since(a.heads()))  # a finds the fork at 5
    c.ingest(y.envelopes_since({})), c.ingest(x.envelopes_since(c.heads()))  # c finds the fork at 3
    assert (
        a.heads()[key.public_key_hex].equivocated_at == 5
        and c.heads()[key.public_key_hex].equivocated_at == 3
    )
    sync(a, c)
    for site in (a, c):
        assert (
            site.heads()[key.public_key_hex].seq == 2
            and site.heads()[key.public_key_hex].equivocated_at == 3
        )
    assert a.snapshot() == c.snapshot()


def forged_checkpoint(tmp_path, key, writer):
    """`key`'s checkpoint naming the writer's real head but holding another state: a mug that is
    not one."""
    forger = open_site(key, path=tmp_path / "forger.db")
    forger.ingest(writer.envelopes_since({}))
    forger.learn_peer_heads(writer.heads())
    forger.maps["m"].observe((1, 1), "not a mug", confidence=0.5)
    feed = forger._replica.feeds[key.public_key]
    head = writer.heads()[key.public_key_hex]
    return seal(key, Kind.CHECKPOINT, head.seq, bytes.fromhex(head.hash), feed.hlc, feed.state())


def history(key):
    writer = open_site(key)
    writer.skills.publish("real", "pick")
    writer.maps["m"].observe((1, 1), "mug", confidence=0.5)
    writer.skills.publish("more", "place")
    return writer


def pull_until_done(site, peer, limit=10_000):
    """`site` pulls from `peer` as the federation client does, page by page; the reports."""
    reports = []
    while page := peer.envelopes_since(
        site.heads(), limit=limit, unchecked=site.unchecked_checkpoints()
    ):
        reports.append(site.ingest(page))
        if not reports[-1].accepted and not reports[-1].verified:
            break
    return reports


def test_a_site_bootstrapped_from_a_forged_checkpoint_finds_the_fork_from_a_holder_of_the_history(
    tmp_path,
):
    key = Identity.generate()
    writer = history(key)
    holder = open_site(trust=[key.public_key])
    holder.ingest(writer.envelopes_since({}))
    forged = forged_checkpoint(tmp_path, key, writer)
    site = open_site(trust=[key.public_key])
    assert site.ingest([forged.raw]).accepted == [(key.public_key_hex, 3)]
    assert site.maps["m"].get((1, 1)).value == "not a mug"  # nothing here can tell, yet
    assert site.unchecked_checkpoints() == {key.public_key_hex: (3, 0)}
    assert site.heads()[key.public_key_hex] == holder.heads()[key.public_key_hex]  # same head

    reports = pull_until_done(site, holder)
    assert reports[0].verified == 3 and reports[0].equivocations == [(key.public_key_hex, 3)]
    assert site.equivocations() == [(key.public_key_hex, 3)]
    assert site.maps["m"].get((1, 1)).value == "mug"  # the writer's history up to the fork
    assert site.unchecked_checkpoints() == {}
    sync(site, holder)  # the holder learns of the fork from the evidence the site sends it
    for one in (site, holder):
        assert one.equivocations() == [(key.public_key_hex, 3)]
        assert one.heads()[key.public_key_hex].seq == 2
        assert [s.name for s in one.skills.list()] == ["real"]
    assert site.snapshot() == holder.snapshot()
    also = open_site(trust=[key.public_key])  # took the same forgery, and syncs only with `site`
    also.ingest([forged.raw])
    sync(also, site)
    assert also.equivocations() == [(key.public_key_hex, 3)]
    assert also.snapshot() == site.snapshot()


def test_an_honest_checkpoint_is_checked_once_page_by_page_and_never_asked_about_again(tmp_path):
    key = Identity.generate()
    writer = history(key)
    holder = open_site(trust=[key.public_key])
    holder.ingest(writer.envelopes_since({}))
    identity = Identity.generate()
    site = open_site(identity, trust=[key.public_key], path=tmp_path / "site.db")
    site.ingest([writer.checkpoint().raw])
    before = site.snapshot()

    reports = pull_until_done(site, holder, limit=2)
    assert [r.verified for r in reports] == [2, 1] and all(r.ok for r in reports)
    assert site.unchecked_checkpoints() == {}
    assert site.snapshot() == before and site.heads() == holder.heads()
    assert holder.envelopes_since(site.heads(), unchecked=site.unchecked_checkpoints()) == []
    site.close()
    again = open_site(identity, trust=[key.public_key], path=tmp_path / "site.db")
    assert again.unchecked_checkpoints() == {}  # kept in the store: the check is not redone
    assert again.snapshot() == before


def test_a_check_in_progress_takes_only_the_next_signed_chained_envelope(tmp_path):
    key = Identity.generate()
    writer = history(key)
    envelopes = writer.envelopes_since({})  # 1, 2, 3
    site = open_site(trust=[key.public_key])
    site.ingest([writer.checkpoint().raw])
    assert site.ingest(envelopes[:1]).verified == 1
    before = site.snapshot()
    one, two = (decode(raw, max_bytes=1 << 20) for raw in envelopes[:2])
    bad_signature = two.raw[:-1] + bytes([two.raw[-1] ^ 1])
    unchained = seal(key, Kind.UPDATE, 2, b"\x07" * 32, two.hlc, two.update)  # not after 1
    report = site.ingest([bad_signature, unchained.raw, b"\x01\x01garbage", envelopes[0]])
    assert report.reasons() == ["bad_signature", "broken_chain", "truncated"]
    assert report.verified == 0 and report.duplicates == 1  # envelope 1 again: nothing new
    assert site.unchecked_checkpoints() == {key.public_key_hex: (3, 1)}
    assert site.snapshot() == before and site.equivocations() == []
    assert site.ingest(envelopes[1:]).verified == 2
    assert site.unchecked_checkpoints() == {} and site.equivocations() == []


def test_a_forks_evidence_keeps_its_feed_withheld_by_the_maps_it_writes(tmp_path):
    """Read rules withhold feeds by the maps they wrote: a feed cut to nothing at its fork still
    counts the maps its evidence writes (evidence is served with the feed), after a reopen too;
    evidence whose bytes are no update (a fork is kept on its signature alone) counts as writing
    any map, and is never handed to pycrdt."""
    key = Identity.generate()
    writer = open_site(key)
    writer.maps["vault"].observe((1, 1), {"code": "secret"}, confidence=0.9)
    me = Identity.generate()
    site = open_site(me, trust=[key.public_key], path=tmp_path / "site.db")
    site.ingest(writer.envelopes_since({}))
    assert site.authors_writing({"vault"}) == {key.public_key}
    other = open_site(key)
    other.maps["hall"].observe((1, 1), "door", confidence=0.5)
    site.ingest(other.envelopes_since({}))  # the same seq 1: a fork, the feed cut before it
    assert site.equivocations() == [(key.public_key_hex, 1)]
    assert site.heads()[key.public_key_hex].seq == 0
    assert site.authors_writing({"vault"}) == site.authors_writing({"hall"}) == {key.public_key}
    site.close()
    with open_site(me, trust=[key.public_key], path=tmp_path / "site.db") as again:
        assert again.authors_writing({"vault"}) == {key.public_key}
        assert again.authors_writing({"elsewhere"}) == set()

    garbled = seal(key, Kind.UPDATE, 1, bytes(32), 10**15, b"\x01\x01\xff\xff\xff\xff\x0f")
    held = open_site(me, trust=[key.public_key], path=tmp_path / "held.db")
    held.ingest(writer.envelopes_since({}))
    held.ingest([garbled.raw])
    assert held.equivocations() == [(key.public_key_hex, 1)]
    assert held.authors_writing({"elsewhere"}) == {key.public_key}  # what it writes is unknown
    held.close()
    with open_site(me, trust=[key.public_key], path=tmp_path / "held.db") as again:
        assert again.authors_writing({"elsewhere"}) == {key.public_key}

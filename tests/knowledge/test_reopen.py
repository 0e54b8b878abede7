"""Reopening from snapshots (knowledge._reopen) shows exactly what replaying the store shows.

The property test builds random stores: root sites and the devices they delegate, trust changes
(delegations, key revocations, policy changes), skills, cells, counters, certificates,
withdrawals, revocations, a writer that forks its feed, a writer whose clock runs ahead (its
envelopes are held), delivered in random pages, with the site closed, reopened and crashed (its
store closed without a final snapshot) at random points and snapshots taken every few envelopes.
Then it reopens the store twice, from its snapshots and by a full replay, and compares every
public read and the feeds' and grants' state.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import HybridClock, Identity, Role, TrustPolicy, _reopen, _snapshot
from knowledge._errors import SimnetError
from knowledge._store import Store

KEYS = {
    name: Identity.from_seed(bytes([i + 1]) * 32, new=True) for i, name in enumerate("ABVFDEGS")
}
A, B, V, F, D1, D2, G, SITE = (KEYS[n] for n in "ABVFDEGS")  # G: a device whose clock runs ahead
ROOTS = {A: list(Role), B: [Role.PUBLISH, Role.VALIDATE], V: [Role.VALIDATE], F: [Role.PUBLISH]}


def site_policy(drop_b_validate: bool = False) -> TrustPolicy:
    policy = TrustPolicy()
    for key, roles in ROOTS.items():
        if key is B and drop_b_validate:
            roles = [Role.PUBLISH]
        policy = policy.with_root(key.public_key, roles)
    return policy


def actor_policy() -> TrustPolicy:
    policy = TrustPolicy()
    for key in ROOTS:
        policy = policy.with_root(key.public_key)
    return policy


def ahead_ms() -> int:
    return time.time_ns() // 1_000_000 + 60_000  # beyond the accepted offset, within the horizon


class World:
    """The writers: in-memory knowledge bases that share everything they write through `pool`."""

    def __init__(self) -> None:
        self.actors = {
            key: knowledge.open(":memory:", key, policy=actor_policy())
            for key in (A, B, V, F, D1, D2)
        }
        self.actors[G] = knowledge.open(
            ":memory:", G, policy=actor_policy(), clock=HybridClock(physical_ms=ahead_ms)
        )
        self.fork: knowledge.KnowledgeBase | None = None  # F's second history
        self.pool: list[bytes] = []
        self.seen: set[bytes] = set()

    def collect(self) -> None:
        kbs = [*self.actors.values(), *([self.fork] if self.fork else [])]
        for kb in kbs:
            for raw in kb.envelopes_since({}, limit=100_000):
                if raw not in self.seen:
                    self.seen.add(raw)
                    self.pool.append(raw)

    def act(self, action: tuple[Any, ...]) -> None:
        kind, n = action
        who = {
            "cert": (V, B, D1),
            "withdraw": (A, B, D1),
            "revoke": (A,),
            "delegate": (A, B),
            "keyrevoke": (A, B),
            "fork": (F,),
        }.get(kind, (A, B, F, D1, D2, G))
        kb = self.fork if kind == "fork-write" else self.actors[who[n % len(who)]]
        if kb is None:
            return
        kb.ingest([raw for raw in self.pool if raw[2:34] != kb.identity.public_key])
        skills = [s.id for s in kb.skills.list(include_withdrawn=True)]
        skill = skills[n % len(skills)] if skills else None
        try:
            if kind in ("publish", "fork-write"):
                kb.skills.publish(f"s{n}", "pick")
            elif kind == "cell":
                kb.maps["m"].observe((n % 5, 0), {"n": n}, (n % 10) / 10)
            elif kind == "delete-cell":
                kb.maps["m"].delete((n % 5, 0), (n % 10) / 10)
            elif kind == "tiles":  # cells over two tiles, some also written one by one above
                cells = [(x, 0) for x in range(n % 3, 70, 7)]
                kb.maps["m"].observe_many(cells, [{"t": n}] * len(cells), (n % 10) / 10)
            elif kind == "counter" and skill:
                kb.counters.record(skill, success=n % 2 == 0)
            elif kind == "cert" and skill:
                kb.certificates.add(skill, branches=64, successes=60 + n % 5)
            elif kind == "withdraw" and skill:
                kb.skills.withdraw(skill)
            elif kind == "revoke" and skill:
                kb.revoke(skill, "bad")
            elif kind == "delegate":
                device = (D1, D2, G)[n % 3]
                kb.delegate(device.public_key, [Role.PUBLISH, Role.VALIDATE][: 1 + n % 2])
            elif kind == "keyrevoke":
                device = (D1, D2)[n % 2]
                head = kb.heads().get(device.public_key_hex)
                kb.revoke_key(device.public_key, head.seq - n % 2 if head else 0)
            elif kind == "fork" and self.fork is None:  # F signs two histories from here on
                self.fork = knowledge.open(":memory:", F, policy=actor_policy())
                self.fork.ingest(self.actors[F].envelopes_since({}, limit=100_000))
                self.fork.skills.publish(f"other{n}", "pick")
                kb.skills.publish(f"one{n}", "pick")
        except (SimnetError, KeyError):
            pass  # not allowed, unknown, or already done: nothing written
        self.collect()


ACTIONS = st.tuples(
    st.sampled_from(
        [
            "publish",
            "cell",
            "delete-cell",
            "tiles",
            "counter",
            "cert",
            "withdraw",
            "revoke",
            "delegate",
            "keyrevoke",
            "fork",
            "fork-write",
        ]
    ),
    st.integers(0, 50),
)
STEPS = st.lists(
    st.one_of(
        ACTIONS,
        st.sampled_from([("deliver",), ("reopen",), ("crash",), ("policy",)]),
    ),
    min_size=5,
    max_size=30,
)


def reads(kb: knowledge.KnowledgeBase) -> dict[str, Any]:
    """Every public read, and the replica's state behind them."""
    replica = kb._replica
    skills = [s.id for s in kb.skills.list(include_withdrawn=True)]
    keys = [k.public_key for k in KEYS.values()]
    return {
        "heads": kb.heads(),
        "snapshot": kb.snapshot(),
        "equivocations": kb.equivocations(),
        "held": kb.held(),
        "envelopes": kb.envelopes_since({}, limit=1_000_000),
        "skills": kb.skills.list(include_withdrawn=True),
        "active": kb.skills.list(active_only=True),
        "activation": {s: kb.activation(s) for s in skills},
        "revoked": {s: kb.is_revoked(s) for s in skills},
        "certificates": {s: kb.certificates.for_skill(s) for s in skills},
        "counters": {s: kb.counters.per_site(s) for s in skills},
        "cells": {m: kb.maps[m].cells(include_deleted=True) for m in kb.maps.names()},
        "roles": {k: (kb.roles_of(k), kb.can_read(k)) for k in keys},
        "writing": kb.authors_writing(["m"]),
        "feeds": {
            a: (f.seq, f.head, f.hlc, f.state(), f.next_clock, f._frozen, sorted(f.map_names))
            for a, f in replica.feeds.items()
        },
        "written": {a: dict(w) for a, w in replica.written.items() if w},
        "authority": replica.authority.digest(),
        "fork_memory": replica.fork_memory()[:3],
    }


def open_site(path: Path, policy: TrustPolicy | None = None) -> knowledge.KnowledgeBase:
    return knowledge.open(path, SITE, policy=policy)


def drop_snapshots(path: Path) -> None:
    store = Store(path)
    with store.transaction():
        store.delete_snapshots()
    store.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps=STEPS, every=st.integers(1, 6), seed=st.integers(0, 2**16), crash=st.booleans())
def test_reopening_from_snapshots_shows_what_a_full_replay_shows(steps, every, seed, crash):
    rng = random.Random(seed)
    world = World()
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(_reopen, "SNAPSHOT_EVERY", every)
        path = Path(tmp) / "site.db"
        site = open_site(path, site_policy())
        dropped = False
        prelude = [("delegate", 0), ("delegate", 1), ("delegate", 2), ("delegate", 4)]
        for step in [*prelude, *steps, ("deliver",)]:
            if step[0] == "deliver":
                pending = list(world.pool)
                rng.shuffle(pending)
                while pending:
                    size = rng.randint(1, 8)
                    site.ingest(pending[:size])
                    pending = pending[size:]
            elif step[0] == "reopen":
                site.close()
                site = open_site(path)
            elif step[0] == "crash":
                site._replica.store.close()  # killed: no snapshot on the way out
                site = open_site(path)
            elif step[0] == "policy":
                dropped = not dropped
                site.set_policy(site_policy(drop_b_validate=dropped))
            else:
                world.act(step)
        live = reads(site)
        if crash:
            site._replica.store.close()
        else:
            site.close()
        shutil.copy(path, Path(tmp) / "replayed.db")
        snapshotted = open_site(path)
        from_snapshots = reads(snapshotted)
        restored = snapshotted._replica
        tails = {
            a
            for a, at in restored.snapshotted.items()
            if at != (restored.feeds[a].seq, restored.feeds[a].head)
        }
        event(f"feeds restored: {bool(restored.snapshotted)}, with tails: {bool(tails)}")
        event(f"views restored: {restored.views_snapshotted is not None}")
        forks, held = bool(from_snapshots["equivocations"]), bool(from_snapshots["held"])
        event(f"equivocations: {forks}, held: {held}")
        pins = [g.last_seq for k in KEYS.values() for g in restored.authority.grants(k.public_key)]
        event(f"key revoked: {any(seq is not None for seq in pins)}")
        snapshotted.close()
        drop_snapshots(Path(tmp) / "replayed.db")
        replayed = open_site(Path(tmp) / "replayed.db")
        assert not replayed._replica.snapshotted  # it really replayed
        assert from_snapshots == reads(replayed)
        replayed.close()
        assert live["snapshot"] == from_snapshots["snapshot"]
        assert live["heads"] == from_snapshots["heads"]


def _built(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    world = World()
    for step in [("delegate", 0), ("publish", 3), ("cell", 3), ("tiles", 1), ("publish", 1)]:
        world.act(step)
    path = tmp_path / "site.db"
    with open_site(path, site_policy()) as site:
        site.ingest(world.pool)
        expected = reads(site)
    return path, expected


def _open_and_read(path: Path) -> tuple[dict[str, Any], bool]:
    with open_site(path) as site:
        return reads(site), bool(site._replica.snapshotted)


def test_a_clean_close_leaves_snapshots_that_the_next_open_uses(tmp_path):
    path, expected = _built(tmp_path)
    got, used = _open_and_read(path)
    assert used and got["snapshot"] == expected["snapshot"] and got["feeds"] == expected["feeds"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "fingerprint", "stale-head"])
def test_a_damaged_or_stale_snapshot_is_ignored_and_the_store_replayed(tmp_path, damage):
    path, expected = _built(tmp_path)
    db = sqlite3.connect(path)
    name, data = db.execute(
        "SELECT name, data FROM snapshots WHERE name LIKE 'feed/%' ORDER BY name LIMIT 1"
    ).fetchone()
    data = bytearray(data)
    if damage == "flip":
        data[-5] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "fingerprint":
        data[len(_snapshot.FORMAT)] ^= 0xFF  # another version of the code wrote it
    if damage == "stale-head":  # the feed the snapshot covers was replaced since
        author = bytes.fromhex(name[5:])
        db.execute(
            "UPDATE envelopes SET hash=zeroblob(32) WHERE author=? AND seq="
            "(SELECT MAX(seq) FROM envelopes WHERE author=?)",
            (author, author),
        )
        db.commit()
        db.close()
        with open_site(path) as site:
            assert bytes.fromhex(name[5:]) not in site._replica.snapshotted
        return
    db.execute("UPDATE snapshots SET data=? WHERE name=?", (bytes(data), name))
    db.commit()
    db.close()
    with open_site(path) as site:
        assert bytes.fromhex(name[5:]) not in site._replica.snapshotted  # replayed, not restored
        got = reads(site)
    assert got["snapshot"] == expected["snapshot"] and got["feeds"] == expected["feeds"]
    assert _open_and_read(path) == (got, True)  # and snapshotted again on close


def test_a_damaged_document_state_is_rebuilt_from_the_envelopes_when_first_needed(tmp_path, caplog):
    """A feed's document state is read only when its document is first needed."""
    path, expected = _built(tmp_path)
    db = sqlite3.connect(path)
    names = [n for (n,) in db.execute("SELECT DISTINCT name FROM snapshots") if n[:6] == "state/"]
    assert names  # one per feed
    db.execute(
        "UPDATE snapshots SET data=zeroblob(length(data)) WHERE name=? AND part>0", names[:1]
    )
    db.commit()
    db.close()
    with open_site(path) as site:
        assert bytes.fromhex(names[0][6:]) in site._replica.snapshotted  # restored all the same
        assert "unusable" not in caplog.text
        got = reads(site)  # its document, read now, is replayed from the envelopes
    assert "unusable: replaying it" in caplog.text
    assert got["feeds"] == expected["feeds"] and got["snapshot"] == expected["snapshot"]


def test_a_store_without_the_snapshots_table_opens_and_is_snapshotted(tmp_path):
    path, expected = _built(tmp_path)
    db = sqlite3.connect(path)
    db.execute("DROP TABLE snapshots")  # as a store written before snapshots existed
    db.commit()
    db.close()
    got, used = _open_and_read(path)
    assert not used and got["snapshot"] == expected["snapshot"]
    got, used = _open_and_read(path)
    assert used and got["snapshot"] == expected["snapshot"]

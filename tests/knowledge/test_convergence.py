"""Property: replicas that end up holding the same envelopes show the same knowledge.

3-8 writers (site roots and delegated devices) make random operations on every view; replicas
receive their envelopes in random order, in random chunks, duplicated, partitioned from each other,
some joining late (bootstrapping from a checkpoint); after a final anti-entropy exchange every
replica and every writer is identical, including derived activation under the shared policy.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import Identity, Role, TrustPolicy

EXAMPLES = int(os.environ.get("SIMNET_CONVERGENCE_EXAMPLES", "1000"))
# The schedules are drawn in SHARDS runs of their own (each with its own random draws), which xdist
# spreads over the cores: 4 x 250 schedules, the EXAMPLES in all (CI draws new ones every run;
# SIMNET_CONVERGENCE_EXAMPLES=20000 for a long search).
SHARDS = 4


def _identities(n: int) -> list[Identity]:
    return [Identity.from_seed(bytes([i + 1]) * 32, new=True) for i in range(n)]


op = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 7), st.sampled_from(["pick", "walk", "push"])),
    st.tuples(
        st.just("observe"),
        st.integers(0, 7),
        st.integers(0, 3),
        st.floats(0, 1, width=16),
        st.integers(),
    ),
    st.tuples(st.just("delete"), st.integers(0, 7), st.integers(0, 3), st.floats(0, 1, width=16)),
    st.tuples(
        st.just("observe_many"),
        st.integers(0, 7),
        st.lists(
            st.tuples(st.integers(0, 3), st.sampled_from([0, 63, 64])), min_size=1, max_size=4
        ),
        st.floats(0, 1, width=16),
        st.integers(),
    ),
    st.tuples(st.just("count"), st.integers(0, 7), st.integers(0, 20), st.booleans()),
    st.tuples(
        st.just("certify"),
        st.integers(0, 7),
        st.integers(0, 20),
        st.integers(50, 80),
        st.integers(0, 6),
    ),
    st.tuples(st.just("revoke"), st.integers(0, 7), st.integers(0, 20)),
    st.tuples(st.just("withdraw"), st.integers(0, 7), st.integers(0, 20)),
    st.tuples(st.just("gossip"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("checkpoint"), st.integers(0, 7)),
)


def _sync(a: knowledge.KnowledgeBase, b: knowledge.KnowledgeBase) -> None:
    while True:
        moved = len(b.ingest(a.envelopes_since(b.heads(), limit=7)).accepted)
        moved += len(a.ingest(b.envelopes_since(a.heads(), limit=7)).accepted)
        if not moved:
            return


def _apply(writers, skills, operation) -> None:
    kind, w = operation[0], writers[operation[1] % len(writers)]
    try:
        if kind == "publish":
            skills.append(w.skills.publish(f"s{len(skills)}", operation[2]).id)
        elif kind == "observe":
            w.maps["m"].observe((operation[2], 0), operation[4], operation[3])
        elif kind == "delete":
            w.maps["m"].delete((operation[2], 0), operation[3])
        elif kind == "observe_many":  # tiles, over cells that per-cell records also write
            w.maps["m"].observe_many(operation[2], [operation[4]] * len(operation[2]), operation[3])
        elif kind == "gossip":
            _sync(w, writers[operation[2] % len(writers)])
        elif kind == "checkpoint":
            if w.heads():
                w.checkpoint()
        elif skills:
            skill = skills[operation[2] % len(skills)]
            if kind == "count":
                w.counters.record(skill, success=operation[3])
            elif kind == "certify":
                w.certificates.add(
                    skill, branches=operation[3], successes=operation[3] - operation[4]
                )
            elif kind == "revoke":
                w.revoke(skill)
            elif kind == "withdraw" and skill in w.skills:
                w.skills.withdraw(skill)
    except (knowledge.NotAuthorizedError, knowledge.RecordError, knowledge.StoreError):
        # a device without the role, another site's skill, nothing to checkpoint: refused, no change
        pass


@pytest.mark.parametrize("shard", range(SHARDS))
@settings(max_examples=max(1, -(-EXAMPLES // SHARDS)))
@given(
    n_roots=st.integers(2, 4),
    n_devices=st.integers(1, 4),
    operations=st.lists(op, min_size=5, max_size=40),
    n_replicas=st.integers(2, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_replicas_converge(shard, n_roots, n_devices, operations, n_replicas, seed):
    rng = random.Random(seed)
    ids = _identities(n_roots + n_devices + n_replicas + 1)
    roots, devices, observers = (
        ids[:n_roots],
        ids[n_roots : n_roots + n_devices],
        ids[n_roots + n_devices :],
    )
    policy = TrustPolicy()
    for i, root in enumerate(roots):
        policy = policy.with_root(root.public_key, name=f"site{i}")
    policy = TrustPolicy(
        policy.roots, knowledge.ActivationPolicy(min_branches=60, min_lower_bound=0.8)
    )
    opened = []

    def open_kb(identity, site=None):
        kb = knowledge.open(
            ":memory:",
            identity,
            policy=policy if site is None else policy.for_device_of(site.public_key),
        )
        opened.append(kb)
        return kb

    try:
        root_kbs = [open_kb(r) for r in roots]
        device_kbs = [open_kb(d, roots[i % n_roots]) for i, d in enumerate(devices)]
        for i, device in enumerate(
            devices
        ):  # each device belongs to a root, with a random subset of roles
            roles = [r for r in Role if rng.random() < 0.7] or [Role.PUBLISH]
            root_kbs[i % n_roots].delegate(device.public_key, roles)
            device_kbs[i].ingest(root_kbs[i % n_roots].envelopes_since({}))
            device_kbs[i].learn_site_heads(
                root_kbs[i % n_roots].heads()
            )  # writes once it has seen its site's heads
        writers = root_kbs + device_kbs
        skills: list[str] = []
        for operation in operations:
            _apply(writers, skills, operation)

        everything = [raw for w in writers for raw in w.envelopes_since({}, limit=10_000)]
        replicas = [open_kb(o) for o in observers[:-1]]
        for replica in replicas:  # random chunks, random order, duplicates; partial delivery
            stream = everything + rng.sample(everything, k=len(everything) // 3)
            rng.shuffle(stream)
            stream = stream[: rng.randint(0, len(stream))]
            while stream:
                cut = rng.randint(1, len(stream))
                replica.ingest(stream[:cut])
                stream = stream[cut:]
        for _ in range(rng.randint(0, 3)):  # partitions: some replicas talk only among themselves
            a, b = rng.sample(replicas, 2)
            _sync(a, b)
        for w in (
            writers
        ):  # the partition heals: every writer reaches one replica, replicas reach each other
            _sync(w, replicas[0])
        for r in replicas[1:]:
            _sync(replicas[0], r)
        late = open_kb(
            observers[-1]
        )  # a late joiner bootstraps from a replica (checkpoints travel too)
        _sync(replicas[0], late)
        for w in writers:
            _sync(replicas[0], w)

        expected = replicas[0].snapshot()
        event(
            f"skills={min(len(expected['skills']), 5)} cells={min(len(expected['cells']), 3)} "
            f"active={sum(s['active'] for s in expected['skills'].values())}"
        )
        for kb in [*replicas[1:], late, *writers]:
            assert kb.snapshot() == expected
            assert kb.heads() == replicas[0].heads()
    finally:
        for kb in opened:
            kb.close()

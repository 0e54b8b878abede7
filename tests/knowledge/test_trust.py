"""Delegation scope (issue #13, item 1): a root's grants are its own.

Before the fix, a remote root that a site trusted only for one narrow role could write delegation
and key-revocation records naming keys it does not own — the site's own root key, the site's devices
— and strip their rights. The rules now (knowledge/_trust.py): grants from different roots are
independent and only add; a root's delegations count only with the roles the policy trusts that root
for; a delegation naming a root (this site's own key included) is ignored; so no record written by a
writer W can reduce or change a right that W did not grant.

The property tests drive `Authority` directly with random policies (roots with random role sets,
this site's own key or a `device_of` site) and random delegation / key-revocation records by random
roots, then add a random set of records authored by one writer W and compare every key's grants
before and after. A second property test checks the same through a real KnowledgeBase: a hostile
root's envelopes, ingested, leave every right it did not grant unchanged.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import Identity, Role, TrustedRoot, TrustPolicy
from knowledge._records import ALL_ROLES, RecordType
from knowledge._trust import Authority, Grant

KEYS = [
    bytes([i + 1]) * 32 for i in range(8)
]  # a small universe, so records collide with roots and devices
ROLE_SETS = st.frozensets(st.sampled_from(list(Role)))
HASH = st.one_of(st.none(), st.sampled_from([bytes([i]) * 32 for i in range(4)]).map(bytes.hex))


def delegation_record():
    return st.fixed_dictionaries(
        {"roles": ROLE_SETS.map(lambda roles: sorted(r.value for r in roles))},
        optional={"expires": st.one_of(st.none(), st.integers(0, 2**64 - 1))},
    )


def key_revocation_record():
    return st.builds(
        lambda last_seq, last_hash: {
            "last_seq": last_seq,
            **({} if last_hash is None else {"last_hash": last_hash}),
        },
        st.integers(0, 10),
        HASH,
    )


def records_by(record):
    """{author: {named key: record}} over the key universe."""
    named = st.dictionaries(st.sampled_from(KEYS), record, max_size=4)
    return st.dictionaries(st.sampled_from(KEYS), named, max_size=5)


@st.composite
def scenes(draw):
    policy_roots = draw(st.dictionaries(st.sampled_from(KEYS), ROLE_SETS, max_size=5))
    policy = TrustPolicy(roots=tuple(TrustedRoot(k, roles) for k, roles in policy_roots.items()))
    own = draw(st.one_of(st.none(), st.sampled_from(KEYS)))
    mode = draw(st.sampled_from(["site", "device"]))
    if mode == "device":
        policy = policy.for_device_of(draw(st.sampled_from(KEYS)))
    delegations = draw(records_by(delegation_record()))
    revocations = draw(records_by(key_revocation_record()))
    writer = draw(st.sampled_from(KEYS))
    added_delegations = draw(
        st.dictionaries(st.sampled_from(KEYS), delegation_record(), max_size=8)
    )
    added_revocations = draw(
        st.dictionaries(st.sampled_from(KEYS), key_revocation_record(), max_size=8)
    )
    return policy, own, delegations, revocations, writer, added_delegations, added_revocations


def trusted_roots(policy: TrustPolicy, own: bytes | None) -> dict[bytes, frozenset[Role]]:
    """The roots and their roles as the policy states them (docs/KNOWLEDGE.md, "Trust"): roots
    listed with at least one role; plus the site a device belongs to, with every role, or else this
    site's own key."""
    roots = {r.key: frozenset(r.roles) for r in policy.roots if r.roles}
    if policy.device_of is not None:
        roots.setdefault(policy.device_of, ALL_ROLES)
    elif own is not None:
        roots.setdefault(own, ALL_ROLES)
    return roots


def merged(base: dict, writer: bytes, added: dict) -> dict:
    """`base` with the writer's feed also holding `added` (one current record per key: the new
    one)."""
    out = {author: dict(named) for author, named in base.items()}
    out.setdefault(writer, {}).update(added)
    return out


def others(grants: tuple[Grant, ...], writer: bytes) -> list[Grant]:
    return [g for g in grants if g.site != writer]


@settings(max_examples=150, deadline=None)
@given(scenes())
def test_records_by_one_writer_never_change_rights_it_did_not_grant(scene):
    """Attack: writer W (a root with some roles, any other root, this site's own key, or an
    untrusted key) adds delegations and key revocations naming anything — roots, this site's key,
    other roots' devices. Grants made by other roots never change; no root's grant changes; keys W
    does not delegate keep exactly their grants; and whatever W grants is capped by the roles the
    policy trusts W for."""
    policy, own, delegations, revocations, w, add_delegations, add_revocations = scene
    before = Authority(policy, own, delegations, revocations)
    after_delegations = merged(delegations, w, add_delegations)
    after = Authority(policy, own, after_delegations, merged(revocations, w, add_revocations))
    roots = trusted_roots(policy, own)
    delegated_by_w = set(after_delegations.get(w, {})) if w in roots else set()

    assert after.roots() == before.roots() == sorted(roots)
    for key in KEYS:
        assert others(after.grants(key), w) == others(before.grants(key), w), key.hex()[:4]
        if key not in delegated_by_w:
            assert after.grants(key) == before.grants(key), key.hex()[:4]
        if key in roots:  # a root's rights come from the policy alone
            assert after.grants(key) == (Grant(key, roots[key], root=True),)
            assert after.roles(key) == roots[key]
        for grant in after.grants(key):
            if not grant.root:
                assert grant.site in roots and grant.site != key
                assert grant.roles <= roots[grant.site], (grant, roots[grant.site])
        # Admission only ever gains from W's grant: whatever another grant admitted is still
        # admitted.
        for seq, hlc in ((1, 0), (5, 2**40), (11, 2**64 - 1)):
            if any(g.admits(seq, hlc) is None for g in others(before.grants(key), w)):
                assert after.admits(key, seq, hlc) is None


@settings(max_examples=60, deadline=None)
@given(scenes())
def test_a_writer_that_is_no_trusted_root_changes_nothing(scene):
    """Attack: the records come from a key the policy does not trust as a root (say, a device of
    this site, or a stranger): they change no grant at all."""
    policy, own, delegations, revocations, w, add_delegations, add_revocations = scene
    if w in trusted_roots(policy, own):
        return
    before = Authority(policy, own, delegations, revocations)
    after = Authority(
        policy,
        own,
        merged(delegations, w, add_delegations),
        merged(revocations, w, add_revocations),
    )
    assert after == before
    for key in KEYS:
        assert after.grants(key) == before.grants(key)


@settings(max_examples=60, deadline=None)
@given(scenes())
def test_grants_from_different_roots_are_independent_and_only_add(scene):
    """The grants of a key are the union of each delegating root's own grant: removing every record
    of one root removes exactly its grants, and the roles a key holds are the union of what each
    root gives."""
    policy, own, delegations, revocations, _w, _d, _r = scene
    full = Authority(policy, own, delegations, revocations)
    roots = trusted_roots(policy, own)
    for key in KEYS:
        if key in roots:
            continue
        sites = [g.site for g in full.grants(key)]
        assert sites == sorted(set(sites)), sites  # one grant per delegating root
        assert set(sites) == {r for r in roots if key in delegations.get(r, {})}
        for root in set(sites):
            alone = Authority(
                policy, own, {root: delegations[root]}, {root: revocations.get(root, {})}
            )
            (grant,) = [g for g in full.grants(key) if g.site == root]
            assert alone.grants(key) == (grant,)
            assert (
                grant.roles
                == frozenset(Role(r) for r in delegations[root][key]["roles"]) & roots[root]
            )
        assert (full.roles(key) or frozenset()) == frozenset().union(
            *(g.roles for g in full.grants(key))
        )


def test_own_key_is_a_root_with_every_role_whatever_anyone_delegates():
    """Attack in one line: a root trusted only for validate delegates this site's own key with no
    roles and revokes it at seq 0. The site's key is still its root with every role."""
    own, hostile = KEYS[0], KEYS[1]
    policy = TrustPolicy().with_root(hostile, [Role.VALIDATE])
    authority = Authority(
        policy, own, {hostile: {own: {"roles": []}}}, {hostile: {own: {"last_seq": 0}}}
    )
    assert authority.grants(own) == (Grant(own, ALL_ROLES, root=True),)
    assert authority.admits(own, 10**6, 2**63) is None


def test_device_of_site_is_governed_by_its_site_not_by_the_device_itself():
    """On a device (`device_of`), the device's own key is no root: its rights come from its site's
    delegation, and another trusted root's delegation of it only adds (capped by that root's
    roles)."""
    site, device, other = KEYS[0], KEYS[1], KEYS[2]
    policy = TrustPolicy().with_root(other, [Role.VALIDATE]).for_device_of(site)
    authority = Authority(
        policy,
        device,
        {
            site: {device: {"roles": ["publish"]}},
            other: {device: {"roles": ["publish", "revoke", "validate"]}},
        },
        {},
    )
    assert not authority.is_root(device)
    assert authority.roles(device) == {Role.PUBLISH, Role.VALIDATE}
    stripped = Authority(
        policy,
        device,
        {site: {device: {"roles": ["publish"]}}, other: {device: {"roles": []}}},
        {other: {device: {"last_seq": 0}}},
    )
    assert stripped.roles(device) == {Role.PUBLISH} and stripped.admits(device, 99, 0) is None


# --- the same through a real KnowledgeBase --------------------------------------------------------


def _sync(a: knowledge.KnowledgeBase, b: knowledge.KnowledgeBase) -> None:
    for _ in range(6):
        before = (a.heads(), b.heads())
        b.ingest(a.envelopes_since(b.heads(), limit=10**6))
        a.ingest(b.envelopes_since(a.heads(), limit=10**6))
        for device, site in (
            (a, b),
            (b, a),
        ):  # a device takes its own site's heads as the word on its feed
            if device.policy.device_of == site.identity.public_key:
                device.learn_site_heads(site.heads())
        if (a.heads(), b.heads()) == before:
            return


def _signed_delegation(kb: knowledge.KnowledgeBase, device: bytes, roles: frozenset) -> None:
    """A delegation record `kb.delegate` would not write (naming the writer's own key), written
    below the API check, as a hostile writer can."""
    record = {"v": 1, "hlc": kb.now(), "roles": sorted(r.value for r in roles), "expires": None}
    kb._replica.put_record(RecordType.DELEGATE, device.hex(), record)


@st.composite
def hostile_writes(draw):
    names = ["site", "peer", "hostile", "device1", "device2", "peer-device", "stranger"]
    writes = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["delegate", "revoke_key"]),
                st.sampled_from(names),
                ROLE_SETS,
                st.integers(0, 2),
            ),
            min_size=1,
            max_size=8,
        )
    )
    hostile_roles = draw(ROLE_SETS.filter(bool))
    return hostile_roles, writes


@settings(max_examples=30, deadline=None)
@given(hostile_writes())
def test_a_hostile_roots_ingested_records_leave_other_rights_and_views_unchanged(case):
    """Attack, end to end: site S trusts a peer root P fully and a hostile root H for a random set
    of roles. S delegated devices d1 (publish) and d2 (publish, validate), P delegated pd (publish).
    H writes random delegations and key revocations (pinned at seqs it holds) naming S's key, P's
    key, its own, S's and P's devices, a stranger — and S ingests them. S's views do not change;
    every key H did not delegate keeps its roles at S; keys H delegated only gain (within H's
    roles); S's devices still write."""
    hostile_roles, writes = case
    s_id, p_id, h_id = Identity.generate(), Identity.generate(), Identity.generate()
    devices = {
        name: Identity.generate() for name in ("device1", "device2", "peer-device", "stranger")
    }
    s_policy = TrustPolicy().with_root(p_id.public_key).with_root(h_id.public_key, hostile_roles)
    s = knowledge.open(":memory:", s_id, policy=s_policy)
    p = knowledge.open(":memory:", p_id)
    h = knowledge.open(
        ":memory:", h_id, policy=TrustPolicy().with_root(s_id.public_key).with_root(p_id.public_key)
    )
    robots = {
        name: knowledge.open(":memory:", devices[name], policy=TrustPolicy().for_device_of(site))
        for name, site in (
            ("device1", s_id.public_key),
            ("device2", s_id.public_key),
            ("peer-device", p_id.public_key),
        )
    }
    try:
        s.delegate(devices["device1"].public_key, [Role.PUBLISH])
        s.delegate(devices["device2"].public_key, [Role.PUBLISH, Role.VALIDATE])
        p.delegate(devices["peer-device"].public_key, [Role.PUBLISH])
        for name, robot in robots.items():
            home = p if name == "peer-device" else s
            _sync(home, robot)
            robot.skills.publish(f"{name}-skill", "pick")
            robot.maps["floor"].observe((1, len(name)), name, 0.5)
            _sync(home, robot)
        s.skills.publish("site-skill", "pick")
        _sync(s, p)
        _sync(s, h)  # the hostile root holds everything S holds, so it can pin revocations
        keys = {
            "site": s_id.public_key,
            "peer": p_id.public_key,
            "hostile": h_id.public_key,
            **{n: i.public_key for n, i in devices.items()},
        }
        before_views = s.snapshot()
        before_roles = {n: s.roles_of(k) for n, k in keys.items()}

        delegated = set()
        for action, target, roles, seq in writes:
            key = keys[target]
            if action == "delegate":
                if target == "hostile":  # the API refuses its own key; an attacker signs it anyway
                    _signed_delegation(h, key, roles)
                else:
                    h.delegate(key, roles)
                delegated.add(target)
            else:
                held = h.heads().get(key.hex())
                h.revoke_key(key, min(seq, held.seq if held else 0), reason="hostile")
        report = s.ingest(h.envelopes_since(s.heads(), limit=10**6))
        assert report.rejected == [], report.rejected

        assert s.snapshot() == before_views
        for name, key in keys.items():
            now = s.roles_of(key)
            if name in delegated and name not in ("site", "peer", "hostile"):
                assert (before_roles[name] or frozenset()) <= (now or frozenset())
                assert (now or frozenset()) - (before_roles[name] or frozenset()) <= hostile_roles
            else:
                assert now == before_roles[name], name
        # S's devices still write, and S takes their envelopes.
        for name in ("device1", "device2"):
            robots[name].maps["floor"].observe((2, len(name)), "after", 0.6)
            sent = robots[name].envelopes_since(s.heads(), limit=100)
            got = s.ingest(sent)
            assert got.rejected == [] and got.accepted, (name, got)
            assert s.maps["floor"].get((2, len(name))).value == "after"
        s.delegate(Identity.generate().public_key, [Role.PUBLISH])  # the site still delegates
    finally:
        for kb in (s, p, h, *robots.values()):
            kb.close()

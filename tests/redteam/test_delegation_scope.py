"""Red team, issue #13 item 1: a narrowly trusted remote root reaching into another site's grants.

Site A trusts a remote root H only to validate. Before the fix, H could write delegation and key
revocation records naming keys it does not own and strip their rights at A: delegate A's own root
key with no roles (A's own skills vanished from its views), delegate A's devices with no roles and
revoke their keys (the devices got 403 and their data vanished), after which `simnet device add`
answered 500.

Now a root's grants are its own: H's records count only for keys H delegates, only add, and only
with the roles A trusts H for; a delegation naming a root is ignored. The attack is run against a
live `simnet serve` process (H pushes its envelopes over HTTP, signed with its own key, as any
trusted peer may) and in-process through `kb.ingest`. A's views, its devices' rights, its devices'
syncing and `simnet device add` must all be as they were; H may only add what its own grant allows.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, replace

import httpx
import pytest
from click.testing import CliRunner

import federation
import knowledge
from federation import PAGE_TYPE, encode_page
from knowledge import ActivationPolicy, Identity, Role, TrustPolicy
from knowledge._envelope import decode

ALL = frozenset(Role)

TYPED_IN = ActivationPolicy(rerunnable_only=False)  # A's certificates here are typed in


def author(raw: bytes) -> bytes:
    return decode(raw, max_bytes=1 << 26).author


def simnet(home, *args: str) -> tuple[int, str, str | None]:
    """The real `simnet` entry point (knowledge.cli.run), in-process: (exit code, output,
    traceback)."""
    from knowledge.cli import run

    runner, argv = CliRunner(), sys.argv
    with runner.isolation() as (out, err, _):
        sys.argv = ["simnet", "--home", str(home), *args]
        tb = None
        try:
            run()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - what a user would see as a traceback
            tb, code = traceback.format_exc(), 1
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        return code, out.getvalue().decode() + err.getvalue().decode(), tb


def attack(
    hostile: knowledge.KnowledgeBase, site_key: bytes, devices: list[knowledge.KnowledgeBase]
) -> list[bytes]:
    """H's records naming what it does not own: A's root key and A's devices, with no roles, and key
    revocations of them (A's root at 0, the devices at 0 and pinned at their envelope 1). Returns
    H's envelopes (H holds A's feeds, so it can pin)."""
    hostile.revoke_key(site_key, 0, reason="hostile")
    for n, device in enumerate(devices):
        hostile.revoke_key(
            device.identity.public_key, n % 2, reason="hostile"
        )  # seq 0, or pinned at envelope 1
    hostile.delegate(site_key, [])
    for device in devices:
        hostile.delegate(device.identity.public_key, [])
    return [
        raw
        for raw in hostile.envelopes_since({}, limit=10**6)
        if author(raw) == hostile.identity.public_key
    ]


def views(kb: knowledge.KnowledgeBase) -> dict:
    """What A shows: skills and their state, cells, revocations (counters apart: see `counters`)."""
    snapshot = {k: v for k, v in kb.snapshot().items() if k != "counters"}
    return {
        "snapshot": snapshot,
        "skills": sorted(s.id for s in kb.skills.list()),
        "active": sorted(s.id for s in kb.skills.list() if kb.is_active(s.id)),
    }


def counters(kb: knowledge.KnowledgeBase) -> dict:
    """Per skill, per site: the PN-counter figures A files under each site."""
    return {s.id: kb.counters.per_site(s.id) for s in kb.skills.list(include_withdrawn=True)}


def smaller_key_than(key: bytes) -> Identity:
    """A fresh identity whose public key sorts below `key` (where per-site figures would be
    filed)."""
    while True:
        identity = Identity.generate()
        if identity.public_key < key:
            return identity


# --- over the wire: a live `simnet serve` ---------------------------------------------------------


@dataclass
class Live:
    site: object  # tests/redteam/conftest.py's Live
    hostile: knowledge.KnowledgeBase
    devices: list[knowledge.KnowledgeBase]
    before: dict
    roles_before: dict[bytes, frozenset[Role] | None]
    status_before: dict
    answer: httpx.Response


def read_store(site) -> knowledge.KnowledgeBase:
    return knowledge.open(site.home / "site.db")  # read-only, beside the running server


@pytest.fixture(scope="module")
def attacked(module_live, tmp_path_factory):
    site = module_live("a")
    hostile_id = smaller_key_than(site.key.public_key)
    policy = TrustPolicy.load(site.home / "trust.toml").with_root(
        hostile_id.public_key, [Role.VALIDATE], name="h"
    )
    policy = replace(policy, activation=TYPED_IN)
    (site.home / "trust.toml").write_text(policy.to_toml())
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        for name in ("walk", "grasp"):
            skill = kb.skills.publish(name, "pick")
            kb.certificates.add(skill.id, branches=128, successes=127, randomized=["mass"])
        kb.maps["hall"].observe((0, 0), "door", 0.7)
    site.start()

    devices = []
    for roles in ("publish", "publish,validate"):
        device = Identity.generate()
        code, out, tb = simnet(site.home, "device", "add", device.public_key_hex, "--roles", roles)
        assert code == 0 and tb is None, out
        kb = knowledge.open(
            ":memory:", device, policy=TrustPolicy().for_device_of(site.key.public_key)
        )
        federation.sync_with(kb, site.url, site.key.public_key)
        skill = kb.skills.publish(f"by-{roles}", "pick")
        kb.maps["hall"].observe((1, len(devices)), roles, 0.6)
        kb.counters.record(skill.id, success=True)
        federation.sync_with(kb, site.url, site.key.public_key)
        devices.append(kb)

    hostile = knowledge.open(
        tmp_path_factory.mktemp("hostile") / "h.db",
        hostile_id,
        policy=TrustPolicy().with_root(site.key.public_key),
    )
    federation.sync_with(
        hostile, site.url, site.key.public_key
    )  # H may read at A: it is a trusted root
    keys = [site.key.public_key, hostile_id.public_key, *(d.identity.public_key for d in devices)]
    with read_store(site) as kb:
        before = views(kb)
        before["counters"] = counters(kb)
        roles_before = {k: kb.roles_of(k) for k in keys}
    status_before = site.status()
    assert len(before["active"]) == 2 and len(before["skills"]) == 4

    page = attack(hostile, site.key.public_key, devices)
    with site.client(hostile_id) as client:
        answer = client.post(
            "/v1/envelopes", content=encode_page(page), headers={"content-type": PAGE_TYPE}
        )
    federation.sync_with(
        hostile, site.url, site.key.public_key
    )  # and an ordinary gossip round besides
    yield Live(site, hostile, devices, before, roles_before, status_before, answer)
    hostile.close()
    for kb in devices:
        kb.close()


def test_hostile_push_is_taken_as_data_without_harm(attacked):
    """The push of H's envelopes is answered 200 and accepted (they are validly signed by a trusted
    root); the server stays healthy and logs no traceback."""
    a = attacked
    assert a.answer.status_code == 200, a.answer.text[:500]
    body = a.answer.json()
    assert body["rejected"] == [] and body["accepted"] >= 6, body
    assert httpx.get(f"{a.site.url}/v1/health", timeout=5).status_code == 200
    a.site.assert_no_traceback()


def test_sites_views_are_unchanged(attacked):
    """A's own skills, its devices' skills and cells, certificates and activation: exactly as before
    the attack (H adds nothing A would show: its trust records name keys it does not own)."""
    a = attacked
    with read_store(a.site) as kb:
        assert views(kb) == {k: v for k, v in a.before.items() if k != "counters"}
    status = a.site.status()
    for field in ("skills", "active_skills", "certificates", "revocations", "equivocations"):
        assert status[field] == a.status_before[field], field


def test_devices_counters_stay_filed_under_their_own_site(attacked):
    """Attack: H (trusted only to validate, its key sorting below A's) delegates A's devices with
    *no* roles. A files a device's counter figures under "the smallest key among the roots that
    delegate it" — every grant counts, an empty one too — so the devices' uses and successes move
    from A's site to H's in A's views (`kb.counters.per_site`, `kb.snapshot()["counters"]`): H
    changed how A accounts for A's own devices. They must stay filed under A."""
    a = attacked
    with read_store(a.site) as kb:
        assert counters(kb) == a.before["counters"]


def test_site_key_and_devices_keep_their_rights(attacked):
    """A's root key keeps every role; A's devices keep exactly what A delegated (an empty delegation
    by H adds no role and takes none); all of them may still read."""
    a = attacked
    with read_store(a.site) as kb:
        assert kb.roles_of(a.site.key.public_key) == ALL
        for key, roles in a.roles_before.items():
            assert kb.roles_of(key) == roles, key.hex()[:16]
        for device in a.devices:
            assert kb.can_read(device.identity.public_key)
    assert a.roles_before[a.devices[0].identity.public_key] == {Role.PUBLISH}
    assert a.roles_before[a.devices[1].identity.public_key] == {Role.PUBLISH, Role.VALIDATE}


def test_devices_still_sync_and_write(attacked):
    """A's devices still sync with A over HTTP (200, never 403) and their new writes land and
    show."""
    a = attacked
    for n, device in enumerate(a.devices):
        with a.site.client(device.identity) as client:
            assert client.get("/v1/heads").status_code == 200
        skill = device.skills.publish(f"after-attack-{n}", "pick")
        report = federation.sync_with(device, a.site.url, a.site.key.public_key)
        assert report.pushed >= 1 and report.refused_by_peer == 0, report
        with read_store(a.site) as kb:
            assert kb.skills.get(skill.id).name == f"after-attack-{n}"
    a.site.assert_no_traceback()


def test_simnet_device_add_still_works(attacked):
    """`simnet device add` (through the running server's admin endpoint) still delegates, and the
    new device syncs and publishes."""
    a = attacked
    device = Identity.generate()
    code, out, tb = simnet(
        a.site.home, "device", "add", device.public_key_hex, "--roles", "publish"
    )
    assert code == 0 and tb is None and "may now publish" in out, (code, out, tb)
    with knowledge.open(
        ":memory:", device, policy=TrustPolicy().for_device_of(a.site.key.public_key)
    ) as kb:
        federation.sync_with(kb, a.site.url, a.site.key.public_key)
        skill = kb.skills.publish("newcomer", "pick")
        assert federation.sync_with(kb, a.site.url, a.site.key.public_key).pushed >= 1
    with read_store(a.site) as kb:
        assert kb.roles_of(device.public_key) == {Role.PUBLISH}
        assert kb.skills.get(skill.id).name == "newcomer"
    a.site.assert_no_traceback()


# --- in-process: kb.ingest ------------------------------------------------------------------------


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


@pytest.fixture
def scene(open_kb):
    """Site A (its own root) trusting H for validate, A's devices d1 (publish), d2 (publish,
    validate), A's two certified skills; H (trusting A) holds everything A holds."""
    a_id = Identity.generate()
    hostile_id = smaller_key_than(a_id.public_key)
    a = open_kb(
        "a",
        a_id,
        policy=TrustPolicy(activation=TYPED_IN).with_root(hostile_id.public_key, [Role.VALIDATE]),
    )
    devices = []
    for roles in ([Role.PUBLISH], [Role.PUBLISH, Role.VALIDATE]):
        d_id = Identity.generate()
        a.delegate(d_id.public_key, roles)
        device = open_kb(
            f"d{len(devices)}", d_id, policy=TrustPolicy().for_device_of(a.identity.public_key)
        )
        _sync(a, device)
        skill = device.skills.publish(f"device-skill-{len(devices)}", "pick")
        device.counters.record(skill.id, success=True)
        _sync(a, device)
        devices.append(device)
    for name in ("walk", "grasp"):
        skill = a.skills.publish(name, "pick")
        a.certificates.add(skill.id, branches=128, successes=127)
    hostile = open_kb("h", hostile_id, policy=TrustPolicy().with_root(a.identity.public_key))
    _sync(a, hostile)
    return a, hostile, devices


def test_in_process_ingest_of_the_attack_changes_nothing_at_the_site(scene):
    """The same attack through `kb.ingest`: every envelope accepted, A's views and every key's
    rights unchanged, A's devices' next envelopes accepted, A still delegates and writes as root."""
    a, hostile, devices = scene
    keys = [
        a.identity.public_key,
        hostile.identity.public_key,
        *(d.identity.public_key for d in devices),
    ]
    before, roles = views(a), {k: a.roles_of(k) for k in keys}
    assert len(before["active"]) == 2
    report = a.ingest(attack(hostile, a.identity.public_key, devices))
    assert report.rejected == [] and len(report.accepted) >= 6 and report.record_issues == [], (
        report
    )
    assert views(a) == before
    assert {k: a.roles_of(k) for k in keys} == roles
    assert a.roles_of(a.identity.public_key) == ALL
    for n, device in enumerate(devices):
        device.maps["yard"].observe((n, n), "still here", 0.5)
        got = a.ingest(device.envelopes_since(a.heads(), limit=100))
        assert got.rejected == [] and got.accepted, got
        assert a.can_read(device.identity.public_key)
    newcomer = Identity.generate()
    a.delegate(newcomer.public_key, [Role.PUBLISH])  # `simnet device add` on the store
    assert a.roles_of(newcomer.public_key) == {Role.PUBLISH}
    a.skills.publish("after", "pick")
    # A's devices, which trust only A, see H's feed as an unknown writer's and are untouched too.
    for device in devices:
        _sync(a, device)
        assert device.roles_of(device.identity.public_key) == a.roles_of(device.identity.public_key)


def test_hostile_root_adds_only_within_the_roles_it_is_trusted_for(scene):
    """What H may legitimately do: delegate keys with the roles A trusts H for. Delegating A's
    device with every role gives it validate at A (H's own grant) but never revoke or anything H
    lacks; a key of H's own delegated publish gets nothing it can publish with at A."""
    a, hostile, devices = scene
    d1 = devices[0]
    hostile.delegate(d1.identity.public_key, [Role.PUBLISH, Role.VALIDATE, Role.REVOKE])
    own_device = Identity.generate()
    hostile.delegate(own_device.public_key, [Role.PUBLISH, Role.REVOKE])
    report = a.ingest(hostile.envelopes_since(a.heads(), limit=10**6))
    assert report.rejected == []
    assert a.roles_of(d1.identity.public_key) == {Role.PUBLISH, Role.VALIDATE}
    assert a.roles_of(own_device.public_key) == frozenset()
    # The device's revocation of A's skill would need the revoke role: A has none to give through H.
    skill = next(s for s in a.skills.list() if s.name == "walk")
    assert a.is_active(skill.id)
    rogue_policy = TrustPolicy().for_device_of(hostile.identity.public_key)
    with knowledge.open(":memory:", own_device, policy=rogue_policy) as rogue:
        _sync(hostile, rogue)
        rogue.revoke(skill.id, "rogue")
        rogue.skills.publish("rogue-skill", "pick")
        pushed = a.ingest(rogue.envelopes_since(a.heads(), limit=100))
    assert pushed.rejected == [] or {r.reason for r in pushed.rejected} <= {"unauthorized"}
    assert a.is_active(skill.id) and not a.is_revoked(skill.id)
    assert "rogue-skill" not in {s.name for s in a.skills.list()}


def test_in_process_empty_delegation_does_not_refile_the_devices_counters(scene):
    """The counter half of the attack through `kb.ingest`: after H's empty delegations of A's
    devices (H's key sorts below A's), A's per-site counter figures must be unchanged (they move to
    H's site)."""
    a, hostile, devices = scene
    before = counters(a)
    assert any(a.identity.public_key_hex in per_site for per_site in before.values())
    a.ingest(attack(hostile, a.identity.public_key, devices))
    assert counters(a) == before


@pytest.mark.parametrize("h_roles", [[Role.VALIDATE], [Role.PUBLISH]])
def test_only_a_root_that_vouches_for_the_publisher_with_publish_can_withdraw_its_skills(
    open_kb, h_roles
):
    """Attack: H delegates A's device d, then withdraws d's skill. A withdrawal counts where a site
    that vouches for the publisher with the publish role also vouches for the withdrawer
    (docs/SECURITY.md: a root trusted to publish that delegates a key shares responsibility for it).
    A root trusted only to validate gives d nothing that covers a skill, so its withdrawal is not
    shown; a root A trusts to publish and that chose to vouch for d may withdraw d's skills, as d's
    own site may."""
    a_id, h_id, d_id = Identity.generate(), Identity.generate(), Identity.generate()
    a = open_kb("a", a_id, policy=TrustPolicy().with_root(h_id.public_key, h_roles))
    h = open_kb("h", h_id, policy=TrustPolicy().with_root(a_id.public_key))
    d = open_kb("d", d_id, policy=TrustPolicy().for_device_of(a_id.public_key))
    a.delegate(d_id.public_key, [Role.PUBLISH])
    _sync(a, d)
    skill = d.skills.publish("device-skill", "pick")
    _sync(a, d)
    _sync(a, h)
    assert [s.id for s in a.skills.list()] == [skill.id]
    h.delegate(d_id.public_key, [Role.PUBLISH])
    h.skills.withdraw(skill.id, "hostile")  # H's own store, which trusts A fully, lets it
    report = a.ingest(h.envelopes_since(a.heads(), limit=10**6))
    assert report.rejected == []
    if h_roles == [Role.VALIDATE]:
        assert [s.id for s in a.skills.list()] == [skill.id]
        assert "withdrawn by its site" not in a.activation(skill.id).reasons
    else:
        assert a.skills.list() == []
        assert "withdrawn by its site" in a.activation(skill.id).reasons


def test_revoked_device_stays_revoked_for_what_needed_its_sites_grant(scene):
    """A revokes its device d1 at its current seq; H re-delegates d1 (validate, all H may give).
    d1's later envelopes may then be taken on H's grant, but its later skills (publish: only A's
    grant gives it, and that grant ends at last_seq) are never shown at A."""
    a, hostile, devices = scene
    d1 = devices[0]
    held = a.heads()[d1.identity.public_key_hex].seq
    a.revoke_key(d1.identity.public_key, held, reason="lost")
    _sync(a, hostile)
    hostile.delegate(d1.identity.public_key, [Role.VALIDATE, Role.PUBLISH])
    a.ingest(hostile.envelopes_since(a.heads(), limit=10**6))
    d1.skills.publish("after-revocation", "pick")
    a.ingest(d1.envelopes_since(a.heads(), limit=100))
    assert "after-revocation" not in {s.name for s in a.skills.list()}
    assert a.roles_of(d1.identity.public_key) <= {Role.PUBLISH, Role.VALIDATE}

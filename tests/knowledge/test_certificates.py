"""kb.certificates and kb.tasks: task definitions as records, which certificates can be re-run,
spot checks, disputes, and how each changes activation at sites with different policies."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

import knowledge
from knowledge import ActivationPolicy, Identity, Role, TrustPolicy, UnknownTaskError

TASK = {"format": "simnet.task/1", "name": "reach", "horizon": 50, "scene": "<mujoco/>"}
OTHER_TASK = {**TASK, "name": "push"}
WEIGHTS = "ab" * 32
SKILL_HASH = "cd" * 32


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def evaluation(task: dict, successes: list[int], **policy) -> dict:
    """A record shaped as a simulator evaluation: what activation reads (sim writes real ones)."""
    return {
        "format": "simnet.sim.evaluation/1",
        "task": {"hash": knowledge.content_hash(task), "name": task["name"], "definition": task},
        "sampler": {"seed": 0, "terms": []},
        "policy": {"kind": "mlp", "skill_hash": SKILL_HASH, "weights_sha256": WEIGHTS, **policy},
        "outcomes": {"success": successes},
    }


def certify(kb, skill, successes: list[int], task: dict = TASK, changes: dict | None = None):
    record = evaluation(task, successes)
    record.update(changes or {})
    return kb.certificates.add(
        skill.id, branches=len(successes), successes=sum(successes), evaluation=record
    )


def publish(kb, tasks=(TASK,)):
    hashes = [kb.tasks.publish(t) for t in tasks]
    policy = {"kind": "mlp", "weights": WEIGHTS, "skill_hash": SKILL_HASH, "architecture": {}}
    return kb.skills.publish("reach-1", "reach", policy=policy, blobs=[WEIGHTS], tasks=hashes)


def sync(*kbs):
    for a in kbs:
        for b in kbs:
            if a is not b:
                b.ingest(a.envelopes_since(b.heads()))


STRICT = ActivationPolicy(min_branches=64, min_lower_bound=0.9)
GOOD = [1] * 64


# --- tasks ----------------------------------------------------------------------------------------


def test_a_task_is_named_by_its_definition_and_replicates():
    a, b = (knowledge.open(":memory:", Identity.generate()) for _ in range(2))
    b.set_policy(TrustPolicy().with_root(a.identity.public_key))
    task_hash = a.tasks.publish(TASK)
    assert task_hash == knowledge.content_hash(TASK) and a.tasks.publish(TASK) == task_hash
    assert a.tasks.get(task_hash) == TASK and a.tasks.name(task_hash) == "reach"
    skill = publish(a)
    assert skill.tasks == (task_hash,)
    sync(a, b)
    assert task_hash in b.tasks and b.tasks.list() == [task_hash]
    assert b.skills.get(skill.id).tasks == (task_hash,)
    with pytest.raises(UnknownTaskError, match="no task definition"):
        b.tasks.get("00" * 32)


def test_a_task_carries_the_files_its_definition_names_as_blobs():
    kb = knowledge.open(":memory:", Identity.generate())
    mesh, texture = b"a mesh" * 100, b"a texture" * 100
    names = {"meshes/link.stl": sha(mesh), "textures/grid.png": sha(texture)}
    task = {**TASK, "assets": names}
    with pytest.raises(knowledge.BlobError, match="'textures/grid.png'.*not stored here"):
        kb.tasks.publish(task, assets={"meshes/link.stl": mesh})
    with pytest.raises(knowledge.BlobError, match="'meshes/link.stl': its bytes hash to"):
        kb.tasks.publish(task, assets={"meshes/link.stl": texture, "textures/grid.png": texture})
    with pytest.raises(knowledge.BlobError, match="'other.stl' is not named"):
        kb.tasks.publish(task, assets={"other.stl": mesh})
    with pytest.raises(knowledge.RecordError, match="must map file names to blob sha256"):
        kb.tasks.publish({**TASK, "assets": {"meshes/link.stl": "not a hash"}})
    assert kb.tasks.list() == [] and kb.blobs.list() == []  # nothing of a refused task is kept
    task_hash = kb.tasks.publish(
        task, assets={"meshes/link.stl": mesh, "textures/grid.png": texture}
    )
    assert task_hash == knowledge.content_hash(task) and kb.tasks.assets(task_hash) == names
    assert kb.blobs.get(names["meshes/link.stl"]) == mesh
    assert kb.tasks.publish(task) == task_hash  # its files are held: publishing again needs none
    assert kb.tasks.assets(kb.tasks.publish(OTHER_TASK)) == {}


def test_a_task_too_large_for_a_record_is_refused_and_nothing_is_written():
    kb = knowledge.open(":memory:", Identity.generate())
    with pytest.raises(knowledge.RecordError, match="exceeds"):
        kb.tasks.publish({**TASK, "scene": "x" * 300_000})
    assert kb.tasks.list() == []


def test_a_skill_without_tasks_keeps_its_old_record_shape():
    kb = knowledge.open(":memory:", Identity.generate())
    skill = kb.skills.publish("s", "t")
    assert skill.tasks == () and "tasks" not in kb._replica.views.skill(skill.id)


# --- re-runnable certificates ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"evaluation": None}, "carries no evaluation record"),
        ({"format": "my-own/1"}, "not a simulator evaluation"),
        ({"sampler": None}, "lacks the task definition or the sampler"),
        ({"task": {"hash": "00" * 32, "definition": TASK}}, "does not hash"),
        ({"outcomes": {"success": [1] * 63}}, "do not add up"),
        ({"policy": {"kind": "mlp", "skill_hash": "ee" * 32}}, "other weights"),
        ({"policy": {"kind": "callable", "class": "x.f"}}, "no other site can load"),
    ],
)
def test_only_a_certificate_another_site_can_re_run_counts(change, why):
    kb = knowledge.open(":memory:", Identity.generate(), policy=TrustPolicy(activation=STRICT))
    skill = publish(kb)
    if "evaluation" in change:
        kb.certificates.add(skill.id, branches=64, successes=64, evaluation=None)
    else:
        certify(kb, skill, GOOD, changes=change)
    activation = kb.activation(skill.id)
    assert not activation.active
    assert any("cannot be re-run" in r and why in r for r in activation.reasons), activation
    kb.set_policy(TrustPolicy(activation=ActivationPolicy(rerunnable_only=False)))
    assert kb.is_active(skill.id)  # the policy option turns the rule off


def test_a_certificate_for_a_task_the_skill_does_not_name_does_not_count():
    kb = knowledge.open(":memory:", Identity.generate(), policy=TrustPolicy(activation=STRICT))
    skill = publish(kb)
    certify(kb, skill, GOOD, task=OTHER_TASK)
    assert not kb.is_active(skill.id)
    assert "which the skill does not name" in " ".join(kb.activation(skill.id).reasons)
    certify(kb, skill, GOOD)
    assert kb.is_active(skill.id)


# --- spot checks and disputes across sites --------------------------------------------------------


@pytest.fixture
def fleet():
    """Site A publishes; validator sites B and C certify; every site trusts the others."""
    keys = [Identity.generate() for _ in range(3)]
    sites = []
    for key in keys:
        policy = TrustPolicy(activation=STRICT)
        for other in keys:
            if other is not key:
                policy = policy.with_root(other.public_key)
        sites.append(knowledge.open(":memory:", key, policy=policy))
    return sites


def with_spot_checks(kb, **options):
    kb.set_policy(TrustPolicy(kb.policy.roots, ActivationPolicy(**{**STRICT.__dict__, **options})))


def test_with_spot_checks_a_remote_certificate_counts_once_this_site_reproduced_it(fleet):
    a, b, _ = fleet
    skill = publish(a)
    sync(a, b)
    cert = certify(b, skill, GOOD)
    sync(a, b)
    assert a.is_active(skill.id) and a.certificates.awaiting_check() == []
    with_spot_checks(a, spot_check_branches=8)
    assert not a.is_active(skill.id)
    assert "awaits a spot check here" in " ".join(a.activation(skill.id).reasons)
    assert [c.id for c in a.certificates.awaiting_check()] == [cert.id]
    assert b.certificates.awaiting_check() == []  # B's own certificate needs no check at B
    check = a.certificates.check(cert, reproduced=True, branches=[0, 5, 9])
    assert a.is_active(skill.id) and a.certificates.awaiting_check() == []
    assert check.branches == (0, 5, 9) and a.certificates.checks(cert.id) == [check]
    a.revoke(skill.id)
    assert a.certificates.awaiting_check() == []


def test_another_sites_reproduction_does_not_stand_in_for_this_sites(fleet):
    a, b, c = fleet
    skill = publish(a)
    sync(a, b, c)
    cert = certify(b, skill, GOOD)
    sync(a, b, c)
    c.certificates.check(cert, reproduced=True, branches=[1])
    sync(a, b, c)
    with_spot_checks(a, spot_check_fraction=0.25)
    assert a.policy.activation.spot_check_size(64) == 16
    assert not a.is_active(skill.id) and len(a.certificates.checks(cert.id)) == 1


def test_a_dispute_replicates_and_stops_the_certificate_counting_everywhere(fleet):
    a, b, c = fleet
    skill = publish(a)
    sync(a, b, c)
    cert = certify(b, skill, GOOD)
    sync(a, b, c)
    assert all(s.is_active(skill.id) for s in (a, b, c))
    dispute = c.certificates.check(
        cert,
        reproduced=False,
        branches=[3, 4],
        detail="2 of 2 re-run branches fail where the record says success",
        evidence={"recorded": [1, 1], "rerun": [0, 0]},
    )
    sync(a, b, c)
    for site in (a, b, c):
        assert site.certificates.disputes(cert.validator) == [dispute]
        assert not site.is_active(skill.id)
        assert "is disputed by" in " ".join(site.activation(skill.id).reasons)
    assert a.certificates.disputes()[0].evidence == {"recorded": [1, 1], "rerun": [0, 0]}


def test_k_disputes_stop_every_certificate_of_that_validator_counting(fleet):
    a, b, c = fleet
    skills = [publish(a, tasks=(dict(TASK, horizon=h),)) for h in (10, 20, 30)]
    sync(a, b, c)
    certs = [
        certify(b, s, GOOD, task=dict(TASK, horizon=h))
        for s, h in zip(skills, (10, 20, 30), strict=True)
    ]
    with_spot_checks(a, distrust_after_disputes=2)
    c.certificates.check(certs[0], reproduced=False, branches=[0])
    sync(a, b, c)
    assert [a.is_active(s.id) for s in skills] == [False, True, True]
    c.certificates.check(certs[1], reproduced=False, branches=[0])
    sync(a, b, c)
    assert [a.is_active(s.id) for s in skills] == [False, False, False]
    assert "2 disputed certificates" in " ".join(a.activation(skills[2].id).reasons)
    with_spot_checks(a, distrust_after_disputes=0)  # 0: a dispute voids only what it names
    assert [a.is_active(s.id) for s in skills] == [False, False, True]


def test_a_dispute_naming_no_certificate_held_here_is_no_evidence(fleet):
    a, b, c = fleet
    skill = publish(a)
    sync(a, b, c)
    cert = certify(b, skill, GOOD)
    sync(a, b, c)
    invented = dataclasses.replace(cert, id="ab" * 32)  # b's key, a certificate that never was
    c.certificates.check(invented, reproduced=False, branches=[0])
    sync(a, b, c)
    assert len(a.certificates.disputes(cert.validator)) == 1
    assert a.is_active(skill.id)  # neither the real certificate nor its validator is touched


def test_a_dispute_from_a_checker_the_policy_does_not_count_changes_nothing(fleet):
    a, b, c = fleet
    skill = publish(a)
    sync(a, b, c)
    cert = certify(b, skill, GOOD)
    sync(a, b, c)
    a.set_policy(  # A counts only B's certificates, so only B's word on failures too
        TrustPolicy(
            a.policy.roots,
            ActivationPolicy(**{**STRICT.__dict__, "validators": {b.identity.public_key}}),
        )
    )
    c.certificates.check(cert, reproduced=False, branches=[0])
    sync(a, b, c)
    assert a.is_active(skill.id) and not b.is_active(skill.id)


def test_spot_checking_needs_the_validate_role(fleet):
    a, b, _ = fleet
    skill = publish(a)
    sync(a, b)
    cert = certify(b, skill, GOOD)
    sync(a, b)
    robot = knowledge.open(
        ":memory:", Identity.generate(), policy=TrustPolicy().for_device_of(a.identity.public_key)
    )
    a.delegate(robot.identity.public_key, [Role.PUBLISH])
    robot.ingest(a.envelopes_since({}))
    robot.learn_site_heads(a.heads())
    with pytest.raises(knowledge.NotAuthorizedError):
        robot.certificates.check(cert, reproduced=False, branches=[0])


def test_spot_check_policy_reads_and_writes_toml():
    policy = TrustPolicy.from_toml(
        "[activation]\nspot_check_branches = 16\nspot_check_fraction = 0.1\n"
        "spot_check_budget_s = 30\ndistrust_after_disputes = 3\nrerunnable_only = false\n"
    )
    a = policy.activation
    assert (a.spot_check_branches, a.spot_check_fraction, a.spot_check_budget_s) == (16, 0.1, 30.0)
    assert a.distrust_after_disputes == 3 and not a.rerunnable_only and a.spot_checks
    assert a.spot_check_size(100) == 16 and a.spot_check_size(1000) == 100
    assert a.spot_check_size(8) == 8
    assert TrustPolicy.from_toml(policy.to_toml()) == policy
    with pytest.raises(knowledge.PolicyError, match="rerunnable_only must be true or false"):
        TrustPolicy.from_toml("[activation]\nrerunnable_only = 1\n")
    with pytest.raises(knowledge.PolicyError, match="spot_check_fraction must lie in"):
        TrustPolicy.from_toml("[activation]\nspot_check_fraction = 2\n")

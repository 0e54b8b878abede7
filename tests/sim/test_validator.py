"""The validator service: its queue derived from the knowledge base, its priorities, and what it
does with skills it cannot evaluate (a clear state, never a stuck queue or a crash)."""

from __future__ import annotations

import json
import logging
import random
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, SiteHome, TrustPolicy
from knowledge.cli import main
from sim.validation import Validator, ValidatorSettings, fleet_sampler

POLICY = ActivationPolicy(min_branches=16, min_lower_bound=0.5, spot_check_branches=8)
FAST = ValidatorSettings(branches=16, retry_s=60.0, max_attempts=2)


@pytest.fixture
def home(tmp_path):
    """A site (its own root: every role) whose store holds nothing yet."""
    home = SiteHome(tmp_path / "site")
    home.path.mkdir()
    Identity.generate().save(home.key)
    home.policy.write_text(TrustPolicy(activation=POLICY).to_toml())
    knowledge.open(home.store, Identity.load(home.key, new=True)).close()  # born together
    return home


def publish(kb, name="reach", skill="arm_reach_good", task=None):
    return sim.publish_skill(kb, sim.load_skill(skill), name, "reach", tasks=[task])


def state(home):
    return json.loads((home.path / "validator.json").read_text())


def test_it_certifies_what_lacks_a_certificate_and_then_has_nothing_to_do(home, short_arm):
    with home.open_writer() as kb:
        skill = publish(kb, task=short_arm)
        kb.skills.publish("no-task", "reach")  # names no task: nothing to evaluate it on
        validator = Validator(kb, FAST, home=home.path, rng=random.Random(0))
        (job,) = validator.queue()
        assert (job.kind, job.skill, job.why) == ("evaluate", skill.id, "uncertified")
        assert validator.step() == job
        (cert,) = kb.certificates.for_skill(skill.id)
        assert cert.branches == 16 and cert.validator == kb.identity.public_key_hex
        assert kb.is_active(skill.id) and validator.queue() == [] and validator.step() is None
    s = state(home)
    assert s["certificates"] == 1 and s["branches_evaluated"] == 16 and s["branches_per_s"] > 0
    assert s["state"] == "idle" and s["queued"] == 0 and s["failed"] == []


def test_a_skill_with_two_tasks_is_certified_on_each_and_a_restart_does_only_the_rest(
    home, short_arm
):
    shorter = short_arm.replace(horizon=15)
    with home.open_writer() as kb:
        skill = sim.publish_skill(
            kb, sim.load_skill("arm_reach_good"), "reach", "reach", tasks=[short_arm, shorter]
        )
        result = sim.evaluate(short_arm, sim.load_policy(kb, skill.id), branches=16, progress=False)
        sim.certify(kb, skill.id, result)  # as if a validator had stopped after the first task
        kb.set_policy(TrustPolicy(activation=replace(POLICY, min_validators=2)))  # stays inactive
        validator = Validator(kb, FAST, home=home.path)
        validator.step()
        tasks = [c.evaluation["task"]["hash"] for c in kb.certificates.for_skill(skill.id)]
        assert sorted(tasks) == sorted([short_arm.hash, shorter.hash])
        assert validator.queue() == []


def test_the_fleet_sampler_randomizes_what_activation_asks_for(short_arm):
    sampler = fleet_sampler(short_arm, seed=5)
    record = sim.evaluate(
        short_arm, sim.load_skill("arm_reach_good"), branches=4, sampler=sampler, progress=False
    ).to_record()
    assert {"mass", "friction", "damping", "gain"} <= set(sim.randomized(record))
    assert all("target" not in t["target"].split("/")[1] for t in sampler.to_json()["terms"])


def test_the_fleet_sampler_reaches_unnamed_actuators_through_their_joints():
    humanoid = Path(__file__).parents[2] / "examples" / "robots" / "humanoid_small.xml"
    task = sim.stand_task(humanoid, base_body="torso", height=0.8)
    targets = [t.target for t in fleet_sampler(task, seed=1).terms]
    assert "actuator@joint/left_knee/gain" in targets


def test_requests_then_spot_checks_then_use_order_the_queue(home, short_arm, tmp_path):
    other = knowledge.open(tmp_path / "other.db", Identity.generate())
    with home.open_writer() as kb:
        policy = kb.policy.with_root(other.identity.public_key)
        kb.set_policy(policy)
        home.policy.write_text(policy.to_toml())
        other.set_policy(TrustPolicy().with_root(kb.identity.public_key))
        used, plain, asked = (publish(kb, n, task=short_arm) for n in ("used", "plain", "asked"))
        for _ in range(3):
            kb.counters.record(used.id, success=True)
        remote = publish(other, "remote", task=short_arm)
        cert = sim.certify(
            other,
            remote.id,
            sim.evaluate(
                short_arm, sim.load_skill("arm_reach_good"), branches=16, wave=8, progress=False
            ),
        )
        kb.ingest(other.envelopes_since({}))
        for blob in other.blobs.list():
            kb.blobs.put(other.blobs.get(blob))
        (home.path / "validator.requests").write_text(asked.id + "\n")
        validator = Validator(kb, FAST, home=home.path)
        queue = validator.queue()
        assert [(j.kind, j.name, j.why) for j in queue] == [
            ("evaluate", "asked", "requested"),
            ("spot_check", "remote", "spot check"),
            ("evaluate", "used", "used 3 times here"),
            ("evaluate", "plain", "uncertified"),
        ]
        assert queue[1].certificate == cert.id
        validator.step()
        validator.step()
        assert kb.certificates.checks(cert.id)[0].reproduced and kb.is_active(remote.id)
    other.close()


def test_skills_it_cannot_evaluate_wait_or_fail_with_a_reason_and_the_rest_proceed(home, short_arm):
    with home.open_writer() as kb:
        good = publish(kb, "good", task=short_arm)
        record = dict(good.policy)
        record["architecture"] = {**record["architecture"], "hidden": [8]}
        wrong = kb.skills.publish(
            "wrong-spec", "reach", policy=record, blobs=good.blobs, tasks=good.tasks
        )
        no_weights = kb.skills.publish(
            "no-weights", "reach", policy={**good.policy, "weights": "00" * 32}, tasks=good.tasks
        )
        broken = kb.tasks.publish({"format": "simnet.task/1", "name": "no-scene"})
        bad_task = kb.skills.publish("bad-task", "reach", policy=good.policy, tasks=[broken])
        validator = Validator(kb, replace(FAST, max_attempts=1), home=home.path)
        for _ in range(10):
            validator.step()
        assert kb.is_active(good.id)
        s = state(home)
        failed = {f["name"]: f for f in s["failed"]}
        waiting = {w["name"]: w for w in s["waiting"]}
        assert set(failed) == {"wrong-spec", "bad-task"} and set(waiting) == {"no-weights"}
        assert "PolicyPayloadError" in failed["wrong-spec"]["reason"]
        assert "TaskDefinitionError" in failed["bad-task"]["reason"]
        assert failed["bad-task"]["attempts"] == 1 and failed["bad-task"]["retry_at"] is None
        assert "waiting: " in waiting["no-weights"]["reason"] and waiting["no-weights"]["retry_at"]
        assert validator.queue() == []  # nothing retried in a tight loop
        assert {wrong.id, no_weights.id, bad_task.id}.isdisjoint(
            c.skill for s_ in kb.skills.list() for c in kb.certificates.for_skill(s_.id)
        )
    with home.open_writer() as kb:  # a restart remembers what failed
        assert Validator(kb, FAST, home=home.path).queue() == []


def test_a_task_over_the_step_budget_is_refused_unstarted_and_the_rest_proceed(home, short_arm):
    """A writer may name a task that takes longer than this site will spend on one branch: the
    job is refused at once, with what it would take and what to change, and never retried."""
    endless = short_arm.replace(horizon=5_000)  # 50,000 physics steps a branch, over the default
    with home.open_writer() as kb:
        hostile = publish(kb, "endless", task=endless)  # first: the oldest job
        honest = publish(kb, "honest", task=short_arm)
        validator = Validator(kb, FAST, home=home.path)
        assert [j.name for j in validator.queue()] == ["endless", "honest"]
        validator.step()
        (failed,) = state(home)["failed"]
        assert failed["name"] == "endless" and state(home)["branches_evaluated"] == 0
        assert failed["attempts"] == 1 and failed["retry_at"] is None  # given up at once
        for phrase in (endless.name, endless.hash[:12], "5,000 x 10 = 50,000", "20,000"):
            assert phrase in failed["reason"], (phrase, failed["reason"])
        assert "raise max_branch_steps in validator.toml" in failed["reason"]
        assert [j.name for j in validator.queue()] == ["honest"]
        validator.step()
        assert kb.is_active(honest.id) and not kb.certificates.for_skill(hostile.id)
        assert validator.queue() == []


def test_a_certificate_over_the_step_budget_is_not_spot_checked(home, short_arm, tmp_path):
    other = knowledge.open(tmp_path / "other.db", Identity.generate())
    with home.open_writer() as kb:
        policy = kb.policy.with_root(other.identity.public_key)
        kb.set_policy(policy)
        other.set_policy(TrustPolicy().with_root(kb.identity.public_key))
        remote = publish(other, "remote", task=short_arm)
        result = sim.evaluate(short_arm, sim.load_policy(other, remote.id), branches=16, wave=8)
        cert = sim.certify(other, remote.id, result)
        kb.ingest(other.envelopes_since({}))
        for blob in other.blobs.list():
            kb.blobs.put(other.blobs.get(blob))
        budget = replace(FAST, max_branch_steps=short_arm.physics_steps - 1)
        validator = Validator(kb, budget, home=home.path)
        (job,) = validator.queue()
        assert (job.kind, job.certificate) == ("spot_check", cert.id)
        validator.step()
        (failed,) = state(home)["failed"]
        assert failed["certificate"] == cert.id and "over this site's budget" in failed["reason"]
        assert not kb.certificates.checks(cert.id) and validator.queue() == []
    other.close()


def test_a_certificate_whose_wave_is_over_the_budget_is_not_spot_checked(home, short_arm, tmp_path):
    """A spot check re-runs another validator's record in its own layout: a wave of
    `layout.wave` simulations, however few branches it holds. The validator took it as recorded
    (its scene checked with this site's own wave of 16): a wave of 10^9 asked the batch for
    hundreds of GB (std::bad_alloc, retried), one of a few million took gigabytes and hours. Now a
    wave over max(branches, 64) is refused unstarted, never retried, naming the wave and the
    budget; a certificate within it is spot-checked as before."""
    other = knowledge.open(tmp_path / "other.db", Identity.generate())
    with home.open_writer() as kb:
        kb.set_policy(kb.policy.with_root(other.identity.public_key))
        other.set_policy(TrustPolicy().with_root(kb.identity.public_key))
        remote = publish(other, "remote", task=short_arm)
        result = sim.evaluate(short_arm, sim.load_policy(other, remote.id), branches=16, wave=8)
        record = result.to_record()
        hostile = sim.certify(
            other, remote.id, {**record, "layout": {**record["layout"], "wave": 10**9}}
        )
        kb.ingest(other.envelopes_since({}))
        for blob in other.blobs.list():
            kb.blobs.put(other.blobs.get(blob))
        validator = Validator(kb, FAST, home=home.path)
        (job,) = validator.queue()
        assert (job.kind, job.certificate) == ("spot_check", hostile.id)
        validator.step()
        (failed,) = state(home)["failed"]
        assert failed["certificate"] == hostile.id and failed["retry_at"] is None, failed
        for phrase in ("over budget", "layout.wave asks for 1,000,000,000 simulations", "of 64"):
            assert phrase in failed["reason"], (phrase, failed["reason"])
        assert "branches in validator.toml" in failed["reason"]
        assert not kb.certificates.checks(hostile.id) and state(home)["spot_checks"] == 0

        honest = sim.certify(other, remote.id, result)  # wave 8
        kb.ingest(other.envelopes_since({}))
        (job,) = validator.queue()
        assert job.certificate == honest.id
        validator.step()
        (check,) = kb.certificates.checks(honest.id)
        assert check.reproduced and state(home)["spot_checks"] == 1
    other.close()


def test_writers_take_turns_whatever_their_clocks_say(home, short_arm, tmp_path):
    """One writer's many early-dated skills get it one job per turn, not the whole queue."""
    other = knowledge.open(tmp_path / "other.db", Identity.generate())
    with home.open_writer() as kb:
        kb.set_policy(kb.policy.with_root(other.identity.public_key))
        other.set_policy(TrustPolicy().with_root(kb.identity.public_key))
        for name in ("flood-1", "flood-2", "flood-3"):  # earlier than anything here
            publish(other, name, task=short_arm)
        kb.ingest(other.envelopes_since({}))
        publish(kb, "honest", task=short_arm)
        validator = Validator(kb, FAST, home=home.path)
        assert [j.name for j in validator.queue()] == ["flood-1", "honest", "flood-2", "flood-3"]
        ran = [validator.step().name for _ in range(4)]  # type: ignore[union-attr]
        assert ran == ["flood-1", "honest", "flood-2", "flood-3"]  # not the flood's next job
    other.close()


def test_a_skill_naming_many_tasks_is_budgeted_for_all_of_them(home, short_arm):
    """The budget is a branch of each of a job's tasks together: naming many short tasks costs a
    writer as much as one long one."""
    tasks = [short_arm.replace(horizon=short_arm.horizon + i) for i in range(3)]
    budget = replace(FAST, max_branch_steps=sum(t.physics_steps for t in tasks) - 1)
    with home.open_writer() as kb:
        many = sim.publish_skill(kb, sim.load_skill("arm_reach_good"), "many", "reach", tasks=tasks)
        validator = Validator(kb, budget, home=home.path)
        validator.step()
        (failed,) = state(home)["failed"]
        assert failed["skill"] == many.id and "its 3 tasks take" in failed["reason"]
        assert state(home)["branches_evaluated"] == 0


def test_the_step_budget_is_checked_on_load(home):
    (home.path / "validator.toml").write_text("max_branch_steps = 0\n")
    with pytest.raises(knowledge.PolicyError, match="max_branch_steps must be an integer >= 1"):
        ValidatorSettings.load(home.path / "validator.toml")
    (home.path / "validator.toml").write_text("max_branch_steps = 100_000\n")
    assert ValidatorSettings.load(home.path / "validator.toml").max_branch_steps == 100_000


def test_the_job_time_budget_is_checked_on_load(home):
    assert ValidatorSettings().max_job_s == 600
    for bad in ("0", "-1", "true", '"ten"'):
        (home.path / "validator.toml").write_text(f"max_job_s = {bad}\n")
        with pytest.raises(knowledge.PolicyError, match="max_job_s must be a number > 0"):
            ValidatorSettings.load(home.path / "validator.toml")
    (home.path / "validator.toml").write_text("max_job_s = 1800\n")
    assert ValidatorSettings.load(home.path / "validator.toml").max_job_s == 1800


def test_simnet_validate_once_and_request(home, short_arm):
    with home.open_writer() as kb:
        first, second = (publish(kb, n, task=short_arm) for n in ("first", "second"))
    runner = CliRunner()
    out = runner.invoke(main, ["--home", str(home.path), "validate", "--request", "second"])
    assert out.exit_code == 0 and "requested second" in out.output, out.output
    out = runner.invoke(
        main, ["--home", str(home.path), "validate", "--once", "--branches", "16", "--json"]
    )
    assert out.exit_code == 0, out.output
    final = json.loads(out.output)
    assert final["certificates"] == 2 and final["state"] == "stopped"
    with home.open_readonly() as kb:
        assert kb.is_active(first.id) and kb.is_active(second.id)
    bad = runner.invoke(main, ["--home", str(home.path), "validate", "--request", "nothing"])
    assert bad.exit_code != 0 and "nothing" in bad.output


def test_a_validator_making_certificates_its_own_site_does_not_count_says_so(home, caplog):
    """The stranger's validator certified 16 branches where the site's policy asks 64, and only
    the skills staying inactive told why: now its start says so."""
    stop = threading.Event()
    stop.set()  # start, and stop at once: the warning is what is wanted
    with home.open_writer() as kb, caplog.at_level(logging.WARNING, "sim.validation"):
        Validator(kb, replace(FAST, branches=8), home=home.path).run(stop)
        Validator(kb, replace(FAST, branches=16), home=home.path).run(stop)  # what POLICY asks
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "branches = 8 is below this site's activation policy (min_branches = 16)" in warning

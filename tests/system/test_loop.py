"""The loop closes by itself across real processes: a robot publishes a skill with its weights and
task, a validator site's `serve --validate` evaluates and certifies it, a spot-checking site re-runs
part of every remote certificate before counting it and disputes a forged one, the dispute spreads,
and a revocation turns the skill off everywhere. Sim and federation together, as a fleet runs them.
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace

import knowledge
import sim
from federation import sync_with
from sim.evaluation._evaluation_record import _summary

from ..conftest import simnet_here
from .conftest import SiteProcess, simnet, wait_until

BRANCHES = 64


def configure(site: SiteProcess, *, validator: str = "", **activation) -> None:
    policy = knowledge.TrustPolicy.load(site.home / "trust.toml")
    rules = replace(policy.activation, min_branches=BRANCHES, min_lower_bound=0.8, **activation)
    (site.home / "trust.toml").write_text(replace(policy, activation=rules).to_toml())
    (site.home / "validator.toml").write_text(validator)


def device(site: SiteProcess, roles: str) -> knowledge.KnowledgeBase:
    """A device of `site` under its site's policy, synced once."""
    identity = knowledge.Identity.generate()
    simnet_here(site.home, "device", "add", identity.public_key_hex, "--roles", roles)
    policy = knowledge.TrustPolicy.load(site.home / "trust.toml")
    kb = knowledge.open(":memory:", identity, policy=policy.for_device_of(site.key.public_key))
    sync_with(kb, site.url, site.key.public_key)
    return kb


def active(site: SiteProcess, skill_id: str) -> bool:
    with knowledge.open(site.home / "site.db", policy=site.home / "trust.toml") as kb:
        return kb.is_active(skill_id)


def disputes(site: SiteProcess) -> list[knowledge.SpotCheck]:
    with knowledge.open(site.home / "site.db", policy=site.home / "trust.toml") as kb:
        return kb.certificates.disputes()


def validator_state(site: SiteProcess) -> dict:
    path = site.home / "validator.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_the_loop_certifies_spot_checks_disputes_and_revokes(fleet):
    publisher, validator, checker, liar_site = (
        fleet.add(n) for n in ("publisher", "validator", "checker", "liar")
    )
    fleet.mesh()
    configure(publisher)  # counts certificates without re-running them
    configure(validator, validator=f"branches = {BRANCHES}\n")
    configure(checker, validator="certifies = false\n", spot_check_branches=16)
    configure(liar_site)
    publisher.start()
    validator.start("--validate")
    checker.start("--validate")
    liar_site.start()

    robot = device(publisher, "publish")
    task = sim.load_task("arm_reach")
    good = sim.publish_skill(robot, sim.load_skill("arm_reach_good"), "good", "reach", tasks=[task])
    bad = sim.publish_skill(
        robot, sim.load_skill("arm_reach_degraded"), "degraded", "reach", tasks=[task]
    )
    report = sync_with(
        robot, publisher.url, publisher.key.public_key, push_blobs=[*good.blobs, *bad.blobs]
    )
    assert report.blobs_pushed == 2

    # a validator device of the liar's site signs the degraded skill as flawless
    liar = device(liar_site, "validate")
    wait_until(
        lambda: sync_with(liar, liar_site.url, liar_site.key.public_key) and bad.id in liar.skills,
        60,
        "the degraded skill to reach the liar",
    )
    liar.blobs.put(robot.blobs.get(bad.blobs[0]))
    record = sim.evaluate(
        task, sim.load_policy(liar, bad.id), branches=BRANCHES, wave=16, progress=False
    ).to_record()
    assert sum(record["outcomes"]["success"]) < BRANCHES
    record["outcomes"]["success"] = [1] * BRANCHES
    record["summary"] = _summary(BRANCHES, BRANCHES, record["summary"]["mean_return"], 0.95)
    forged = liar.certificates.add(
        bad.id,
        branches=BRANCHES,
        successes=BRANCHES,
        randomized=sim.randomized(record),
        evaluation=record,
    )
    sync_with(liar, liar_site.url, liar_site.key.public_key)

    sites = (publisher, validator, checker, liar_site)
    wait_until(lambda: all(active(s, good.id) for s in sites), 120, "the good skill active")
    wait_until(lambda: all(disputes(s) for s in sites), 120, "the dispute everywhere")
    (dispute,) = disputes(publisher)
    assert dispute.certificate == forged.id and dispute.checker == checker.key.public_key_hex
    assert not dispute.reproduced and "differ from the record" in dispute.detail
    assert dispute.evidence["recorded_success"] == [1] * 16
    assert not any(active(s, bad.id) for s in sites)
    state = validator_state(checker)
    assert state["spot_checks"] >= 2 and state["disputes"] == 1 and state["certificates"] == 0
    status = json.loads(simnet(checker.home, "status", "--json").stdout)
    assert status["validator"]["disputes"] == 1

    simnet(publisher.home, "revoke", good.id, "--reason", "end of test")
    wait_until(lambda: not any(active(s, good.id) for s in sites), 60, "the revocation")


def test_a_validator_killed_mid_evaluation_resumes_and_certifies_once(fleet):
    publisher, validator = fleet.add("publisher"), fleet.add("validator")
    fleet.mesh()
    configure(publisher)
    # 16 waves of 64: the kill lands after the first, with 15 to go (the check below makes sure)
    configure(validator, validator=f"branches = {16 * BRANCHES}\n")
    publisher.start()
    validator.start("--validate")
    robot = device(publisher, "publish")
    task = sim.load_task("arm_reach")
    skill = sim.publish_skill(
        robot, sim.load_skill("arm_reach_good"), "good", "reach", tasks=[task]
    )
    sync_with(robot, publisher.url, publisher.key.public_key, push_blobs=list(skill.blobs))
    wait_until(
        lambda: (validator_state(validator).get("current") or {}).get("done", 0) > 0,
        120,
        "the evaluation under way",
    )
    validator.stop(signal.SIGKILL)
    with knowledge.open(validator.home / "site.db") as kb:  # killed before it could certify
        assert kb.certificates.for_skill(skill.id) == []
    validator.start("--validate")
    wait_until(lambda: active(publisher, skill.id), 300, "the skill certified after the restart")
    with knowledge.open(validator.home / "site.db") as kb:
        assert len(kb.certificates.for_skill(skill.id)) == 1

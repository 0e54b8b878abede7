"""Certificates that learn from the field: the field test and adversarial probing, measured.

Field test: a skill is certified in the simulator (a real evaluation, signed); then robots report
field outcomes one at a time, each a simulated deployment, and the site's field test runs after
each. The well-calibrated skill is deployed in the dynamics its certificate covers; the
miscalibrated one in dynamics its certificate never saw (the worst region an adversarial probe
finds: its field success is far below its certificate's). Printed: whether each was suspended, and
after how many outcomes the miscalibrated one was.

Probing: the cross-entropy probe against random branches with the same rollout budget, on the
shipped skills: the failure rate each finds and their ratio. A ratio is capped at 1 / the random
failure rate (a skill that fails half the time cannot be found failing ten times as often), so the
goal (5 or more) applies to skills that fail rarely at random: the walker's good skill here.

Refinement at inference time: the shipped degraded arm skill on fresh branches alone, then with the
planner around it (best of N perturbed rollouts in nominal dynamics, re-planned every 5 steps),
then the skill distilled from the refined runs, alone.

Prints one JSON line.   python benchmarks/field.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, TrustPolicy
from sim.evaluation import distill_refined


def certified_site(task: sim.Task, policy: sim.Policy, sampler: sim.Sampler, branches: int):
    """A site that certified `policy` on `task` itself (its own certificates need no spot check)."""
    activation = ActivationPolicy(min_branches=branches, min_lower_bound=0.5)
    kb = knowledge.open(":memory:", Identity.generate(), policy=TrustPolicy(activation=activation))
    skill = sim.publish_skill(kb, policy, task.name, task.name, tasks=[task])
    result = sim.evaluate(task, policy, branches=branches, sampler=sampler, progress=False)
    sim.certify(kb, skill.id, result)
    assert kb.is_active(skill.id), kb.activation(skill.id)
    return kb, skill


def deploy(kb, skill, task, policy, sampler, outcomes: int) -> int | None:
    """Report `outcomes` field runs one by one; the outcome count at which the field test
    suspended the skill, or None."""
    runs = sim.evaluate(task, policy, branches=outcomes, sampler=sampler, progress=False).outcomes
    for i, run in enumerate(runs, start=1):
        kb.outcomes.record(
            skill.id, success=run.success, embodiment=task.embodiment, values={"steps": run.steps}
        )
        if not kb.is_active(skill.id):
            return i
    return None


def probing(name: str, skill: str, budget: int) -> dict:
    task = sim.load_task(name)
    policy = sim.load_skill(skill)
    sampler = sim.load_sampler(name, seed=3)
    started = time.perf_counter()
    found = sim.probe(task, policy, sampler=sampler, budget=budget, seed=1)
    probe_s = time.perf_counter() - started
    started = time.perf_counter()
    random = sim.evaluate(task, policy, branches=budget, sampler=sampler, progress=False)
    random_s = time.perf_counter() - started
    random_rate = 1 - random.success_rate
    return {
        "skill": skill,
        "budget": budget,
        "probe_failure_rate": round(found.failure_rate, 3),
        "random_failure_rate": round(random_rate, 3),
        "probe_failure_rate_ratio": round(found.failure_rate / random_rate, 1)
        if random_rate
        else None,
        "probe_s": round(probe_s, 2),
        "random_s": round(random_s, 2),
    }


def refinement(episodes: int) -> dict:
    task = sim.load_task("arm_reach")
    degraded = sim.load_skill("arm_reach_degraded")
    field = sim.load_sampler("arm_reach", seed=5)
    started = time.perf_counter()
    refined = sim.refine(task, degraded, sampler=field, episodes=episodes, candidates=32)
    refine_s = time.perf_counter() - started
    successor = distill_refined(refined, epochs=600)
    fresh = sim.load_sampler("arm_reach", seed=9)
    alone = sim.evaluate(task, degraded, branches=128, sampler=fresh, progress=False)
    unrefined = sim.evaluate(task, degraded, branches=episodes, sampler=field, progress=False)
    distilled = sim.evaluate(task, successor, branches=128, sampler=fresh, progress=False)
    return {
        "unrefined_success": round(unrefined.success_rate, 3),
        "refined_success": round(refined.success_rate, 3),
        "refinement_gain": round(refined.success_rate - unrefined.success_rate, 3),
        "distilled_success": round(distilled.success_rate, 3),
        "degraded_success_fresh": round(alone.success_rate, 3),
        "refine_s_per_episode": round(refine_s / episodes, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer branches and rollouts")
    args = parser.parse_args()
    branches, outcomes, budget = (128, 200, 512) if args.quick else (256, 400, 1024)

    walker = sim.load_task("walker_forward")
    good = sim.load_skill("walker_forward_good")
    covered = sim.load_sampler("walker_forward", seed=3)
    honest_kb, honest = certified_site(walker, good, covered, branches)
    field = sim.Sampler(covered.terms, seed=99)  # the same dynamics, other draws
    honest_at = deploy(honest_kb, honest, walker, good, field, outcomes)

    region = sim.probe(walker, good, sampler=covered, budget=budget, seed=1)
    wrong_kb, wrong = certified_site(walker, good, covered, branches)
    wrong_at = deploy(wrong_kb, wrong, region.task, good, region.sampler, outcomes)
    field_rate = 1 - region.failure_rate

    probes = [
        probing("walker_forward", "walker_forward_good", budget),
        probing("walker_forward", "walker_forward_degraded", budget),
        probing("arm_reach", "arm_reach_degraded", budget),
    ]
    print(
        json.dumps(
            {
                "benchmark": "field",
                "quick": args.quick,
                "certificate_branches": branches,
                "field_outcomes": outcomes,
                "honest_suspended": int(honest_at is not None),
                "miscalibrated_suspended": int(wrong_at is not None),
                "outcomes_to_suspend": wrong_at,
                "miscalibrated_field_success": round(field_rate, 3),
                "promised_lower_bound": round(wrong_kb.ledger.field_test(wrong.id).promised, 3),
                "probe_failure_rate": probes[0]["probe_failure_rate"],
                "random_failure_rate": probes[0]["random_failure_rate"],
                "probe_failure_rate_ratio": probes[0]["probe_failure_rate_ratio"],
                "probes": probes,
                **refinement(32 if args.quick else 64),
            }
        )
    )


if __name__ == "__main__":
    main()

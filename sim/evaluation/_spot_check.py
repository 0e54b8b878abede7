"""`spot_check`: re-run a sampled part of another validator's certificate here; sign the verdict.

Re-running a whole evaluation doubles the fleet's simulation bill; re-running a few waves chosen at
random, where the validator cannot know which, catches a validator that inflates its counts or runs
something other than it claims with a fraction of it. Branches run in whole waves (a wave's rows
share policy calls, so only a whole wave re-runs bit for bit). On the certificate's own platform
every re-run branch must match its record exactly; elsewhere the re-run success count over those
branches must lie in the recorded count's 99% Clopper-Pearson interval. A check that does not
reproduce is signed as a dispute with its evidence (`kb.certificates.check`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from knowledge import Certificate, KnowledgeBase, SpotCheck
from knowledge.stats import clopper_pearson_interval

from .._assets import fetch_assets
from .._errors import EvaluationRecordError
from .._tasks import Task
from ._certify import load_policy
from ._evaluate import single_threaded_torch
from ._evaluation_record import check_record, environment, outcomes_of
from ._reproduce import rerun_inputs
from ._rollout import BranchOutcome, PolicyCaller, run_wave

INTERVAL = 0.99


@dataclass(frozen=True)
class SpotCheckResult:
    """What a spot check found: `reproduced`, over `branches`, and the signed record (if made)."""

    reproduced: bool
    branches: tuple[int, ...]
    detail: str
    seconds: float
    check: SpotCheck | None


def spot_check(
    kb: KnowledgeBase,
    certificate: Certificate,
    *,
    branches: int | None = None,
    budget_s: float | None = None,
    threads: int = 1,
    sign: bool = True,
    rng: random.Random | None = None,
    on_step: Callable[[], None] | None = None,
) -> SpotCheckResult:
    """Re-run at least `branches` branches of `certificate` (default: this site's policy,
    `spot_check_size`), in random whole waves, stopping after the wave that passes `budget_s`
    (default: the policy's `spot_check_budget_s`); with `sign`, write the verdict as a spot check
    (the writer needs the validate role). A record that cannot be re-run at all raises, and nothing
    is signed: that is no evidence against the validator (EvaluationRecordError if it is
    malformed, MissingAssetError if a file its task's scene loads cannot be fetched, the policy's
    errors if it cannot be loaded here). `on_step()` is called after each control step of a wave,
    as `sim.evaluate` calls it: a service's stop check or time budget, which an exception it raises
    enforces (nothing is signed then)."""
    started = time.monotonic()
    policy = kb.policy.activation
    record = certificate.evaluation
    if not isinstance(record, dict):
        raise EvaluationRecordError("the certificate carries no evaluation record to re-run")
    check_record(record)
    recorded = outcomes_of(record)
    task, sampler, start = rerun_inputs(record, fetch_assets(kb, record["task"]["definition"]))
    caller = PolicyCaller(load_policy(kb, certificate.skill), task)
    wave, planned = record["layout"]["wave"], record["layout"]["branches"]
    want = branches if branches is not None else max(1, policy.spot_check_size(len(recorded)))
    budget = policy.spot_check_budget_s if budget_s is None else budget_s
    order = list(range(-(-len(recorded) // wave)))
    (rng or random.SystemRandom()).shuffle(order)  # the validator cannot know which waves
    rerun: list[BranchOutcome] = []
    with single_threaded_torch():
        for index in order:
            rows = run_wave(
                task, caller, sampler, index, wave, planned, threads, on_step, start=start
            )
            rerun += rows[: max(0, len(recorded) - index * wave)]
            if len(rerun) >= want or time.monotonic() - started > budget:
                break
    reproduced, detail = _verdict(record, task, recorded, rerun)
    checked = tuple(sorted(o.branch for o in rerun))
    signed = None
    if sign:
        signed = kb.certificates.check(
            certificate,
            reproduced=reproduced,
            branches=checked,
            detail=detail,
            evidence=None if reproduced else _evidence(recorded, rerun),
        )
    return SpotCheckResult(reproduced, checked, detail, time.monotonic() - started, signed)


def _verdict(
    record: dict, task: Task, recorded: tuple[BranchOutcome, ...], rerun: list[BranchOutcome]
) -> tuple[bool, str]:
    same_platform = (
        record["environment"] == environment()
        and record["template"].get("model_hash") == task.template.model_hash
    )
    n = len(rerun)
    if same_platform:
        differ = [o.branch for o in rerun if recorded[o.branch] != o]
        if differ:
            return False, (
                f"{len(differ)} of {n} re-run branches differ from the record on its own platform "
                f"(first: branch {differ[0]})"
            )
        return True, f"{n} re-run branches match the record exactly"
    claimed = sum(recorded[o.branch].success for o in rerun)
    found = sum(o.success for o in rerun)
    low, high = clopper_pearson_interval(claimed, n, INTERVAL)
    inside = low <= found / n <= high
    return inside, (
        f"{found} of {n} re-run branches succeed where the record says {claimed}: "
        f"{'inside' if inside else 'outside'} its {INTERVAL:.0%} interval (another platform)"
    )


def _evidence(recorded: tuple[BranchOutcome, ...], rerun: list[BranchOutcome]) -> dict:
    """The re-run branches' outcomes beside the recorded ones, and the platform that re-ran them."""
    return {
        "branch": [o.branch for o in rerun],
        "recorded_success": [int(recorded[o.branch].success) for o in rerun],
        "rerun_success": [int(o.success) for o in rerun],
        "rerun_steps": [o.steps for o in rerun],
        "rerun_reason": [o.reason for o in rerun],
        "environment": environment(),
    }

"""`reproduce`: re-run a recorded evaluation and say whether it matches (exactly on the same
platform, within the binomial confidence interval elsewhere)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from knowledge.stats import SPRT, clopper_pearson_interval

from .._errors import EvaluationRecordError, MissingAssetError, SimError
from .._mlp import describe_policy
from .._patches import Sampler
from .._snapshot import Snapshot
from .._tasks import Task
from ._evaluate import evaluate
from ._evaluation_record import Evaluation, environment, outcomes_of


@dataclass(frozen=True)
class Reproduction:
    """The verdict of `reproduce`: `matches` is what a verifier acts on; `detail` says why."""

    matches: bool
    exact: bool
    same_platform: bool
    mismatched_branches: tuple[int, ...]
    detail: str
    rerun: Evaluation


def rerun_inputs(
    record: dict, assets: Mapping[str, bytes] | None = None
) -> tuple[Task, Sampler, Snapshot | None]:
    """The task (its scene compiled from `assets`, the files it loads), sampler and start state a
    record's evaluation ran with, rebuilt here: MissingAssetError if a file is not given."""
    try:
        task = Task(record["task"]["definition"], assets)
        sampler = Sampler.from_json(record["sampler"])
        start = Snapshot.from_json(record["start"], task.template) if "start" in record else None
    except MissingAssetError:
        raise  # not here: says nothing about the record
    except (SimError, KeyError, TypeError, ValueError) as exc:
        raise EvaluationRecordError(f"record cannot be re-run: {exc}") from exc
    return task, sampler, start


def reproduce(
    record: dict,
    policy: Any,
    *,
    assets: Mapping[str, bytes] | None = None,
    threads: int = 0,
    workers: int = 1,
    interval: float = 0.99,
    progress: bool | None = None,
) -> Reproduction:
    """Re-run a recorded evaluation with `policy` and compare; `assets` are the bytes of the files
    its task's scene loads, by name (`sim.fetch_assets` gets them from a knowledge base).

    On the same platform (equal environment and compiled-model hash) every branch outcome must match
    bit for bit; elsewhere the re-run success rate must lie in the recorded result's two-sided
    `interval` Clopper–Pearson interval. A record that is malformed, tampered with, or names
    another policy than `policy` raises EvaluationRecordError; one that does not reproduce returns
    matches=False; a scene file not given raises MissingAssetError. (A plain callable cannot be
    identified: the caller vouches for it.)
    """
    recorded = outcomes_of(record)
    task, sampler, start = rerun_inputs(record, assets)
    try:
        sprt = None if record["sequential"] is None else SPRT.from_json(record["sequential"])
    except (SimError, KeyError, TypeError, ValueError) as exc:
        raise EvaluationRecordError(f"record cannot be re-run: {exc}") from exc
    if task.template.source_hash != record["template"].get("source_hash"):
        raise EvaluationRecordError(
            "record field 'template.source_hash' does not match the task's scene"
        )
    described = describe_policy(policy)
    if record["policy"].get("kind") != "callable" and described != record["policy"]:
        raise EvaluationRecordError(
            f"record field 'policy': names {record['policy']}, the policy given is {described}"
        )
    layout = record["layout"]
    rerun = evaluate(
        task,
        policy,
        branches=layout["branches"],
        sampler=sampler,
        wave=layout["wave"],
        threads=threads,
        workers=workers,
        sprt=sprt,
        confidence=record["summary"]["confidence"],
        progress=progress,
        start=start,
    )
    # equal versions, CPU vector features and compiled model: the patch draws and every outcome must
    # then be bit-identical
    same_platform = (
        record["environment"] == environment()
        and record["template"].get("model_hash") == task.template.model_hash
    )
    pairs = list(zip(recorded, rerun.outcomes, strict=False))  # lengths are compared below
    mismatched = tuple(a.branch for a, b in pairs if a != b)
    exact = (
        not mismatched
        and len(recorded) == len(rerun.outcomes)
        and rerun.patches_digest == record["patches_digest"]
    )
    if same_platform:
        if exact:
            detail = "all branch outcomes match"
        elif rerun.patches_digest != record["patches_digest"]:
            detail = "the recorded sampler spec draws other patches than the record claims"
        else:
            detail = (
                f"{len(mismatched)} of {len(recorded)} branch outcomes differ on the same platform"
            )
        return Reproduction(exact, exact, True, mismatched, detail, rerun)
    successes = sum(o.success for o in recorded)
    low, high = clopper_pearson_interval(successes, len(recorded), interval)
    inside = low <= rerun.success_rate <= high
    detail = (
        f"re-run rate {rerun.success_rate:.4f} {'inside' if inside else 'outside'} the recorded "
        f"{interval:.0%} interval [{low:.4f}, {high:.4f}] (another platform)"
    )
    return Reproduction(inside, exact, False, mismatched, detail, rerun)

"""Evaluation: closed-loop rollouts of a policy over randomized branches, the executors that run
waves of branches (here, in worker processes, in Ray actors), the deterministic record of an
evaluation and its reproduction, certificates, and distillation.

The everyday names are re-exported by `sim`; `branch_patch`, `distill` and `fit_mlp` are research
tools and live here only. The statistics (bounds, SPRT, sample sizes) are `knowledge.stats`:
activation recomputes the same bounds.
"""

from ._certify import (
    Verification,
    certify,
    fetch_task,
    load_policy,
    publish_skill,
    publish_task,
    randomized,
    skill_tasks,
    verify_certificate,
)
from ._distill import distill, fit_mlp
from ._evaluate import Comparison, compare, evaluate
from ._evaluation_record import Evaluation, check_record, record_hash
from ._probe import Probe, probe
from ._ray import use_ray
from ._refine import Refinement, distill_refined, refine
from ._reproduce import Reproduction, reproduce
from ._rollout import BranchOutcome, branch_patch
from ._spot_check import SpotCheckResult, spot_check

__all__ = [
    "BranchOutcome",
    "Comparison",
    "Evaluation",
    "Probe",
    "Refinement",
    "Reproduction",
    "SpotCheckResult",
    "Verification",
    "branch_patch",
    "certify",
    "check_record",
    "compare",
    "distill",
    "distill_refined",
    "evaluate",
    "fetch_task",
    "fit_mlp",
    "load_policy",
    "probe",
    "publish_skill",
    "publish_task",
    "randomized",
    "record_hash",
    "refine",
    "reproduce",
    "skill_tasks",
    "spot_check",
    "use_ray",
    "verify_certificate",
]

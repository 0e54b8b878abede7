"""sim: the embedded MuJoCo simulator that validates skills before anything activates them.

A task (scene, initial-state distribution, observation, reward, success) is data; so is a skill
(an MLP architecture spec plus safetensors weights). `evaluate` rolls a policy out closed loop in N
branches of the task's template, each differing only by its patch, and returns per-branch outcomes,
confidence bounds and, with `to_record()`, a deterministic record that `reproduce` can re-run.
"""

from ._distill import distill, fit_mlp
from ._errors import (
    EntryPointError,
    IncompatibleTemplateError,
    MutationError,
    PolicyCallError,
    PolicyOutputError,
    PolicyRunError,
    RecordError,
    SamplerSpecError,
    SimError,
    SkillPayloadError,
    SkillSpecError,
    SpecError,
    TaskDefinitionError,
    TemplateError,
)
from ._evaluate import Comparison, Evaluation, compare, evaluate
from ._patches import Mutation, Patch, Sampler, SamplerTerm
from ._policies import MLP, EntryPointRef, MLPSpec, Skill
from ._record import Reproduction, check_record, record_hash, reproduce
from ._rollout import BranchOutcome, branch_patch
from ._shipped import load_sampler, load_skill, load_task, shipped_skills, shipped_tasks
from ._stats import SPRT, clopper_pearson_interval, clopper_pearson_lower, fixed_sample_size, wilson_lower
from ._tasks import Task
from ._templates import Template

__all__ = [
    "BranchOutcome", "Comparison", "EntryPointError", "EntryPointRef", "Evaluation",
    "IncompatibleTemplateError", "MLP", "MLPSpec", "Mutation", "MutationError", "Patch", "PolicyCallError",
    "PolicyOutputError", "PolicyRunError", "RecordError", "Reproduction", "SPRT", "Sampler",
    "SamplerSpecError", "SamplerTerm", "SimError", "Skill", "SkillPayloadError", "SkillSpecError",
    "SpecError", "Task", "TaskDefinitionError", "Template", "TemplateError", "branch_patch", "check_record",
    "clopper_pearson_interval", "clopper_pearson_lower", "compare", "distill", "evaluate", "fit_mlp",
    "fixed_sample_size", "load_sampler", "load_skill", "load_task", "record_hash", "reproduce",
    "shipped_skills", "shipped_tasks", "wilson_lower",
]

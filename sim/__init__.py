"""sim: the embedded MuJoCo simulator that validates skills before anything activates them.

A task (scene, initial-state distribution, observation, reward, success) is data; so is a skill
(an MLP architecture spec plus safetensors weights). `evaluate` rolls a policy out closed loop in N
branches of the task's template, each differing only by its patch (E = T + Δ), and returns
per-branch outcomes and confidence bounds; `to_record()` gives the deterministic JSON a validator
signs, and `reproduce` re-runs a record to check it.

    import sim

    task = sim.load_task("arm_reach")
    result = sim.evaluate(task, sim.load_skill("arm_reach_good"), branches=256,
                          sampler=sim.load_sampler("arm_reach", seed=7))
    result.successes, result.clopper_pearson_lower     # (256, 0.988...)
    record = result.to_record()                        # JSON-safe, deterministic
    sim.reproduce(record, sim.load_skill("arm_reach_good")).matches   # True

A `World` is a site's persistent digital twin, split into shards that run in worker processes (or
Ray actors): every mutation is logged, checkpoints are taken as it runs, and it can be reopened,
forked at any recorded tick, replayed exactly, and evaluated from:

    world = sim.World.create("site.world", {"cell": scene_xml}, [sim.Entity("walker1", walker_xml, "cell")])
    world.apply("cell", sim.Mutation("actuator/walker1/hhip/ctrl", "set", (0.3,)), provenance="operator")
    world.advance(2000)
    branch = world.fork("cell", at=1000)               # never changes the canonical world
    world.replay("cell", 0, 2000).exact                # True: re-executed bit for bit

Evaluations with `workers > 1` and worlds with worker processes start processes: call them under
`if __name__ == "__main__":`.
"""

from ._bodies import (
    Robot,
    Slot,
    procedural_arm,
    procedural_legged,
    robot_population,
    shipped_robots,
)
from ._branches import Branch, Replay
from ._certify import (
    Verification,
    certify,
    load_policy,
    publish_skill,
    randomized,
    verify_certificate,
)
from ._distill import distill, fit_mlp
from ._entities import Entity
from ._errors import (
    BackendError,
    CorruptCheckpointError,
    CorruptLogError,
    CorruptWorldError,
    EntryPointError,
    HistoryError,
    IncompatibleTemplateError,
    MutationError,
    PolicyCallError,
    PolicyOutputError,
    PolicyRunError,
    RecordError,
    ReplayTemplateError,
    SamplerSpecError,
    SimError,
    SkillPayloadError,
    SkillSpecError,
    SpecError,
    TaskDefinitionError,
    TemplateError,
    UnknownEntityError,
    UnknownShardError,
    WorkerLostError,
    WorldError,
    WorldLockedError,
)
from ._evaluate import Comparison, Evaluation, compare, evaluate
from ._patches import Mutation, Patch, Sampler, SamplerTerm
from ._policies import MLP, EntryPointRef, MLPSpec, Skill
from ._ray import use_ray
from ._record import Reproduction, check_record, record_hash, reproduce
from ._rollout import BranchOutcome, branch_patch
from ._segments import Event
from ._shipped import load_sampler, load_skill, load_task, shipped_skills, shipped_tasks
from ._snapshot import Snapshot
from ._stats import (
    SPRT,
    clopper_pearson_interval,
    clopper_pearson_lower,
    fixed_sample_size,
    wilson_lower,
)
from ._tasks import Task
from ._templates import Template
from ._transfer import NativeSkill, native_skill, retarget, transfer_dataset
from ._world import Intervention, Migration, World

__all__ = [
    "BranchOutcome",
    "Comparison",
    "Verification",
    "certify",
    "load_policy",
    "publish_skill",
    "randomized",
    "verify_certificate",
    "EntryPointError",
    "EntryPointRef",
    "Evaluation",
    "IncompatibleTemplateError",
    "MLP",
    "MLPSpec",
    "Mutation",
    "MutationError",
    "Patch",
    "PolicyCallError",
    "PolicyOutputError",
    "PolicyRunError",
    "RecordError",
    "Reproduction",
    "SPRT",
    "Sampler",
    "SamplerSpecError",
    "SamplerTerm",
    "SimError",
    "Skill",
    "SkillPayloadError",
    "SkillSpecError",
    "SpecError",
    "Task",
    "TaskDefinitionError",
    "Template",
    "TemplateError",
    "branch_patch",
    "check_record",
    "clopper_pearson_interval",
    "clopper_pearson_lower",
    "compare",
    "distill",
    "evaluate",
    "fit_mlp",
    "fixed_sample_size",
    "load_sampler",
    "load_skill",
    "load_task",
    "record_hash",
    "reproduce",
    "shipped_skills",
    "shipped_tasks",
    "wilson_lower",
    "BackendError",
    "Branch",
    "CorruptCheckpointError",
    "CorruptLogError",
    "CorruptWorldError",
    "Entity",
    "Event",
    "HistoryError",
    "Intervention",
    "Migration",
    "Replay",
    "ReplayTemplateError",
    "Snapshot",
    "UnknownEntityError",
    "UnknownShardError",
    "WorkerLostError",
    "World",
    "WorldError",
    "WorldLockedError",
    "use_ray",
    "NativeSkill",
    "Robot",
    "Slot",
    "native_skill",
    "procedural_arm",
    "procedural_legged",
    "retarget",
    "robot_population",
    "shipped_robots",
    "transfer_dataset",
]

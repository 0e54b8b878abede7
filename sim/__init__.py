"""sim: the embedded MuJoCo simulator that validates skills before anything activates them.

A task (scene, initial-state distribution, observation, reward, success) is data; so is a skill's
`Policy` (an MLP architecture spec plus safetensors weights). `evaluate` rolls a policy out closed
loop in N branches of the task's template, each differing only by its patch (E = T + Δ), and
returns per-branch outcomes and confidence bounds; `to_record()` gives the deterministic JSON a
validator signs, and `reproduce` re-runs a record to check it.

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

    world = sim.World.create("site.world", {"cell": scene_xml},
                             [sim.Entity("walker1", walker_xml, "cell")])
    world.apply("cell", sim.Mutation("actuator/walker1/hhip/ctrl", "set", (0.3,)),
                provenance="operator")
    world.advance(2000)
    branch = world.fork("cell", at=1000)               # never changes the canonical world
    world.replay("cell", 0, 2000).exact                # True: re-executed bit for bit

Tasks for a robot of one's own come from builders (`reach_task` for an arm, `stand_task` for a
legged robot) or are written by hand: see docs/TASKS.md. The files a task's scene loads (meshes,
textures) travel with it by hash as blobs: `fetch_task` compiles a task from a knowledge base,
fetching them from peers, and a site that cannot get one is told `MissingAssetError`.

The package is layered: the vocabulary (templates, patches, tasks and their builders, policies,
snapshots, shipped assets) at the top of `sim`; `sim.evaluation` (rollouts, executors, records,
certificates, and distillation; the statistics are `knowledge.stats`); `sim.world` (the persistent
world, its store and shard hosts); `sim.transfer` (procedural bodies and transfer datasets, for
research). This module re-exports what a user of the library needs.

Evaluations with `workers > 1` and worlds with worker processes start processes: call them under
`if __name__ == "__main__":`.
"""

from typing import TYPE_CHECKING

from knowledge import __version__ as __version__  # one distribution, one version
from knowledge.stats import SPRT  # what evaluate(sprt=...) takes

from . import _extra  # noqa: F401 - before sim's modules: names a missing extra, not a module
from ._assets import fetch_assets
from ._builders import reach_task, stand_task
from ._errors import (
    BackendError,
    CorruptCheckpointError,
    CorruptLogError,
    CorruptWorldError,
    EntryPointError,
    EvaluationRecordError,
    HistoryError,
    IncompatibleTemplateError,
    MissingAssetError,
    MutationError,
    PolicyCallError,
    PolicyOutputError,
    PolicyPayloadError,
    PolicyRunError,
    PolicySpecError,
    ReplayTemplateError,
    SamplerSpecError,
    SimError,
    SpecError,
    TaskDefinitionError,
    TemplateError,
    UnknownEntityError,
    UnknownShardError,
    WorkerLostError,
    WorldError,
    WorldFullError,
    WorldLockedError,
)
from ._mlp import EntryPointRef, Policy
from ._mlp_spec import MLPSpec
from ._patches import Mutation, Patch, Sampler, SamplerTerm
from ._shipped import load_sampler, load_skill, load_task, shipped_skills, shipped_tasks
from ._snapshot import Snapshot
from ._tasks import Task
from ._templates import Template
from .evaluation import (
    BranchOutcome,
    Comparison,
    Evaluation,
    Probe,
    Refinement,
    Reproduction,
    SpotCheckResult,
    Verification,
    certify,
    check_record,
    compare,
    evaluate,
    fetch_task,
    load_policy,
    probe,
    publish_skill,
    publish_task,
    randomized,
    record_hash,
    refine,
    reproduce,
    skill_tasks,
    spot_check,
    use_ray,
    verify_certificate,
)
from .world import Branch, Entity, Event, Intervention, Migration, Replay, World

__all__ = [
    "BackendError",
    "Branch",
    "BranchOutcome",
    "Comparison",
    "CorruptCheckpointError",
    "CorruptLogError",
    "CorruptWorldError",
    "Entity",
    "EntryPointError",
    "EntryPointRef",
    "Evaluation",
    "EvaluationRecordError",
    "Event",
    "HistoryError",
    "IncompatibleTemplateError",
    "Intervention",
    "MLP",
    "MLPSpec",
    "Migration",
    "MissingAssetError",
    "Mutation",
    "MutationError",
    "Patch",
    "Policy",
    "PolicyCallError",
    "PolicyOutputError",
    "PolicyPayloadError",
    "PolicyRunError",
    "PolicySpecError",
    "Probe",
    "Refinement",
    "Replay",
    "ReplayTemplateError",
    "Reproduction",
    "SPRT",
    "Sampler",
    "SamplerSpecError",
    "SamplerTerm",
    "SimError",
    "Snapshot",
    "SpecError",
    "SpotCheckResult",
    "Task",
    "TaskDefinitionError",
    "Template",
    "TemplateError",
    "UnknownEntityError",
    "UnknownShardError",
    "Verification",
    "WorkerLostError",
    "World",
    "WorldError",
    "WorldFullError",
    "WorldLockedError",
    "certify",
    "check_record",
    "compare",
    "evaluate",
    "fetch_assets",
    "fetch_task",
    "load_policy",
    "load_sampler",
    "load_skill",
    "load_task",
    "probe",
    "publish_skill",
    "publish_task",
    "randomized",
    "reach_task",
    "record_hash",
    "refine",
    "reproduce",
    "shipped_skills",
    "shipped_tasks",
    "skill_tasks",
    "spot_check",
    "stand_task",
    "use_ray",
    "verify_certificate",
]

if TYPE_CHECKING:
    from ._torch_mlp import MLP


def __getattr__(name: str) -> object:
    """`sim.MLP` imports torch when first asked for, not with `import sim`."""
    if name == "MLP":
        from ._torch_mlp import MLP

        globals()["MLP"] = MLP
        return MLP
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "MLP"})

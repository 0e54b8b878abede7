"""The simulator's errors: each says which branch, field or tensor was wrong and what to do.

SimnetError (knowledge)
└── SimError
    ├── TemplateError
    │   └── IncompatibleTemplateError
    │       └── ReplayTemplateError (also a WorldError)
    ├── MutationError (ValueError)
    ├── SpecError (ValueError)
    │   ├── SamplerSpecError
    │   ├── TaskDefinitionError
    │   └── PolicySpecError
    ├── PolicyPayloadError
    ├── EntryPointError
    ├── PolicyRunError
    │   ├── PolicyCallError
    │   └── PolicyOutputError
    ├── EvaluationRecordError (ValueError)
    ├── MissingAssetError (also a knowledge.BlobError)
    ├── BackendError
    └── WorldError
        ├── WorldLockedError
        ├── WorldFullError (also a knowledge.StoreFullError)
        ├── HistoryError (ValueError)
        ├── UnknownShardError (LookupError)
        ├── UnknownEntityError (LookupError)
        ├── CorruptWorldError
        │   ├── CorruptLogError
        │   └── CorruptCheckpointError
        ├── ReplayTemplateError (also an IncompatibleTemplateError)
        └── WorkerLostError

A world's files that cannot be written say so with the path: WorldFullError when the disk is full
(the commit was not kept, and the next one succeeds once there is space; `except
knowledge.StoreFullError` catches it with a knowledge base's), WorldError when the folder is
missing or read-only.
"""

from __future__ import annotations

from knowledge import BlobError, SimnetError, StoreFullError


def _rebuild(cls: type[SimError], args: tuple, state: dict) -> SimError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class SimError(SimnetError):
    """Base class of every error the `sim` package raises on purpose."""

    def __reduce__(self) -> tuple:
        # subclasses take their own constructor arguments: rebuild from the message and attributes,
        # so that an error raised in a worker process arrives whole
        return _rebuild, (type(self), self.args, self.__dict__)


class TemplateError(SimError):
    """A scene cannot be compiled into a template."""


class IncompatibleTemplateError(TemplateError):
    """A patch, skill or record made for one template (or task interface) met another."""


class MutationError(SimError, ValueError):
    """A mutation names no field of the template, or its op or value cannot apply; names the
    branch."""

    def __init__(self, target: str, detail: str, branch: int | None = None) -> None:
        where = f"branch {branch}: " if branch is not None else ""
        super().__init__(f"{where}mutation {target!r}: {detail}")
        self.target = target
        self.branch = branch
        self.detail = detail


class SpecError(SimError, ValueError):
    """A declarative definition (sampler, task, skill architecture) is malformed; `field` is its
    path."""

    def __init__(self, kind: str, field: str, detail: str) -> None:
        super().__init__(f"{kind} field {field!r}: {detail}")
        self.field = field
        self.detail = detail


class SamplerSpecError(SpecError):
    """A sampler spec is malformed or its targets match nothing in the template."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__("sampler", field, detail)


class TaskDefinitionError(SpecError):
    """A task definition is malformed or names objects its scene does not have."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__("task", field, detail)


class PolicySpecError(SpecError):
    """A policy's architecture spec (a skill's `spec`) is malformed."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__("skill", field, detail)


class PolicyPayloadError(SimError):
    """A policy's weights blob is not safetensors, or its tensors do not match the architecture
    spec."""


class EntryPointError(SimError):
    """A record names a Python entry point that is not installed here, or not at the recorded
    version."""


class PolicyRunError(SimError):
    """The policy failed during an evaluation; the run yields no result. Names the branches and
    step."""

    def __init__(self, detail: str, branches: tuple[int, ...], step: int) -> None:
        shown = ", ".join(map(str, branches[:5])) + (", ..." if len(branches) > 5 else "")
        super().__init__(f"control step {step}, branch(es) {shown}: {detail}")
        self.branches = branches
        self.step = step
        self.detail = detail


class PolicyCallError(PolicyRunError):
    """The policy raised; the original exception is chained as `__cause__`."""


class PolicyOutputError(PolicyRunError):
    """The policy returned the wrong shape, a non-numeric array, or NaN/inf for a live branch."""


class EvaluationRecordError(SimError, ValueError):
    """An evaluation record is malformed, or its hashes do not match its contents (tampered)."""


class MissingAssetError(SimError, BlobError):
    """A file a task's scene loads (`name`, carried as blob `hash`) is not here and no source had
    it: the task cannot be compiled here, which says nothing about the task or a certificate of it.
    It may arrive later (a validator waits for it, as for weights)."""

    def __init__(self, name: str, digest: str, reason: str = "") -> None:
        super().__init__(
            f"asset {name!r} ({digest}) is missing" + (f": {reason}" if reason else "")
        )
        self.name = name
        self.hash = digest
        self.reason = reason


class BackendError(SimError):
    """A backend cannot run: the Ray extra is not installed (pip install 'simnet-fleet[ray]') or no
    cluster answers."""


class WorldError(SimError):
    """A persistent world refused an operation; the message names the shard, branch or tick."""


class WorldLockedError(WorldError):
    """Another process has this world open: one process at a time drives a world."""


class WorldFullError(WorldError, StoreFullError):
    """The disk holding a world's files is full (SQLITE_FULL, ENOSPC, a quota or a file-size
    limit): nothing of the commit was kept. Free space and retry."""


class HistoryError(WorldError, ValueError):
    """A tick outside the recorded history: forking or replaying beyond a shard's head, or writing
    into its past."""


class UnknownShardError(WorldError, LookupError):
    """The world has no shard (or branch) of that name."""


class UnknownEntityError(WorldError, LookupError):
    """The world has no entity of that name, or it is not where the operation expects it."""


class CorruptWorldError(WorldError):
    """Stored world data fails its checksum; nothing was built from it. Restore the file from a
    backup."""


class CorruptLogError(CorruptWorldError):
    """An event log segment fails its checksum, or has a gap."""


class CorruptCheckpointError(CorruptWorldError):
    """A checkpoint fails its checksum."""


class ReplayTemplateError(IncompatibleTemplateError, WorldError):
    """History recorded on one template would be replayed on another (another scene, or another
    MuJoCo build compiling it differently): the replay could not be exact, so it does not run."""


class WorkerLostError(WorldError):
    """A shard worker died and could not be rebuilt from its checkpoint and log."""

"""A validator's settings: ``validator.toml`` in the site's home, every key optional."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import knowledge

from .._patches import Sampler
from .._tasks import Task
from ..evaluation._evaluate import DEFAULT_WAVE
from ._samplers import fleet_sampler

SETTINGS_FILE = "validator.toml"
# settings that are integers >= 1
_POSITIVE_INTS = "branches workers threads max_attempts max_branch_steps max_scene_mb".split()
_POSITIVE_INTS.append("max_branch_macs")


@dataclass(frozen=True)
class ValidatorSettings:
    """How a site validates (``validator.toml`` in its home; every key optional)."""

    certifies: bool = True  # evaluate and certify skills (false: only spot-check)
    branches: int = 128  # per task of a skill
    probe_budget: int = 0  # rollouts of an adversarial probe per task, recorded in the certificate
    workers: int = 1  # evaluation worker processes (1: in the validator's own thread)
    threads: int = 1  # physics threads per wave
    embodiments: tuple[str, ...] = ()  # the bodies this fleet registers (a task's `embodiment`)
    samplers: dict[str, str] = field(default_factory=dict)  # task name -> sampler JSON file
    retry_s: float = 30.0  # a job waiting on weights, a task or an asset is tried again after this
    max_attempts: int = 3  # a job that fails this often is given up (shown in the status)
    idle_s: float = 1.0  # how often an idle validator looks at the knowledge base again
    # physics steps one branch may take (horizon x control_substeps): a job whose task asks more is
    # refused unstarted, so a writer cannot tie the validator up with an endless task
    max_branch_steps: int = 20_000
    # what a task's scene may take to compile and hold one wave of simulations, measured in a
    # child process first: a few bytes of MJCF can ask for all of the machine's memory
    max_scene_mb: int = 1024
    max_compile_s: float = 60.0
    # multiply-adds a skill's network may take over a branch of its tasks (weights x control steps)
    max_branch_macs: int = 10**10
    # wall-clock seconds an evaluation job may take: a scene within the memory budget can still be
    # slow on every physics step (many bodies in contact), which the step budgets do not bound
    max_job_s: float = 600.0

    @property
    def max_rerun_wave(self) -> int:
        """The most simulations a re-run of another site's evaluation record (a spot check,
        `simnet verify`, `simnet reproduce`) may step at once, its `layout.wave`: as many as this
        site evaluates a task with (`branches`), and never fewer than the default wave (64),
        which every evaluation uses unless told otherwise."""
        return max(self.branches, DEFAULT_WAVE)

    @classmethod
    def load(cls, path: Path) -> ValidatorSettings:
        if not path.exists():
            return cls()
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise knowledge.PolicyError(f"{path}: {exc}") from None
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise knowledge.PolicyError(
                f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}"
            )
        if "embodiments" in data:
            data["embodiments"] = tuple(data["embodiments"])
        settings = cls(**data)
        for name in _POSITIVE_INTS:
            value = getattr(settings, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise knowledge.PolicyError(
                    f"{path}: {name} must be an integer >= 1, not {value!r}"
                )
        for name in ("max_compile_s", "max_job_s"):
            value = getattr(settings, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise knowledge.PolicyError(f"{path}: {name} must be a number > 0, not {value!r}")
        if not isinstance(settings.probe_budget, int) or settings.probe_budget < 0:
            raise knowledge.PolicyError(f"{path}: probe_budget must be an integer >= 0")
        return settings

    def sampler(self, task: Task, seed: int, home: Path | None) -> Sampler:
        """This site's sampler for `task` (named in `samplers`), or the fleet sampler."""
        path = self.samplers.get(task.name)
        if path is None:
            return fleet_sampler(task, seed)
        spec = json.loads((home / path if home else Path(path)).read_text())
        return Sampler.from_json({**spec, "seed": seed})


def settings_with(settings: ValidatorSettings, **changes: Any) -> ValidatorSettings:
    """`settings` with the given fields replaced where they are not None (command-line options)."""
    return replace(settings, **{k: v for k, v in changes.items() if v is not None})

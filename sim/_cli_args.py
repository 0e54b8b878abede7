"""What the simulator commands read from their arguments: a skill (a shipped name, a file, or a
skill of this site's store), a task (a shipped name or a definition file), a sampler, and the
scene budget of the commands that compile a scene they were given (`evaluate`, `certify` and
`refine --task FILE`, `publish --for-task FILE`, `reproduce`, `verify`).

The scene budget is the validator's (`sim.validation`), so a peer's task that asks for gigabytes is
refused by a child process before this one compiles it: the site's `max_scene_mb` and
`max_compile_s` (``validator.toml`` in --home, else the validator's defaults), or the command's
--max-scene-mb and --max-compile-s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import click

from knowledge import SiteHome
from knowledge.cli import skill_by_prefix

from ._assets import declared, read_file
from ._mlp import EntryPointRef, Policy
from ._patches import Sampler
from ._shipped import load_sampler, load_skill, load_task, shipped_skills, shipped_tasks
from ._tasks import Task
from .evaluation import load_policy
from .evaluation._evaluate import DEFAULT_WAVE
from .validation._scene_budget import (
    SceneOverBudget,
    WaveOverBudget,
    check_scene,
    probe_replay,
    rerun_wave,
)
from .validation._settings import SETTINGS_FILE, ValidatorSettings

# exit status: a file a task loads is missing here, or a re-run's wave or its scene is over this
# site's budget (no verdict either way)
CANNOT_VERIFY = 3


def skill_arg(name: str) -> Policy | EntryPointRef:
    """A shipped skill, a skill file or a skill of this site's knowledge base (an id prefix): a
    Policy, or the EntryPointRef of a knowledge-base skill that names a local entry point."""
    if name in shipped_skills():
        return load_skill(name)
    if Path(name).is_file():
        return Policy.load(name)
    home = click.get_current_context().find_object(SiteHome)
    if home is not None and home.store.exists():
        with home.open_readonly() as kb:
            return load_policy(kb, skill_by_prefix(kb, name).id)
    raise click.BadParameter(
        f"neither a shipped skill ({', '.join(shipped_skills())}), a file, nor a skill id",
        param_hint="SKILL",
    )


def task_arg(name: str, limits: SceneLimits, wave: int | Sequence[int], threads: int = 1) -> Task:
    """A shipped task, or a definition file: the files its scene loads are read relative to the
    file's directory and carried by hash (`Task.from_files`). A file's scene and its declared files
    are first compiled in a child process under `limits` (MiB, seconds; `scene_limits`), with what
    the command simulates of it: a batch of `wave` simulations (or one per number, held at once) on
    `threads` physics threads (`check_scene`), since a task from elsewhere may ask for gigabytes;
    one over them is a ClickException naming the task and the limit (a scene loading files it does
    not declare, an author's own, is found only by compiling it here)."""
    if name in shipped_tasks():
        return load_task(name)
    path = Path(name)
    if path.is_file():
        definition = json.loads(path.read_text())
        if isinstance(definition, dict):
            assets = {n: read_file(path.parent / n, f"assets[{n!r}]") for n in declared(definition)}
            refusal = scene_refusal(definition, assets, wave, limits, threads)
            if refusal is not None:
                raise click.ClickException(refusal)
        return Task.from_files(definition, path.parent)
    raise click.BadParameter(
        f"neither a shipped task ({', '.join(shipped_tasks())}) nor a file", param_hint="--task"
    )


def sampler_arg(spec: str | None, task: Task, seed: int) -> Sampler:
    if spec is None:
        return load_sampler(task.name, seed) if task.name in shipped_tasks() else Sampler(seed=seed)
    data = json.loads(Path(spec).read_text())
    return Sampler.from_json({**data, "seed": seed})


SAMPLER = click.option(
    "--sampler",
    "sampler_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A sampler spec file: the randomization (default: the task's shipped one, if any).",
)


F = TypeVar("F", bound=Callable[..., Any])
REMEDY = f"--max-scene-mb, --max-compile-s, or max_scene_mb, max_compile_s in {SETTINGS_FILE}"
WAVE_REMEDY = f"its branches in {SETTINGS_FILE}, or {DEFAULT_WAVE} if more"


def scene_budget(command: F) -> F:
    """The --max-scene-mb and --max-compile-s options."""
    command = click.option(
        "--max-compile-s",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help=f"Seconds a scene may take to compile (default: max_compile_s in {SETTINGS_FILE}, "
        "else 60).",
    )(command)
    return click.option(
        "--max-scene-mb",
        type=click.IntRange(min=1),
        default=None,
        help="MiB of memory a scene may take to compile with one wave of simulations, measured "
        f"in a child process first (default: max_scene_mb in {SETTINGS_FILE}, else 1,024).",
    )(command)


class SceneLimits(NamedTuple):
    """What a command may compile and simulate here: MiB and seconds for a scene with one wave of
    simulations, and the most simulations a re-run of a record may step at once."""

    max_mb: int
    max_s: float
    max_wave: int


def scene_limits(max_mb: int | None, max_s: float | None) -> SceneLimits:
    """The options given, else the site's validator.toml, else the validator's defaults; the
    re-run wave limit is the validator's (`ValidatorSettings.max_rerun_wave`)."""
    home = click.get_current_context().find_object(SiteHome)
    settings = ValidatorSettings.load(home.path / SETTINGS_FILE) if home else ValidatorSettings()
    return SceneLimits(
        max_mb or settings.max_scene_mb, max_s or settings.max_compile_s, settings.max_rerun_wave
    )


def scene_refusal(
    definition: Mapping[str, Any],
    assets: Mapping[str, bytes],
    wave: int | Sequence[int],
    limits: SceneLimits,
    threads: int = 1,
    what: str | None = None,
) -> str | None:
    """Why a task definition's scene, with a batch of `wave` simulations (or one per number) on
    `threads` physics threads, is over `limits`; None if it fits. `what` names the scene in the
    message (default: the task's)."""
    try:
        check_scene(
            definition,
            assets,
            max_mb=limits.max_mb,
            max_s=limits.max_s,
            wave=wave,
            threads=threads,
            remedy=REMEDY,
            what=what,
        )
    except SceneOverBudget as exc:
        return str(exc)
    return None


def record_refusal(
    record: Any, assets: Mapping[str, bytes], limits: SceneLimits, probe: Any = None
) -> str | None:
    """Why re-running an evaluation record (and replaying the certificate's `probe`, if given) here
    is over `limits`: its wave (`layout.wave`, the simulations the re-run steps at once) over
    `limits.max_wave`, the probe's branches over `probe_replay`'s bound, or its task's scene (with
    `assets`) with the larger of their waves over the scene budget; None if it fits."""
    try:
        wave = rerun_wave(record, max_wave=limits.max_wave, remedy=WAVE_REMEDY)
        replayed = probe_replay(probe, record, max_wave=limits.max_wave, remedy=WAVE_REMEDY)
    except WaveOverBudget as exc:
        return str(exc)
    wave = max(wave, min(replayed, DEFAULT_WAVE))  # the probe's replay runs waves of up to 64
    definition = record_definition(record)
    # on all CPUs, as `reproduce` and `verify_certificate` re-run it
    return None if definition is None else scene_refusal(definition, assets, wave, limits, 0)


def record_definition(record: Any) -> dict | None:
    """The task definition a record's evaluation ran; None if it has none (its re-run says so)."""
    task = record.get("task") if isinstance(record, dict) else None
    definition = task.get("definition") if isinstance(task, dict) else None
    return definition if isinstance(definition, dict) else None

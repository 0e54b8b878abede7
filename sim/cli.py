"""The simulator commands of `simnet`: evaluate, reproduce, publish, certify, verify, world.

Mounted into the `simnet` group through the ``simnet.commands`` entry-point group (one entry per
command, in pyproject.toml), so that neither `knowledge` nor `federation` imports `sim`. A skill is
a shipped name ("arm_reach_good"), a file (a ``.json`` sidecar beside its ``.safetensors``) or,
where a site's store is at hand (--home), the id (or an id prefix) of a skill in it; a task is a
shipped name or a task definition file.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

import knowledge
from knowledge import SiteHome
from knowledge.cli import skill_by_prefix, urdf_options, urdf_reader_options
from knowledge.stats import SPRT

from ._cli_args import SAMPLER, sampler_arg, scene_budget, scene_limits, skill_arg, task_arg
from ._cli_rerun import reproduce_command, verify_command  # noqa: F401 - simnet reproduce, verify
from ._mlp import Policy
from .evaluation import (
    certify,
    distill_refined,
    evaluate,
    load_policy,
    probe,
    publish_skill,
    refine,
    use_ray,
)
from .evaluation._evaluate import DEFAULT_WAVE
from .transfer._datasets_cli import encoder_dataset_command  # noqa: F401 - simnet encoder dataset
from .validation._cli import validate_command  # noqa: F401 - simnet validate
from .world._world_cli import world_group  # noqa: F401 - simnet world


@click.command("evaluate")
@click.argument("skill")
@click.option(
    "--task", "task_name", required=True, help="A shipped task name or a task definition file."
)
@click.option("--branches", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes; outcomes do not depend on it.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Physics threads per process (0: all CPUs); outcomes do not depend on it.",
)
@click.option(
    "--wave",
    type=click.IntRange(min=1),
    default=None,
    help="Branches per batch (default: up to 64).",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@SAMPLER
@click.option(
    "--sprt",
    nargs=2,
    type=click.FloatRange(0, 1),
    default=None,
    metavar="P0 P1",
    help="Stop early by a sequential test of rate P0 against P1 (5% error rates).",
)
@click.option(
    "--record",
    "record_file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the evaluation record (the body of a certificate) to this file.",
)
@click.option(
    "--backend",
    type=click.Choice(["process", "ray"]),
    default="process",
    show_default=True,
    help=(
        "Run the waves in worker processes or in Ray actors (--workers of them); "
        "outcomes do not depend on it."
    ),
)
@click.option(
    "--ray-address",
    default=None,
    help="With --backend ray: the cluster (default: $RAY_ADDRESS, or a local Ray).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@scene_budget
def evaluate_command(
    skill: str,
    task_name: str,
    branches: int,
    workers: int,
    threads: int,
    wave: int | None,
    seed: int,
    sampler_file: str | None,
    sprt: tuple[float, float] | None,
    record_file: str | None,
    backend: str,
    ray_address: str | None,
    as_json: bool,
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Roll SKILL out closed loop in randomized branches of a task and report its success rate."""
    limits = scene_limits(max_scene_mb, max_compile_s)
    task = task_arg(task_name, limits, wave or min(branches, DEFAULT_WAVE), threads)
    if backend == "ray":
        use_ray(ray_address)
    result = evaluate(
        task,
        skill_arg(skill),
        branches=branches,
        sampler=sampler_arg(sampler_file, task, seed),
        wave=wave,
        threads=threads,
        workers=workers,
        sprt=SPRT(*sprt) if sprt else None,
        backend=backend,
    )
    record = result.to_record()
    if record_file:
        Path(record_file).write_text(json.dumps(record, sort_keys=True) + "\n")
    if as_json:
        click.echo(json.dumps(record, sort_keys=True))
        return
    lines = [
        f"{task.name}: {result.successes}/{result.n} succeeded ({result.success_rate:.3f})",
        f"lower bound at {result.confidence:.0%}: "
        f"Clopper-Pearson {result.clopper_pearson_lower:.4f}, "
        f"Wilson {result.wilson_lower:.4f}",
        f"mean return {result.mean_return:.4f}",
    ]
    if result.sprt is not None:
        lines.append(
            f"SPRT {result.decision} after {result.decided_at} branches ({result.n} simulated)"
        )
    click.echo("\n".join(lines))


@click.command("publish")
@click.argument("skill")
@click.option("--name", required=True, help="The skill's name in the library.")
@click.option(
    "--task", "task_family", required=True, help="Its task family (pick, reach, walk, ...)."
)
@click.option("--description", default="")
@click.option(
    "--mjcf",
    "bodies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A body it was made for (repeatable): its embodiment scope.",
)
@click.option(
    "--urdf",
    "urdf_bodies",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A body it was made for, as URDF (repeatable; the URDF options below apply to each).",
)
@urdf_options
@click.option(
    "--for-task",
    "for_tasks",
    multiple=True,
    help="A task it is meant for (repeatable): a shipped task name or a task definition file; "
    "its definition is published too, and validators evaluate the skill on it.",
)
@scene_budget
@click.pass_obj
def publish_command(
    home: SiteHome,
    skill: str,
    name: str,
    task_family: str,
    description: str,
    bodies: tuple[str, ...],
    urdf_bodies: tuple[str, ...],
    floating_base: bool | None,
    package_paths: tuple[str, ...],
    balance_inertia: bool,
    for_tasks: tuple[str, ...],
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Publish a simulator skill (weights as a blob, architecture in the record) as this site."""
    options = urdf_reader_options(bool(urdf_bodies), floating_base, package_paths, balance_inertia)
    limits = scene_limits(max_scene_mb, max_compile_s)
    tasks = [task_arg(t, limits, 1) for t in for_tasks]  # compiled here, not simulated
    policy = skill_arg(skill)
    if not isinstance(policy, Policy):
        raise click.BadParameter(
            "it names a local entry point: only MLP skills (architecture and weights) publish",
            param_hint="SKILL",
        )
    embodiments = [knowledge.Embodiment.from_mjcf(b).to_dict() for b in bodies]
    embodiments += [knowledge.Embodiment.from_urdf(u, **options).to_dict() for u in urdf_bodies]
    with home.open_writer() as kb:
        record = publish_skill(
            kb,
            policy,
            name,
            task_family,
            description=description,
            embodiments=embodiments,
            tasks=tasks,
        )
    click.echo(f"published {name}: {record.id}")


@click.command("certify")
@click.argument("skill_id")
@click.option(
    "--task", "task_name", required=True, help="A shipped task name or a task definition file."
)
@click.option("--branches", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@SAMPLER
@click.option(
    "--probe-budget",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also run an adversarial probe of this many rollouts and record its worst region.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the certificate as JSON.")
@scene_budget
@click.pass_obj
def certify_command(
    home: SiteHome,
    skill_id: str,
    task_name: str,
    branches: int,
    seed: int,
    workers: int,
    sampler_file: str | None,
    probe_budget: int,
    as_json: bool,
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Evaluate a skill of this site's library in randomized branches and sign the result as a
    certificate.

    The site's key needs the validate role; while `simnet serve` holds the store, run this from a
    validator's own home (a key the site delegated with `simnet device add KEY --roles validate`).
    """
    # as many simulations at once as a wave of its evaluation, or of its probe (64)
    wave = DEFAULT_WAVE if probe_budget else min(branches, DEFAULT_WAVE)
    # on all CPUs, as evaluate and probe run by default
    task = task_arg(task_name, scene_limits(max_scene_mb, max_compile_s), wave, threads=0)
    with home.open_writer() as kb:
        skill_id = skill_by_prefix(kb, skill_id).id
        result = evaluate(
            task,
            load_policy(kb, skill_id),
            branches=branches,
            workers=workers,
            sampler=sampler_arg(sampler_file, task, seed),
        )
        found = None
        if probe_budget:
            policy = load_policy(kb, skill_id)
            sampler = sampler_arg(sampler_file, task, seed)
            found = probe(task, policy, sampler=sampler, budget=probe_budget)
        cert = certify(kb, skill_id, result, probe=found)
        active = kb.is_active(skill_id)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "certificate": cert.id,
                    "skill": skill_id,
                    "branches": cert.branches,
                    "successes": cert.successes,
                    "randomized": list(cert.randomized),
                    "probe_failure_rate": found.failure_rate if found else None,
                    "active": active,
                }
            )
        )
        return
    click.echo(
        f"certified {skill_id[:16]}… on {task.name}: {cert.successes}/{cert.branches} "
        f"(Wilson lower bound {result.wilson_lower:.3f}; randomized {', '.join(cert.randomized)})\n"
        f"certificate {cert.id}\nactive here: {active}"
        + (f"\nworst region its probe found fails {found.failure_rate:.0%}" if found else "")
    )


@click.command("refine")
@click.argument("skill_id")
@click.option("--task", "task_name", required=True, help="A shipped task name or a task file.")
@click.option("--episodes", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--candidates", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Training epochs of the distilled version (with --publish).",
)
@click.option(
    "--publish",
    "new_name",
    help="Distill the refined runs into a new version of the skill and publish it as this name.",
)
@scene_budget
@click.pass_obj
def refine_command(
    home: SiteHome,
    skill_id: str,
    task_name: str,
    episodes: int,
    candidates: int,
    seed: int,
    epochs: int,
    new_name: str | None,
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Run SKILL with the simulator planning around it (best of N perturbed rollouts,
    re-planned), report its success alone and refined; with --publish, distill the refined
    runs into a new version of the skill (its parent: SKILL) and publish it."""
    # refine holds the episodes' batch and its planner's (episodes x candidates) at once, each
    # on one physics thread (the evaluation alone, before it, holds fewer)
    limits = scene_limits(max_scene_mb, max_compile_s)
    task = task_arg(task_name, limits, (episodes, episodes * candidates), threads=1)
    sampler = sampler_arg(None, task, seed)
    with home.open_readonly() as kb:
        skill = skill_by_prefix(kb, skill_id)
        policy = load_policy(kb, skill.id)
    alone = evaluate(task, policy, branches=episodes, sampler=sampler, threads=1, progress=False)
    refined = refine(task, policy, sampler=sampler, episodes=episodes, candidates=candidates)
    click.echo(
        f"{skill.name} on {task.name}: {alone.success_rate:.0%} alone, "
        f"{refined.success_rate:.0%} refined ({episodes} episodes)"
    )
    if new_name is None:
        return
    successor = distill_refined(refined, epochs=epochs)
    with home.open_writer() as kb:
        record = publish_skill(
            kb,
            successor,
            new_name,
            skill.task,
            parents=[skill.id],
            tasks=[task],
            embodiments=skill.embodiments,
        )
    click.echo(f"published {new_name}: {record.id} (parent {skill.id[:16]}…); certify it next")

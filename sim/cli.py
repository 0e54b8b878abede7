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

from ._assets import fetch_assets
from ._errors import MissingAssetError
from ._mlp import EntryPointRef, Policy
from ._patches import Sampler
from ._shipped import load_sampler, load_skill, load_task, shipped_skills, shipped_tasks
from ._tasks import Task
from .evaluation import (
    certify,
    distill_refined,
    evaluate,
    load_policy,
    probe,
    publish_skill,
    refine,
    reproduce,
    use_ray,
    verify_certificate,
)
from .transfer._datasets_cli import encoder_dataset_command  # noqa: F401 - simnet encoder dataset
from .validation._cli import validate_command  # noqa: F401 - simnet validate
from .world._world_cli import world_group  # noqa: F401 - simnet world

CANNOT_VERIFY = 3  # exit status: a file a task loads is missing here (no verdict either way)


def _skill(name: str) -> Policy | EntryPointRef:
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


def _task(name: str) -> Task:
    """A shipped task, or a definition file: the files its scene loads are read relative to the
    file's directory and carried by hash (`Task.from_files`)."""
    if name in shipped_tasks():
        return load_task(name)
    if Path(name).is_file():
        return Task.from_files(json.loads(Path(name).read_text()), Path(name).parent)
    raise click.BadParameter(
        f"neither a shipped task ({', '.join(shipped_tasks())}) nor a file", param_hint="--task"
    )


def _sampler(spec: str | None, task: Task, seed: int) -> Sampler:
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
) -> None:
    """Roll SKILL out closed loop in randomized branches of a task and report its success rate."""
    task = _task(task_name)
    if backend == "ray":
        use_ray(ray_address)
    result = evaluate(
        task,
        _skill(skill),
        branches=branches,
        sampler=_sampler(sampler_file, task, seed),
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


@click.command("reproduce")
@click.argument("record_file", type=click.Path(dir_okay=False, exists=True))
@click.argument("skill")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def reproduce_command(record_file: str, skill: str, workers: int, as_json: bool) -> None:
    """Re-run a recorded evaluation of SKILL; exit status 1 if it does not reproduce, 3 if a file
    its task's scene loads is not in this site's store (--home) nor at its peers."""
    record = json.loads(Path(record_file).read_text())
    try:
        assets = _record_assets(record)
        verdict = reproduce(record, _skill(skill), assets=assets, workers=workers)
    except MissingAssetError as exc:
        click.echo(f"cannot re-run here: {exc}", err=True)
        raise SystemExit(CANNOT_VERIFY) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "matches": verdict.matches,
                    "exact": verdict.exact,
                    "same_platform": verdict.same_platform,
                    "detail": verdict.detail,
                    "mismatched_branches": list(verdict.mismatched_branches),
                }
            )
        )
    else:
        click.echo(f"{'reproduces' if verdict.matches else 'DOES NOT REPRODUCE'}: {verdict.detail}")
    if not verdict.matches:
        raise SystemExit(1)


def _record_assets(record: dict) -> dict[str, bytes]:
    """The files a record's task loads, from this site's blobs and its peers (none without a
    site)."""
    definition = (record.get("task") or {}).get("definition") or {}
    if not isinstance(definition, dict) or not definition.get("assets"):
        return {}
    home = click.get_current_context().find_object(SiteHome)
    if home is None or not home.store.exists():
        name, digest = next(iter(sorted(definition["assets"].items())))
        raise MissingAssetError(name, str(digest), "no site (--home) to fetch it from")
    with home.open_readonly() as kb:
        return fetch_assets(kb, definition)


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
) -> None:
    """Publish a simulator skill (weights as a blob, architecture in the record) as this site."""
    options = urdf_reader_options(bool(urdf_bodies), floating_base, package_paths, balance_inertia)
    policy = _skill(skill)
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
            tasks=[_task(t) for t in for_tasks],
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
) -> None:
    """Evaluate a skill of this site's library in randomized branches and sign the result as a
    certificate.

    The site's key needs the validate role; while `simnet serve` holds the store, run this from a
    validator's own home (a key the site delegated with `simnet device add KEY --roles validate`).
    """
    task = _task(task_name)
    with home.open_writer() as kb:
        skill_id = skill_by_prefix(kb, skill_id).id
        result = evaluate(
            task,
            load_policy(kb, skill_id),
            branches=branches,
            workers=workers,
            sampler=_sampler(sampler_file, task, seed),
        )
        found = None
        if probe_budget:
            policy = load_policy(kb, skill_id)
            sampler = _sampler(sampler_file, task, seed)
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
) -> None:
    """Run SKILL with the simulator planning around it (best of N perturbed rollouts,
    re-planned), report its success alone and refined; with --publish, distill the refined
    runs into a new version of the skill (its parent: SKILL) and publish it."""
    task = _task(task_name)
    sampler = _sampler(None, task, seed)
    with home.open_readonly() as kb:
        skill = skill_by_prefix(kb, skill_id)
        policy = load_policy(kb, skill.id)
    alone = evaluate(task, policy, branches=episodes, sampler=sampler, progress=False)
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


@click.command("verify")
@click.argument("certificate")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.pass_obj
def verify_command(home: SiteHome, certificate: str, workers: int, as_json: bool) -> None:
    """Re-run a certificate's evaluation here (a certificate id prefix, or a skill: all of its
    certificates); exit status 1 if one is tampered or does not reproduce, else 3 if one cannot be
    verified here (a file its task's scene loads is missing: no verdict on it)."""
    with home.open_readonly() as kb:
        every = [
            c
            for s in kb.skills.list(include_withdrawn=True)
            for c in kb.certificates.for_skill(s.id)
        ]
        found = [c for c in every if c.id.startswith(certificate.lower())]
        if not found:
            found = kb.certificates.for_skill(skill_by_prefix(kb, certificate).id)
            if not found:
                raise click.ClickException(f"{certificate!r} names a skill with no certificates")
        elif len(found) > 1:
            raise click.ClickException(
                f"{len(found)} certificates match {certificate!r}; give more of the id"
            )
        verdicts = [(c, verify_certificate(kb, c, workers=workers)) for c in found]
    if as_json:
        rows = [
            {"certificate": c.id, "valid": v.valid, "verdict": v.verdict, "detail": v.detail}
            for c, v in verdicts
        ]
        click.echo(json.dumps(rows[0] if len(rows) == 1 else rows))
    else:
        shown = {"valid": "valid", "invalid": "NOT VALID", "cannot verify here": "UNVERIFIED"}
        for c, v in verdicts:
            click.echo(f"{c.id[:16]} {shown[v.verdict]}: {v.detail}")
    if any(v.verdict == "invalid" for _, v in verdicts):
        raise SystemExit(1)
    if any(v.verdict == "cannot verify here" for _, v in verdicts):
        raise SystemExit(CANNOT_VERIFY)

"""The `simnet` command: one click group over one table of command name -> "module:attr".

A command is imported only when it runs, so `simnet status` does not pay for importing the simulator
and torch, and `knowledge` never imports `sim` or `federation`: the table names them as text. Adding
a command is one line in `COMMANDS` (no reinstall). `simnet --help` lists the table's summaries
without importing anything. This module also defines the knowledge-base commands (`skills ...`).
Every read command takes ``--json``.
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

import knowledge

from ._cli_urdf import urdf_options as urdf_options  # re-exported: sim reads URDF too
from ._cli_urdf import urdf_reader_options as urdf_reader_options
from ._errors import SimnetError
from ._home import SiteHome

COMMANDS: dict[str, tuple[str, str]] = {
    # name: ("module:attr", the summary `simnet --help` shows; a test keeps it the command's own)
    "certify": (
        "sim.cli:certify_command",
        "Evaluate a skill of this site's library in randomized branches and sign the result as a "
        "certificate.",
    ),
    "device": (
        "federation.cli:device",
        "The device keys (robots, validators) allowed to write for this site.",
    ),
    "evaluate": (
        "sim.cli:evaluate_command",
        "Roll SKILL out closed loop in randomized branches of a task and report its success rate.",
    ),
    "init": (
        "federation.cli:init",
        "Create a site here: its root key (mode 0600), store, trust policy and simnet.toml.",
    ),
    "key": (
        "federation.cli:key_command",
        "Print this site's public key (64 hex), as its peers give it to `peer add --key`.",
    ),
    "peer": (
        "federation.cli:peer",
        "The sites this site syncs with.",
    ),
    "publish": (
        "sim.cli:publish_command",
        "Publish a simulator skill (weights as a blob, architecture in the record) as this site.",
    ),
    "refine": (
        "sim.cli:refine_command",
        "Run SKILL with the simulator planning around it (best of N perturbed rollouts, "
        "re-planned), report its success alone and refined; with --publish, distill the refined "
        "runs into a new version of the skill (its parent: SKILL) and publish it.",
    ),
    "reproduce": (
        "sim.cli:reproduce_command",
        "Re-run a recorded evaluation of SKILL; exit status 1 if it does not reproduce, 3 if a "
        "file its task's scene loads is not in this site's store (--home) nor at its peers, or "
        "its scene or wave is over this site's budget.",
    ),
    "revoke": (
        "federation.cli:revoke",
        "Revoke a skill fleet-wide (irreversible; publish a corrected skill instead of "
        "un-revoking).",
    ),
    "serve": (
        "federation.cli:serve_command",
        "Serve this site over HTTP and gossip with its peers until interrupted.",
    ),
    "status": (
        "federation.cli:status",
        "This site: key, server, peers (last sync, lag), counts of what it knows, and its "
        "validator.",
    ),
    "stop": (
        "federation.cli:stop_command",
        "Stop this site's running server (SIGTERM: it finishes its requests and closes the store).",
    ),
    "sync": (
        "federation.cli:sync_command",
        "Sync now with one peer, or with every peer.",
    ),
    "validate": (
        "sim.cli:validate_command",
        "Certify uncertified skills and spot-check other sites' certificates from the simulator, "
        "until interrupted (settings: validator.toml; state: validator.json, shown by `simnet "
        "status`).",
    ),
    "verify": (
        "sim.cli:verify_command",
        "Re-run a certificate's evaluation here (a certificate id prefix, or a skill: all of its "
        "certificates); exit status 1 if one is tampered or does not reproduce, else 3 if one "
        "cannot be verified here (a file its task's scene loads is missing, or its scene or wave "
        "is over this site's budget: no verdict on it).",
    ),
    "world": (
        "sim.cli:world_group",
        "Persistent, sharded worlds: create, status, advance, fork, replay, prune, drop.",
    ),
}
SERVICES = {
    # name: "module:attr" of f(home, kb, stop), a service `simnet serve --NAME` runs in a thread
    # beside gossip on the server's knowledge base until `stop` (a threading.Event) is set
    "validate": "sim.validation:run_validator",
}
BLOB_SETUP = (
    # "module:attr" of f(home, kb), run before a site's store first stores or fetches a blob: any
    # command (`certify`, `verify`, ...) then fetches what it lacks from the site's peers
    "federation:attach_site_peers",
)
EXTRAS = {  # an optional dependency -> the extra that installs it (see pyproject.toml)
    "uvicorn": "server",
    "starlette": "server",
    "yaml": "server",
    "prometheus_client": "server",
    "torch": "sim",
    "orjson": "sim",
    "tqdm": "sim",
    "ray": "ray",
}
ENCODER_COMMANDS: dict[str, tuple[str, str]] = {
    "dataset": (
        "sim.cli:encoder_dataset_command",
        "Make every body's native skills and evaluate each on every body of its kind: a success "
        "matrix.",
    ),
    "report": (
        "knowledge.embodiment._cli:report_command",
        "Per target body: Spearman of -distance with measured success, recall@5 of working skills.",
    ),
    "train": (
        "knowledge.embodiment._cli:train_command",
        "Train encoder weights on measured transfers; use them with `skills query --encoder FILE`.",
    ),
}


def emit(data: Any, as_json: bool, human: str) -> None:
    click.echo(json.dumps(data, indent=1, default=str) if as_json else human)


def skill_by_prefix(kb: knowledge.KnowledgeBase, prefix: str, shown: int = 5) -> knowledge.Skill:
    """The one skill whose id starts with `prefix` (or whose name is `prefix`); else an error that
    says which skills there are, so a typo is easy to mend."""
    skills = kb.skills.list(include_withdrawn=True)
    matches = [s for s in skills if s.id.startswith(prefix.lower())]
    matches = matches or [s for s in skills if s.name == prefix]
    if len(matches) == 1:
        return matches[0]
    candidates = matches or skills
    listed = ", ".join(f"{s.name} ({s.id[:12]})" for s in candidates[:shown])
    more = f" and {len(candidates) - shown} more" if len(candidates) > shown else ""
    if matches:
        raise click.ClickException(
            f"{len(matches)} skills match {prefix!r}; give more of the id ({listed}{more})"
        )
    known = f"skills here: {listed}{more}" if skills else "this site holds no skills"
    raise click.ClickException(f"0 skills match {prefix!r}; {known}")


class LazyGroup(click.Group):
    """A click group whose table of commands ("module:attr") is imported one command at a time."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands or name not in self.lazy:
            return super().get_command(ctx, name)
        module, _, attr = self.lazy[name][0].partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            raise _missing_extra(name, exc) from None
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[name][0]} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists commands, from the table's summaries: `simnet --help` imports nothing."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = [
            (name, click.Command(name, help=self.lazy[name][1]).get_short_help_str(limit))
            if name in self.lazy
            else (name, self.commands[name].get_short_help_str(limit))
            for name in names
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class _Simnet(LazyGroup):
    """The root group: a library error anywhere below becomes a one-line message, never a
    traceback; so does a file the system refuses (a read-only folder, a full disk), naming it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SimnetError as exc:
            raise click.ClickException(str(exc)) from None
        except ModuleNotFoundError as exc:  # a command that imports an extra's library as it runs
            raise _missing_extra(ctx.invoked_subcommand or "", exc) from None
        except OSError as exc:
            if exc.errno in (None, errno.EPIPE):  # not the disk's; a closed pipe is click's to end
                raise
            names = " -> ".join(str(n) for n in (exc.filename, exc.filename2) if n is not None)
            raise click.ClickException(
                f"{names}: {exc.strerror}" if names else str(exc.strerror or exc)
            ) from None


def _missing_extra(command: str, exc: ModuleNotFoundError) -> Exception:
    """The one-line error for a command whose optional dependency is not installed (else `exc`)."""
    extra = EXTRAS.get((exc.name or "").partition(".")[0])
    if extra is None:
        return exc
    return click.ClickException(
        f"`simnet {command}` needs the {extra} extra ({exc.name} is not installed): "
        f"pip install 'simnet-fleet[{extra}]'"
    )


@click.group(cls=_Simnet, lazy=COMMANDS)
@click.option(
    "--home",
    envvar="SIMNET_HOME",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The site's directory (or $SIMNET_HOME).",
)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(knowledge.__version__, prog_name="simnet")
@click.pass_context
def main(ctx: click.Context, home: Path, verbose: int) -> None:
    """simnet: share robot skills, maps and certificates across sites, safely."""
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    ctx.obj = SiteHome(home, blob_setup=BLOB_SETUP, services=SERVICES)


@main.group()
def skills() -> None:
    """The skill library."""


@skills.command("list")
@click.option("--task", help="Only this task family.")
@click.option("--active", is_flag=True, help="Only skills active under this site's policy.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def skills_list(home: SiteHome, task: str | None, active: bool, as_json: bool) -> None:
    """List skills: id, name, task, active, revoked."""
    with home.open_readonly() as kb:
        rows: list[dict[str, Any]] = [
            {
                "id": s.id,
                "name": s.name,
                "task": s.task,
                "author": s.author,
                "active": kb.is_active(s.id),
                "revoked": kb.is_revoked(s.id),
            }
            for s in kb.skills.list(task=task, active_only=active)
        ]
    lines = [f"{'id':16}  {'name':32} {'task':14} state"]
    for r in rows:
        state = "revoked" if r["revoked"] else "active" if r["active"] else "inactive"
        lines.append(f"{r['id'][:16]}  {r['name'][:32]:32} {r['task'][:14]:14} {state}")
    emit(rows, as_json, "\n".join(lines) if rows else "no skills")


@skills.command("show")
@click.argument("skill_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def skills_show(home: SiteHome, skill_id: str, as_json: bool) -> None:
    """Show one skill (an id prefix is enough), its activation, certificates and counts."""
    with home.open_readonly() as kb:
        skill = skill_by_prefix(kb, skill_id)
        activation = kb.activation(skill.id)
        data: dict[str, Any] = {
            "skill": asdict(skill),
            "active": activation.active,
            "reasons": list(activation.reasons),
            "revoked": kb.is_revoked(skill.id),
            "certificates": [asdict(c) for c in kb.certificates.for_skill(skill.id)],
            "counts": asdict(kb.counters.get(skill.id)),
        }
    human = [
        f"{skill.name}  ({skill.task})",
        f"id        {skill.id}",
        f"author    {skill.author}",
        f"active    {data['active']}  ({'; '.join(data['reasons'])})",
        f"counts    {data['counts']}",
        f"certified {len(data['certificates'])} time(s)",
    ]
    if skill.description:
        human.insert(1, skill.description)
    emit(data, as_json, "\n".join(human))


@skills.command("query")
@click.option("--mjcf", type=click.Path(exists=True, dir_okay=False), help="The robot's MJCF file.")
@click.option("--urdf", type=click.Path(exists=True, dir_okay=False), help="The robot's URDF file.")
@click.option("--task", help="Only this task family.")
@click.option("-k", "k", default=10, show_default=True, help="How many skills.")
@click.option(
    "--all", "include_inactive", is_flag=True, help="Include inactive and revoked skills."
)
@click.option("--min-branches", default=0, show_default=True, help="Minimum certified branches.")
@click.option(
    "--encoder",
    "encoder_spec",
    default="features",
    show_default=True,
    help="'features', 'learned' (the shipped weights) or a weights file from `simnet encoder "
    "train`.",
)
@urdf_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def skills_query(
    home: SiteHome,
    mjcf: str | None,
    urdf: str | None,
    task: str | None,
    k: int,
    include_inactive: bool,
    min_branches: int,
    encoder_spec: str,
    floating_base: bool | None,
    package_paths: tuple[str, ...],
    balance_inertia: bool,
    as_json: bool,
) -> None:
    """Skills that should work on this body, nearest first.

    The model file is read through the site's descriptor cache: asking again with unchanged
    files does not wait for MuJoCo."""
    if (mjcf is None) == (urdf is None):
        raise click.UsageError("give exactly one of --mjcf or --urdf")
    options = urdf_reader_options(urdf is not None, floating_base, package_paths, balance_inertia)
    from .embodiment._cli import load_encoder  # the embodiment side loads only for a query

    encoder = load_encoder(encoder_spec)
    with home.open_readonly() as kb:
        body = kb.skills.describe(mjcf or urdf or "", urdf=urdf is not None, **options)
        results = kb.skills.query(
            body,
            task=task,
            k=k,
            active_only=not include_inactive,
            min_certified_branches=min_branches,
            encoder=encoder,
        )
    rows: list[dict[str, Any]] = [
        {
            "id": r.skill.id,
            "name": r.skill.name,
            "task": r.skill.task,
            "distance": r.distance,
            "ranked_by": r.ranked_by,
            "ood": r.ood,
            "active": r.activation.active,
            "certificates": asdict(r.certificates),
        }
        for r in results
    ]
    lines = [f"{'distance':>9}  {'id':16}  {'name':32} {'task':12} active"]
    lines += [
        f"{r['distance']:9.4f}  {r['id'][:16]}  {r['name'][:32]:32} "
        f"{r['task'][:12]:12} {r['active']}"
        for r in rows
    ]
    if results and results[0].ood is not None:  # the learned encoder says how it ranked
        fell = results[0].ranked_by != encoder.name
        lines.append(
            f"out-of-distribution score {results[0].ood:.2f}"
            + (f" (above 1: ranked by {results[0].ranked_by})" if fell else "")
        )
    if not results and not as_json:  # how the learned encoder sees the body is worth knowing
        ood = encoder.assess(body)[1]
        lines = ["no matching skills"] + (
            [] if ood is None else [f"out-of-distribution score {ood:.2f}"]
        )
    if not body.actuators:  # ranked as what the file says: a passive body, which no skill drives
        lines.append(
            "note: this body has no actuators (an MJCF declares none and gives no joint armature; "
            "a URDF: no joint gives <limit effort>), so it ranks as a passive body; if its drives "
            "are added in code, describe the model with them"
        )
    emit(rows, as_json, "\n".join(lines))


@main.command("ledger")
@click.option(
    "--plot", type=click.Path(dir_okay=False), help="Also draw the calibration plot (PNG)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def ledger_command(home: SiteHome, plot: str | None, as_json: bool) -> None:
    """Certificates' predictions scored against field outcomes, per site, body and task family,
    and the skills this site's field test suspends."""
    with home.open_readonly() as kb:
        rows = [asdict(r) for r in kb.ledger.rows()]
        tests = [
            (s, t)
            for s in kb.skills.list()
            if (t := kb.ledger.field_test(s.id)) is not None and t.suspended
        ]
        if plot and rows:
            kb.ledger.calibration_png(plot)
    data = {"rows": rows, "suspended": [{"skill": s.id, "detail": t.detail} for s, t in tests]}
    lines = [f"{'site':12} {'body':16} {'task':12} skills trials  rate  brier  log   cover  crps"]
    for r in rows:
        scores = " ".join(f"{k}={v:.3g}" for k, v in r["crps"].items())
        lines.append(
            f"{r['site'][:12]:12} {r['embodiment'][:16]:16} {r['task'][:12]:12} {r['skills']:6} "
            f"{r['trials']:6} {r['successes'] / r['trials']:5.2f} {r['brier']:6.3f} "
            f"{r['log_score']:5.2f} {r['coverage']:5.2f}  {scores}"
        )
    lines += [f"suspended here: {s.name} ({s.id[:12]}): {t.detail}" for s, t in tests]
    emit(data, as_json, "\n".join(lines) if rows else "no field outcomes of certified skills")


@main.group()
def blobs() -> None:
    """The blobs this site stores (weights, meshes): list them, collect the garbage."""


@blobs.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def blobs_list(home: SiteHome, as_json: bool) -> None:
    """Stored blobs: hash, size, the skills and tasks naming them; garbage if only withdrawn or
    revoked skills do."""
    with home.open_readonly() as kb:
        named: dict[str, list[str]] = {}
        for skill in kb.skills.list(include_withdrawn=True):
            weights = (skill.policy or {}).get("weights")
            for blob_hash in {*skill.blobs, *([weights] if isinstance(weights, str) else [])}:
                named.setdefault(blob_hash, []).append(skill.name)
        files: dict[str, list[str]] = {}
        for task_hash in kb.tasks.list():
            for file, blob_hash in kb.tasks.assets(task_hash).items():
                files.setdefault(blob_hash, []).append(f"{kb.tasks.name(task_hash)}:{file}")
        garbage = kb.blobs.collect_garbage(dry_run=True)
        rows: list[dict[str, Any]] = [
            {
                "hash": h,
                "bytes": kb.blobs.size(h),
                "skills": sorted(named.get(h, [])),
                "tasks": sorted(files.get(h, [])),
                "garbage": h in garbage,
            }
            for h in kb.blobs.list()
        ]
        total, quota = kb.blobs.stored_bytes(), kb.blobs.quota
    lines = [
        f"{r['hash'][:16]}  {r['bytes']:>12}  {'garbage ' if r['garbage'] else ''}"
        f"{', '.join(r['skills'] + r['tasks']) or '(nothing names it)'}"
        for r in rows
    ]
    lines.append(f"{total} bytes stored" + (f" of a {quota}-byte quota" if quota else ""))
    emit({"blobs": rows, "bytes": total, "quota": quota}, as_json, "\n".join(lines))


@blobs.command("gc")
@click.option("--dry-run", is_flag=True, help="Say what would be freed; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def blobs_gc(home: SiteHome, dry_run: bool, as_json: bool) -> None:
    """Delete the blobs that only withdrawn or revoked skills name (run it while no server holds
    the store)."""
    with home.open_readonly() if dry_run else home.open_writer() as kb:
        freed = kb.blobs.collect_garbage(dry_run=dry_run)
    verb = "would free" if dry_run else "freed"
    emit(freed, as_json, f"{verb} {sum(freed.values())} bytes in {len(freed)} blob(s)")


@main.group(cls=LazyGroup, lazy=ENCODER_COMMANDS)
def encoder() -> None:
    """The learned embodiment encoder: retrain it, report how well its distances predict
    transfer."""


def run() -> None:
    """Console-script entry point (click's standalone mode: errors are one line and exit status
    1)."""
    main(prog_name="simnet")

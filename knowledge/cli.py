"""The `simnet` command: one click group, composed from each package's own commands.

This module defines the group and the knowledge-base commands (`skills list/show`). Other packages add
theirs through the ``simnet.commands`` entry-point group (see pyproject.toml), so `knowledge` never
imports them. Every read command takes ``--json``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import click

import knowledge

from ._errors import SimnetError
from .embodiment._cli import load_encoder, report_command, train_command

STORE_FILE = "site.db"
KEY_FILE = "site.key"
POLICY_FILE = "trust.toml"


class Home:
    """A site's directory (``--home`` or $SIMNET_HOME): its store, root key and trust policy, plus the
    files of federation's configuration (simnet.toml)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def store(self) -> Path:
        return self.path / STORE_FILE

    def _need_store(self) -> None:
        if not self.store.exists():
            raise click.ClickException(
                f"no knowledge base in {self.path}; run `simnet init` there, or pass --home"
            )

    def open_readonly(self) -> knowledge.KnowledgeBase:
        self._need_store()
        return knowledge.open(self.store)

    def open_writer(self) -> knowledge.KnowledgeBase:
        """The store opened as the site's key; StoreLockedError says so if `simnet serve` holds it."""
        self._need_store()
        identity = knowledge.Identity.load(self.path / KEY_FILE)
        policy = self.path / POLICY_FILE
        return knowledge.open(self.store, identity, policy=policy if policy.exists() else None)


def emit(data: Any, as_json: bool, human: str) -> None:
    click.echo(json.dumps(data, indent=1, default=str) if as_json else human)


class _Commands(click.Group):
    """`simnet`: its own commands plus those other packages register under the ``simnet.commands``
    entry-point group (one entry per command name), imported only when used — so `simnet status` does not
    pay for importing the simulator and torch. An entry named ``group.name`` adds to one of our groups."""

    def __init__(self, *args: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = prefix

    def _registered(self) -> dict[str, EntryPoint]:
        found = {
            entry.name.removeprefix(self.prefix): entry
            for entry in entry_points(group="simnet.commands")
            if entry.name.startswith(self.prefix)
        }
        return {name: entry for name, entry in found.items() if "." not in name}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._registered()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in (registered := self._registered()):
            command = registered[name].load()
        return command


@click.group(cls=_Commands)
@click.option(
    "--home",
    envvar="SIMNET_HOME",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The site's directory (or $SIMNET_HOME).",
)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def main(ctx: click.Context, home: Path, verbose: int) -> None:
    """simnet: share robot skills, maps and certificates across sites, safely."""
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    ctx.obj = Home(home)


@main.group()
def skills() -> None:
    """The skill library."""


@skills.command("list")
@click.option("--task", help="Only this task family.")
@click.option("--active", is_flag=True, help="Only skills active under this site's policy.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def skills_list(home: Home, task: str | None, active: bool, as_json: bool) -> None:
    """List skills: id, name, task, active, revoked."""
    with home.open_readonly() as kb:
        rows = [
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
def skills_show(home: Home, skill_id: str, as_json: bool) -> None:
    """Show one skill (an id prefix is enough), its activation, certificates and counts."""
    with home.open_readonly() as kb:
        matches = [
            s for s in kb.skills.list(include_withdrawn=True) if s.id.startswith(skill_id.lower())
        ]
        if len(matches) != 1:
            raise click.ClickException(
                f"{len(matches)} skills match {skill_id!r}; give more of the id"
            )
        skill = matches[0]
        activation = kb.activation(skill.id)
        data = {
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
    help="'features', 'learned' (the shipped weights) or a weights file from `simnet encoder train`.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def skills_query(
    home: Home,
    mjcf: str | None,
    urdf: str | None,
    task: str | None,
    k: int,
    include_inactive: bool,
    min_branches: int,
    encoder_spec: str,
    as_json: bool,
) -> None:
    """Skills that should work on this body, nearest first."""
    if (mjcf is None) == (urdf is None):
        raise click.UsageError("give exactly one of --mjcf or --urdf")
    body = knowledge.Embodiment.from_mjcf(mjcf) if mjcf else knowledge.Embodiment.from_urdf(urdf)  # type: ignore[arg-type]
    encoder = load_encoder(encoder_spec)
    with home.open_readonly() as kb:
        results = kb.skills.query(
            body,
            task=task,
            k=k,
            active_only=not include_inactive,
            min_certified_branches=min_branches,
            encoder=encoder,
        )
    rows = [
        {
            "id": r.skill.id,
            "name": r.skill.name,
            "task": r.skill.task,
            "distance": r.distance,
            "active": r.activation.active,
            "certificates": asdict(r.certificates),
        }
        for r in results
    ]
    lines = [f"{'distance':>9}  {'id':16}  {'name':32} {'task':12} active"]
    lines += [
        f"{r['distance']:9.4f}  {r['id'][:16]}  {r['name'][:32]:32} {r['task'][:12]:12} {r['active']}"
        for r in rows
    ]
    emit(rows, as_json, "\n".join(lines) if rows else "no matching skills")


@main.group(cls=_Commands, prefix="encoder.")
def encoder() -> None:
    """The learned embodiment encoder: retrain it, report how well its distances predict transfer."""


encoder.add_command(train_command)
encoder.add_command(report_command)


def run() -> None:
    """Console-script entry point: library errors become one-line messages and exit status 1."""
    try:
        main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except click.Abort:
        raise SystemExit(1) from None
    except SimnetError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None

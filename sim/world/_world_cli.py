"""`simnet world ...`: persistent worlds of a site, stored beside its knowledge base
(<home>/worlds/NAME.db).

The commands run shards in the CLI's own process by default (`--backend inline`): they are short,
and a worker process or Ray actor would only add start-up time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from knowledge import SiteHome

from .._cli_args import scene_budget, scene_limits, scene_refusal
from .._errors import SimError
from ..evaluation._executors import BACKENDS
from ._entities import Entity, check_name
from ._world import World
from ._world_input import check_text

WORLDS_DIR = "worlds"


def world_path(home: SiteHome, name: str) -> Path:
    try:
        return home.path / WORLDS_DIR / f"{check_name('world', name)}.db"
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None


def _utf8(ctx: click.Context, param: click.Parameter, text: str) -> str:
    """Text the world can store: the shell passes bytes that are not UTF-8 as lone surrogates."""
    try:
        return check_text(param.name or "text", text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not UTF-8 text") from None


@contextlib.contextmanager
def _opened(home: SiteHome, name: str, backend: str = "inline") -> Iterator[World]:
    """World NAME, open for the block; a SimError in it (opening included) is the command's error
    message."""
    path = world_path(home, name)
    if not path.exists():
        raise click.ClickException(
            f"no world {name!r} in {home.path / WORLDS_DIR}; create it with `simnet world create`"
        )
    try:
        with World.open(path, backend=backend) as world:
            yield world
    except SimError as exc:
        raise click.ClickException(str(exc)) from exc


def _entity(spec: str) -> Entity:
    """NAME=FILE@SHARD or NAME=FILE@SHARD:X,Y,Z"""
    try:
        name, rest = spec.split("=", 1)
        path, where = rest.rsplit("@", 1)
        shard, _, pos = where.partition(":")
        xyz = tuple(float(v) for v in pos.split(",")) if pos else (0.0, 0.0, 0.0)
        return Entity(name, Path(path).read_text(encoding="utf-8"), shard, xyz)  # type: ignore[arg-type]
    except (ValueError, OSError) as exc:
        raise click.BadParameter(
            f"{spec!r}: {exc} (expected NAME=FILE@SHARD[:X,Y,Z])", param_hint="--entity"
        ) from exc


_backend = click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="inline",
    show_default=True,
    help="Where shards run: this process, worker processes, or Ray actors.",
)
_json = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.group("world")
def world_group() -> None:
    """Persistent, sharded worlds: create, status, advance, fork, replay, prune, drop."""


@world_group.command("create")
@click.argument("name")
@click.option(
    "--shard",
    "shards",
    multiple=True,
    required=True,
    metavar="NAME=SCENE.xml",
    help="A shard and its scene MJCF (repeatable).",
)
@click.option(
    "--entity",
    "entities",
    multiple=True,
    metavar="NAME=FILE@SHARD[:X,Y,Z]",
    help="An entity (an MJCF model of it alone), the shard it starts in and where (repeatable).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Ticks (physics steps) between checkpoints.",
)
@scene_budget
@click.pass_obj
def create_command(
    home: SiteHome,
    name: str,
    shards: tuple[str, ...],
    entities: tuple[str, ...],
    checkpoint_every: int,
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Create world NAME in this site's directory. Each scene and entity file is first compiled in
    a child process under the scene budget, as a task's scene is, so a file that asks for
    gigabytes is refused with nothing created."""
    scenes = {}
    for spec in shards:
        shard, sep, scene = spec.partition("=")
        if not sep or not Path(scene).is_file():
            raise click.BadParameter(
                f"{spec!r}: expected NAME=SCENE.xml with an existing file", param_hint="--shard"
            )
        try:
            scenes[shard] = Path(scene).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"{spec!r}: {exc}", param_hint="--shard") from None
    placed = [_entity(e) for e in entities]
    limits = scene_limits(max_scene_mb, max_compile_s)
    for what, text in [
        *((f"shard {shard}: its scene", text) for shard, text in scenes.items()),
        *((f"entity {entity.name}: its model", entity.mjcf) for entity in placed),
    ]:
        if refusal := scene_refusal({"scene": text}, {}, 1, limits, what=what):
            raise click.ClickException(refusal)
    path, worlds = world_path(home, name), home.path / WORLDS_DIR
    try:  # the site's own folder of worlds (and the site's folder): made as needed
        worlds.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(
            f"cannot create the folder {worlds} for world {name!r}: {exc.strerror or exc}"
        ) from None
    try:
        with World.create(
            path,
            scenes,
            placed,
            name=name,
            checkpoint_every=checkpoint_every,
            backend="inline",
        ) as world:
            click.echo(
                f"created world {name} ({world.id}) with shards {', '.join(world.shards)} at {path}"
            )
    except (SimError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@world_group.command("status")
@click.argument("name", required=False)
@_backend
@_json
@click.pass_obj
def status_command(home: SiteHome, name: str | None, backend: str, as_json: bool) -> None:
    """Shards (tick, time, entities, events, checkpoints) and branches of world NAME; without NAME,
    the worlds here."""
    if name is None:
        names = sorted(p.stem for p in (home.path / WORLDS_DIR).glob("*.db"))
        click.echo(json.dumps(names) if as_json else "\n".join(names) or "no worlds")
        return
    with _opened(home, name, backend) as world:
        status = world.status()
    if as_json:
        click.echo(json.dumps(status, indent=1))
        return
    lines = [
        f"world {status['name']} ({status['id']}), "
        f"checkpoints every {status['checkpoint_every']} ticks"
    ]
    for shard, s in status["shards"].items():
        kept = f" (history from tick {s['history_from']})" if s["history_from"] else ""
        lines.append(
            f"  {shard:12} tick {s['tick']:>9}  t={s['time']:.3f}s  events {s['events']:>6}  "
            f"checkpoints {s['checkpoints']:>5}  entities: {', '.join(s['entities']) or '-'}{kept}"
        )
    for b in status["branches"]:
        lines.append(
            f"  branch {b['id']} of {b['shard']} from tick {b['base_tick']}, "
            f"at {b['head']}  {b['label']}"
        )
    click.echo("\n".join(lines))


@world_group.command("advance")
@click.argument("name")
@click.argument("steps", type=click.IntRange(min=0))
@click.option("--shard", "shards", multiple=True, help="Only these shards (default: all).")
@_backend
@click.pass_obj
def advance_command(
    home: SiteHome, name: str, steps: int, shards: tuple[str, ...], backend: str
) -> None:
    """Step world NAME by STEPS ticks, logging and checkpointing as it goes."""
    with _opened(home, name, backend) as world:
        heads = world.advance(steps, list(shards) or None)
    click.echo(", ".join(f"{s} at tick {t}" for s, t in heads.items()))


@world_group.command("fork")
@click.argument("name")
@click.argument("shard")
@click.option(
    "--at", "tick", type=click.IntRange(min=0), required=True, help="The tick to branch from."
)
@click.option("--label", default="", callback=_utf8, help="A note kept with the branch.")
@click.pass_obj
def fork_command(home: SiteHome, name: str, shard: str, tick: int, label: str) -> None:
    """Branch SHARD of world NAME at a tick; prints the branch id."""
    with _opened(home, name) as world:
        branch = world.fork(shard, tick, label=label)
    click.echo(branch.id)


@world_group.command("replay")
@click.argument("name")
@click.argument("shard")
@click.argument("start", type=click.IntRange(min=0))
@click.argument("stop", type=click.IntRange(min=0))
@_backend
@_json
@click.pass_obj
def replay_command(
    home: SiteHome, name: str, shard: str, start: int, stop: int, backend: str, as_json: bool
) -> None:
    """Re-execute SHARD from START to STOP and compare with the recorded checkpoints; exit 1 if they
    differ."""
    with _opened(home, name, backend) as world:
        result = world.replay(shard, start, stop)
    data: dict[str, Any] = {
        "shard": shard,
        "start": start,
        "stop": stop,
        "exact": result.exact,
        "checked": list(result.checked),
        "mismatched": list(result.mismatched),
        "state_sha256": result.snapshot.state_sha256,
    }
    if as_json:
        click.echo(json.dumps(data))
    else:
        verdict = "exact" if result.exact else f"DIFFERS at ticks {list(result.mismatched)}"
        click.echo(
            f"replayed {shard} {start}..{stop}: {verdict} "
            f"({len(result.checked)} checkpoints compared); "
            f"state {data['state_sha256'][:16]}"
        )
    if not result.exact:
        raise SystemExit(1)


@world_group.command("prune")
@click.argument("name")
@click.option(
    "--before",
    "tick",
    type=click.IntRange(min=0),
    required=True,
    help="Forget history before the last checkpoint at or before this tick.",
)
@click.option("--shard", "shards", multiple=True, help="Only these shards (default: all).")
@click.pass_obj
def prune_command(home: SiteHome, name: str, tick: int, shards: tuple[str, ...]) -> None:
    """Retention: drop each shard's events and checkpoints before a tick; forks and replays start
    there after."""
    with _opened(home, name) as world:
        starts = world.prune(tick, list(shards) or None)
    click.echo(", ".join(f"{s}: history from tick {t}" for s, t in starts.items()))


@world_group.command("drop")
@click.argument("name")
@click.argument("branch")
@click.pass_obj
def drop_command(home: SiteHome, name: str, branch: str) -> None:
    """Delete BRANCH of world NAME (its log and checkpoints); the canonical world is untouched."""
    with _opened(home, name) as world:
        world.branch(branch).delete()
    click.echo(f"dropped branch {branch}")

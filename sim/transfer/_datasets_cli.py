"""`simnet encoder dataset`: generate a transfer dataset in the simulator (the encoder group lives
in knowledge)."""

from __future__ import annotations

import json
import time

import click

from ._bodies import robot_population
from ._datasets import transfer_dataset


@click.command("dataset")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the dataset (JSON; gzip-compressed when it ends in .gz).",
)
@click.option(
    "--arms", type=click.IntRange(min=0), default=64, show_default=True, help="Procedural arms."
)
@click.option(
    "--legged",
    type=click.IntRange(min=0),
    default=40,
    show_default=True,
    help="Procedural legged bodies.",
)
@click.option(
    "--industrial-arms",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="6-7 dof arms of vendor patterns, mostly torque-driven.",
)
@click.option(
    "--two-armed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Two-armed torsos.",
)
@click.option(
    "--mobile-manipulators",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Wheeled bases with one or two arms.",
)
@click.option(
    "--quadrupeds",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Floating-base 3D quadrupeds.",
)
@click.option(
    "--humanoids",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Floating-base humanoids.",
)
@click.option(
    "--sources",
    type=click.IntRange(min=1),
    default=None,
    help="Evaluate each body with its own skill and this many others drawn for it (default: all).",
)
@click.option(
    "--shipped/--no-shipped",
    default=True,
    show_default=True,
    help="Include the project's own arm and walker scenes.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="First body seed, and the seed of the evaluation branches.",
)
@click.option(
    "--branches",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Branches per (skill, body) evaluation.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes; the dataset does not depend on it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a summary as JSON.")
def encoder_dataset_command(
    out: str,
    arms: int,
    legged: int,
    industrial_arms: int,
    two_armed: int,
    mobile_manipulators: int,
    quadrupeds: int,
    humanoids: int,
    sources: int | None,
    shipped: bool,
    seed: int,
    branches: int,
    workers: int,
    as_json: bool,
) -> None:
    """Make every body's native skills and evaluate each on every body of its kind: a success
    matrix."""
    robots = robot_population(
        arms,
        legged,
        seed=seed,
        shipped=shipped,
        industrial=industrial_arms,
        two_armed=two_armed,
        mobile=mobile_manipulators,
        quadrupeds=quadrupeds,
        humanoids=humanoids,
    )
    if not robots:
        raise click.UsageError("no bodies: give a number of some kind of body, or keep --shipped")
    start = time.perf_counter()
    data = transfer_dataset(robots, branches=branches, workers=workers, seed=seed, sources=sources)
    data.save(out)
    summary = {
        "out": out,
        "bodies": len(data.bodies),
        "transfers": len(data.transfers),
        "tasks": list(data.tasks),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"wrote {out}: {summary['bodies']} bodies, {summary['transfers']} transfers "
            f"({', '.join(data.tasks)}) in {summary['seconds']} s"
        )

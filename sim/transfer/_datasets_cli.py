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
    shipped: bool,
    seed: int,
    branches: int,
    workers: int,
    as_json: bool,
) -> None:
    """Make every body's native skills and evaluate each on every body of its kind: a success
    matrix."""
    robots = robot_population(arms, legged, seed=seed, shipped=shipped)
    if not robots:
        raise click.UsageError("no bodies: give --arms or --legged, or keep --shipped")
    start = time.perf_counter()
    data = transfer_dataset(robots, branches=branches, workers=workers, seed=seed)
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

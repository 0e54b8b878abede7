"""`simnet validate`: run the validator service on this site's store, in the foreground."""

from __future__ import annotations

import json
import signal
import threading
from types import FrameType

import click

from knowledge import SiteHome, StoreLockedError
from knowledge.cli import skill_by_prefix

from ._settings import SETTINGS_FILE, ValidatorSettings, settings_with
from ._validator import REQUESTS_FILE, Validator


@click.command("validate")
@click.option("--once", is_flag=True, help="Work through the queue as it is now, then exit.")
@click.option("--branches", type=click.IntRange(min=1), help="Branches per task (default 128).")
@click.option("--workers", type=click.IntRange(min=1), help="Evaluation worker processes.")
@click.option("--threads", type=click.IntRange(min=1), help="Physics threads per wave.")
@click.option(
    "--request",
    metavar="SKILL",
    help="Put SKILL (a name or id prefix) at the head of the queue (a running validator too), "
    "and exit.",
)
@click.option("--json", "as_json", is_flag=True, help="With --once: print the final state as JSON.")
@click.pass_obj
def validate_command(
    home: SiteHome,
    once: bool,
    branches: int | None,
    workers: int | None,
    threads: int | None,
    request: str | None,
    as_json: bool,
) -> None:
    """Certify uncertified skills and spot-check other sites' certificates from the simulator, until
    interrupted (settings: validator.toml; state: validator.json, shown by `simnet status`).

    While `simnet serve` holds the store, run `simnet serve --validate` instead.
    """
    if request is not None:
        with home.open_readonly() as kb:
            skill = skill_by_prefix(kb, request)
        with open(home.path / REQUESTS_FILE, "a") as requests:
            requests.write(skill.id + "\n")
        click.echo(f"requested {skill.name} ({skill.id[:16]}…): validated first")
        return
    settings = settings_with(
        ValidatorSettings.load(home.path / SETTINGS_FILE),
        branches=branches,
        workers=workers,
        threads=threads,
    )
    try:
        kb = home.open_writer()
    except StoreLockedError:
        raise click.ClickException(
            "a server holds this site's store: validate there with `simnet serve --validate`"
        ) from None
    with kb:
        validator = Validator(kb, settings, home=home.path)
        if once:
            done = 0
            while validator.queue():
                validator.step()
                done += 1
                if done > 10_000:  # a queue that never empties is a bug, not a workload
                    break
            validator._save(validator.queue(), state="stopped")  # not stale: done, on purpose
            state = validator.status(state="stopped")
            if as_json:
                click.echo(json.dumps(state))
            else:
                click.echo(
                    f"{state['certificates']} certificates, {state['spot_checks']} spot checks "
                    f"({state['disputes']} disputed), {len(state['failed'])} failed, "
                    f"{len(state['waiting'])} waiting"
                )
            return
        stop = threading.Event()

        def halt(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, halt)
        signal.signal(signal.SIGINT, halt)
        validator.run(stop)

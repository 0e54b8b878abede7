"""`simnet reproduce` and `simnet verify`: re-run an evaluation another site recorded, its wave
(`layout.wave`) first held to this site's limit and its scene compiled under this site's scene
budget in a child process."""

from __future__ import annotations

import json
from pathlib import Path

import click

import knowledge
from knowledge import SiteHome
from knowledge.cli import skill_by_prefix

from ._assets import fetch_assets
from ._cli_args import (
    CANNOT_VERIFY,
    SceneLimits,
    record_definition,
    record_refusal,
    scene_budget,
    scene_limits,
    skill_arg,
)
from ._errors import MissingAssetError, SimError
from .evaluation import Verification, reproduce, verify_certificate


@click.command("reproduce")
@click.argument("record_file", type=click.Path(dir_okay=False, exists=True))
@click.argument("skill")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@scene_budget
def reproduce_command(
    record_file: str,
    skill: str,
    workers: int,
    as_json: bool,
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Re-run a recorded evaluation of SKILL; exit status 1 if it does not reproduce, 3 if a file
    its task's scene loads is not in this site's store (--home) nor at its peers, or its scene or
    wave is over this site's budget."""
    record = json.loads(Path(record_file).read_text())
    limits = scene_limits(max_scene_mb, max_compile_s)
    try:
        assets = _record_assets(record)
        refusal = record_refusal(record, assets, limits)
        if refusal is not None:
            click.echo(f"cannot re-run here: {refusal}", err=True)
            raise SystemExit(CANNOT_VERIFY)
        verdict = reproduce(record, skill_arg(skill), assets=assets, workers=workers)
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
    definition = record_definition(record)
    if definition is None or not definition.get("assets"):
        return {}
    home = click.get_current_context().find_object(SiteHome)
    if home is None or not home.store.exists():
        name, digest = next(iter(sorted(definition["assets"].items())))
        raise MissingAssetError(name, str(digest), "no site (--home) to fetch it from")
    with home.open_readonly() as kb:
        return fetch_assets(kb, definition)


@click.command("verify")
@click.argument("certificate")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@scene_budget
@click.pass_obj
def verify_command(
    home: SiteHome,
    certificate: str,
    workers: int,
    as_json: bool,
    max_scene_mb: int | None,
    max_compile_s: float | None,
) -> None:
    """Re-run a certificate's evaluation here (a certificate id prefix, or a skill: all of its
    certificates); exit status 1 if one is tampered or does not reproduce, else 3 if one cannot be
    verified here (a file its task's scene loads is missing, or its scene or wave is over this
    site's budget: no verdict on it)."""
    limits = scene_limits(max_scene_mb, max_compile_s)
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
        verdicts = [(c, _verified(kb, c, workers, limits)) for c in found]
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


def _verified(
    kb: knowledge.KnowledgeBase,
    certificate: knowledge.Certificate,
    workers: int,
    limits: SceneLimits,
) -> Verification:
    """`verify_certificate`, once the certificate's wave and its probe's branches showed within
    `limits` and a child process that its scene with that wave fits them: "cannot verify here" if
    not."""
    definition = record_definition(certificate.evaluation)
    try:
        assets = None if definition is None else fetch_assets(kb, definition)
    except (SimError, knowledge.SimnetError):  # missing or malformed: verifying says which
        assets = None
    if definition is None or assets is not None:
        refusal = record_refusal(certificate.evaluation, assets or {}, limits, certificate.probe)
        if refusal is not None:
            return Verification(False, f"cannot verify here: {refusal}", verifiable=False)
    return verify_certificate(kb, certificate, workers=workers)

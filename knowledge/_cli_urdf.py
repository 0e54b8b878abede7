"""The URDF reader's options as flags, for every `simnet` command that reads a URDF file
(`skills query --urdf`, `publish --urdf`): `Embodiment.from_urdf`'s floating_base, package_path
and balance_inertia."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def urdf_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add `Embodiment.from_urdf`'s options to a command that reads URDF files, as its parameters
    `floating_base`, `package_paths` and `balance_inertia` (`urdf_reader_options` bundles them)."""
    options = [
        click.option(
            "--floating-base/--fixed-base",
            "floating_base",
            default=None,
            help="Whether the URDF robot's base floats. Default: it floats when it has legs or "
            "wheels (docs/EMBODIMENT.md).",
        ),
        click.option(
            "--package-path",
            "package_paths",
            multiple=True,
            type=click.Path(exists=True, file_okay=False),
            help="A folder where package:// URIs are looked up, before $ROS_PACKAGE_PATH and the "
            "file's own folders (repeatable).",
        ),
        click.option(
            "--balance-inertia",
            is_flag=True,
            help="Repair URDF inertias MuJoCo refuses (no rigid body has them).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def urdf_reader_options(
    urdf_given: bool,
    floating_base: bool | None,
    package_paths: tuple[str, ...],
    balance_inertia: bool,
) -> dict[str, Any]:
    """The keyword arguments of `from_urdf` from `urdf_options`' flags; a usage error names the
    flags when no URDF file is given for them to apply to."""
    given = [
        flag
        for flag, used in (
            ("--floating-base/--fixed-base", floating_base is not None),
            ("--package-path", bool(package_paths)),
            ("--balance-inertia", balance_inertia),
        )
        if used
    ]
    if given and not urdf_given:
        verb = "applies" if len(given) == 1 else "apply"
        raise click.UsageError(f"{', '.join(given)} {verb} to a URDF file: give one with --urdf")
    return {
        "floating_base": floating_base,
        "package_path": list(package_paths) or None,
        "balance_inertia": balance_inertia,
    }

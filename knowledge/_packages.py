"""`package://` URIs, resolved one way everywhere: describing a URDF (`Embodiment.from_urdf`, the
descriptor cache) and bundling a task's scene files (`sim.Task.from_files`, the task builders).

ROS names files inside a package, `package://NAME/rest`, and leaves where packages lie to the
machine. The search order, first match wins:

1. the `package_path` argument, in order;
2. `ROS_PACKAGE_PATH` (entries separated by `os.pathsep`), in order;
3. the folders holding the file that names the URI (`relative_to`: the file, or its folder),
   nearest first, up to the root: a vendor package unpacked anywhere finds its own meshes.

In each folder, NAME is a directory of that name inside it, or the folder itself when it is named
NAME. A package found nowhere is a `PackageNotFoundError` naming the URI and every place searched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ._errors import EmbodimentError

PACKAGE_SCHEME = "package://"


class PackageNotFoundError(EmbodimentError):
    """A `package://` URI whose package is in no folder of the search path."""

    def __init__(self, uri: str, package: str, searched: list[Path], where: str = "") -> None:
        self.uri, self.package, self.searched = uri, package, searched
        places = ", ".join(map(str, searched)) or "nowhere"
        super().__init__(
            f"{where}{': ' if where else ''}cannot resolve {uri}: no package {package!r} in the"
            f" search path: {places}; pass package_path= (simnet: --package-path) or set"
            " ROS_PACKAGE_PATH"
        )

    def at(self, where: str) -> PackageNotFoundError:
        """The same error, its message starting with `where` (the file that names the URI)."""
        return PackageNotFoundError(self.uri, self.package, self.searched, where)


def package_search_path(
    package_path: Iterable[str | os.PathLike[str]] | None = None,
    relative_to: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """The folders searched for a package, in order (module docstring): `package_path`, then
    `ROS_PACKAGE_PATH`, then the folders holding `relative_to` (the file naming the URI, or its
    folder), nearest first."""
    roots = [Path(p) for p in package_path or ()]
    roots += [Path(p) for p in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep) if p]
    if relative_to is not None:
        near = Path(os.path.abspath(relative_to))
        roots += [near, *near.parents] if near.is_dir() else near.parents
    return roots


def resolve_package_uri(
    uri: str,
    *,
    package_path: Iterable[str | os.PathLike[str]] | None = None,
    relative_to: str | os.PathLike[str] | None = None,
) -> Path:
    """The file `package://NAME/rest` names (not checked to exist): `rest` under the first folder
    of `package_search_path` that is or holds a directory NAME. `package://NAME` alone is the
    package's directory (xacro's `$(find NAME)`). PackageNotFoundError otherwise; ValueError for a
    URI of another scheme."""
    if not uri.startswith(PACKAGE_SCHEME):
        raise ValueError(f"{uri!r} is not a package:// URI")
    package, _, rest = uri.removeprefix(PACKAGE_SCHEME).lstrip("/").partition("/")
    searched = package_search_path(package_path, relative_to)
    for root in searched:
        for candidate in (root / package, root):
            if package and candidate.name == package and candidate.is_dir():
                return candidate / rest if rest else candidate
    raise PackageNotFoundError(uri, package, searched)

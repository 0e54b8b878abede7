"""Scene assets carried by content: the files a task's scene loads (meshes, textures, heightfields,
skins) travel with the task as blobs, named in its definition's "assets" (relative name -> sha256),
so that the task's hash covers them and any site re-runs it from the same bytes.

MuJoCo reads them from memory: a compiled task gets a virtual file system holding exactly its
assets, and a scene that would load anything else (a file the task does not carry, an `<include>`,
an element whose file this module does not know) is refused, so nothing is read from the working
directory of whoever compiles it. `bundle` does the authoring side: it reads the files a model
spec loads (from the model's directory, and URDF `package://` URIs by knowledge's one search
order, as `Embodiment.from_urdf` resolves them), renames them to portable relative names and
returns their bytes. An `<include>`d file becomes part of the scene text: MuJoCo's reader inlines
it and its writer writes it out.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from knowledge import (
    BlobError,
    BlobQuotaError,
    KnowledgeBase,
    PackageNotFoundError,
    resolve_package_uri,
)

from ._errors import MissingAssetError, TaskDefinitionError

_HEX64 = re.compile(r"[0-9a-f]{64}")
_PACKAGE = "package://"
# elements whose file MuJoCo loads when it compiles, and the compiler directory it is under
_DIRS = {"mesh": "meshdir", "hfield": "meshdir", "skin": "meshdir", "texture": "texturedir"}
_CUBE_FACES = ("fileright", "fileleft", "fileup", "filedown", "filefront", "fileback")
PathLike = str | os.PathLike[str]


def declared(definition: Mapping[str, Any]) -> dict[str, str]:
    """A definition's "assets" field, checked: portable relative names -> sha256 hex."""
    assets = definition.get("assets", {})
    if not isinstance(assets, dict):
        raise TaskDefinitionError("assets", "must map relative file names to sha256 hashes")
    for name, digest in assets.items():
        check_name(name, f"assets[{name!r}]")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise TaskDefinitionError(f"assets[{name!r}]", "must be a sha256: 64 lowercase hex")
    return dict(assets)


def check_name(name: object, field: str) -> str:
    """A portable asset name: a relative POSIX path without '.', '..' or empty parts, and no
    control characters (a NUL would reach the file system as an error of its own)."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith("/")
        or "\\" in name
        or ":" in name
        or not name.isprintable()
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise TaskDefinitionError(
            field, f"{name!r} is not a relative file name ('dir/file.stl', no '..')"
        )
    return name


def checked_bytes(names: Mapping[str, str], given: Mapping[str, bytes]) -> dict[str, bytes]:
    """The bytes of every asset `names` declares, each checked against its hash: a wrong one is a
    TaskDefinitionError, an absent one a MissingAssetError."""
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise TaskDefinitionError(f"assets[{unknown[0]!r}]", "is not named in the definition")
    out = {}
    for name, digest in sorted(names.items()):
        if name not in given:
            raise MissingAssetError(name, digest, "its bytes were not given")
        data = bytes(given[name])
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise TaskDefinitionError(
                f"assets[{name!r}]", f"the bytes given hash to {actual[:16]}…, not {digest[:16]}…"
            )
        out[name] = data
    return out


@contextlib.contextmanager
def virtual_files(assets: Mapping[str, bytes]) -> Iterator[mujoco.MjVfs]:
    """A MuJoCo virtual file system holding `assets` under their names (looked up exactly)."""
    with mujoco.MjVfs() as vfs:
        for name, data in assets.items():
            vfs[name] = data
        yield vfs


def check_sealed(xml: str, names: Sequence[str]) -> None:
    """Refuse a scene that would load a file other than the assets `names`: TaskDefinitionError
    naming the file (a task must compile from what it carries on any machine)."""
    if "file" not in xml and "include" not in xml:
        return  # no element that loads a file can be in it
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise TaskDefinitionError("scene", f"MuJoCo cannot read it: {exc}") from exc
    for element in root.iter():
        files = [k for k in element.attrib if k.startswith("file")]
        if element.tag == "include":
            raise TaskDefinitionError(
                "scene",
                f"includes {element.get('file')!r}: a task's scene is one text (build the task "
                "with sim.Task.from_files, which inlines included files)",
            )
        if files and element.tag not in _DIRS:
            raise TaskDefinitionError(
                "scene",
                f"<{element.tag} {files[0]}={element.get(files[0])!r}> loads a file a task "
                "cannot carry (tasks carry meshes, textures, heightfields and skins)",
            )
    try:
        spec = mujoco.MjSpec.from_string(xml)
    except ValueError as exc:
        raise TaskDefinitionError("scene", f"MuJoCo cannot read it: {_one_line(exc)}") from exc
    carried = set(names)
    for kind, _, _, file, where in _files(spec):
        if file.startswith(_PACKAGE):
            raise TaskDefinitionError(
                "scene", f"{where} loads {file!r}: build the task with sim.Task.from_files"
            )
        name = _lookup(spec, kind, file)
        if name not in carried:
            raise TaskDefinitionError(
                "scene",
                f"{where} loads {name!r}, which the task does not carry in its assets (build it "
                "with sim.Task.from_files to carry the files it loads)",
            )


def bundle(
    spec: Any, directory: PathLike | None = None, package_path: Sequence[PathLike] = ()
) -> dict[str, bytes]:
    """Read the files a model spec loads, rename them in the spec to portable names and give it
    their bytes (`spec.assets`); returns name -> bytes. Relative paths resolve against the model
    file's directory (or `directory`, or the working directory, for a spec read from text);
    `package://pkg/...` by `knowledge.resolve_package_uri`: `package_path`, ROS_PACKAGE_PATH,
    then that directory and those above it (as `Embodiment.from_urdf` does). Names are paths
    relative to the model's directory when every file is under it, else to the deepest directory
    holding them all. TaskDefinitionError names a file that cannot be read."""
    base = Path(os.path.normpath(spec.modelfiledir or directory or "."))
    found = []  # (element, cube face or None, file on disk)
    for reference in _files(spec):
        kind, element, face, file, where = reference
        if file.startswith(_PACKAGE):
            path = _package_file(file, package_path, base, where)
        else:
            name = posixpath.basename(file) if spec.strippath else file
            path = base / getattr(spec, _DIRS[kind]) / name
        path = Path(os.path.normpath(path))
        if not path.is_file():
            raise TaskDefinitionError("scene", f"{where} loads {file!r}: {path} is no file")
        found.append((element, face, path))
    names = _portable_names([path for _, _, path in found], base)
    for element, face, path in found:
        if face is None:
            element.file = names[path]
        else:
            faces = list(element.cubefiles)
            faces[face] = names[path]
            element.cubefiles = faces
    spec.meshdir = spec.texturedir = ""
    spec.strippath = False
    spec.modelfiledir = ""
    files = {name: path.read_bytes() for path, name in names.items()}
    spec.assets = files  # what the spec compiles from from now on
    return files


def drop_visual_meshes(spec: Any) -> None:
    """Delete the meshes that only visual geoms use, those geoms, and their files from
    `spec.assets`: a task is physics, nothing renders it, and a vendor arm's visual OBJ files made
    its task 31 MB where its collision meshes are 0.4 MB. Visual is what MuJoCo's own
    `discardvisual` drops; a body whose inertia such a geom sets keeps its meshes (MuJoCo computes
    inertias before discarding), so the compiled inertias are checked to be the same."""
    if not spec.meshes:
        return
    probe = spec.copy()
    probe.compiler.discardvisual = True
    try:  # its inertias are the whole scene's: MuJoCo computes them before discarding
        kept = probe.compile()
    except ValueError:
        return  # the task's own compile says what is wrong, naming the scene
    visual = {mesh.name for mesh in spec.meshes} - {kept.mesh(i).name for i in range(kept.nmesh)}
    for _ in range(2):  # the second pass confirms that the first one's choice changes nothing
        if not visual:
            return
        trial = spec.copy()
        _delete_meshes(trial, visual)
        changed = _inertia_changed(kept, trial.compile())
        if not changed:
            break
        visual -= {g.meshname for g in spec.geoms if g.parent.name in changed}
    else:
        return
    files = {mesh.name: mesh.file for mesh in spec.meshes}
    _delete_meshes(spec, visual)
    needed = {mesh.file for mesh in spec.meshes}
    carried = spec.assets  # not a mesh given by its vertices in the scene: it has no file
    for name in ({files[m] for m in visual} - needed) & carried.keys():
        del spec.assets[name]  # assigning a dict to `spec.assets` adds to it


def _delete_meshes(spec: Any, names: set[str]) -> None:
    for geom in list(spec.geoms):
        if geom.meshname in names:
            spec.delete(geom)
    for mesh in list(spec.meshes):
        if mesh.name in names:
            spec.delete(mesh)


def _inertia_changed(before: mujoco.MjModel, after: mujoco.MjModel) -> set[str]:
    """Names of the bodies whose mass, inertia or its frame differ between two compiles of one
    tree (an unnamed one makes every body count as changed)."""
    arrays = ("body_mass", "body_inertia", "body_ipos", "body_iquat")
    differ = np.zeros(before.nbody, bool)
    for name in arrays:
        a, b = getattr(before, name), getattr(after, name)
        differ |= ~np.isclose(a, b, rtol=1e-9, atol=1e-12).reshape(before.nbody, -1).all(1)
    names = [before.body(i).name for i in np.flatnonzero(differ)]
    if "" in names:
        return {before.body(i).name for i in range(before.nbody)}
    return set(names)


def fetch_assets(kb: KnowledgeBase, definition: Mapping[str, Any]) -> dict[str, bytes]:
    """The bytes of a definition's assets from `kb`'s blobs, fetched from its sources (peers) when
    not stored: MissingAssetError naming the first that no source has, BlobQuotaError if one does
    not fit in the store's quota."""
    out = {}
    for name, digest in sorted(declared(definition).items()):
        try:
            out[name] = kb.blobs.fetch(digest)
        except BlobQuotaError:
            raise
        except BlobError as exc:
            raise MissingAssetError(name, digest, str(exc)) from None
    return out


def read_file(path: Path, field: str) -> bytes:
    """A file's bytes; TaskDefinitionError naming `field` if it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TaskDefinitionError(field, f"{path} cannot be read ({exc.strerror})") from None


def included_files(xml: str, directory: Path, depth: int = 0) -> dict[str, bytes]:
    """The files a scene `<include>`s (and they include), read from `directory`: MuJoCo resolves
    an include against the main file's directory, and a scene given as text has none."""
    if "include" not in xml:
        return {}
    if depth > 16:
        raise TaskDefinitionError("scene", "includes nest more than 16 deep")
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise TaskDefinitionError("scene", f"MuJoCo cannot read it: {exc}") from exc
    found: dict[str, bytes] = {}
    for element in root.iter("include"):
        file = element.get("file", "")
        data = read_file(directory / file, "scene")
        found[file] = data
        found.update(included_files(data.decode(errors="replace"), directory, depth + 1))
    return found


# --- reading a spec's files ----------------------------------------------------------------------


def _files(spec: Any) -> Iterator[tuple[str, Any, int | None, str, str]]:
    """(kind, element, cube face or None, file as written, where) for every file the spec's assets
    load."""
    for kind, elements in (
        ("mesh", spec.meshes),
        ("hfield", spec.hfields),
        ("skin", spec.skins),
        ("texture", spec.textures),
    ):
        for i, element in enumerate(elements):
            label = f"{kind} {element.name or i!r}"
            if element.file:
                yield kind, element, None, element.file, label
            for face, file in enumerate(getattr(element, "cubefiles", ())):
                if file:
                    yield kind, element, face, file, f"{label} ({_CUBE_FACES[face]})"


def _lookup(spec: Any, kind: str, file: str) -> str:
    """The name MuJoCo looks a file up by, when the scene is compiled from text."""
    name = posixpath.basename(file) if spec.strippath else file
    return posixpath.normpath(posixpath.join(getattr(spec, _DIRS[kind]), name))


def _package_file(uri: str, package_path: Sequence[PathLike], base: Path, where: str) -> Path:
    """The file a `package://pkg/rest` URI names, by knowledge's one search order: `package_path`,
    ROS_PACKAGE_PATH, then the model's folder and those above it."""
    try:
        return resolve_package_uri(uri, package_path=package_path, relative_to=base)
    except PackageNotFoundError as exc:
        raise TaskDefinitionError("scene", f"{where} loads {uri!r}: {exc}") from None


def _portable_names(paths: list[Path], base: Path) -> dict[Path, str]:
    """Each file's name: its path relative to `base` if all are under it, else relative to the
    deepest directory holding them all."""
    absolute = [p.absolute() for p in paths]
    root = base.absolute()
    if not all(p.is_relative_to(root) for p in absolute):
        root = Path(os.path.commonpath([p.parent for p in absolute]))
    return {p: a.relative_to(root).as_posix() for p, a in zip(paths, absolute, strict=True)}


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())

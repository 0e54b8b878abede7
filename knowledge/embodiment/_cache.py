"""Descriptors cached by content, so that a robot asking again does not wait for MuJoCo again.

Describing a model file compiles it: tens to hundreds of milliseconds for a mesh robot, even with
its visual geoms left out (`_trim`). The key is a SHA-256 over the content of every file the
description reads (the model, its includes, the meshes its physical geoms use and other assets it
names, but not textures or meshes only visual geoms use), the reader's options and the versions of
the descriptor reader and of MuJoCo: the same content is a hit wherever the files lie, and any edit
that can change the description is a miss. Files whose reads cannot be listed (xacro, MJCF text)
are not cached.

Entries are `to_dict()` JSON, one file per key in a directory (`<store>.embodiments` beside a
knowledge base), read back through `from_dict`, which checks them; a damaged entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import xml.etree.ElementTree as ET
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco

from .._errors import EmbodimentError
from ._descriptors import FORMAT, Embodiment, describe
from ._mjcf import MjcfModel, prepare_mjcf
from ._urdf import resolve_mesh, uses_xacro

VERSION = f"simnet.descriptor-cache/4 format {FORMAT} mujoco {mujoco.__version__}"
"""Part of every key: a new descriptor layout, reader or MuJoCo version may describe a file
differently (2: MJCF extents leave visual geoms out; 3: MJCF meshes that weigh are weighed with
numpy, whose principal axes are not MuJoCo's to the last digits, and an MJCF scene's undriven
objects are left out; 4: an MJCF model that declares no actuators has motors where its joints
have armature)."""
_ASSET_DIRS = ("meshdir", "texturedir", "assetdir")


def _xml(path: Path) -> ET.Element | None:
    try:
        return ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None


def mjcf_files(path: Path, visual: Callable[[], set[str]] = set) -> list[Path] | None:
    """The files an MJCF description reads: the model, its includes and every asset a `file`
    attribute names (each place MuJoCo may look for it) but those `visual()` gives (asked only
    when assets are named), or None when the model cannot be parsed."""
    base = path.parent
    files, queue, seen = [], [path], set()
    named: list[str] = []
    dirs = [""]
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        root = _xml(current)
        if root is None:
            return None
        files.append(current)
        for element in root.iter():
            if element.tag == "compiler":
                dirs += [element.get(key, "") for key in _ASSET_DIRS if element.get(key)]
            if element.get("file"):
                if element.tag == "include":
                    queue.append(base / element.get("file", ""))
                else:
                    named.append(element.get("file", ""))
    skip = visual() if named else set()
    for name in (name for name in named if name not in skip):
        files += [base / d / name for d in dirs if (base / d / name).is_file()]
    return files


def urdf_files(path: Path, package_path: Any, label: str = "<cache>") -> list[Path] | None:
    """The files a URDF description reads: itself and its collision meshes; None for xacro or
    when a mesh cannot be resolved (the reader then says why)."""
    root = _xml(path)
    if root is None or path.name.endswith(".xacro") or uses_xacro(root):
        return None
    files = [path]
    roots = list(package_path or ())
    for mesh in root.iterfind("link/collision/geometry/mesh"):
        try:
            files.append(resolve_mesh(label, path, mesh.get("filename", ""), roots))
        except EmbodimentError:
            return None
    return files


def cache_key(files: list[Path], options: Any) -> str | None:
    """SHA-256 of the version, the options, and each file's place (relative to the first) and
    content; None if a file cannot be read."""
    digest = hashlib.sha256(json.dumps([VERSION, options], default=str).encode())
    base = files[0].parent
    for file in sorted(set(files), key=str):
        try:
            content = file.read_bytes()
        except OSError:
            return None
        name = os.path.relpath(file, base) if file != files[0] else ""
        digest.update(f"\0{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


class DescriptorCache:
    """Descriptors by content key: the last `capacity` in memory, all of them in `directory`
    (None: memory only)."""

    def __init__(self, directory: str | os.PathLike[str] | None, capacity: int = 64) -> None:
        self.directory = None if directory is None else Path(directory)
        self.capacity = capacity
        self.hits = self.misses = 0
        self._memory: OrderedDict[str, Embodiment] = OrderedDict()
        self._lock = threading.Lock()  # queries run on several threads; reads run unlocked

    def read(self, path: str | os.PathLike[str], *, urdf: bool, **options: Any) -> Embodiment:
        """`Embodiment.from_urdf(path, **options)` or `from_mjcf(path, **options)`, from the cache
        when the files are unchanged."""
        path = Path(path)
        reader: Callable[[], Embodiment]
        if urdf:
            reader = lambda: Embodiment.from_urdf(path, **options)  # noqa: E731
            files = urdf_files(path, options.get("package_path"))
        else:
            parsed: list[MjcfModel] = []

            def visual() -> set[str]:
                """Parse the model (milliseconds) to leave the visual meshes out of the key."""
                parsed.append(prepare_mjcf(path))
                return parsed[0].visual_files()

            files = mjcf_files(path, visual)
            reader = lambda: describe(  # noqa: E731
                (parsed or [prepare_mjcf(path)])[0].parts(**options)
            )
        key = None
        if files is not None:
            os_path = os.environ.get("ROS_PACKAGE_PATH", "") if urdf else ""
            key = cache_key(files, ["urdf" if urdf else "mjcf", sorted(options.items()), os_path])
        if key is None:
            return reader()
        with self._lock:
            found = self._memory.get(key)
        if found is None:
            found = self._load(key)
        hit = found is not None
        if found is None:
            found = reader()
            self._save(key, found)
        with self._lock:
            self.hits += hit
            self.misses += not hit
            self._memory[key] = found
            self._memory.move_to_end(key)
            while len(self._memory) > self.capacity:
                self._memory.popitem(last=False)
        return found

    def _load(self, key: str) -> Embodiment | None:
        if self.directory is None:
            return None
        try:
            return Embodiment.from_dict(json.loads((self.directory / f"{key}.json").read_bytes()))
        except (OSError, ValueError, EmbodimentError):
            return None  # absent or damaged: read the files again

    def _save(self, key: str, embodiment: Embodiment) -> None:
        if self.directory is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=self.directory, suffix=".tmp", delete=False
            ) as out:
                # dumps, not dump: json.dump encodes in Python, dumps in C (a tenth of a query)
                out.write(json.dumps(embodiment.to_dict(), separators=(",", ":")))
            os.replace(out.name, self.directory / f"{key}.json")
        except OSError:
            pass  # a cache that cannot be written (a read-only store) only costs time

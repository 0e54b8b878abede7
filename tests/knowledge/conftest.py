"""Fixtures for disks that refuse writes, for real: read-only files and folders, a full disk.

- `read_only(*paths)` makes files and folders read-only until the test ends. chmod does not stop
  root, so when the tests run as root the test's thread also gives up, for the test, the
  capabilities that bypass file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER).
  Capabilities are per thread on Linux: SQLite, called from this thread, is refused as any other
  user would be.
- `untrimmed(path)` describes an MJCF file from MuJoCo compiling it whole, visual geoms left out of
  the extents: what `Embodiment.from_mjcf`, which compiles only the file's physics, must equal.
- `small_disk(script, *args, size_kb=...)` runs a Python script in a private mount namespace
  (`unshare -rm`) with a tmpfs of `size_kb` mounted at the path it gets as `sys.argv[1]`: a real
  file system that fills up (ENOSPC), or is remounted read-only. Skipped where user namespaces are
  not available.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mujoco
import pytest

from knowledge import Embodiment
from knowledge.embodiment._descriptors import describe
from knowledge.embodiment._mjcf import _describe, prepare_mjcf
from knowledge.embodiment._parts import Parts
from knowledge.embodiment._scene import robot_only, with_armature_motors, with_floating_base
from knowledge.embodiment._trim import split, trim

_CAP_VERSION_3 = 0x20080522
_BYPASS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _set_effective(change) -> int:
    """Apply `change(effective) -> effective` to this thread's capabilities; the old value."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    old = data[0].effective
    data[0].effective = change(old)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    return old


@pytest.fixture
def read_only():
    changed: list[tuple[Path, int]] = []
    saved: list[int] = []

    def _make(*paths: Path) -> None:
        for path in paths:
            mode = path.stat().st_mode & 0o7777
            changed.append((path, mode))
            path.chmod(mode & ~0o222)
        if os.geteuid() == 0 and not saved:
            if not sys.platform.startswith("linux"):
                pytest.skip("as root, chmod binds only where capabilities can be dropped (Linux)")
            mask = sum(1 << cap for cap in _BYPASS)
            saved.append(_set_effective(lambda effective: effective & ~mask))

    yield _make
    if saved:
        _set_effective(lambda _effective: saved[0])
    for path, mode in reversed(changed):
        path.chmod(mode)


_UNSHARE = shutil.which("unshare")


def _namespaces_work(where: Path) -> bool:
    if _UNSHARE is None:
        return False
    probe = subprocess.run(
        [_UNSHARE, "-rm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0"', str(where)],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if not _namespaces_work(mount):
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to mount a small tmpfs")

    def _run(script: str, *args: str, size_kb: int = 1024) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                _UNSHARE,
                "-rm",
                "sh",
                "-c",
                f'mount -t tmpfs -o size={size_kb}k tmpfs "$0" && exec "$@"',
                str(mount),
                sys.executable,
                "-c",
                script,
                str(mount),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    return _run


def _untrimmed_parts(path: Path) -> Parts:
    """The file compiled whole by MuJoCo, its visual geoms left out of the extents and its meshes
    bounded by the vertices `trim` read from their files: the parts, in model order."""
    trimmed = prepare_mjcf(path)
    trim(trimmed.spec, trimmed.plan)
    spec = mujoco.MjSpec.from_file(str(path))
    visual = split(spec).visual
    model = spec.compile()
    parts = _describe(model, {geom.id for geom in visual}, trimmed.plan.bounds)
    parts = robot_only(with_armature_motors(parts))
    return with_floating_base(str(path), parts, None)


def _untrimmed(path: Path) -> Embodiment:
    """The description of `_untrimmed_parts`."""
    return describe(_untrimmed_parts(path))


@pytest.fixture
def untrimmed():
    return _untrimmed


@pytest.fixture
def untrimmed_parts():
    return _untrimmed_parts

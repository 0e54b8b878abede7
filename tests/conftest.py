"""Shared fixtures: identities and knowledge bases on real SQLite files."""

from __future__ import annotations

import os
import struct
import sys
import zlib
from pathlib import Path

# Where PYTHONDONTWRITEBYTECODE is set, every process the suite starts (the xdist workers and the
# many `simnet` commands, servers and child processes of the tests) compiled every module it
# imported (torch, numpy, starlette, ...) from source again: a fifth of the suite's CPU time. The
# suite keeps compiled bytecode in .cache/pycache instead (ignored by git, nothing written beside
# the sources); a PYTHONPYCACHEPREFIX set by the caller is kept.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(Path(__file__).parents[1] / ".cache" / "pycache")
    sys.dont_write_bytecode = False
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

# The suite runs on several xdist workers (pyproject's addopts): one OpenMP/BLAS thread (torch,
# faiss, numpy) in each worker and in every process it starts. Their default, a thread per core in
# every process, spins threads against each other once the cores are busy: tests/sim/test_distill.py
# took 390 s instead of 26 s on a loaded machine. Set before anything loads those libraries; an
# OMP_NUM_THREADS set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import knowledge  # noqa: E402

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "quick",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("SIMNET_HYPOTHESIS_PROFILE", "default"))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): two workers per core, as many tests spend their time
    waiting for processes they started (servers, `simnet` commands, a pip install) rather than
    computing: with a worker per core and one more, the suite kept 2 cores only 1.4 busy."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 2 * (cores or 1)


# Modules whose tests take the longest (tens of seconds each: documents and examples run whole,
# a cold mypy run, real sites as processes, a pip install, thousands of random schedules), slowest
# first. xdist hands tests out in collection order, one at a time to whichever worker is free:
# collected last (as tests/test_docs.py, tests/test_examples.py and tests/test_types.py are), they
# started when the rest was nearly done and the suite waited for them. Started first, the short
# tests fill in around them. (Only with `--no-loadscope-reorder`, in pyproject's addopts: by
# default `--dist loadgroup` hands out the groups with the most tests first, and the documents
# started a minute in, the cold mypy run after them, the pip install three minutes in.)
SLOW_FIRST = (
    "tests/test_docs.py",
    "tests/test_types.py",  # one mypy run over everything, cold in a fresh clone: a minute or more
    "tests/system/test_light_install.py",
    "tests/knowledge/test_convergence.py",
    "tests/test_examples.py",
    "tests/system/test_loop.py",
    "tests/redteam/test_page_bytes.py",
    "tests/knowledge/test_recordtext.py",
    "tests/system/test_assets.py",
    "tests/system/test_blobs.py",
    "tests/sim/test_ray.py",  # the "ray" group (one Ray for all its tests, on one worker)
    "tests/knowledge/test_mesh_bounds.py",
    "tests/knowledge/test_learned.py",
    "tests/sim/test_datasets.py",
    "tests/sim/test_world.py",
    "tests/system/test_validator_status.py",
    "tests/sim/test_distill.py",
    "tests/knowledge/test_trust.py",
    "tests/knowledge/test_crash.py",
    "tests/sim/test_branches.py",
    "tests/system/test_clocks.py",
    "tests/system/test_fleet.py",
    "tests/redteam/test_forks.py",
    "tests/sim/test_morphologies.py",
    "tests/knowledge/test_corpus.py",
)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """The slowest modules first (SLOW_FIRST), then the collection's order.

    `--dist loadgroup` (pyproject's addopts) runs the tests of one xdist group on one worker:

    - "ray": every test on Ray (those using `ray_session`; a parametrized backend marks its "ray"
      case itself), so one local Ray serves them all instead of one per worker;
    - a module's tests that share a module-scoped fixture (a `simnet serve` site, a peer process, a
      recorded evaluation), so it is built once rather than on every worker.
    """
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}  # whole modules keep their order
    items[:] = sorted(items, key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    for item in items:  # before xdist reads the groups
        if item.get_closest_marker("xdist_group"):
            continue
        if "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    result = yield
    if getattr(config.option, "loadgroup", False):  # set on xdist workers under loadgroup
        _tell_xdist_the_groups(items)
    return result


def _tell_xdist_the_groups(items: list[pytest.Item]) -> None:
    """pytest-xdist 3.8 tells its scheduler a test's group by appending "@group" to the test's node
    id through `item._nodeid`, which pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386):
    `--dist loadgroup` then silently groups nothing. Append it where pytest 9.2 keeps the id."""
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # pytest's record of the fixtures a test uses
    if info is None:
        return False
    return any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs)


def simnet_here(home: Path, *args: str) -> str:
    """`simnet --home HOME ARGS` through the real entry point, `knowledge.cli.run`, in this
    process, for fixtures' set-up (init, peer add, device add) and commands that are clients of
    running sites: a `simnet` process spends half a second importing before it starts. Returns its
    stdout; raises AssertionError with its stderr if it fails or prints a traceback."""
    from click.testing import CliRunner

    from knowledge.cli import run

    argv = sys.argv
    with CliRunner().isolation() as (out, err, _):
        sys.argv = ["simnet", "--home", str(home), *args]
        try:
            run()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        stderr = err.getvalue().decode()
        if code != 0 or "Traceback" in stderr:
            raise AssertionError(f"simnet {' '.join(args)} failed ({code}):\n{stderr}")
        return out.getvalue().decode()


@pytest.fixture
def identity() -> knowledge.Identity:
    return knowledge.Identity.generate()


@pytest.fixture
def open_kb(tmp_path):
    """open_kb(name, identity=None, policy=None) -> KnowledgeBase on a real file; all closed at
    teardown."""
    opened = []

    def _open(name: str = "site", identity: knowledge.Identity | None = None, **kwargs):
        kb = knowledge.open(
            tmp_path / f"{name}.db", identity or knowledge.Identity.generate(), **kwargs
        )
        opened.append(kb)
        return kb

    yield _open
    for kb in opened:
        kb.close()


# --- a robot whose scene loads files (meshes, a texture, an include) ------------------------------


def _box_stl(length: float, half: float) -> bytes:
    """A binary STL of a box from (0, -half, -half) to (length, half, half): 12 triangles."""
    corners = [(x, y, z) for x in (0.0, length) for y in (-half, half) for z in (-half, half)]
    faces = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1)]
    faces += [(2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]
    out = bytearray(80) + struct.pack("<I", len(faces))
    for face in faces:
        out += struct.pack("<3f", 0.0, 0.0, 0.0)  # MuJoCo computes normals itself
        for i in face:
            out += struct.pack("<3f", *corners[i])
        out += b"\0\0"
    return bytes(out)


def _box_obj(length: float, half: float) -> str:
    corners = [(x, y, z) for x in (0.0, length) for y in (-half, half) for z in (-half, half)]
    faces = ["1 2 4 3", "5 7 8 6", "1 5 6 2", "3 4 8 7", "1 3 7 5", "2 6 8 4"]
    return "".join(f"v {x} {y} {z}\n" for x, y, z in corners) + "".join(f"f {f}\n" for f in faces)


def _png(width: int, height: int) -> bytes:
    """An RGB checkerboard as PNG bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\0" + b"".join(bytes([255 * ((x + y) % 2)] * 3) for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(rows))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + idat + chunk(b"IEND", b"")


MESH_ARM = """<mujoco>
  <worldbody>
    <body name="upper" pos="0 0 0.1">
      <joint name="shoulder" axis="0 0 1" damping="0.05"/>
      <geom type="mesh" mesh="upper" density="500"/>
      <body name="fore" pos="0.2 0 0">
        <joint name="elbow" axis="0 0 1" damping="0.05"/>
        <geom type="mesh" mesh="fore" density="500"/>
        <site name="ee" pos="0.15 0 0"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.fixture
def mesh_robot():
    """mesh_robot(directory, absolute_meshdir=False, fore_length=0.15) -> the scene.xml of a
    2-link planar arm whose links are meshes (an STL and an OBJ, in meshes/), with a textured
    floor (textures/grid.png) and its arm in an included file (arm.xml)."""

    def _write(directory: Path, absolute_meshdir: bool = False, fore_length: float = 0.15) -> Path:
        (directory / "meshes").mkdir(parents=True, exist_ok=True)
        (directory / "textures").mkdir(exist_ok=True)
        (directory / "meshes" / "upper.stl").write_bytes(_box_stl(0.2, 0.02))
        (directory / "meshes" / "fore.obj").write_text(_box_obj(fore_length, 0.015))
        (directory / "textures" / "grid.png").write_bytes(_png(4, 4))
        (directory / "arm.xml").write_text(MESH_ARM)
        meshdir = (directory / "meshes").resolve() if absolute_meshdir else "meshes"
        scene = directory / "scene.xml"
        scene.write_text(
            f"""<mujoco model="meshbot">
  <compiler meshdir="{meshdir}" texturedir="textures"/>
  <asset>
    <mesh name="upper" file="upper.stl"/>
    <mesh name="fore" file="fore.obj"/>
    <texture name="grid" type="2d" file="grid.png"/>
    <material name="floor" texture="grid"/>
  </asset>
  <worldbody>
    <geom name="floor" type="plane" size="1 1 0.1" material="floor"/>
  </worldbody>
  <include file="arm.xml"/>
  <actuator>
    <motor joint="shoulder" gear="2" ctrlrange="-1 1"/>
    <motor joint="elbow" gear="2" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""
        )
        return scene

    return _write


@pytest.fixture
def mesh_urdf():
    """mesh_urdf(workspace) -> the URDF of a 1-joint arm in a ROS package `meshbot_description`
    under `workspace`: its visual mesh by `package://`, its collision mesh by a relative path; both
    files are named link.stl, in meshes/visual/ and meshes/collision/."""

    def _write(workspace: Path) -> Path:
        package = workspace / "meshbot_description"
        for kind, half in (("visual", 0.02), ("collision", 0.025)):
            (package / "meshes" / kind).mkdir(parents=True, exist_ok=True)
            (package / "meshes" / kind / "link.stl").write_bytes(_box_stl(0.3, half))
        (package / "urdf").mkdir(exist_ok=True)
        urdf = package / "urdf" / "meshbot.urdf"
        inertia = '<inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/>'
        urdf.write_text(
            f"""<robot name="meshbot">
  <mujoco><compiler discardvisual="false"/></mujoco>
  <link name="base"><inertial><mass value="1"/>{inertia}</inertial></link>
  <link name="arm">
    <inertial><mass value="0.5"/>{inertia}</inertial>
    <visual><geometry>
      <mesh filename="package://meshbot_description/meshes/visual/link.stl"/>
    </geometry></visual>
    <collision><geometry><mesh filename="../meshes/collision/link.stl"/></geometry></collision>
  </link>
  <link name="tool"><inertial><mass value="0.1"/>{inertia}</inertial></link>
  <joint name="pan" type="revolute">
    <parent link="base"/><child link="arm"/><axis xyz="0 0 1"/>
    <limit lower="-2" upper="2" effort="10" velocity="2"/>
  </joint>
  <joint name="tool_joint" type="fixed">
    <parent link="arm"/><child link="tool"/><origin xyz="0.3 0 0"/>
  </joint>
</robot>
"""
        )
        return urdf

    return _write

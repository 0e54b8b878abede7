"""Shared fixtures: the shipped tasks with short horizons, so the whole sim suite stays quick."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import textwrap
import zlib

import numpy as np
import pytest

import sim
from sim.world._worldrows import Checkpoint, Log
from sim.world._worldstore import WorldStore


@pytest.fixture(scope="session")
def arm() -> sim.Task:
    return sim.load_task("arm_reach")


@pytest.fixture(scope="session")
def walker() -> sim.Task:
    return sim.load_task("walker_forward")


@pytest.fixture(scope="session")
def short_walker(walker: sim.Task) -> sim.Task:
    return walker.replace(horizon=30)


@pytest.fixture(scope="session")
def short_arm(arm: sim.Task) -> sim.Task:
    return arm.replace(horizon=20)


_MARKER = (
    '<body name="marker" mocap="true">'
    '<geom type="sphere" size=".05" contype="0" conaffinity="0"/></body>'
)
FREE_BODY = f"""
<mujoco>
  <worldbody>
    <body name="box" pos="0 0 1"><freejoint name="free"/><geom type="box" size=".1 .1 .1"/></body>
    {_MARKER}
  </worldbody>
</mujoco>
"""


@pytest.fixture(scope="session")
def free_body() -> sim.Template:
    """A scene with a free body and a mocap body, whose poses are state rather than model fields."""
    return sim.Template(FREE_BODY)


# ---- persistent worlds ----

REGION = """
<mujoco model="region">
  <option timestep="0.005"/>
  <worldbody><geom name="floor" type="plane" size="40 40 0.1"/></worldbody>
</mujoco>
"""
CRATE = """
<mujoco>
  <worldbody>
    <body name="crate" pos="1 0 0.3"><freejoint/><geom type="box" size=".1 .1 .1" mass="2"/></body>
  </worldbody>
</mujoco>
"""


@pytest.fixture(scope="session")
def region() -> str:
    """A shard's scene: a floor, nothing else."""
    return REGION


@pytest.fixture(scope="session")
def world_entities() -> list[sim.Entity]:
    """The shipped walker in shard "west" and a free crate in shard "east"."""
    walker = sim.load_task("walker_forward").definition["scene"]
    return [
        sim.Entity("walker1", walker, "west"),
        sim.Entity("crate", CRATE, "east", (0.0, 1.0, 0.0)),
    ]


JOINTS = ("hhip", "hknee", "fhip", "fknee")


def gait_at(tick):
    """The walker's controls at a tick: a function of the tick only, so any run can repeat them."""
    return [
        sim.Mutation(f"actuator/walker1/{j}/ctrl", "set", (0.5 * np.sin(0.02 * tick + i),))
        for i, j in enumerate(JOINTS)
    ]


def drive_world(world, ticks, every=20):
    for _ in range(ticks // every):
        tick = world.head("west")
        world.apply("west", gait_at(tick), provenance=f"gait@{tick}")
        world.advance(every)


@pytest.fixture(scope="session")
def gait():
    """`gait(tick)`: the walker's controls at a tick."""
    return gait_at


@pytest.fixture(scope="session")
def drive():
    """`drive(world, ticks, every=20)`: walk shard "west" for `ticks`, an event every `every`."""
    return drive_world


@pytest.fixture
def make_world(tmp_path, region, world_entities):
    """`make_world(name, backend, every)`: a two-shard world in tmp_path, closed after the test."""
    made = []

    def make(name="w", backend="process", every=100):
        world = sim.World.create(
            tmp_path / f"{name}.db",
            {"west": region, "east": region},
            world_entities,
            checkpoint_every=every,
            backend=backend,
        )
        made.append(world)
        return world

    yield make
    for world in made:
        world.close()


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray (2 CPUs) for the whole session: starting one takes seconds. The tests using it
    run on one xdist worker (group "ray", see tests/conftest.py).

    Its workers at the priority of everything else: Ray starts them at niceness 15 (a batch
    cluster's default), which beside the other xdist workers' processes gave each actor a few
    percent of a core, so building one (a shard's worker: imports, a scene) took minutes."""
    import ray

    sim.use_ray(num_cpus=2, _system_config={"worker_niceness": 0})
    yield ray
    ray.shutdown()


@pytest.fixture
def kill_when_busy():
    """SIGKILL a process once it has used `cpu` seconds more than now: mid-computation, not between
    calls."""
    import os
    import signal
    import threading
    import time

    def cpu_seconds(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(pid: int, cpu: float = 0.15, patience: float = 60.0) -> threading.Thread:
        start, deadline = cpu_seconds(pid), time.monotonic() + patience

        def watch() -> None:
            while cpu_seconds(pid) - start < cpu:
                if time.monotonic() > deadline:
                    return  # it never got that busy: no kill, and the test's recovery checks fail
                time.sleep(0.005)
            os.kill(pid, signal.SIGKILL)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread

    return kill


@pytest.fixture
def store(tmp_path):
    """A world store holding a log of six events in three segments and a checkpoint, reopened."""
    store = WorldStore(tmp_path / "w.db", create=True)
    with store.transaction():
        store.add_log(Log("west", "", 0, 0, "canonical"))
        store.put_checkpoints("west", "", [Checkpoint(10, "t" * 64, "m" * 64, [], b"\x01" * 16)])
    for ticks in ((0, 0), (5, 9, 9), (12,)):  # one commit each: segments of events 1..2, 3..5 and 6
        with store.transaction():
            store.append(
                "west",
                "",
                [
                    (t, "walker1", "mutate", {"target": "x", "op": "set", "value": [t]}, "test")
                    for t in ticks
                ],
            )
    store.close()  # reopened, it reads the file: what a later session would see
    store = WorldStore(tmp_path / "w.db", create=False)
    yield store
    store.close()


@pytest.fixture
def installed_policy(tmp_path, monkeypatch):
    """A real installed distribution (a dist-info on sys.path) exposing a simnet.policies entry
    point."""
    (tmp_path / "fleetctl.py").write_text(
        textwrap.dedent("""
        import numpy as np

        def make(task):
            def policy(obs):
                return np.zeros((len(obs), task.act_dim))
            return policy
    """)
    )
    info = tmp_path / "fleetctl-1.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleetctl\nVersion: 1.2.0\n")
    (info / "entry_points.txt").write_text("[simnet.policies]\nstand_still = fleetctl:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("fleetctl", None)


@pytest.fixture
def format_1():
    """Makes a redo record as simnet wrote it before redo format 2: a SHA-256 and a JSON payload."""

    def record(world_id: str, number: int, rows: dict) -> bytes:
        salt = world_id.encode()
        payload = json.dumps({"n": number, **rows}).encode()
        length = struct.pack("<Q", len(payload))
        return (
            length
            + struct.pack("<I", zlib.crc32(salt + length))
            + hashlib.sha256(salt + payload).digest()
            + payload
        )

    return record

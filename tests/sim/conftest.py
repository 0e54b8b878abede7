"""Shared fixtures: the shipped tasks with short horizons, so the whole sim suite stays quick."""

from __future__ import annotations

import pytest

import sim
from sim._worldstore import Checkpoint, Log, WorldStore


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


FREE_BODY = """
<mujoco>
  <worldbody>
    <body name="box" pos="0 0 1"><freejoint name="free"/><geom type="box" size=".1 .1 .1"/></body>
    <body name="marker" mocap="true"><geom type="sphere" size=".05" contype="0" conaffinity="0"/></body>
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


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray (2 CPUs) for the whole session: starting one takes seconds."""
    import ray

    sim.use_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture
def kill_when_busy():
    """SIGKILL a process once it has used `cpu` seconds more than now: mid-computation, not between calls."""
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

"""Shared fixtures: the shipped tasks with short horizons, so the whole sim suite stays quick."""

from __future__ import annotations

import pytest

import sim


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

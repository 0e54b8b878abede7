"""Tests of knowledge.embodiment._tokens: a body as the learned encoder's tokens, and turning them
as training does (a robot's heading in its file is its vendor's choice)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import mujoco
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import Embodiment
from knowledge.embodiment._tokens import VECTORS, body_tokens, random_turns, token_batch, turned

ASSETS = Path(__file__).parent.parent / "assets"
ROBOTS = ASSETS / "robots"
BODIES = [
    Embodiment.from_mjcf(ROBOTS / "arm7.xml"),
    Embodiment.from_mjcf(ROBOTS / "quadruped.xml"),
    Embodiment.from_mjcf(ROBOTS / "humanoid_small.xml"),
    Embodiment.from_urdf(ROBOTS / "arm6.urdf"),
]


def facing(e: Embodiment, yaw: float) -> Embodiment:
    """The same robot as a file that has it face `yaw` radians further round the vertical."""
    turn = np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])
    bodies = []
    for body in e.bodies:
        if body.parent < 0:
            quat = np.zeros(4)
            mujoco.mju_mulQuat(quat, turn, np.array(body.quat, float))
            pos = np.zeros(3)
            mujoco.mju_rotVecQuat(pos, np.array(body.pos, float), turn)
            body = dataclasses.replace(body, quat=tuple(quat), pos=tuple(pos))
        bodies.append(body)
    return dataclasses.replace(e, bodies=tuple(bodies))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(range(len(BODIES))), st.floats(-math.pi, math.pi))
def test_turning_tokens_is_turning_the_robot(which, yaw):
    """`turned` (what training applies) gives the tokens of the robot as a file facing another
    way: only the world-frame vectors move, and they move as the robot does."""
    body = BODIES[which]
    joints, _, tokens = token_batch([body])
    again, _, tokens_again = token_batch([facing(body, yaw)])
    c, s = math.cos(yaw), math.sin(yaw)
    rotation = np.array([[[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]])
    assert np.allclose(turned(joints, rotation), again, atol=1e-5)
    assert np.array_equal(tokens, tokens_again)  # the body token has no direction in it
    rest = np.ones(joints.shape[-1], bool)
    rest[VECTORS] = False
    assert np.array_equal(joints[..., rest], again[..., rest])


def test_random_turns_are_rotations_about_the_vertical():
    turns = random_turns(64, np.random.default_rng(0))
    assert np.allclose(turns @ turns.transpose(0, 2, 1), np.eye(3), atol=1e-12)
    assert np.allclose(np.linalg.det(turns), 1.0)
    assert np.allclose(turns[:, 2], [0, 0, 1]) and np.allclose(turns[:, :, 2], [0, 0, 1])
    headings = np.arctan2(turns[:, 1, 0], turns[:, 0, 0])
    assert np.ptp(headings) > 5.0  # all the way round


SHAPELESS_FOOT = """<mujoco><worldbody><body name="pelvis" pos="0 0 1"><freejoint/>
  <geom type="box" size="0.1 0.1 0.05"/>
  <body name="thigh" pos="0 0 -0.05"><joint name="hip" axis="0 1 0"/>
    <geom type="capsule" fromto="0 0 0 0 0 -0.4" size="0.04"/>
    <body name="shin" pos="0 0 -0.4"><joint name="knee" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.4" size="0.04"/>
      <body name="ankle" pos="0 0 -0.4"><joint name="ankle_pitch" axis="0 1 0"/>
        <inertial pos="0 0 0" mass="0.2" diaginertia="1e-4 1e-4 1e-4"/>
        <body name="foot" pos="0 0 0"><joint name="ankle_roll" axis="1 0 0"/>
          <inertial pos="0.05 0 -0.06" mass="1" diaginertia="1e-3 1e-3 1e-3"/>
        </body></body></body></body></body></worldbody></mujoco>"""


def test_a_foot_framed_at_its_ankle_still_ends_its_leg():
    """Vendors' URDFs put a foot's frame at its ankle (two ankle joints, one origin) and some give
    it a mass but no collision shape. Every joint of the leg still moves the foot: the chain ends
    at the foot's centre of mass, not at the ankle (where every lever above it would be zero)."""
    body = Embodiment.from_mjcf(SHAPELESS_FOOT)
    joints, _ = body_tokens(body)
    foot = np.array([0.05, 0.0, 1.0 - 0.05 - 0.8 - 0.06])
    origins = {"hip": [0, 0, 0.95], "knee": [0, 0, 0.55], "ankle_pitch": [0, 0, 0.15]}
    origins["ankle_roll"] = origins["ankle_pitch"]
    moving = [j for j in body.joints if j.type != "free"]
    for token, joint in zip(joints, moving, strict=True):
        lever = (foot - np.array(origins[joint.name])) / body.reach
        assert np.allclose(token[6:9], lever, atol=1e-5), joint.name

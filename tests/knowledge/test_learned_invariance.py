"""What the learned encoder's training makes it indifferent to, and what it groups: a robot's
heading in its file (turns about the vertical) and the class of body it is."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import Embodiment, TransferDataset, train_encoder
from knowledge.embodiment._learned import VECTORS, random_turns, token_batch, turned

ASSETS = Path(__file__).parent.parent / "assets"
ROBOTS = ASSETS / "robots"
SMALL = TransferDataset.load(ASSETS / "transfer_small.json.gz")
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


def _spread(data: TransferDataset, labelled: list[str], **options) -> float:
    """Mean distance between bodies of one class over the mean between bodies of two."""
    vectors = train_encoder(data, epochs=40, **options).encode_many(data.bodies)[:, :-1]
    distance = np.linalg.norm(vectors[:, None] - vectors[None], axis=2)
    labels = np.array(labelled)
    same = (labels[:, None] == labels[None]) & ~np.eye(len(labels), dtype=bool)
    return float(distance[same].mean() / distance[labels[:, None] != labels[None]].mean())


def test_classes_pull_bodies_of_one_class_together():
    """Classes no transfer tells apart (arms split by how many joints they have) come out
    grouped when training is given them."""
    data = SMALL.subset(list(range(20)))
    classes = [f"{len(b.actuators) > 5}" for b in data.bodies]
    assert len(set(classes)) == 2
    assert _spread(data, classes, classes=classes, contrast=2.0) < 0.9 * _spread(data, classes)


def test_classes_must_name_every_body():
    data = SMALL.subset(list(range(6)))
    with pytest.raises(ValueError, match="classes: 2 given for 6 bodies"):
        train_encoder(data, epochs=1, classes=["a", "b"])

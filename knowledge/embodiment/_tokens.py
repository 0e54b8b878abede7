"""The learned encoder's input: a body as tokens.

A body becomes a set of tokens, one per moving joint (type, axis, where it sits at the home pose,
the link and subtree it moves, where that subtree's chain ends and how the joint moves that end,
its range, the actuator that drives it: kind, strength, stiffness and damping over the load it
holds) plus one token for the whole body (mass, reach, dof, feet, and the feature encoder's
structural aggregates). Nothing a file's format decides rather than the robot (local joint axes, a
motor's gear against its control range, armature, friction) is in a token, so that one robot
written as MJCF and as URDF reads alike. Joint tokens carry world-frame vectors (`VECTORS`) that
turn with the body (`turned`): training turns bodies about the vertical (`random_turns`), since
which way a file has a robot face is its vendor's choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mujoco
import numpy as np

from ._descriptors import Embodiment
from ._encoders import morphology_features
from ._parts import Actuator

_TYPES = ("hinge", "slide", "ball")
_KINDS = ("motor", "position", "velocity")
JOINT_FEATURES = 36
VECTORS = slice(3, 15)
"""The joint token's world-frame vectors: axis, lever, how the joint moves the lever's end, and
position; four 3-vectors that turn with the body (`turned`)."""
_G = 9.81
_SHAPE = (
    "end_effectors",
    "chain_depth",
    "branching",
    "hinge_fraction",
    "slide_fraction",
    "ball_fraction",
    "actuated_fraction",
    "base_mass_fraction",
    "heaviest_body_fraction",
    "longest_link",
    "mean_link",
    "hinge_range",
)
"""The feature encoder's structural features the body token carries too (`morphology_features`):
aggregates that read alike whatever format or vendor wrote a file; and the root body's share of
the mass, which the feature encoder dropped in its version 5 (the weights were trained with it)."""
BODY_FEATURES = 8 + len(_SHAPE)


def _log(x: float, floor: float = 1e-3) -> float:
    return math.log(max(x, 0.0) + floor)


def body_tokens(e: Embodiment) -> tuple[np.ndarray, np.ndarray]:
    """(joint tokens (n, JOINT_FEATURES), body token (BODY_FEATURES,)) of a descriptor, float32.

    Geometry is read at the home pose (every joint at 0), lengths relative to the body's reach and,
    for scale, as logarithms of metres.
    """
    n = len(e.bodies)
    reach, total = max(e.reach, 1e-3), max(e.mass, 1e-9)
    rot, pos = np.zeros((n, 3, 3)), np.zeros((n, 3))
    depth, root = [0] * n, list(range(n))
    jointed = {j.body for j in e.joints if j.type != "free"}
    for i, body in enumerate(e.bodies):
        local = np.zeros(9)
        mujoco.mju_quat2Mat(local, np.array(body.quat, float))
        if body.parent < 0:
            rot[i] = local.reshape(3, 3)
        else:
            rot[i] = rot[body.parent] @ local.reshape(3, 3)
            pos[i] = pos[body.parent] + rot[body.parent] @ np.array(body.pos)
            depth[i], root[i] = depth[body.parent], root[body.parent]
        depth[i] += i in jointed
    subtree_mass = np.array([b.mass for b in e.bodies])
    tip = np.array([b.extent for b in e.bodies])
    below = list(depth)
    for i in reversed(range(n)):
        parent = e.bodies[i].parent
        if parent >= 0:
            subtree_mass[parent] += subtree_mass[i]
            tip[parent] = max(tip[parent], e.bodies[i].link_length + tip[i])
            below[parent] = max(below[parent], below[i])
    ends = _chain_ends(e, pos, rot)
    drives = {
        a.target[0]: a for a in e.actuators if a.transmission == "joint" and len(a.target) == 1
    }
    tokens = []
    for j, joint in enumerate(e.joints):
        if joint.type == "free":
            continue
        b, body = joint.body, e.bodies[joint.body]
        act = drives.get(j)
        low, high = joint.range or (0.0, 0.0)
        scale = math.pi if joint.type != "slide" else reach
        axis = rot[b] @ np.array(joint.axis)
        lever = (ends[b] - pos[b]) / reach
        strength = _strength(act, joint.force_range)
        load = _G * subtree_mass[b] * max(tip[b], 1e-3)  # holding its subtree straight out
        stiffness = _stiffness(act)
        tokens.append(
            [
                *(float(joint.type == t) for t in _TYPES),
                *axis,
                *lever,
                *(np.cross(axis, lever) if joint.type != "slide" else axis),
                *((pos[b] - pos[root[b]]) / reach),
                body.link_length / reach,
                _log(body.link_length),
                depth[b] / 8,
                (below[b] - depth[b]) / 8,
                subtree_mass[b] / total,
                _log(body.mass),
                body.mass / total,
                tip[b] / reach,
                _log(tip[b]),
                float(joint.range is not None),
                min(high - low, 2 * scale) / scale,
                math.log1p(joint.damping / max(load, 1e-6)),
                float(act is not None),
                *(float(act is not None and act.kind == k) for k in _KINDS),
                float(act is not None and act.kind not in _KINDS),
                math.log1p(stiffness / load) if load > 0 else 0.0,
                math.log(_command_gear(act)),
                math.log1p(strength),
                math.log1p(strength / load) if load > 0 else 0.0,
            ]
        )
    shape = {
        **morphology_features(e),
        "base_mass_fraction": math.fsum(b.mass for b in e.bodies if b.parent < 0) / total,
    }
    body_token = [
        _log(e.mass),
        _log(e.reach),
        e.dof / 16,
        len(e.end_effectors) / 8,
        float(e.floating_base),
        len(e.actuators) / 16,
        len(tokens) / 16,
        max(depth, default=0) / 8,
        *(shape[name] for name in _SHAPE),
    ]
    return np.array(tokens, np.float32).reshape(-1, JOINT_FEATURES), np.array(
        body_token, np.float32
    )


def turned(joints: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Joint tokens (B, T, F) of bodies turned by `rotations` (B, 3, 3): their world-frame
    vectors rotated, everything else (lengths, masses, actuation) as it was."""
    out = joints.copy()
    vectors = joints[..., VECTORS].reshape(*joints.shape[:2], 4, 3)
    out[..., VECTORS] = np.einsum("bij,btkj->btki", rotations, vectors).reshape(
        *joints.shape[:2], 12
    )
    return out


def random_turns(count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` random rotations about the vertical (count, 3, 3): which way a robot faces is its
    file's convention (vendors' frames differ in heading), while gravity fixes what is up.
    (Turning fixed-base bodies every way, as if their zero pose were a convention too, cost the
    ranking of reach transfers a fifth of its Spearman.)"""
    yaw = rng.uniform(0.0, 2.0 * np.pi, count)
    c, s, zero, one = np.cos(yaw), np.sin(yaw), np.zeros(count), np.ones(count)
    return np.stack(
        [np.stack([c, -s, zero], 1), np.stack([s, c, zero], 1), np.stack([zero, zero, one], 1)], 1
    )


def _command_gear(act: Actuator | None) -> float:
    """A servo's gear: how its command scales to the joint's target (a position skill's commands
    mean other angles under another gear). 1 for a motor, whose gear only scales its strength."""
    if act is None or act.kind not in ("position", "velocity") or not act.gear[0]:
        return 1.0
    return abs(act.gear[0])


def _stiffness(act: Actuator | None) -> float:
    """A servo's stiffness at its joint (torque per radian, or force per metre; 0 for a motor)."""
    if act is None or act.kind != "position":
        return 0.0
    return abs(act.gear[0]) ** 2 * abs(act.gain)


def _strength(act: Actuator | None, limit: tuple[float, float] | None) -> float:
    """The largest torque (or force) a joint's actuator applies, however the file says it: a force
    limit, a motor's control range, a servo's push at a tenth of a radian (or metre) of error (the
    stiffness `from_urdf` gives an effort), else the joint's own effort limit (URDF); all at the
    joint (times the gear). 0 when nothing bounds it."""
    if act is not None:
        gear = abs(act.gear[0]) or 1.0
        if act.force_range:
            return gear * max(map(abs, act.force_range))
        if act.kind == "motor" and act.ctrl_range:
            return gear * max(map(abs, act.ctrl_range))
        if act.kind == "position":
            return gear * gear * abs(act.gain) * 0.1
    return max(map(abs, limit)) if limit else 0.0


def _chain_ends(e: Embodiment, pos: np.ndarray, rot: np.ndarray) -> np.ndarray:
    """Per body, the farthest point its subtree reaches at the home pose: a site (a tool), or where
    there is none, the farthest of its bodies' origins, centres of mass and leaf links' tips. Where
    its joint moves the chain's end, so that a joint's token holds its Jacobian. A leaf's tip lies
    along its link, or along the nearest link above it where the leaf sits at its parent's origin
    (vendors' URDFs often place a foot's or hand's frame at its joint, and some give it a mass but
    no collision shape: then its centre of mass is as far as it reaches).

    Each body's candidates are compared in numpy: a body's subtree can hold most of the body's
    points, and measuring them one by one in Python made a chain of 1,000 bodies (a peer's skill
    scope of 120 KB) cost 7 s to encode, 2,000 bodies 28 s. The first farthest point, in the
    order the subtree's set of bodies is iterated, wins a tie, as before."""
    n = len(e.bodies)
    heading = np.zeros((n, 3))
    for i, body in enumerate(e.bodies):
        if body.parent >= 0:
            step = body.link_length
            heading[i] = (pos[i] - pos[body.parent]) / step if step > 0 else heading[body.parent]
    parents = {b.parent for b in e.bodies}
    reached = [
        [pos[i], pos[i] + rot[i] @ np.array(b.com)]
        + ([pos[i] + heading[i] * b.extent] if i not in parents else [])
        for i, b in enumerate(e.bodies)
    ]
    points = np.array([p for own in reached for p in own]).reshape(-1, 3)
    counts = np.array([len(own) for own in reached], np.intp)
    starts = np.cumsum(counts) - counts
    site_body = np.array([s.body for s in e.sites], np.intp)
    site_at = np.array(
        [pos[s.body] + rot[s.body] @ np.array(s.pos) for s in e.sites], float
    ).reshape(-1, 3)
    inside = [{i} for i in range(n)]
    for i in reversed(range(n)):
        if e.bodies[i].parent >= 0:
            inside[e.bodies[i].parent] |= inside[i]
    ends = pos.copy()
    member = np.zeros(n + 1, bool)  # the last entry stands for the world (a site's body -1)
    for i in range(n):
        bodies = np.fromiter(inside[i], np.intp, len(inside[i]))
        mine = site_at[:0]
        if len(site_body):
            member[bodies] = True
            mine = site_at[member[site_body]]
            member[bodies] = False
        if not len(mine):
            own = counts[bodies]
            first = np.repeat(starts[bodies] - (np.cumsum(own) - own), own)
            mine = points[first + np.arange(len(first))]
        ends[i] = mine[_farthest(mine, pos[i])]
    return ends


_TIES = 64
"""Most distinct points `_farthest` measures one by one to settle a near tie."""


def _farthest(points: np.ndarray, centre: np.ndarray) -> int:
    """The index of the first point farthest from `centre`, as `max(points, key=norm)` finds it.

    Measured together, distances can round otherwise in their last bit than one at a time (a
    symmetric robot's tips lie at one distance): near ties, up to `_TIES` distinct points, are
    settled one at a time, as the tokens the encoder was trained on were."""
    distance = np.linalg.norm(points - centre, axis=1)
    if not np.isfinite(distance.max()):  # numbers no robot has: the first NaN (or inf)
        return int(np.argmax(distance))
    near = np.flatnonzero(distance >= distance.max() * (1.0 - 1e-9))
    if len(near) > 1:
        _, first = np.unique(points[near], axis=0, return_index=True)
        near = near[np.sort(first)]
    if 1 < len(near) <= _TIES:
        return int(max(near, key=lambda k: float(np.linalg.norm(points[k] - centre))))
    return int(near[0])


def token_batch(bodies: Sequence[Embodiment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded joint tokens (B, T, F), padding mask (B, T) (True = padding), body tokens (B, G)."""
    pairs = [body_tokens(b) for b in bodies]
    longest = max((len(j) for j, _ in pairs), default=0)
    joints = np.zeros((len(pairs), longest, JOINT_FEATURES), np.float32)
    mask = np.ones((len(pairs), longest), bool)
    for i, (tokens, _) in enumerate(pairs):
        joints[i, : len(tokens)], mask[i, : len(tokens)] = tokens, False
    body = np.stack([b for _, b in pairs]) if pairs else np.zeros((0, BODY_FEATURES), np.float32)
    return joints, mask, body

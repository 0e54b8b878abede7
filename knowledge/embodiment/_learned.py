"""The learned embodiment encoder: attention over joint tokens, trained so that distance ranks
transfer.

A body becomes a set of tokens, one per moving joint (type, axis, where it sits at the home pose,
the link and subtree it moves, where that subtree's chain ends and how the joint moves that end,
its range, the actuator that drives it: kind, strength, stiffness and damping over the load it
holds) plus one token for the whole body (mass, reach, dof, feet, and the feature encoder's
structural aggregates). Nothing a file's format decides rather than the robot (local joint axes, a
motor's gear against its control range, armature, friction) is in a token. A small transformer
with no positional encoding attends over the set and pools it into a vector, so the vector cannot
depend on the order joints are listed in; what the kinematic tree makes different (a shoulder and
a wrist) differs in the tokens themselves. The vector has one coordinate more: how far the body is
out of the distribution the network was trained on (`_ood`), scaled so that such bodies lie beyond
every body it knows.

Training (`train_encoder`, in `_training`) uses measured transfers: for every target body, the
skills of the other bodies are ranked by their success there, and a pairwise logistic loss asks the
distances to rank them the same way (RankNet, weighted by the difference in success and more where
the better one succeeds), plus the same across targets so that one distance means about one success
rate everywhere.

The weights are a safetensors file with the network's configuration in its metadata and the
out-of-distribution reference beside the tensors; the version is a hash of all of it, so retrained
or recalibrated weights are a new embedding space and get their own index.

This module is the inference side and runs on numpy alone: the forward pass of the network that
`_training` defines in torch, reproduced operation by operation, so that a robot which only queries
skills loads and uses the weights without installing torch (gigabytes). Only training needs torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Literal

import mujoco
import numpy as np
import safetensors.numpy

from .._errors import SimnetError
from . import _ood
from ._descriptors import Embodiment
from ._encoders import Encoder, FeatureEncoder, morphology_features
from ._parts import Actuator

FORMAT = "simnet.encoder/3"
"""/3: joint tokens say what survives a change of file format (no local axes, gear, control ranges,
armature or friction; actuators by their strength, stiffness and damping over the load they hold);
inputs are clipped; files carry the out-of-distribution reference. /1 and /2 files are refused."""
SHIPPED = "transfer-attention.safetensors"
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
aggregates that read alike whatever format or vendor wrote a file."""
BODY_FEATURES = 8 + len(_SHAPE)
DEFAULT_CONFIG = {"width": 64, "heads": 4, "layers": 2, "dim": 32}
CLIP = 6.0
OUTSIDE = 10.0
"""How far out of distribution bodies are put (the last coordinate, `LearnedEncoder._run`), per unit
of score above 1, in the reference's median distances."""
"""Standardized inputs are clipped to +-CLIP: a value no training body had (a gear of 1e15, a
friction ten thousand times any seen) saturates instead of swamping the network."""


class EncoderWeightsError(SimnetError, ValueError):
    """Encoder weights are not a valid simnet encoder file (format, configuration or tensors)."""


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
    shape = morphology_features(e)
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
    there is none, a leaf link's tip along the link. Where its joint moves the chain's end, so that
    a joint's token holds its Jacobian."""
    sites = [(s.body, pos[s.body] + rot[s.body] @ np.array(s.pos)) for s in e.sites]
    parents = {b.parent for b in e.bodies}
    tips = [
        (i, pos[i] + (pos[i] - pos[b.parent]) / b.link_length * b.extent)
        for i, b in enumerate(e.bodies)
        if i not in parents and b.parent >= 0 and b.link_length > 0
    ]
    inside = [{i} for i in range(len(e.bodies))]
    for i in reversed(range(len(e.bodies))):
        if e.bodies[i].parent >= 0:
            inside[e.bodies[i].parent] |= inside[i]
    ends = pos.copy()
    for i in range(len(e.bodies)):
        mine = [p for b, p in sites if b in inside[i]] or [p for b, p in tips if b in inside[i]]
        if mine:
            ends[i] = max(mine, key=lambda p: float(np.linalg.norm(p - pos[i])))
    return ends


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


def _shapes(width: int, heads: int, layers: int, dim: int) -> dict[str, tuple[int, ...]]:
    """The network's tensors by name (torch's state_dict names) and their shapes."""
    if min(width, heads, layers, dim) < 1 or width % heads:
        raise ValueError(f"no network has width {width}, {heads} heads, {layers} layers, dim {dim}")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, size in (("joint", JOINT_FEATURES), ("body", BODY_FEATURES)):
        shapes |= {f"{name}_mean": (size,), f"{name}_std": (size,)}
        shapes |= {f"{name}_in.0.weight": (width, size), f"{name}_in.0.bias": (width,)}
        shapes |= {f"{name}_in.2.weight": (width, width), f"{name}_in.2.bias": (width,)}
    for i in range(layers):
        p = f"blocks.layers.{i}."
        shapes |= {
            p + "self_attn.in_proj_weight": (3 * width, width),
            p + "self_attn.in_proj_bias": (3 * width,),
            p + "self_attn.out_proj.weight": (width, width),
            p + "self_attn.out_proj.bias": (width,),
            p + "linear1.weight": (2 * width, width),
            p + "linear1.bias": (2 * width,),
            p + "linear2.weight": (width, 2 * width),
            p + "linear2.bias": (width,),
            **{p + f"norm{k}.{w}": (width,) for k in (1, 2) for w in ("weight", "bias")},
        }
    shapes |= {"out.0.weight": (2 * width,), "out.0.bias": (2 * width,)}
    shapes |= {"out.1.weight": (width, 2 * width), "out.1.bias": (width,)}
    shapes |= {"out.3.weight": (dim, width), "out.3.bias": (dim,)}
    return shapes


_erf: Callable[[np.ndarray], np.ndarray] = np.frompyfunc(math.erf, 1, 1)


def _gelu(x: np.ndarray) -> np.ndarray:
    """torch's nn.GELU() (exact, with erf, not the tanh approximation)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """torch's nn.LayerNorm over the last axis: biased variance, eps 1e-5."""
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * weight + bias


def _forward(
    w: dict[str, np.ndarray],
    heads: int,
    layers: int,
    joints: np.ndarray,
    mask: np.ndarray,
    body: np.ndarray,
) -> np.ndarray:
    """The network of `_training._Network` in numpy, in float64: token embedding (normalized
    inputs, Linear-GELU-Linear), `layers` pre-norm transformer encoder layers (torch's
    nn.TransformerEncoderLayer with norm_first=True, ReLU, no dropout; padding masked out of the
    keys), the body token and the mean of the joint tokens, then LayerNorm-Linear-GELU-Linear.
    Returns (B, dim) float64."""

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def embed(x: np.ndarray, name: str) -> np.ndarray:
        x = np.clip((x - w[f"{name}_mean"]) / w[f"{name}_std"], -CLIP, CLIP)
        return linear(_gelu(linear(x, f"{name}_in.0")), f"{name}_in.2")

    x = np.concatenate([embed(body, "body")[:, None], embed(joints, "joint")], 1)
    padding = np.concatenate([np.zeros_like(mask[:, :1]), mask], 1)  # (B, S)
    batch, length, width = x.shape
    size = width // heads
    for i in range(layers):
        p = f"blocks.layers.{i}."
        h = _layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"])
        qkv = h @ w[p + "self_attn.in_proj_weight"].T + w[p + "self_attn.in_proj_bias"]
        q, k, v = (
            part.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)
            for part in np.split(qkv, 3, -1)
        )
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size)  # (B, H, S, S)
        scores = np.where(padding[:, None, None, :], -np.inf, scores)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        x = x + linear(
            attended.transpose(0, 2, 1, 3).reshape(batch, length, width), p + "self_attn.out_proj"
        )
        h = _layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"])
        x = x + linear(np.maximum(linear(h, p + "linear1"), 0.0), p + "linear2")
    keep = (~mask)[..., None].astype(x.dtype)
    mean = (x[:, 1:] * keep).sum(1) / np.maximum(keep.sum(1), 1.0)
    h = _layer_norm(np.concatenate([x[:, 0], mean], 1), w["out.0.weight"], w["out.0.bias"])
    return linear(_gelu(linear(h, "out.1")), "out.3")


class LearnedEncoder(Encoder):
    """Transfer-trained embodiment encoder ("transfer-attention"); Euclidean distance ranks likely
    transfer.

    `LearnedEncoder()` loads the weights shipped in the package (no network); pass a weights file
    (or its bytes) written by `save` or `simnet encoder train` to use retrained ones. `version`
    names the weights. Encoding runs on numpy: torch is not needed (only training imports it:
    `_training.untrained_encoder` and `train_encoder`).

    `ood(body)` says how far a body lies from the population the weights were trained on (`_ood`:
    above 1, out of distribution; None for weights without a reference). A query with such a body
    is ranked by `fallback` instead (the feature encoder unless given; None: never fall back).
    """

    name = "transfer-attention"
    metric = "l2"

    def __init__(
        self,
        weights: str | os.PathLike[str] | bytes | None = None,
        *,
        fallback: Encoder | None | Literal["features"] = "features",
    ) -> None:
        if weights is None:
            weights = (resources.files("knowledge") / "assets" / SHIPPED).read_bytes()
        elif not isinstance(weights, bytes):
            weights = Path(weights).read_bytes()
        self._tensors, self.reference, self.config, self.meta = _read(weights)
        self.dim = self.config["dim"] + 1
        reference = self.reference.tensors() if self.reference is not None else {}
        self.version = _version(self.config, {**self._tensors, **reference})
        self._spread = _spread(self.reference)
        self.fallback = FeatureEncoder() if fallback == "features" else fallback
        # float64 copies to compute with: the forward pass rounds once, at its end
        self._weights = {k: v.astype(np.float64) for k, v in self._tensors.items()}

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        return self.encode_many([embodiment])[0]

    def encode_many(self, embodiments: Iterable[Embodiment]) -> np.ndarray:
        return self._run(list(embodiments))[0]

    def assess(self, embodiment: Embodiment) -> tuple[np.ndarray, float | None]:
        vectors, scores = self._run([embodiment], ood=True)
        return vectors[0], None if scores is None else float(scores[0])

    def ood_many(self, embodiments: Iterable[Embodiment]) -> np.ndarray | None:
        """Out-of-distribution scores of bodies (see `_ood`); None without a reference."""
        return self._run(list(embodiments), ood=True)[1]

    def ood_components(self, embodiments: Iterable[Embodiment]) -> np.ndarray | None:
        """(B, 3) each body's distances to the reference (joints, body, vector) over their
        thresholds: which part makes a body out of distribution."""
        scores = self._run(list(embodiments), ood=True, parts=True)[1]
        return scores

    def _run(
        self, bodies: list[Embodiment], *, ood: bool = False, parts: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Vectors (B, dim) float32 and, with `ood` and a reference, their scores (or components
        over thresholds, with `parts`). A vector is the network's output and one coordinate more:
        `OUTSIDE` times the reference's typical distance times how far the body's score is above
        1 (0 within the distribution), so that the bodies the network does not know lie far from
        every body it does, and never come up as a known body's nearest."""
        if not bodies:
            return np.empty((0, self.dim), np.float32), None
        network = self._network_vectors(bodies)
        if self.reference is None:
            return np.pad(network, ((0, 0), (0, 1))).astype(np.float32), None
        joints, mask, body = token_batch(bodies)
        ref = self.reference
        distances = _ood.components(
            *_standardized(self._weights, joints, body, mask),
            network,
            ref.tokens,
            ref.bodies,
            ref.vectors,
        )
        scores = _ood.score(distances, ref.thresholds)
        outside = OUTSIDE * self._spread * np.maximum(scores - 1.0, 0.0)
        vectors = np.concatenate([network, outside[:, None]], 1).astype(np.float32)
        if not ood:
            return vectors, None
        return vectors, distances / ref.thresholds if parts else scores

    def _network_vectors(self, bodies: list[Embodiment]) -> np.ndarray:
        """The network's output (B, config dim), float64."""
        return self._token_vectors(*token_batch(bodies))

    def _token_vectors(self, joints: np.ndarray, mask: np.ndarray, body: np.ndarray) -> np.ndarray:
        """The network's output (B, config dim) for token batches, float64."""
        return (
            _forward(
                self._weights,
                int(self.config["heads"]),
                int(self.config["layers"]),
                joints.astype(np.float64),
                mask,
                body.astype(np.float64),
            )
            .astype(np.float32)
            .astype(np.float64)
        )

    def with_reference(self, reference: _ood.Reference) -> LearnedEncoder:
        """These weights with another out-of-distribution reference (a new version: the vectors'
        last coordinate depends on it)."""
        return LearnedEncoder(
            weights_file(self._tensors, self.config, self.meta, reference), fallback=self.fallback
        )

    def to_bytes(self) -> bytes:
        return weights_file(self._tensors, self.config, self.meta, self.reference)

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_bytes(self.to_bytes())

    def __repr__(self) -> str:
        return f"LearnedEncoder(version={self.version!r}, dim={self.dim})"


def population_reference(
    encoder: LearnedEncoder,
    bodies: Sequence[Embodiment],
    seed: int = 0,
    groups: Sequence[int] | None = None,
    turns: int = 0,
) -> _ood.Reference:
    """The out-of-distribution reference of `encoder` for the population `bodies` (its training
    bodies), calibrated on them leaving out each body with its group (`groups`, default: each body
    alone; one robot's descriptions are one group) (`_ood.build`). With `turns`, each body is also
    seen turned that many times at random (`random_turns`, seeded), as training turns them."""
    joints, mask, body = token_batch(bodies)
    group = np.arange(len(bodies)) if groups is None else np.asarray(groups)
    if turns:
        rng = np.random.default_rng(seed)
        joints = np.concatenate(
            [joints] + [turned(joints, random_turns(len(joints), rng)) for _ in range(turns)]
        )
        mask, body = np.tile(mask, (turns + 1, 1)), np.tile(body, (turns + 1, 1))
        group = np.tile(group, turns + 1)
    return _ood.build(
        *_standardized(encoder._weights, joints, body, mask),
        encoder._token_vectors(joints, mask, body),
        group,
        seed,
    )


def _standardized(
    w: dict[str, np.ndarray], joints: np.ndarray, body: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Joint tokens, their mask and body tokens as the network sees them: standardized, clipped."""
    return (
        np.clip((joints - w["joint_mean"]) / w["joint_std"], -CLIP, CLIP),
        mask,
        np.clip((body - w["body_mean"]) / w["body_std"], -CLIP, CLIP),
    )


def weights_file(
    tensors: dict[str, np.ndarray],
    config: dict,
    meta: dict,
    reference: _ood.Reference | None = None,
) -> bytes:
    """A weights file: the tensors (float32, by their torch state_dict names), the
    out-of-distribution reference (`ood.*`, float16), the configuration and `meta` in the
    safetensors metadata."""
    header = {
        "format": FORMAT,
        "config": json.dumps(config, sort_keys=True),
        "meta": json.dumps(meta, sort_keys=True),
    }
    arrays = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    if reference is not None:  # the reference needs no more than half precision
        arrays |= {k: np.ascontiguousarray(v, np.float16) for k, v in reference.tensors().items()}
    return safetensors.numpy.save(dict(sorted(arrays.items())), metadata=header)


def _read(blob: bytes) -> tuple[dict[str, np.ndarray], _ood.Reference | None, dict, dict]:
    """(network tensors as float32 arrays, out-of-distribution reference or None, configuration,
    meta) of a weights file, every tensor checked against the configuration's shapes;
    EncoderWeightsError if anything is off."""
    try:
        loaded = safetensors.numpy.load(blob)
        header = (
            json.loads(blob[8 : 8 + int.from_bytes(blob[:8], "little")]).get("__metadata__") or {}
        )
    except Exception as exc:  # safetensors raises its own error type on corrupt data
        raise EncoderWeightsError(f"encoder weights are not safetensors: {exc}") from exc
    if header.get("format") != FORMAT:
        raise EncoderWeightsError(
            f"encoder weights: format {header.get('format')!r} is not {FORMAT!r}"
        )
    extra = {
        k: np.ascontiguousarray(v, np.float32)
        for k, v in loaded.items()
        if k.startswith(_ood.PREFIX)
    }
    network = {k: v for k, v in loaded.items() if not k.startswith(_ood.PREFIX)}
    try:
        config = json.loads(header["config"])
        meta = json.loads(header.get("meta", "{}"))
        shapes = _shapes(**{key: int(config[key]) for key in DEFAULT_CONFIG})
        missing, unexpected = sorted(shapes.keys() - network), sorted(network.keys() - shapes)
        if missing or unexpected:
            raise ValueError(f"missing tensors {missing}, unexpected tensors {unexpected}")
        wrong = [
            f"{k} {network[k].shape} != {s}" for k, s in shapes.items() if network[k].shape != s
        ]
        if wrong:
            raise ValueError(f"tensor shapes do not match: {', '.join(wrong)}")
        tensors = {k: np.ascontiguousarray(network[k], np.float32) for k in sorted(shapes)}
        reference = _ood.Reference.from_tensors(
            extra, JOINT_FEATURES, BODY_FEATURES, int(config["dim"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EncoderWeightsError(
            f"encoder weights do not match their configuration: {exc}"
        ) from exc
    if not all(np.isfinite(t).all() for t in [*tensors.values(), *extra.values()]):
        raise EncoderWeightsError("encoder weights hold NaN or inf")
    return tensors, reference, config, meta


def _spread(reference: _ood.Reference | None) -> float:
    """The median distance between the reference's vectors: the scale of the space."""
    if reference is None:
        return 0.0
    vectors = reference.vectors.astype(np.float64)
    return float(np.median(np.linalg.norm(vectors[:, None] - vectors[None], axis=2)))


def _version(config: dict, tensors: dict[str, np.ndarray]) -> str:
    """1-<hash of configuration and tensors>: equal weights, equal space, whatever the file's byte
    layout."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensor, np.float32).tobytes())
    return f"1-{digest.hexdigest()[:16]}"

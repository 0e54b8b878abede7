"""The learned embodiment encoder: attention over joint tokens, trained so that distance ranks
transfer.

A body becomes a set of tokens, one per moving joint (type, axis, where it sits at the home pose,
the link and subtree it moves, where that subtree's chain ends and how the joint moves that end per
unit of actuator command, limits, dynamics, the actuator that drives it) plus one token for the
whole body (mass, reach, dof, feet). A small transformer with no positional encoding attends over
the set and pools it into a vector, so the vector cannot depend on the order joints are listed in;
what the kinematic tree makes different (a shoulder and a wrist) differs in the tokens themselves.

Training (`train_encoder`, in `_training`) uses measured transfers: for every target body, the
skills of the other bodies are ranked by their success there, and a pairwise logistic loss asks the
distances to rank them the same way (RankNet, weighted by the difference in success and more where
the better one succeeds), plus the same across targets so that one distance means about one success
rate everywhere.

The weights are a safetensors file with the network's configuration in its metadata; the version is
a hash of both, so retrained weights are a new embedding space and get their own index.

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

import mujoco
import numpy as np
import safetensors.numpy

from .._errors import SimnetError
from ._descriptors import Embodiment
from ._encoders import Encoder

FORMAT = "simnet.encoder/2"
"""/2: joint tokens carry the lever to their chain's end and its Jacobian column (/1 files are
refused)."""
SHIPPED = "transfer-attention.safetensors"
_TYPES = ("hinge", "slide", "ball")
_KINDS = ("motor", "position", "velocity")
JOINT_FEATURES = 43
BODY_FEATURES = 8
DEFAULT_CONFIG = {"width": 64, "heads": 4, "layers": 2, "dim": 32}


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
        gear = abs(act.gear[0]) if act is not None and act.gear[0] else 1.0
        low, high = joint.range or (0.0, 0.0)
        ctrl = act.ctrl_range if act is not None and act.ctrl_range else (0.0, 0.0)
        force = act.force_range if act is not None and act.force_range else joint.force_range
        scale = math.pi if joint.type != "slide" else reach
        axis = rot[b] @ np.array(joint.axis)
        lever = (ends[b] - pos[b]) / reach
        tokens.append(
            [
                *(float(joint.type == t) for t in _TYPES),
                *axis,
                *joint.axis,
                *lever,
                *((np.cross(axis, lever) if joint.type != "slide" else axis) / gear),
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
                low / scale,
                high / scale,
                math.log1p(joint.damping),
                math.log1p(10 * joint.armature),
                math.log1p(joint.frictionloss),
                float(act is not None),
                *(float(act is not None and act.kind == k) for k in _KINDS),
                float(act is not None and act.kind not in _KINDS),
                math.log(gear),
                math.log1p(abs(act.gain) if act else 0.0),
                ctrl[0] / gear / scale,
                ctrl[1] / gear / scale,
                math.log1p(max(abs(force[0]), abs(force[1])) if force else 0.0),
            ]
        )
    body_token = [
        _log(e.mass),
        _log(e.reach),
        e.dof / 16,
        len(e.end_effectors) / 8,
        float(e.floating_base),
        len(e.actuators) / 16,
        len(tokens) / 16,
        max(depth, default=0) / 8,
    ]
    return np.array(tokens, np.float32).reshape(-1, JOINT_FEATURES), np.array(
        body_token, np.float32
    )


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
        x = (x - w[f"{name}_mean"]) / w[f"{name}_std"]
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
    """

    name = "transfer-attention"
    metric = "l2"

    def __init__(self, weights: str | os.PathLike[str] | bytes | None = None) -> None:
        if weights is None:
            weights = (resources.files("knowledge") / "assets" / SHIPPED).read_bytes()
        elif not isinstance(weights, bytes):
            weights = Path(weights).read_bytes()
        self._tensors, self.config, self.meta = _read(weights)
        self.dim = self.config["dim"]
        self.version = _version(self.config, self._tensors)
        # float64 copies to compute with: the forward pass rounds once, at its end
        self._weights = {k: v.astype(np.float64) for k, v in self._tensors.items()}

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        return self.encode_many([embodiment])[0]

    def encode_many(self, embodiments: Iterable[Embodiment]) -> np.ndarray:
        bodies = list(embodiments)
        if not bodies:
            return np.empty((0, self.dim), np.float32)
        joints, mask, body = token_batch(bodies)
        vectors = _forward(
            self._weights,
            int(self.config["heads"]),
            int(self.config["layers"]),
            joints.astype(np.float64),
            mask,
            body.astype(np.float64),
        )
        return vectors.astype(np.float32)

    def to_bytes(self) -> bytes:
        return weights_file(self._tensors, self.config, self.meta)

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_bytes(self.to_bytes())

    def __repr__(self) -> str:
        return f"LearnedEncoder(version={self.version!r}, dim={self.dim})"


def weights_file(tensors: dict[str, np.ndarray], config: dict, meta: dict) -> bytes:
    """A weights file: the tensors (float32, by their torch state_dict names), the configuration
    and `meta` in the safetensors metadata."""
    header = {
        "format": FORMAT,
        "config": json.dumps(config, sort_keys=True),
        "meta": json.dumps(meta, sort_keys=True),
    }
    arrays = {k: np.ascontiguousarray(tensors[k], np.float32) for k in sorted(tensors)}
    return safetensors.numpy.save(arrays, metadata=header)


def _read(blob: bytes) -> tuple[dict[str, np.ndarray], dict, dict]:
    """(tensors as float32 arrays, configuration, meta) of a weights file, every tensor checked
    against the configuration's shapes; EncoderWeightsError if anything is off."""
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
    try:
        config = json.loads(header["config"])
        meta = json.loads(header.get("meta", "{}"))
        shapes = _shapes(**{key: int(config[key]) for key in DEFAULT_CONFIG})
        missing, unexpected = sorted(shapes.keys() - loaded), sorted(loaded.keys() - shapes)
        if missing or unexpected:
            raise ValueError(f"missing tensors {missing}, unexpected tensors {unexpected}")
        wrong = [f"{k} {loaded[k].shape} != {s}" for k, s in shapes.items() if loaded[k].shape != s]
        if wrong:
            raise ValueError(f"tensor shapes do not match: {', '.join(wrong)}")
        tensors = {k: np.ascontiguousarray(loaded[k], np.float32) for k in sorted(shapes)}
    except (KeyError, TypeError, ValueError) as exc:
        raise EncoderWeightsError(
            f"encoder weights do not match their configuration: {exc}"
        ) from exc
    if not all(np.isfinite(t).all() for t in tensors.values()):
        raise EncoderWeightsError("encoder weights hold NaN or inf")
    return tensors, config, meta


def _version(config: dict, tensors: dict[str, np.ndarray]) -> str:
    """1-<hash of configuration and tensors>: equal weights, equal space, whatever the file's byte
    layout."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensor, np.float32).tobytes())
    return f"1-{digest.hexdigest()[:16]}"

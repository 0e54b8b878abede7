"""The learned embodiment encoder: attention over joint tokens, trained so that distance ranks
transfer.

A body becomes a set of tokens, one per moving joint (type, axis, where it sits at the home pose,
the link and subtree it moves, where that subtree's chain ends and how the joint moves that end per
unit of actuator command, limits, dynamics, the actuator that drives it) plus one token for the
whole body (mass, reach, dof, feet). A small transformer with no positional encoding attends over
the set and pools it into a vector, so the vector cannot depend on the order joints are listed in;
what the kinematic tree makes different (a shoulder and a wrist) differs in the tokens themselves.

Training (`train_encoder`) uses measured transfers: for every target body, the skills of the other
bodies are ranked by their success there, and a pairwise logistic loss asks the distances to rank
them the same way (RankNet, weighted by the difference in success and more where the better one
succeeds), plus the same across targets so that one distance means about one success rate
everywhere.

The weights are a safetensors file with the network's configuration in its metadata; the version is
a hash of both, so retrained weights are a new embedding space and get their own index.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

import mujoco
import numpy as np
import safetensors.torch
import torch
from torch import nn

from .._errors import SimnetError
from ._descriptors import Embodiment
from ._encoders import Encoder
from ._transfer_data import TransferDataError, TransferDataset

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
    for i, b in enumerate(e.bodies):
        local = np.zeros(9)
        mujoco.mju_quat2Mat(local, np.array(b.quat, float))
        if b.parent < 0:
            rot[i] = local.reshape(3, 3)
        else:
            rot[i] = rot[b.parent] @ local.reshape(3, 3)
            pos[i] = pos[b.parent] + rot[b.parent] @ np.array(b.pos)
            depth[i], root[i] = depth[b.parent], root[b.parent]
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


def _batch(bodies: Sequence[Embodiment]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded joint tokens (B, T, F), padding mask (B, T) (True = padding), body tokens (B, G)."""
    pairs = [body_tokens(b) for b in bodies]
    longest = max((len(j) for j, _ in pairs), default=0)
    joints = np.zeros((len(pairs), longest, JOINT_FEATURES), np.float32)
    mask = np.ones((len(pairs), longest), bool)
    for i, (tokens, _) in enumerate(pairs):
        joints[i, : len(tokens)], mask[i, : len(tokens)] = tokens, False
    body = np.stack([b for _, b in pairs]) if pairs else np.zeros((0, BODY_FEATURES), np.float32)
    return torch.from_numpy(joints), torch.from_numpy(mask), torch.from_numpy(body)


class _Network(nn.Module):
    """Token embedding, a transformer over the body and joint tokens, pooling, a projection."""

    def __init__(self, width: int, heads: int, layers: int, dim: int) -> None:
        super().__init__()
        for name, size in (("joint", JOINT_FEATURES), ("body", BODY_FEATURES)):
            self.register_buffer(f"{name}_mean", torch.zeros(size))
            self.register_buffer(f"{name}_std", torch.ones(size))
        self.joint_in = nn.Sequential(
            nn.Linear(JOINT_FEATURES, width), nn.GELU(), nn.Linear(width, width)
        )
        self.body_in = nn.Sequential(
            nn.Linear(BODY_FEATURES, width), nn.GELU(), nn.Linear(width, width)
        )
        layer = nn.TransformerEncoderLayer(
            width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Sequential(
            nn.LayerNorm(2 * width), nn.Linear(2 * width, width), nn.GELU(), nn.Linear(width, dim)
        )

    def forward(self, joints: torch.Tensor, mask: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
        j = self.joint_in((joints - self.joint_mean) / self.joint_std)
        g = self.body_in((body - self.body_mean) / self.body_std)
        x = self.blocks(
            torch.cat([g[:, None], j], 1),
            src_key_padding_mask=torch.cat([torch.zeros_like(mask[:, :1]), mask], 1),
        )
        keep = (~mask).unsqueeze(-1).float()
        mean = (x[:, 1:] * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.out(torch.cat([x[:, 0], mean], 1))

    def normalize_from(self, bodies: Sequence[Embodiment]) -> None:
        """Set the input normalization to the statistics of these bodies' tokens."""
        joints, mask, body = _batch(bodies)
        valid = joints[~mask]
        for name, values in (("joint", valid), ("body", body)):
            getattr(self, f"{name}_mean").copy_(values.mean(0))
            getattr(self, f"{name}_std").copy_(
                values.std(0).clamp(min=1e-3) if len(values) > 1 else torch.ones(values.shape[1])
            )


class LearnedEncoder(Encoder):
    """Transfer-trained embodiment encoder ("transfer-attention"); Euclidean distance ranks likely
    transfer.

    `LearnedEncoder()` loads the weights shipped in the package (no network); pass a weights file
    (or its bytes) written by `save` or `simnet encoder train` to use retrained ones. `version`
    names the weights.
    """

    name = "transfer-attention"
    metric = "l2"

    def __init__(self, weights: str | os.PathLike[str] | bytes | None = None) -> None:
        if weights is None:
            weights = (resources.files("knowledge") / "assets" / SHIPPED).read_bytes()
        elif not isinstance(weights, bytes):
            weights = Path(weights).read_bytes()
        self._network, self.config, self.meta = _read(weights)
        self.dim = self.config["dim"]
        self.version = _version(self.config, self._network)

    @classmethod
    def untrained(
        cls, bodies: Sequence[Embodiment], *, seed: int = 0, **config: int
    ) -> LearnedEncoder:
        """A randomly initialized network (seeded), its inputs normalized over `bodies`: where
        training starts."""
        config = {**DEFAULT_CONFIG, **config}
        with torch.random.fork_rng():  # seeded, without touching the caller's random state
            torch.manual_seed(seed)
            network = _Network(**config)
        network.normalize_from(bodies)
        return cls(_write(network, config, {"trained_on": "nothing (untrained)"}))

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        return self.encode_many([embodiment])[0]

    def encode_many(self, embodiments: Iterable[Embodiment]) -> np.ndarray:
        bodies = list(embodiments)
        if not bodies:
            return np.empty((0, self.dim), np.float32)
        with torch.inference_mode():
            return self._network(*_batch(bodies)).numpy().astype(np.float32)

    def to_bytes(self) -> bytes:
        return _write(self._network, self.config, self.meta)

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_bytes(self.to_bytes())

    def __repr__(self) -> str:
        return f"LearnedEncoder(version={self.version!r}, dim={self.dim})"


def _write(network: _Network, config: dict, meta: dict) -> bytes:
    tensors = {k: v.detach().contiguous().clone() for k, v in sorted(network.state_dict().items())}
    header = {
        "format": FORMAT,
        "config": json.dumps(config, sort_keys=True),
        "meta": json.dumps(meta, sort_keys=True),
    }
    return safetensors.torch.save(tensors, metadata=header)


def _read(blob: bytes) -> tuple[_Network, dict, dict]:
    try:
        tensors = safetensors.torch.load(blob)
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
        network = _Network(**{key: int(config[key]) for key in DEFAULT_CONFIG})
        network.load_state_dict(tensors, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise EncoderWeightsError(
            f"encoder weights do not match their configuration: {exc}"
        ) from exc
    if not all(torch.isfinite(t).all() for t in tensors.values()):
        raise EncoderWeightsError("encoder weights hold NaN or inf")
    network.eval()
    return network, config, meta


def _version(config: dict, network: _Network) -> str:
    """1-<hash of configuration and tensors>: equal weights, equal space, whatever the file's byte
    layout."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for name, tensor in sorted(network.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return f"1-{digest.hexdigest()[:16]}"


# -- training --------------------------------------------------------------------------------------


def _pairs(dataset: TransferDataset, margin: float) -> tuple[torch.Tensor, ...]:
    """Measured transfers between distinct bodies as (source, target, rate) columns, and for each
    target and task the (better, worse) pairs of them whose rates differ by more than `margin`."""
    measured = [t for t in dataset.transfers if t.source != t.target]
    if not measured:
        raise TransferDataError("no transfers between distinct bodies to train on")
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for k, t in enumerate(measured):
        groups[t.target, t.task].append(k)
    better, worse = [], []
    for rows in groups.values():
        for a in rows:
            better += [a] * sum(measured[a].rate > measured[b].rate + margin for b in rows)
            worse += [b for b in rows if measured[a].rate > measured[b].rate + margin]
    return (
        torch.tensor([t.source for t in measured]),
        torch.tensor([t.target for t in measured]),
        torch.tensor([t.rate for t in measured], dtype=torch.float32),
        torch.tensor(better, dtype=torch.long),
        torch.tensor(worse, dtype=torch.long),
    )


def train_encoder(
    dataset: TransferDataset,
    *,
    epochs: int = 400,
    seed: int = 0,
    lr: float = 2e-3,
    weight_decay: float = 1e-3,
    margin: float = 0.1,
    temperature: float = 0.1,
    favour: float = 4.0,
    good: float = 0.8,
    start: LearnedEncoder | None = None,
    meta: dict | None = None,
) -> LearnedEncoder:
    """Train on every transfer in `dataset` (full batch, Adam); returns a new encoder.

    The loss is scale-free (distances over their mean), so the space does not grow to win it. A pair
    whose better skill succeeds (rate at least `good`, the report's threshold) weighs 1 + `favour`
    times as much: retrieval is judged by whether the skills that work come first.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    source, target, rate, better, worse = _pairs(dataset, margin)
    if not len(better):
        raise TransferDataError("every transfer scored alike: nothing to rank")
    encoder = start or LearnedEncoder.untrained(dataset.bodies, seed=seed)
    network, _, _ = _read(encoder.to_bytes())
    network.train()
    generator = torch.Generator().manual_seed(seed)
    batch = _batch(dataset.bodies)
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    weight = (rate[better] - rate[worse]).clamp(min=0) * (1 + favour * (rate[better] >= good))
    for _ in range(epochs):
        vectors = network(*batch)
        distance = (vectors[source] - vectors[target]).pow(2).sum(1).add(1e-9).sqrt()
        scaled = distance / distance.mean().detach().clamp(min=1e-6) / temperature
        within = (
            nn.functional.softplus(scaled[better] - scaled[worse]) * weight
        ).sum() / weight.sum()
        a, b = torch.randint(0, len(rate), (2, 4096), generator=generator)
        gap = rate[a] - rate[b]
        sign, strength = gap.sign(), gap.abs() * (gap.abs() > margin)
        across = (
            nn.functional.softplus(sign * (scaled[a] - scaled[b])) * strength
        ).sum() / strength.sum().clamp(min=1e-6)
        loss = within + 0.5 * across
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    network.eval()
    info = {
        "trained_on": f"{len(dataset.bodies)} bodies, {len(rate)} transfers",
        "epochs": epochs,
        "seed": seed,
        **(meta or {}),
    }
    return LearnedEncoder(_write(network, encoder.config, info))

"""The learned embodiment encoder: attention over joint tokens, trained so that distance ranks
transfer.

A body becomes a set of tokens (`_tokens`), one per moving joint plus one for the whole body. A
small transformer with no positional encoding attends over the set and pools it into a vector, so
the vector cannot depend on the order joints are listed in; what the kinematic tree makes different
(a shoulder and a wrist) differs in the tokens themselves. The vector has one coordinate more: how
far the body is out of the distribution the network was trained on (`_ood`), scaled so that such
bodies lie beyond every body it knows.

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

import numpy as np
import safetensors.numpy

from .._errors import SimnetError
from . import _ood
from ._descriptors import Embodiment
from ._encoders import Encoder, FeatureEncoder
from ._tokens import BODY_FEATURES, JOINT_FEATURES, random_turns, token_batch, turned

FORMAT = "simnet.encoder/4"
"""/3: joint tokens say what survives a change of file format (no local axes, gear, control ranges,
armature or friction; actuators by their strength, stiffness and damping over the load they hold);
inputs are clipped; files carry the out-of-distribution reference. /1 and /2 files are refused."""
SHIPPED = "transfer-attention.safetensors"
DEFAULT_CONFIG = {"width": 64, "heads": 4, "layers": 2, "dim": 32}
CLIP = 6.0
"""Standardized inputs are clipped to +-CLIP: a value no training body had (a gear of 1e15, a
friction ten thousand times any seen) saturates instead of swamping the network."""
OUTSIDE = 10.0
"""How far out of distribution bodies are put (the last coordinate, `LearnedEncoder._run`), per unit
of score above 1, in the reference's median distances."""
KIND_MARGIN = 1.0
"""Feature distances up to this many of the training bodies' median feature distance say nothing
to the guard (`LearnedEncoder.guarded`): bodies that near are of one kind, and the learned distance
ranks them."""
KIND_PENALTY = 4.0
"""What the guard adds per median feature distance beyond `KIND_MARGIN`, in the reference's median
learned distances."""


BATCH_ATTENTION = 1 << 22
"""Most attention entries (bodies x tokens squared) one forward pass computes: each layer holds a
few float64 arrays of heads times that many (128 MB each at this size). Bodies are padded to the
batch's longest, so one peer's scope of 1,500 joints in a batch of 100 arms padded every arm to it
(21 GB, 156 s, where the arms alone took 0.4 s)."""


class EncoderWeightsError(SimnetError, ValueError):
    """Encoder weights are not a valid simnet encoder file (format, configuration or tensors)."""


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

    A query in distribution is ranked by `guarded` distances: the learned distance, plus a penalty
    where the feature encoder (`guard`) finds the two bodies of different kinds. The network
    learned from transfers, and transfers are only measured between bodies of one kind (arms
    among arms, legged bodies among legged bodies), so nothing taught it how far apart kinds
    are: it put gymnasium's humanoid beside a UR10. Weights whose meta records the training
    bodies' median feature distance (`feature_spread`, written by `train_encoder`) have a guard;
    others (and `fallback=None`) rank by the learned distance alone.
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
        self._spread = _spread_of(self.version, self.reference)
        self.fallback = FeatureEncoder() if fallback == "features" else fallback
        features = self.meta.get("feature_spread")
        if isinstance(self.fallback, FeatureEncoder) and features is not None:
            if features.get("version") == self.fallback.version and features["median"] > 0:
                self.guard = self.fallback
                self._feature_spread = float(features["median"])
        # float64 copies to compute with: the forward pass rounds once, at its end
        self._weights = {k: v.astype(np.float64) for k, v in self._tensors.items()}

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        return self.encode_many([embodiment])[0]

    def encode_many(self, embodiments: Iterable[Embodiment]) -> np.ndarray:
        return self._run(list(embodiments))[0]

    def assess(self, embodiment: Embodiment) -> tuple[np.ndarray, float | None]:
        vectors, scores = self._run([embodiment], ood=True)
        return vectors[0], None if scores is None else float(scores[0])

    def guarded(self, distances: np.ndarray, guard_distances: np.ndarray) -> np.ndarray:
        """Learned distances plus `KIND_PENALTY` median learned distances per median feature
        distance beyond `KIND_MARGIN` (measured on the population: the held-out bodies' Spearman
        rose, 0.581 to 0.598, recall@5 held, and on the corpus the humanoids beside arms went to
        humanoids; see docs/EMBODIMENT.md)."""
        if self.guard is None:
            return distances
        beyond = np.maximum(guard_distances / self._feature_spread - KIND_MARGIN, 0.0)
        return distances + KIND_PENALTY * self._spread * beyond

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
        every body it does, and never come up as a known body's nearest.

        Bodies run in batches of at most `BATCH_ATTENTION` attention entries (`_batches`)."""
        if not bodies:
            return np.empty((0, self.dim), np.float32), None
        batches = _batches(bodies)
        if len(batches) > 1:
            runs = [self._run([bodies[i] for i in b], ood=ood, parts=parts) for b in batches]
            order = np.concatenate(batches)
            vectors = np.empty((len(bodies), self.dim), np.float32)
            vectors[order] = np.concatenate([run[0] for run in runs])
            if runs[0][1] is None:
                return vectors, None
            found = np.concatenate([run[1] for run in runs if run[1] is not None])
            scores = np.empty((len(bodies), *found.shape[1:]), found.dtype)
            scores[order] = found
            return vectors, scores
        joints, mask, body = token_batch(bodies)
        network = self._token_vectors(joints, mask, body)
        if self.reference is None:
            return np.pad(network, ((0, 0), (0, 1))).astype(np.float32), None
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


def _batches(bodies: Sequence[Embodiment]) -> list[np.ndarray]:
    """The bodies' indices in batches of at most `BATCH_ATTENTION` attention entries, each padded
    to its longest (a body over it runs alone): all in one batch, in order, when they fit, else
    by their number of joint tokens, so that short bodies are batched together."""
    tokens = np.array([sum(j.type != "free" for j in b.joints) + 1 for b in bodies])
    if len(bodies) * int(tokens.max()) ** 2 <= BATCH_ATTENTION:
        return [np.arange(len(bodies))]
    batches: list[list[int]] = []
    for i in np.argsort(tokens, kind="stable").tolist():
        if batches and (len(batches[-1]) + 1) * int(tokens[i]) ** 2 <= BATCH_ATTENTION:
            batches[-1].append(i)
        else:
            batches.append([i])
    return [np.array(batch) for batch in batches]


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
            f"encoder weights: format {header.get('format')!r} is not {FORMAT!r} (weights of "
            "another format were trained on other tokens: retrain them with this version)"
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


def feature_spread(bodies: Sequence[Embodiment]) -> dict[str, str | float]:
    """The median feature distance between pairs of `bodies` and the feature encoder's version:
    the guard's unit (`LearnedEncoder.guarded`), kept in the meta of weights trained on them."""
    features = FeatureEncoder()
    vectors = features.encode_many(bodies).astype(np.float64)
    distances = _distances(vectors)[np.triu_indices(len(vectors), 1)]
    return {"version": features.version, "median": float(np.median(distances))}


_SPREADS: dict[str, float] = {}
"""`_spread` by weights version (a hash of the reference too): it is most of what loading weights
costs (pairwise distances of a few thousand vectors), and the same weights load again and again."""


def _spread_of(version: str, reference: _ood.Reference | None) -> float:
    if version not in _SPREADS:
        if len(_SPREADS) >= 64:  # a process training many encoders keeps the latest only
            _SPREADS.clear()
        _SPREADS[version] = _spread(reference)
    return _SPREADS[version]


def _spread(reference: _ood.Reference | None) -> float:
    """The median distance between the reference's vectors: the scale of the space."""
    if reference is None:
        return 0.0
    return float(np.median(_distances(reference.vectors.astype(np.float64))))


def _distances(vectors: np.ndarray, rows: int = 128) -> np.ndarray:
    """(n, n) Euclidean distances between `vectors`, `rows` rows at a time: all differences at once
    held n x n x dim floats (3.2 GB to load the shipped weights, for a 50 MB answer)."""
    blocks = [
        np.linalg.norm(vectors[i : i + rows, None] - vectors[None], axis=2)
        for i in range(0, len(vectors), rows)
    ]
    return np.concatenate(blocks) if blocks else np.zeros((0, 0))


def _version(config: dict, tensors: dict[str, np.ndarray]) -> str:
    """1-<hash of configuration and tensors>: equal weights, equal space, whatever the file's byte
    layout."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensor, np.float32).tobytes())
    return f"1-{digest.hexdigest()[:16]}"

"""Training the learned embodiment encoder (torch): the network, its initialization and
`train_encoder`.

The encoder's inference (`_learned`: tokens, weights files, `LearnedEncoder.encode`) runs on numpy
alone, so that robots which only query skills need not install torch (gigabytes); torch is needed
here only, to initialize and train the network. `_Network` is the reference: `_learned._forward`
computes the same function in numpy, and the weights file holds this module's state_dict.
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import numpy as np
import torch
from torch import nn

from ._descriptors import Embodiment
from ._learned import (
    CLIP,
    DEFAULT_CONFIG,
    LearnedEncoder,
    feature_spread,
    population_reference,
    weights_file,
)
from ._tokens import BODY_FEATURES, JOINT_FEATURES, random_turns, token_batch, turned
from ._transfer_data import TransferDataError, TransferDataset
from ._views import urdf_view

TURNS = 8
"""Random turns of each body the input normalization and the out-of-distribution reference see
beside it (training turns every body at random in every epoch)."""


def _torch_batch(bodies: Sequence[Embodiment]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_tokens.token_batch` as tensors: padded joint tokens, padding mask (True = padding), body
    tokens."""
    joints, mask, body = token_batch(bodies)
    return torch.from_numpy(joints), torch.from_numpy(mask), torch.from_numpy(body)


class _Network(nn.Module):
    """Token embedding, a transformer over the body and joint tokens, pooling, a projection."""

    # buffers (register_buffer below): the feature standardization
    joint_mean: torch.Tensor
    joint_std: torch.Tensor
    body_mean: torch.Tensor
    body_std: torch.Tensor

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

    def forward(
        self,
        joints: torch.Tensor,
        mask: torch.Tensor,
        body: torch.Tensor,
        noise: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Vectors of a batch; `noise` (training only) jitters the standardized inputs."""
        j = ((joints - self.joint_mean) / self.joint_std).clamp(-CLIP, CLIP)
        g = ((body - self.body_mean) / self.body_std).clamp(-CLIP, CLIP)
        if noise:
            j = j + noise * torch.randn(j.shape, generator=generator)
            g = g + noise * torch.randn(g.shape, generator=generator)
        j, g = self.joint_in(j), self.body_in(g)
        x = self.blocks(
            torch.cat([g[:, None], j], 1),
            src_key_padding_mask=torch.cat([torch.zeros_like(mask[:, :1]), mask], 1),
        )
        keep = (~mask).unsqueeze(-1).float()
        mean = (x[:, 1:] * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.out(torch.cat([x[:, 0], mean], 1))

    def normalize_from(self, bodies: Sequence[Embodiment], turns: int = 0, seed: int = 0) -> None:
        """Set the input normalization to the statistics of these bodies' tokens (and of `turns`
        random turns of each, `_tokens.random_turns`)."""
        joints, mask, body = token_batch(bodies)
        rng = np.random.default_rng(seed)
        joints = np.concatenate(
            [joints] + [turned(joints, random_turns(len(joints), rng)) for _ in range(turns)]
        )
        valid = torch.from_numpy(joints[~np.tile(mask, (turns + 1, 1))])
        for name, values in (("joint", valid), ("body", torch.from_numpy(body))):
            getattr(self, f"{name}_mean").copy_(values.mean(0))
            getattr(self, f"{name}_std").copy_(
                values.std(0).clamp(min=1e-3) if len(values) > 1 else torch.ones(values.shape[1])
            )


def _network(encoder: LearnedEncoder) -> _Network:
    """The torch network holding an encoder's weights (in eval mode)."""
    network = _Network(
        **{key: int(encoder.config[key]) for key in ("width", "heads", "layers", "dim")}
    )
    network.load_state_dict(
        {k: torch.from_numpy(v.copy()) for k, v in encoder._tensors.items()}, strict=True
    )
    return network.eval()


def _arrays(network: _Network) -> dict[str, np.ndarray]:
    """A network's state_dict as float32 arrays, for `_learned.weights_file`."""
    return {
        k: v.detach().float().contiguous().numpy().copy() for k, v in network.state_dict().items()
    }


def untrained_encoder(
    bodies: Sequence[Embodiment], *, seed: int = 0, turns: int = TURNS, **config: int
) -> LearnedEncoder:
    """A randomly initialized network (seeded), its inputs normalized over `bodies` and `turns`
    random turns of each: where training starts."""
    config = {**DEFAULT_CONFIG, **config}
    with torch.random.fork_rng():  # seeded, without touching the caller's random state
        torch.manual_seed(seed)
        network = _Network(**config)
    network.normalize_from(bodies, turns, seed)
    encoder = LearnedEncoder(
        weights_file(_arrays(network), config, {"trained_on": "nothing (untrained)"})
    )
    return encoder.with_reference(population_reference(encoder, bodies, seed, turns=turns))


def _pairs(dataset: TransferDataset, margin: float, unskilled: bool) -> tuple[torch.Tensor, ...]:
    """Measured transfers between distinct bodies as (source, target, rate) columns, and for each
    target and task the (better, worse) pairs of them whose rates differ by more than `margin`.
    With `unskilled`, every body with no skill of a task family (never its source in the dataset)
    joins each target's group of that family at rate 0: nothing it has runs there."""
    measured = [
        (t.source, t.target, t.task, t.rate) for t in dataset.transfers if t.source != t.target
    ]
    if not measured:
        raise TransferDataError("no transfers between distinct bodies to train on")
    if unskilled:
        skilled: dict[str, set[int]] = defaultdict(set)
        for source, _, task, _ in measured:
            skilled[task].add(source)
        targets = sorted({(target, task) for _, target, task, _ in measured})
        measured += [
            (source, target, task, 0.0)
            for target, task in targets
            for source in range(len(dataset.bodies))
            if source not in skilled[task] and source != target
        ]
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for k, (_, target, task, _) in enumerate(measured):
        groups[target, task].append(k)
    rates = np.array([m[3] for m in measured])
    better, worse = [], []
    for rows in map(np.array, groups.values()):
        a, b = np.nonzero(rates[rows][:, None] > rates[rows][None, :] + margin)
        better.append(rows[a])
        worse.append(rows[b])
    return (
        torch.tensor([m[0] for m in measured]),
        torch.tensor([m[1] for m in measured]),
        torch.tensor(rates, dtype=torch.float32),
        torch.from_numpy(np.concatenate(better)).long(),
        torch.from_numpy(np.concatenate(worse)).long(),
    )


_P = ParamSpec("_P")
_TRAINING = threading.RLock()  # RLock: a training may call another (nested calls keep one thread)
_R = TypeVar("_R")


def _one_thread(train: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run `train` with torch on one thread: sums over threads round differently, so the same data
    make the same weights on any machine only this way (the shell's `simnet encoder train`, the
    shipped weights' `build_encoder` and the benchmark agree to the byte). The setting is the
    process's: trainings in several threads take turns (a lock), so none changes another's."""

    @functools.wraps(train)
    def on_one_thread(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _TRAINING:
            previous = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return train(*args, **kwargs)
            finally:
                torch.set_num_threads(previous)

    return on_one_thread


@_one_thread
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
    unskilled: bool = True,
    views: bool = True,
    noise: float = 0.15,
    turn: bool = True,
    classes: Sequence[str] | None = None,
    contrast: float = 1.0,
) -> LearnedEncoder:
    """Train on every transfer in `dataset` (full batch, Adam); returns a new encoder.

    The loss is scale-free (distances over their mean), so the space does not grow to win it. A pair
    whose better skill succeeds (rate at least `good`, the report's threshold) weighs 1 + `favour`
    times as much: retrieval is judged by whether the skills that work come first. With `unskilled`
    (the default), a body without a skill of a target's task family counts as a source that fails
    there (`_pairs`): that is what keeps arms, legged bodies and humanoids apart. With `views` (the
    default), every body is also seen as its URDF would describe it (`_views.urdf_view`): either
    description stands in for the body in the ranking, at random in each epoch, so the format a
    file was written in does not move the body. The encoder comes with the out-of-distribution
    reference of the dataset's bodies and their views (`_ood`). `noise` jitters the standardized
    inputs in training (Gaussian, in standard deviations), so that bodies a little off the
    population's values, as real ones are, land where their neighbours do. With `turn` (the
    default), every body is turned about the vertical at random in every epoch
    (`_tokens.random_turns`), and the normalization and the reference see `TURNS` turns of each:
    which way a file has a robot face is its vendor's choice.
    `classes` (one per body, e.g. its morphology) adds a contrastive term weighted `contrast`:
    each body nearer to another of its class than to one of another class, so that bodies of one
    kind embed together even where no transfer was measured between them.
    The weights' meta names the bodies trained on (`trained_names`), so that a benchmark can check
    that the bodies it reports on were never seen, and their median feature distance
    (`feature_spread`), the unit of the guard that queries rank by (`LearnedEncoder.guarded`).
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    source, target, rate, better, worse = _pairs(dataset, margin, unskilled)
    if not len(better):
        raise TransferDataError("every transfer scored alike: nothing to rank")
    n = len(dataset.bodies)
    if classes is not None and len(classes) != n:
        raise ValueError(f"classes: {len(classes)} given for {n} bodies")
    seen = list(dataset.bodies) + ([urdf_view(b) for b in dataset.bodies] if views else [])
    turns = TURNS if turn else 0
    encoder = start or untrained_encoder(seen, seed=seed, turns=turns)
    network = _network(encoder)
    network.train()
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    joints, mask, body = token_batch(seen)
    batch = torch.from_numpy(joints), torch.from_numpy(mask), torch.from_numpy(body)
    kinds = _kinds(classes)
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    weight = (rate[better] - rate[worse]).clamp(min=0) * (1 + favour * (rate[better] >= good))
    for _ in range(epochs):
        if turn:
            batch = (torch.from_numpy(turned(joints, random_turns(len(joints), rng))), *batch[1:])
        everything = network(*batch, noise, generator)
        vectors = everything[:n]
        if views:  # each body as either of its descriptions: the ranking holds for both
            vectors = torch.where(
                (torch.rand(n, generator=generator) < 0.5)[:, None], everything[n:], vectors
            )
        distance = (vectors[source] - vectors[target]).pow(2).sum(1).add(1e-9).sqrt()
        mean = distance.mean().detach().clamp(min=1e-6)
        scaled = distance / mean / temperature
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
        if kinds is not None and contrast:
            loss = loss + contrast * _contrastive(vectors / mean / temperature, kinds, rng)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    network.eval()
    info = {
        "trained_on": f"{len(dataset.bodies)} bodies, {len(rate)} transfers",
        "trained_names": sorted(set(dataset.names)),
        "epochs": epochs,
        "seed": seed,
        "feature_spread": feature_spread(seen),
        **(meta or {}),
    }
    trained = LearnedEncoder(weights_file(_arrays(network), encoder.config, info))
    groups = [i % n for i in range(len(seen))]  # a body and its view are one robot
    return trained.with_reference(population_reference(trained, seen, seed, groups, turns))


def _kinds(classes: Sequence[str] | None) -> np.ndarray | None:
    """Class indices per body; None when there is nothing to contrast (no class with two bodies
    beside another class)."""
    if classes is None:
        return None
    names, kinds = np.unique(np.asarray(classes, dtype=str), return_inverse=True)
    counts = np.bincount(kinds)
    return kinds if len(names) > 1 and (counts > 1).sum() >= 1 else None


def _contrastive(
    vectors: torch.Tensor, kinds: np.ndarray, rng: np.random.Generator
) -> torch.Tensor:
    """Each body against one random body of its class and one of another (drawn by `rng`): a
    logistic loss on (distance to the same class - distance to the other)."""
    anchors, positives, negatives = [], [], []
    for i, kind in enumerate(kinds):
        same = np.flatnonzero(kinds == kind)
        other = np.flatnonzero(kinds != kind)
        if len(same) < 2 or not len(other):
            continue
        anchors.append(i)
        positives.append(rng.choice(same[same != i]))
        negatives.append(rng.choice(other))
    a, p, q = (torch.as_tensor(np.array(x)) for x in (anchors, positives, negatives))
    near = (vectors[a] - vectors[p]).pow(2).sum(1).add(1e-9).sqrt()
    far = (vectors[a] - vectors[q]).pow(2).sum(1).add(1e-9).sqrt()
    return nn.functional.softplus(near - far).mean()

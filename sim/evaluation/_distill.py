"""Distillation: turn a local controller (code, which never travels) into a skill (data, which
does).

DAgger (Ross et al. 2011): roll out the current student on the task's own randomized branches, label
every visited observation with the expert's action, refit an MLP on everything gathered so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .._mlp import Policy
from .._mlp_spec import MLPSpec
from .._patches import Sampler
from .._tasks import Task
from ._evaluate import evaluate, single_threaded_torch

if TYPE_CHECKING:
    from .._torch_mlp import MLP

Controller = Callable[[np.ndarray], np.ndarray]


class _Recorder:
    """Acts with `actor`, records (obs, expert action) for every row the evaluator marks live."""

    def __init__(self, actor: Callable[[np.ndarray], np.ndarray], expert: Controller) -> None:
        self.actor, self.expert = actor, expert
        self.obs: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        live = np.any(obs != 0.0, axis=1)  # the evaluator zeroes the rows of ended branches
        self.obs.append(obs[live])
        self.labels.append(np.asarray(self.expert(obs), dtype=np.float64)[live])
        return self.actor(obs)


def fit_mlp(
    obs: np.ndarray,
    actions: np.ndarray,
    *,
    hidden: tuple[int, ...] = (64, 64),
    activation: str = "tanh",
    act_bound: float | None = None,
    epochs: int = 2000,
    seed: int = 0,
) -> Policy:
    """Least-squares fit of an MLP skill; `act_bound` adds a tanh output scaled to ±act_bound."""
    import torch  # here, not at import: `import sim` does not import torch

    from .._torch_mlp import MLP

    generator = torch.Generator().manual_seed(seed)
    spec = MLPSpec(
        obs.shape[1],
        actions.shape[1],
        tuple(hidden),
        activation,
        "tanh" if act_bound else None,
        "float64",
    )
    mean, std = obs.mean(axis=0), np.maximum(obs.std(axis=0), 1e-3)
    scale = np.full(actions.shape[1], act_bound if act_bound else 1.0)
    offset = np.zeros(actions.shape[1]) if act_bound else actions.mean(axis=0)
    if not act_bound:
        scale = np.maximum(actions.std(axis=0), 1e-6)
    shapes = spec.tensor_shapes()
    init = {k: torch.zeros(v, dtype=torch.float64) for k, v in shapes.items()}
    init.update(
        obs_mean=torch.from_numpy(mean),
        obs_std=torch.from_numpy(std),
        act_offset=torch.from_numpy(offset),
        act_scale=torch.from_numpy(scale),
    )
    for name, shape in shapes.items():
        if name.endswith(".weight"):
            init[name] = torch.randn(shape, generator=generator, dtype=torch.float64) / np.sqrt(
                shape[1]
            )
    model = MLP(spec, init)
    model.train()
    for buffer in ("obs_mean", "obs_std", "act_offset", "act_scale"):
        getattr(model, buffer).requires_grad_(False)
    x = torch.from_numpy(obs)
    y = torch.from_numpy(actions)
    optimizer = torch.optim.Adam(model.layers.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    # one thread: a small MLP gains nothing from more, the result is the same on any machine, and
    # on a loaded machine intra-op threads that wait for each other made training 20x slower
    with single_threaded_torch():
        for _ in range(epochs):
            rows = torch.randint(0, len(x), (min(len(x), 1024),), generator=generator)
            loss = torch.mean(((model(x[rows]) - y[rows]) / model.act_scale) ** 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return Policy.from_tensors(spec, {k: v.detach() for k, v in model.state_dict().items()})


def distill(
    task: Task,
    expert: Controller,
    *,
    sampler: Sampler | None = None,
    branches: int = 64,
    iterations: int = 4,
    hidden: tuple[int, ...] = (64, 64),
    act_bound: float | None = None,
    epochs: int = 2000,
    seed: int = 0,
) -> Policy:
    """Fit an MLP skill that imitates `expert` on `task` by DAgger; returns the last student."""
    if iterations < 1:
        raise ValueError(f"distill needs at least one iteration, got {iterations}")
    sampler = sampler or Sampler()
    obs_sets: list[np.ndarray] = []
    label_sets: list[np.ndarray] = []
    actor: Callable[[np.ndarray], np.ndarray] = expert
    for iteration in range(iterations):
        recorder = _Recorder(actor, expert)
        evaluate(
            task,
            recorder,
            branches=branches,
            sampler=Sampler(sampler.terms, sampler.seed + iteration),
            progress=False,
        )
        obs_sets += recorder.obs
        label_sets += recorder.labels
        skill = fit_mlp(
            np.concatenate(obs_sets),
            np.concatenate(label_sets),
            hidden=hidden,
            act_bound=act_bound,
            epochs=epochs,
            seed=seed + iteration,
        )
        actor = _numpy_policy(skill.module())
    return skill


def _numpy_policy(module: MLP) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(obs)).numpy()

    return act

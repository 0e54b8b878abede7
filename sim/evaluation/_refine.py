"""Simulator-in-the-loop refinement at inference time, and distilling what it does into a skill.

A brittle policy is run with a planner around it: every `replan` control steps, from the state each
episode is in, `candidates` rollouts of `lookahead` steps run in the simulator, each the policy's
own actions plus a sequence of Gaussian perturbations (the first candidate unperturbed), and the
episode executes the start of the best sequence (`method="best"`) or of the return-weighted average
of the perturbations (`method="mppi"`, temperature `temperature`). The planner simulates with the
template's nominal dynamics and each episode's own task terms (its target): the episodes themselves
run in their own patched dynamics (the field), which it does not know. What the refined episodes
observed and did is the data `distill_refined` fits a new MLP skill to, so one site's refinement can
be certified and published as every site's next skill version.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from .._mlp import Policy
from .._patches import Sampler, apply_model_patches
from .._tasks import Runtime, Task
from ._distill import fit_mlp
from ._evaluate import single_threaded_torch
from ._rollout import PolicyCaller, branch_patches, prepared_batch

_POS = int(mujoco.mjtStage.mjSTAGE_POS)
_NONE = int(mujoco.mjtStage.mjSTAGE_NONE)


@dataclass(frozen=True)
class Refinement:
    """Refined episodes: per-episode success and return, and what the refined policy saw and did."""

    success: np.ndarray  # (episodes,) bool
    returns: np.ndarray  # (episodes,)
    observations: np.ndarray  # (samples, obs_dim): every live step of every episode
    actions: np.ndarray  # (samples, act_dim): the action executed there

    @property
    def success_rate(self) -> float:
        return float(self.success.mean())


def refine(
    task: Task,
    policy: object,
    *,
    sampler: Sampler,
    episodes: int = 32,
    candidates: int = 32,
    lookahead: int = 10,
    replan: int = 5,
    noise: float = 0.05,
    method: str = "best",
    temperature: float = 1.0,
    seed: int = 0,
    threads: int = 1,
) -> Refinement:
    """Run `episodes` branches of `task` (dynamics and initial states from `sampler`) with the
    planner around `policy`."""
    if method not in ("best", "mppi"):
        raise ValueError(f"method is 'best' or 'mppi', not {method!r}")
    if not (candidates >= 1 and lookahead >= 1 and 1 <= replan <= lookahead):
        raise ValueError("need candidates >= 1 and 1 <= replan <= lookahead")
    rng = np.random.default_rng(seed)
    caller = PolicyCaller(policy, task)
    template = task.template
    ids = list(range(episodes))
    patches = branch_patches(task, sampler, 0, episodes)
    field, here = prepared_batch(task, patches, ids, episodes, threads)
    # the planner knows each episode's task (its target, its initial-state terms: the task's
    # patches) but not the field's dynamics (the sampler's): it plans with nominal dynamics
    plan = mjbatch.Batch(template.model, episodes * candidates, threads)
    known = task.init_patches(sampler.seed, 0, episodes)
    apply_model_patches(
        plan,
        template,
        [known[e] for e in range(episodes) for _ in range(candidates)],
        list(range(episodes * candidates)),
    )
    live = np.ones(episodes, bool)
    success = np.zeros(episodes, bool)
    returns = np.zeros(episodes)
    seen: list[np.ndarray] = []
    done: list[np.ndarray] = []
    with single_threaded_torch():
        for start in range(0, task.horizon, replan):
            perturbation = _plan(
                task,
                caller,
                plan,
                field,
                live,
                candidates,
                lookahead,
                noise,
                method,
                temperature,
                rng,
            )
            for h in range(min(replan, task.horizon - start)):
                obs = here.observe()
                action = np.asarray(caller(obs), dtype=np.float64) + perturbation[:, h]
                seen.append(obs[live])
                done.append(action[live])
                _act(task, here, action, live)
                field.step(
                    None if live.all() else np.flatnonzero(live).astype(np.int32),
                    nstep=task.control_substeps,
                    stage=_POS,
                )
                gained = here.reward()
                returns[live] += gained[live]
                for _reason, hit in here.failures():
                    live &= ~hit
                if task.definition["success"]["when"] == "first":
                    reached = live & here.succeeded()
                    success |= reached
                    live &= ~reached
                here.end_step()
                if not live.any():
                    break
            if not live.any():
                break
    if live.any() and task.definition["success"]["when"] == "end":
        success |= live & here.succeeded()
    return Refinement(success, returns, np.concatenate(seen), np.concatenate(done))


def _plan(
    task: Task,
    caller: PolicyCaller,
    plan: mjbatch.Batch,
    field: mjbatch.Batch,
    live: np.ndarray,
    candidates: int,
    lookahead: int,
    noise: float,
    method: str,
    temperature: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """(episodes, lookahead, act_dim): the perturbation each episode executes next."""
    episodes = len(live)
    eps = rng.normal(0.0, noise, (episodes, candidates, lookahead, task.act_dim))
    eps[:, 0] = 0.0  # the policy as it is stays a candidate
    plan.reset(keyframe=task.keyframe, stage=_NONE)
    plan.state[:] = np.repeat(field.state, candidates, axis=0)
    plan.forward(stage=_POS)
    runtime = Runtime(task, plan)
    runtime.begin()
    flat = eps.reshape(episodes * candidates, lookahead, task.act_dim)
    score = np.zeros(episodes * candidates)
    alive = np.ones(episodes * candidates, bool)
    for h in range(lookahead):
        action = np.asarray(caller(runtime.observe()), dtype=np.float64) + flat[:, h]
        _act(task, runtime, action, alive)
        try:
            plan.step(None, nstep=task.control_substeps, stage=_POS)
        except mjbatch.SimulationError as exc:
            alive[np.asarray(exc.ids, dtype=np.int64)] = False
        reward = runtime.reward()
        score += np.where(alive, np.where(np.isfinite(reward), reward, -1e9), 0.0)
        for _reason, hit in runtime.failures():
            score[alive & hit] -= 1e6
            alive &= ~hit
        runtime.end_step()
    scores = score.reshape(episodes, candidates)
    if method == "best":
        return eps[np.arange(episodes), scores.argmax(axis=1)]
    weights = np.exp((scores - scores.max(axis=1, keepdims=True)) / temperature)
    weights /= weights.sum(axis=1, keepdims=True)
    return np.einsum("ec,ecla->ela", weights, eps)


def _act(task: Task, runtime: Runtime, action: np.ndarray, live: np.ndarray) -> None:
    ctrl = runtime.ctrl
    target = action if task.action_mode == "absolute" else ctrl + action
    ctrl[live] = np.clip(target, runtime.ctrl_low, runtime.ctrl_high)[live]


def distill_refined(
    refined: Refinement, *, hidden: tuple[int, ...] = (64, 64), epochs: int = 1000, seed: int = 0
) -> Policy:
    """A new MLP skill fitted to what the refined episodes did (behaviour cloning)."""
    bound = float(np.abs(refined.actions).max()) * 1.05 or None
    return fit_mlp(
        refined.observations,
        refined.actions,
        hidden=hidden,
        act_bound=bound,
        epochs=epochs,
        seed=seed,
    )

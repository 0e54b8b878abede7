"""One wave: up to `wave` branches stepped together in a `mujoco.batch.Batch`, closed loop.

The batch is built fresh per wave from the shared template, so memory follows the wave size (the
concurrency), not the branch count; and a branch's dynamics depend on its own patch alone. The
policy sees every row of the wave in one call per control step, dead rows zeroed, so the batch
layout of policy calls (wave size, row = branch % wave) is fixed whatever happens to the others.
On two threads or more, a large torch policy that gives each row the same bits in a call on half
the wave is called per half instead, each half a lane of its own (`run_wave`): the outcomes do not
change.
"""

from __future__ import annotations

import concurrent.futures
import math
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from .._errors import (
    IncompatibleTemplateError,
    PolicyCallError,
    PolicyOutputError,
    TaskDefinitionError,
)
from .._mlp import EntryPointRef, Policy
from .._patches import (
    Draws,
    Patch,
    Sampler,
    apply_model_patches,
    apply_state_patches,
    sample_draws,
)
from .._snapshot import Snapshot, apply_stepwise
from .._tasks import Runtime, Task

_UNSTABLE = {
    int(getattr(mujoco.mjtWarning, f"mjWARN_{w}")): w
    for w in ("BADQPOS", "BADQVEL", "BADQACC", "BADCTRL")
}
# consecutive in mjtWarning: a slice of a batch's warnings is a view, which costs no copy per step
_UNSTABLE_SLICE = slice(min(_UNSTABLE), max(_UNSTABLE) + 1)
_POS = int(mujoco.mjtStage.mjSTAGE_POS)
_NONE = int(mujoco.mjtStage.mjSTAGE_NONE)


@dataclass(frozen=True)
class BranchOutcome:
    """How one branch ended: `reason` is "success", "horizon", "failure:<term>",
    "unstable:<warning>" or "mujoco:<message>"; `total_reward` sums the task's reward terms."""

    branch: int
    success: bool
    total_reward: float
    steps: int
    reason: str


class PolicyCaller:
    """A policy as one batched numpy call: torch modules run in float and inference mode."""

    def __init__(self, policy: Any, task: Task) -> None:
        if isinstance(policy, EntryPointRef):
            policy = policy.load()(task)
        if isinstance(policy, Policy):
            policy = policy.module()
        spec = getattr(policy, "spec", None)
        if spec is not None and (spec.obs_dim, spec.act_dim) != (task.obs_dim, task.act_dim):
            raise IncompatibleTemplateError(
                f"the skill maps {spec.obs_dim} observations to {spec.act_dim} actions; "
                f"task {task.name!r} gives {task.obs_dim} and drives {task.act_dim}"
            )
        self.policy: Any = policy  # a torch module, or any callable from an entry point
        torch = sys.modules.get("torch")  # a policy is a torch module only once torch is imported
        self.torch = torch is not None and isinstance(policy, torch.nn.Module)
        self.parameters = 0  # a torch module's, the measure of its work per row
        self._call: Callable[[np.ndarray], object] = self.policy
        if self.torch:
            self.parameters = sum(p.numel() for p in self.policy.parameters())
            self._call = _module_call(self.policy)
        self._splits: dict[tuple[int, int], bool] = {}

    def splits_exactly(self, rows: int, at: int, obs_dim: int) -> bool:
        """Whether calls on rows [0, at) and [at, rows) give every row the bits one call on all
        `rows` gives it. Only torch modules are asked (a callable is promised one call per wave).
        Which kernels a module's operations take depends on the shapes, not on the values, so one
        probe of seeded random observations per (rows, at) tells."""
        if not self.torch:
            return False
        if (rows, at) not in self._splits:
            probe = np.random.default_rng(rows * 65_537 + at).standard_normal((rows, obs_dim))
            try:
                whole = np.asarray(self(probe))
                parts = np.concatenate([self(probe[:at].copy()), self(probe[at:].copy())])
                exact = whole.shape == parts.shape and whole.tobytes() == parts.tobytes()
            except Exception:  # noqa: BLE001 - the wave's own calls raise it, named
                exact = False
            self._splits[(rows, at)] = exact and bool(np.isfinite(whole).all())
        return self._splits[(rows, at)]

    def __call__(self, obs: np.ndarray) -> object:
        return self._call(obs)


def _module_call(module: Any) -> Callable[[np.ndarray], np.ndarray]:
    """A torch module as a numpy call: `MLP.act`, else the module in its parameters' dtype in
    inference mode, its output as float64."""
    import torch

    from .._torch_mlp import MLP

    if isinstance(module, MLP):
        return module.act
    first = next(iter(module.parameters()), None)
    dtype = first.dtype if first is not None else torch.float64

    def call(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(obs).to(dtype)).to(torch.float64).numpy()

    return call


def branch_patches(task: Task, sampler: Sampler, first: int, count: int) -> list[Patch]:
    """What makes each branch differ from the template: its dynamics draws, then its initial
    state."""
    return branch_draws(task, sampler, first, count).patches()


def branch_draws(task: Task, sampler: Sampler, first: int, count: int) -> Draws:
    """`branch_patches` as columns, which a batch applies without a `Mutation` per branch."""
    dynamics = sample_draws(sampler.terms, task.template, sampler.seed, first, count, "dynamics")
    init = sample_draws(
        task.init_terms, task.template, sampler.seed, first, count, "init", TaskDefinitionError
    )
    return dynamics + init


def branch_patch(task: Task, sampler: Sampler, branch: int) -> Patch:
    return branch_patches(task, sampler, branch, 1)[0]


def run_wave(
    task: Task,
    caller: PolicyCaller,
    sampler: Sampler,
    wave_index: int,
    wave: int,
    branches: int,
    threads: int,
    on_step: Callable[[], None] | None = None,
    patches: Sequence[Patch] | Draws | None = None,
    start: Snapshot | None = None,
) -> list[BranchOutcome]:
    """Roll out branches [wave_index * wave, ...) closed loop; outcomes in branch order. With
    `start`, every branch begins at that world snapshot (its model patch, then its state) instead of
    a reset.

    On two or more threads, where the policy is large (`_LANE_PARAMETERS`) and gives each row the
    bits it gives it in a call on the whole wave (checked once per caller, see
    `PolicyCaller.splits_exactly`), the wave runs as two lanes of rows, each a closed loop on its
    own thread: one lane's policy call and bookkeeping overlap the other's physics. The outcomes
    are those of one lane; an error in a lane re-runs the wave as one lane, which raises it as a
    single policy call names it."""
    ids = list(range(wave_index * wave, min((wave_index + 1) * wave, branches)))
    if patches is None:
        patches = branch_draws(task, sampler, ids[0], len(ids))
    at = _lane_split(task, caller, wave, threads)
    if at:
        try:
            return _two_lanes(task, caller, patches, ids, wave, at, threads, on_step, start)
        except Exception:  # noqa: BLE001 - the single lane below raises it, named as one call names it
            pass
    return _closed_loop(task, caller, patches, ids, wave, threads, on_step, start)


_LANE_ROWS = 32  # a lane's rows are whole multiples of this, and it has at least this many
# Lanes pay a policy call's fixed cost twice per control step (it runs cold after the physics: a
# 64x64 MLP's 256-row call takes ~170 us there, 115 us warm) and the two threads' handing over of
# the GIL; they save the half of the policy's per-row work that overlaps physics. On a 2-core
# machine one lane is 2-4% faster for a 64x64 MLP (5,800 parameters) and 2% for 128x128 (19,700);
# lanes are 5% faster for 256x256 (72,000) and 15% for 512x512 (275,000).
_LANE_PARAMETERS = 32_768


def _lane_split(task: Task, caller: PolicyCaller, rows: int, threads: int) -> int:
    """The first row of the second lane, or 0 to run the wave as one lane: one thread, a wave too
    small to share, a task with Python terms (they see all rows at once), a policy too small to gain
    from the overlap, or one whose rows depend on the batch."""
    at = rows // 2 // _LANE_ROWS * _LANE_ROWS
    if threads < 2 or at < _LANE_ROWS or _has_python_terms(task):
        return 0
    if caller.parameters < _LANE_PARAMETERS:
        return 0
    return at if caller.splits_exactly(rows, at, task.obs_dim) else 0


def _has_python_terms(task: Task) -> bool:
    data = task.definition
    terms = [*data["reward"], *data["success"]["all"], *data.get("failure", [])]
    return any(term.get("term") == "entry_point" for term in terms)


def _two_lanes(
    task: Task,
    caller: PolicyCaller,
    patches: Sequence[Patch] | Draws,
    ids: list[int],
    rows: int,
    at: int,
    threads: int,
    on_step: Callable[[], None] | None,
    start: Snapshot | None,
) -> list[BranchOutcome]:
    """Rows [0, at) here and [at, rows) on a second thread, the threads shared between them; the
    first lane to fail stops the other at its next control step."""
    failed = threading.Event()

    def unless_failed() -> None:
        if failed.is_set():
            raise _LaneStopped

    def lane(first: int, end: int, lane_threads: int, tick: Callable[[], None]) -> list:
        try:
            return _closed_loop(
                task,
                caller,
                patches[first:end],
                ids[first:end],
                end - first,
                lane_threads,
                tick,
                start,
            )
        except BaseException:
            failed.set()
            raise

    def here_tick() -> None:
        unless_failed()
        if on_step is not None:
            on_step()

    if len(ids) <= at:  # the second lane would hold no branch
        return lane(0, at, threads, here_tick)
    with concurrent.futures.ThreadPoolExecutor(1, "lane") as pool:
        later = pool.submit(lane, at, rows, threads - threads // 2, unless_failed)
        first = lane(0, at, threads // 2, here_tick)
        return first + later.result()


class _LaneStopped(Exception):
    """The other lane failed: this one stops (internal)."""


def _closed_loop(
    task: Task,
    caller: PolicyCaller,
    patches: Sequence[Patch] | Draws,
    ids: list[int],
    size: int,
    threads: int,
    on_step: Callable[[], None] | None,
    start: Snapshot | None,
) -> list[BranchOutcome]:
    """Branches `ids` in the first rows of a batch of `size`, stepped to the horizon, the policy
    called on all `size` rows at once per control step."""
    n = len(ids)
    batch, runtime = prepared_batch(task, patches, ids, size, threads, start)

    live = np.zeros(size, bool)
    live[:n] = True
    everyone = n == size  # every row live: the usual case, which skips the row masks below
    success = np.zeros(size, bool)
    reward = np.zeros(size)
    steps = np.zeros(size, np.int64)
    reasons = [""] * size
    counts = batch.warning[:, _UNSTABLE_SLICE, 1]  # a live view
    warned = counts.copy()
    ctrl = runtime.ctrl
    clipped = np.empty_like(ctrl)  # the targets of each control step, clipped, written in place
    first_success = task.definition["success"]["when"] == "first"

    def end(rows: np.ndarray, reason: str | list[str]) -> None:
        nonlocal everyone
        if not rows.any():  # the usual case, every control step: nothing ended
            return
        for k, row in enumerate(np.flatnonzero(rows)):
            reasons[row] = reason if isinstance(reason, str) else reason[k]
        live[rows] = False
        everyone = False

    # A finite sum means finite terms (NaN and inf propagate; an overflow only sends the check to
    # the exact, per-row path), so one reduction clears a whole array in the usual case.
    for step in range(task.horizon):
        obs = runtime.observe()
        if not (everyone and math.isfinite(obs.sum())):
            obs[~live] = 0.0
            end(live & ~np.isfinite(obs).all(axis=1), "unstable:nonfinite")
            if not live.any():
                break
        actions = _actions(caller, obs, live, ids, step, task.act_dim)
        target = actions if task.action_mode == "absolute" else np.add(ctrl, actions, out=clipped)
        # np.clip's bits (the values are finite), without its Python wrapper or new arrays
        np.maximum(target, runtime.ctrl_low, out=clipped)
        np.minimum(clipped, runtime.ctrl_high, out=clipped)
        if everyone:
            ctrl[...] = clipped
        else:
            ctrl[live] = clipped[live]
        stepping = None if everyone else np.flatnonzero(live).astype(np.int32)
        try:
            batch.step(stepping, nstep=task.control_substeps, stage=_POS)
        except mjbatch.SimulationError as exc:
            failed = np.zeros(size, bool)
            failed[exc.ids] = True
            messages = [
                batch.error(s).splitlines()[0] for s in sorted(map(int, exc.ids)) if live[s]
            ]
            end(failed & live, [f"mujoco:{m}" for m in messages])
        if (counts != warned).any():
            rising = (counts > warned) & live[:, None]
            if rising.any():
                rows = rising.any(axis=1)
                first = _UNSTABLE_SLICE.start
                end(rows, [f"unstable:{_UNSTABLE[first + int(r.argmax())]}" for r in rising[rows]])
            warned = counts.copy()
        gained = runtime.reward()
        if everyone and math.isfinite(gained.sum()):
            steps += 1
            reward += gained
        else:
            steps[live] += 1
            end(live & ~np.isfinite(gained), "unstable:nonfinite")
            reward[live] += gained[live]
        for reason, hit in runtime.failures():
            end(live & hit, reason)
        if first_success:
            done = live & runtime.succeeded()
            success |= done
            end(done, "success")
        runtime.end_step()
        if on_step is not None:
            on_step()
        if not everyone and not live.any():
            break
    if live.any():
        done = live & runtime.succeeded()
        success |= done
        end(done, "success")
        end(live.copy(), "horizon")
    return [
        BranchOutcome(b, bool(success[i]), float(reward[i]), int(steps[i]), reasons[i])
        for i, b in enumerate(ids)
    ]


def prepared_batch(
    task: Task,
    patches: Sequence[Patch] | Draws,
    ids: list[int],
    rows: int,
    threads: int,
    start: Snapshot | None = None,
) -> tuple[mjbatch.Batch, Runtime]:
    """A batch of `rows` simulations at the start of `task`: branch `ids[i]` in row i, with its
    patch (after the world `start`, if given), and the task's runtime begun on it."""
    template = task.template
    batch = mjbatch.Batch(template.model, rows, threads)
    if start is not None:
        apply_stepwise(batch, template, start.patch, ids)
    apply_model_patches(batch, template, patches, ids)
    batch.reset(keyframe=task.keyframe, stage=_NONE)
    if start is not None:
        batch.state[: len(ids)] = start.state
    apply_state_patches(batch, template, patches, ids)
    runtime = Runtime(task, batch)
    batch.forward(stage=_POS)
    runtime.begin()
    return batch, runtime


def _actions(
    caller: PolicyCaller, obs: np.ndarray, live: np.ndarray, ids: list[int], step: int, act_dim: int
) -> np.ndarray:
    """The policy's actions, checked for every live row: a bad policy is an error, not a failure."""

    def live_branches() -> tuple[int, ...]:  # only built for an error: this runs every control step
        return tuple(ids[i] for i in np.flatnonzero(live))

    try:
        raw = caller(obs)  # the policy's own: nothing reads it after
    except Exception as exc:
        raise PolicyCallError(
            f"the policy raised {type(exc).__name__}: {exc}", live_branches(), step
        ) from exc
    try:
        actions = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        detail = f"the policy returned {type(raw).__name__}, not a numeric array"
        raise PolicyOutputError(detail, live_branches(), step) from exc
    if actions.shape != (len(obs), act_dim):
        raise PolicyOutputError(
            f"the policy returned shape {actions.shape}, expected {(len(obs), act_dim)}",
            live_branches(),
            step,
        )
    if math.isfinite(actions.sum()):  # the usual case (see `_closed_loop`)
        return actions
    nonfinite = live & ~np.isfinite(actions).all(axis=1)
    if nonfinite.any():
        bad = tuple(ids[i] for i in np.flatnonzero(nonfinite))
        raise PolicyOutputError("the policy returned NaN or inf", bad, step)
    return actions

"""Branch evaluation throughput, memory and SPRT savings, each against its baseline in the same run.

    python benchmarks/branch_eval.py [--quick]

- Throughput: the arm task, 256 branches under the shipped dynamics randomization, closed loop with
  the shipped torch MLP (64x64), physics on all cores; against a raw single-thread Python
  `mj_step` loop on the same model whose joint targets sweep every control period, as the policy's
  do (`ratio_to_raw`); the same loop holding the home pose is reported too (`ratio_to_raw_still`).
  Env steps are physics steps. Library and raw runs alternate and the medians are reported, so
  that load from other processes hits both alike. `physics_scaling`: the same batch of 256 stepped
  with no policy on all threads over one thread, alternating with the rest: the ceiling of the ratio
  on this machine as loaded during the run (~2 on a quiet 2-core machine). `cpu_over_physics`: CPU
  seconds (all threads) per env step of the library over those of that batch on all threads, both
  per step: what the policy, the bookkeeping and the waits add to the physics, which other
  processes loading the machine distort less than wall-clock figures. `cpu_over_loop_physics`: the
  same over a batch that also sweeps its joint targets and computes positions after each control
  period, as the closed loop must: what the policy, the bookkeeping and the waits alone add.
- Memory: resident-set growth over the footprint after imports and template compilation, for the
  library's 256 branches against 256 independent MjModel+MjData copies of the same patched models;
  each measured in a fresh subprocess (peak RSS, VmHWM).
- SPRT: branches simulated (waves of 8) before deciding, over the shipped good and degraded skills
  of both tasks, against a fixed-N test with the same error rates.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

import mujoco
import numpy as np
from mujoco import batch as mjbatch

import knowledge.stats
import sim
import sim.evaluation
from sim.evaluation import branch_patch

BRANCHES = 256
TASK = "arm_reach"


def _rss_kb(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def library_rate(
    task: sim.Task, skill: sim.Policy, sampler: sim.Sampler, threads: int
) -> tuple[float, float]:
    """Env steps/s, and CPU seconds (all threads) per env step."""
    start, cpu = time.perf_counter(), time.process_time()
    result = sim.evaluate(
        task,
        skill,
        branches=BRANCHES,
        wave=BRANCHES,
        sampler=sampler,
        threads=threads,
        progress=False,
    )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    steps = sum(o.steps for o in result.outcomes) * task.control_substeps
    return steps / elapsed, cpu / steps


def raw_rate(task: sim.Task, steps: int, moving: bool) -> float:
    """mj_step/s of a plain single-thread loop on the template. `moving` sweeps the joint targets
    every control period, as a reaching policy does (a moving arm costs ~10% more per step than one
    holding its pose); the targets are precomputed, so the loop does only what the raw loop does."""
    model = task.template.model
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, task.keyframe)
    periods, substeps = steps // task.control_substeps, task.control_substeps
    home = model.key_ctrl[task.keyframe]
    targets = [
        home + 0.4 * np.sin(0.05 * k + np.arange(model.nu)) if moving else home
        for k in range(periods)
    ]
    step = mujoco.mj_step
    start = time.perf_counter()
    for target in targets:
        data.ctrl[:] = target
        for _ in range(substeps):
            step(model, data)
    return periods * substeps / (time.perf_counter() - start)


def physics_rate(task: sim.Task, threads: int, as_the_loop: bool = False) -> tuple[float, float]:
    """mj_step/s of the template's batch of 256 stepped on `threads` threads, no policy: how far
    plain physics scales on this machine as it is loaded now (the ceiling `ratio_to_raw` has); and
    CPU seconds (all threads) per step. `as_the_loop`: the physics a closed loop must do besides,
    the joint targets sweeping every control period as in `raw_rate` and the positions computed
    after each (the observation's site positions), 12-20% more per step than the still batch."""
    batch = mjbatch.Batch(task.template.model, BRANCHES, threads)
    batch.reset(keyframe=task.keyframe)
    ctrl, home = batch.bind("ctrl"), task.template.model.key_ctrl[task.keyframe]
    stage = mujoco.mjtStage.mjSTAGE_POS if as_the_loop else mujoco.mjtStage.mjSTAGE_NONE
    sweep = np.arange(len(home))
    start, cpu = time.perf_counter(), time.process_time()
    for k in range(task.horizon // 3):
        if as_the_loop:
            ctrl[:] = home + 0.4 * np.sin(0.05 * k + sweep)
        batch.step(None, nstep=task.control_substeps, stage=stage)
    steps = BRANCHES * (task.horizon // 3) * task.control_substeps
    return steps / (time.perf_counter() - start), (time.process_time() - cpu) / steps


def naive_copies(task: sim.Task, sampler: sim.Sampler) -> list:
    """256 independent patched MjModel + MjData pairs: what the batch saves us from holding."""
    template = task.template
    held = []
    for branch in range(BRANCHES):
        model = copy.copy(template.model)
        data = mujoco.MjData(model)
        for mutation in branch_patch(task, sampler, branch).mutations:
            slot = template.slot(mutation.target)
            if slot.state:
                continue
            field = (
                model.opt.gravity
                if slot.field == "opt.gravity"
                else getattr(model, slot.field).reshape(-1)
            )
            cells = field[slot.start : slot.start + slot.size]
            value = np.asarray(mutation.value)
            cells[:] = (
                value
                if mutation.op == "set"
                else cells + value
                if mutation.op == "add"
                else cells * value
            )
        mujoco.mj_setConst(model, data)
        held.append((model, data))
    return held


def memory_child(kind: str) -> None:
    task = sim.load_task(TASK)
    skill = sim.load_skill(f"{TASK}_good")
    sampler = sim.load_sampler(TASK, seed=0)
    skill.module()  # torch and the policy are part of the footprint, as the template is
    base = _rss_kb("VmRSS")
    if kind == "library":
        sim.evaluate(task, skill, branches=BRANCHES, wave=BRANCHES, sampler=sampler, progress=False)
    else:
        held = naive_copies(task, sampler)
        assert len(held) == BRANCHES
    print(json.dumps({"growth_kb": _rss_kb("VmHWM") - base}))


def memory_growth_mb(kind: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--memory", kind], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["growth_kb"] / 1024


def sprt_figures(seeds: int) -> dict:
    test = sim.SPRT(0.85, 0.95, 0.05, 0.05)
    fixed = knowledge.stats.fixed_sample_size(test.p0, test.p1, test.alpha, test.beta)
    simulated, decisions = [], []
    for name in ("arm_reach", "walker_forward"):
        task = sim.load_task(name)
        for quality in ("good", "degraded"):
            skill = sim.load_skill(f"{name}_{quality}")
            for seed in range(seeds):
                sampler = sim.load_sampler(name, seed=100 + seed)
                result = sim.evaluate(
                    task, skill, branches=fixed, wave=8, sampler=sampler, sprt=test, progress=False
                )
                simulated.append(result.n)
                decisions.append(f"{name}_{quality}:{result.decision}@{result.decided_at}")
    return {
        "sprt_savings": 1 - sum(simulated) / (fixed * len(simulated)),
        "sprt_fixed_n": fixed,
        "sprt_mean_branches": statistics.mean(simulated),
        "sprt_decisions": decisions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and SPRT seeds")
    parser.add_argument("--memory", choices=("library", "naive"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory:
        memory_child(args.memory)
        return
    repeats, seeds = (3, 1) if args.quick else (7, 5)
    threads = os.cpu_count() or 1
    task = sim.load_task(TASK)
    skill = sim.load_skill(f"{TASK}_good")
    sampler = sim.load_sampler(TASK, seed=0)
    raw_steps = BRANCHES * task.horizon * task.control_substeps // (4 if args.quick else 1)
    library_rate(task, skill, sampler, threads)  # warm up: first torch call, page faults
    library, raw, still, scaling, cpu, loop_cpu = [], [], [], [], [], []
    for _ in range(repeats):
        rate, library_cpu = library_rate(task, skill, sampler, threads)
        library.append(rate)
        raw.append(raw_rate(task, raw_steps, moving=True))
        still.append(raw_rate(task, raw_steps, moving=False))
        (on_all, physics_cpu), (on_one, _) = physics_rate(task, threads), physics_rate(task, 1)
        scaling.append(on_all / on_one)
        cpu.append(library_cpu / physics_cpu)
        loop_cpu.append(library_cpu / physics_rate(task, threads, as_the_loop=True)[1])
    env_steps, raw_steps_per_s = statistics.median(library), statistics.median(raw)
    growth, naive = memory_growth_mb("library"), memory_growth_mb("naive")
    line = {
        "benchmark": "branch_eval",
        "task": TASK,
        "branches": BRANCHES,
        "quick": args.quick,
        "repeats": repeats,
        "threads": threads,
        "env_steps_per_s": round(env_steps),
        "raw_mj_step_per_s": round(raw_steps_per_s),
        "ratio_to_raw": round(env_steps / raw_steps_per_s, 3),
        "raw_still_mj_step_per_s": round(statistics.median(still)),
        "ratio_to_raw_still": round(env_steps / statistics.median(still), 3),
        "physics_scaling": round(statistics.median(scaling), 3),
        "cpu_over_physics": round(statistics.median(cpu), 3),
        "cpu_over_loop_physics": round(statistics.median(loop_cpu), 3),
        "rss_growth_mb": round(growth, 2),
        "naive_rss_growth_mb": round(naive, 2),
        "memory_ratio": round(growth / naive, 3),
        "policy": (
            f"torch MLP {list(skill.spec.hidden)} {skill.spec.dtype}, one batched call per control "
            "step on the whole wave (a policy this small runs as one lane)"
        ),
        **sprt_figures(seeds),
    }
    line["sprt_savings"] = round(line["sprt_savings"], 3)
    print(json.dumps(line))


if __name__ == "__main__":
    main()

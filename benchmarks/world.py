"""Persistent worlds: what persistence costs, how fast a fork is, how big a checkpoint is, whether
replays are exact, and how much evaluation throughput the Ray backend keeps; each against its
baseline in the same run.

    python benchmarks/world.py [--quick]

- persistence_overhead: one shard (the shipped walker and a crate on a floor) stepping with its
  event log and checkpoints on, against the same stepping with logging and checkpoints off; a
  setpoint event for the walker's four joints every 20 ticks (10 Hz of virtual time), checkpoints
  every 1000 ticks, in windows of one second of virtual time: the window's events and the advance
  over it are one commit (`World.batch`). With persistence off, each setpoint is still checked
  against the shard's template and shaped into the event the engine applies (`mutate_event`, what
  `World.apply` does before it logs), and the same engine steps. Everything else `World.apply`,
  `World.advance` and the commit do counts as persistence: the store, checksums, checkpoints, and
  the world's bookkeeping. Both run in this process (backend "inline"). Runs alternate; the figure
  is the median over rounds of (with / without - 1), which load drifting between rounds does not
  bias. persistence_overhead_1hz: the same with a setpoint every 200 ticks.
  persistence_overhead_cpu: the 10 Hz figure on this thread's CPU time (the inline backend runs
  everything on it): what other processes loading the machine distort least (they preempt the run,
  which wall-clock time counts). persistence_overhead_vs_prebuilt: against the engine fed events
  built before timing (nothing checked or shaped while it runs), the stricter figure.
  persistence_overhead_long_run: the 10 Hz figure in one world that keeps running, stretch after
  stretch, each against the checked stepping from the stretch's starting state; the other runs last
  about a second in a new world each, so they leave out what a long-lived store adds (its redo file
  folded into the SQLite file every 4 MiB, about every 900 commits here; its WAL copied into the
  database file every 5 s, beside the writer; a growing file). event_cost_us: what persistence adds
  per event at 10 Hz, commits and checkpoints included.
- fork_ms: fork the shard at a random recorded tick and materialize the branch in the shard's worker
  process (restore the nearest checkpoint, re-execute the log to the tick), median; fork_log_ms: the
  fork alone (a checkpoint reference and a new log).
- checkpoint_bytes: a stored checkpoint's state row and model patch (median over the run's
  checkpoints).
- replay_exact_rate: of the recorded checkpoints that replays crossed (one from tick 0 over the
  whole run, others from random ticks), the fraction reproduced bit for bit.
- ray_throughput_retention: the walker task's closed-loop evaluation on 2 workers, physics steps/s
  with Ray actors over steps/s with worker processes, each as `evaluate` runs it (worker processes
  are forked per call from the preloaded forkserver; Ray actors are pooled for the session), both
  warm, alternating; the median over pairs of Ray / processes. With few branches the per-call fork
  weighs on the processes; use the full run's figure.

Before measuring, the benchmark freezes the garbage collector's view of the heap after imports and
setup (`gc.freeze()`, as long-running services do), so that collections of torch's and MuJoCo's
import-time objects do not land at random in either measurement. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import sim
from sim import Event
from sim.world._engine import Engine
from sim.world._world_input import mutate_event
from sim.world._worldrows import Checkpoint
from sim.world._worldstore import WorldStore

REGION = """<mujoco model="cell"><option timestep="0.005"/>
  <worldbody><geom name="floor" type="plane" size="200 200 0.1"/></worldbody></mujoco>"""
CRATE = """<mujoco><worldbody><body name="crate" pos="1 0 0.3"><freejoint/>
  <geom type="box" size=".1 .1 .1" mass="2"/></body></worldbody></mujoco>"""
JOINTS = ("hhip", "hknee", "fhip", "fknee")
EVERY, WINDOW = 1000, 200  # ticks between checkpoints, per commit window


def gait(tick: int) -> list[sim.Mutation]:
    return [
        sim.Mutation(f"actuator/walker1/{j}/ctrl", "set", (0.5 * np.sin(0.02 * tick + i),))
        for i, j in enumerate(JOINTS)
    ]


def entities() -> list[sim.Entity]:
    walker = sim.load_task("walker_forward").definition["scene"]
    return [
        sim.Entity("walker1", walker, "cell"),
        sim.Entity("crate", CRATE, "cell", (0.0, 1.0, 0.0)),
    ]


def world(path: Path) -> sim.World:
    return sim.World.create(
        path, {"cell": REGION}, entities(), checkpoint_every=EVERY, backend="inline"
    )


def clock() -> tuple[float, float]:
    """Wall-clock and this thread's CPU seconds (everything of the inline backend runs on it)."""
    return time.perf_counter(), time.thread_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    now = clock()
    return now[0] - start[0], now[1] - start[1]


def persistent(twin: sim.World, ticks: int, period: int) -> tuple[float, float]:
    """Seconds (wall, CPU) to run the twin `ticks` further from its head, a setpoint every `period`
    ticks."""
    first = twin.head("cell")
    setpoints = {tick: gait(tick) for tick in range(first, first + ticks, period)}
    start = clock()
    for window in range(first, first + ticks, WINDOW):
        with twin.batch():  # the window's events, the advance and its checkpoint: one commit
            for tick in range(window, window + WINDOW, period):
                twin.apply("cell", setpoints[tick], at=tick, provenance="setpoint")
            twin.advance(WINDOW)
    return since(start)


def volatile(
    snap: sim.Snapshot, ticks: int, period: int, prebuilt: bool
) -> tuple[tuple[float, float], np.ndarray]:
    """The same stepping from the same state with nothing logged and no checkpoints: the same
    setpoints checked and shaped into events as the engine goes (or, `prebuilt`, before it starts),
    applied by the same engine."""
    first, template = snap.tick, snap.template
    setpoints = {tick: gait(tick) for tick in range(first, first + ticks, period)}
    state = Checkpoint(
        first, template.source_hash, template.model_hash, snap.patch.to_json(), snap.state.tobytes()
    )
    engine = Engine.restore(state, template.xml, sys.maxsize)

    def window_events(window: int) -> list[Event]:
        return [
            Event(tick // period + 1, *mutate_event(template, tick, setpoints[tick], "setpoint"))
            for tick in range(window, window + WINDOW, period)
        ]

    windows = range(first, first + ticks, WINDOW)
    built = {window: window_events(window) for window in windows} if prebuilt else {}
    start = clock()
    for window in windows:
        engine.advance(
            window + WINDOW,
            built[window] if prebuilt else window_events(window),
            lambda checkpoint: None,
        )
    return since(start), engine.row


def overhead(
    tmp: Path, ticks: int, period: int, repeats: int
) -> tuple[float, float, float, float, float, Path]:
    """Rounds of runs, with persistence, then without (checked as it goes, then prebuilt): the
    medians over rounds of (with / without - 1) against each, the same on CPU time against the
    checked run (what other processes loading the machine distort least), the median seconds with
    and without (checked), and the last persistent world. A round's ratio is robust to load that
    drifts between rounds; a ratio of medians is not."""
    on, off, prebuilt = [], [], []
    for rep in range(repeats):
        path = tmp / f"w{period}-{rep}.db"
        with world(path) as twin:
            start = twin.snapshot("cell")
            on.append(persistent(twin, ticks, period))
            final = twin.snapshot("cell")
        for runs, ready in ((off, False), (prebuilt, True)):
            elapsed, row = volatile(start, ticks, period, ready)
            runs.append(elapsed)
            assert row.tobytes() == final.state.tobytes(), "persistence changed the simulation"
    ratio = statistics.median(a[0] / b[0] - 1 for a, b in zip(on, off, strict=True))
    strict = statistics.median(a[0] / b[0] - 1 for a, b in zip(on, prebuilt, strict=True))
    cpu = statistics.median(a[1] / b[1] - 1 for a, b in zip(on, off, strict=True))
    median_on, median_off = (statistics.median(run[0] for run in runs) for runs in (on, off))
    return ratio, strict, cpu, median_on, median_off, path


def long_run(path: Path, ticks: int, period: int, repeats: int) -> float:
    """One twin that keeps running, stretch after stretch, each against the same stepping from the
    stretch's starting state: the median over stretches of (with / without - 1)."""
    ratios = []
    with world(path) as twin:
        for _ in range(repeats):
            start = twin.snapshot("cell")
            elapsed, _ = persistent(twin, ticks, period)
            (without, _), row = volatile(start, ticks, period, False)
            assert row.tobytes() == twin.snapshot("cell").state.tobytes(), (
                "persistence changed the simulation"
            )
            ratios.append(elapsed / without - 1)
    return statistics.median(ratios)


def evaluation_rate(backend: str, branches: int) -> float:
    task, skill = sim.load_task("walker_forward"), sim.load_skill("walker_forward_good")
    start = time.perf_counter()
    result = sim.evaluate(
        task,
        skill,
        branches=branches,
        wave=16,
        workers=2,
        threads=1,
        backend=backend,
        sampler=sim.load_sampler("walker_forward", seed=1),
        progress=False,
    )
    return (
        sum(o.steps for o in result.outcomes)
        * task.control_substeps
        / (time.perf_counter() - start)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run, fewer repetitions")
    args = parser.parse_args()
    ticks, repeats, forks, branches = (20_000, 3, 8, 64) if args.quick else (100_000, 7, 20, 256)
    rng = random.Random(6)
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory() as tmp:
        slow, *_ = overhead(Path(tmp), ticks, 200, repeats)
        fast, strict, cpu, median_on, median_off, path = overhead(Path(tmp), ticks, 20, repeats)
        lasting = long_run(Path(tmp) / "long.db", ticks, 20, repeats)
        # forks, checkpoints and replays of the last run's history, in a worker process
        with sim.World.open(path, backend="process") as world:
            fork_ms, log_ms = [], []
            for _ in range(forks):
                at = rng.randrange(ticks)
                start = time.perf_counter()
                branch = world.fork("cell", at)
                log_ms.append((time.perf_counter() - start) * 1e3)
                branch.snapshot()
                fork_ms.append((time.perf_counter() - start) * 1e3)
            replays = [world.replay("cell", 0, ticks)]
            replays += [
                world.replay("cell", s, min(ticks, s + 5 * EVERY))
                for s in rng.sample(range(ticks), 5)
            ]
        store = WorldStore(path, create=False)  # the world is closed: its store, read directly
        sizes = [
            len(c.state) + len(json.dumps(c.patch)) for c in store.checkpoints("cell", "", 0, ticks)
        ]
        store.close()
        checked = sum(len(r.checked) for r in replays)
        exact = checked - sum(len(r.mismatched) for r in replays)
    # evaluation throughput: worker processes against Ray actors, both warm
    sim.use_ray(num_cpus=2)
    for backend in ("process", "ray"):
        evaluation_rate(backend, 32)
    local, remote = [], []
    for _ in range(repeats):
        local.append(evaluation_rate("process", branches))
        remote.append(evaluation_rate("ray", branches))
    line = {
        "benchmark": "world",
        "quick": args.quick,
        "ticks": ticks,
        "repeats": repeats,
        "persistence_overhead": fast,
        "persistence_overhead_1hz": slow,
        "persistence_overhead_vs_prebuilt": strict,
        "persistence_overhead_cpu": cpu,
        "persistence_overhead_long_run": lasting,
        "steps_per_s_persistent": ticks / median_on,
        "steps_per_s_volatile": ticks / median_off,
        "event_cost_us": (median_on - median_off) / (ticks // 20) * 1e6,
        "checkpoint_every": EVERY,
        "fork_ms": statistics.median(fork_ms),
        "fork_log_ms": statistics.median(log_ms),
        "checkpoint_bytes": statistics.median(sizes),
        "replay_exact_rate": exact / checked,
        "replay_checkpoints_compared": checked,
        "ray_throughput_retention": statistics.median(
            r / lo for r, lo in zip(remote, local, strict=True)
        ),
        "ray_steps_per_s": statistics.median(remote),
        "local_steps_per_s": statistics.median(local),
        "evaluation_branches": branches,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()

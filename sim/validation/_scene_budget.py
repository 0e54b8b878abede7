"""What a task's scene costs to compile and hold, measured before the validator compiles it.

A scene is a few hundred bytes of MJCF that can ask for gigabytes: a heightfield of 40,000 x 40,000
samples, a builtin texture as large, `<size memory="64G"/>` for every simulation, a `<flexcomp>`
grid of millions of bodies. Compiled in the validating site's own process, such a scene took all
the machine's memory (the server with it) or its time. So the validator first compiles each scene
in a child process whose address space is capped at the budget (`max_scene_mb`, on Linux) and
whose run is capped in time (`max_compile_s`), and there makes what an evaluation makes of it: a
`mujoco.batch.Batch` of one wave's simulations on the evaluation's physics threads (a state row
per simulation, an MjData per thread), with the fields a task's runtime binds (`RUNTIME_FIELDS`),
reset and forwarded once; a scene that does not fit is refused, unstarted, naming the limit. (The
check once made one MjData per simulation, which an evaluation never does: 64 of them reserve
850 MB for the shipped arm, 1,070 MB for Talos, and an honest robot was refused.) A re-run of
another site's evaluation record makes as many simulations at once as the record's `layout.wave`,
which the record chooses: a wave over the site's limit (`ValidatorSettings.max_rerun_wave`) is
refused before anything is compiled, and the scene is measured with the record's wave.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .._tasks import RUNTIME_FIELDS
from ..evaluation._evaluate import DEFAULT_WAVE

# The child: read {"scene", "assets", "batches", "threads", "fields"} from stdin, cap the address
# space at what it uses now plus the budget, compile, make each batch an evaluation holds at once
# (rows, on `threads` physics threads) with the fields its runtime binds, reset and forward them,
# print the model's size. Only mujoco and numpy are imported.
_CHILD = r"""
import base64, json, resource, sys
import mujoco
from mujoco import batch as mjbatch
budget = int(sys.argv[1])
job = json.loads(sys.stdin.buffer.read())
try:
    with open("/proc/self/status") as status:
        used = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + budget, used + budget))
except (OSError, StopIteration, ValueError):
    pass  # no /proc (not Linux): the time limit alone
try:
    with mujoco.MjVfs() as vfs:
        for name, data in job["assets"].items():
            vfs[name] = base64.b64decode(data)
        model = mujoco.MjModel.from_xml_string(job["scene"], vfs=vfs)
except MemoryError:
    print(json.dumps({"error": "memory"}))
except Exception as exc:
    text = str(exc)
    memory = any(w in text for w in ("allocate", "unknown exception", "bad_alloc", "memory"))
    print(json.dumps({"error": "memory" if memory else " ".join(text.split())[:300]}))
else:
    try:  # a compiled scene failing here fails for room (a thread, a library's lazy load, arrays)
        held = []
        for rows in job["batches"]:
            batch = mjbatch.Batch(model, rows, 1)
            held += [batch] + [batch.bind(f) for f in job["fields"]]
            batch.reset()
            batch.forward()
        # the other physics threads' data, made here without starting threads: a thread the cap
        # left no room for would fail as no compile error, and a smaller budget pass
        held += [mujoco.MjData(model) for _ in range(job["threads"] - 1)]
    except Exception:
        print(json.dumps({"error": "memory"}))
    else:
        print(json.dumps({"model_bytes": mujoco.mj_sizeModel(model)}))
"""


class SceneOverBudget(Exception):
    """A task's scene needs more memory or time to compile than the site allows."""


class WaveOverBudget(SceneOverBudget):
    """An evaluation record's re-run would step more simulations at once (its `layout.wave`) than
    the site allows: a re-run keeps the recorded wave (the policy sees all of a wave's rows per
    call, so outcomes depend on it), and its memory and work per step grow with it."""


def rerun_wave(record: Any, *, max_wave: int, remedy: str) -> int:
    """The simulations a re-run of an evaluation record steps at once: its `layout.wave` (a wave
    has that many rows even when the record has fewer branches). WaveOverBudget, naming the wave,
    the limit and, in brackets, `remedy`, if it is more than `max_wave`. A record without a
    positive integer wave gives the default wave (64): its re-run refuses it (`check_record`)."""
    layout = record.get("layout") if isinstance(record, dict) else None
    wave = layout.get("wave") if isinstance(layout, dict) else None
    if not isinstance(wave, int) or isinstance(wave, bool) or wave < 1:
        return DEFAULT_WAVE
    if wave > max_wave:
        raise WaveOverBudget(
            f"its evaluation record's layout.wave asks for {wave:,} simulations stepped at once, "
            f"over this site's budget of {max_wave:,} ({remedy})"
        )
    return wave


def probe_replay(probe: Any, record: Any, *, max_wave: int, remedy: str) -> int:
    """The branches `simnet verify` replays of a certificate's probe (`probe["branches"]`, the
    measurement of its worst region, run in waves of up to 64), 0 if it has none or they are not a
    positive integer (the replay refuses it). WaveOverBudget, naming them, the limit and, in
    brackets, `remedy`, if they are more than the record's own branches (`layout.branches`, which
    its outcomes bound) and more than `max_wave`: the probe record carries the number alone, and a
    huge one ran out of memory after the main re-run matched."""
    branches = probe.get("branches") if isinstance(probe, dict) else None
    if not isinstance(branches, int) or isinstance(branches, bool) or branches < 1:
        return 0
    layout = record.get("layout") if isinstance(record, dict) else None
    recorded = layout.get("branches") if isinstance(layout, dict) else None
    limit = max(recorded if isinstance(recorded, int) else 0, max_wave)
    if branches > limit:
        raise WaveOverBudget(
            f"its probe record asks for {branches:,} branches replayed, over this site's budget of "
            f"{limit:,} (the certificate's own branches, or {max_wave:,} if more; {remedy})"
        )
    return branches


def check_scene(
    definition: Mapping[str, Any],
    assets: Mapping[str, bytes],
    *,
    max_mb: int,
    max_s: float,
    wave: int | Sequence[int],
    threads: int = 1,
    remedy: str = "max_scene_mb, max_compile_s in validator.toml: to validate it, raise them, "
    "restart and request the skill",
    what: str | None = None,
) -> None:
    """SceneOverBudget if compiling a task definition's scene (with `assets`) and making what an
    evaluation holds of it takes more than `max_mb` MiB of address space or `max_s` seconds: a batch
    of `wave` simulations (or one batch per number, held at once: refine's episodes and its
    planner's episodes x candidates) stepped on `threads` physics threads (0: all CPUs, as
    `mujoco.batch.Batch` counts them), with the fields a task's runtime binds. Its message names the
    task (or `what` the scene is), the simulations, the limits and, in brackets, `remedy` (how to
    raise them). A scene MuJoCo
    refuses for another reason passes: the task's own compile says what is wrong with it."""
    scene = definition.get("scene")
    if not isinstance(scene, str):
        return  # not a scene: the task refuses it
    batches = [wave] if isinstance(wave, int) else list(wave)
    job = {
        "scene": scene,
        "assets": {n: base64.b64encode(b).decode() for n, b in assets.items()},
        "batches": batches,
        "threads": threads or os.cpu_count() or 1,
        "fields": list(RUNTIME_FIELDS),
    }
    limit = f"this site's budget of {max_mb:,} MiB and {max_s:g} s ({remedy})"
    name = what or f"task {definition.get('name')}: its scene"
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-c", _CHILD, str(max_mb * 2**20)],
            input=json.dumps(job).encode(),
            capture_output=True,
            timeout=max_s,
        )
    except subprocess.TimeoutExpired:
        raise SceneOverBudget(f"{name} did not compile within {limit}") from None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    # killed, or out of memory on the way
    if not isinstance(answer, dict) or answer.get("error") == "memory":
        total = sum(batches)
        simulations = f"{total:,} simulation{'' if total == 1 else 's'}"
        raise SceneOverBudget(f"{name} with {simulations} does not fit in {limit}")

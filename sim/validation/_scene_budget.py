"""What a task's scene costs to compile and hold, measured before the validator compiles it.

A scene is a few hundred bytes of MJCF that can ask for gigabytes: a heightfield of 40,000 x 40,000
samples, a builtin texture as large, `<size memory="64G"/>` for every simulation, a `<flexcomp>`
grid of millions of bodies. Compiled in the validating site's own process, such a scene took all
the machine's memory (the server with it) or its time. So the validator first compiles each scene
in a child process whose address space is capped at the budget (`max_scene_mb`, on Linux) and
whose run is capped in time (`max_compile_s`), making the data of one wave of simulations as an
evaluation does; a scene that does not fit is refused, unstarted, naming the limit. A re-run of
another site's evaluation record makes as many simulations at once as the record's `layout.wave`,
which the record chooses: a wave over the site's limit (`ValidatorSettings.max_rerun_wave`) is
refused before anything is compiled, and the scene is measured with the record's wave.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from ..evaluation._evaluate import DEFAULT_WAVE

# The child: read {"scene", "assets"} from stdin, cap the address space at what it uses now plus
# the budget, compile, make one wave's data, print the sizes. Only mujoco is imported.
_CHILD = r"""
import base64, json, resource, sys
import mujoco
budget, wave = int(sys.argv[1]), int(sys.argv[2])
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
    datas = [mujoco.MjData(model) for _ in range(wave)]
except MemoryError:
    print(json.dumps({"error": "memory"}))
except Exception as exc:
    memory = "allocate" in str(exc) or "unknown exception" in str(exc)
    print(json.dumps({"error": "memory" if memory else " ".join(str(exc).split())[:300]}))
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


def check_scene(
    definition: Mapping[str, Any],
    assets: Mapping[str, bytes],
    *,
    max_mb: int,
    max_s: float,
    wave: int,
    remedy: str = "max_scene_mb, max_compile_s in validator.toml: to validate it, raise them, "
    "restart and request the skill",
) -> None:
    """SceneOverBudget if compiling a task definition's scene (with `assets`) and making `wave`
    simulations' data takes more than `max_mb` MiB of address space or `max_s` seconds; its message
    names the task, the limits and, in brackets, `remedy` (how to raise them). A scene MuJoCo
    refuses for another reason passes: the task's own compile says what is wrong with it."""
    scene = definition.get("scene")
    if not isinstance(scene, str):
        return  # not a scene: the task refuses it
    job = {"scene": scene, "assets": {n: base64.b64encode(b).decode() for n, b in assets.items()}}
    limit = f"this site's budget of {max_mb:,} MiB and {max_s:g} s ({remedy})"
    name = f"task {definition.get('name')}: its scene"
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-c", _CHILD, str(max_mb * 2**20), str(wave)],
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
        simulations = f"{wave:,} simulation{'' if wave == 1 else 's'}"
        raise SceneOverBudget(f"{name} with {simulations} does not fit in {limit}")

"""What carrying a task's scene files by hash costs, against MuJoCo reading them from the disk.

    python benchmarks/task_assets.py [--quick]

A robot of four links whose geoms are meshes (UV spheres written as OBJ, `--vertices` each) in a
directory, its scene loading them through `meshdir`:

- raw: `mujoco.MjModel.from_xml_path(scene)`, MuJoCo reading the scene and its meshes from the disk
  (the baseline);
- from_disk: a `sim.Template` of the scene text compiled from the disk in the robot's directory, as
  a task's scene was before tasks carried their files (unportable; the template's model hash
  included);
- fetch_task: `sim.fetch_task(kb, task_hash)` on a store that holds the task record and its files
  as blobs: read and hash-check every blob, check the scene loads nothing else, compile from memory
  (the template cache is emptied before each run, so every run compiles);
- from_files: `sim.Task.from_files(definition, directory)`, the authoring side: read the files,
  rewrite the scene with portable names, compile it;
- cached: `sim.Task(definition, assets)` again, its template compiled already (what a worker or
  `task.replace` pays: hashing the files).

Every run is cold, as a site's first compile of a task is: MuJoCo's asset cache (which keeps
processed meshes between compiles in one process) is cleared before each. Library and raw runs
alternate and medians are reported. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import mujoco

import knowledge
import sim
from sim import _templates

LINKS = 4


def sphere_obj(vertices: int, radius: float) -> str:
    """A UV sphere of about `vertices` vertices, as OBJ text."""
    rings = max(3, int(math.sqrt(vertices / 2)))
    segments = 2 * rings
    lines = []
    for i in range(rings + 1):
        theta = math.pi * i / rings
        for j in range(segments):
            phi = 2 * math.pi * j / segments
            lines.append(
                f"v {radius * math.sin(theta) * math.cos(phi):.6f} "
                f"{radius * math.sin(theta) * math.sin(phi):.6f} {radius * math.cos(theta):.6f}"
            )
    for i in range(rings):
        for j in range(segments):
            a, b = i * segments + j + 1, i * segments + (j + 1) % segments + 1
            c, d = a + segments, b + segments
            lines.append(f"f {a} {c} {d} {b}")
    return "\n".join(lines) + "\n"


def write_robot(directory: Path, vertices: int) -> Path:
    (directory / "meshes").mkdir(parents=True)
    bodies, assets = "", ""
    for i in range(LINKS):
        (directory / "meshes" / f"link{i}.obj").write_text(sphere_obj(vertices, 0.05 + 0.01 * i))
        assets += f'<mesh name="link{i}" file="link{i}.obj"/>'
        bodies += (
            f'<body name="link{i}" pos="0.12 0 0"><joint name="j{i}" axis="0 0 1"/>'
            f'<geom type="mesh" mesh="link{i}"/>'
        )
    bodies += "</body>" * LINKS
    actuators = "".join(f'<motor joint="j{i}"/>' for i in range(LINKS))
    scene = directory / "scene.xml"
    scene.write_text(
        f'<mujoco model="spheres"><compiler meshdir="meshes"/><asset>{assets}</asset>'
        f"<worldbody>{bodies}</worldbody><actuator>{actuators}</actuator></mujoco>"
    )
    return scene


def definition(scene: Path) -> dict:
    joints = [f"j{i}" for i in range(LINKS)]
    return {
        "format": "simnet.task/1",
        "name": "spheres",
        "embodiment": "spheres",
        "scene": scene.read_text(),
        "keyframe": None,
        "init": [],
        "observation": [{"term": "qpos", "joints": joints}],
        "action": {"mode": "absolute"},
        "reward": [],
        "success": {"when": "end", "all": [{"term": "alive", "above": 0}]},
        "failure": [],
        "horizon": 10,
        "control_substeps": 2,
    }


def ms(run) -> float:
    """Wall time of `run()`, cold: MuJoCo's asset cache emptied first."""
    mujoco.mj_clearCache(mujoco.mj_getCache())
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--vertices", type=int, default=20_000)
    args = parser.parse_args()
    repeats = 3 if args.quick else 15
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scene = write_robot(root / "robot", 2_000 if args.quick else args.vertices)
        task = sim.Task.from_files(definition(scene), scene.parent)
        kb = knowledge.open(root / "site.db", knowledge.Identity.generate())
        task_hash = sim.publish_task(kb, task)
        raw, disk, fetched, bundled, cached = [], [], [], [], []
        text = scene.read_text()

        def from_disk() -> None:
            here = os.getcwd()
            os.chdir(scene.parent)
            try:
                _templates.Template(text)
            finally:
                os.chdir(here)

        def fetch() -> None:
            _templates._CACHE.clear()  # compile every time, as a fresh process would
            sim.fetch_task(kb, task_hash)

        for _ in range(repeats):
            raw.append(ms(lambda: mujoco.MjModel.from_xml_path(str(scene))))
            disk.append(ms(from_disk))
            fetched.append(ms(fetch))
            bundled.append(ms(lambda: sim.Task.from_files(definition(scene), scene.parent)))
            cached.append(ms(lambda: sim.Task(task.to_json(), dict(task.assets))))
        kb.close()
    raw_ms, fetch_ms = statistics.median(raw), statistics.median(fetched)
    disk_ms = statistics.median(disk)
    bundle_ms = statistics.median(bundled)
    print(
        json.dumps(
            {
                "benchmark": "task_assets",
                "files": LINKS,
                "asset_bytes": sum(len(b) for b in task.assets.values()),
                "mesh_vertices": int(task.template.model.nmeshvert),
                "repeats": repeats,
                "raw_from_xml_path_ms_p50": round(raw_ms, 2),
                "from_disk_template_ms_p50": round(disk_ms, 2),
                "fetch_task_ms_p50": round(fetch_ms, 2),
                "ratio_to_raw": round(fetch_ms / raw_ms, 3),
                "ratio_to_from_disk": round(fetch_ms / disk_ms, 3),
                "from_files_ms_p50": round(bundle_ms, 2),
                "from_files_ratio_to_raw": round(bundle_ms / raw_ms, 3),
                "cached_task_ms_p50": round(statistics.median(cached), 3),
            }
        )
    )


if __name__ == "__main__":
    main()

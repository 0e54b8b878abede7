"""The project's own tasks and skills, shipped as package data under sim/assets."""

from __future__ import annotations

import json
from importlib import resources

from ._mlp import Policy
from ._patches import Sampler
from ._tasks import Task

_ASSETS = resources.files("sim") / "assets"


def shipped_tasks() -> list[str]:
    return sorted(
        p.name.removesuffix(".json")
        for p in (_ASSETS / "tasks").iterdir()
        if p.name.endswith(".json")
    )


def load_task(name: str) -> Task:
    """A shipped task by name ("arm_reach", "walker_forward", "arm_push"); its scene is inlined
    into the definition."""
    path = _ASSETS / "tasks" / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no shipped task {name!r}; shipped: {shipped_tasks()}")
    data = json.loads(path.read_text())
    data["scene"] = (_ASSETS / "scenes" / data.pop("scene_file")).read_text()
    return Task(data)


def shipped_skills() -> list[str]:
    return sorted(
        p.name.removesuffix(".json")
        for p in (_ASSETS / "skills").iterdir()
        if p.name.endswith(".json")
    )


def load_skill(name: str) -> Policy:
    """The policy of a shipped skill, by name ("arm_reach_good", "walker_forward_degraded")."""
    path = _ASSETS / "skills" / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no shipped skill {name!r}; shipped: {shipped_skills()}")
    with (
        resources.as_file(path) as spec,
        resources.as_file(_ASSETS / "skills" / f"{name}.safetensors") as weights,
    ):
        return Policy.load(spec, weights)


def load_sampler(task: str, seed: int = 0) -> Sampler:
    """The project's standard dynamics randomization for a shipped task, with the given seed."""
    path = _ASSETS / "samplers" / f"{task}.json"
    if not path.is_file():
        raise KeyError(f"no shipped sampler for task {task!r}")
    data = json.loads(path.read_text())
    data["seed"] = seed
    return Sampler.from_json(data)

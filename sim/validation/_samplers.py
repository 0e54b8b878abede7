"""The dynamics randomization a validator applies to a task it has no sampler of its own for."""

from __future__ import annotations

from collections.abc import Iterable

import mujoco

from .._errors import SamplerSpecError
from .._patches import Sampler, SamplerTerm, expand_targets
from .._tasks import Task

# kind -> (MuJoCo object kind, field, scale range): moderate, physically plausible spreads
SPREADS = {
    "mass": ("body", "mass", 0.8, 1.2),
    "friction": ("geom", "friction", 0.7, 1.3),
    "damping": ("joint", "damping", 0.7, 1.3),
    "gain": ("actuator", "gain", 0.9, 1.1),
}


def fleet_sampler(task: Task, seed: int, kinds: Iterable[str] = tuple(SPREADS)) -> Sampler:
    """Scale each named object's `kinds` of dynamics uniformly around the task's scene, per branch.

    Only objects it can scale are named: bodies with mass (a massless or mocap body must stay so),
    and named geoms, joints and actuators. A kind with nothing to scale in the scene is left out.
    """
    model = task.template.model
    terms = []
    for kind in kinds:
        obj, field, low, high = SPREADS[kind]
        for target in _targets(task, obj, field):
            if obj == "body" and model.body(target.split("/")[1]).mass[0] <= 0:
                continue
            term = SamplerTerm(target, "scale", "uniform", (low, high))
            try:
                expand_targets(term, task.template, "fleet sampler")
            except SamplerSpecError:
                continue
            terms.append(term)
    return Sampler(tuple(terms), seed)


def _targets(task: Task, obj: str, field: str) -> list[str]:
    """Each named object's `field`; an unnamed actuator through the joint it drives."""
    model = task.template.model
    count = {"body": model.nbody, "geom": model.ngeom, "joint": model.njnt, "actuator": model.nu}
    out = []
    for i in range(count[obj]):
        name = getattr(model, obj)(i).name
        if name and name != "world":
            out.append(f"{obj}/{name}/{field}")
        elif obj == "actuator" and model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT:
            joint = model.joint(int(model.actuator_trnid[i, 0])).name
            if joint:
                out.append(f"actuator@joint/{joint}/{field}")
    return out

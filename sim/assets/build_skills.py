"""Rebuild the shipped skills (sim/assets/skills/*.json + .safetensors) from their controllers.

    python -m sim.assets.build_skills

The controllers here are local code; what ships is data. The walker's gait is a central pattern
generator, exactly affine in the task's clock observation, so its skill is an MLP with no hidden
layer. The arm's expert is a damped least-squares Jacobian controller, nonlinear in the joint
angles, so its skill is an MLP distilled from it by DAgger; the degraded arm skill is a fixed
Jacobian-transpose controller from the home pose with too high a gain.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np

from sim import MLPSpec, Policy, load_sampler, load_task
from sim.evaluation import distill

SKILLS = Path(__file__).resolve().parent / "skills"
# the walker's gait: ctrl_j = amplitude_j * sin(2 pi t / 0.5 + phase_j) + offset_j
AMPLITUDE = np.array([0.76, 0.51, 0.23, 0.33])
PHASE = np.array([-2.57, -1.05, 1.16, 0.57])
OFFSET = np.array([0.13, -0.04, -0.31, -0.16])
ARM_STEP = 0.15  # largest joint-target change per control step


def walker_skill(scale: float, note: str) -> Policy:
    spec = MLPSpec(obs_dim=11, act_dim=4, hidden=(), activation="tanh", output_activation=None)
    weight = np.zeros((4, 11))
    weight[:, 0] = scale * AMPLITUDE * np.cos(PHASE)  # coefficient of sin(wt)
    weight[:, 1] = scale * AMPLITUDE * np.sin(PHASE)  # coefficient of cos(wt)
    return Policy.from_tensors(
        spec,
        {
            "layers.0.weight": weight,
            "layers.0.bias": OFFSET,
            "obs_mean": np.zeros(11),
            "obs_std": np.ones(11),
            "act_offset": np.zeros(4),
            "act_scale": np.ones(4),
        },
        {"task": "walker_forward", "note": note},
    )


def arm_expert(
    model: mujoco.MjModel, gain: float = 0.3, damping: float = 0.05
) -> Callable[[np.ndarray], np.ndarray]:
    """Damped least-squares step towards the target: the controller the arm skill imitates."""
    data = mujoco.MjData(model)
    site = model.site("ee").id

    def act(obs: np.ndarray) -> np.ndarray:
        out = np.zeros((len(obs), model.nu))
        jac = np.zeros((3, model.nv))
        for row, o in enumerate(obs):
            data.qpos[:] = o[:7]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, jac, None, site)
            dq = jac.T @ np.linalg.solve(jac @ jac.T + damping**2 * np.eye(3), o[14:17])
            out[row] = np.clip(gain * dq, -ARM_STEP, ARM_STEP)
        return out

    return act


def arm_degraded(model: mujoco.MjModel, gain: float = 2.0) -> Policy:
    """Jacobian transpose frozen at the home pose, overdriven: right near home, wrong further
    out."""
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_forward(model, data)
    jac = np.zeros((3, model.nv))
    mujoco.mj_jacSite(model, data, jac, None, model.site("ee").id)
    weight = np.zeros((7, 17))
    weight[:, 14:17] = gain * jac.T / ARM_STEP
    spec = MLPSpec(obs_dim=17, act_dim=7, hidden=(), activation="tanh", output_activation="tanh")
    return Policy.from_tensors(
        spec,
        {
            "layers.0.weight": weight,
            "layers.0.bias": np.zeros(7),
            "obs_mean": np.zeros(17),
            "obs_std": np.ones(17),
            "act_offset": np.zeros(7),
            "act_scale": np.full(7, ARM_STEP),
        },
        {"task": "arm_reach", "note": "fixed home-pose Jacobian transpose, gain too high"},
    )


def main() -> None:
    SKILLS.mkdir(exist_ok=True)
    walker_skill(1.0, "central pattern generator gait").save(SKILLS / "walker_forward_good.json")
    walker_skill(0.85, "the same gait at 85% amplitude").save(
        SKILLS / "walker_forward_degraded.json"
    )
    arm = load_task("arm_reach")
    arm_degraded(arm.template.model).save(SKILLS / "arm_reach_degraded.json")
    good = distill(
        arm,
        arm_expert(arm.template.model),
        sampler=load_sampler("arm_reach", seed=1000),
        branches=128,
        iterations=5,
        hidden=(64, 64),
        act_bound=ARM_STEP,
        epochs=3000,
    )
    Policy(
        good.spec,
        good.weights,
        {
            "task": "arm_reach",
            "note": "MLP distilled by DAgger from a damped least-squares Jacobian controller",
        },
    ).save(SKILLS / "arm_reach_good.json")


if __name__ == "__main__":
    main()

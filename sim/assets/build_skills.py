"""Rebuild the shipped skills (sim/assets/skills/*.json + .safetensors) from their controllers.

    python -m sim.assets.build_skills [arm_reach walker_forward arm_push]

The controllers here are local code; what ships is data. The walker's gait is a central pattern
generator, exactly affine in the task's clock observation, so its skill is an MLP with no hidden
layer. The arm's expert is a damped least-squares Jacobian controller, nonlinear in the joint
angles, so its skill is an MLP distilled from it by DAgger; the degraded arm skill is a fixed
Jacobian-transpose controller from the home pose with too high a gain. The pusher's expert is a
scripted push (go behind the puck on the goal line, detouring around it, then push through it
while steering back onto the line), distilled by DAgger too; its degraded skill is the same MLP
detuned (see `push_degraded`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
import safetensors.torch

from sim import MLPSpec, Policy, load_sampler, load_task
from sim.evaluation import distill

SKILLS = Path(__file__).resolve().parent / "skills"
# the walker's gait: ctrl_j = amplitude_j * sin(2 pi t / 0.5 + phase_j) + offset_j
AMPLITUDE = np.array([0.76, 0.51, 0.23, 0.33])
PHASE = np.array([-2.57, -1.05, 1.16, 0.57])
OFFSET = np.array([0.13, -0.04, -0.31, -0.16])
ARM_STEP = 0.15  # largest joint-target change per control step
PUSH_STEP = 0.08  # the pusher's largest joint-target change per control step
PUSH_DETUNE = 0.35  # the degraded push skill's step scale
PUSH_CLEARANCE = 0.03 + 0.012 + 0.006  # puck radius + pusher radius + a margin (m)


def walker_skill(scale: float, note: str) -> Policy:
    weight = np.zeros((4, 11))
    weight[:, 0] = scale * AMPLITUDE * np.cos(PHASE)  # coefficient of sin(wt)
    weight[:, 1] = scale * AMPLITUDE * np.sin(PHASE)  # coefficient of cos(wt)
    return Policy.linear(weight, OFFSET, {"task": "walker_forward", "note": note})


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


def push_expert(model: mujoco.MjModel, gain: float = 0.5) -> Callable[[np.ndarray], np.ndarray]:
    """The scripted push on arm_push's observation (joint positions, velocities, controls, tip to
    puck, puck to goal): a tip target relative to the puck, reached by damped least squares."""
    data = mujoco.MjData(model)
    site = model.site("tip").id
    clear = PUSH_CLEARANCE

    def act(obs: np.ndarray) -> np.ndarray:
        out = np.zeros((len(obs), model.nu))
        jac = np.zeros((3, model.nv))
        for row, o in enumerate(obs):
            to_puck, to_goal = o[6:8], o[9:11]
            line = to_goal / max(float(np.linalg.norm(to_goal)), 1e-6)
            normal = np.array([-line[1], line[0]])
            along, beside = -to_puck @ line, -to_puck @ normal  # the tip, relative to the puck
            if along < -0.7 * clear and abs(beside) < 0.02:  # behind it, on the line: push
                move = to_puck - line * (clear - 0.04) - normal * beside
            else:  # to the push point behind the puck, wide of it while beside or in front
                side = np.sign(beside) if abs(beside) > 1e-3 else 1.0
                wide = np.clip((along + clear) / clear, 0.0, 1.0)
                move = to_puck - line * (clear + 0.015) + normal * side * (clear + 0.02) * wide
            data.qpos[:2] = o[0:2]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, jac, None, site)
            planar = jac[:2, :2]
            step = planar.T @ np.linalg.solve(planar @ planar.T + 0.02**2 * np.eye(2), gain * move)
            out[row] = np.clip(step, -PUSH_STEP, PUSH_STEP)
        return out

    return act


def push_degraded(good: Policy) -> Policy:
    """The good push skill detuned: its steps scaled to a third, so it pushes too slowly to reach
    the far goals in time."""
    tensors = safetensors.torch.load(good.weights)
    tensors["act_scale"] = tensors["act_scale"] * PUSH_DETUNE
    return Policy.from_tensors(
        good.spec,
        tensors,
        {"task": "arm_push", "note": f"the good push MLP with its steps scaled by {PUSH_DETUNE}"},
    )


def build_walker() -> None:
    walker_skill(1.0, "central pattern generator gait").save(SKILLS / "walker_forward_good.json")
    walker_skill(0.85, "the same gait at 85% amplitude").save(
        SKILLS / "walker_forward_degraded.json"
    )


def distilled(
    task_name: str,
    expert: Callable[[mujoco.MjModel], Callable[[np.ndarray], np.ndarray]],
    iterations: int,
    act_bound: float,
    note: str,
) -> Policy:
    """A 64x64 MLP distilled by DAgger from `expert` on the task's standard randomization."""
    task = load_task(task_name)
    good = distill(
        task,
        expert(task.template.model),
        sampler=load_sampler(task_name, seed=1000),
        branches=128,
        iterations=iterations,
        hidden=(64, 64),
        act_bound=act_bound,
        epochs=3000,
    )
    return Policy(good.spec, good.weights, {"task": task_name, "note": note})


def build_arm() -> None:
    arm_degraded(load_task("arm_reach").template.model).save(SKILLS / "arm_reach_degraded.json")
    note = "MLP distilled by DAgger from a damped least-squares Jacobian controller"
    distilled("arm_reach", arm_expert, 5, ARM_STEP, note).save(SKILLS / "arm_reach_good.json")


def build_push() -> None:
    note = "MLP distilled by DAgger from a scripted push controller"
    pusher = distilled("arm_push", push_expert, 6, PUSH_STEP, note)
    pusher.save(SKILLS / "arm_push_good.json")
    push_degraded(pusher).save(SKILLS / "arm_push_degraded.json")


BUILDS = {"walker_forward": build_walker, "arm_reach": build_arm, "arm_push": build_push}


def main(tasks: list[str]) -> None:
    """Rebuild the skills of the named tasks (all of them if none are named)."""
    SKILLS.mkdir(exist_ok=True)
    for task in tasks or list(BUILDS):
        BUILDS[task]()


if __name__ == "__main__":
    main(sys.argv[1:])

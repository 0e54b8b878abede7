"""Native skills: each body's own skill for a task family, computed on that body alone and expressed
as data (a linear `MLPSpec`, hidden=()).

Both families aim the joints at targets that are an affine function of the goal: q* = A goal + c.
A position servo is sent its target (times its gear); a motor gets a PD law around it, closed by the
policy itself, tau = kp (q* - q) - kd dq (+ the torque that holds the arm against gravity where
the body does not compensate it), over its gear; a velocity servo (a wheel) is told to stand still.
The gains come from the body's own joint-space inertia (arms) or efforts (legs), so a skill made
for one mass and inertia may be too soft or too stiff, even unstable, on another body.

- reach (anything with an arm): A is an inverse-kinematics map. Goals are sampled in the task's
  box around the home tool position and solved by damped least squares on the body's own model (the
  first arm's joints only); A is fitted to the solutions (least squares). There is no feedback on
  the tool: on another arm the skill works as far as that arm's kinematics, gear and dynamics agree.
- posture (anything that stands): A maps the goal heights of the torso's two ends to joint angles.
  Each sampled goal is solved by the body's own leg geometry (torso pitch and height from the goal,
  feet staying where they stand: two-link inverse kinematics per planar leg, damped least squares on
  the model for a 3D body, flat feet kept flat), then corrected on the body's own model: the pose is
  held with the skill's own control law until it settles, and what it missed (sag under gravity,
  feet slipping) corrects the aim it is solved for by Broyden's method, the best of five tries kept.
  On another body it works as far as that body's legs (lengths, knee direction, limits), gear,
  stiffness and masses agree.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from .._mlp import Policy
from ._families import POSTURE_RANGE
from ._robot import Robot

_REACH_BANDWIDTH = 2 * math.pi * 1.5
"""Natural frequency (rad/s) of a motor arm's PD law, critically damped: slow enough for the
reach task's 25 Hz control, fast enough to settle in its 1.2 s."""
_LEG_STIFFNESS = 0.15
"""A standing body's PD law reaches its joint's effort at this error (radians)."""


def _kinds(model: mujoco.MjModel) -> list[str]:
    """Each actuator's kind, by its bias: position servo, velocity servo or motor."""
    out = []
    for k in range(model.nu):
        affine = model.actuator_biastype[k] == mujoco.mjtBias.mjBIAS_AFFINE
        if affine and model.actuator_biasprm[k, 1] != 0:
            out.append("position")
        elif affine and model.actuator_biasprm[k, 2] != 0:
            out.append("velocity")
        else:
            out.append("motor")
    return out


class _Law:
    """The control law q* = A goal + c made concrete for one body: per actuator either a servo
    target or a PD law (see the module doc)."""

    def __init__(self, robot: Robot, model: mujoco.MjModel, family: str) -> None:
        self.model, self.n = model, len(robot.joints)
        self.kinds = _kinds(model)
        self.gear = np.array(robot.gear)
        self.dofs = np.array([model.joint(j).dofadr[0] for j in robot.joints])
        self.address = np.array([model.joint(j).qposadr[0] for j in robot.joints])
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        inertia = np.zeros((model.nv, model.nv))
        mujoco.mj_fullM(model, data, inertia)
        # the inertia a joint moves when nothing else holds (the least it may see): what its
        # loop must stay stable on
        own = 1.0 / np.diag(np.linalg.inv(inertia))[self.dofs]
        self.hold = np.zeros(self.n)
        if family == "reach":
            self.kp = own * _REACH_BANDWIDTH**2
            self.kd = 2 * own * _REACH_BANDWIDTH
            # what gravity asks of the joints at home, where no gravcomp carries the body
            self.hold = (data.qfrc_bias - data.qfrc_gravcomp)[self.dofs]
        else:  # stiff enough to carry the body, damped as the joint's own inertia allows
            effort = np.abs(model.actuator_ctrlrange[:, 1] * model.actuator_gear[:, 0])
            self.kp = effort / _LEG_STIFFNESS
            period = model.opt.timestep  # these bodies close the loop at every physics step
            self.kd = np.minimum(2 * np.sqrt(self.kp * own), 0.5 * own / period)
        self.motor = np.array([k == "motor" for k in self.kinds])
        self.servo = np.array([k == "position" for k in self.kinds])

    def policy(
        self, obs_dim: int, goal_columns: list[int], a: np.ndarray, c: np.ndarray, note: str
    ) -> Policy:
        """The linear policy of this law for q* = a @ goal + c (a: (joints, goals))."""
        n, gear = self.n, self.gear
        weight, bias = np.zeros((n, obs_dim)), np.zeros(n)
        servo, motor = self.servo, self.motor
        weight[np.ix_(servo, np.array(goal_columns))] = gear[servo, None] * a[servo]
        bias[servo] = gear[servo] * c[servo]
        rows = np.flatnonzero(motor)
        scale = 1.0 / gear[rows]
        weight[np.ix_(rows, np.array(goal_columns))] = (scale * self.kp[rows])[:, None] * a[rows]
        weight[rows, rows] = -scale * self.kp[rows]
        weight[rows, n + rows] = -scale * self.kd[rows]
        bias[rows] = scale * (self.kp[rows] * c[rows] + self.hold[rows])
        return Policy.linear(weight, bias, {"note": note})

    def control(self, data: mujoco.MjData, target: np.ndarray) -> None:
        """Set the controls that hold `target` (joint angles) now."""
        q, dq = data.qpos[self.address], data.qvel[self.dofs]
        torque = self.kp * (target - q) - self.kd * dq + self.hold
        data.ctrl[:] = np.where(self.servo, self.gear * target, 0.0)
        data.ctrl[self.motor] = (torque / self.gear)[self.motor]


def reach_skill(robot: Robot, samples: int = 200) -> Policy:
    """Fit the linear inverse-kinematics map of an arm over its task's goal box (see the module
    doc)."""
    task = robot.task("reach")
    model = task.template.model
    data = mujoco.MjData(model)
    law = _Law(robot, model, "reach")
    arm = np.array([s.joint < 100 for s in robot.slots])  # the first arm; other parts hold
    home = np.array(robot.home)
    address, dofs = law.address[arm], law.dofs[arm]
    box = task.definition["init"][0]  # the goal's offsets from the home tool position
    offsets = np.random.default_rng(0).uniform(box["low"], box["high"], (samples, 3))
    tool, jac = model.site("ee").id, np.zeros((3, model.nv))
    solutions = []
    for offset in offsets:
        data.qpos[address] = home[arm]
        mujoco.mj_kinematics(model, data)
        goal = data.site_xpos[tool] + offset
        for _ in range(30):
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, jac, None, tool)
            columns = jac[:, dofs]
            error = goal - data.site_xpos[tool]
            data.qpos[address] += columns.T @ np.linalg.solve(
                columns @ columns.T + 0.05**2 * np.eye(3), error
            )
        solutions.append(data.qpos[address] - home[arm])
    ik = np.zeros((len(arm), 3))
    ik[arm] = np.linalg.lstsq(offsets, np.array(solutions), rcond=None)[0].T  # (joints, 3)
    n = len(robot.joints)
    return law.policy(
        task.obs_dim,
        [2 * n, 2 * n + 1, 2 * n + 2],
        ik,
        home,
        f"linear inverse kinematics of {robot.name}",
    )


def _leg_pose(model: mujoco.MjModel, robot: Robot, aim: np.ndarray) -> np.ndarray:
    """Joint angles that put the torso's ends `aim[:2]` (front, back) above where they start and the
    torso `aim[2]` ahead of where it starts, every foot staying where it stands: the torso's pitch
    and height from the aim, then each leg's own two-link inverse kinematics, its knee bent the way
    its range allows."""
    front, back = model.site("front").pos[0], model.site("back").pos[0]
    pitch = math.asin(float(np.clip((aim[1] - aim[0]) / (front - back), -1, 1)))
    centre = model.body("torso").pos[2] + aim[0] + front * math.sin(pitch)
    angles = np.zeros(len(robot.joints))
    for hip, knee in _legs(robot):
        thigh, shin = (model.joint(robot.joints[k]).bodyid[0] for k in (hip, knee))
        foot = next(g for g in range(model.ngeom) if model.geom_bodyid[g] == shin)
        upper, lower = (
            float(np.linalg.norm(model.body_pos[shin])),
            2 * float(model.geom_size[foot, 1]),
        )
        x = model.body_pos[thigh][0]
        reach = np.array(
            [
                x * math.cos(pitch) - x + aim[2],  # foot behind the hip by this much
                centre - x * math.sin(pitch) - model.geom_size[foot, 0],
            ]
        )
        span = min(float(np.linalg.norm(reach)), upper + lower - 1e-6)
        lean = math.acos(np.clip((upper**2 + span**2 - lower**2) / (2 * upper * span), -1, 1))
        bend = math.asin(np.clip(upper * math.sin(lean) / lower, -1, 1))
        low, high = model.jnt_range[model.joint(robot.joints[knee]).id]
        sign = 1.0 if -low > high else -1.0  # the knee bends the way its range is wider
        direction = math.atan2(reach[0], reach[1])
        angles[hip], angles[knee] = direction + sign * lean - pitch, -sign * (lean + bend)
    return angles


def _legs(robot: Robot) -> list[tuple[int, int]]:
    """(hip, knee) actuator indices of each leg."""
    knees = {s.limb: k for k, s in enumerate(robot.slots) if s.joint == 1}
    return [(k, knees[s.limb]) for k, s in enumerate(robot.slots) if s.joint == 0]


def _loaded(model: mujoco.MjModel, data: mujoco.MjData, inertia: np.ndarray) -> np.ndarray:
    """Per degree of freedom, the inertia it moves while the feet stay planted: a leg joint carries
    the body (the free base follows the joints so that the feet do not move), an arm only itself.
    Zero for the base's own six."""
    rows = []
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    mujoco.mj_kinematics(model, data)
    mujoco.mj_comPos(model, data)
    for i in range(4):
        if _has_site(model, f"foot{i}"):
            site = model.site(f"foot{i}").id
            mujoco.mj_jacSite(model, data, jacp, jacr, site)
            rows += [jacp.copy()] + ([jacr.copy()] if _flat(model, site) else [])
    contact = np.vstack(rows)
    follow = -np.linalg.pinv(contact[:, :6]) @ contact[:, 6:]
    carried = np.vstack([follow, np.eye(model.nv - 6)])
    return np.concatenate([np.zeros(6), np.diag(carried.T @ inertia @ carried)])


def _floating(model: mujoco.MjModel) -> bool:
    return model.njnt > 0 and model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE


def _leg_pose_3d(model: mujoco.MjModel, robot: Robot, aim: np.ndarray) -> np.ndarray:
    """`_leg_pose` for a floating 3D body: the torso placed by the aim (pitch about y, height,
    forward), then every leg joint solved at once by damped least squares so that each foot site
    stays where it stands (and a flat foot stays flat)."""
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    feet = [model.site(f"foot{i}").id for i in range(4) if _has_site(model, f"foot{i}")]
    where = data.site_xpos[feet].copy()
    flat = [_flat(model, f) for f in feet]
    half = float(model.site("front").pos[0])
    pitch = math.asin(float(np.clip((aim[1] - aim[0]) / (2 * half), -1, 1)))
    data.qpos[0] += aim[2]
    data.qpos[2] += (aim[0] + aim[1]) / 2
    data.qpos[3:7] = [math.cos(pitch / 2), 0.0, math.sin(pitch / 2), 0.0]
    legs = [s.joint < 100 for s in robot.slots]
    dofs = np.array(
        [model.joint(j).dofadr[0] for j, leg in zip(robot.joints, legs, strict=True) if leg]
    )
    address = np.array(
        [model.joint(j).qposadr[0] for j, leg in zip(robot.joints, legs, strict=True) if leg]
    )
    joints = [model.joint(j).id for j, leg in zip(robot.joints, legs, strict=True) if leg]
    free = ~model.jnt_limited[joints].astype(bool)  # continuous joints: no stops to clip at
    low = np.where(free, -np.inf, model.jnt_range[joints, 0])
    high = np.where(free, np.inf, model.jnt_range[joints, 1])
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    for _ in range(40):
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        rows, errors = [], []
        for site, goal, keep in zip(feet, where, flat, strict=True):
            mujoco.mj_jacSite(model, data, jacp, jacr, site)
            rows.append(jacp[:, dofs].copy())
            errors.append(goal - data.site_xpos[site])
            if keep:  # rotate the foot back to level: the error is its z axis against world z
                rows.append(jacr[:, dofs].copy())
                errors.append(np.cross(data.site_xmat[site].reshape(3, 3)[:, 2], [0.0, 0.0, 1.0]))
        jac, error = np.vstack(rows), np.concatenate(errors)
        step = jac.T @ np.linalg.solve(jac @ jac.T + 0.02**2 * np.eye(len(error)), error)
        data.qpos[address] = np.clip(data.qpos[address] + step, low, high)
    angles = np.zeros(len(robot.joints))
    angles[np.array(legs)] = data.qpos[address]
    return angles


def _has_site(model: mujoco.MjModel, name: str) -> bool:
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, name) >= 0


def _flat(model: mujoco.MjModel, site: int) -> bool:
    """Whether the foot at this site is a sole (a box) rather than a point foot."""
    body = model.site_bodyid[site]
    return any(
        model.geom_type[g] == mujoco.mjtGeom.mjGEOM_BOX and model.geom_contype[g]
        for g in range(model.ngeom)
        if model.geom_bodyid[g] == body
    )


def posture_skill(robot: Robot, samples: int = 32, corrections: int = 4) -> Policy:
    """Fit the linear map from goal heights to joint angles of a legged body (see the module doc).

    Each sampled goal is solved by `_leg_pose`, then corrected on the body's own model by Broyden's
    method: the pose is held with the body's own law until it settles, and what it missed (height
    of each end, the torso's drift forward) moves the aim it is solved for; the best aim found is
    kept. So the skill offsets its own sag under gravity and the slip of its feet.
    """
    task = robot.task("posture")
    model = task.template.model
    data = mujoco.MjData(model)
    law = _Law(robot, model, "posture")
    pose = _leg_pose_3d if _floating(model) else _leg_pose
    ends = [model.site(end).id for end in ("front", "back")]
    homes = np.array([model.site(f"home_{end}").pos for end in ("front", "back")])
    horizon, substeps = task.definition["horizon"], task.definition["control_substeps"]
    servos = bool(law.servo.all())

    def settle(aim: np.ndarray) -> np.ndarray:
        """Where the pose solved for `aim` takes the torso: (front height, back height, forward
        drift)."""
        mujoco.mj_resetData(model, data)
        target = pose(model, robot, aim)
        if servos:  # one control for the whole hold, as a servo needs
            data.ctrl[:] = law.gear * target
            mujoco.mj_step(model, data, nstep=horizon * substeps)
        else:
            for _ in range(horizon):
                law.control(data, target)
                mujoco.mj_step(model, data, nstep=substeps)
        moved = data.site_xpos[ends] - homes
        return np.array([moved[0, 2], moved[1, 2], moved[:, 0].mean()])

    low, high = np.array(POSTURE_RANGE) * robot.size
    goals = np.random.default_rng(0).uniform(low, high, (samples, 2))
    if len(task.definition["init"]) and task.definition["init"][0]["target"] == "body/goal/pos":
        goals[:, 1] = goals[:, 0]  # both ends go down together
    poses = []
    for goal in goals:
        want = np.array([*goal, 0.0])
        aim, jacobian = want.copy(), np.eye(3)
        reached = settle(aim)
        best = (np.linalg.norm(want - reached), aim)
        for _ in range(corrections):
            step = np.linalg.lstsq(jacobian, want - reached, rcond=None)[0]
            aim = aim + step
            moved, reached = -reached, settle(aim)
            moved += reached
            jacobian += np.outer(moved - jacobian @ step, step) / max(step @ step, 1e-12)
            best = min(best, (np.linalg.norm(want - reached), aim), key=lambda pair: pair[0])
        poses.append(pose(model, robot, best[1]))
    fit = np.linalg.lstsq(np.column_stack([goals, np.ones(samples)]), np.array(poses), rcond=None)[
        0
    ]  # (3, joints)
    n = len(robot.joints)
    return law.policy(
        task.obs_dim,
        [2 * n + 2, 2 * n + 5],
        fit[:2].T,
        fit[2],  # the z of each goal offset
        f"posture map of {robot.name}, corrected on its own model",
    )

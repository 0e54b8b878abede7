"""Robot bodies for transfer experiments: procedural arms and legged bodies from a seed, the shipped
models, and populations of them with the bodies shaped like real robots (`_manipulators`,
`_standing`).

A `Robot` (`_robot`) is a scene (the body plus what its task needs: a floor; a home marker and a
goal for an arm; markers at the torso's ends, where they start and where they should go, for a
legged body) and the body's skill interface: its actuated joints, each placed by a `Slot`.

Arms follow one of three kinematic patterns (articulated, anthropomorphic, with a roll joint), with
3-7 hinge joints, the home posture built into the link frames (qpos 0 is home), gravity compensation
and position actuators; their task family is "reach" (bring the tool to a goal near home). Legged
bodies are planar: a torso on slide-slide-hinge root joints and 2-6 legs of thigh and shin, position
actuators at hips and knees; their task family is "posture" (crouch until the torso's front and back
ends are at goal heights, which sets its height and pitch, and hold still there). Every number comes
from the seed: the same seed gives the same MJCF text.
"""

from __future__ import annotations

import math
from importlib import resources

import mujoco
import numpy as np

from . import _manipulators, _standing
from ._families import posture_markers
from ._robot import _AXES, Robot, Slot, _conditioning, _f, _quat

# kinematic patterns of arms: joint axes from the base, nominal link proportions, home bends
# (radians)
_ARM_PATTERNS = (
    ("zyyyzyz", (1.0, 1.2, 1.0, 0.6, 0.5, 0.4, 0.3), (0.0, 0.5, 1.2, 0.8, 0.0, 0.6, 0.0)),
    ("zyzyzyz", (1.0, 1.0, 0.9, 0.9, 0.6, 0.4, 0.3), (0.0, 0.5, 0.0, 1.4, 0.0, 0.9, 0.0)),
    ("zyyxyzy", (0.8, 1.3, 1.1, 0.5, 0.5, 0.4, 0.3), (0.0, 0.4, 1.3, 0.0, 0.7, 0.0, 0.5)),
)


def procedural_arm(seed: int) -> Robot:
    """A procedural arm: pattern, dof (3-7), reach, proportions, home bends, masses, limits,
    gear."""
    rng = np.random.default_rng([seed, 1])
    pattern, nominal, bends = _ARM_PATTERNS[int(rng.integers(len(_ARM_PATTERNS)))]
    n = int(
        rng.integers(4 if pattern[2] == "z" else 3, 8)
    )  # a roll third joint needs a fourth to reach in 3D
    axes = pattern[:n]
    reach = float(np.exp(rng.uniform(math.log(0.55), math.log(1.1))))
    weights = np.array(nominal[:n]) * rng.uniform(0.8, 1.25, n)
    lengths = reach * weights / weights.sum()
    gear = float(np.exp(rng.uniform(math.log(0.75), math.log(1.33))))
    stiffness = rng.uniform(80, 250) * reach / 0.9
    density = rng.uniform(4.0, 10.0)
    widths = rng.uniform(1.6, 2.9, n)
    damping, armature = rng.uniform(0.5, 3.0, n), rng.uniform(0.01, 0.1, n)
    pitch = np.array([a != "z" for a in axes])
    for _ in range(50):  # a home posture far from singular, so the arm can move its tool every way
        home = (np.array(bends[:n]) + rng.normal(0.0, 0.15, n)) * pitch
        scene = _arm_scene(
            seed, axes, lengths, home, gear, stiffness, density, widths, damping, armature, reach
        )
        if _conditioning(scene) > 0.2:
            break
    joints = tuple(f"j{k + 1}" for k in range(n))
    return Robot(
        f"arm-{seed}",
        "arm",
        scene,
        joints,
        tuple(Slot(0.0, k) for k in range(n)),
        (gear,) * n,
        reach,
        (0.0,) * n,
        None,
        f"procedural arm, seed {seed}",
        "arm",
    )


def _arm_scene(
    seed: int,
    axes: str,
    lengths: np.ndarray,
    home: np.ndarray,
    gear: float,
    stiffness: float,
    density: float,
    widths: np.ndarray,
    damping: np.ndarray,
    armature: np.ndarray,
    reach: float,
) -> str:
    n = len(axes)
    radius = 0.035 * reach / 0.9
    chain, closing = [], []
    for k in range(n):
        pos = 0.1 * reach / 0.9 if k == 0 else lengths[k - 1]
        chain.append(
            f'<body name="link{k + 1}" pos="0 0 {pos:.6g}" '
            f'quat="{_f(_quat(axes[k], home[k]))}" gravcomp="1">'
            f'<joint name="j{k + 1}" axis="{_f(_AXES[axes[k]])}" '
            f'range="{-widths[k]:.6g} {widths[k]:.6g}" '
            f'damping="{damping[k]:.6g}" armature="{armature[k]:.6g}"/>'
            f'<geom fromto="0 0 0 0 0 {lengths[k]:.6g}" size="{radius * (1 - 0.4 * k / n):.6g}" '
            f'mass="{density * lengths[k]:.6g}"/>'
        )
        closing.append("</body>")
    chain.append(f'<site name="ee" pos="0 0 {lengths[-1]:.6g}" size="0.02"/>')
    kp, kv = stiffness / gear**2, 0.08 * stiffness / gear**2
    actuators = "".join(
        f'<position name="a{k + 1}" joint="j{k + 1}" gear="{gear:.6g}" kp="{kp:.6g}" kv="{kv:.6g}" '
        f'ctrlrange="{-widths[k] * gear:.6g} {widths[k] * gear:.6g}"/>'
        for k in range(n)
    )
    base = f"{0.07 * reach / 0.9:.6g}"
    robot = f"""<mujoco model="arm-{seed}">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.004" integrator="implicitfast"/>
  <default><geom type="capsule" contype="0" conaffinity="0" rgba="0.7 0.7 0.75 1"/></default>
  <worldbody>
    <light pos="0 0 2"/>
    <geom name="floor" type="plane" size="2 2 0.1" contype="1" conaffinity="1"/>
    <body name="base" pos="0 0 0.05"><geom type="cylinder" size="{base} 0.05" mass="3"/>
      {"".join(chain)}{"".join(closing)}
    </body>
    MARKERS
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>"""
    model = mujoco.MjModel.from_xml_string(robot.replace("MARKERS", ""))
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    tool = _f(data.site("ee").xpos)
    markers = (
        f'<site name="home" pos="{tool}" size="0.01" rgba="1 1 1 0.3"/>'
        f'<body name="target" pos="{tool}">'
        '<site name="target" size="0.025" rgba="0 1 0 0.6"/></body>'
    )
    return robot.replace("MARKERS", markers)


def procedural_legged(seed: int) -> Robot:
    """A procedural planar legged body: 2-6 legs spread along a torso; leg, torso, mass, gain and
    gear vary."""
    rng = np.random.default_rng([seed, 2])
    legs = int(rng.integers(2, 7))
    leg = float(np.exp(rng.uniform(math.log(0.25), math.log(0.45))))  # thigh plus shin
    thigh = leg * rng.uniform(0.45, 0.6)
    shin = leg - thigh
    torso = leg * rng.uniform(1.4, 2.4)
    gear = float(np.exp(rng.uniform(math.log(0.8), math.log(1.25))))
    stiffness = 28 * leg / 0.35 * rng.uniform(0.8, 1.25)
    torso_mass, leg_mass = (
        4.0 * torso / 0.6 * rng.uniform(0.8, 1.25),
        0.4 * leg / 0.35 * rng.uniform(0.8, 1.25),
    )
    hip, knee = rng.uniform(0.9, 1.1), rng.uniform(1.0, 1.3)
    parts, joints, slots, ranges = [], [], [], []
    for i in range(legs):
        x, y = torso / 2 - i * torso / (legs - 1), 0.06 * (1 if i % 2 == 0 else -1)
        parts.append(
            f'<body name="thigh{i}" pos="{x:.6g} {y:.6g} 0">'
            f'<joint name="hip{i}" axis="0 1 0" range="{-hip:.6g} {hip:.6g}"/>'
            f'<geom fromto="0 0 0 0 0 {-thigh:.6g}" mass="{leg_mass:.6g}"/>'
            f'<body name="shin{i}" pos="0 0 {-thigh:.6g}">'
            f'<joint name="knee{i}" axis="0 1 0" range="{-knee:.6g} 0.3"/>'
            f'<geom name="foot{i}" fromto="0 0 0 0 0 {-shin:.6g}" mass="{0.7 * leg_mass:.6g}"/>'
            "</body></body>"
        )
        joints += [f"hip{i}", f"knee{i}"]
        slots += [Slot(i / (legs - 1), 0), Slot(i / (legs - 1), 1)]
        ranges += [(-hip, hip), (-knee, 0.3)]
    kp, kv = stiffness / gear**2, 0.05 * stiffness / gear**2
    actuators = "".join(
        f'<position name="{j}" joint="{j}" gear="{gear:.6g}" kp="{kp:.6g}" kv="{kv:.6g}" '
        f'ctrlrange="{low * gear:.6g} {high * gear:.6g}"/>'
        for j, (low, high) in zip(joints, ranges, strict=True)
    )
    ends = f"{-torso / 2:.6g} 0 0 {torso / 2:.6g} 0 0"
    scene = f"""<mujoco model="legged-{seed}">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.005"/>
  <default>
    <joint damping="0.5" armature="0.01"/>
    <geom type="capsule" size="0.025" friction="0.9 0.05 0.001" rgba="0.8 0.6 0.4 1"/>
  </default>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <geom name="floor" type="plane" size="40 2 0.1" rgba="0.3 0.35 0.4 1"/>
    <body name="torso" pos="0 0 {thigh + shin + 0.025:.6g}">
      <joint name="rootx" type="slide" axis="1 0 0" damping="0" armature="0"/>
      <joint name="rootz" type="slide" axis="0 0 1" damping="0" armature="0"/>
      <joint name="rooty" type="hinge" axis="0 1 0" damping="0" armature="0"/>
      <geom name="torso" fromto="{ends}" size="0.045" mass="{torso_mass:.6g}"/>
      {"".join(parts)}
    </body>
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>"""
    return Robot(
        f"legged-{seed}",
        "legged",
        posture_markers(scene),
        tuple(joints),
        tuple(slots),
        (gear,) * len(joints),
        thigh + shin,
        (0.0,) * len(joints),
        None,
        f"procedural legged body, seed {seed}",
        "planar legged",
    )


def shipped_robots() -> list[Robot]:
    """The project's real task scenes as robots: the 7-dof arm (reach, from its home keyframe) and
    the walker."""
    scenes = resources.files("sim") / "assets" / "scenes"
    spec = mujoco.MjSpec.from_string((scenes / "arm7.xml").read_text())
    model = spec.compile()
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_kinematics(model, data)
    spec.worldbody.add_site(name="home", pos=data.site("ee").xpos.copy(), size=[0.01, 0, 0])
    arm7 = Robot(
        "simnet-arm7",
        "arm",
        spec.to_xml(),
        tuple(f"j{k}" for k in range(1, 8)),
        tuple(Slot(0.0, k) for k in range(7)),
        (1.0,) * 7,
        _arm_reach(model),
        tuple(float(q) for q in data.qpos),
        "home",
        "sim/assets/scenes/arm7.xml",
        "arm",
    )
    # the walker's actuators run hind hip, hind knee, fore hip, fore knee; legs count from the front
    walker = Robot(
        "simnet-walker",
        "legged",
        posture_markers((scenes / "walker.xml").read_text()),
        ("hhip", "hknee", "fhip", "fknee"),
        (Slot(1.0, 0), Slot(1.0, 1), Slot(0.0, 0), Slot(0.0, 1)),
        (1.0,) * 4,
        0.32,
        (0.0,) * 4,
        None,
        "sim/assets/scenes/walker.xml",
        "planar legged",
    )
    return [arm7, walker]


def _arm_reach(model: mujoco.MjModel) -> float:
    """Sum of link offsets from the first jointed body to the tool: the reach of a serial arm."""
    tool = model.site("ee").id
    body, total = int(model.site_bodyid[tool]), float(np.linalg.norm(model.site_pos[tool]))
    while model.body_jntnum[body] and body:
        total += float(np.linalg.norm(model.body_pos[body]))
        body = int(model.body_parentid[body])
    return total


def robot_population(
    arms: int,
    legged: int,
    *,
    seed: int = 0,
    shipped: bool = True,
    industrial: int = 0,
    two_armed: int = 0,
    mobile: int = 0,
    quadrupeds: int = 0,
    humanoids: int = 0,
) -> list[Robot]:
    """`arms` procedural arms and `legged` planar legged bodies, and of the bodies shaped like real
    robots (`_manipulators`, `_standing`) `industrial` arms, `two_armed` torsos, `mobile`
    manipulators, `quadrupeds` and `humanoids` (seeds from `seed` on), plus the shipped robots."""
    makers = [
        (procedural_arm, arms),
        (_manipulators.industrial_arm, industrial),
        (_manipulators.two_armed, two_armed),
        (_manipulators.mobile_manipulator, mobile),
        (procedural_legged, legged),
        (_standing.procedural_quadruped, quadrupeds),
        (_standing.procedural_humanoid, humanoids),
    ]
    population = [make(seed + i) for make, count in makers for i in range(count)]
    return population + (shipped_robots() if shipped else [])

"""Task builders on the project's robot files: reach for arms (MJCF and URDF), stand for legged
robots; the tasks they build are solvable, travel as data, and bad names are errors naming them."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import knowledge
import sim
from sim import TaskDefinitionError, reach_task, stand_task

ROBOTS = "tests/assets/robots"


def reach_controller(task: sim.Task, site: str, step: float = 0.05, gain: float = 0.1):
    """Damped least squares on the task's own observation (joint positions, then the vector to the
    target): the kind of local controller a site distils into a skill."""
    model = task.template.model
    data = mujoco.MjData(model)
    chain = task.definition["observation"][0]["joints"]
    qpos = [int(model.joint(j).qposadr[0]) for j in chain]
    dofs = [int(model.joint(j).dofadr[0]) for j in chain]
    acts = [
        next(a for a in range(model.nu) if model.actuator_trnid[a, 0] == model.joint(j).id)
        for j in chain
    ]
    n = len(chain)
    jac = np.zeros((3, model.nv))

    def act(obs: np.ndarray) -> np.ndarray:
        out = np.zeros((len(obs), model.nu))
        for row, o in enumerate(obs):
            data.qpos[qpos] = o[:n]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, jac, None, model.site(site).id)
            j = jac[:, dofs]
            dq = j.T @ np.linalg.solve(j @ j.T + 0.05**2 * np.eye(3), o[2 * n : 2 * n + 3])
            out[row, acts] = np.clip(gain * dq, -step, step)
        return out

    return act


@pytest.mark.parametrize(
    ("robot", "end_effector", "site", "start"),
    [
        ("sim/assets/scenes/arm7.xml", "ee", "ee", {"keyframe": "home"}),
        (
            f"{ROBOTS}/arm6.urdf",
            "tool0",  # a fixed URDF link: a body here, and the task adds a site at its origin
            "reach_ee",
            {"home": {"shoulder_lift_joint": -0.8, "elbow_joint": 1.2}},
        ),
    ],
)
def test_reach_tasks_for_any_arm_are_solvable(robot, end_effector, site, start):
    task = reach_task(robot, end_effector=end_effector, horizon=100, **start)
    model = task.template.model
    assert task.act_dim == model.nu == len(task.definition["observation"][0]["joints"])
    assert task.obs_dim == 2 * task.act_dim + 3
    assert task.definition["keyframe"] == start.get("keyframe", "start")
    result = sim.evaluate(
        task,
        reach_controller(task, site),
        branches=16,
        sampler=sim.Sampler.from_json(
            {
                "terms": [
                    {
                        "target": "joint/*/damping",
                        "op": "scale",
                        "dist": "uniform",
                        "low": 0.8,
                        "high": 1.2,
                    }
                ]
            }
        ),
        progress=False,
    )
    assert result.successes >= 14, [o.reason for o in result.outcomes]
    idle = sim.evaluate(
        task, lambda o: np.zeros((len(o), task.act_dim)), branches=16, progress=False
    )
    assert idle.successes <= 4  # the target is not where the arm starts
    assert sim.Task(task.to_json()).hash == task.hash  # data: it travels as JSON


def test_reach_defaults_follow_the_chain_and_urdf_arms_get_servos():
    arm6 = reach_task(f"{ROBOTS}/arm6.urdf", end_effector="wrist_3_link")
    model = arm6.template.model
    joints = arm6.definition["observation"][0]["joints"]
    assert joints == [
        "shoulder_pan_joint",
        "shoulder_lift_joint",
        "elbow_joint",
        "wrist_1_joint",
        "wrist_2_joint",
        "wrist_3_joint",
    ]
    assert [model.actuator(a).name for a in range(model.nu)] == [f"{j}_servo" for j in joints]
    assert model.opt.integrator == mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    part = reach_task(
        f"{ROBOTS}/arm7.xml", end_effector="link4", target_box=([0.2, -0.1, 0.3], [0.3, 0.1, 0.5])
    )
    assert part.definition["observation"][0]["joints"] == ["j1", "j2", "j3", "j4"]
    assert part.act_dim == 7  # the scene's own actuators, all of them
    (target,) = [t for t in part.definition["init"] if t["target"] == "body/reach_target/pos"]
    assert np.allclose(target["low"], [-0.05, -0.1, -0.1]) and np.allclose(
        target["high"], [0.05, 0.1, 0.1]
    )
    patch = part.init_patches(seed=0, first=0, count=4)
    assert all(len(p.mutations) == 1 + 4 for p in patch)  # the target, then noise on each joint


def test_inertias_mujoco_refuses_are_repaired_as_the_descriptor_repairs_them():
    """A URDF whose inertias no rigid body has: refused with the way out named, then built with
    `balance_inertia=True`, its links weighing what `Embodiment.from_urdf` says they weigh."""
    path = f"{ROBOTS}/unbalanced_inertia.urdf"
    with pytest.raises(TaskDefinitionError, match="balance_inertia=True repairs such inertias"):
        reach_task(path, end_effector="lower")
    task = reach_task(path, end_effector="lower", balance_inertia=True)
    body = knowledge.Embodiment.from_urdf(path, balance_inertia=True)
    model = task.template.model
    for link in ("upper", "lower"):
        (described,) = [b for b in body.bodies if b.name == link]
        assert model.body(link).mass[0] == pytest.approx(described.mass)
        assert np.allclose(
            sorted(model.body(link).inertia),
            sorted(np.linalg.eigvalsh(_matrix(described.inertia))),
            atol=1e-9,
        )


def _matrix(inertia: tuple[float, ...]) -> np.ndarray:
    xx, yy, zz, xy, xz, yz = inertia
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


def test_stand_tasks_for_legged_robots():
    quadruped = stand_task(f"{ROBOTS}/quadruped.xml", base_body="torso", height=0.2)
    humanoid = stand_task(f"{ROBOTS}/humanoid_small.xml", base_body="torso", height=0.7, horizon=50)
    for task, nu in ((quadruped, 12), (humanoid, 16)):
        assert task.act_dim == nu
        assert task.definition["failure"][0] == {
            "term": "body_height",
            "body": "torso",
            "below": task.definition["success"]["all"][0]["above"],
        }
    # the humanoid's actuators have no names: samplers reach them through their joints
    sampler = sim.Sampler.from_json(
        {
            "terms": [
                {
                    "target": "actuator@joint/*knee/gain",
                    "op": "scale",
                    "dist": "uniform",
                    "low": 0.8,
                    "high": 1.2,
                }
            ]
        }
    )
    result = sim.evaluate(
        humanoid, lambda o: np.zeros((len(o), 16)), branches=4, sampler=sampler, progress=False
    )
    assert all(o.reason.startswith("failure:") for o in result.outcomes)  # limp: it falls


def test_a_urdf_quadruped_held_in_its_posture_stands():
    task = stand_task(
        f"{ROBOTS}/quadruped12.urdf",
        base_body="trunk",
        height=0.25,
        floating_base=True,
        posture={
            "trunk_free": [
                0,
                0,
                0.42,
                1,
                0,
                0,
                0,
            ],  # the free joint the task adds: x y z, quaternion
            **{f"{leg}_hip": 0.3 for leg in ("fl", "fr", "hl", "hr")},
            **{f"{leg}_knee": -1.0 for leg in ("fl", "fr", "hl", "hr")},
        },
        horizon=50,
    )
    model = task.template.model
    key = model.key(task.definition["keyframe"])
    hold = key.ctrl.copy()
    stood = sim.evaluate(task, lambda o: np.tile(hold, (len(o), 1)), branches=8, progress=False)
    limp = sim.evaluate(
        task, lambda o: np.zeros((len(o), task.act_dim)), branches=8, progress=False
    )
    assert stood.successes == 8, [o.reason for o in stood.outcomes]
    assert limp.successes < 8


@pytest.mark.parametrize(
    ("build", "field", "message"),
    [
        (
            lambda: reach_task(f"{ROBOTS}/arm7.xml", end_effector="gripper"),
            "end_effector",
            "no site or body named 'gripper'",
        ),
        (
            lambda: reach_task(f"{ROBOTS}/arm7.xml", end_effector="ee", joints=["j1", "j9"]),
            "joints[1]",
            "no joint named 'j9'",
        ),
        (
            lambda: reach_task(f"{ROBOTS}/arm7.xml", end_effector="ee", keyframe="rest"),
            "keyframe",
            "no keyframe 'rest'",
        ),
        (
            lambda: reach_task(f"{ROBOTS}/arm7.xml", end_effector="ee", home={"elbow": 1.0}),
            "home['elbow']",
            "no joint named 'elbow'",
        ),
        (
            lambda: reach_task(f"{ROBOTS}/arm7.xml", end_effector="ee", home={"j4": 0.5}),
            "home['j4']",
            r"0.5 rad is outside the joint's range \[-3.072, -0.06981\] rad",  # -176 to -4 degrees
        ),
        (
            lambda: reach_task(
                f"{ROBOTS}/arm7.xml", end_effector="ee", target_box=((0, 0, 1), (1, 1, 0))
            ),
            "target_box",
            "exceeds",
        ),
        (
            lambda: reach_task(f"{ROBOTS}/arm7.xml", end_effector="ee", tolerance=0),
            "tolerance",
            "> 0",
        ),
        (
            lambda: reach_task(f"{ROBOTS}/no_such_arm.xml", end_effector="ee"),
            "scene",
            "no such file",
        ),
        (
            lambda: reach_task("<mujoco><worldbody><body/></mujoco>", end_effector="ee"),
            "scene",
            "cannot read",
        ),
        (
            lambda: stand_task(f"{ROBOTS}/quadruped.xml", base_body="body", height=0.2),
            "base_body",
            "no body named 'body'",
        ),
        (
            lambda: stand_task(f"{ROBOTS}/arm7.xml", base_body="link1", height=0.2),
            "base_body",
            "has no free joint",
        ),
        (
            lambda: stand_task(f"{ROBOTS}/quadruped.xml", base_body="torso", height=-1),
            "height",
            "> 0",
        ),
    ],
)
def test_bad_names_and_values_are_task_definition_errors_naming_them(build, field, message):
    with pytest.raises(TaskDefinitionError, match=message) as caught:
        build()
    assert caught.value.field == field


def test_a_urdf_quadruped_given_a_free_joint_starts_on_the_floor_not_in_it():
    """A URDF puts its root at the origin, the legs below: the task raises the base so the feet,
    in the posture asked for, rest on the floor, and holding the posture stands."""
    legs = {
        **{f"{leg}_hip": 0.3 for leg in ("fl", "fr", "hl", "hr")},
        **{f"{leg}_knee": -1.0 for leg in ("fl", "fr", "hl", "hr")},
    }
    task = stand_task(
        f"{ROBOTS}/quadruped12.urdf",
        base_body="trunk",
        height=0.25,
        floating_base=True,
        posture=legs,
        horizon=50,
    )
    model = task.template.model
    key = model.key(task.definition["keyframe"])
    data = mujoco.MjData(model)
    data.qpos[:] = key.qpos
    mujoco.mj_kinematics(model, data)
    feet = [g for g in range(model.ngeom) if model.geom_bodyid[g] != 0 and model.geom_contype[g]]
    lowest = min(data.geom_xpos[g, 2] - model.geom_rbound[g] for g in feet)
    assert 0.3 < key.qpos[2] < 0.6 and lowest > -0.05  # on the floor, not 0.4 m into it
    hold = key.ctrl.copy()
    stood = sim.evaluate(task, lambda o: np.tile(hold, (len(o), 1)), branches=8, progress=False)
    assert stood.successes == 8, [o.reason for o in stood.outcomes]


WELDED_WALKER = """<mujoco><worldbody>{terrain}
  <body name="trunk" pos="0 0 0"><geom type="box" size=".2 .1 .05" mass="5"/>{legs}</body>
</worldbody></mujoco>"""
WELDED_LEG = """<body name="{n}" pos="{x} {y} 0"><joint name="{n}_hip" axis="0 1 0" range="-60 60"/>
  <geom type="capsule" fromto="0 0 0 0 0 -.2" size=".02" mass=".5"/></body>"""


def test_resting_on_the_floor_counts_the_robot_only_and_reads_any_number_type():
    """Only the robot's own geoms place it (not a static terrain block reaching below the floor),
    and a posture of numpy numbers places it as Python floats do."""
    legs = "".join(
        WELDED_LEG.format(n=n, x=x, y=y)
        for n, x, y in (
            ("fl", 0.15, 0.1),
            ("fr", 0.15, -0.1),
            ("hl", -0.15, 0.1),
            ("hr", -0.15, -0.1),
        )
    )
    terrain = '<body name="block" pos="1 0 -.5"><geom type="box" size=".3 .3 .5"/></body>'

    def trunk_height(scene: str, angle) -> float:
        task = stand_task(
            scene,
            base_body="trunk",
            height=0.1,
            floating_base=True,
            posture={f"{n}_hip": angle for n in ("fl", "fr", "hl", "hr")},
        )
        return float(task.template.model.key(task.definition["keyframe"]).qpos[2])

    plain = trunk_height(WELDED_WALKER.format(terrain="", legs=legs), 0.5)
    assert plain == pytest.approx(0.02 + 0.2 * np.cos(0.5), abs=1e-5)  # tilted legs touch the floor
    assert trunk_height(WELDED_WALKER.format(terrain=terrain, legs=legs), 0.5) == plain
    for number in (np.float32(0.5), np.array(0.5), [0.5]):
        assert trunk_height(WELDED_WALKER.format(terrain="", legs=legs), number) == pytest.approx(
            plain, abs=1e-6
        )


@pytest.mark.parametrize(
    "foot",
    [
        '<geom type="box" size=".03 .02 .01" euler="20 30 40" mass=".1"/>',
        '<geom type="cylinder" size=".03 .02" euler="0 50 0" mass=".1"/>',
        '<geom type="ellipsoid" size=".03 .02 .01" euler="10 70 0" mass=".1"/>',
        '<geom type="mesh" mesh="wedge" euler="15 25 0" mass=".1"/>',
    ],
)
def test_a_floating_base_rests_exactly_on_the_scenes_own_ground(foot):
    """Whatever shape its feet have, a robot given a free joint starts touching the ground, not a
    few millimetres above it (a bounding box's corner), and on the scene's own ground plane where
    that is not at z = 0."""
    legs = "".join(
        f'<body name="{n}" pos="{x} {y} 0"><joint name="{n}_hip" axis="0 1 0" range="-60 60"/>'
        f'<geom type="capsule" fromto="0 0 0 0 0 -.2" size=".01" mass=".5"/>'
        f'<body pos="0 0 -.25">{foot}</body></body>'
        for n, x, y in (
            ("fl", 0.15, 0.1),
            ("fr", 0.15, -0.1),
            ("hl", -0.15, 0.1),
            ("hr", -0.15, -0.1),
        )
    )
    wedge = '<mesh name="wedge" vertex="0 0 0  .04 0 0  0 .03 0  0 0 .05"/>'
    scene = f"""<mujoco><asset>{wedge}</asset>
    <worldbody><geom name="ground" type="plane" size="5 5 .1" pos="0 0 .3"/>
      <body name="trunk"><geom type="box" size=".2 .1 .05" mass="5"/>{legs}</body>
    </worldbody></mujoco>"""
    task = stand_task(scene, base_body="trunk", height=0.1, floating_base=True)
    model = task.template.model
    data = mujoco.MjData(model)
    data.qpos[:] = (
        model.key(task.definition["keyframe"]).qpos
        if task.definition.get("keyframe")
        else model.qpos0
    )
    mujoco.mj_forward(model, data)
    ground = model.geom("ground").id
    robot = [g for g in range(model.ngeom) if model.geom_bodyid[g] != 0]
    gap = min(mujoco.mj_geomDistance(model, data, g, ground, 1.0, None) for g in robot)
    assert gap == pytest.approx(0.0, abs=1e-5)  # the scene's text keeps 6 digits


def _start_contacts(task: sim.Task) -> set[tuple[str, str]]:
    """The pairs of bodies in contact in the task's start pose, by name."""
    model = task.template.model
    data = mujoco.MjData(model)
    if task.definition["keyframe"]:
        mujoco.mj_resetDataKeyframe(model, data, model.key(task.definition["keyframe"]).id)
    mujoco.mj_forward(model, data)
    return {
        tuple(sorted(model.body(int(model.geom_bodyid[g])).name for g in c.geom))
        for c in data.contact[: data.ncon]
    }


def test_a_robots_parts_that_overlap_at_rest_do_not_collide():
    """Each hand of this URDF biped sits inside its thigh at rest, as Talos's grippers do: the
    task excludes those pairs (an SRDF's rule: in collision in the default pose), not the feet's
    contact with the floor; kept, the overlap pushes the arms 0.07 rad off the posture held."""
    robot = f"{ROBOTS}/overlapping_biped.urdf"

    def build(**options):
        return stand_task(
            robot, base_body="trunk", height=0.5, floating_base=True, joint_noise=0.0, **options
        )

    def held(task: sim.Task) -> float:
        """How far the joints end from the start pose after 2 s holding it."""
        model = task.template.model
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        start = data.qpos[7:].copy()
        for _ in range(1000):
            mujoco.mj_step(model, data)
        return float(np.abs(data.qpos[7:] - start).max())

    task = build()
    assert _start_contacts(task) == {("left_foot", "world"), ("right_foot", "world")}
    excluded = mujoco.MjSpec.from_string(task.definition["scene"]).excludes
    assert sorted(sorted((e.bodyname1, e.bodyname2)) for e in excluded) == [
        ["left_hand", "left_thigh"],
        ["right_hand", "right_thigh"],
    ]
    assert build().hash == task.hash  # the same files, the same task
    assert held(task) < 0.01
    kept = build(exclude_start_contacts=False)
    assert ("left_hand", "left_thigh") in _start_contacts(kept)
    assert held(kept) > 0.05


OVERLAPPING_ARM = """<mujoco><worldbody>
  <body name="base"><geom type="cylinder" size=".08 .05"/>
    <body name="link1" pos="0 0 .05"><joint name="j1" axis="0 0 1"/>
      <geom type="capsule" fromto="0 0 0 0 0 .3" size=".03"/>
      <body name="link2" pos="0 0 .3"><joint name="j2" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 .1 0 -.28" size=".03"/><site name="tip" pos=".1 0 -.28"/>
      </body>
    </body>
  </body>
  <body name="block" pos=".1 0 .1"><freejoint/><geom type="box" size=".03 .03 .03"/></body>
</worldbody></mujoco>"""


def test_a_reach_task_excludes_the_robots_own_overlaps_only():
    """The arm's forearm dips into its base (two bodies apart), and its first link starts inside
    the base, which is welded to the world (MuJoCo's parent-child filter spares neither): both
    pairs are excluded. A prop placed touching the arm is not the robot's: its contacts stay."""
    task = reach_task(OVERLAPPING_ARM, end_effector="tip", joint_noise=0.0)
    contacts = _start_contacts(task)
    assert ("base", "link2") not in contacts
    assert ("block", "link2") in contacts
    excluded = mujoco.MjSpec.from_string(task.definition["scene"]).excludes
    assert sorted(sorted((e.bodyname1, e.bodyname2)) for e in excluded) == [
        ["base", "link1"],
        ["base", "link2"],
    ]
    kept = reach_task(OVERLAPPING_ARM, end_effector="tip", exclude_start_contacts=False)
    assert ("base", "link2") in _start_contacts(kept)


def test_a_collada_mesh_is_refused_saying_what_mujoco_reads_and_what_to_do(tmp_path):
    """MuJoCo has no decoder for COLLADA (ROS packages often ship .dae collision meshes): the
    refusal names the files, the formats it reads and a way out, before MuJoCo's own words."""
    (tmp_path / "meshes").mkdir()
    (tmp_path / "meshes" / "link.dae").write_text('<?xml version="1.0"?><COLLADA/>')
    (tmp_path / "arm.urdf").write_text(
        """<robot name="daearm"><link name="base"/>
        <link name="link"><inertial><mass value="1"/>
          <inertia ixx=".01" iyy=".01" izz=".01" ixy="0" ixz="0" iyz="0"/></inertial>
          <collision><geometry><mesh filename="meshes/link.dae"/></geometry></collision></link>
        <joint name="j" type="revolute"><parent link="base"/><child link="link"/>
          <axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
        </robot>"""
    )
    with pytest.raises(TaskDefinitionError) as caught:
        reach_task(tmp_path / "arm.urdf", end_effector="link")
    assert caught.value.field == "scene"
    detail = caught.value.detail
    assert "reads STL, OBJ and MSH meshes, not .dae (COLLADA): meshes/link.dae" in detail
    assert "assimp export" in detail and "package_path" in detail
    assert detail.index("assimp") < detail.index("no decoder found")

"""Embodiment descriptors: hand-checked values for the project's robots and gymnasium's, fingerprint
invariance (sibling order, whitespace, file name and place) and sensitivity, dict round trips, bad
files."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import gymnasium
import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import Embodiment, EmbodimentError

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"
GYM = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"
GYM_MODELS = sorted(GYM.glob("*.xml"))
OWN_MJCF = ["arm7.xml", "gripper.xml", "quadruped.xml", "humanoid_small.xml", "wheeled_base.xml"]


def load(name: str) -> Embodiment:
    path = ROBOTS / name
    return Embodiment.from_urdf(path) if name.endswith(".urdf") else Embodiment.from_mjcf(path)


def by_name(items, name):
    return next(item for item in items if item.name == name)


def ranges(embodiment, *names):
    return [by_name(embodiment.joints, name).range for name in names]


def radians(low, high):
    return pytest.approx((math.radians(low), math.radians(high)), rel=1e-5)


# -- hand-checked descriptors ----------------------------------------------------------------------


def test_arm7_matches_the_file():
    arm = load("arm7.xml")
    assert (arm.name, arm.dof, arm.floating_base, arm.mass) == ("arm7", 7, False, 19.0)
    assert [j.type for j in arm.joints] == ["hinge"] * 7
    assert [j.name for j in arm.joints] == [f"j{i}" for i in range(1, 8)]  # a chain keeps its order
    assert ranges(arm, "j1", "j4", "j6") == [
        radians(-166, 166),
        radians(-176, -4),
        radians(-1, 215),
    ]
    assert [j.damping for j in arm.joints] == [0.5] * 4 + [0.2] * 3  # the wrist default class
    assert [j.armature for j in arm.joints] == [0.1] * 4 + [0.05] * 3
    assert [j.axis for j in arm.joints][:2] == [(0.0, 0.0, 1.0), (0.0, 1.0, 0.0)]
    assert {a.kind for a in arm.actuators} == {"position"}
    assert [a.gain for a in arm.actuators] == [100.0] * 4 + [50.0] * 3
    assert [a.force_range for a in arm.actuators] == [(-87.0, 87.0)] * 4 + [(-12.0, 12.0)] * 3
    assert all(a.ctrl_range == (-2.9, 2.9) and a.transmission == "joint" for a in arm.actuators)
    assert [arm.joints[a.target[0]].name for a in arm.actuators] == [f"j{i}" for i in range(1, 8)]
    base = by_name(arm.bodies, "base")
    assert base.parent == -1 and base.pos == (
        0.0,
        0.0,
        0.0,
    )  # placed at z=0.4 in the world: not shape
    assert [b.link_length for b in arm.bodies] == pytest.approx(
        [0, 0.1, 0.2, 0.2, 0.2, 0.15, 0.15, 0.1]
    )
    assert by_name(arm.bodies, "link1").inertia == (0.05, 0.05, 0.01, 0.0, 0.0, 0.0)
    assert [arm.bodies[i].name for i in arm.end_effectors] == ["link7"]
    assert arm.reach == pytest.approx(
        1.1 + 0.1
    )  # link offsets, then the "ee" site 0.1 beyond link7
    link7 = arm.bodies.index(by_name(arm.bodies, "link7"))
    assert {(s.type, s.dim) for s in arm.sensors if s.body == link7} == {
        ("force", 3),
        ("torque", 3),
    }
    assert by_name(arm.sites, "ee").body == link7


def test_arm6_urdf_fuses_fixed_links():
    arm = load("arm6.urdf")
    assert (arm.name, arm.dof, arm.floating_base) == ("arm6", 6, False)  # an arm: no legs, wheels
    # a motor on every joint with an effort limit (wrist_3 has none), its control the joint torque
    assert [(a.kind, a.ctrl_range) for a in arm.actuators] == [("motor", (-150.0, 150.0))] * 3 + [
        ("motor", (-28.0, 28.0))
    ] * 2
    assert [arm.joints[a.target[0]].name for a in arm.actuators] == [j.name for j in arm.joints[:5]]
    names = [b.name for b in arm.bodies]
    assert (
        "base_link" not in names and "tool0" not in names
    )  # fused into the world and into wrist_3
    assert arm.mass == pytest.approx(3.7 + 8.393 + 2.275 + 1.219 + 1.219 + 0.1879 + 0.1)
    assert by_name(arm.bodies, "wrist_3_link").mass == pytest.approx(0.2879)
    assert [j.force_range for j in arm.joints] == [(-150.0, 150.0)] * 3 + [(-28.0, 28.0)] * 2 + [
        None
    ]
    assert [j.damping for j in arm.joints] == [2.0, 2.0, 1.0, 0.0, 0.0, 0.0]
    assert [j.frictionloss for j in arm.joints] == [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert ranges(arm, "elbow_joint", "wrist_3_joint") == [
        (-3.1416, 3.1416),
        None,
    ]  # continuous: unlimited
    assert by_name(arm.bodies, "forearm_link").link_length == pytest.approx(
        math.hypot(0.1197, 0.425), rel=1e-5
    )
    assert arm.reach == pytest.approx(
        0.13585 + math.hypot(0.1197, 0.425) + 0.39225 + 0.093 + 0.09465, rel=1e-5
    )
    assert [arm.bodies[i].name for i in arm.end_effectors] == ["wrist_3_link"]


def test_gripper_tendon_actuator_drives_both_fingers():
    gripper = load("gripper.xml")
    assert (gripper.dof, gripper.mass) == (2, 0.6)
    assert [(j.type, j.range, j.damping, j.armature) for j in gripper.joints] == [
        ("slide", (0.0, 0.03), 2.0, 0.01)
    ] * 2
    (grip,) = gripper.actuators
    assert (grip.transmission, grip.kind, grip.gain, grip.ctrl_range) == (
        "tendon",
        "position",
        200.0,
        (0.0, 0.03),
    )
    assert sorted(gripper.joints[j].name for j in grip.target) == ["left", "right"]
    assert sorted(gripper.bodies[i].name for i in gripper.end_effectors) == [
        "left_finger",
        "right_finger",
    ]
    assert sorted((gripper.bodies[s.body].name, s.type) for s in gripper.sensors) == [
        ("left_finger", "touch"),
        ("right_finger", "touch"),
    ]


def test_quadruped_resolves_its_include():
    dog = load("quadruped.xml")
    assert (dog.dof, dog.floating_base, dog.mass) == (18, True, 15.2)
    hinges = [j for j in dog.joints if j.type == "hinge"]
    assert len(hinges) == 12 and {(j.damping, j.armature) for j in hinges} == {
        (0.3, 0.02)
    }  # from the include
    assert ranges(dog, "fl_abduct", "hr_hip", "hl_knee") == [
        radians(-45, 45),
        radians(-60, 90),
        radians(-150, -30),
    ]
    assert sorted(a.gear[0] for a in dog.actuators) == [20.0] * 8 + [30.0] * 4
    assert {a.kind for a in dog.actuators} == {"motor"}
    assert sorted(dog.bodies[i].name for i in dog.end_effectors) == [
        "fl_calf",
        "fr_calf",
        "hl_calf",
        "hr_calf",
    ]
    assert dog.reach == pytest.approx(
        math.hypot(0.2, 0.1) + 0.05 + 0.2 + 0.22, rel=1e-5
    )  # calf tip: capsule + radius
    torso = dog.bodies.index(by_name(dog.bodies, "torso"))
    assert sorted(s.type for s in dog.sensors if s.body == torso) == ["accelerometer", "gyro"]
    assert sorted(s.type for s in dog.sensors) == ["accelerometer", "gyro"] + ["touch"] * 4


def test_small_humanoid_has_a_ball_joint():
    body = load("humanoid_small.xml")
    assert (body.dof, body.floating_base, body.mass, len(body.actuators)) == (25, True, 33.0, 16)
    neck = by_name(body.joints, "neck")
    assert neck.type == "ball" and neck.range == radians(0, 45)
    assert ranges(body, "left_knee", "right_hip_z") == [radians(-160, -2), radians(-35, 60)]
    assert sorted(body.bodies[i].name for i in body.end_effectors) == [
        "head",
        "left_foot",
        "left_forearm",
        "right_foot",
        "right_forearm",
    ]
    thigh = body.bodies.index(by_name(body.bodies, "left_thigh"))
    assert [j.name for j in body.joints if j.body == thigh] == [
        "left_hip_x",
        "left_hip_y",
        "left_hip_z",
    ]


def test_wheeled_base_has_velocity_wheels_and_a_caster():
    base = load("wheeled_base.xml")
    assert (base.dof, base.mass) == (11, 14.2)
    assert {(j.name, j.type, j.range) for j in base.joints} == {
        ("root", "free", None),
        ("left_wheel", "hinge", None),
        ("right_wheel", "hinge", None),
        ("caster", "ball", None),
    }
    assert {(a.kind, a.gain, a.ctrl_range, a.force_range) for a in base.actuators} == {
        ("velocity", 10.0, (-20.0, 20.0), (-8.0, 8.0))
    }
    assert sorted(s.type for s in base.sensors) == ["gyro", "jointvel", "jointvel", "rangefinder"]


def test_gymnasium_ant_matches_its_file():
    ant = Embodiment.from_mjcf(GYM / "ant.xml")
    assert (ant.dof, ant.floating_base, len(ant.actuators)) == (14, True, 8)
    assert {(a.kind, a.gear[0], a.ctrl_range) for a in ant.actuators} == {
        ("motor", 150.0, (-1.0, 1.0))
    }
    hinges = [j for j in ant.joints if j.type == "hinge"]
    assert {(j.damping, j.armature) for j in hinges} == {(1.0, 1.0)}
    assert [j.range for j in hinges if j.name.startswith("hip")] == [radians(-30, 30)] * 4
    assert len(ant.end_effectors) == 4
    root = by_name(ant.joints, "root")
    assert (root.type, root.damping, root.armature) == ("free", 0.0, 0.0)


@pytest.mark.parametrize("path", GYM_MODELS, ids=lambda p: p.stem)
def test_gymnasium_models_agree_with_mujoco(path):
    """The robot is MuJoCo's model less the trees no actuator drives (the reacher's target, the
    pusher's object and goal), counted here from MuJoCo's own `body_rootid`."""
    model = mujoco.MjModel.from_xml_path(str(path))
    driven = {int(model.body_rootid[model.jnt_bodyid[j]]) for j in model.actuator_trnid[:, 0]}
    robot = np.isin(model.body_rootid, list(driven))
    robot[0] = False  # the world
    joints = np.isin(model.jnt_bodyid, np.flatnonzero(robot))
    described = Embodiment.from_mjcf(path)
    assert described.dof == int(model.body_dofnum[robot].sum())
    parts = (len(described.bodies), len(described.joints), len(described.actuators))
    assert parts == (int(robot.sum()), int(joints.sum()), model.nu)
    assert described.mass == pytest.approx(float(model.body_mass[robot].sum()), rel=1e-5)
    assert Embodiment.from_dict(json.loads(json.dumps(described.to_dict()))) == described


# -- fingerprints ----------------------------------------------------------------------------------


def rewrite(root: ET.Element, rnd: random.Random) -> None:
    """Shuffle what a body does not depend on the order of: sibling bodies, geoms and sites (in
    place among their slots), actuators, sensors, tendons, URDF links and joints, and attributes.
    (Geom order changes compiled inertias in the last bits, which the descriptor's rounding
    absorbs.)"""
    for parent in root.iter():
        for tags in (
            {"body"},
            {"geom"},
            {"site"},
            {"link", "joint"} if parent.tag == "robot" else set(),
        ):
            slots = [i for i, child in enumerate(parent) if child.tag in tags]
            moved = [parent[i] for i in slots]
            rnd.shuffle(moved)
            for i, child in zip(slots, moved, strict=True):
                parent[i] = child
        if parent.tag in ("actuator", "sensor", "tendon"):
            children = list(parent)
            rnd.shuffle(children)
            parent[:] = children
        items = list(parent.attrib.items())
        rnd.shuffle(items)
        parent.attrib.clear()
        parent.attrib.update(items)


@settings(max_examples=12)
@given(
    name=st.sampled_from(
        [*OWN_MJCF, "arm6.urdf", "gym:ant.xml", "gym:humanoid.xml", "gym:pusher.xml"]
    ),
    seed=st.integers(0, 2**32 - 1),
    indent=st.sampled_from(["", " ", "\t", "     "]),
    filename=st.text("abcdefgh_-0123456789", min_size=1, max_size=12),
)
def test_fingerprint_ignores_sibling_order_whitespace_and_file_name(name, seed, indent, filename):
    source = GYM / name[4:] if name.startswith("gym:") else ROBOTS / name
    reader = Embodiment.from_urdf if name.endswith(".urdf") else Embodiment.from_mjcf
    original = reader(source)
    tree = ET.parse(source)
    rewrite(tree.getroot(), random.Random(seed))
    if indent:
        ET.indent(tree, space=indent)
    with tempfile.TemporaryDirectory() as elsewhere:
        shutil.copy(
            ROBOTS / "quadruped_defaults.xml", elsewhere
        )  # the include travels with its file
        copy = Path(elsewhere) / f"{filename}{source.suffix}"
        tree.write(copy)
        rewritten = reader(copy)
    assert rewritten.fingerprint == original.fingerprint
    assert rewritten.to_dict() == original.to_dict()


def test_fingerprint_changes_with_the_body_but_not_with_names():
    text = (ROBOTS / "arm7.xml").read_text()
    original = Embodiment.from_mjcf(text)
    assert (
        Embodiment.from_mjcf(ROBOTS / "arm7.xml").fingerprint == original.fingerprint
    )  # text or file
    renamed = Embodiment.from_mjcf(text.replace('"j1"', '"shoulder"').replace('"link3"', '"upper"'))
    assert renamed.fingerprint == original.fingerprint and renamed.to_dict() != original.to_dict()
    for change in [
        ('name="j1" axis="0 0 1" range="-166 166"', 'name="j1" axis="0 0 1" range="-160 166"'),
        (
            'mass="2.5" diaginertia="0.03 0.03 0.008"/>\n            <geom',
            'mass="2.6" diaginertia="0.03 0.03 0.008"/>',
        ),
        ('<body name="link4" pos="0 0 0.2">', '<body name="link4" pos="0 0 0.21">'),
        ('<jointpos name="j4_pos" joint="j4"/>', ""),
        ('kp="50"', 'kp="60"'),
    ]:
        assert change[0] in text
        assert Embodiment.from_mjcf(text.replace(*change, 1)).fingerprint != original.fingerprint, (
            change
        )


def test_fingerprint_covers_joint_friction_but_not_contact_friction(tmp_path):
    """Contact friction is a pair's, randomized by certificates: not the body's (see
    `Embodiment.fingerprint`). Joint friction (frictionloss) is the body's."""
    shutil.copy(ROBOTS / "quadruped_defaults.xml", tmp_path)
    text = (ROBOTS / "quadruped.xml").read_text()
    original = Embodiment.from_mjcf(ROBOTS / "quadruped.xml").fingerprint

    def fingerprint(old: str, new: str) -> str:
        assert old in text
        (tmp_path / "dog.xml").write_text(text.replace(old, new))
        return Embodiment.from_mjcf(tmp_path / "dog.xml").fingerprint

    feet = '<geom class="calf" fromto="0 0 0 0 0 -0.2"/>'
    assert fingerprint(feet, feet.replace("/>", ' friction="0.3 0.01 0.001"/>')) == original
    knee = '<joint name="fl_knee" axis="0 1 0" range="-150 -30"/>'
    assert fingerprint(knee, knee.replace("/>", ' frictionloss="0.5"/>')) != original


def test_fingerprints_tell_the_robots_apart():
    files = [ROBOTS / name for name in [*OWN_MJCF, "arm6.urdf"]] + GYM_MODELS
    fingerprints = {
        path.name: (
            load(path.name) if path.parent == ROBOTS else Embodiment.from_mjcf(path)
        ).fingerprint
        for path in files
    }
    # gymnasium ships walker2d twice with identical bodies (v5 changes only the feet's contact
    # friction, which the fingerprint leaves out by design), and the pusher twice with one arm (v5
    # changes only the object it pushes, which is not the robot); all else differ
    assert fingerprints.pop("walker2d_v5.xml") == fingerprints["walker2d.xml"]
    assert fingerprints.pop("pusher_v5.xml") == fingerprints["pusher.xml"]
    assert len(set(fingerprints.values())) == len(fingerprints)
    assert all(len(f) == 64 and int(f, 16) >= 0 for f in fingerprints.values())


# -- plain data ------------------------------------------------------------------------------------


JOINT_TARGETS = ("joint", "jointinparent", "tendon")


def shuffled(data: dict, rnd: random.Random) -> dict:
    """The same body with every list in another order (bodies in another parents-first order),
    references renumbered, totals left out: what a careless producer might send."""
    bodies, joints = data["bodies"], data["joints"]
    order, ready = [], [i for i, b in enumerate(bodies) if b["parent"] == -1]
    while ready:
        i = ready.pop(rnd.randrange(len(ready)))
        order.append(i)
        ready += [c for c, b in enumerate(bodies) if b["parent"] == i]
    new_body = {old: new for new, old in enumerate(order)} | {-1: -1}
    joint_order = list(range(len(joints)))
    rnd.shuffle(
        joint_order
    )  # any interleaving of bodies, but a body's own joints keep their (kinematic) order
    for body in {j["body"] for j in joints}:
        slots = [i for i, j in enumerate(joint_order) if joints[j]["body"] == body]
        for slot, j in zip(slots, sorted(joint_order[i] for i in slots), strict=True):
            joint_order[slot] = j
    new_joint = {old: new for new, old in enumerate(joint_order)}

    def moved(item, **changes):
        return {**item, **changes}

    out = {
        "format": data["format"],
        "name": data["name"],
        "bodies": [moved(bodies[i], parent=new_body[bodies[i]["parent"]]) for i in order],
        "joints": [moved(joints[j], body=new_body[joints[j]["body"]]) for j in joint_order],
        "actuators": [
            moved(
                a,
                target=[
                    (new_joint if a["transmission"] in JOINT_TARGETS else new_body)[t]
                    for t in a["target"]
                ],
            )
            for a in data["actuators"]
        ],
        "sites": [moved(s, body=new_body[s["body"]]) for s in data["sites"]],
        "sensors": [moved(s, body=new_body[s["body"]]) for s in data["sensors"]],
    }
    for key in ("actuators", "sites", "sensors"):
        rnd.shuffle(out[key])
    return out


@settings(max_examples=30)
@given(name=st.sampled_from([*OWN_MJCF, "arm6.urdf"]), seed=st.integers(0, 2**32 - 1))
def test_from_dict_puts_any_order_back_in_canonical_order(name, seed):
    original = load(name)
    again = Embodiment.from_dict(shuffled(original.to_dict(), random.Random(seed)))
    assert again == original and again.fingerprint == original.fingerprint


@pytest.mark.parametrize("name", [*OWN_MJCF, "arm6.urdf"])
def test_dict_round_trips_through_json(name):
    original = load(name)
    data = original.to_dict()
    assert Embodiment.from_dict(json.loads(json.dumps(data))).to_dict() == data
    assert (data["dof"], data["mass"], data["fingerprint"]) == (
        original.dof,
        original.mass,
        original.fingerprint,
    )


def test_descriptors_stay_small():
    for path in [ROBOTS / "humanoid_small.xml", GYM / "humanoid.xml"]:
        text = json.dumps(Embodiment.from_mjcf(path).to_dict(), separators=(",", ":"))
        assert len(text) < 16_000


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d.update(format=2), "format 2"),
        (lambda d: d.update(colour="red"), "unknown keys"),
        (lambda d: d["joints"][0].update(range=[0, "1"]), "joints[0].range[1]"),
        (lambda d: d["bodies"][0].update(mass=float("nan")), "bodies[0].mass"),
        (lambda d: d["bodies"][1].update(parent=5), "bodies[1].parent"),
        (lambda d: d["joints"][0].update(body=99), "joints[0].body"),
        (lambda d: d["actuators"][0].update(target=[99]), "actuators[0].target"),
        (lambda d: d["joints"][0].update(type="screw"), "joints[0].type"),
        (lambda d: d["joints"][0].pop("axis"), "joints[0]"),
        (lambda d: d["sensors"][0].update(dim=True), "sensors[0].dim"),
        (lambda d: d.update(dof=8), "dof"),
        (lambda d: d.update(fingerprint="0" * 64), "fingerprint"),
        (lambda d: d.update(bodies="torso"), "bodies"),
    ],
)
def test_from_dict_rejects_damaged_descriptors(damage, message):
    data = json.loads(json.dumps(load("arm7.xml").to_dict()))
    damage(data)
    with pytest.raises(EmbodimentError) as caught:
        Embodiment.from_dict(data)
    assert message in str(caught.value)


# -- bad files -------------------------------------------------------------------------------------

ARM = (ROBOTS / "arm6.urdf").read_text()
BAD_FILES = {
    "missing.xml": (None, "no such file"),
    "syntax.xml": ("<mujoco><worldbody><body><joint/></worldbody></mujoco>", "XML syntax error"),
    "empty.xml": ("", "XML syntax error"),
    "urdf_as_mjcf.xml": (ARM, "use Embodiment.from_urdf"),
    "unknown_joint.xml": (
        '<mujoco><worldbody><body><joint name="a"/><geom size=".1"/></body></worldbody>'
        '<actuator><motor joint="b"/></actuator></mujoco>',
        "MuJoCo cannot compile it",
    ),
    "missing_include.xml": ('<mujoco><include file="nowhere.xml"/></mujoco>', "nowhere.xml"),
    "no_joints.xml": (
        '<mujoco><worldbody><body><geom size=".1"/></body></worldbody></mujoco>',
        "no joints",
    ),
    "massless.xml": (
        '<mujoco><worldbody><body><joint/><geom size=".1" mass="0"/></body></worldbody></mujoco>',
        "MuJoCo cannot compile it",
    ),
}
BAD_URDFS = {
    "mjcf_as_urdf.urdf": ((ROBOTS / "gripper.xml").read_text(), "use Embodiment.from_mjcf"),
    "package_mesh.urdf": (
        ARM.replace(
            '<link name="tool0">',
            '<link name="tool0"><collision><geometry>'
            '<mesh filename="package://arm6/meshes/tool.stl"/></geometry></collision>',
        ),
        "no package 'arm6'",
    ),
    "no_inertia.urdf": (
        '<robot name="r"><link name="a"/><link name="b"/>'
        '<joint name="j" type="revolute"><parent link="a"/>'
        '<child link="b"/><limit lower="-1" upper="1" effort="1" velocity="1"/></joint></robot>',
        "MuJoCo cannot compile it",
    ),
}


@pytest.mark.parametrize("filename", [*BAD_FILES, *BAD_URDFS])
def test_bad_files_raise_errors_naming_the_file_and_problem(tmp_path, filename):
    text, problem = {**BAD_FILES, **BAD_URDFS}[filename]
    path = tmp_path / filename
    if text is not None:
        path.write_text(text)
    reader = Embodiment.from_urdf if filename.endswith(".urdf") else Embodiment.from_mjcf
    with pytest.raises(EmbodimentError) as caught:
        reader(path)
    assert str(path) in str(caught.value) and problem in str(caught.value)


def test_a_directory_and_bad_xml_text_are_refused(tmp_path):
    with pytest.raises(EmbodimentError, match="not a regular file"):
        Embodiment.from_urdf(tmp_path)
    with pytest.raises(EmbodimentError, match="<MJCF text>: XML syntax error"):
        Embodiment.from_mjcf("<mujoco><worldbody>")


HOSTILE_VALUES = ["", "nan", "inf", "-1", "0", "1e308", "1e-320", "abc", "1 2", "1 2 3 4", "é"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from([*OWN_MJCF, "arm6.urdf", "quadruped12.urdf", "diffbot.urdf"]),
    edits=st.lists(
        st.tuples(st.sampled_from(["value", "delete", "copy"]), st.integers(0, 10**6)),
        min_size=1,
        max_size=3,
    ),
    value=st.sampled_from(HOSTILE_VALUES),
    cut=st.none() | st.floats(0, 1),
)
def test_a_damaged_robot_file_is_described_or_refused_naming_it(name, edits, value, cut):
    """Whatever is done to a robot file (an attribute set to a hostile value, an element deleted or
    copied, the text cut short), reading it gives a description or an EmbodimentError naming the
    file: never another exception."""
    root = ET.parse(ROBOTS / name).getroot()
    for edit, pick in edits:
        parents = [(p, c) for p in root.iter() for c in p]
        parent, element = parents[pick % len(parents)]
        if edit == "value" and element.attrib:
            element.set(sorted(element.attrib)[pick % len(element.attrib)], value)
        elif edit == "delete":
            parent.remove(element)
        elif edit == "copy":
            parent.append(ET.fromstring(ET.tostring(element)))
    text = ET.tostring(root, encoding="unicode")
    text = text if cut is None else text[: int(cut * len(text))]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_text(text)
        reader = Embodiment.from_urdf if name.endswith(".urdf") else Embodiment.from_mjcf
        try:
            reader(path)
        except EmbodimentError as exc:
            assert str(path) in str(exc)


def test_a_hand_edited_embodiment_round_trips():
    """to_dict canonicalizes again, so an Embodiment changed with dataclasses.replace reads back."""
    arm = load("arm7.xml")
    joint = arm.joints[0]
    edited = dataclasses.replace(
        arm,
        joints=(dataclasses.replace(joint, damping=joint.damping * 1.2345678901), *arm.joints[1:]),
    )
    back = Embodiment.from_dict(edited.to_dict())
    assert back.fingerprint != arm.fingerprint
    assert Embodiment.from_dict(back.to_dict()) == back

"""A robot told from its scene (`_scene`): a task's undriven objects beside a robot are left out of
its description, and a walker whose file leaves it welded to the world gets its free joint. Real
MJCF files compiled by MuJoCo; the checks compare fingerprints with the robot described alone."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import Embodiment, EmbodimentError

ROBOTS = Path(__file__).resolve().parent.parent / "assets" / "robots"
ARM = (ROBOTS / "arm7.xml").read_text()
QUADRUPED = (ROBOTS / "quadruped.xml").read_text()

SCENE_OBJECTS = {
    "ball on slides": """<body name="ball" pos=".4 0 .4"><joint name="ball_x" type="slide"
        axis="1 0 0"/><joint name="ball_z" type="slide" axis="0 0 1"/>
        <geom type="sphere" size=".03" mass=".1"/></body>""",
    "free target": """<body name="target" pos=".2 .2 0"><freejoint name="target_free"/>
        <geom type="box" size=".02 .02 .02" mass=".05"/></body>""",
    "table": """<body name="table" pos="0 .8 .2"><geom type="box" size=".5 .3 .2" mass="30"/>
        <body name="leg"><geom type="capsule" fromto="0 0 0 0 0 -.2" size=".02" mass="1"/>
        </body></body>""",
    "hinged door": """<body name="door" pos="1 0 .5"><joint name="hinge" axis="0 0 1"
        range="0 90"/><geom type="box" size=".4 .02 .5" mass="5"/></body>""",
}


def _with(model: str, *objects: str) -> str:
    """The MJCF text with the objects added to its worldbody."""
    return model.replace("</worldbody>", "".join(objects) + "</worldbody>", 1)


def _welded(model: str) -> str:
    return re.sub(r"<freejoint[^>]*/>", "", model)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(sorted(SCENE_OBJECTS)), min_size=1, max_size=4))
def test_undriven_objects_beside_a_robot_are_left_out(names):
    alone = Embodiment.from_mjcf(ARM)
    objects = [SCENE_OBJECTS[n].replace('name="', f'name="{i}_') for i, n in enumerate(names)]
    scene = Embodiment.from_mjcf(_with(ARM, *objects))
    assert scene.fingerprint == alone.fingerprint
    assert (scene.dof, scene.floating_base, scene.mass) == (7, False, alone.mass)


BARE_ARM = re.sub(r"<actuator>.*</actuator>|<position [^>]*/>", "", ARM, flags=re.S)
"""The arm with no actuators, nor their defaults; its joints keep their armature (0.1, 0.05)."""


def test_a_model_without_actuators_or_armature_is_kept_whole():
    bare = re.sub(r'armature="[^"]*"', "", BARE_ARM)
    whole = Embodiment.from_mjcf(_with(bare, SCENE_OBJECTS["ball on slides"]))
    assert (whole.dof, len(whole.actuators)) == (9, 0)


def test_joints_with_armature_have_motors_when_a_model_declares_no_actuators():
    """Armature is a geared rotor's inertia: the arm reads as if each joint had a `<motor>`, its
    control limited to the joint's actuatorfrcrange, and a ball on slides without armature (the
    file's default gives every joint 0.1) is the scene."""
    limited = BARE_ARM.replace('<joint name="j1"', '<joint name="j1" actuatorfrcrange="-30 30"')
    motors = "".join(f'<motor joint="j{i}"/>' for i in range(2, 8))
    j1 = '<motor joint="j1" ctrlrange="-30 30"/>'
    explicit = _with(limited, "").replace(
        "</worldbody>", f"</worldbody><actuator>{j1}{motors}</actuator>", 1
    )
    ball = SCENE_OBJECTS["ball on slides"].replace('type="slide"', 'type="slide" armature="0"')
    inferred = Embodiment.from_mjcf(_with(limited, ball))
    # the ball with the file's default armature reads as driven too: the robot and the ball
    assert Embodiment.from_mjcf(_with(limited, SCENE_OBJECTS["ball on slides"])).dof == 9
    assert inferred.fingerprint == Embodiment.from_mjcf(explicit).fingerprint
    assert [a.kind for a in inferred.actuators] == ["motor"] * 7 and inferred.dof == 7
    assert sorted(a.name for a in inferred.actuators) == [f"j{i}" for i in range(1, 8)]
    # a joint without armature stays passive; a model declaring any actuator is read as written
    one_passive = Embodiment.from_mjcf(limited.replace('name="j3"', 'name="j3" armature="0"'))
    assert len(one_passive.actuators) == 6
    assert "j3" not in {a.name for a in one_passive.actuators}
    one_motor = limited.replace(
        "</worldbody>", '</worldbody><actuator><motor joint="j1"/></actuator>', 1
    )
    assert len(Embodiment.from_mjcf(one_motor).actuators) == 1


def test_a_tree_a_tendon_actuator_reaches_is_the_robot():
    """A second tree driven only through a fixed tendon over a joint of each tree is kept."""
    tendon = """<tendon><fixed name="coupled"><joint joint="j1" coef="1"/>
        <joint joint="hinge" coef="1"/></fixed></tendon>"""
    text = _with(ARM, SCENE_OBJECTS["hinged door"]).replace("<actuator>", tendon + "<actuator>")
    text = text.replace("<actuator>", '<actuator><motor name="pull" tendon="coupled"/>')
    assert Embodiment.from_mjcf(text).dof == 8


def test_a_welded_walker_floats_as_if_its_file_said_so(tmp_path):
    shutil.copy(ROBOTS / "quadruped_defaults.xml", tmp_path)
    (tmp_path / "welded.xml").write_text(_welded(QUADRUPED))
    floating = Embodiment.from_mjcf(ROBOTS / "quadruped.xml")
    welded = Embodiment.from_mjcf(tmp_path / "welded.xml")
    assert floating.floating_base and welded.floating_base
    assert welded.fingerprint == floating.fingerprint  # the same free joint MuJoCo compiles
    as_written = Embodiment.from_mjcf(tmp_path / "welded.xml", floating_base=False)
    assert (as_written.floating_base, as_written.dof) == (False, floating.dof - 6)


def test_an_arm_stays_welded_unless_asked():
    assert not Embodiment.from_mjcf(ARM).floating_base
    asked = Embodiment.from_mjcf(ARM, floating_base=True)
    assert (asked.floating_base, asked.dof) == (True, 13)


PLANAR = """<mujoco><worldbody><body name="torso" pos="0 0 1">
    <joint name="x" type="slide" axis="1 0 0"/><geom type="box" size=".2 .1 .1" mass="2"/>
    <body name="thigh"><joint name="hip" axis="0 1 0"/><geom type="capsule" size=".05"
    fromto="0 0 0 0 0 -.4" mass="1"/></body></body></worldbody>
    <actuator><motor joint="hip"/></actuator></mujoco>"""


def test_floating_base_true_needs_one_jointless_root():
    with pytest.raises(EmbodimentError, match="needs one root body without joints.*root has"):
        Embodiment.from_mjcf(PLANAR, floating_base=True)
    assert not Embodiment.from_mjcf(PLANAR).floating_base

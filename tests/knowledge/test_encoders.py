"""The morphology feature encoder: shape and determinism, invariance to part order, hand-checked
features, and distances that put like bodies together."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge import EmbeddingSpace, Embodiment, Encoder, FeatureEncoder
from knowledge.embodiment._encoders import FEATURES, morphology_features

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"
GYM = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"
OWN = [
    "arm7.xml",
    "arm6.urdf",
    "gripper.xml",
    "quadruped.xml",
    "humanoid_small.xml",
    "wheeled_base.xml",
]


def load(name: str) -> Embodiment:
    if name.startswith("gym:"):
        return Embodiment.from_mjcf(GYM / name[4:])
    path = ROBOTS / name
    return Embodiment.from_urdf(path) if name.endswith(".urdf") else Embodiment.from_mjcf(path)


ALL = {name: load(name) for name in [*OWN, *(f"gym:{p.name}" for p in sorted(GYM.glob("*.xml")))]}
encoder = FeatureEncoder()


def distance(a: str, b: str) -> float:
    return float(np.linalg.norm(encoder.encode(ALL[a]) - encoder.encode(ALL[b])))


def test_encoder_describes_its_space():
    assert isinstance(encoder, Encoder)
    assert encoder.space == EmbeddingSpace("morphology-features", "7", len(FEATURES), "l2")
    assert encoder.feature_names == tuple(name for name, _ in FEATURES)
    assert len(set(encoder.feature_names)) == encoder.dim == 34


@pytest.mark.parametrize("name", sorted(ALL))
def test_vectors_are_finite_float32_and_deterministic(name):
    vector = encoder.encode(ALL[name])
    assert vector.dtype == np.float32 and vector.shape == (encoder.dim,)
    assert np.isfinite(vector).all()
    weights = np.array([w for _, w in FEATURES], np.float32)
    assert ((vector >= 0) & (vector <= 1.5 * weights)).all()  # each feature roughly in [0, 1]
    assert np.array_equal(
        vector, FeatureEncoder().encode(Embodiment.from_dict(ALL[name].to_dict()))
    )


def test_encode_many_stacks_encode():
    bodies = list(ALL.values())
    assert np.array_equal(
        encoder.encode_many(bodies), np.stack([encoder.encode(b) for b in bodies])
    )
    assert encoder.encode_many([]).shape == (0, encoder.dim)


def permuted(e: Embodiment, rnd: random.Random) -> Embodiment:
    """The same body with joints, actuators, sites and sensors listed in another order (indices
    renumbered), built directly so that canonical ordering cannot hide an order-dependent
    encoder."""
    order = list(range(len(e.joints)))
    rnd.shuffle(order)
    new = {old: i for i, old in enumerate(order)}
    actuators = [
        dataclasses.replace(a, target=tuple(new[t] for t in a.target)) if a.moves_joints else a
        for a in e.actuators
    ]
    sites, sensors = list(e.sites), list(e.sensors)
    for part in (actuators, sites, sensors):
        rnd.shuffle(part)
    joints = tuple(e.joints[i] for i in order)
    return Embodiment(e.name, e.bodies, joints, tuple(actuators), tuple(sites), tuple(sensors))


@settings(max_examples=40)
@given(name=st.sampled_from(sorted(ALL)), seed=st.integers(0, 2**32 - 1))
def test_features_do_not_depend_on_part_order(name, seed):
    original = ALL[name]
    shuffled = permuted(original, random.Random(seed))
    assert np.allclose(encoder.encode(shuffled), encoder.encode(original), rtol=1e-6, atol=1e-7)


CART = """<mujoco><worldbody><body name="chassis" pos="0 0 .3"><freejoint/>
  <geom type="box" size=".3 .2 .05" mass="10"/>{limbs}</body></worldbody>
  <actuator>{motors}</actuator></mujoco>"""
WHEEL = """<body name="{n}" pos="{x} {y} 0"><joint name="{n}" axis="0 1 0"/>
  <geom type="cylinder" size=".1 .03" zaxis="0 1 0" mass="1"/></body>"""
SHIN = """<body name="{n}" pos="{x} {y} 0"><joint name="{n}" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0 0 -.25" size=".02" mass="1"/></body>"""


def _cart(limb: str) -> Embodiment:
    """A floating chassis with four free-turning leaf joints of `limb`'s shape."""
    corners = [("fl", 0.25, 0.2), ("fr", 0.25, -0.2), ("hl", -0.25, 0.2), ("hr", -0.25, -0.2)]
    limbs = "".join(limb.format(n=n, x=x, y=y) for n, x, y in corners)
    motors = "".join(f'<motor joint="{n}"/>' for n, _, _ in corners)
    return Embodiment.from_mjcf(CART.format(limbs=limbs, motors=motors))


def test_wheels_are_free_turning_tips_of_a_floating_body_with_their_mass_on_the_axle():
    assert morphology_features(_cart(WHEEL))["wheels"] == pytest.approx(math.log(5) / math.log(17))
    assert morphology_features(_cart(SHIN))["wheels"] == 0.0  # a shin's mass hangs off its axis
    limited = _cart(WHEEL.replace('axis="0 1 0"/>', 'axis="0 1 0" range="-1 1"/>'))
    assert morphology_features(limited)["wheels"] == 0.0  # a wheel turns without end
    welded = CART.replace("<freejoint/>", "")  # a fixed base: its turning tips are not wheels
    fixed = Embodiment.from_mjcf(
        welded.format(
            limbs="".join(WHEEL.format(n=n, x=0, y=y) for n, y in (("a", 0.2), ("b", -0.2))),
            motors='<motor joint="a"/><motor joint="b"/>',
        )
    )
    assert not fixed.floating_base and morphology_features(fixed)["wheels"] == 0.0
    assert morphology_features(ALL["wheeled_base.xml"])["wheels"] > 0
    assert morphology_features(ALL["quadruped.xml"])["wheels"] == 0.0


TORSO = """<mujoco><worldbody><body name="base"><geom type="box" size=".2 .2 .1" mass="10"/>
  <body name="torso" pos="0 0 .4" {turn}>{waist}<geom type="box" size=".15 .1 .25" mass="{torso}"/>
  {chest}{arms}</body></body></worldbody></mujoco>"""
ARM = """<body name="{s}upper" pos="0 {y} .2" {turn}><joint name="{s}shoulder" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0 0 -.3" size=".04" mass="2"/>
  <body name="{s}fore" pos="0 0 -.3"><joint name="{s}elbow" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0 0 -.3" size=".03" mass="1"/></body></body>"""
CHEST = '<body name="chest" pos="0 0 .2"><geom type="sphere" size=".1" mass="8"/></body>'


def _torso(
    waist: str = "", torso: float = 20.0, chest: str = "", turn: str = "", arm_turn: str = ""
) -> Embodiment:
    """A fixed base carrying a torso (welded, or on `waist`) with two two-link arms."""
    arms = "".join(ARM.format(s=s, y=y, turn=arm_turn) for s, y in (("l", 0.2), ("r", -0.2)))
    return Embodiment.from_mjcf(
        TORSO.format(waist=waist, torso=torso, chest=chest, turn=turn, arms=arms)
    )


def test_the_trunk_is_the_base_and_what_is_welded_to_it():
    welded = morphology_features(_torso())  # a base of 10 kg of 36
    assert welded["trunk_mass_fraction"] == pytest.approx(30 / 36)  # base and welded torso
    on_a_waist = morphology_features(_torso(waist='<joint name="waist" axis="0 0 1"/>'))
    assert on_a_waist["trunk_mass_fraction"] == pytest.approx(10 / 36)  # the torso turns
    # One rigid torso split into two welded bodies, or turned, or with its arms mounted another
    # way, is the same trunk.
    for other in (
        _torso(torso=12.0, chest=CHEST),
        _torso(turn='euler="0 0 1.2"'),
        _torso(arm_turn='euler="0.7 0 0.3"'),
    ):
        assert morphology_features(other)["trunk_mass_fraction"] == pytest.approx(30 / 36)
    floating = CART.format(limbs="", motors="")  # a free joint does not move a body off its trunk
    assert morphology_features(Embodiment.from_mjcf(floating))["trunk_mass_fraction"] == 1.0


@pytest.mark.parametrize("name", sorted(ALL))
def test_the_trunk_holds_the_base(name):
    body = ALL[name]
    roots = math.fsum(b.mass for b in body.bodies if b.parent < 0) / body.mass
    trunk = morphology_features(body)["trunk_mass_fraction"]
    assert roots <= trunk + 1e-9 and trunk <= 1.0 + 1e-9


LEG = """<body name="{n}" pos="{x} {y} 0" {turn}><joint name="{n}_hip" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0 0 -.2" size=".03" mass="{m}"/>
  <body name="{n}_shin" pos="0 0 -.2"><joint name="{n}_knee" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0 0 -.2" size=".02" mass="{m}"/></body></body>"""


def _walker(masses: dict[str, float], turn: str = "", spine: bool = False) -> Embodiment:
    """A floating chassis with two-link limbs of the given masses per link (fl, fr, hl, hr); with
    `spine`, the front limbs hang from a second body on a joint."""
    at = {"fl": (0.25, 0.2), "fr": (0.25, -0.2), "hl": (-0.25, 0.2), "hr": (-0.25, -0.2)}
    legs = {n: LEG.format(n=n, x=at[n][0], y=at[n][1], m=m, turn=turn) for n, m in masses.items()}
    front = "".join(legs.pop(n) for n in ("fl", "fr") if n in legs)
    if spine:
        front = front.replace('pos=".25', 'pos="0')
        front = f"""<body name="chest" pos=".25 0 0"><joint name="spine" axis="0 1 0"/>
          <geom type="box" size=".1 .2 .05" mass="3"/>{front}</body>"""
    motors = "".join(f'<motor joint="{n}_{j}"/>' for n in masses for j in ("hip", "knee"))
    return Embodiment.from_mjcf(CART.format(limbs=front + "".join(legs.values()), motors=motors))


def test_limb_balance_is_how_evenly_the_four_heaviest_limbs_share_their_mass():
    like = {"fl": 1.0, "fr": 1.0, "hl": 1.0, "hr": 1.0}
    assert morphology_features(_walker(like))["limb_balance"] == pytest.approx(1.0)
    # legs of 2 kg a link beside arms of 1: (2 + 2) / (4 + 4)
    arms_and_legs = {"fl": 1.0, "fr": 1.0, "hl": 2.0, "hr": 2.0}
    assert morphology_features(_walker(arms_and_legs))["limb_balance"] == pytest.approx(0.5)
    # four unequal limbs, 2, 3, 4 and 5 kg a link: (third + fourth) / (first + second)
    unequal = {"fl": 2.0, "fr": 3.0, "hl": 4.0, "hr": 5.0}
    assert morphology_features(_walker(unequal))["limb_balance"] == pytest.approx(5 / 9)
    assert morphology_features(_walker({"hl": 2.0, "hr": 2.0}))["limb_balance"] == 0.0
    assert morphology_features(_cart(WHEEL))["limb_balance"] == 0.0  # a wheel is one body
    # one-link legs on the trunk (a minitaur with locked knees) are limbs; one-link fingers on a
    # hand that hangs on a joint are not
    assert morphology_features(_cart(SHIN))["limb_balance"] == pytest.approx(1.0)
    fingers = "".join(SHIN.format(n=f"f{i}", x=0.05 * i, y=0) for i in range(4))
    hand = f"""<body name="hand" pos=".3 0 0"><joint name="wrist" axis="0 0 1"/>
      <geom type="box" size=".05 .05 .02" mass="1"/>{fingers}</body>"""
    on_a_hand = Embodiment.from_mjcf(CART.format(limbs=hand, motors='<motor joint="wrist"/>'))
    assert morphology_features(on_a_hand)["limb_balance"] == 0.0
    # nor are they on a fixed palm: one-link legs are a floating body's
    palm = f"""<mujoco><worldbody><body name="palm"><geom type="box" size=".05 .05 .02"/>
      {fingers}</body></worldbody><actuator>{"".join(f'<motor joint="f{i}"/>' for i in range(4))}
      </actuator></mujoco>"""
    assert morphology_features(Embodiment.from_mjcf(palm))["limb_balance"] == 0.0
    assert morphology_features(ALL["arm7.xml"])["limb_balance"] == 0.0  # one chain
    # a limb stops below a root: four stands of unlike mass, each holding a like two-link chain
    stand = """<body name="s{i}" pos="{i} 0 0"><geom type="box" size=".1 .1 .1" mass="{m}"/>
      <body name="a{i}"><joint name="a{i}" axis="0 1 0"/><geom type="sphere" size=".1" mass="1"/>
      <body name="b{i}"><joint name="b{i}" axis="0 1 0"/><geom type="sphere" size=".1" mass="1"/>
      </body></body></body>"""
    stands = "".join(stand.format(i=i, m=m) for i, m in enumerate((50, 50, 10, 10)))
    scene = Embodiment.from_mjcf(f"<mujoco><worldbody>{stands}</worldbody></mujoco>")
    assert morphology_features(scene)["limb_balance"] == pytest.approx(1.0)
    # a spine between the front and hind legs, limbs mounted turned: the same limbs
    for other in (_walker(like, spine=True), _walker(like, turn='euler="0.4 0 1.1"')):
        assert morphology_features(other)["limb_balance"] == pytest.approx(1.0)


STRUCTURE = ("dof", "end_effectors", "chain_depth", "branching", "limb_balance", "wheels")


def test_structure_is_read_on_rigid_parts_so_welded_bodies_change_nothing():
    """A head welded to an arm's first link, feet and covers welded to a walker: MuJoCo's URDF
    import would fuse them into their links, and the structure features do not see them either."""
    text = (ROBOTS / "arm7.xml").read_text()
    head = '<body name="head" pos="0 0.1 0.1"><geom type="sphere" size="0.08" mass="2"/></body>'
    with_head = Embodiment.from_mjcf(
        text.replace('<body name="link2"', head + '<body name="link2"')
    )
    assert len(with_head.bodies) == len(ALL["arm7.xml"].bodies) + 1
    plain, headed = morphology_features(ALL["arm7.xml"]), morphology_features(with_head)
    assert {k: headed[k] for k in STRUCTURE} == {k: plain[k] for k in STRUCTURE}
    like = {"fl": 1.0, "fr": 1.0, "hl": 1.0, "hr": 1.0}
    walker = _walker(like)
    # a foot below each shin, a kneepad beside each thigh (a side branch: the rule before version 6
    # counted 8 tips and no limbs), a cover on the chassis
    pad = (
        '<body name="{n}_{part}" pos="0 .03 -.2"><geom type="sphere" size=".02" mass=".1"/></body>'
    )
    legs = []
    for n, (x, y) in {
        "fl": (0.25, 0.2),
        "fr": (0.25, -0.2),
        "hl": (-0.25, 0.2),
        "hr": (-0.25, -0.2),
    }.items():
        leg = LEG.format(n=n, x=x, y=y, m=1.0, turn="")
        leg = leg.replace(
            f'<body name="{n}_shin"', pad.format(n=n, part="kneepad") + f'<body name="{n}_shin"'
        )
        legs.append(leg.replace("</body></body>", pad.format(n=n, part="foot") + "</body></body>"))
    cover = '<body name="cover" pos="0 0 .1"><geom type="box" size=".1 .1 .02" mass="1"/></body>'
    motors = "".join(f'<motor joint="{n}_{j}"/>' for n in like for j in ("hip", "knee"))
    padded = Embodiment.from_mjcf(CART.format(limbs="".join(legs) + cover, motors=motors))
    assert len(padded.bodies) == len(walker.bodies) + 9
    assert len(padded.end_effectors) == 4 and morphology_features(padded)["limb_balance"] == 1.0
    assert {k: morphology_features(padded)[k] for k in STRUCTURE} == {
        k: morphology_features(walker)[k] for k in STRUCTURE
    }


def test_features_of_the_7dof_arm_by_hand():
    features = morphology_features(ALL["arm7.xml"])
    assert features["floating_base"] == 0.0
    assert features["dof"] == pytest.approx(math.log(8) / math.log(65))
    assert features["end_effectors"] == pytest.approx(math.log(2) / math.log(17))
    assert features["chain_depth"] == pytest.approx(
        math.log(8) / math.log(17)
    )  # 7 jointed links to the hand
    assert (
        features["hinge_fraction"],
        features["actuated_fraction"],
        features["position_fraction"],
    ) == (1.0, 1.0, 1.0)
    assert features["mass"] == pytest.approx((math.log10(19.0) + 2) / 5)
    assert features["reach"] == pytest.approx((math.log10(1.2) + 2) / 3)
    assert features["trunk_mass_fraction"] == pytest.approx(4 / 19)  # link1 turns on the base
    assert features["strength"] == pytest.approx(
        math.log1p((4 * 87 + 3 * 12) / 7) / math.log1p(1000)
    )
    assert features["force_torque_sensors"] == pytest.approx(math.log(3) / math.log(9))


def test_urdf_effort_limits_count_as_actuation():
    features = morphology_features(ALL["arm6.urdf"])  # MuJoCo makes no actuators from URDF
    assert features["actuated_fraction"] == pytest.approx(
        5 / 6
    )  # every joint but the continuous wrist_3
    assert features["strength"] == pytest.approx(
        math.log1p((3 * 150 + 2 * 28) / 5) / math.log1p(1000)
    )


def test_like_bodies_are_near():
    others = ["quadruped.xml", "humanoid_small.xml", "wheeled_base.xml", "gym:ant.xml"]
    assert distance("arm7.xml", "arm6.urdf") < min(distance("arm7.xml", other) for other in others)
    assert distance("gym:ant.xml", "quadruped.xml") < distance("gym:ant.xml", "arm7.xml")
    assert distance("gym:humanoid.xml", "humanoid_small.xml") < min(
        distance("gym:humanoid.xml", other)
        for other in ["arm7.xml", "arm6.urdf", "gripper.xml", "wheeled_base.xml"]
    )
    assert (
        distance("gym:humanoid.xml", "gym:humanoidstandup.xml")
        < 0.1
        < distance("gym:humanoid.xml", "gym:ant.xml")
    )
    assert distance("gym:walker2d.xml", "gym:walker2d_v5.xml") == 0.0


def test_embedding_space_checks_its_fields():
    for bad in [("", "1", 4), ("x", "", 4), ("x", "1", 0)]:
        with pytest.raises(ValueError):
            EmbeddingSpace(*bad)
    with pytest.raises(ValueError, match="metric"):
        EmbeddingSpace("x", "1", 4, "manhattan")  # type: ignore[arg-type]

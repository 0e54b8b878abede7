"""A robot without its scene.

MJCF files written for a task hold the task's objects beside the robot: a ball on slide joints, a
target on a free joint, a table. Read as the robot, they add degrees of freedom and mass, and a free
object makes an arm look like a floating base. So when some trees hanging on the world are driven
by actuators, the others are the scene and are left out: a tree is the robot if an actuator moves
one of its joints or bodies. A model with no actuators, or whose actuators reach no tree, is kept
whole (nothing tells robot from scene there).

A model that declares no actuators at all (dm_control's jaco arm and hand, whose loaders add them
in Python) still says which joints have motors: MuJoCo's `armature` is the inertia of a geared
rotor behind the joint. `with_armature_motors` gives each such hinge or slide joint the motor a
`<motor joint=.../>` line would, its control limited to the joint's `actuatorfrcrange` if any, as
URDF's reader reads a motor from a joint's effort limit (the file's actuator defaults are not
applied: no line names them). A model with any actuator is read as written.

And walker models written to be placed in a scene (dm_control's, PyBullet's MJCF) often leave
their root welded to the world, the loader adding the free joint: `with_floating_base` gives them
theirs (`Embodiment.from_mjcf(floating_base=...)` decides otherwise).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .._errors import EmbodimentError
from ._parts import Actuator, Joint, Parts
from ._urdf import named_as_leg


def with_armature_motors(parts: Parts) -> Parts:
    """The parts with a motor on each hinge or slide joint that has armature, when the model
    declares no actuator (module docstring); `parts` otherwise."""
    name, bodies, joints, actuators, sites, sensors = parts
    if actuators:
        return parts
    motors = [
        Actuator(
            joint.name,
            "joint",
            (j,),
            "motor",
            (1.0, 0.0, 0.0, 0.0, 0.0, 0.0),
            1.0,
            (0.0, 0.0, 0.0),
            joint.force_range,
            None,
        )
        for j, joint in enumerate(joints)
        if joint.type in ("hinge", "slide") and joint.armature > 0
    ]
    return (name, bodies, joints, motors, sites, sensors) if motors else parts


def robot_only(parts: Parts) -> Parts:
    """The parts of the trees an actuator drives, indices renumbered; `parts` if that is all."""
    name, bodies, joints, actuators, sites, sensors = parts
    tree = list(range(len(bodies)))  # each body's tree: the body on the world it hangs from
    for i, body in enumerate(bodies):
        if body.parent >= 0:
            tree[i] = tree[body.parent]  # bodies come after their parents, as MuJoCo orders them
    driven = {
        tree[joints[t].body if actuator.moves_joints else t]
        for actuator in actuators
        for t in actuator.target
        if actuator.moves_joints or t >= 0
    }
    keep = [tree[i] in driven for i in range(len(bodies))]
    if not driven or all(keep):
        return parts
    body_at = {old: new for new, old in enumerate(i for i in range(len(bodies)) if keep[i])}
    body_at[-1] = -1
    kept_joints = [j for j, joint in enumerate(joints) if keep[joint.body]]
    joint_at = {old: new for new, old in enumerate(kept_joints)}
    return (
        name,
        [replace(b, parent=body_at[b.parent]) for i, b in enumerate(bodies) if keep[i]],
        [replace(joints[j], body=body_at[joints[j].body]) for j in kept_joints],
        [
            replace(a, target=tuple((joint_at if a.moves_joints else body_at)[t] for t in a.target))
            for a in actuators  # every actuator moves a kept tree, or only the world
        ],
        [replace(s, body=body_at[s.body]) for s in sites if s.body < 0 or keep[s.body]],
        [replace(s, body=body_at[s.body]) for s in sensors if s.body < 0 or keep[s.body]],
    )


def with_floating_base(label: str, parts: Parts, floating_base: bool | None) -> Parts:
    """The parts with a free joint on the root, where the file leaves a walker welded.

    As for URDF, a model whose one root body has no joint floats when it has legs (`has_legs`),
    or when `floating_base=True`; `floating_base=False` keeps the file as written. Wheels are not
    looked for: MJCF hinges are unlimited unless a range is given, so "turns freely" says nothing
    there.
    """
    name, bodies, joints, actuators, sites, sensors = parts
    if floating_base is False or any(joint.type == "free" for joint in joints):
        return parts
    roots = [i for i, body in enumerate(bodies) if body.parent < 0]
    jointless_root = len(roots) == 1 and all(joint.body != roots[0] for joint in joints)
    if floating_base and not jointless_root:
        raise EmbodimentError(
            f"{label}: floating_base=True needs one root body without joints, to give it a free "
            f"joint; this model has {len(roots)} root bodies"
            + ("" if len(roots) != 1 else " and its root has joints")
        )
    if not jointless_root or not (floating_base or has_legs(parts)):
        return parts
    free = Joint("floating_base", roots[0], "free", (0.0, 0.0, 1.0), None, 0.0, 0.0, 0.0, None)
    return (
        name,
        bodies,
        [free, *joints],
        [
            replace(a, target=tuple(t + 1 for t in a.target)) if a.moves_joints else a
            for a in actuators
        ],
        sites,
        sensors,
    )


def has_legs(parts: Parts) -> bool:
    """At least two legs: bodies named as legs, or carrying a joint named as one
    (`_urdf.named_as_leg`), with no such body above them and two or more joints in their subtree.
    Unlike URDF's rule, pointing down does not make a leg here: MJCF grippers (robosuite's) hang
    their fingers below a jointless root too, and a rodent's legs hang from a jointed spine."""
    _, bodies, joints, _, _, _ = parts
    named = [named_as_leg([body.name]) for body in bodies]
    for joint in joints:
        named[joint.body] = named[joint.body] or named_as_leg([joint.name])
    leg = [-1] * len(bodies)  # the topmost leg-named body at or above each body, if any
    for i, body in enumerate(bodies):
        above = leg[body.parent] if body.parent >= 0 else -1
        leg[i] = above if above >= 0 else i if named[i] else -1
    joints_in = Counter(leg[joint.body] for joint in joints)
    return sum(count >= 2 for top, count in joints_in.items() if top >= 0) >= 2

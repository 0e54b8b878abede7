"""Robot bodies described from their MuJoCo-compiled models.

A descriptor says what a body *is* (kinematic tree, joints, actuators, masses, sensors), not how its
file is written: MuJoCo compiles the MJCF or URDF first, so defaults, includes, angle units and
`fromto` shorthands are resolved (`_mjcf`), and the parts (`_parts`) are put in a canonical order so
that the fingerprint names the body, not the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .._canonical import canonical_json, content_hash
from .._errors import EmbodimentError
from ._mjcf import read_mjcf, read_urdf
from ._parts import (
    ACTUATOR_KINDS,
    JOINT_DOF,
    Actuator,
    Body,
    EmbodimentSite,
    Joint,
    Parts,
    Sensor,
)

FORMAT = 1
"""Version of the `to_dict` layout; `from_dict` refuses other versions rather than guess."""
_MAX_PARTS = 4096


@dataclass(frozen=True)
class Embodiment:
    """The descriptor of a robot body, in canonical order. Build it with `from_mjcf`, `from_urdf` or
    `from_dict`."""

    name: str
    bodies: tuple[Body, ...] = field(repr=False)
    joints: tuple[Joint, ...] = field(repr=False)
    actuators: tuple[Actuator, ...] = field(repr=False)
    sites: tuple[EmbodimentSite, ...] = field(repr=False)
    sensors: tuple[Sensor, ...] = field(repr=False)

    @classmethod
    def from_mjcf(
        cls, source: str | os.PathLike[str], *, floating_base: bool | None = None
    ) -> Embodiment:
        """Describe an MJCF file, or MJCF text (a string starting with `<`; includes resolve from
        the cwd).

        The robot is the trees an actuator drives: a task's objects beside it (a ball, a free
        target, a table) are left out. A walker whose one root body hangs on the world without a
        joint gets a free joint when it has legs, or with `floating_base=True`;
        `floating_base=False` keeps the file as written (`knowledge/embodiment/_scene.py`).
        """
        return _canonical(*read_mjcf(source, floating_base=floating_base))

    @classmethod
    def from_urdf(
        cls,
        path: str | os.PathLike[str],
        *,
        floating_base: bool | None = None,
        package_path: Iterable[str | os.PathLike[str]] | None = None,
        balance_inertia: bool = False,
    ) -> Embodiment:
        """Describe a URDF (or xacro) file. MuJoCo fuses links on fixed joints into their parent.

        What URDF leaves unsaid is filled in by rules (`knowledge/embodiment/_urdf.py`): a robot
        with legs or wheels floats unless `floating_base=False` (a fixed robot's base is fused into
        the world); transmissions, else effort limits, make actuators; `package://` URIs resolve
        from `package_path`, then ROS_PACKAGE_PATH, then the file's folders; `balance_inertia=True`
        repairs inertias MuJoCo refuses.
        """
        return _canonical(
            *read_urdf(
                path,
                floating_base=floating_base,
                package_path=package_path,
                balance_inertia=balance_inertia,
            )
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Embodiment:
        """Read a descriptor from `to_dict` output (for example from a peer's record), checking
        every field."""
        where = "embodiment descriptor"
        if not isinstance(data, Mapping):
            raise EmbodimentError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise EmbodimentError(
                f"{where}: format {data.get('format')!r} is not {FORMAT}, "
                "the one this library reads"
            )
        unknown = set(data) - {"format", "name", *_PARTS, *_DERIVED}
        if unknown:
            raise EmbodimentError(f"{where}: unknown keys {sorted(unknown)}")
        parts = {key: _parse_list(kind, data.get(key), key) for key, kind in _PARTS.items()}
        embodiment = _canonical(_parse("text", data.get("name"), "name"), **parts)
        _ = embodiment.mass  # masses adding up past the float range are no body: EmbodimentError
        for key in _CHECKED:
            if key in data and data[key] != _plain(getattr(embodiment, key)):
                found = getattr(embodiment, key)
                raise EmbodimentError(
                    f"{where}: {key} says {data[key]!r} but the parts give {found!r}"
                )
        return embodiment

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, canonical form; totals and the fingerprint are included for readers (dof, mass
        and the fingerprint are checked on reading).

        Canonicalized again first, so an Embodiment edited by hand (dataclasses.replace) round-trips
        too; one a reader or `from_dict` made is canonical already (canonical order is a fixed
        point), and skipping the second pass took a tenth off a mesh robot's first query.
        """
        canon = self
        if not self.__dict__.get(_CANONICAL):
            canon = _canonical(self.name, **{key: getattr(self, key) for key in _PARTS})
        data: dict[str, Any] = {"format": FORMAT, "name": canon.name}
        data.update({key: [_plain(item) for item in getattr(canon, key)] for key in _PARTS})
        data.update({key: _plain(getattr(canon, key)) for key in _DERIVED})
        return data

    @cached_property
    def fingerprint(self) -> str:
        """Hex SHA-256 of the compact, key-sorted JSON of `to_dict()` without names, totals and
        fingerprint.

        It covers what the descriptor records and nothing else: the tree with each body's pose,
        mass, inertia and extent; joints with their limits, damping, armature and frictionloss
        (joint friction, URDF `<dynamics friction>`); actuators; sites; sensors. Names are labels,
        so renaming a joint keeps it. Contact properties are not recorded and do not count: geom
        friction, solref/solimp, condim, margins, and shapes beyond each body's extent. So two
        robots that differ only in foot friction share a fingerprint, by design: contact friction
        belongs to a pair of surfaces (MuJoCo combines both geoms'), and a skill's certificates
        randomize it across branches (`randomized=["friction"]`) rather than treat it as a body.
        """
        physical: dict[str, Any] = {
            key: [_plain(item, names=False) for item in getattr(self, key)] for key in _PARTS
        }
        physical["format"] = FORMAT
        return content_hash(physical)

    @cached_property
    def dof(self) -> int:
        return sum(JOINT_DOF[joint.type] for joint in self.joints)

    @cached_property
    def mass(self) -> float:
        try:
            total = math.fsum(body.mass for body in self.bodies)
        except OverflowError:  # masses past the float range: `_num` refuses the total
            total = math.inf
        return _num(total)

    @cached_property
    def floating_base(self) -> bool:
        return any(joint.type == "free" for joint in self.joints)

    @cached_property
    def rigid_parts(self) -> tuple[int, ...]:
        """Each body's rigid part, as the index of the part's top body: a root or a body on a
        joint, with every body welded below it (no joint between). MuJoCo's URDF import fuses
        fixed links so, while MJCF files split one rigid part into bodies as their authors like (a
        camera frame, a fingertip pad, a head on a robot's first link): structure read on parts
        does not depend on how a file splits them."""
        jointed = {joint.body for joint in self.joints}
        top: list[int] = []
        for i, body in enumerate(self.bodies):  # parents precede children
            top.append(i if body.parent < 0 or i in jointed else top[body.parent])
        return tuple(top)

    @cached_property
    def end_effectors(self) -> tuple[int, ...]:
        """The physical tips of moving chains (hands, fingertips, feet, wheels): the moving rigid
        parts (`rigid_parts`) that no other part hangs on, each named by its top body (a shin, not
        the foot welded to it). Whatever is welded to a part (vendor frames, a pad, a fixed jaw) is
        that part, not another tip."""
        top, moving = self.rigid_parts, self._moving()
        inner = {top[b.parent] for i, b in enumerate(self.bodies) if top[i] == i and b.parent >= 0}
        return tuple(
            i for i in range(len(self.bodies)) if top[i] == i and moving[i] and i not in inner
        )

    @cached_property
    def reach(self) -> float:
        """Longest path from a base (a body on the world) through link offsets to the tip of a
        moving body."""
        path = [0.0] * len(self.bodies)
        for i, body in enumerate(self.bodies):
            if body.parent >= 0:
                path[i] = path[body.parent] + body.link_length
        moving = self._moving()
        return _num(
            max((path[i] + b.extent for i, b in enumerate(self.bodies) if moving[i]), default=0.0)
        )

    def _moving(self) -> list[bool]:
        """Whether each body has a joint on itself or an ancestor (parents precede children)."""
        jointed = {joint.body for joint in self.joints}
        moving: list[bool] = []
        for i, body in enumerate(self.bodies):
            moving.append(i in jointed or (body.parent >= 0 and moving[body.parent]))
        return moving

    def __repr__(self) -> str:
        return (
            f"Embodiment({self.name!r}, dof={self.dof}, mass={self.mass}, "
            f"fingerprint={self.fingerprint[:12]!r})"
        )


def describe(parts: Parts) -> Embodiment:
    """The descriptor of the parts a reader gave (for callers that run the reader themselves)."""
    return _canonical(*parts)


_PARTS: dict[str, type] = {
    "bodies": Body,
    "joints": Joint,
    "actuators": Actuator,
    "sites": EmbodimentSite,
    "sensors": Sensor,
}
_DERIVED = ("dof", "mass", "reach", "end_effectors", "fingerprint")
_CHECKED = ("dof", "mass", "fingerprint")
"""Derived values `from_dict` checks. Reach and end effectors are interpretations a newer version
may refine (since feature version 6, whatever is welded to a link is that link, not a tip): an
older peer's are recomputed, not refused."""
_REFS = frozenset({"parent", "body", "target"})
_CANONICAL = "_canonical_form"
"""Set in the instance's `__dict__` by `_canonical`: `to_dict` need not order it again."""


# -- canonical order -------------------------------------------------------------------------------


def _canonical(
    name: str, bodies: Any, joints: Any, actuators: Any, sites: Any, sensors: Any
) -> Embodiment:
    """Round every number, check every index, and order the parts so that sibling order cannot show.

    Each body's subtree gets a hash of its own content (joints, sites, sensors and actuators
    attached to it, names left out) and of its children's hashes; siblings are visited in hash
    order, names breaking ties.
    """
    bodies, joints, actuators, sites, sensors = (
        [_rounded(item) for item in part] for part in (bodies, joints, actuators, sites, sensors)
    )
    n = len(bodies)
    refs = [(f"bodies[{i}].parent", b.parent, -1, i) for i, b in enumerate(bodies)]
    refs += [(f"joints[{i}].body", j.body, 0, n) for i, j in enumerate(joints)]
    refs += [(f"sites[{i}].body", x.body, -1, n) for i, x in enumerate(sites)]
    refs += [(f"sensors[{i}].body", x.body, -1, n) for i, x in enumerate(sensors)]
    refs += [
        (f"actuators[{i}].target", t, *((0, len(joints)) if a.moves_joints else (-1, n)))
        for i, a in enumerate(actuators)
        for t in a.target
    ]
    for what, ref, low, high in refs:
        if not low <= ref < high:
            raise EmbodimentError(f"embodiment: {what} is {ref}, outside {low}..{high - 1}")

    local: list[list[Any]] = [[_plain(b, names=False, refs=False), [], [], [], []] for b in bodies]
    position_in_body: dict[int, int] = {}
    for j, joint in enumerate(joints):
        position_in_body[j] = len(local[joint.body][1])
        local[joint.body][1].append(_plain(joint, names=False, refs=False))
    for site in sites:
        if site.body >= 0:
            local[site.body][2].append(_plain(site, names=False, refs=False))
    for sensor in sensors:
        if sensor.body >= 0:
            local[sensor.body][3].append(_plain(sensor, names=False, refs=False))
    for act in actuators:
        if act.moves_joints and len(act.target) == 1:
            owner, where = joints[act.target[0]].body, position_in_body[act.target[0]]
        elif not act.moves_joints and len(act.target) == 1 and act.target[0] >= 0:
            owner, where = act.target[0], -1
        else:
            continue  # multi-joint tendons join the order after the bodies are placed
        local[owner][4].append([_plain(act, names=False, refs=False), where])

    children: list[list[int]] = [[] for _ in range(n)]
    roots: list[int] = []
    for i, body in enumerate(bodies):
        (children[body.parent] if body.parent >= 0 else roots).append(i)
    digest = [""] * n
    for i in reversed(range(n)):
        content = [
            local[i][0],
            local[i][1],
            *(sorted(canonical_json(x).decode() for x in part) for part in local[i][2:]),
        ]
        digest[i] = content_hash([content, sorted(digest[c] for c in children[i])])

    def rank(i: int) -> tuple[str, str, int]:
        return digest[i], bodies[i].name, i

    order: list[int] = []
    stack = sorted(roots, key=rank, reverse=True)
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(sorted(children[i], key=rank, reverse=True))
    new_body = {old: new for new, old in enumerate(order)}
    new_body[-1] = -1

    def body_of(item: Any) -> Any:
        return item.__class__(**{**_fields(item), "body": new_body[item.body]})

    placed_joints = sorted(range(len(joints)), key=lambda j: (new_body[joints[j].body], j))
    new_joint = {old: new for new, old in enumerate(placed_joints)}

    def retarget(act: Actuator) -> Actuator:
        table = new_joint if act.moves_joints else new_body
        return Actuator(**{**_fields(act), "target": tuple(sorted(table[t] for t in act.target))})

    def by_content(item: Any) -> tuple[Any, ...]:
        ref = item.target if isinstance(item, Actuator) else item.body
        return ref, canonical_json(_plain(item, names=False, refs=False)), item.name

    embodiment = Embodiment(
        name=name,
        bodies=tuple(
            Body(**{**_fields(bodies[old]), "parent": new_body[bodies[old].parent]})
            for old in order
        ),
        joints=tuple(body_of(joints[old]) for old in placed_joints),
        actuators=tuple(sorted(map(retarget, actuators), key=by_content)),
        sites=tuple(sorted(map(body_of, sites), key=by_content)),
        sensors=tuple(sorted(map(body_of, sensors), key=by_content)),
    )
    embodiment.__dict__[_CANONICAL] = True  # not a field: `replace` makes one without it
    return embodiment


# -- numbers and plain data ------------------------------------------------------------------------


def _num(x: float) -> float:
    """Six significant digits, tiny values to zero: compiled numbers differ in last bits between
    equivalent files (summation order), and the fingerprint must not see that."""
    if not math.isfinite(x):
        raise EmbodimentError(f"embodiment: non-finite number {x}")
    return 0.0 if abs(x) < 1e-12 else float(f"{x:.6g}") + 0.0


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, tuple) and value and isinstance(value[0], float):
        return tuple(_num(v) for v in value)
    return value


def _rounded(item: Any) -> Any:
    values = {key: _round(value) for key, value in _fields(item).items()}
    if isinstance(item, Body) and next((q for q in values["quat"] if q != 0), 1.0) < 0:
        values["quat"] = tuple(0.0 - q for q in values["quat"])  # q and -q are one rotation
    return item.__class__(**values)


def _fields(item: Any) -> dict[str, Any]:
    """A part's fields by name, in order (the parts declare no pseudo-fields, so this is what
    `dataclasses.fields` gives, at a fraction of its cost on descriptors of thousands of parts)."""
    return {name: getattr(item, name) for name in item.__dataclass_fields__}


def _plain(value: Any, *, names: bool = True, refs: bool = True) -> Any:
    """JSON-safe form of a part, optionally without its name and its indices into other parts."""
    if hasattr(value, "__dataclass_fields__"):
        return {
            key: _plain(v)
            for key, v in _fields(value).items()
            if (names or key != "name") and (refs or key not in _REFS)
        }
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# -- checking plain data ---------------------------------------------------------------------------

_SCHEMA: dict[type, dict[str, Any]] = {
    # field kinds: "text", "int", "num", N (a list of N numbers), "range" (two numbers or null),
    # "ints" (a list of indices), or a tuple of the allowed strings
    Body: dict(
        name="text", parent="int", pos=3, quat=4, mass="num", com=3, inertia=6, extent="num"
    ),
    Joint: dict(
        name="text",
        body="int",
        type=tuple(JOINT_DOF),
        axis=3,
        range="range",
        damping="num",
        armature="num",
        frictionloss="num",
        force_range="range",
    ),
    Actuator: dict(
        name="text",
        transmission="text",
        target="ints",
        kind=ACTUATOR_KINDS,
        gear=6,
        gain="num",
        bias=3,
        ctrl_range="range",
        force_range="range",
    ),
    EmbodimentSite: dict(name="text", body="int", pos=3),
    Sensor: dict(name="text", type="text", dim="int", body="int"),
}


def _fail(where: str, what: str, value: Any) -> EmbodimentError:
    return EmbodimentError(f"embodiment descriptor: {where} must be {what}, got {value!r:.80}")


def _parse(kind: Any, value: Any, where: str) -> Any:
    """One field of plain data, checked against its kind in `_SCHEMA` (bools are not numbers)."""
    if kind == "range":
        return None if value is None else _parse(2, value, where)
    if isinstance(kind, int) or kind == "ints":
        size, item = (kind, "num") if isinstance(kind, int) else (None, "int")
        if (
            not isinstance(value, list)
            or len(value) != (size or len(value))
            or len(value) > _MAX_PARTS
        ):
            raise _fail(where, f"a list of {size or 'at most ' + str(_MAX_PARTS)} {item}s", value)
        return tuple(_parse(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(kind, tuple):
        if value not in kind:
            raise _fail(where, f"one of {list(kind)}", value)
        return value
    if kind == "text" and not (isinstance(value, str) and len(value) <= 200):
        raise _fail(where, "a string of at most 200 characters", value)
    if kind == "int" and type(value) is not int:
        raise _fail(where, "an integer", value)
    if kind == "num":
        if type(value) not in (int, float) or not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        return float(value)
    return value


def _parse_list(part: type, value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > _MAX_PARTS:
        raise _fail(where, f"a list of at most {_MAX_PARTS} objects", value)
    schema, parsed = _SCHEMA[part], []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or set(item) != set(schema):
            raise _fail(f"{where}[{i}]", f"an object with keys {sorted(schema)}", item)
        parsed.append(
            part(
                **{
                    key: _parse(kind, item[key], f"{where}[{i}].{key}")
                    for key, kind in schema.items()
                }
            )
        )
    return parsed

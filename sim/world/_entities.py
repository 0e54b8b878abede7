"""Entities (robots, objects, fixtures) compiled into a shard's template, and their state by name.

A shard's template is its scene plus its entities, each attached under the prefix "<entity>/" (so
one robot model can appear many times), always through `MjSpec` and back to MJCF text: every
template of a world, the first and those after a migration, is made the same way and compiles the
same on replay. State moves between templates by element name, which is what lets an entity leave
one shard and enter another with its joints, controls and warm start intact.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import mujoco
import numpy as np

from .._errors import TemplateError
from .._numbers import finite_floats
from .._patches import Patch
from .._templates import split_target

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SCENERY = (
    mujoco.mjtObj.mjOBJ_GEOM,
    mujoco.mjtObj.mjOBJ_SITE,
    mujoco.mjtObj.mjOBJ_LIGHT,
    mujoco.mjtObj.mjOBJ_CAMERA,
)
_FREE, _BALL = int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)
_INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION
_OBJ = mujoco.mjtObj


def check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r}: use 1-64 letters, digits, '_', '.', '-'")
    return name


@dataclass(frozen=True)
class Entity:
    """A robot, object or fixture: an MJCF model of it alone, placed in `shard` at `pos`.

    Only the model's bodies (with their joints, actuators, sensors, defaults) become the entity:
    its worldbody's own geoms, sites, lights and cameras (a floor, a lamp) and its keyframes are
    scenery of the file, and the shard's scene decides the options.
    """

    name: str
    mjcf: str
    shard: str
    pos: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        check_name("entity", self.name)
        check_name("shard", self.shard)
        if not isinstance(self.mjcf, str):
            raise TemplateError(
                f"entity {self.name!r}: mjcf must be MJCF text, got {type(self.mjcf).__name__}"
            )
        pos = finite_floats(self.pos)
        if pos is None or len(pos) != 3:
            raise ValueError(
                f"entity {self.name!r}: pos must be three finite numbers, got {self.pos!r}"
            )
        object.__setattr__(self, "pos", tuple(pos))

    def to_json(self) -> dict:
        return {"name": self.name, "mjcf": self.mjcf, "shard": self.shard, "pos": list(self.pos)}

    @classmethod
    def from_json(cls, data: Mapping) -> Entity:
        return cls(data["name"], data["mjcf"], data["shard"], tuple(data["pos"]))


def compose(scene: str, entities: Iterable[Entity]) -> str:
    """The MJCF text of `scene` with `entities` attached, in name order; TemplateError if it
    fails."""
    spec = _parse("the scene", scene)
    for entity in sorted(entities, key=lambda e: e.name):
        child = _parse(f"entity {entity.name!r}", entity.mjcf)
        _strip_scenery(child, spec)
        frame = spec.worldbody.add_frame(pos=list(entity.pos))
        spec.attach(child, prefix=f"{entity.name}/", frame=frame)
    try:
        spec.compile()
    except ValueError as exc:
        raise TemplateError(
            f"the shard's scene with entities {sorted(e.name for e in entities)} "
            f"does not compile: {exc}"
        ) from exc
    return spec.to_xml()


def _parse(what: str, mjcf: str) -> mujoco.MjSpec:
    """The spec of `mjcf`; TemplateError if it does not parse or names asset files: a world stores
    MJCF text only, so a relative file would not be found when the world opens elsewhere."""
    try:
        mjcf.encode()  # a lone surrogate: text that UTF-8 cannot store (nor MuJoCo read)
        spec = mujoco.MjSpec.from_string(mjcf)
    except ValueError as exc:  # UnicodeEncodeError included
        raise TemplateError(f"{what} does not parse: {exc}") from exc
    for kind, assets in (
        ("mesh", spec.meshes),
        ("texture", spec.textures),
        ("hfield", spec.hfields),
        ("skin", spec.skins),
    ):
        for asset in assets:
            files = [f for f in (asset.file, *getattr(asset, "cubefiles", ())) if f]
            if files:
                raise TemplateError(
                    f"{what}: {kind} {asset.name!r} loads file {files[0]!r}; a world stores MJCF "
                    "text only: inline the asset or drop it"
                )
    return spec


def _strip_scenery(child: mujoco.MjSpec, parent: mujoco.MjSpec) -> None:
    """Keep the bodies only; name unnamed joints, actuators and bodies so their state can move by
    name; take the parent's options so that attaching raises no conflict."""
    for kind in _SCENERY:
        for element in child.worldbody.find_all(kind):
            if element.parent.name == "world":
                child.delete(element)
    for key in list(child.keys):
        child.delete(key)
    for kind, elements in (
        ("joint", child.joints),
        ("actuator", child.actuators),
        ("body", child.bodies[1:]),
    ):
        for i, element in enumerate(elements):
            if not element.name:
                element.name = f"~{kind}{i}"
    for attr in dir(parent.option):
        if not attr.startswith("_"):
            setattr(child.option, attr, getattr(parent.option, attr))


@functools.lru_cache(maxsize=4096)  # called for every mutation a world logs
def entity_of(target: str) -> str:
    """The entity a mutation target addresses ("joint/walker1/hhip/qpos" -> "walker1"), or "" for
    the shard."""
    parts = split_target(target)
    return parts[1].split("/", 1)[0] if parts and "/" in parts[1] else ""


def entity_patch(patch: Patch, entity: str) -> tuple[Patch, Patch]:
    """(the mutations of `entity`'s elements, the rest), each in order."""
    mine = tuple(m for m in patch.mutations if entity_of(m.target) == entity)
    rest = tuple(m for m in patch.mutations if entity_of(m.target) != entity)
    return Patch(mine), Patch(rest)


# ---- state by name: what moves between templates ----


def named_state(model: mujoco.MjModel, row: np.ndarray, prefix: str = "") -> dict:
    """The state of the named joints, actuators, bodies and equalities (those under `prefix`), from
    a mjSTATE_INTEGRATION row, as JSON-safe lists."""
    data = _data(model, row)
    out: dict[str, dict] = {"joint": {}, "actuator": {}, "body": {}, "equality": {}}
    for name, qpos, dofs in _joints(model, prefix):
        out["joint"][name] = {
            "qpos": data.qpos[qpos].tolist(),
            "qvel": data.qvel[dofs].tolist(),
            "qacc_warmstart": data.qacc_warmstart[dofs].tolist(),
            "qfrc_applied": data.qfrc_applied[dofs].tolist(),
        }
    for name, i, acts in _actuators(model, prefix):
        out["actuator"][name] = {"ctrl": [float(data.ctrl[i])], "act": data.act[acts].tolist()}
    for name, i in _named(model, _OBJ.mjOBJ_BODY, model.nbody, prefix):
        entry = {"xfrc_applied": data.xfrc_applied[i].tolist()}
        mocap = int(model.body_mocapid[i])
        if mocap >= 0:
            entry |= {
                "mocap_pos": data.mocap_pos[mocap].tolist(),
                "mocap_quat": data.mocap_quat[mocap].tolist(),
            }
        out["body"][name] = entry
    for name, i in _named(model, _OBJ.mjOBJ_EQUALITY, model.neq, prefix):
        out["equality"][name] = {"eq_active": [float(data.eq_active[i])]}
    return out


def moved_row(
    old: mujoco.MjModel,
    row: np.ndarray,
    new: mujoco.MjModel,
    entering: Mapping[str, Mapping] | None = None,
) -> np.ndarray:
    """A state row for `new`: everything `old` and `new` share, by name, keeps its state (time too);
    `entering` (a `named_state`) supplies the rest; what neither has starts at the model's
    defaults."""
    data = mujoco.MjData(new)
    before = _data(old, row)
    data.time = before.time
    if new.nuserdata == old.nuserdata:
        data.userdata[:] = before.userdata
    for state in (named_state(old, row), entering or {}):
        _write(new, data, state)
    out = np.empty(mujoco.mj_stateSize(new, _INTEGRATION))
    mujoco.mj_getState(new, data, out, _INTEGRATION)
    return out


def _write(model: mujoco.MjModel, data: mujoco.MjData, state: Mapping[str, Mapping]) -> None:
    joints = {name: (qpos, dofs) for name, qpos, dofs in _joints(model, "")}
    for name, values in state.get("joint", {}).items():
        if name in joints:
            qpos, dofs = joints[name]
            data.qpos[qpos] = values["qpos"]
            for field in ("qvel", "qacc_warmstart", "qfrc_applied"):
                getattr(data, field)[dofs] = values[field]
    actuators = {name: (i, acts) for name, i, acts in _actuators(model, "")}
    for name, values in state.get("actuator", {}).items():
        if name in actuators:
            i, acts = actuators[name]
            data.ctrl[i] = values["ctrl"][0]
            data.act[acts] = values["act"]
    for name, values in state.get("body", {}).items():
        i = mujoco.mj_name2id(model, _OBJ.mjOBJ_BODY, name)
        if i >= 0:
            data.xfrc_applied[i] = values["xfrc_applied"]
            mocap = int(model.body_mocapid[i])
            if mocap >= 0 and "mocap_pos" in values:
                data.mocap_pos[mocap], data.mocap_quat[mocap] = (
                    values["mocap_pos"],
                    values["mocap_quat"],
                )
    for name, values in state.get("equality", {}).items():
        i = mujoco.mj_name2id(model, _OBJ.mjOBJ_EQUALITY, name)
        if i >= 0:
            data.eq_active[i] = values["eq_active"][0]


def _data(model: mujoco.MjModel, row: np.ndarray) -> mujoco.MjData:
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, np.asarray(row, dtype=np.float64), _INTEGRATION)
    return data


def _named(
    model: mujoco.MjModel, kind: mujoco.mjtObj, count: int, prefix: str
) -> Iterable[tuple[str, int]]:
    for i in range(count):
        name = mujoco.mj_id2name(model, kind, i)
        if name and name.startswith(prefix):
            yield name, i


def _joints(model: mujoco.MjModel, prefix: str) -> Iterable[tuple[str, slice, slice]]:
    for name, j in _named(model, _OBJ.mjOBJ_JOINT, model.njnt, prefix):
        kind = int(model.jnt_type[j])
        nq, nv = {_FREE: (7, 6), _BALL: (4, 3)}.get(kind, (1, 1))
        qpos, dof = int(model.jnt_qposadr[j]), int(model.jnt_dofadr[j])
        yield name, slice(qpos, qpos + nq), slice(dof, dof + nv)


def _actuators(model: mujoco.MjModel, prefix: str) -> Iterable[tuple[str, int, slice]]:
    for name, i in _named(model, _OBJ.mjOBJ_ACTUATOR, model.nu, prefix):
        adr, num = int(model.actuator_actadr[i]), int(model.actuator_actnum[i])
        yield name, i, slice(adr, adr + num) if adr >= 0 else slice(0, 0)

"""Templates: a compiled scene shared read-only by every branch, and the mutable slots it offers.

A mutation target is "kind/name/attr" (or "option/gravity"); a name may itself hold "/" (an entity's
prefix in a world, "walker1/torso"). "actuator@joint/<joint>/attr" names the one actuator that
drives a joint, so that actuators without names (common in robot files) can be addressed. Resolving
a target against a template gives a `Slot`: which per-simulation field of `mujoco.batch.Batch` it
writes, where, and how many values.
"""

from __future__ import annotations

import difflib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from knowledge import content_hash, sha256_hex

from ._assets import check_sealed, virtual_files
from ._errors import MutationError, TemplateError

# (kind, attr) -> (field, values per object, column offset in a row, value domain)
# row-sized fields such as actuator_gainprm hold several values per object; we take a prefix
_MODEL_ATTRS = {
    ("body", "mass"): ("body_mass", 1, 0, "positive"),
    ("body", "inertia"): ("body_inertia", 3, 0, "positive"),
    ("body", "pos"): ("body_pos", 3, 0, "any"),
    ("geom", "friction"): ("geom_friction", 3, 0, "nonnegative"),
    ("joint", "damping"): ("dof_damping", None, 0, "nonnegative"),
    ("joint", "armature"): ("dof_armature", None, 0, "nonnegative"),
    ("actuator", "gain"): ("actuator_gainprm", 1, 0, "any"),
    ("actuator", "bias"): ("actuator_biasprm", 3, 0, "any"),
}
_STATE_ATTRS = {("joint", "qpos"): "qpos", ("joint", "qvel"): "qvel", ("actuator", "ctrl"): "ctrl"}
_OPTION_ATTRS = {"gravity": ("opt.gravity", 3, "any")}
_KINDS = {
    "body": mujoco.mjtObj.mjOBJ_BODY,
    "geom": mujoco.mjtObj.mjOBJ_GEOM,
    "joint": mujoco.mjtObj.mjOBJ_JOINT,
    "actuator": mujoco.mjtObj.mjOBJ_ACTUATOR,
    "site": mujoco.mjtObj.mjOBJ_SITE,
}
_FREE, _BALL = int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)
BY_JOINT = "actuator@joint"  # the kind of a target that names an actuator by the joint it drives
_JOINT_TRANSMISSIONS = (int(mujoco.mjtTrn.mjTRN_JOINT), int(mujoco.mjtTrn.mjTRN_JOINTINPARENT))


@dataclass(frozen=True)
class Slot:
    """Where a target's values live: `field` of the batch, flat `start` and `size` within a
    simulation."""

    target: str
    field: str  # a Batch model field ("body_mass", "opt.gravity") or state field ("qpos", "qvel")
    start: int
    size: int
    state: bool  # initial state, written after reset, instead of a model field
    setconst: bool  # mj_setConst must run after writing it
    domain: str  # "any", "positive", "nonnegative"
    quaternion: bool = False  # qpos of a free or ball joint: only "set" with unit quaternions
    # other cells holding the same quantity, (field, flat index, sign): a servo's gain is also its
    # bias (`servo_bias`), and the op applies to both
    coupled: tuple[tuple[str, int, float], ...] = ()


class Template:
    """A scene compiled once; branches share its `model` read-only and differ only by their patches.

    `source_hash` addresses the MJCF text and the files it loads (portable); `model_hash` the
    compiled model bytes (exact identity of what was simulated, which can differ across MuJoCo
    versions and platforms).

    With `assets` (name -> bytes; a task's), the scene is compiled from those files alone, held in
    memory, and one that would load any other file is refused (TaskDefinitionError); `digests`
    (name -> their sha256) spares hashing them. Without, MuJoCo reads the files the scene names from
    the disk, relative to the working directory.
    """

    def __init__(
        self,
        xml: str,
        assets: Mapping[str, bytes] | None = None,
        digests: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(xml, str) or not xml.strip():
            raise TemplateError("a template needs MJCF text")
        self.xml = xml
        self.source_hash = source_hash(xml, _digests(assets, digests))
        if assets is not None:
            check_sealed(xml, list(assets))
        try:
            if not assets:
                self.model = mujoco.MjModel.from_xml_string(xml)
            else:
                with virtual_files(assets) as vfs:
                    self.model = mujoco.MjModel.from_xml_string(xml, vfs=vfs)
        except ValueError as exc:
            raise TemplateError(f"the scene does not compile: {exc}") from exc
        self.nbytes = mujoco.mj_sizeModel(self.model)  # the compiled model's
        buffer = np.empty(self.nbytes, np.uint8)
        mujoco.mj_saveModel(self.model, None, buffer)
        self.model_hash = sha256_hex(buffer.tobytes())
        self._slots: dict[str, Slot] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> Template:
        return cached_template(Path(path).read_text())

    def __repr__(self) -> str:
        return f"Template(source_hash={self.source_hash[:12]}, nbody={self.model.nbody})"

    def names(self, kind: str) -> list[str]:
        """Names of the template's objects of a kind, in id order; unnamed objects and the world
        body (which has no dynamics to randomize) are left out."""
        count = {
            "body": self.model.nbody,
            "geom": self.model.ngeom,
            "joint": self.model.njnt,
            "actuator": self.model.nu,
            "site": self.model.nsite,
        }[kind]
        names = (
            mujoco.mj_id2name(self.model, _KINDS[kind], i)
            for i in range(1 if kind == "body" else 0, count)
        )
        return [n for n in names if n]

    def object_id(self, kind: str, name: str) -> int:
        """The id of a named object, or -1."""
        return mujoco.mj_name2id(self.model, _KINDS[kind], name)

    def actuators_of(self, joint: int) -> list[int]:
        """The ids of the actuators whose transmission is the joint with this id."""
        m = self.model
        return [
            i
            for i in range(m.nu)
            if int(m.actuator_trntype[i]) in _JOINT_TRANSMISSIONS
            and int(m.actuator_trnid[i, 0]) == joint
        ]

    def driven_joints(self) -> list[str]:
        """Names of the joints some actuator drives, in joint id order (what "actuator@joint/*"
        ranges over)."""
        return [n for n in self.names("joint") if self.actuators_of(self.object_id("joint", n))]

    def slot(self, target: str) -> Slot:
        """Resolve a mutation target; raises MutationError naming the target and close matches."""
        found = self._slots.get(target)
        if found is None:
            found = self._slots[target] = self._resolve(target)
        return found

    def _resolve(self, target: str) -> Slot:
        parts = split_target(target) if isinstance(target, str) else None
        if isinstance(target, str) and target.startswith("option/"):
            option = target.removeprefix("option/")
            if option not in _OPTION_ATTRS:
                raise MutationError(target, f"unknown option; options are {sorted(_OPTION_ATTRS)}")
            field, size, domain = _OPTION_ATTRS[option]
            return Slot(target, field, 0, size, False, True, domain)
        if parts is None:
            raise MutationError(str(target), "a target is 'kind/name/attr' or 'option/<name>'")
        kind, name, attr = parts
        by_joint = kind == BY_JOINT
        if by_joint:
            kind = "actuator"
        if (kind, attr) not in _MODEL_ATTRS and (kind, attr) not in _STATE_ATTRS:
            known = sorted(f"{k}/<name>/{a}" for k, a in [*_MODEL_ATTRS, *_STATE_ATTRS])
            raise MutationError(
                target,
                f"unknown kind or attribute; targets are {known}, option/gravity and "
                f"{BY_JOINT}/<joint>/<actuator attribute>",
            )
        ident = self._ident("joint" if by_joint else kind, name, target)
        m = self.model
        if by_joint:
            driving = self.actuators_of(ident)
            if len(driving) != 1:
                detail = (
                    "no actuator drives it"
                    if not driving
                    else f"{len(driving)} actuators drive it: address them by name"
                )
                raise MutationError(target, f"joint {name!r}: {detail}")
            ident = driving[0]
        if (kind, attr) == ("actuator", "ctrl"):
            return Slot(target, "ctrl", ident, 1, True, False, "any")
        if (kind, attr) in _STATE_ATTRS:
            jtype = int(m.jnt_type[ident])
            if attr == "qpos":
                start = int(m.jnt_qposadr[ident])
                size = {_FREE: 7, _BALL: 4}.get(jtype, 1)
            else:
                start = int(m.jnt_dofadr[ident])
                size = {_FREE: 6, _BALL: 3}.get(jtype, 1)
            quaternion = attr == "qpos" and jtype in (_FREE, _BALL)
            return Slot(
                target, _STATE_ATTRS[kind, attr], start, size, True, False, "any", quaternion
            )
        field, per_object, column, domain = _MODEL_ATTRS[kind, attr]
        if kind == "joint":  # values per joint: as many as its dofs
            start = int(m.jnt_dofadr[ident])
            size = {_FREE: 6, _BALL: 3}.get(int(m.jnt_type[ident]), 1)
        else:
            assert per_object is not None  # None in the table for joints only
            size = per_object
            start = (
                ident * getattr(m, field).shape[1] + column
                if getattr(m, field).ndim == 2
                else ident
            )
        if (kind, attr) == ("body", "pos"):
            if int(m.body_mocapid[ident]) >= 0:
                raise MutationError(
                    target, "a mocap body's pose is state (mocap_pos), not a model field"
                )
            jnt = int(m.body_jntadr[ident])
            if int(m.body_jntnum[ident]) and int(m.jnt_type[jnt]) == _FREE:
                raise MutationError(
                    target, "a free body's pose is its joint's qpos: use joint/<name>/qpos"
                )
        coupled = servo_bias(m, ident) if (kind, attr) == ("actuator", "gain") else ()
        setconst = any(
            f in mujoco.MjModel._setconst_inputs for f in [field, *(c[0] for c in coupled)]
        )
        return Slot(target, field, int(start), int(size), False, setconst, domain, False, coupled)

    def _ident(self, kind: str, name: str, target: str) -> int:
        ident = self.object_id(kind, name)
        if ident < 0:
            close = difflib.get_close_matches(name, self.names(kind), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise MutationError(target, f"the template has no {kind} named {name!r}{hint}")
        return ident


def servo_bias(m: mujoco.MjModel, actuator: int) -> tuple[tuple[str, int, float], ...]:
    """The bias cell that repeats a servo's gain, negated: a position servo's force is
    kp * ctrl - kp * qpos (gainprm[0] = -biasprm[1] = kp), a velocity servo's kv * ctrl - kv * qvel
    (gainprm[0] = -biasprm[2] = kv, biasprm[1] = 0). Changing the gain alone would move the set
    point (kp x1.2: a joint told 1 rad settles at 1.2), not the stiffness; so "gain" changes both.
    Other actuators (motors, general ones whose bias is not the gain) have no such cell."""
    affine = int(m.actuator_biastype[actuator]) == int(mujoco.mjtBias.mjBIAS_AFFINE)
    fixed = int(m.actuator_gaintype[actuator]) == int(mujoco.mjtGain.mjGAIN_FIXED)
    gain, bias = float(m.actuator_gainprm[actuator, 0]), m.actuator_biasprm[actuator]
    if not (affine and fixed and gain != 0):
        return ()
    row = actuator * m.actuator_biasprm.shape[1]
    if float(bias[1]) == -gain:
        return (("actuator_biasprm", row + 1, -1.0),)
    if float(bias[1]) == 0 and float(bias[2]) == -gain:
        return (("actuator_biasprm", row + 2, -1.0),)
    return ()


def split_target(target: str) -> tuple[str, str, str] | None:
    """(kind, name, attr) of "kind/name/attr", where the name may hold "/"; None if malformed."""
    kind, _, rest = target.partition("/")
    name, _, attr = rest.rpartition("/")
    return (kind, name, attr) if kind and name and attr else None


def source_hash(xml: str, digests: Mapping[str, str] | None) -> str:
    """The sha256 of the scene text; with files (name -> sha256), of the text and the files."""
    if not digests:
        return sha256_hex(xml.encode())
    return content_hash({"scene": sha256_hex(xml.encode()), "assets": dict(digests)})


def _digests(
    assets: Mapping[str, bytes] | None, digests: Mapping[str, str] | None
) -> Mapping[str, str] | None:
    if assets is None or digests is not None:
        return digests
    return {name: sha256_hex(data) for name, data in assets.items()}


# The templates this process compiled last, least recently used first: a long-running validator
# compiles every distinct scene it is sent, so the cache keeps at most this many, and past this many
# bytes of compiled models only the newest. The lock guards the cache and `_COMPILING` only: a scene
# compiles outside it (a slow one must not hold up other threads' hits and compiles), and a thread
# asking for a scene another thread is compiling waits for that compile instead of starting its own.
_CACHE: OrderedDict[tuple[str, bool], Template] = OrderedDict()
_COMPILING: dict[tuple[str, bool], threading.Event] = {}  # set when its compile ends, either way
_CACHE_LOCK = threading.Lock()
CACHE_TEMPLATES = 32
CACHE_BYTES = 512 << 20


def cached_template(
    xml: str,
    assets: Mapping[str, bytes] | None = None,
    digests: Mapping[str, str] | None = None,
) -> Template:
    """One Template per distinct scene (text and files) among the last ones used in this process:
    memory grows with templates, not tasks, and the least recently used go first (past
    `CACHE_TEMPLATES` of them or `CACHE_BYTES` of compiled models). `digests` (name -> sha256 of
    `assets`, checked by the caller) spares hashing the files again. Threads compile different
    scenes at once; a scene being compiled is compiled once, the other threads asking for it
    waiting for it (if that compile fails, each tries it itself and gets its own error)."""
    digests = _digests(assets, digests)
    key = (source_hash(xml, digests), assets is not None)
    while True:
        with _CACHE_LOCK:
            found = _CACHE.get(key)
            if found is not None:
                _CACHE.move_to_end(key)
                return found
            underway = _COMPILING.get(key)
            if underway is None:
                mine = _COMPILING[key] = threading.Event()
                break
        underway.wait()  # then cached, or failed: look again
    try:
        found = Template(xml, assets, digests)
        with _CACHE_LOCK:
            _CACHE[key] = found
            held = sum(t.nbytes for t in _CACHE.values())
            while len(_CACHE) > 1 and (len(_CACHE) > CACHE_TEMPLATES or held > CACHE_BYTES):
                held -= _CACHE.popitem(last=False)[1].nbytes
    finally:  # cached, or failed: the waiting threads look again
        with _CACHE_LOCK:
            del _COMPILING[key]
        mine.set()
    return found

"""Tasks as data: a content-addressed definition (scene and the files it loads, initial-state
distribution, observation, action, reward, success and failure terms, horizon) written in a small
vocabulary implemented here.

A task from a peer is JSON, never code: every term below is evaluated by this module on arrays bound
from the batch, vectorized over simulations. The one escape hatch, an "entry_point" term, names a
function of a locally installed, versioned distribution (group simnet.terms); it runs only if that
exact version is installed here.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from knowledge import content_hash, sha256_hex

from ._assets import (
    bundle,
    checked_bytes,
    declared,
    drop_visual_meshes,
    included_files,
    read_file,
)
from ._errors import TaskDefinitionError, TemplateError
from ._mlp import EntryPointRef
from ._numbers import is_number
from ._patches import Patch, SamplerTerm, expand_targets, sample_terms
from ._templates import Template, cached_template

FORMAT = "simnet.task/1"
_KEYS = {
    "format",
    "assets",
    "name",
    "embodiment",
    "scene",
    "keyframe",
    "init",
    "observation",
    "action",
    "reward",
    "success",
    "failure",
    "horizon",
    "control_substeps",
}
# term -> the object references it takes (name -> kind); "axis" and "period" are numbers
QUANTITIES: dict[str, dict[str, str | None]] = {
    "site_distance": {"from": "site", "to": "site"},
    "body_displacement": {"body": "body", "axis": None},
    "body_progress": {"body": "body", "axis": None},
    "body_height": {"body": "body"},
    "body_upright": {"body": "body"},
    "ctrl_sq": {},
    "alive": {},
    # a locally installed Python term, named by the definition but never carried by it
    "entry_point": {"name": "text", "distribution": "text", "version": "text"},
}
TERMS_GROUP = "simnet.terms"
# Far beyond any real task (a million control steps; ten thousand physics steps between two): a
# definition past them is hostile or broken, and must not tie up whoever evaluates it.
_MAX_STEPS = {"horizon": 1_000_000, "control_substeps": 10_000}
OBSERVATIONS: dict[str, dict[str, str | None]] = {
    "qpos": {"joints": "joints"},
    "qvel": {"joints": "joints"},
    "site_pos": {"site": "site"},
    "site_delta": {"from": "site", "to": "site"},
    "body_pos": {"body": "body"},
    "body_upright": {"body": "body"},
    "clock": {"period": None},
    "ctrl": {},
}
Array = np.ndarray


class Task:
    """A validated task definition; `hash` is the sha256 of its canonical JSON.

    A scene that loads files (meshes, textures, heightfields, skins) names them in the definition's
    "assets" (relative name -> sha256), so the hash covers their bytes; `assets` gives those bytes
    (name -> bytes; `sim.fetch_task` fetches them from a knowledge base's blobs, `from_files`
    reads them from the disk). The scene is compiled from them alone: MissingAssetError if one is
    not given, TaskDefinitionError if bytes do not match their hash or the scene would load a file
    the task does not carry.
    """

    def __init__(
        self, definition: Mapping[str, Any], assets: Mapping[str, bytes] | None = None
    ) -> None:
        try:
            data = json.loads(json.dumps(definition, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise TaskDefinitionError("", f"not JSON-serializable: {exc}") from exc
        if not isinstance(data, dict):
            raise TaskDefinitionError("", "a task definition is a JSON object")
        self._data = data
        self.hash = content_hash(data)
        self._python_terms: dict[tuple[str, str, str], Callable[[Runtime], Array]] = {}
        _require(data.get("format") == FORMAT, "format", f"must be {FORMAT!r}")
        extra = sorted(set(data) - _KEYS)
        _require(not extra, extra[0] if extra else "", f"unknown key; keys are {sorted(_KEYS)}")
        for key in ("name", "embodiment", "scene"):
            _require(
                isinstance(data.get(key), str) and data[key], key, "must be a non-empty string"
            )
        self.name: str = data["name"]
        self.embodiment: str = data["embodiment"]
        names = declared(data)
        self._assets = checked_bytes(names, assets or {})
        try:
            self.template: Template = cached_template(data["scene"], self._assets, names)
        except TemplateError as exc:  # the scene is a field of the task
            raise TaskDefinitionError("scene", str(exc)) from exc
        model = self.template.model
        for key, limit in _MAX_STEPS.items():
            _require(
                _in_limit(data.get(key), limit), key, f"must be an integer from 1 to {limit:,}"
            )
        self.horizon: int = data["horizon"]
        self.control_substeps: int = data["control_substeps"]
        keyframe = data.get("keyframe")
        self.keyframe = -1
        if keyframe is not None:
            _require(isinstance(keyframe, str), "keyframe", "must be a keyframe name or null")
            self.keyframe = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, keyframe)
            _require(self.keyframe >= 0, "keyframe", f"the scene has no keyframe {keyframe!r}")
        init = data.get("init", [])
        _require(isinstance(init, list), "init", "must be a list of sampler terms")
        self.init_terms = tuple(
            SamplerTerm.from_json(t, f"init[{i}]", TaskDefinitionError) for i, t in enumerate(init)
        )
        for i, term in enumerate(self.init_terms):
            expand_targets(term, self.template, f"init[{i}]", TaskDefinitionError)
        observation: Any = data.get("observation")  # JSON: checked here
        _require(
            isinstance(observation, list) and observation, "observation", "must be a non-empty list"
        )
        self.obs_dim = sum(
            self._obs_size(t, f"observation[{i}]") for i, t in enumerate(observation)
        )
        action: Any = data.get("action")
        _require(
            isinstance(action, dict)
            and set(action) == {"mode"}
            and action["mode"] in ("absolute", "delta"),
            "action",
            "must be {'mode': 'absolute' | 'delta'}",
        )
        self.action_mode: str = action["mode"]
        self.act_dim: int = model.nu
        _require(self.act_dim > 0, "scene", "the scene has no actuators to drive")
        reward = data.get("reward", [])
        _require(isinstance(reward, list), "reward", "must be a list of weighted terms")
        for i, term in enumerate(reward):
            self._check_quantity(term, f"reward[{i}]", extra={"weight"})
            _require(
                is_number(term.get("weight")), f"reward[{i}].weight", "must be a finite number"
            )
        success: Any = data.get("success")
        _require(
            isinstance(success, dict) and set(success) == {"when", "all"},
            "success",
            "must be {'when': 'end' | 'first', 'all': [conditions]}",
        )
        _require(success["when"] in ("end", "first"), "success.when", "must be 'end' or 'first'")
        _require(
            isinstance(success["all"], list) and success["all"],
            "success.all",
            "must be a non-empty list",
        )
        for i, cond in enumerate(success["all"]):
            self._check_condition(cond, f"success.all[{i}]")
        failure = data.get("failure", [])
        _require(isinstance(failure, list), "failure", "must be a list of conditions")
        for i, cond in enumerate(failure):
            self._check_condition(cond, f"failure[{i}]")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], assets: Mapping[str, bytes] | None = None) -> Task:
        return cls(data, assets)

    @classmethod
    def from_files(
        cls,
        definition: Mapping[str, Any],
        directory: str | os.PathLike[str] = ".",
        *,
        package_path: Sequence[str | os.PathLike[str]] = (),
    ) -> Task:
        """A task whose scene's files are read from the disk and carried by hash: relative paths
        (and `<include>`s) resolve against `directory`, `package://` URIs against `package_path`,
        ROS_PACKAGE_PATH and `directory`'s folders (`knowledge.resolve_package_uri`). The scene is
        rewritten by MuJoCo's own writer with included files inlined and each file renamed to a
        portable name (`sim._assets.bundle`), and meshes only visual geoms use dropped with those
        geoms (`drop_visual_meshes`); a scene that loads nothing is kept as it is. A
        definition that names its assets already has them read from `directory`/<name>."""
        data = dict(definition)
        if "assets" in data:
            names = declared(data)
            return cls(data, {n: read_file(Path(directory) / n, f"assets[{n!r}]") for n in names})
        scene: Any = data.get("scene")
        _require(isinstance(scene, str) and scene, "scene", "must be a non-empty string")
        included = included_files(scene, Path(directory))
        try:
            spec = mujoco.MjSpec.from_string(scene, include=included or None)
        except ValueError as exc:
            raise TaskDefinitionError("scene", f"MuJoCo cannot read it: {exc}") from exc
        bundle(spec, directory, package_path)
        drop_visual_meshes(spec)
        files = dict(spec.assets)
        if not files and not included:
            return cls(data)
        try:
            data["scene"] = spec.to_xml()
        except ValueError as exc:
            raise TaskDefinitionError("scene", f"does not compile: {exc}") from exc
        if files:
            data["assets"] = {name: sha256_hex(b) for name, b in sorted(files.items())}
        return cls(data, files)

    def to_json(self) -> dict:
        return copy.deepcopy(self._data)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the definition as `<name>.json` into `directory` and each asset beside it under its
        name, as `from_files` (and `simnet evaluate --task FILE`) reads them back: the same task,
        hash and all. Returns the definition's path. A file already there with other bytes (another
        task's mesh of the same name) is not overwritten: FileExistsError, nothing written."""
        file = f"{self.name}.json"
        if file in (".json", "..json") or any(c in self.name for c in "/\\:\0"):
            raise TaskDefinitionError("name", f"{self.name!r} cannot name a file ('/', '\\', ':')")
        if file in self._assets:
            raise TaskDefinitionError("name", f"an asset is named {file!r} too")
        folder = Path(directory)
        files = {**self._assets, file: json.dumps(self._data, indent=1, sort_keys=True).encode()}
        for name, data in files.items():  # asset names are checked portable relative paths
            if (folder / name).is_file() and (folder / name).read_bytes() != data:
                raise FileExistsError(f"{folder / name} holds other bytes: save elsewhere")
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        return folder / file

    @property
    def assets(self) -> Mapping[str, bytes]:
        """The bytes of the files the scene loads, by name (empty for a scene that loads none)."""
        return MappingProxyType(self._assets)

    @property
    def physics_steps(self) -> int:
        """Physics steps one branch runs at most: what evaluating it costs, whatever the scene."""
        return self.horizon * self.control_substeps

    def replace(self, **changes: Any) -> Task:
        """A new task (with its own hash) differing in the given top-level fields, e.g. horizon."""
        data = {**self._data, **changes}
        names = declared(data)
        return Task(data, {n: b for n, b in self._assets.items() if n in names})

    def __repr__(self) -> str:
        return f"Task({self.name!r}, hash={self.hash[:12]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Task) and other.hash == self.hash

    def __hash__(self) -> int:
        return hash(self.hash)

    def init_patches(self, seed: int, first: int, count: int) -> list[Patch]:
        """Branches' draws from the task's initial-state distribution."""
        return sample_terms(
            self.init_terms, self.template, seed, first, count, "init", TaskDefinitionError
        )

    @property
    def definition(self) -> Mapping[str, Any]:
        return self._data

    def _ref(self, kind: str, name: Any, where: str) -> int:
        _require(isinstance(name, str), where, f"must name a {kind}")
        ident = self.template.object_id(kind, name)
        _require(ident >= 0, where, f"the scene has no {kind} named {name!r}")
        return ident

    def _check_args(
        self, term: dict, args: Mapping[str, str | None], where: str, extra: set[str]
    ) -> None:
        allowed = {"term", *args, *extra}
        unknown = sorted(set(term) - allowed)
        _require(
            not unknown,
            f"{where}.{unknown[0]}" if unknown else where,
            f"unknown key; allowed {sorted(allowed)}",
        )
        for key, kind in args.items():
            if kind == "joints":
                joints: Any = term.get(key)
                _require(
                    isinstance(joints, list) and joints,
                    f"{where}.{key}",
                    "must be a non-empty list of joint names",
                )
                for j, name in enumerate(joints):
                    self._ref("joint", name, f"{where}.{key}[{j}]")
            elif kind == "text":
                _require(
                    isinstance(term.get(key), str) and term[key],
                    f"{where}.{key}",
                    "must be a non-empty string",
                )
            elif kind is not None:
                self._ref(kind, term.get(key), f"{where}.{key}")
            elif key == "axis":
                axis = term.get(key)
                _require(
                    axis in (0, 1, 2) and not isinstance(axis, bool),
                    f"{where}.axis",
                    "must be 0, 1 or 2",
                )
            else:
                _require(
                    is_number(term.get(key)) and term[key] > 0,
                    f"{where}.{key}",
                    "must be a number > 0",
                )

    def _obs_size(self, term: Any, where: str) -> int:
        _require(
            isinstance(term, dict)
            and isinstance(term.get("term"), str)
            and term["term"] in OBSERVATIONS,
            f"{where}.term",
            f"must be one of {sorted(OBSERVATIONS)}",
        )
        self._check_args(term, OBSERVATIONS[term["term"]], where, set())
        kind = term["term"]
        if kind in ("qpos", "qvel"):
            return sum(self.template.slot(f"joint/{j}/{kind}").size for j in term["joints"])
        return {
            "site_pos": 3,
            "site_delta": 3,
            "body_pos": 3,
            "body_upright": 1,
            "clock": 2,
            "ctrl": self.template.model.nu,
        }[kind]

    def _check_quantity(self, term: Any, where: str, extra: set[str]) -> None:
        _require(
            isinstance(term, dict)
            and isinstance(term.get("term"), str)
            and term["term"] in QUANTITIES,
            f"{where}.term",
            f"must be one of {sorted(QUANTITIES)}",
        )
        self._check_args(term, QUANTITIES[term["term"]], where, extra)
        if term["term"] == "entry_point":
            self.python_term(term)  # installed here, at the named version, or EntryPointError now

    def python_term(self, term: Mapping[str, str]) -> Callable[[Runtime], Array]:
        """The function an "entry_point" term names (group simnet.terms): called with the Runtime
        after each control step, it returns one float per simulation."""
        key = (term["name"], term["distribution"], term["version"])
        if key not in self._python_terms:
            self._python_terms[key] = EntryPointRef(*key, group=TERMS_GROUP).load()
        return self._python_terms[key]

    def _check_condition(self, cond: Any, where: str) -> None:
        self._check_quantity(cond, where, extra={"above", "below"})
        bounds = [k for k in ("above", "below") if k in cond]
        _require(len(bounds) == 1, where, "a condition has exactly one of 'above' or 'below'")
        _require(is_number(cond[bounds[0]]), f"{where}.{bounds[0]}", "must be a finite number")


def definition_steps(definition: Mapping[str, Any]) -> int | None:
    """The physics steps one branch of a task definition takes at most (horizon x
    control_substeps), read without compiling it; None where `Task` would refuse those fields."""
    counts = [definition.get(key) for key in _MAX_STEPS]
    if not all(_in_limit(v, limit) for v, limit in zip(counts, _MAX_STEPS.values(), strict=True)):
        return None
    return math.prod(counts)  # type: ignore[arg-type]


def _in_limit(value: object, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limit


def _require(ok: object, field: str, detail: str) -> None:
    if not ok:
        raise TaskDefinitionError(field, detail)


# the batch fields a task's runtime binds (each, one row per simulation): the scene budget's check
# (sim.validation) binds them too, to hold what an evaluation holds
RUNTIME_FIELDS = ("qpos", "qvel", "ctrl", "time", "site_xpos", "xpos", "xmat")


class Runtime:
    """A task's terms compiled against one batch: observations, quantities and conditions as
    arrays."""

    def __init__(self, task: Task, batch: mjbatch.Batch) -> None:
        self.task = task
        model = task.template.model
        # derived fields are bound before the first call, so that it fills them
        self.qpos, self.qvel, self.ctrl, self.time, self.site_xpos, self.xpos, self.xmat = (
            batch.bind(f) for f in RUNTIME_FIELDS
        )
        limited = model.actuator_ctrllimited.astype(bool)
        self.ctrl_low = np.where(limited, model.actuator_ctrlrange[:, 0], -np.inf)
        self.ctrl_high = np.where(limited, model.actuator_ctrlrange[:, 1], np.inf)
        data = task.definition
        self._obs = [self._observation(t) for t in data["observation"]]
        self._reward = [(float(t["weight"]), self._quantity(t)) for t in data["reward"]]
        self._success = [self._condition(c) for c in data["success"]["all"]]
        self._failure = [
            (f"failure:{c['term']}", self._condition(c)) for c in data.get("failure", [])
        ]
        self._start = self._previous = self.xpos.copy()
        # only body_progress reads the previous step's poses: the others skip the copy every step
        terms = [*data["reward"], *data["success"]["all"], *data.get("failure", [])]
        self._tracks_progress = any(t["term"] == "body_progress" for t in terms)

    def begin(self) -> None:
        """Mark the episode start (after reset and the first forward)."""
        self._start = self.xpos.copy()
        self._previous = self.xpos.copy()

    def end_step(self) -> None:
        if self._tracks_progress:
            self._previous = self.xpos.copy()

    def observe(self) -> Array:
        return np.concatenate([f() for f in self._obs], axis=1)

    def reward(self) -> Array:
        total = np.zeros(len(self.qpos))
        for weight, quantity in self._reward:
            total += weight * quantity()
        return total

    def succeeded(self) -> Array:
        ok = np.ones(len(self.qpos), bool)
        for cond in self._success:
            ok &= cond()
        return ok

    def failures(self) -> list[tuple[str, Array]]:
        return [(reason, cond()) for reason, cond in self._failure]

    def _observation(self, term: dict) -> Callable[[], Array]:
        t = self.task.template
        kind = term["term"]
        if kind in ("qpos", "qvel"):
            index = np.concatenate(
                [
                    np.arange(s.start, s.start + s.size)
                    for s in (t.slot(f"joint/{j}/{kind}") for j in term["joints"])
                ]
            )
            source = self.qpos if kind == "qpos" else self.qvel
            return lambda: source[:, index]
        if kind == "site_pos":
            i = t.object_id("site", term["site"])
            return lambda: self.site_xpos[:, i]
        if kind == "site_delta":
            a, b = t.object_id("site", term["from"]), t.object_id("site", term["to"])
            return lambda: self.site_xpos[:, b] - self.site_xpos[:, a]
        if kind == "body_pos":
            i = t.object_id("body", term["body"])
            return lambda: self.xpos[:, i]
        if kind == "body_upright":
            i = t.object_id("body", term["body"])
            return lambda: self.xmat[:, i, 8:9]
        if kind == "clock":
            omega = 2 * np.pi / float(term["period"])
            return lambda: np.stack([np.sin(omega * self.time), np.cos(omega * self.time)], axis=1)
        return lambda: self.ctrl.copy()

    def _quantity(self, term: dict) -> Callable[[], Array]:
        t = self.task.template
        kind = term["term"]
        if kind == "site_distance":
            a, b = t.object_id("site", term["from"]), t.object_id("site", term["to"])

            def distance() -> Array:  # np.linalg.norm's own operations, without its Python wrapper
                delta = self.site_xpos[:, b] - self.site_xpos[:, a]
                return np.sqrt(np.add.reduce(np.multiply(delta, delta, out=delta), axis=1))

            return distance
        if kind in ("body_displacement", "body_progress", "body_height", "body_upright"):
            i = t.object_id("body", term["body"])
            axis = term.get("axis", 2)
            if kind == "body_displacement":
                return lambda: self.xpos[:, i, axis] - self._start[:, i, axis]
            if kind == "body_progress":
                return lambda: self.xpos[:, i, axis] - self._previous[:, i, axis]
            if kind == "body_height":
                return lambda: self.xpos[:, i, 2].copy()
            return lambda: self.xmat[:, i, 8].copy()
        if kind == "ctrl_sq":
            return lambda: np.sum(self.ctrl * self.ctrl, axis=1)
        if kind == "entry_point":
            function = self.task.python_term(term)
            return lambda: self._python_value(function, term["name"])
        return lambda: np.ones(len(self.qpos))

    def _python_value(self, function: Callable[[Runtime], Array], name: str) -> Array:
        value = np.asarray(function(self), dtype=np.float64)
        if value.shape != (len(self.qpos),):
            raise TaskDefinitionError(
                f"entry_point {name}",
                f"returned shape {value.shape}, "
                f"expected one value per simulation {(len(self.qpos),)}",
            )
        return value

    def _condition(self, cond: dict) -> Callable[[], Array]:
        quantity = self._quantity(cond)
        if "above" in cond:
            bound = float(cond["above"])
            return lambda: quantity() > bound
        bound = float(cond["below"])
        return lambda: quantity() < bound

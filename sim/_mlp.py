"""Policies are data, never code: a `Policy` is an MLP architecture spec plus safetensors weights,
checked against each other before any tensor is used (what a knowledge-base skill carries). Python
policies come only from locally installed, versioned entry points, which a record may name but never
carry.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import numpy as np
import safetensors.torch
import torch

from knowledge import canonical_json, content_hash, sha256_hex

from ._errors import EntryPointError, PolicyPayloadError, PolicySpecError

MLP_FORMAT = "simnet.mlp/1"
ACTIVATIONS: dict[str, Callable[[], torch.nn.Module]] = {
    "tanh": torch.nn.Tanh,
    "relu": torch.nn.ReLU,
    "elu": torch.nn.ELU,
    "silu": torch.nn.SiLU,
}
# the same kernels in place, for inference (`MLP.act`): the same bits without new tensors
_IN_PLACE: dict[str, Callable[[torch.Tensor], object]] = {
    "tanh": torch.tanh_,
    "relu": torch.relu_,
    "elu": lambda x: torch.nn.functional.elu(x, inplace=True),
    "silu": lambda x: torch.nn.functional.silu(x, inplace=True),
}
_DTYPES = {"float64": (torch.float64, "F64"), "float32": (torch.float32, "F32")}
MAX_WEIGHTS_BYTES = 256 * 2**20
POLICY_GROUP = "simnet.policies"


@dataclass(frozen=True)
class MLPSpec:
    """obs → (obs - obs_mean) / obs_std → Linear/activation … → act_offset + act_scale * out.

    `hidden=[]` is a linear (affine) policy, which expresses PD and CPG controllers exactly.
    """

    obs_dim: int
    act_dim: int
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    output_activation: str | None = None
    dtype: str = "float64"

    def to_json(self) -> dict:
        return {
            "format": MLP_FORMAT,
            "obs_dim": self.obs_dim,
            "act_dim": self.act_dim,
            "hidden": list(self.hidden),
            "activation": self.activation,
            "output_activation": self.output_activation,
            "dtype": self.dtype,
        }

    @classmethod
    def from_json(cls, data: Any) -> MLPSpec:
        def need(ok: bool, key: str, detail: str) -> None:
            if not ok:
                raise PolicySpecError(key, detail)

        need(isinstance(data, dict), "", "an architecture spec is a JSON object")
        need(data.get("format") == MLP_FORMAT, "format", f"must be {MLP_FORMAT!r}")
        keys = set(cls(1, 1).to_json())
        extra = sorted(set(data) - keys)
        need(not extra, extra[0] if extra else "", f"unknown key; keys are {sorted(keys)}")
        for key in ("obs_dim", "act_dim"):
            value = data.get(key)
            need(
                isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100_000,
                key,
                "must be an integer in [1, 100000]",
            )
        hidden = data.get("hidden")
        need(
            isinstance(hidden, list)
            and len(hidden) <= 16
            and all(
                isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 100_000 for h in hidden
            ),
            "hidden",
            "must be a list of at most 16 layer sizes in [1, 100000]",
        )
        need(
            isinstance(data.get("activation"), str) and data["activation"] in ACTIVATIONS,
            "activation",
            f"must be one of {sorted(ACTIVATIONS)}",
        )
        out = data.get("output_activation")
        need(
            out is None or (isinstance(out, str) and out in ACTIVATIONS),
            "output_activation",
            f"must be null or one of {sorted(ACTIVATIONS)}",
        )
        need(
            isinstance(data.get("dtype"), str) and data["dtype"] in _DTYPES,
            "dtype",
            f"must be one of {sorted(_DTYPES)}",
        )
        return cls(
            data["obs_dim"], data["act_dim"], tuple(hidden), data["activation"], out, data["dtype"]
        )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the weights must hold, with its shape; nothing more is accepted."""
        sizes = [self.obs_dim, *self.hidden, self.act_dim]
        shapes: dict[str, tuple[int, ...]] = {
            "obs_mean": (self.obs_dim,),
            "obs_std": (self.obs_dim,),
            "act_offset": (self.act_dim,),
            "act_scale": (self.act_dim,),
        }
        for i, (n_in, n_out) in enumerate(pairwise(sizes)):
            shapes[f"layers.{i}.weight"] = (n_out, n_in)
            shapes[f"layers.{i}.bias"] = (n_out,)
        return shapes


class MLP(torch.nn.Module):
    """The torch module of an MLPSpec; built only from checked tensors."""

    # buffers (register_buffer below)
    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    act_offset: torch.Tensor
    act_scale: torch.Tensor

    def __init__(self, spec: MLPSpec, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.spec = spec
        dtype = _DTYPES[spec.dtype][0]
        sizes = [spec.obs_dim, *spec.hidden, spec.act_dim]
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, dtype=dtype) for a, b in pairwise(sizes)
        )
        self.activation = ACTIVATIONS[spec.activation]()
        self.output_activation = (
            ACTIVATIONS[spec.output_activation]() if spec.output_activation else None
        )
        for name in ("obs_mean", "obs_std", "act_offset", "act_scale"):
            self.register_buffer(name, torch.zeros(spec.tensor_shapes()[name], dtype=dtype))
        self.load_state_dict(dict(tensors), strict=True)
        self.eval()
        # what `act` reads, as dicts: Module attribute lookups cost as much as the kernels
        # at a wave's batch sizes. The dicts are the modules' own, so a parameter or buffer loaded,
        # converted or replaced later is the one `act` uses.
        self._layer_parameters = tuple(
            cast(dict[str, torch.Tensor], layer._parameters) for layer in self.layers
        )
        self._buffer_tensors = cast(dict[str, torch.Tensor], self._buffers)
        self._hidden = _IN_PLACE[spec.activation]
        self._output = _IN_PLACE[spec.output_activation] if spec.output_activation else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = (obs - self.obs_mean) / self.obs_std
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        if self.output_activation is not None:
            x = self.output_activation(x)
        return self.act_offset + self.act_scale * x

    def act(self, obs: np.ndarray) -> np.ndarray:
        """`forward` on a float64 array, as float64, with no autograd: the same kernels on the same
        operands (in place, and without the submodules' call machinery), so the same bits. What a
        rollout calls every control step."""
        buffers, linear = self._buffer_tensors, torch.nn.functional.linear
        *hidden_layers, last = self._layer_parameters
        with torch.inference_mode():
            x = torch.from_numpy(obs).to(buffers["obs_mean"].dtype)
            x = (x - buffers["obs_mean"]).div_(buffers["obs_std"])
            for parameters in hidden_layers:
                x = linear(x, parameters["weight"], parameters["bias"])
                self._hidden(x)
            x = linear(x, last["weight"], last["bias"])
            if self._output is not None:
                self._output(x)
            # offset + scale * x: IEEE products and sums commute, bit for bit
            x.mul_(buffers["act_scale"]).add_(buffers["act_offset"])
            return x.to(torch.float64).numpy()


@dataclass(frozen=True)
class Policy:
    """A replicable MLP policy, the payload of a skill: an architecture spec and a safetensors
    weights blob, content-addressed.

    Constructing one checks the blob against the spec (names, dtypes, shapes, finiteness);
    `weights_sha256` is the blob's address, `hash` the skill's (spec and weights together).
    """

    spec: MLPSpec
    weights: bytes = field(repr=False)
    metadata: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self._tensors()  # fail now, not at first use

    @classmethod
    def from_tensors(
        cls, spec: MLPSpec, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
    ) -> Policy:
        dtype = _DTYPES[spec.dtype][0]
        prepared = {
            k: torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v)
            .to(dtype)
            .contiguous()
            for k, v in tensors.items()
        }
        # metadata stays out of the blob: safetensors writes its map in no fixed order
        blob = safetensors.torch.save(dict(sorted(prepared.items())))
        return cls(spec, blob, dict(metadata or {}))

    @classmethod
    def linear(cls, weight: Any, bias: Any, metadata: Mapping[str, str] | None = None) -> Policy:
        """An affine policy, act = weight @ obs + bias (no normalisation, no hidden layer): PD and
        CPG controllers, and "motors off" (zeros)."""
        weight, bias = np.asarray(weight, float), np.asarray(bias, float)
        act_dim, obs_dim = weight.shape
        return cls.from_tensors(
            MLPSpec(obs_dim, act_dim, hidden=()),
            {
                "layers.0.weight": weight,
                "layers.0.bias": bias,
                "obs_mean": np.zeros(obs_dim),
                "obs_std": np.ones(obs_dim),
                "act_offset": np.zeros(act_dim),
                "act_scale": np.ones(act_dim),
            },
            metadata,
        )

    @classmethod
    def load(cls, spec_path: str | Path, weights_path: str | Path | None = None) -> Policy:
        """Read `name.json` (the spec and optional metadata) and `name.safetensors` beside it."""
        spec_path = Path(spec_path)
        doc = json.loads(spec_path.read_text())
        weights_path = Path(weights_path) if weights_path else spec_path.with_suffix(".safetensors")
        skill = cls(
            MLPSpec.from_json(doc.get("architecture")),
            weights_path.read_bytes(),
            doc.get("metadata", {}),
        )
        recorded = doc.get("weights_sha256")
        if recorded is not None and recorded != skill.weights_sha256:
            raise PolicyPayloadError(
                f"{weights_path}: sha256 {skill.weights_sha256} does not match "
                f"the recorded {recorded}"
            )
        return skill

    def save(self, spec_path: str | Path) -> None:
        spec_path = Path(spec_path)
        doc = {
            "architecture": self.spec.to_json(),
            "weights_sha256": self.weights_sha256,
            "metadata": dict(self.metadata),
        }
        spec_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        spec_path.with_suffix(".safetensors").write_bytes(self.weights)

    @property
    def weights_sha256(self) -> str:
        return sha256_hex(self.weights)

    @property
    def hash(self) -> str:
        return content_hash(
            {"architecture": self.spec.to_json(), "weights_sha256": self.weights_sha256}
        )

    def describe(self) -> dict:
        """What an evaluation record says about this policy."""
        return {
            "kind": "mlp",
            "skill_hash": self.hash,
            "architecture": self.spec.to_json(),
            "weights_sha256": self.weights_sha256,
        }

    def module(self) -> MLP:
        return MLP(self.spec, self._tensors())

    def _tensors(self) -> dict[str, torch.Tensor]:
        blob = self.weights
        if not isinstance(blob, bytes) or len(blob) > MAX_WEIGHTS_BYTES:
            raise PolicyPayloadError(
                f"weights must be at most {MAX_WEIGHTS_BYTES} bytes of safetensors"
            )
        header = _safetensors_header(blob)
        expected = self.spec.tensor_shapes()
        found = {k for k in header if k != "__metadata__"}
        if found != set(expected):
            missing, unexpected = sorted(set(expected) - found), sorted(found - set(expected))
            raise PolicyPayloadError(
                f"weights do not match the architecture: missing {missing}, unexpected {unexpected}"
            )
        tag = _DTYPES[self.spec.dtype][1]
        for name, shape in expected.items():
            info = header[name]
            if (
                not isinstance(info, dict)
                or info.get("dtype") != tag
                or tuple(info.get("shape", ())) != shape
            ):
                raise PolicyPayloadError(
                    f"tensor {name!r} is {info.get('dtype')} {info.get('shape')}, "
                    f"the architecture needs {tag} {list(shape)}"
                )
        try:
            tensors = safetensors.torch.load(blob)
        except Exception as exc:  # safetensors raises its own SafetensorError on corrupt data
            raise PolicyPayloadError(f"weights are not valid safetensors: {exc}") from exc
        # One encoding per set of tensors, so the weights' hash names what runs: a revocation
        # follows the hash, and other bytes for the same tensors would be a copy it misses.
        if safetensors.torch.save(dict(sorted(tensors.items()))) != blob:
            raise PolicyPayloadError(
                "weights are not in the one encoding of their tensors (safetensors of the tensors "
                "in name order, no metadata): re-encode them with Policy.from_tensors"
            )
        for name, tensor in tensors.items():
            if not torch.isfinite(tensor).all():
                raise PolicyPayloadError(f"tensor {name!r} holds NaN or inf")
        if not (tensors["obs_std"] > 0).all():
            raise PolicyPayloadError("tensor 'obs_std' must be > 0 everywhere")
        return tensors


def _safetensors_header(blob: bytes) -> dict:
    if len(blob) < 8:
        raise PolicyPayloadError(
            "weights are not safetensors: shorter than the 8-byte header length"
        )
    (size,) = struct.unpack("<Q", blob[:8])
    if size > len(blob) - 8 or size > 100 * 2**20:
        raise PolicyPayloadError("weights are not safetensors: header length exceeds the blob")
    try:
        header = json.loads(blob[8 : 8 + size])
    except ValueError as exc:
        raise PolicyPayloadError(
            f"weights are not safetensors: header is not JSON ({exc})"
        ) from exc
    if not isinstance(header, dict):
        raise PolicyPayloadError("weights are not safetensors: header is not an object")
    return header


@dataclass(frozen=True)
class EntryPointRef:
    """A locally installed Python policy factory: `group`/`name` at `distribution`==`version`.

    The factory is called with the task and returns a policy (a torch module or a batched callable).
    """

    name: str
    distribution: str
    version: str
    group: str = POLICY_GROUP

    def to_json(self) -> dict:
        return {
            "kind": "entry_point",
            "group": self.group,
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
        }

    def load(self) -> Any:
        found = [
            ep for ep in importlib.metadata.entry_points(group=self.group) if ep.name == self.name
        ]
        if not found:
            raise EntryPointError(
                f"no entry point {self.name!r} in group {self.group!r} is installed here"
            )
        ep = found[0]
        dist = ep.dist
        if dist is None or dist.name != self.distribution or dist.version != self.version:
            have = f"{dist.name}=={dist.version}" if dist is not None else "an unknown distribution"
            raise EntryPointError(
                f"entry point {self.name!r} comes from {have}, the record needs "
                f"{self.distribution}=={self.version}"
            )
        return ep.load()


def describe_policy(policy: Any) -> dict:
    """A JSON description of a policy for the record: a hash where the policy is data."""
    if isinstance(policy, Policy):
        return policy.describe()
    if isinstance(policy, EntryPointRef):
        return policy.to_json()
    if isinstance(policy, MLP):
        return {
            "kind": "torch",
            "class": "sim.MLP",
            "architecture": policy.spec.to_json(),
            "state_sha256": _state_digest(policy),
        }
    if isinstance(policy, torch.nn.Module):
        cls = type(policy)
        return {
            "kind": "torch",
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "state_sha256": _state_digest(policy),
        }
    name = getattr(policy, "__qualname__", type(policy).__qualname__)
    return {"kind": "callable", "class": f"{getattr(policy, '__module__', '?')}.{name}"}


def policy_payload(policy: Any) -> tuple:
    """A policy as data a worker can rebuild: only MLP policies and entry points can be shipped."""
    if isinstance(policy, Policy):
        return ("skill", policy.spec.to_json(), policy.weights)
    if isinstance(policy, EntryPointRef):
        return ("entry_point", policy.to_json())
    raise ValueError(
        "workers > 1 and other backends need the policy as data (a Policy) or an EntryPointRef, "
        f"not {type(policy).__name__}: only those can be shipped to a worker"
    )


def policy_from_payload(payload: tuple) -> Any:
    if payload[0] == "skill":
        return Policy(MLPSpec.from_json(payload[1]), payload[2])
    data = payload[1]
    return EntryPointRef(data["name"], data["distribution"], data["version"], data["group"])


def _state_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(canonical_json([name, str(t.dtype), list(t.shape)]))
        h.update(t.numpy().tobytes())
    return h.hexdigest()

"""Policies are data, never code: a `Policy` is an MLP architecture spec plus safetensors weights,
checked against each other before any tensor is used (what a knowledge-base skill carries). Python
policies come only from locally installed, versioned entry points, which a record may name but never
carry.
"""

from __future__ import annotations

import importlib.metadata
import json
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from knowledge import content_hash, sha256_hex

from ._errors import EntryPointError, PolicyPayloadError
from ._mlp_spec import DTYPE_TAGS, MLPSpec

if TYPE_CHECKING:
    import torch

    from ._torch_mlp import MLP

MAX_WEIGHTS_BYTES = 256 * 2**20
POLICY_GROUP = "simnet.policies"


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
        from ._torch_mlp import encode

        # metadata stays out of the blob: safetensors writes its map in no fixed order
        return cls(spec, encode(spec, tensors), dict(metadata or {}))

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
        from ._torch_mlp import MLP

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
        tag = DTYPE_TAGS[self.spec.dtype]
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
        from ._torch_mlp import checked_tensors

        return checked_tensors(blob)


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
    if sys.modules.get("torch") is not None:  # a torch module needs torch imported
        from ._torch_mlp import describe_module

        if (described := describe_module(policy)) is not None:
            return described
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

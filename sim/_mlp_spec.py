"""A policy's architecture: the spec a skill's weights are checked against, apart from torch (the
weights' tensors and the module they build are in `_torch_mlp`)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ._errors import PolicySpecError

MLP_FORMAT = "simnet.mlp/1"
ACTIVATIONS = ("elu", "relu", "silu", "tanh")
DTYPE_TAGS = {"float64": "F64", "float32": "F32"}
"""A spec's dtype and the safetensors tag of its tensors."""


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
            isinstance(data.get("dtype"), str) and data["dtype"] in DTYPE_TAGS,
            "dtype",
            f"must be one of {sorted(DTYPE_TAGS)}",
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

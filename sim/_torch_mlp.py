"""The torch side of a `Policy`: the `MLP` module its spec and weights build, and the weights'
checks and encoding that need tensors. Apart from `_mlp` so that `import sim` does not import torch
(seconds of a process's start), only what runs or trains a policy does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any, cast

import numpy as np
import safetensors.torch
import torch

from knowledge import canonical_json

from ._errors import PolicyPayloadError
from ._mlp_spec import MLPSpec

ACTIVATION_MODULES: dict[str, Callable[[], torch.nn.Module]] = {
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
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


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
        dtype = _DTYPES[spec.dtype]
        sizes = [spec.obs_dim, *spec.hidden, spec.act_dim]
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, dtype=dtype) for a, b in pairwise(sizes)
        )
        self.activation = ACTIVATION_MODULES[spec.activation]()
        self.output_activation = (
            ACTIVATION_MODULES[spec.output_activation]() if spec.output_activation else None
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


def encode(spec: MLPSpec, tensors: Mapping[str, Any]) -> bytes:
    """The one safetensors encoding of `tensors` (arrays or tensors) in the spec's dtype: tensors
    in name order, no metadata."""
    dtype = _DTYPES[spec.dtype]
    prepared = {
        k: torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v)
        .to(dtype)
        .contiguous()
        for k, v in tensors.items()
    }
    return safetensors.torch.save(dict(sorted(prepared.items())))


def checked_tensors(blob: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a weights blob whose header `Policy` checked against its spec: valid
    safetensors, in the one encoding of its tensors, finite, with `obs_std` above zero."""
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


def describe_module(policy: Any) -> dict | None:
    """What a record says of a torch module policy (its state's hash), or None for another kind."""
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
    return None


def _state_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(canonical_json([name, str(t.dtype), list(t.shape)]))
        h.update(t.numpy().tobytes())
    return h.hexdigest()

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import (
    EntryPointError,
    EntryPointRef,
    IncompatibleTemplateError,
    MLPSpec,
    Policy,
    PolicyPayloadError,
    PolicySpecError,
    evaluate,
    load_skill,
)
from sim._mlp import describe_policy


def _tensors(spec, rng):
    return {
        name: rng.normal(size=shape)
        if not name.endswith("std")
        else np.abs(rng.normal(size=shape)) + 0.5
        for name, shape in spec.tensor_shapes().items()
    }


def test_skill_round_trip_and_forward_matches_numpy(tmp_path):
    rng = np.random.default_rng(0)
    spec = MLPSpec(5, 3, (8, 4), "tanh", "tanh", "float64")
    tensors = _tensors(spec, rng)
    skill = Policy.from_tensors(spec, tensors, {"task": "demo"})
    skill.save(tmp_path / "demo.json")
    loaded = Policy.load(tmp_path / "demo.json")
    assert loaded.hash == skill.hash and loaded.weights == skill.weights
    assert loaded.metadata == {"task": "demo"}
    obs = rng.normal(size=(6, 5))
    x = (obs - tensors["obs_mean"]) / tensors["obs_std"]
    x = np.tanh(x @ tensors["layers.0.weight"].T + tensors["layers.0.bias"])
    x = np.tanh(x @ tensors["layers.1.weight"].T + tensors["layers.1.bias"])
    x = np.tanh(x @ tensors["layers.2.weight"].T + tensors["layers.2.bias"])
    expected = tensors["act_offset"] + tensors["act_scale"] * x
    with torch.inference_mode():
        got = loaded.module()(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    # the same spec and tensors give the same blob, so the same address
    assert Policy.from_tensors(spec, tensors).weights_sha256 == skill.weights_sha256


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["tanh", "relu", "elu", "silu"]),
    st.sampled_from([None, "tanh", "relu", "elu", "silu"]),
    st.sampled_from(["float64", "float32"]),
    st.lists(st.integers(1, 70), max_size=3).map(tuple),
    st.integers(1, 300),
    st.integers(0, 2**32 - 1),
)
def test_act_gives_forward_bits(activation, output, dtype, hidden, rows, seed):
    """What rollouts call each control step (in place, functional) against the module's forward."""
    rng = np.random.default_rng(seed)
    spec = MLPSpec(
        int(rng.integers(1, 30)), int(rng.integers(1, 9)), hidden, activation, output, dtype
    )
    module = Policy.from_tensors(spec, _tensors(spec, rng)).module()
    obs = rng.normal(scale=3.0, size=(rows, spec.obs_dim))
    with torch.inference_mode():
        expected = module(torch.from_numpy(obs).to(module.obs_mean.dtype)).to(torch.float64)
    got = module.act(obs.copy())
    assert got.dtype == np.float64 and got.tobytes() == expected.numpy().tobytes()


def test_act_uses_the_tensors_the_module_holds_now():
    """`act` reads the module's own parameter and buffer dicts: weights loaded after construction
    and a module converted to float32 are what it computes with, as `forward` does."""
    rng = np.random.default_rng(3)
    spec = MLPSpec(6, 2, (5,), "tanh", None, "float64")
    module = Policy.from_tensors(spec, _tensors(spec, rng)).module()
    other = _tensors(spec, rng)
    module.load_state_dict({k: torch.from_numpy(v) for k, v in other.items()})
    obs = rng.normal(size=(9, 6))
    reloaded = Policy.from_tensors(spec, other).module().act(obs)
    assert module.act(obs).tobytes() == reloaded.tobytes()
    module.float()
    with torch.inference_mode():
        expected = module(torch.from_numpy(obs).float()).double().numpy()
    got = module.act(obs)
    assert got.dtype == np.float64 and got.tobytes() == expected.tobytes()
    assert got.tobytes() != reloaded.tobytes()  # float32 arithmetic really ran


def test_a_tampered_sidecar_hash_is_refused(tmp_path):
    skill = load_skill("walker_forward_good")
    skill.save(tmp_path / "w.json")
    doc = json.loads((tmp_path / "w.json").read_text())
    doc["weights_sha256"] = "0" * 64
    (tmp_path / "w.json").write_text(json.dumps(doc))
    with pytest.raises(PolicyPayloadError, match="does not match"):
        Policy.load(tmp_path / "w.json")


def _header_blob(header: dict, payload: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


@pytest.mark.parametrize(
    "mangle, message",
    [
        (lambda t: t.pop("layers.1.bias"), "missing \\['layers.1.bias'\\]"),
        (lambda t: t.update(extra=np.zeros(2)), "unexpected \\['extra'\\]"),
        (
            lambda t: t.update({"layers.0.weight": np.zeros((3, 4))}),
            "'layers.0.weight' is F64 \\[3, 4\\].*needs F64 \\[4, 3\\]",
        ),
        (lambda t: t.update({"layers.0.bias": np.full(4, np.nan)}), "NaN or inf"),
        (lambda t: t.update(obs_std=np.zeros(3)), "obs_std"),
    ],
)
def test_payloads_that_do_not_match_the_spec(mangle, message):
    spec = MLPSpec(3, 2, (4,))
    tensors = _tensors(spec, np.random.default_rng(1))
    mangle(tensors)
    with pytest.raises(PolicyPayloadError, match=message):
        Policy.from_tensors(spec, tensors)


def test_dtype_and_garbage_payloads():
    spec = MLPSpec(3, 2, ())
    good = Policy.from_tensors(spec, _tensors(spec, np.random.default_rng(2)))
    with pytest.raises(PolicyPayloadError, match="F32"):
        Policy(MLPSpec(3, 2, (), dtype="float32"), good.weights)
    with pytest.raises(PolicyPayloadError, match="shorter"):
        Policy(spec, b"abc")
    with pytest.raises(PolicyPayloadError, match="exceeds"):
        Policy(spec, struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(PolicyPayloadError, match="not JSON"):
        Policy(spec, struct.pack("<Q", 4) + b"{{{{")
    header = {
        name: {"dtype": "F64", "shape": list(shape), "data_offsets": [0, 10**9]}
        for name, shape in spec.tensor_shapes().items()
    }
    with pytest.raises(PolicyPayloadError, match="not valid safetensors"):
        Policy(spec, _header_blob(header, b"\0" * 16))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.update(format="onnx"), "format"),
        (lambda d: d.update(hidden=[64, -1]), "hidden"),
        (lambda d: d.update(activation="sigmoid"), "activation"),
        (lambda d: d.update(output_activation="softmax"), "output_activation"),
        (lambda d: d.update(obs_dim=0), "obs_dim"),
        (lambda d: d.update(dtype="float16"), "dtype"),
        (lambda d: d.update(code="import os"), "code"),
    ],
)
def test_malformed_architecture_specs_name_the_field(edit, field):
    data = MLPSpec(3, 2).to_json()
    edit(data)
    with pytest.raises(PolicySpecError) as info:
        MLPSpec.from_json(data)
    assert info.value.field == field


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from([*MLPSpec(3, 2).to_json(), "extra"]), value=JSON_VALUES)
def test_any_value_in_an_architecture_spec_is_read_or_refused_naming_the_field(field, value):
    """A spec comes from a peer's blob: any JSON in any field is a spec or a PolicySpecError."""
    data = {**MLPSpec(3, 2).to_json(), field: value}
    try:
        MLPSpec.from_json(data)
    except PolicySpecError as exc:
        assert exc.field == field


def test_a_skill_for_another_task_interface_is_refused(short_walker):
    with pytest.raises(IncompatibleTemplateError, match="17 observations to 7 actions"):
        evaluate(short_walker, load_skill("arm_reach_good"), branches=2, progress=False)


def test_policy_descriptions():
    skill = load_skill("arm_reach_good")
    assert describe_policy(skill)["skill_hash"] == skill.hash
    module = skill.module()
    assert (
        describe_policy(module)["state_sha256"] == describe_policy(skill.module())["state_sha256"]
    )
    assert describe_policy(torch.nn.Linear(2, 2))["class"] == "torch.nn.modules.linear.Linear"
    assert describe_policy(np.tanh)["kind"] == "callable"


def test_entry_point_policies_load_only_at_the_recorded_version(installed_policy, short_walker):
    ref = EntryPointRef("stand_still", "fleetctl", "1.2.0")
    result = evaluate(short_walker, ref, branches=2, progress=False)
    assert result.policy == ref.to_json() and result.successes == 0
    with pytest.raises(EntryPointError, match="fleetctl==1.2.0.*needs fleetctl==1.3.0"):
        EntryPointRef("stand_still", "fleetctl", "1.3.0").load()
    with pytest.raises(EntryPointError, match="no entry point 'walk'"):
        EntryPointRef("walk", "fleetctl", "1.2.0").load()

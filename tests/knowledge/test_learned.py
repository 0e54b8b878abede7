"""The learned encoder: tokens, determinism, joint-order invariance, weights on disk, training,
retrieval; its numpy forward pass against the torch network it reproduces, and encoding with torch
absent (the light install).

`tests/assets/transfer_small.json.gz` is real simulator data: `simnet encoder dataset --arms 32
--walkers 0 --no-shipped` (32 procedural arms, every arm's reach skill evaluated on every arm, 16
branches each).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

import knowledge
from knowledge import (
    Embodiment,
    EncoderWeightsError,
    FeatureEncoder,
    LearnedEncoder,
    SkillIndex,
    TransferDataError,
    TransferDataset,
    evaluate_encoder,
    train_encoder,
)
from knowledge.embodiment import _learned
from knowledge.embodiment._learned import DEFAULT_CONFIG, FORMAT, population_reference
from knowledge.embodiment._retrieval import index_path
from knowledge.embodiment._tokens import BODY_FEATURES, JOINT_FEATURES, body_tokens
from knowledge.embodiment._training import untrained_encoder

SHIPPED_VERSION = "1-65a1d4c24f043aad"
"""The shipped weights' embedding space: indexes key on it, so loading them another way (numpy
rather than torch) must not change it."""

ASSETS = Path(__file__).parent.parent / "assets"
ROBOTS = ASSETS / "robots"
SMALL = TransferDataset.load(ASSETS / "transfer_small.json.gz")
BODIES = [
    Embodiment.from_mjcf(ROBOTS / name)
    for name in (
        "arm7.xml",
        "gripper.xml",
        "quadruped.xml",
        "humanoid_small.xml",
        "wheeled_base.xml",
    )
]
BODIES += [Embodiment.from_urdf(ROBOTS / "arm6.urdf"), *SMALL.bodies[:4]]
shipped = LearnedEncoder()


def permuted(e: Embodiment, rnd: random.Random) -> Embodiment:
    """The same body with joints, actuators, sites and sensors listed in another order (indices
    renumbered)."""
    order = list(range(len(e.joints)))
    rnd.shuffle(order)
    new = {old: i for i, old in enumerate(order)}
    actuators = [
        dataclasses.replace(a, target=tuple(new[t] for t in a.target)) if a.moves_joints else a
        for a in e.actuators
    ]
    sites, sensors = list(e.sites), list(e.sensors)
    for part in (actuators, sites, sensors):
        rnd.shuffle(part)
    return Embodiment(
        e.name,
        e.bodies,
        tuple(e.joints[i] for i in order),
        tuple(actuators),
        tuple(sites),
        tuple(sensors),
    )


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.name)
def test_one_token_per_moving_joint(body):
    joints, whole = body_tokens(body)
    assert joints.shape == (sum(j.type != "free" for j in body.joints), JOINT_FEATURES)
    assert (
        whole.shape == (BODY_FEATURES,) and np.isfinite(joints).all() and np.isfinite(whole).all()
    )


_BENT_ARM_ACTUATORS = (
    '<actuator><position joint="j1" gear="2" kp="10"/>'
    '<position joint="j2" gear="2" kp="10"/></actuator>'
)
BENT_ARM = f"""<mujoco><worldbody><body name="a" pos="0 0 0.1"><joint name="j1" axis="0 0 1"/>
  <geom type="capsule" fromto="0 0 0 0 0 0.3" size="0.02"/>
  <body name="b" pos="0 0 0.3" quat="0.9 0 0.43 0"><joint name="j2" axis="0 1 0"/>
    <geom type="capsule" fromto="0 0 0 0 0 0.25" size="0.02"/><site name="tool" pos="0 0 0.2"/>
  </body></body></worldbody>
  {_BENT_ARM_ACTUATORS}</mujoco>"""


def test_a_joint_token_holds_how_its_joint_moves_the_tool():
    """The lever from the joint to the chain's end (the tool site, not the longer link's tip) and
    the tool's Jacobian column, as MuJoCo computes them at the home pose."""

    body = Embodiment.from_mjcf(BENT_ARM)
    joints, _ = body_tokens(body)
    model = mujoco.MjModel.from_xml_string(BENT_ARM)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    jacobian = np.zeros((3, model.nv))
    mujoco.mj_jacSite(model, data, jacobian, None, model.site("tool").id)
    for k in range(model.njnt):
        lever = (data.site("tool").xpos - data.xpos[model.jnt_bodyid[k]]) / body.reach
        assert np.allclose(joints[k, 6:9], lever, atol=1e-5)
        assert np.allclose(joints[k, 9:12], jacobian[:, k] / body.reach, atol=1e-5)
    assert np.abs(joints[:, 9:12]).max() > 0.1  # the bend makes both joints move the tool


def test_vectors_are_deterministic_and_batching_does_not_change_them():
    vectors = shipped.encode_many(BODIES)
    assert vectors.dtype == np.float32 and vectors.shape == (len(BODIES), shipped.dim)
    assert np.array_equal(vectors, shipped.encode_many(BODIES))
    assert np.array_equal(
        vectors, LearnedEncoder().encode_many(Embodiment.from_dict(b.to_dict()) for b in BODIES)
    )
    single = np.stack(
        [shipped.encode(b) for b in BODIES]
    )  # no padding: other float summation order
    assert np.allclose(single, vectors, atol=1e-5)
    assert shipped.encode_many([]).shape == (0, shipped.dim)


def test_bodies_over_the_attention_budget_run_in_smaller_batches_in_their_order(monkeypatch):
    """A batch pads every body to its longest: past `BATCH_ATTENTION` the bodies run in batches
    by their number of joints (a peer's scope of 1,500 joints padded 100 arms to 21 GB)."""
    bodies = BODIES * 3
    whole = shipped.encode_many(bodies), shipped.ood_components(bodies)
    monkeypatch.setattr(_learned, "BATCH_ATTENTION", 2 * 9**2)  # two arms of 8 joint tokens
    batches = _learned._batches(bodies)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(bodies)))
    for batch in batches:  # each within the budget, or a body alone
        longest = max(sum(j.type != "free" for j in bodies[i].joints) + 1 for i in batch)
        assert len(batch) == 1 or len(batch) * longest**2 <= 2 * 9**2
    batched = shipped.encode_many(bodies), shipped.ood_components(bodies)
    for one, other in zip(whole, batched, strict=True):
        assert one is not None and other is not None and one.shape == other.shape
        assert np.allclose(one, other, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.name)
def test_listing_order_of_joints_does_not_matter(body, seed):
    assert np.allclose(
        shipped.encode(permuted(body, random.Random(seed))), shipped.encode(body), atol=1e-5
    )


def test_where_a_joint_sits_in_the_chain_matters():
    """Swapping two links of an arm is another body: the vector changes (it is not a bag of
    links)."""
    arm = SMALL.bodies[0]
    bodies = list(arm.bodies)
    first, second = [i for i, b in enumerate(bodies) if b.parent >= 0 and b.link_length > 0][1:3]
    bodies[first], bodies[second] = (
        dataclasses.replace(bodies[first], pos=bodies[second].pos),
        dataclasses.replace(bodies[second], pos=bodies[first].pos),
    )
    swapped = dataclasses.replace(arm, bodies=tuple(bodies))
    assert swapped.fingerprint != arm.fingerprint
    assert not np.allclose(shipped.encode(swapped), shipped.encode(arm), atol=1e-3)


def test_shipped_weights_load_without_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the encoder tried to open a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    encoder = LearnedEncoder()
    assert encoder.space == knowledge.EmbeddingSpace(
        "transfer-attention", encoder.version, DEFAULT_CONFIG["dim"] + 1, "l2"
    )
    assert encoder.version.startswith("1-") and encoder.meta["trained_on"]


def test_weights_round_trip(tmp_path):
    path = tmp_path / "weights.safetensors"
    shipped.save(path)
    for again in (
        LearnedEncoder(path),
        LearnedEncoder(path.read_bytes()),
        LearnedEncoder(str(path)),
    ):
        assert again.version == shipped.version and again.config == shipped.config
        assert np.array_equal(again.encode_many(BODIES), shipped.encode_many(BODIES))


def test_bad_weights_are_refused(tmp_path):
    import safetensors.torch
    import torch

    good = shipped.to_bytes()
    tensors = safetensors.torch.load(good)
    header = {"format": FORMAT, "config": json.dumps(DEFAULT_CONFIG)}
    bad = {
        "not safetensors": b"hello, weights",
        "truncated": good[: len(good) // 2],
        "other format": safetensors.torch.save(tensors, metadata={**header, "format": "other/1"}),
        "older tokens": safetensors.torch.save(
            tensors, metadata={**header, "format": "simnet.encoder/2"}
        ),
        "half a reference": safetensors.torch.save(
            {k: v for k, v in tensors.items() if k != "ood.thresholds"}, metadata=header
        ),
        "reference of other tokens": safetensors.torch.save(
            {**tensors, "ood.tokens": tensors["ood.tokens"][:, :-1].contiguous()}, metadata=header
        ),
        "zero threshold": safetensors.torch.save(
            {**tensors, "ood.thresholds": torch.zeros_like(tensors["ood.thresholds"])},
            metadata=header,
        ),
        "wrong shapes": safetensors.torch.save(
            tensors, metadata={**header, "config": json.dumps({**DEFAULT_CONFIG, "width": 48})}
        ),
        "missing tensor": safetensors.torch.save(dict(list(tensors.items())[1:]), metadata=header),
        "NaN": safetensors.torch.save(
            {**tensors, "out.3.bias": torch.full_like(tensors["out.3.bias"], float("nan"))},
            metadata=header,
        ),
    }
    for name, blob in bad.items():
        with pytest.raises(EncoderWeightsError):
            LearnedEncoder(blob)
        assert name


def test_training_improves_the_ranking_on_held_out_bodies():
    train, held = SMALL.split(0.25, seed=0)
    assert len(held) >= 6
    data = SMALL.subset(train)
    untrained = untrained_encoder(data.bodies)
    trained = train_encoder(data, epochs=150)
    before, after = evaluate_encoder(SMALL, untrained, held), evaluate_encoder(SMALL, trained, held)
    assert after.spearman > before.spearman + 0.2
    assert after.spearman > evaluate_encoder(SMALL, FeatureEncoder(), held).spearman
    assert trained.version not in (untrained.version, shipped.version)
    assert trained.meta["epochs"] == 150
    assert trained.meta["trained_names"] == sorted(set(data.names))
    assert not set(trained.meta["trained_names"]) & {SMALL.names[i] for i in held}
    # the same data and seed give the same weights, however many threads torch was given
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)  # the reference above ran with what the machine had (2 here)
        assert train_encoder(data, epochs=150).version == trained.version
        assert torch.get_num_threads() == 4  # and it is left as it was
    finally:
        torch.set_num_threads(threads)


def test_training_needs_something_to_rank():
    body = SMALL.bodies[0]
    with pytest.raises(TransferDataError, match="distinct"):
        train_encoder(TransferDataset.from_outcomes([(body, body, "reach", 3, 4)]))
    alike = TransferDataset.from_outcomes(
        [(SMALL.bodies[i], body, "reach", 2, 4) for i in (1, 2, 3)]
    )
    with pytest.raises(TransferDataError, match="alike"):
        train_encoder(alike)
    with pytest.raises(ValueError):
        train_encoder(SMALL, epochs=0)


def test_retrieval_with_the_learned_encoder_is_the_brute_force_answer(open_kb):
    kb = open_kb()
    scopes = SMALL.bodies[:24]
    ids = [
        kb.skills.publish(f"reach-{i}", "reach", embodiments=[body.to_dict()]).id
        for i, body in enumerate(scopes)
    ]
    query = SMALL.bodies[30]
    results = kb.skills.query(query, task="reach", k=8, active_only=False, encoder=shipped)
    vectors = shipped.encode_many(scopes)
    distance = np.linalg.norm(vectors - shipped.encode(query), axis=1)
    expected = [ids[i] for i in np.argsort(distance, kind="stable")[:8]]
    assert [r.skill.id for r in results] == expected
    assert np.allclose([r.distance for r in results], np.sort(distance)[:8], rtol=1e-4)


def test_switching_encoders_uses_and_rebuilds_their_own_index(tmp_path):
    identity = knowledge.Identity.generate()
    store = tmp_path / "site.db"
    kb = knowledge.open(store, identity)
    for i, body in enumerate(SMALL.bodies[:12]):
        kb.skills.publish(f"reach-{i}", "reach", embodiments=[body.to_dict()])
    query = SMALL.bodies[20]
    assert len(kb.skills.query(query, k=3, active_only=False)) == 3
    assert len(kb.skills.query(query, k=3, active_only=False, encoder=shipped)) == 3
    kb.close()
    learned_index = index_path(str(store), shipped)
    assert index_path(str(store), FeatureEncoder()).exists() and learned_index.exists()
    assert SkillIndex.load(learned_index, shipped.space) is not None
    # retrained weights are another space: the saved index is not reused but rebuilt for them
    retrained = train_encoder(SMALL.subset(list(range(16))), epochs=20)
    assert retrained.space != shipped.space and index_path(str(store), retrained) == learned_index
    kb = knowledge.open(store, identity)
    results = kb.skills.query(query, k=12, active_only=False, encoder=retrained)
    kb.close()
    vectors = retrained.encode_many(SMALL.bodies[:12])
    features = FeatureEncoder().encode_many(SMALL.bodies[:12])
    ranks = retrained.guarded(
        np.linalg.norm(vectors - retrained.encode(query), axis=1),
        np.linalg.norm(features - FeatureEncoder().encode(query), axis=1),
    )
    order = np.argsort(ranks, kind="stable")
    assert [r.skill.name for r in results] == [f"reach-{i}" for i in order]
    assert SkillIndex.load(learned_index, retrained.space) is not None
    assert SkillIndex.load(learned_index, shipped.space) is None


def _robots() -> list[Embodiment]:
    """Every robot in tests/assets/robots that describes a body (one file there has no joints)."""
    robots = []
    for path in sorted(ROBOTS.iterdir()):
        load = Embodiment.from_urdf if path.suffix == ".urdf" else Embodiment.from_mjcf
        try:
            robots.append(load(path))
        except knowledge.EmbodimentError:
            continue
    return robots


def _torch_vectors(encoder: LearnedEncoder, bodies: list[Embodiment]) -> np.ndarray:
    """What the torch network (training's `_Network`) holding `encoder`'s weights makes of
    `bodies`: the vectors but their last coordinate (the out-of-distribution one, numpy's)."""
    import torch

    from knowledge.embodiment._training import _network, _torch_batch

    with torch.inference_mode():
        return _network(encoder)(*_torch_batch(bodies)).numpy()


def test_the_shipped_weights_keep_their_version():
    assert shipped.version == SHIPPED_VERSION
    assert LearnedEncoder(shipped.to_bytes()).version == SHIPPED_VERSION


def test_the_shipped_weights_trained_on_no_body_the_transfer_benchmark_holds_out():
    """benchmarks/transfer.py reports on `split(0.25, seed=0, by="name")`'s held-out bodies: every
    body the shipped weights trained on must fall on the other side, whatever the readers do."""
    names = shipped.meta["trained_names"]
    assert len(names) > 100 and {"arm-0", "legged-0", "quadruped-0"} & set(names)
    bodies = tuple(Embodiment.from_dict({**BODIES[0].to_dict(), "name": name}) for name in names)
    train, held = TransferDataset(bodies, (), {}).split(0.25, seed=0, by="name")
    assert held == [] and len(train) == len(names)


def test_the_numpy_forward_pass_is_the_torch_network_on_the_shipped_weights():
    robots = _robots()
    assert len(robots) >= 6
    bodies = robots + BODIES
    vectors = shipped.encode_many(bodies)[:, :-1]
    assert np.allclose(vectors, _torch_vectors(shipped, bodies), atol=1e-5)
    for body in robots:  # one at a time: no padding
        assert np.allclose(shipped.encode(body)[:-1], _torch_vectors(shipped, [body])[0], atol=1e-5)


@pytest.mark.parametrize(
    "config", [{}, {"width": 16, "heads": 2, "layers": 1, "dim": 8}], ids=["default", "tiny"]
)
def test_the_numpy_forward_pass_is_the_torch_network_on_freshly_trained_weights(config):
    data = SMALL.subset(list(range(10)))
    start = untrained_encoder(data.bodies, seed=3, **config)
    trained = train_encoder(data, epochs=10, seed=3, start=start)
    assert trained.version != start.version and trained.config == start.config
    bodies = _robots() + list(SMALL.bodies[:12])
    for encoder in (start, trained, LearnedEncoder(trained.to_bytes())):
        assert np.allclose(
            encoder.encode_many(bodies)[:, :-1], _torch_vectors(encoder, bodies), atol=1e-5
        )


def test_weights_whose_heads_do_not_divide_their_width_are_refused():
    import safetensors.numpy

    tensors = safetensors.numpy.load(shipped.to_bytes())
    config = json.dumps({**DEFAULT_CONFIG, "heads": 5})
    with pytest.raises(EncoderWeightsError):
        LearnedEncoder(
            safetensors.numpy.save(tensors, metadata={"format": FORMAT, "config": config})
        )


_WITHOUT_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is not installed (blocked by the test)")
        return None

sys.meta_path.insert(0, NoTorch())
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch was importable")

import knowledge
from knowledge import Embodiment, LearnedEncoder

encoder = LearnedEncoder()
arm = Embodiment.from_mjcf(sys.argv[1])
vector = encoder.encode(arm)
assert vector.shape == (encoder.dim,) and encoder.space.version == encoder.version
assert "torch" not in sys.modules, "torch was imported"
print(encoder.version, " ".join(repr(float(x)) for x in vector))
"""


def test_the_learned_encoder_encodes_without_torch():
    """A robot that only queries skills installs no torch: loading the shipped weights and encoding
    a body work with torch unimportable, and give the vector torch gives."""
    root = Path(knowledge.__file__).parent.parent
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, str(ROBOTS / "arm7.xml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    version, *numbers = done.stdout.split()
    assert version == SHIPPED_VERSION
    arm = Embodiment.from_mjcf(ROBOTS / "arm7.xml")
    assert np.array_equal(np.array(numbers, np.float32), shipped.encode(arm))
    assert np.allclose(
        np.array(numbers, np.float32)[:-1], _torch_vectors(shipped, [arm])[0], atol=1e-5
    )


# -- out of distribution --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arms_only() -> LearnedEncoder:
    """An encoder that has seen 3-7 dof procedural arms only: a quadruped is out of its depth.
    Trained once, by the worker that runs the tests using it (the tests sharing a module fixture
    run on one xdist worker: tests/conftest.py), not at collection in every worker."""
    return train_encoder(SMALL.subset(SMALL.split(0.25, seed=0)[0]), epochs=40)


def test_bodies_like_the_training_ones_are_in_distribution_and_others_not(arms_only):
    _, held = SMALL.split(0.25, seed=0)
    scores = arms_only.ood_many([SMALL.bodies[i] for i in held])
    assert scores is not None and np.median(scores) < 1.0  # calibrated on 22 bodies only
    strangers = [Embodiment.from_mjcf(ROBOTS / n) for n in ("quadruped.xml", "humanoid_small.xml")]
    assert (arms_only.ood_many(strangers) > 1.0).all()
    parts = arms_only.ood_components(strangers)
    assert parts.shape == (2, 3) and np.allclose(parts.max(1), arms_only.ood_many(strangers))
    vector, score = arms_only.assess(strangers[0])
    assert np.array_equal(vector, arms_only.encode(strangers[0])) and score > 1.0


def test_the_reference_travels_with_the_weights_and_is_part_of_the_space(tmp_path, arms_only):
    path = tmp_path / "arms.safetensors"
    arms_only.save(path)
    again = LearnedEncoder(path)
    assert again.version == arms_only.version and again.reference is not None
    assert np.array_equal(again.ood_many(BODIES), arms_only.ood_many(BODIES))
    other = arms_only.with_reference(
        population_reference(arms_only, list(SMALL.bodies) + BODIES)
    )  # recalibrated on more bodies: the network's part is the same, the last coordinate not
    assert other.version != arms_only.version
    assert np.array_equal(other.encode_many(BODIES)[:, :-1], arms_only.encode_many(BODIES)[:, :-1])
    assert (other.ood_many(BODIES) <= 1.0).mean() > (arms_only.ood_many(BODIES) <= 1.0).mean()


def test_bodies_out_of_distribution_lie_beyond_every_known_body(arms_only):
    """Their last coordinate grows with the score: no body the encoder knows has a stranger (a
    quadruped, a humanoid) as its nearest."""
    _, held = SMALL.split(0.25, seed=0)
    known = [SMALL.bodies[i] for i in held]
    strangers = [Embodiment.from_mjcf(ROBOTS / n) for n in ("quadruped.xml", "humanoid_small.xml")]
    vectors = arms_only.encode_many(known + strangers)
    scores = arms_only.ood_many(known + strangers)
    assert (vectors[scores <= 1.0, -1] == 0).all() and (vectors[scores > 1.0, -1] > 0).all()
    for i in np.flatnonzero(scores <= 1.0):
        distance = np.linalg.norm(vectors - vectors[i], axis=1)
        distance[i] = np.inf
        assert np.argmin(distance) < len(known)


def test_a_query_out_of_distribution_is_ranked_by_the_feature_encoder(open_kb, arms_only):
    kb = open_kb()
    scopes = [*SMALL.bodies[:12], *(Embodiment.from_mjcf(ROBOTS / n) for n in ("quadruped.xml",))]
    for i, body in enumerate(scopes):
        kb.skills.publish(f"skill-{i}", "any", embodiments=[body.to_dict()])
    stranger = Embodiment.from_mjcf(ROBOTS / "humanoid_small.xml")
    results = kb.skills.query(stranger, k=5, active_only=False, encoder=arms_only)
    features = FeatureEncoder()
    expected = np.argsort(
        np.linalg.norm(features.encode_many(scopes) - features.encode(stranger), axis=1),
        kind="stable",
    )[:5]
    assert [r.skill.name for r in results] == [f"skill-{i}" for i in expected]
    assert {r.ranked_by for r in results} == {"morphology-features"}
    assert all(r.ood == pytest.approx(arms_only.ood_many([stranger])[0]) for r in results)
    # a body it knows is ranked by its own distance, and says so
    arm = SMALL.bodies[30]
    results = kb.skills.query(arm, k=5, active_only=False, encoder=arms_only)
    assert {r.ranked_by for r in results} == {"transfer-attention"}
    assert results[0].ood is not None and results[0].ood <= 1.0
    # without a fallback it ranks everything itself, and still reports the score
    alone = LearnedEncoder(arms_only.to_bytes(), fallback=None)
    results = kb.skills.query(stranger, k=5, active_only=False, encoder=alone)
    assert {r.ranked_by for r in results} == {"transfer-attention"} and results[0].ood > 1.0
    # the feature encoder has no notion of its distribution
    results = kb.skills.query(stranger, k=5, active_only=False)
    assert results[0].ood is None and results[0].ranked_by == "morphology-features"

"""Transfer datasets: merging outcomes, files, splits, harvesting certificates, and the encoder
report."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

import knowledge
from knowledge import (
    Embodiment,
    Encoder,
    FeatureEncoder,
    TransferDataError,
    TransferDataset,
    evaluate_encoder,
)
from knowledge.embodiment._transfer_data import spearman

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"
ARM7 = Embodiment.from_mjcf(ROBOTS / "arm7.xml")
QUAD = Embodiment.from_mjcf(ROBOTS / "quadruped.xml")
ARM6 = Embodiment.from_urdf(ROBOTS / "arm6.urdf")
GRIPPER = Embodiment.from_mjcf(ROBOTS / "gripper.xml")


def small() -> TransferDataset:
    outcomes = [
        (ARM7, ARM6, "reach", 6, 8),
        (ARM6, ARM7, "reach", 2, 8),
        (GRIPPER, ARM7, "reach", 0, 8),
        (ARM7, ARM7, "reach", 8, 8),
        (QUAD, QUAD, "walk", 7, 8),
    ]
    return TransferDataset.from_outcomes(outcomes, {"note": "hand-made"})


def test_outcomes_merge_bodies_by_fingerprint_and_sum_repeated_pairs():
    renamed = Embodiment.from_dict({**ARM7.to_dict(), "name": "another-name"})
    data = TransferDataset.from_outcomes(
        [(ARM7, ARM6, "reach", 3, 4), (renamed, ARM6, "reach", 1, 4), (ARM7, ARM6, "pick", 0, 2)]
    )
    assert data.names == ("arm7", "arm6")
    assert sorted((t.task, t.successes, t.trials) for t in data.transfers) == [
        ("pick", 0, 2),
        ("reach", 4, 8),
    ]
    assert data.tasks == ("pick", "reach")
    rates = data.rates("reach")
    assert rates[0, 1] == 0.5 and np.isnan(rates[1, 0]) and np.isnan(rates[0, 0])
    with pytest.raises(TransferDataError):
        TransferDataset.from_outcomes([(ARM7, ARM6, "reach", 5, 4)])


@pytest.mark.parametrize("name", ["data.json", "data.json.gz"])
def test_files_round_trip(tmp_path, name):
    data = small()
    data.save(tmp_path / name)
    raw = (tmp_path / name).read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    loaded = TransferDataset.load(tmp_path / name)
    assert loaded.transfers == data.transfers and loaded.meta == data.meta
    assert [b.fingerprint for b in loaded.bodies] == [b.fingerprint for b in data.bodies]


def test_malformed_files_are_refused(tmp_path):
    path = tmp_path / "bad.json"
    for content in (
        b"not json",
        json.dumps({"format": "other"}).encode(),
        json.dumps({**small().to_json(), "transfers": [[0, 99, "reach", 1, 2]]}).encode(),
        json.dumps({**small().to_json(), "transfers": [[0, 1, "reach", 3, 2]]}).encode(),
        gzip.compress(b"{"),
    ):
        path.write_bytes(content)
        with pytest.raises(TransferDataError):
            TransferDataset.load(path)


def test_split_is_stable_and_subset_keeps_transfers_among_kept_bodies():
    data = small()
    train, held = data.split(0.5, seed=3)
    assert sorted(train + held) == list(range(len(data.bodies))) and (train, held) == data.split(
        0.5, seed=3
    )
    assert data.split(0.0) == (list(range(len(data.bodies))), [])
    # a body's side does not depend on the other bodies in the dataset
    bigger = TransferDataset.from_outcomes(
        [(ARM7, ARM6, "reach", 1, 2), (QUAD, QUAD, "walk", 1, 2)]
    )
    sides = {data.names[i]: i in held for i in range(len(data.bodies))}
    _, held_bigger = bigger.split(0.5, seed=3)
    assert all(sides[bigger.names[i]] == (i in held_bigger) for i in range(len(bigger.bodies)))
    sub = data.subset([0, 1])
    assert sub.names == data.names[:2] and {(t.source, t.target) for t in sub.transfers} <= {
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    }
    with pytest.raises(ValueError):
        data.split(1.0)


def described_anew(body: Embodiment, k: int) -> Embodiment:
    """The same robot as another version of a reader might describe it: one link's mass differs,
    so the fingerprint does, the name does not."""
    data = body.to_dict()
    for derived in ("mass", "fingerprint"):
        data.pop(derived)
    data["bodies"][1] = {**data["bodies"][1], "mass": data["bodies"][1]["mass"] + 0.01 * (k + 1)}
    return Embodiment.from_dict(data)


def test_split_by_name_keeps_a_robot_on_its_side_however_its_description_changes():
    versions = [described_anew(ARM7, k) for k in range(16)]
    data = TransferDataset.from_outcomes([(v, QUAD, "reach", 1, 2) for v in versions])
    assert len(data.bodies) == 17 and len({b.fingerprint for b in data.bodies}) == 17
    by_fingerprint = data.split(0.5, seed=1)
    arm7 = [i for i, name in enumerate(data.names) if name == "arm7"]
    assert all(set(arm7) & set(side) for side in by_fingerprint)  # its versions cross the line
    by_name = data.split(0.5, seed=1, by="name")
    assert any(set(arm7) <= set(side) for side in by_name)  # by name they stay together
    assert sorted(sum(by_name, [])) == list(range(17))
    with pytest.raises(ValueError, match="name"):
        data.split(0.5, by="model")
    nameless = Embodiment.from_dict({**ARM6.to_dict(), "name": ""})
    unnamed = TransferDataset.from_outcomes([(nameless, QUAD, "reach", 1, 2)])
    with pytest.raises(ValueError, match="no name"):
        unnamed.split(0.5, by="name")
    assert sorted(sum(unnamed.split(0.5), [])) == [0, 1]  # by fingerprint, names do not matter


def test_spearman_handles_ties_and_constants():
    assert spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    assert spearman(np.array([1, 2, 3, 4]), np.array([0, 0, 1, 1])) == pytest.approx(0.894427191)
    assert math.isnan(spearman(np.array([1, 2, 3]), np.array([1, 1, 1])))


class _Table(Encoder):
    """A one-dimensional encoder with chosen coordinates, to check the report by hand."""

    name, version, dim = "table", "1", 1

    def __init__(self, coordinates: dict[str, float]) -> None:
        self.coordinates = coordinates

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        return np.array([self.coordinates[embodiment.name]], np.float32)


def test_report_ranks_skills_by_distance_per_target():
    bodies = [ARM7, ARM6, GRIPPER, QUAD]
    rates = {("arm6", "arm7"): 7, ("parallel_gripper", "arm7"): 4, ("quadruped", "arm7"): 0}
    outcomes = [
        (next(b for b in bodies if b.name == s), ARM7, "reach", k, 8) for (s, _), k in rates.items()
    ]
    data = TransferDataset.from_outcomes(outcomes)
    target = data.names.index("arm7")
    good = evaluate_encoder(
        data,
        _Table({"arm7": 0.0, "arm6": 1.0, "parallel_gripper": 2.0, "quadruped": 3.0}),
        [target],
        k=1,
        threshold=0.8,
    )
    assert good.spearman == pytest.approx(1.0) and good.recall_at_k == 1.0
    assert good.scores[0].skills == 3 and good.scores[0].body == "arm7"
    bad = evaluate_encoder(
        data,
        _Table({"arm7": 0.0, "arm6": 3.0, "parallel_gripper": 2.0, "quadruped": 1.0}),
        [target],
        k=1,
        threshold=0.8,
    )
    assert bad.spearman == pytest.approx(-1.0) and bad.recall_at_k == 0.0
    # no skill reaches the threshold: recall is undefined there, not zero
    assert math.isnan(evaluate_encoder(data, FeatureEncoder(), threshold=0.99).recall_at_k)
    assert json.loads(json.dumps(good.to_json()))["bodies"][0]["recall_at_1"] == 1.0


def test_certificates_become_transfers(open_kb):
    kb = open_kb()
    scene = (ROBOTS / "arm7.xml").read_text()
    skill = kb.skills.publish(
        "reach-a", "reach", embodiments=[ARM6.to_dict(), {"fingerprint": "legacy tag"}]
    )
    kb.certificates.add(
        skill.id,
        branches=16,
        successes=12,
        randomized=["mass"],
        evaluation={"task": {"definition": {"scene": scene}}},
    )
    kb.certificates.add(
        skill.id,
        branches=16,
        successes=4,
        randomized=["mass"],
        evaluation={"task": {"definition": {"scene": scene}}},
    )
    kb.certificates.add(
        skill.id,
        branches=8,
        successes=8,
        randomized=["mass"],
        evaluation={"task": {"definition": {"scene": str(ROBOTS / "arm7.xml")}}},
    )  # a path: never read
    kb.certificates.add(
        skill.id, branches=8, successes=8, randomized=["mass"], evaluation={"summary": {}}
    )
    kb.skills.publish("unscoped", "reach")
    data = knowledge.TransferDataset.from_knowledge_base(kb)
    assert data.names == ("arm6", "arm7")
    assert [(t.source, t.target, t.task, t.successes, t.trials) for t in data.transfers] == [
        (0, 1, "reach", 16, 32)
    ]

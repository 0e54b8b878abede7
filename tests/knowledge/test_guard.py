"""The learned encoder's guard: a query in distribution ranks by the learned distance plus a penalty
where the feature encoder finds two bodies of different kinds (`LearnedEncoder.guarded`). The rule's
arithmetic; which weights have a guard; training records its unit; and `kb.skills.query` returns
exactly what ranking every skill by guarded distance gives, even where the guard reorders
everything the index fetches first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import knowledge
from knowledge import Embodiment, FeatureEncoder, LearnedEncoder, TransferDataset, train_encoder
from knowledge.embodiment import _learned
from knowledge.embodiment._learned import KIND_MARGIN, KIND_PENALTY, feature_spread, weights_file
from knowledge.embodiment._views import urdf_view

ASSETS = Path(__file__).parent.parent / "assets"
ROBOTS = ASSETS / "robots"
SMALL = TransferDataset.load(ASSETS / "transfer_small.json.gz")
shipped = LearnedEncoder()


def _with_meta(encoder: LearnedEncoder, **meta: object) -> LearnedEncoder:
    """The same weights with other meta (`None` drops a key)."""
    kept = {k: v for k, v in {**encoder.meta, **meta}.items() if v is not None}
    return LearnedEncoder(weights_file(encoder._tensors, encoder.config, kept, encoder.reference))


def _robots() -> list[Embodiment]:
    files = ["arm7.xml", "arm6.urdf", "gripper.xml", "quadruped.xml", "humanoid_small.xml"]
    files += ["wheeled_base.xml", "quadruped12.urdf", "diffbot.urdf"]
    read = {".urdf": Embodiment.from_urdf, ".xml": Embodiment.from_mjcf}
    return [read[Path(f).suffix](ROBOTS / f) for f in files]


def test_the_shipped_weights_are_guarded_by_the_feature_encoder_of_their_version():
    assert isinstance(shipped.guard, FeatureEncoder)
    spread = shipped.meta["feature_spread"]
    assert spread["version"] == FeatureEncoder.version and spread["median"] > 0


def test_guarded_adds_nothing_within_the_margin_and_a_penalty_per_median_beyond():
    unit = shipped.meta["feature_spread"]["median"]
    learned = np.array([0.5, 3.0, 7.0, 7.0, 1.0])
    features = np.array([0.0, KIND_MARGIN * unit, (KIND_MARGIN + 1) * unit, 0.1, 10 * unit])
    ranks = shipped.guarded(learned, features)
    assert ranks[:2].tolist() == learned[:2].tolist() and ranks[3] == learned[3]
    per_median = ranks[2] - learned[2]
    assert per_median > 0
    assert ranks[4] - learned[4] == pytest.approx(per_median * (10 - KIND_MARGIN))
    # in the reference's median learned distances: the same unit the out-of-distribution push uses
    median_learned = per_median / KIND_PENALTY
    assert 0.1 < median_learned < 1e3


def test_weights_without_a_feature_spread_or_of_another_feature_version_rank_unguarded():
    for encoder in (
        _with_meta(shipped, feature_spread=None),
        _with_meta(shipped, feature_spread={"version": "0", "median": 2.0}),
        LearnedEncoder(fallback=None),
    ):
        assert encoder.guard is None
        assert encoder.version == shipped.version  # the vectors are the same space either way
        learned = np.array([1.0, 2.0])
        assert encoder.guarded(learned, np.array([0.0, 1e6])).tolist() == [1.0, 2.0]


def test_training_records_the_feature_spread_of_the_bodies_and_their_views():
    data = SMALL.subset(list(range(10)))
    trained = train_encoder(data, epochs=3)
    seen = list(data.bodies) + [urdf_view(b) for b in data.bodies]
    assert trained.meta["feature_spread"] == feature_spread(seen)
    assert isinstance(trained.guard, FeatureEncoder)
    features = FeatureEncoder().encode_many(seen).astype(np.float64)
    pairs = np.triu_indices(len(seen), 1)
    distances = np.linalg.norm(features[:, None] - features[None], axis=2)[pairs]
    assert trained.meta["feature_spread"]["median"] == pytest.approx(np.median(distances))


@pytest.mark.parametrize("k", [1, 3, 8])
def test_a_query_returns_what_ranking_every_skill_by_guarded_distance_gives(tmp_path, k):
    """With the guard's unit shrunk a hundredfold, nearly every pair is "of another kind", so the
    nearest skills by learned distance are not the answer and the search must fetch deeper."""
    strict = _with_meta(shipped, feature_spread={"version": FeatureEncoder.version, "median": 0.01})
    bodies = _robots() + list(SMALL.bodies[:24])
    with knowledge.open(tmp_path / "site.db", knowledge.Identity.generate()) as kb:
        ids = [
            kb.skills.publish(f"skill-{i}", "reach", embodiments=[body.to_dict()]).id
            for i, body in enumerate(bodies)
        ]
        for query in (bodies[0], bodies[3], SMALL.bodies[30]):  # an arm, a quadruped, an arm
            vector, ood = strict.assess(query)
            assert ood is not None and ood <= 1.0, "the query must be in distribution"
            learned = np.linalg.norm(strict.encode_many(bodies) - vector, axis=1)
            features = FeatureEncoder().encode_many(bodies)
            apart = np.linalg.norm(features - FeatureEncoder().encode(query), axis=1)
            ranks = strict.guarded(learned, apart)
            expected = [ids[i] for i in np.argsort(ranks, kind="stable")[:k]]
            results = kb.skills.query(query, k=k, active_only=False, encoder=strict)
            assert [r.skill.id for r in results] == expected
            assert np.allclose([r.distance for r in results], np.sort(ranks)[:k], rtol=1e-4)
            assert all(r.ranked_by == strict.name for r in results)
            unguarded = [ids[i] for i in np.argsort(learned, kind="stable")[:k]]
            if k == 8:
                assert expected != unguarded, "the guard must matter for this test to mean much"


@pytest.mark.parametrize("n", [0, 1, 5, 300])
def test_pairwise_distances_by_blocks_are_the_distances(n):
    """The spreads' distances, computed a block of rows at a time (loading the shipped weights
    held 3.2 GB of differences at once), equal all differences at once, bit for bit."""
    vectors = np.random.default_rng(n).normal(size=(n, 17))
    whole = np.linalg.norm(vectors[:, None] - vectors[None], axis=2) if n else np.zeros((0, 0))
    assert np.array_equal(_learned._distances(vectors, rows=128), whole)

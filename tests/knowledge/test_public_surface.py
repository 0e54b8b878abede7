"""The public surface of `knowledge` and `knowledge.embodiment`, pinned: a change is deliberate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import knowledge
import knowledge.embodiment

ROOT = Path(__file__).parents[2]

KNOWLEDGE = [
    *("Activation", "ActivationPolicy", "Actuator", "BlobError", "Blobs", "Body", "BodyScore"),
    *("CanonicalJSONError", "Certificate", "CertificateSummary", "Certificates"),
    *("ClockSkewError", "Counters", "Counts", "EmbeddingSpace", "Embodiment", "EmbodimentError"),
    *("EmbodimentSite", "Encoder", "EncoderReport", "EncoderWeightsError", "Envelope"),
    *("EnvelopeError", "FeatureEncoder", "Head", "Hit", "HybridClock", "Identity"),
    *("IdentityError", "IngestReport", "Joint", "Kind", "KnowledgeBase", "LearnedEncoder"),
    *("Limits", "Maps", "NotAuthorizedError", "Observation", "PolicyError", "QueryResult"),
    *("RecordError", "RecordIssue", "Rejection", "Role", "SPRT", "Selection", "SemanticMap"),
    *("Sensor", "SimnetError", "Skill", "SkillIndex", "Skills", "StoreError", "StoreLockedError"),
    *("Transfer", "TransferDataError", "TransferDataset", "TrustPolicy", "TrustedRoot"),
    *("UnknownSkillError", "betainc", "binom_sf", "canonical_json", "clopper_pearson_interval"),
    *("clopper_pearson_lower", "content_hash", "evaluate_encoder", "fixed_sample_size"),
    *("key_id", "mcnemar_p", "normal_quantile", "open", "parse_public_key", "sha256_hex"),
    *("train_encoder", "wilson_lower_bound"),
]
EMBODIMENT = [
    *("Actuator", "Body", "BodyScore", "EmbeddingSpace", "Embodiment", "EmbodimentSite"),
    *("Encoder", "EncoderReport", "EncoderWeightsError", "FeatureEncoder", "Hit", "Joint"),
    *("LearnedEncoder", "Selection", "Sensor", "SkillIndex", "Transfer", "TransferDataError"),
    *("TransferDataset", "evaluate_encoder", "recall_at_k", "train_encoder"),
]


def test_knowledge_exports_exactly_these_names_sorted():
    assert knowledge.__all__ == sorted(knowledge.__all__) == KNOWLEDGE
    assert set(KNOWLEDGE) <= set(dir(knowledge))
    assert all(getattr(knowledge, name) is not None for name in KNOWLEDGE)


def test_embodiment_exports_exactly_these_names_sorted():
    module = knowledge.embodiment
    assert module.__all__ == sorted(module.__all__) == EMBODIMENT
    assert set(EMBODIMENT) <= set(dir(module))
    assert all(getattr(module, name) is not None for name in EMBODIMENT)


def test_the_embodiment_names_of_knowledge_are_the_sub_packages():
    for name in set(KNOWLEDGE) & set(EMBODIMENT):
        assert getattr(knowledge, name) is getattr(knowledge.embodiment, name)


def test_import_knowledge_loads_no_simulator_index_or_torch():
    code = (
        "import sys, knowledge; "
        "print(sorted(m for m in ('mujoco', 'faiss', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"

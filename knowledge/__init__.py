"""simnet's replicated knowledge base: signed per-writer CRDT feeds, typed views, a durable store.

import knowledge
kb = knowledge.open("site.db", knowledge.Identity.generate())
skill = kb.skills.publish("pick-mug", "pick", embodiments=[knowledge.Embodiment.from_mjcf("arm.xml").to_dict()])
kb.skills.query("new_arm.urdf", task="pick", k=5)
kb.maps["floor1"].observe((12, 7), {"label": "shelf"}, confidence=0.8)
kb.counters.record(skill.id, success=True)
other.ingest(kb.envelopes_since(other.heads()))
"""

from ._clock import HybridClock
from ._collections import Blobs, Certificates, Counters, Maps, SemanticMap, Skills
from ._embodiment import Actuator, Body, Embodiment, Joint, Sensor, Site
from ._encoders import EmbeddingSpace, Encoder, FeatureEncoder
from ._envelope import Envelope, Kind
from ._errors import (
    BlobError,
    ClockSkewError,
    EmbodimentError,
    EnvelopeError,
    IdentityError,
    NotAuthorizedError,
    PolicyError,
    RecordError,
    SimnetError,
    StoreError,
    StoreLockedError,
    UnknownSkillError,
)
from ._home import SiteHome
from ._identity import Identity, key_id, parse_public_key
from ._index import Hit, Selection, SkillIndex
from ._kb import KnowledgeBase, Limits, open
from ._models import (
    Activation,
    Certificate,
    CertificateSummary,
    Counts,
    Head,
    IngestReport,
    Observation,
    QueryResult,
    RecordIssue,
    Rejection,
    Skill,
)
from ._policy import ActivationPolicy, TrustedRoot, TrustPolicy, wilson_lower_bound
from ._records import Role
from ._transfer import (
    BodyScore,
    EncoderReport,
    Transfer,
    TransferDataError,
    TransferDataset,
    evaluate_encoder,
)

_LEARNED = ("EncoderWeightsError", "LearnedEncoder", "train_encoder")


def __getattr__(name: str) -> object:
    """The learned encoder needs torch: it is imported on first use, so `import knowledge` stays light."""
    if name in _LEARNED:
        from . import _learned

        return getattr(_learned, name)
    raise AttributeError(f"module 'knowledge' has no attribute {name!r}")


__all__ = [
    "Activation",
    "ActivationPolicy",
    "Actuator",
    "BlobError",
    "Blobs",
    "Body",
    "Certificate",
    "CertificateSummary",
    "Certificates",
    "ClockSkewError",
    "Counters",
    "Counts",
    "EmbeddingSpace",
    "Embodiment",
    "EmbodimentError",
    "Encoder",
    "Envelope",
    "EnvelopeError",
    "FeatureEncoder",
    "Head",
    "Hit",
    "HybridClock",
    "Identity",
    "IdentityError",
    "IngestReport",
    "Joint",
    "Kind",
    "KnowledgeBase",
    "Limits",
    "Maps",
    "NotAuthorizedError",
    "Observation",
    "PolicyError",
    "QueryResult",
    "RecordError",
    "RecordIssue",
    "Rejection",
    "Role",
    "Selection",
    "SemanticMap",
    "Sensor",
    "SimnetError",
    "SiteHome",
    "Site",
    "Skill",
    "SkillIndex",
    "Skills",
    "StoreError",
    "StoreLockedError",
    "TrustPolicy",
    "TrustedRoot",
    "UnknownSkillError",
    "key_id",
    "open",
    "parse_public_key",
    "wilson_lower_bound",
    "BodyScore",
    "EncoderReport",
    "Transfer",
    "TransferDataError",
    "TransferDataset",
    "evaluate_encoder",
    *_LEARNED,
]

"""simnet's replicated knowledge base: signed per-writer CRDT feeds, typed views, a durable store.

    import knowledge
    kb = knowledge.open("site.db", knowledge.Identity.generate())
    skill = kb.skills.publish("pick-mug", "pick", description="...")
    kb.maps["floor1"].observe((12, 7), {"label": "shelf"}, confidence=0.8)
    kb.counters.record(skill.id, success=True)
    other.ingest(kb.envelopes_since(other.heads()))
"""

from ._clock import HybridClock
from ._collections import Blobs, Certificates, Counters, Maps, SemanticMap, Skills
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
from ._identity import Identity, key_id, parse_public_key
from ._kb import KnowledgeBase, Limits, open
from ._models import (
    Activation,
    Certificate,
    Counts,
    Head,
    IngestReport,
    Observation,
    RecordIssue,
    Rejection,
    Skill,
)
from ._policy import ActivationPolicy, TrustedRoot, TrustPolicy, wilson_lower_bound
from ._records import Role

__all__ = [
    "Activation", "ActivationPolicy", "BlobError", "Blobs", "Certificate", "Certificates", "ClockSkewError",
    "Counters", "Counts", "EmbodimentError", "Envelope", "EnvelopeError", "Head", "HybridClock", "Identity",
    "IdentityError", "IngestReport", "Kind", "KnowledgeBase", "Limits", "Maps", "NotAuthorizedError",
    "Observation", "PolicyError", "RecordError", "RecordIssue", "Rejection", "Role", "SemanticMap",
    "SimnetError", "Skill", "Skills", "StoreError", "StoreLockedError", "TrustPolicy", "TrustedRoot",
    "UnknownSkillError", "key_id", "open", "parse_public_key", "wilson_lower_bound",
]

"""simnet's replicated knowledge base: signed per-writer CRDT feeds, typed views, a durable store.

    import knowledge
    kb = knowledge.open("site.db", knowledge.Identity.generate())
    arm = knowledge.Embodiment.from_mjcf("arm.xml")
    skill = kb.skills.publish("pick-mug", "pick", embodiments=[arm.to_dict()])
    kb.skills.query("new_arm.urdf", task="pick", k=5)
    kb.maps["floor1"].observe((12, 7), {"label": "shelf"}, confidence=0.8)
    kb.counters.record(skill.id, success=True)
    other.ingest(kb.envelopes_since(other.heads()))

Validation lives beside them: `kb.tasks` (task definitions as records), `kb.certificates` (signed
evaluations, their spot checks and disputes), `kb.outcomes` and `kb.ledger` (what skills did in the
field, scored against their certificates), all judged by the site's `TrustPolicy`.

The embodiment side (robot descriptors, encoders, the skill index: `knowledge.embodiment`) needs
MuJoCo, FAISS and, to train the learned encoder, torch (using it needs numpy only). `import
knowledge` loads none of them: the names below that come from it import it on first use, and so
does the first `kb.skills.query`.
"""

from typing import TYPE_CHECKING

from ._blobs import BlobSource, IncomingBlob
from ._canonical import canonical_json, content_hash, sha256_hex
from ._certificates import Certificates, Tasks
from ._clock import HybridClock
from ._collections import Blobs, Counters, Skills
from ._envelope import Envelope, Kind
from ._errors import (
    BlobError,
    BlobQuotaError,
    CanonicalJSONError,
    ClockSkewError,
    EmbodimentError,
    EnvelopeError,
    IdentityError,
    NotAuthorizedError,
    PolicyError,
    RecordError,
    SimnetError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreReadOnlyError,
    UnknownSkillError,
    UnknownTaskError,
)
from ._field import FieldOutcomes, FieldTest, LedgerRow, Prediction
from ._home import SiteHome
from ._identity import Identity, key_id, parse_public_key, verify_signature
from ._kb import KnowledgeBase, open
from ._ledger import Ledger, Outcomes
from ._maps import Maps, SemanticMap
from ._models import (
    Activation,
    Certificate,
    CertificateSummary,
    Counts,
    Head,
    Held,
    IngestReport,
    MapRegion,
    Observation,
    QueryResult,
    RecordIssue,
    Rejection,
    Skill,
    SpotCheck,
)
from ._packages import PackageNotFoundError, package_search_path, resolve_package_uri
from ._policy import ActivationPolicy, TrustedRoot, TrustPolicy
from ._records import Role
from ._replica import Limits
from ._version import __version__ as __version__
from .stats import wilson_lower_bound

if TYPE_CHECKING:
    from .embodiment import (
        Actuator,
        Body,
        BodyScore,
        EmbeddingSpace,
        Embodiment,
        EmbodimentSite,
        Encoder,
        EncoderReport,
        EncoderWeightsError,
        FeatureEncoder,
        Hit,
        Joint,
        LearnedEncoder,
        Selection,
        Sensor,
        SkillIndex,
        Transfer,
        TransferDataError,
        TransferDataset,
        evaluate_encoder,
        train_encoder,
    )

_EMBODIMENT = {
    "Actuator": "._parts",
    "Body": "._parts",
    "BodyScore": "._transfer_data",
    "EmbeddingSpace": "._encoders",
    "Embodiment": "._descriptors",
    "EmbodimentSite": "._parts",
    "Encoder": "._encoders",
    "EncoderReport": "._transfer_data",
    "EncoderWeightsError": "._learned",
    "FeatureEncoder": "._encoders",
    "Hit": "._index",
    "Joint": "._parts",
    "LearnedEncoder": "._learned",
    "Selection": "._index",
    "Sensor": "._parts",
    "SkillIndex": "._index",
    "Transfer": "._transfer_data",
    "TransferDataError": "._transfer_data",
    "TransferDataset": "._transfer_data",
    "evaluate_encoder": "._transfer_data",
    "train_encoder": "._training",
}
"""Names from `knowledge.embodiment`, by the module that defines them: imported on first use."""


def _import_on_first_use(name: str) -> object:
    """A name of the embodiment side: import its module now (MuJoCo, FAISS; torch for training)."""
    module = _EMBODIMENT.get(name)
    if module is None:
        raise AttributeError(f"module 'knowledge' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, "knowledge.embodiment"), name)
    globals()[name] = value  # later lookups find it without coming here
    return value


if not TYPE_CHECKING:  # type checkers see the names imported above, and no others
    __getattr__ = _import_on_first_use


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Activation",
    "ActivationPolicy",
    "Actuator",
    "BlobError",
    "BlobQuotaError",
    "BlobSource",
    "Blobs",
    "Body",
    "BodyScore",
    "CanonicalJSONError",
    "Certificate",
    "CertificateSummary",
    "Certificates",
    "ClockSkewError",
    "Counters",
    "Counts",
    "EmbeddingSpace",
    "Embodiment",
    "EmbodimentError",
    "EmbodimentSite",
    "Encoder",
    "EncoderReport",
    "EncoderWeightsError",
    "Envelope",
    "EnvelopeError",
    "FeatureEncoder",
    "FieldOutcomes",
    "FieldTest",
    "Head",
    "Held",
    "Hit",
    "HybridClock",
    "Identity",
    "IdentityError",
    "IncomingBlob",
    "IngestReport",
    "Joint",
    "Kind",
    "KnowledgeBase",
    "LearnedEncoder",
    "Ledger",
    "LedgerRow",
    "Limits",
    "MapRegion",
    "Maps",
    "NotAuthorizedError",
    "Observation",
    "Outcomes",
    "PackageNotFoundError",
    "PolicyError",
    "Prediction",
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
    "Skill",
    "SkillIndex",
    "Skills",
    "SpotCheck",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "StoreReadOnlyError",
    "Tasks",
    "Transfer",
    "TransferDataError",
    "TransferDataset",
    "TrustPolicy",
    "TrustedRoot",
    "UnknownSkillError",
    "UnknownTaskError",
    "canonical_json",
    "content_hash",
    "evaluate_encoder",
    "key_id",
    "open",
    "package_search_path",
    "parse_public_key",
    "resolve_package_uri",
    "sha256_hex",
    "train_encoder",
    "verify_signature",
    "wilson_lower_bound",
]

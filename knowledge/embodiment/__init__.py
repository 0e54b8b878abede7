"""Robot bodies as descriptors, the encoders that embed them, and the index that finds skills by
body.

    from knowledge.embodiment import Embodiment, FeatureEncoder
    arm = Embodiment.from_mjcf("arm.xml")
    vector = FeatureEncoder().encode(arm)

Importing this package loads MuJoCo and FAISS; `import knowledge` does not, and its names for these
(`knowledge.Embodiment`, ...) import this package on first use. The learned encoder needs torch: its
names import it on first use too.
"""

from ._descriptors import Embodiment
from ._encoders import EmbeddingSpace, Encoder, FeatureEncoder
from ._index import Hit, Selection, SkillIndex, recall_at_k
from ._parts import Actuator, Body, EmbodimentSite, Joint, Sensor
from ._transfer_data import (
    BodyScore,
    EncoderReport,
    Transfer,
    TransferDataError,
    TransferDataset,
    evaluate_encoder,
)

_LEARNED = ("EncoderWeightsError", "LearnedEncoder", "train_encoder")


def __getattr__(name: str) -> object:
    """The learned encoder's names: torch is imported on their first use."""
    if name in _LEARNED:
        from . import _learned

        return getattr(_learned, name)
    raise AttributeError(f"module 'knowledge.embodiment' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Actuator",
    "Body",
    "BodyScore",
    "EmbeddingSpace",
    "Embodiment",
    "EmbodimentSite",
    "Encoder",
    "EncoderReport",
    "EncoderWeightsError",
    "FeatureEncoder",
    "Hit",
    "Joint",
    "LearnedEncoder",
    "Selection",
    "Sensor",
    "SkillIndex",
    "Transfer",
    "TransferDataError",
    "TransferDataset",
    "evaluate_encoder",
    "recall_at_k",
    "train_encoder",
]

"""Robot bodies as descriptors, the encoders that embed them, and the index that finds skills by
body.

    from knowledge.embodiment import Embodiment, FeatureEncoder
    arm = Embodiment.from_mjcf("arm.xml")
    vector = FeatureEncoder().encode(arm)

Importing this package loads MuJoCo and FAISS; `import knowledge` does not, and its names for these
(`knowledge.Embodiment`, ...) import this package on first use. The learned encoder runs on numpy;
only training it (`train_encoder`) needs torch, imported on its first use.
"""

from typing import TYPE_CHECKING

from ._descriptors import Embodiment
from ._encoders import EmbeddingSpace, Encoder, FeatureEncoder
from ._index import Hit, SkillIndex, recall_at_k
from ._parts import Actuator, Body, EmbodimentSite, Joint, Sensor
from ._selection import Selection
from ._transfer_data import (
    BodyScore,
    EncoderReport,
    Transfer,
    TransferDataError,
    TransferDataset,
    evaluate_encoder,
)

if TYPE_CHECKING:  # what `__getattr__` imports on first use, as type checkers should see it
    from ._learned import EncoderWeightsError, LearnedEncoder
    from ._training import train_encoder

_LEARNED = {
    "EncoderWeightsError": "._learned",
    "LearnedEncoder": "._learned",
    "train_encoder": "._training",
}


def _import_on_first_use(name: str) -> object:
    """The learned encoder's names, imported on first use (torch with `train_encoder` only)."""
    module = _LEARNED.get(name)
    if module is not None:
        from importlib import import_module

        return getattr(import_module(module, __name__), name)
    raise AttributeError(f"module 'knowledge.embodiment' has no attribute {name!r}")


if not TYPE_CHECKING:  # type checkers see the names imported above, and no others
    __getattr__ = _import_on_first_use


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

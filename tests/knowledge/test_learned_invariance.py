"""What the learned encoder's training groups: with `train_encoder(classes=...)`, bodies of one
class lie together."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from knowledge import TransferDataset, train_encoder

ASSETS = Path(__file__).parent.parent / "assets"
SMALL = TransferDataset.load(ASSETS / "transfer_small.json.gz")


def _spread(data: TransferDataset, labelled: list[str], **options) -> float:
    """Mean distance between bodies of one class over the mean between bodies of two."""
    vectors = train_encoder(data, epochs=40, **options).encode_many(data.bodies)[:, :-1]
    distance = np.linalg.norm(vectors[:, None] - vectors[None], axis=2)
    labels = np.array(labelled)
    same = (labels[:, None] == labels[None]) & ~np.eye(len(labels), dtype=bool)
    return float(distance[same].mean() / distance[labels[:, None] != labels[None]].mean())


def test_classes_pull_bodies_of_one_class_together():
    """Classes no transfer tells apart (arms split by how many joints they have) come out
    grouped when training is given them."""
    data = SMALL.subset(list(range(20)))
    classes = [f"{len(b.actuators) > 5}" for b in data.bodies]
    assert len(set(classes)) == 2
    assert _spread(data, classes, classes=classes, contrast=2.0) < 0.9 * _spread(data, classes)


def test_classes_must_name_every_body():
    data = SMALL.subset(list(range(6)))
    with pytest.raises(ValueError, match="classes: 2 given for 6 bodies"):
        train_encoder(data, epochs=1, classes=["a", "b"])

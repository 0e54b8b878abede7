"""How far a body lies from what a learned encoder was trained on: its out-of-distribution score.

A network maps anything to some vector, and off its training population it may map very different
bodies to nearly one point (the first learned encoder put an arm and three quadrupeds 0.002 apart).
So a learned encoder keeps a small reference of its training population and measures a new body
against it three ways, each as the distance to the nearest reference:

- joints: the mean, over the body's joint tokens (standardized as the network sees them), of the
  distance to the nearest joint token in a sample of the training bodies' tokens: joints unlike any
  it learned (a fish's fins, a fly's 100 legs joints, a gripper's fingers on their own);
- body: the body token (mass, reach, dof, end effectors, ...) to the nearest training body's;
- vector: the body's embedding to the nearest training body's embedding.

Each is divided by its threshold: the 99th percentile of the same distance for each training body
measured against the others (leave one out), which is what a new body drawn from the training
population would show. The score is the largest of the three ratios; above 1 the body is out of
distribution, and a query with it falls back to the feature encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREFIX = "ood."
"""Weights-file tensors under this prefix are the reference (not part of the network)."""
BANK = 512
"""Joint tokens kept from the training bodies."""
QUANTILE = 0.99
"""Share of training bodies (left out in turn) below each threshold."""
COMPONENTS = ("joints", "body", "vector")


@dataclass(frozen=True)
class Reference:
    """A training population as the score needs it: standardized joint tokens (a sample), body
    tokens and embeddings of every body, and one threshold per component."""

    tokens: np.ndarray
    bodies: np.ndarray
    vectors: np.ndarray
    thresholds: np.ndarray

    def tensors(self) -> dict[str, np.ndarray]:
        return {PREFIX + k: getattr(self, k) for k in ("tokens", "bodies", "vectors", "thresholds")}

    @classmethod
    def from_tensors(
        cls, tensors: dict[str, np.ndarray], joint_features: int, body_features: int, dim: int
    ) -> Reference | None:
        """The reference in a weights file's tensors; None if it has none; ValueError if it is
        malformed."""
        names = {PREFIX + k for k in ("tokens", "bodies", "vectors", "thresholds")}
        present = names & tensors.keys()
        if not present:
            return None
        if present != names:
            raise ValueError(f"out-of-distribution reference lacks {sorted(names - present)}")
        ref = cls(*(tensors[PREFIX + k] for k in ("tokens", "bodies", "vectors", "thresholds")))
        shapes_ok = (
            ref.tokens.ndim == 2
            and ref.tokens.shape[1] == joint_features
            and len(ref.tokens) > 0
            and ref.bodies.ndim == 2
            and ref.bodies.shape[1] == body_features
            and ref.vectors.shape == (len(ref.bodies), dim)
            and len(ref.bodies) > 1
            and ref.thresholds.shape == (len(COMPONENTS),)
        )
        if not shapes_ok:
            raise ValueError(
                "out-of-distribution reference has shapes "
                f"{[tensors[n].shape for n in sorted(names)]}"
            )
        if not (ref.thresholds > 0).all():
            raise ValueError(f"out-of-distribution thresholds must be > 0, got {ref.thresholds}")
        return ref


def components(
    joints: np.ndarray,
    mask: np.ndarray,
    body: np.ndarray,
    vectors: np.ndarray,
    tokens: np.ndarray,
    bodies: np.ndarray,
    references: np.ndarray,
    owners: np.ndarray | None = None,
    groups: np.ndarray | None = None,
) -> np.ndarray:
    """(B, 3) distances of each body to the nearest reference: joints (mean over its tokens, per
    feature), body token (per feature), vector. Inputs are standardized tokens (B, T, F) with
    their padding mask, body tokens (B, G) and vectors (B, D). With `owners` (the body index of
    each reference token) and `groups` (a group per body: one robot's descriptions), body i is
    measured without its group's tokens, bodies and vectors: leave one out, for calibration."""
    out = np.zeros((len(body), len(COMPONENTS)))
    for i in range(len(body)):
        own = joints[i][~mask[i]]
        keep_tokens, others = tokens, np.ones(len(bodies), bool)
        if owners is not None and groups is not None:
            others = groups != groups[i]
            keep_tokens = tokens[others[owners]]
        if len(own):
            nearest = _nearest(own, keep_tokens)
            out[i, 0] = float(nearest.mean()) / np.sqrt(joints.shape[-1])
        out[i, 1] = float(_nearest(body[i : i + 1], bodies[others])[0]) / np.sqrt(body.shape[-1])
        out[i, 2] = float(_nearest(vectors[i : i + 1], references[others])[0])
    return out


def _nearest(points: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """Euclidean distance from each point to its nearest row of `bank`."""
    squared = (points**2).sum(1)[:, None] + (bank**2).sum(1)[None, :] - 2 * points @ bank.T
    return np.sqrt(np.maximum(squared.min(1), 0.0))


def build(
    joints: np.ndarray,
    mask: np.ndarray,
    body: np.ndarray,
    vectors: np.ndarray,
    groups: np.ndarray,
    seed: int = 0,
) -> Reference:
    """The reference of a training population (standardized tokens, mask, body tokens, vectors):
    a seeded sample of `BANK` joint tokens, every body token and vector, and thresholds calibrated
    leaving out each body with the rest of its group (`groups`: one robot's descriptions)."""
    owners = np.repeat(np.arange(len(body)), (~mask).sum(1))
    tokens = joints[~mask]
    if len(tokens) > BANK:
        keep = np.sort(np.random.default_rng(seed).choice(len(tokens), BANK, replace=False))
        tokens, owners = tokens[keep], owners[keep]
    scores = components(joints, mask, body, vectors, tokens, body, vectors, owners, groups)
    thresholds = np.quantile(scores, QUANTILE, axis=0)
    return Reference(
        tokens.astype(np.float32),
        body.astype(np.float32),
        vectors.astype(np.float32),
        np.maximum(thresholds, 1e-6).astype(np.float32),
    )


def score(distances: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """(B,) out-of-distribution scores: the largest distance over its threshold (above 1: out)."""
    return (distances / thresholds).max(1)

"""Query latency of the skill index's filtered search against raw FAISS search, and its recall.

Skills are scoped to perturbed variants of real bodies (the project's test robots and gymnasium's
MuJoCo models: masses, link lengths, ranges, gains and damping scaled, sensors dropped), encoded by
the default feature encoder; each skill adds a little jitter to its scope's vector. Queries are
other, unseen variants. The library path is `SkillIndex.search(query, 10, allowed=selection)` with a
standing selection for "active skills of one task family" (about a quarter of the skills); the
baseline is an unfiltered single-query FAISS search on the same vectors in the same structure (a
plain flat index when the library is exact, the library's own trained IVF otherwise), timed
interleaved with the library (which of the two goes first alternates, since the second finds the
first's lists in cache), both on one thread. Recall@10 is measured against exact search over the
allowed skills (tie-aware).

Prints one JSON line. Top-level figures are for the largest size run (1,000,000 skills, or 100,000
with --quick); "runs" holds the figures of every size.

    python benchmarks/retrieval.py [--quick] [--queries N] [--variants N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import faiss
import gymnasium
import numpy as np

from knowledge import EmbodimentError
from knowledge.embodiment import Embodiment, FeatureEncoder, SkillIndex, recall_at_k

ROOT = Path(__file__).resolve().parent.parent
ROBOTS = ROOT / "tests" / "assets" / "robots"
GYM = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"


def bodies() -> list[Embodiment]:
    found = [Embodiment.from_mjcf(p) for p in sorted(GYM.glob("*.xml"))]
    found += [
        Embodiment.from_mjcf(p) for p in sorted(ROBOTS.glob("*.xml")) if "defaults" not in p.name
    ]
    return found + [_urdf(p) for p in sorted(ROBOTS.glob("*.urdf"))]


def _urdf(path: Path) -> Embodiment:
    """A test URDF as its readers' defaults describe it, or with its inertias balanced where MuJoCo
    refuses them (as the refusal suggests: one test robot has such inertias on purpose)."""
    try:
        return Embodiment.from_urdf(path)
    except EmbodimentError as exc:
        if "balance_inertia" not in str(exc):
            raise
        return Embodiment.from_urdf(path, balance_inertia=True)


def variant(e: Embodiment, rng: np.random.Generator) -> Embodiment:
    """The same structure at another size and with other dynamics, as a fleet's many models are."""
    size = rng.lognormal(0, 0.4)

    def jitter(sigma: float = 0.2) -> float:
        return float(rng.lognormal(0, sigma))

    body_parts = [
        dataclasses.replace(
            b,
            pos=tuple(p * size * jitter(0.1) for p in b.pos),
            mass=b.mass * size**3 * jitter(),
            extent=b.extent * size,
        )
        for b in e.bodies
    ]
    joints = [
        dataclasses.replace(
            j,
            damping=j.damping * jitter(0.5),
            armature=j.armature * jitter(0.5),
            range=None if j.range is None else (j.range[0] * (f := jitter()), j.range[1] * f),
        )
        for j in e.joints
    ]
    actuators = [
        dataclasses.replace(
            a,
            gear=(a.gear[0] * (g := size**3 * jitter()), *a.gear[1:]),
            force_range=None
            if a.force_range is None
            else (a.force_range[0] * g, a.force_range[1] * g),
        )
        for a in e.actuators
    ]
    sensors = [s for s in e.sensors if rng.random() > 0.2]
    return Embodiment(
        e.name, tuple(body_parts), tuple(joints), tuple(actuators), e.sites, tuple(sensors)
    )


def workload(
    skills: int, variants: int, queries: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Skill vectors, their task family (0-3) and active flag folded into one int, and query
    vectors."""
    rng = np.random.default_rng(seed)
    base = bodies()
    encoder = FeatureEncoder()
    scopes = encoder.encode_many(
        variant(base[i], rng) for i in rng.integers(len(base), size=variants)
    )
    asked = encoder.encode_many(
        variant(base[i], rng) for i in rng.integers(len(base), size=queries)
    )
    jitter = rng.normal(0, 0.02, (skills, encoder.dim)).astype(np.float32)
    vectors = scopes[rng.integers(variants, size=skills)] + jitter
    labels = rng.integers(4, size=skills) * 2 + (rng.random(skills) < 0.9)  # task family, active
    return np.ascontiguousarray(vectors, np.float32), labels, asked


def percentile_ms(samples: list[float], q: float) -> float:
    return round(float(np.percentile(samples, q)) * 1e3, 4)


def run(
    skills: int, variants: int, queries: int, approximate_above: int | None
) -> dict[str, object]:
    vectors, labels, asked = workload(skills, variants, queries, seed=skills)
    ids = [f"skill-{i}" for i in range(skills)]
    encoder = FeatureEncoder()
    faiss.omp_set_num_threads(2)  # building may use both cores; searching below uses one
    started = time.perf_counter()
    index = SkillIndex(
        encoder.space,
        **({} if approximate_above is None else {"approximate_above": approximate_above}),
    )
    index.add(ids, vectors)
    build_s = time.perf_counter() - started
    allowed_mask = labels == 1  # task family 0, active
    selection = index.select(ids[i] for i in np.flatnonzero(allowed_mask))
    if index.kind == "exact":
        raw = faiss.IndexFlatL2(encoder.dim)
        raw.add(vectors)
    else:
        raw = index._faiss  # the library's trained IVF, searched directly
    faiss.omp_set_num_threads(1)
    library_s, raw_s, found = [], [], []
    warmup = min(50, queries)
    for i, query in enumerate(np.concatenate([asked[:warmup], asked])):
        # the second search of a query finds the lists the first one read still in cache: alternate
        for path in ("library", "raw") if i % 2 else ("raw", "library"):
            start = time.perf_counter()
            if path == "library":
                hits = index.search(query, 10, allowed=selection)
            else:
                raw.search(query[None, :], 10)
            elapsed = time.perf_counter() - start
            if i >= warmup:
                (library_s if path == "library" else raw_s).append(elapsed)
        if i >= warmup:
            found.append([h.distance**2 for h in hits] + [np.inf] * (10 - len(hits)))
    faiss.omp_set_num_threads(2)
    truth, _ = faiss.knn(asked, vectors[allowed_mask], 10)
    p50, raw_p50 = percentile_ms(library_s, 50), percentile_ms(raw_s, 50)
    return {
        "skills": skills,
        "index": index.kind,
        "nprobe": index._nprobe,
        "dim": encoder.dim,
        "filter_fraction": round(float(allowed_mask.mean()), 4),
        "build_s": round(build_s, 2),
        "p50_ms": p50,
        "p99_ms": percentile_ms(library_s, 99),
        "raw_faiss_p50_ms": raw_p50,
        "raw_faiss_p99_ms": percentile_ms(raw_s, 99),
        "ratio_to_raw": round(p50 / raw_p50, 3),
        "recall_at_10": round(recall_at_k(np.array(found, np.float32), truth, "l2"), 4),
        "calibrated_recall_at_10": round(index.recall, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 skills only")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument(
        "--variants", type=int, default=20_000, help="distinct bodies that skills are scoped to"
    )
    parser.add_argument(
        "--approximate-above",
        type=int,
        default=None,
        help="override the index's exact/IVF threshold",
    )
    args = parser.parse_args()
    sizes = [100_000] if args.quick else [100_000, 1_000_000]
    runs = [run(n, args.variants, args.queries, args.approximate_above) for n in sizes]
    print(json.dumps({"benchmark": "retrieval", **runs[-1], "runs": runs}))


if __name__ == "__main__":
    main()

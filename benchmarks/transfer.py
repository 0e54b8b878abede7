"""Does distance predict transfer? The learned encoder against the feature encoder, on held-out
bodies.

    python benchmarks/transfer.py [--quick] [--dataset FILE ...] [--save FILE] [--workers N]
                                  [--plot FILE]

1. A transfer dataset: procedural arms and legged bodies plus the shipped arm and walker; every
   body's native skill evaluated on every body of its kind (`sim.transfer.transfer_dataset`, 16
   branches per cell), or dataset files made the same way (`simnet encoder dataset`; several are
   merged, as `simnet encoder train` merges them: the first is "the population" below).
2. A quarter of the bodies are held out (`TransferDataset.split(0.25, seed=0, by="name")`, by a
   hash of the body's name, which no change to the readers moves): the learned encoder is trained
   from scratch on the transfers among the other bodies only, with the class term (each body's
   class from `sim.transfer.body_classes`; `class_term` false for files that do not record them):
   the shipped recipe.
3. For every held-out body and its task family: Spearman correlation between -distance and the
   measured success of every other body's skill on it, and recall@5 of the skills that succeed in at
   least 80% of branches; means over held-out bodies, for the learned encoder and for the feature
   encoder (the baseline), overall and per task family. With several files, also on the first
   file's held-out bodies measured among its own bodies only ("population_": the figures a run on
   that file alone reports, for the encoder trained on all), and on the held-out bodies the other
   files add ("added_"). `heldout_ood` is the share of held-out bodies the learned encoder calls
   out of distribution (it should rarely: they are drawn like its training bodies), and
   `heldout_trained_by_shipped` how many of them the shipped weights trained on (their meta's
   `trained_names`; 0 when the shipped weights come from this split, as `build_encoder` makes them).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

import sim
import sim.transfer
from knowledge import (
    EncoderReport,
    FeatureEncoder,
    LearnedEncoder,
    TransferDataset,
    evaluate_encoder,
    train_encoder,
)
from knowledge.embodiment._cli import _panel
from knowledge.embodiment._plot import scatter_png


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smaller population (24 arms, 16 legged bodies)"
    )
    parser.add_argument(
        "--dataset",
        action="append",
        help="use this dataset file instead of generating one (repeatable: merged)",
    )
    parser.add_argument("--save", help="write the generated dataset here")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for the dataset")
    parser.add_argument(
        "--plot", help="write distance against success on the held-out bodies (PNG)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.dataset:
        files = [TransferDataset.load(f) for f in args.dataset]
    else:
        arms, legged = (24, 16) if args.quick else (64, 40)
        files = [
            sim.transfer.transfer_dataset(
                sim.transfer.robot_population(arms, legged),
                branches=16,
                workers=args.workers,
                progress=False,
            )
        ]
        if args.save:
            files[0].save(args.save)
    data = files[0] if len(files) == 1 else merged(files)
    generated = time.perf_counter() - start
    train, held = data.split(0.25, seed=0, by="name")
    start = time.perf_counter()
    training = data.subset(train)
    known = sim.transfer.body_classes(files)  # files the simulator made record each robot's
    classes = [known[n] for n in training.names] if set(training.names) <= set(known) else None
    learned = train_encoder(training, classes=classes)  # others (certificates) train without it
    trained = time.perf_counter() - start
    line = {
        "benchmark": "transfer",
        "bodies": len(data.bodies),
        "heldout_bodies": len(held),
        "transfers": len(data.transfers),
        "class_term": classes is not None,
    }
    encoders = {"learned": learned, "features": FeatureEncoder()}
    reports = {name: evaluate_encoder(data, enc, held) for name, enc in encoders.items()}
    line |= figures("", reports, data.tasks)
    line["spearman_gain"] = _figure(reports["learned"].spearman - reports["features"].spearman)
    if len(files) > 1:
        first = files[0]
        _, own = first.split(0.25, seed=0, by="name")
        line |= figures(
            "population_",
            {name: evaluate_encoder(first, enc, own) for name, enc in encoders.items()},
            first.tasks,
        )
        known = {b.fingerprint for b in first.bodies}
        added = [i for i in held if data.bodies[i].fingerprint not in known]
        line["added_heldout_bodies"] = len(added)
        line |= figures(
            "added_",
            {name: evaluate_encoder(data, enc, added) for name, enc in encoders.items()},
            data.tasks,
        )
    shipped = LearnedEncoder().meta.get("trained_names")
    seen = set(shipped or ())
    line["heldout_trained_by_shipped"] = (
        None if shipped is None else sum(data.names[i] in seen for i in held)
    )
    scores = learned.ood_many(data.bodies[i] for i in held)
    line["heldout_ood"] = round(float((scores > 1.0).mean()), 4) if scores is not None else None
    line.update(
        dataset_seconds=round(generated, 1),
        train_seconds=round(trained, 1),
        version=learned.version,
    )
    if args.plot:
        scatter_png(
            args.plot,
            [
                _panel(data, enc, reports[name], held)
                for name, enc in (("features", FeatureEncoder()), ("learned", learned))
            ],
            data.tasks,
        )
    print(json.dumps(line, allow_nan=False))


def merged(files: list[TransferDataset]) -> TransferDataset:
    """One dataset of every file's transfers (a pair measured twice adds its trials)."""
    return TransferDataset.from_outcomes(
        (d.bodies[t.source], d.bodies[t.target], t.task, t.successes, t.trials)
        for d in files
        for t in d.transfers
    )


def figures(prefix: str, reports: dict[str, EncoderReport], tasks: tuple[str, ...]) -> dict:
    """Spearman and recall@5 per encoder, overall and per task family, keyed with `prefix`; None
    where nothing was measured (no held-out target of a family with a skill that succeeds)."""
    out = {}
    for task in (None, *tasks):
        for name, report in reports.items():
            part = report
            if task is not None:
                scores = tuple(s for s in report.scores if s.task == task)
                part = EncoderReport(report.encoder, scores, 5, 0.8)
            key = f"{prefix}{task}_" if task else prefix
            out[f"{key}spearman_{name}"] = _figure(part.spearman)
            out[f"{key}recall_at_5_{name}"] = _figure(part.recall_at_k)
    return out


def _figure(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


if __name__ == "__main__":
    main()

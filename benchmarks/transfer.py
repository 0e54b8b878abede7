"""Does distance predict transfer? The learned encoder against the feature encoder, on held-out
bodies.

    python benchmarks/transfer.py [--quick] [--dataset FILE] [--save FILE] [--workers N]
                                  [--plot FILE]

1. A transfer dataset: procedural arms and legged bodies plus the shipped arm and walker; every
   body's native skill evaluated on every body of its kind (`sim.transfer.transfer_dataset`, 16
   branches per cell), or a dataset file made the same way (`simnet encoder dataset`).
2. A quarter of the bodies are held out (`TransferDataset.split(0.25, seed=0)`, by fingerprint
   hash): the learned encoder is trained from scratch on the transfers among the other bodies only.
3. For every held-out body and its task family: Spearman correlation between -distance and the
   measured success of every other body's skill on it, and recall@5 of the skills that succeed in at
   least 80% of branches; means over held-out bodies, for the learned encoder and for the feature
   encoder (the baseline), overall and per task family.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import sim
import sim.transfer
from knowledge import FeatureEncoder, TransferDataset, evaluate_encoder, train_encoder
from knowledge.embodiment._cli import _panel
from knowledge.embodiment._plot import scatter_png


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smaller population (24 arms, 16 legged bodies)"
    )
    parser.add_argument("--dataset", help="use this dataset file instead of generating one")
    parser.add_argument("--save", help="write the generated dataset here")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for the dataset")
    parser.add_argument(
        "--plot", help="write distance against success on the held-out bodies (PNG)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.dataset:
        data = TransferDataset.load(args.dataset)
    else:
        arms, legged = (24, 16) if args.quick else (64, 40)
        data = sim.transfer.transfer_dataset(
            sim.transfer.robot_population(arms, legged),
            branches=16,
            workers=args.workers,
            progress=False,
        )
        if args.save:
            data.save(args.save)
    generated = time.perf_counter() - start
    train, held = data.split(0.25, seed=0)
    start = time.perf_counter()
    learned = train_encoder(data.subset(train))
    trained = time.perf_counter() - start
    reports = {
        "learned": evaluate_encoder(data, learned, held),
        "features": evaluate_encoder(data, FeatureEncoder(), held),
    }
    line = {
        "benchmark": "transfer",
        "bodies": len(data.bodies),
        "heldout_bodies": len(held),
        "transfers": len(data.transfers),
    }
    for name, report in reports.items():
        line[f"spearman_{name}"] = round(report.spearman, 4)
        line[f"recall_at_5_{name}"] = round(report.recall_at_k, 4)
    line["spearman_gain"] = round(line["spearman_learned"] - line["spearman_features"], 4)
    for task in data.tasks:
        for name, report in reports.items():
            part = type(report)(
                report.encoder, tuple(s for s in report.scores if s.task == task), 5, 0.8
            )
            line[f"{task}_spearman_{name}"] = round(part.spearman, 4)
            line[f"{task}_recall_at_5_{name}"] = round(part.recall_at_k, 4)
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
    print(json.dumps(line))


if __name__ == "__main__":
    main()

"""Rebuild the shipped encoder weights (knowledge/assets/transfer-attention.safetensors).

    python -m sim.assets.build_encoder [--dataset FILE] [--workers 2]

Makes the default transfer dataset (as `simnet encoder dataset` does with its defaults) unless given
one, holds out a quarter of the bodies exactly as benchmarks/transfer.py does, and trains on the
rest: the bodies the benchmark reports on are never seen by the shipped weights either.
"""

from __future__ import annotations

import argparse
from importlib import resources

import torch

from knowledge import TransferDataset, train_encoder
from sim.transfer import robot_population, transfer_dataset

WEIGHTS = resources.files("knowledge") / "assets" / "transfer-attention.safetensors"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dataset", help="a dataset file from `simnet encoder dataset` (default: make one)"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = (
        TransferDataset.load(args.dataset)
        if args.dataset
        else transfer_dataset(robot_population(64, 40), branches=16, workers=args.workers)
    )
    train, _ = data.split(0.25, seed=0)
    encoder = train_encoder(
        data.subset(train),
        meta={
            "dataset": "sim.robot_population(64, 40), 16 branches per transfer, seed 0",
            "held_out": (
                "TransferDataset.split(0.25, seed=0): the bodies benchmarks/transfer.py reports on"
            ),
        },
    )
    with resources.as_file(WEIGHTS) as path:
        encoder.save(path)
    print(f"wrote {WEIGHTS}: {encoder!r}")


if __name__ == "__main__":
    main()

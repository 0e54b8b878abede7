"""`simnet encoder ...`: retrain the learned embodiment encoder and judge it against the feature
encoder.

The simulator adds `simnet encoder dataset` (generating a dataset needs MuJoCo rollouts; see
sim.cli). torch is imported only by the commands that need the learned encoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from ._encoders import Encoder, FeatureEncoder
from ._plot import Panel, scatter_png
from ._transfer_data import EncoderReport, TransferDataset, distances, evaluate_encoder


def load_encoder(spec: str) -> Encoder:
    """ "features", "learned" (the shipped weights) or a weights file written by
    `simnet encoder train`."""
    if spec == "features":
        return FeatureEncoder()
    from ._learned import LearnedEncoder

    if spec == "learned":
        return LearnedEncoder()
    if not Path(spec).is_file():
        raise click.BadParameter(
            f"{spec!r} is neither 'features', 'learned' nor a weights file", param_hint="--encoder"
        )
    return LearnedEncoder(spec)


def _dataset(obj: Any, files: tuple[str, ...]) -> TransferDataset:
    """The union of dataset files, or else the certificates of the site's knowledge base."""
    if files:
        loaded = [TransferDataset.load(f) for f in files]
        outcomes = [
            (d.bodies[t.source], d.bodies[t.target], t.task, t.successes, t.trials)
            for d in loaded
            for t in d.transfers
        ]
        robots = [r for d in loaded for r in d.meta.get("robots", ())]
        return (
            loaded[0]
            if len(loaded) == 1
            else TransferDataset.from_outcomes(outcomes, {"source": list(files), "robots": robots})
        )
    with obj.open_readonly() as kb:
        return TransferDataset.from_knowledge_base(kb)


DATASETS = click.option(
    "--dataset",
    "files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help=(
        "A transfer dataset file (repeatable). Without one: the certificates of the site (--home)."
    ),
)
"""Where a command's transfer data comes from: the files given, or the site's certificates."""


@click.command("train")
@DATASETS
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the weights.",
)
@click.option("--epochs", type=click.IntRange(min=1), default=400, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--holdout",
    type=click.FloatRange(0, 0.9),
    default=0.0,
    show_default=True,
    help="Share of bodies kept out of training and reported on.",
)
@click.option(
    "--split-by",
    type=click.Choice(["fingerprint", "name"]),
    default="fingerprint",
    show_default=True,
    help=(
        "Hold bodies out by a hash of their fingerprint, or of their name (stable across reader "
        "versions where names tell robots apart, as a generated population's do)."
    ),
)
@click.option(
    "--classes",
    "use_classes",
    is_flag=True,
    help=(
        "Add the class term: bodies of one class (as the dataset files record it) embed together "
        "(the shipped weights' recipe)."
    ),
)
@click.option(
    "--fine-tune", is_flag=True, help="Start from the shipped weights instead of a fresh network."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def train_command(
    obj: Any,
    files: tuple[str, ...],
    out: str,
    epochs: int,
    seed: int,
    holdout: float,
    split_by: str,
    use_classes: bool,
    fine_tune: bool,
    as_json: bool,
) -> None:
    """Train encoder weights on measured transfers; use them with `skills query --encoder FILE`."""
    from ._learned import LearnedEncoder
    from ._training import train_encoder

    data = _dataset(obj, files)
    try:
        train, heldout = data.split(holdout, seed=seed, by=split_by)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--split-by") from exc
    training = data.subset(train)
    classes = None
    if use_classes:
        known = data.classes
        missing = sorted(set(training.names) - set(known))
        if missing:
            raise click.BadParameter(
                f"the dataset records no class for {len(missing)} bodies ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}): remake it with `simnet encoder dataset`",
                param_hint="--classes",
            )
        classes = [known[name] for name in training.names]
    learned = train_encoder(
        training,
        classes=classes,
        epochs=epochs,
        seed=seed,
        start=LearnedEncoder() if fine_tune else None,
        meta={"source": str(data.meta.get("source", data.meta.get("generator", "")))},
    )
    learned.save(out)
    result: dict[str, Any] = {
        "weights": out,
        "version": learned.version,
        "bodies": len(train),
        "transfers": len(training.transfers),
    }
    if heldout:
        for name, enc in (("learned", learned), ("features", FeatureEncoder())):
            report = evaluate_encoder(data, enc, heldout)
            result[f"spearman_{name}"], result[f"recall_at_5_{name}"] = (
                report.spearman,
                report.recall_at_k,
            )
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(
        f"wrote {out}: {learned!r}, trained on {result['bodies']} bodies, "
        f"{result['transfers']} transfers"
    )
    if heldout:
        click.echo(
            f"held out {len(heldout)} bodies: Spearman learned {result['spearman_learned']:.3f}, "
            f"features {result['spearman_features']:.3f}; "
            f"recall@5 learned {result['recall_at_5_learned']:.3f}, "
            f"features {result['recall_at_5_features']:.3f}"
        )


@click.command("report")
@DATASETS
@click.option(
    "--encoder",
    "specs",
    multiple=True,
    default=("features", "learned"),
    show_default=True,
    help="'features', 'learned' (shipped) or a weights file; repeatable.",
)
@click.option(
    "--body", "bodies", multiple=True, help="Target bodies to report on, by name (default: all)."
)
@click.option(
    "--threshold",
    type=click.FloatRange(0, 1),
    default=0.8,
    show_default=True,
    help="Success rate that counts a skill as working, for recall@5.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, writable=True),
    help="Write distance against success (PNG).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def report_command(
    obj: Any,
    files: tuple[str, ...],
    specs: tuple[str, ...],
    bodies: tuple[str, ...],
    threshold: float,
    plot: str | None,
    as_json: bool,
) -> None:
    """Per target body: Spearman of -distance with measured success, recall@5 of working skills."""
    data = _dataset(obj, files)
    unknown = set(bodies) - set(data.names)
    if unknown:
        raise click.BadParameter(f"not in the dataset: {sorted(unknown)}", param_hint="--body")
    targets = [i for i, name in enumerate(data.names) if name in bodies] if bodies else None
    encoders = [load_encoder(spec) for spec in specs]
    reports = [evaluate_encoder(data, enc, targets, threshold=threshold) for enc in encoders]
    if plot:
        scatter_png(
            plot,
            [_panel(data, enc, rep, targets) for enc, rep in zip(encoders, reports, strict=True)],
            data.tasks,
        )
    if as_json:
        click.echo(json.dumps([r.to_json() for r in reports]))
        return
    for report in reports:
        click.echo(
            f"{report.encoder}: Spearman {report.spearman:.3f}, recall@5 {report.recall_at_k:.3f} "
            f"over {len(report.scores)} bodies"
        )
        for s in report.scores:
            click.echo(
                f"  {s.body[:28]:28} {s.task[:10]:10} Spearman {s.spearman:6.3f}  "
                f"recall@5 {s.recall_at_k:5.2f}"
                f"  ({s.skills} skills)"
            )


def _panel(
    data: TransferDataset, enc: Encoder, report: EncoderReport, targets: list[int] | None
) -> Panel:
    """Every measured transfer onto a target body: its distance in `enc`'s space and its success."""
    table = distances(data, enc)
    wanted = set(range(len(data.bodies)) if targets is None else targets)
    rows = [
        (table[t.source, t.target], t.rate, data.tasks.index(t.task))
        for t in data.transfers
        if t.target in wanted and t.source != t.target
    ]
    x, y, group = (
        (np.array(column) for column in zip(*rows, strict=True)) if rows else (np.zeros(0),) * 3
    )
    return Panel(f"{enc.name} spearman {report.spearman:.2f}", x, y, group)

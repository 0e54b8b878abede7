"""`simnet encoder train/report` and `simnet skills query --encoder`, through the real click
group."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import knowledge
from knowledge import Embodiment, FeatureEncoder, LearnedEncoder, TransferDataset, train_encoder
from knowledge.cli import main

ASSETS = Path(__file__).parent.parent / "assets"
ROBOTS = ASSETS / "robots"
SMALL = str(ASSETS / "transfer_small.json.gz")


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_train_on_a_dataset_file_and_report_on_held_out_bodies(tmp_path):
    weights = tmp_path / "w.safetensors"
    code, out = run(
        "encoder",
        "train",
        "--dataset",
        SMALL,
        "--out",
        str(weights),
        "--epochs",
        "150",
        "--holdout",
        "0.25",
        "--json",
    )
    assert code == 0, out
    summary = json.loads(out)
    encoder = LearnedEncoder(weights)
    assert summary["version"] == encoder.version and summary["bodies"] < 32
    assert summary["spearman_learned"] > summary["spearman_features"]

    plot = tmp_path / "plot.png"
    code, out = run(
        "encoder",
        "report",
        "--dataset",
        SMALL,
        "--encoder",
        "features",
        "--encoder",
        str(weights),
        "--body",
        "arm-3",
        "--body",
        "arm-7",
        "--plot",
        str(plot),
        "--json",
    )
    assert code == 0, out
    reports = json.loads(out)
    assert [r["encoder"] for r in reports] == [
        f"morphology-features {FeatureEncoder.version}",
        f"transfer-attention {encoder.version}",
    ]
    assert {b["body"] for b in reports[1]["bodies"]} == {"arm-3", "arm-7"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    code, out = run("encoder", "report", "--dataset", SMALL)
    assert code == 0 and "transfer-attention" in out and "arm-31" in out
    code, out = run("encoder", "report", "--dataset", SMALL, "--body", "no-such-robot")
    assert code == 2 and "no-such-robot" in out
    code, out = run("encoder", "report", "--dataset", SMALL, "--encoder", "missing.safetensors")
    assert code == 2 and "weights file" in out


def site_with_certificates(home: Path) -> None:
    """A site whose certificates measured skills of four bodies on two others (hand-written
    records)."""
    kb = knowledge.open(home / "site.db", knowledge.Identity.generate())
    sources = [Embodiment.from_urdf(ROBOTS / "arm6.urdf")] + [
        Embodiment.from_mjcf(ROBOTS / name)
        for name in ("gripper.xml", "quadruped.xml", "humanoid_small.xml")
    ]
    scenes = [(ROBOTS / name).read_text() for name in ("arm7.xml", "wheeled_base.xml")]
    for i, (source, successes) in enumerate(zip(sources, (15, 9, 3, 0), strict=True)):
        skill = kb.skills.publish(f"skill-{i}", "reach", embodiments=[source.to_dict()])
        for scene, offset in zip(scenes, (0, 1), strict=True):
            kb.certificates.add(
                skill.id,
                branches=16,
                successes=max(successes - offset, 0),
                randomized=["mass"],
                evaluation={"task": {"definition": {"scene": scene}}},
            )
    kb.close()


def test_train_from_the_certificates_of_a_site(tmp_path):
    site_with_certificates(tmp_path)
    weights = tmp_path / "site-encoder.safetensors"
    code, out = run(
        "--home", str(tmp_path), "encoder", "train", "--out", str(weights), "--epochs", "20"
    )
    assert code == 0, out
    assert "trained on 6 bodies, 8 transfers" in out
    assert LearnedEncoder(weights).meta["epochs"] == 20
    code, out = run(
        "--home",
        str(tmp_path),
        "encoder",
        "train",
        "--out",
        str(weights),
        "--epochs",
        "5",
        "--fine-tune",
        "--json",
    )
    assert code == 0 and json.loads(out)["transfers"] == 8
    code, out = run("--home", str(tmp_path), "encoder", "report", "--json")
    assert (
        code == 0 and len(json.loads(out)[0]["bodies"]) == 2
    )  # the two bodies certificates ran on

    code, out = run(
        "--home",
        str(tmp_path),
        "skills",
        "query",
        "--mjcf",
        str(ROBOTS / "arm7.xml"),
        "--all",
        "--encoder",
        str(weights),
        "--json",
    )
    assert code == 0, out
    rows = json.loads(out)
    assert len(rows) == 4 and rows == sorted(rows, key=lambda r: r["distance"])
    code, out = run(
        "--home",
        str(tmp_path),
        "skills",
        "query",
        "--mjcf",
        str(ROBOTS / "arm7.xml"),
        "--encoder",
        "nonsense",
    )
    assert code == 2 and "'features', 'learned'" in out


def test_training_from_an_empty_site_says_why(tmp_path):
    knowledge.open(tmp_path / "site.db", knowledge.Identity.generate()).close()
    result = CliRunner().invoke(
        main, ["--home", str(tmp_path), "encoder", "train", "--out", str(tmp_path / "w")]
    )
    assert result.exit_code == 1 and "Error: no transfers" in result.output  # one line, no trace


def test_a_query_that_finds_nothing_still_says_how_far_out_the_body_is(tmp_path):
    knowledge.open(tmp_path / "site.db", knowledge.Identity.generate()).close()
    query = ["--home", str(tmp_path), "skills", "query", "--mjcf", str(ROBOTS / "arm7.xml")]
    code, out = run(*query, "--encoder", "learned")
    score = LearnedEncoder().assess(Embodiment.from_mjcf(ROBOTS / "arm7.xml"))[1]
    assert code == 0 and out.splitlines() == [
        "no matching skills",
        f"out-of-distribution score {score:.2f}",
    ]
    assert run(*query, "--encoder", "features") == (0, "no matching skills\n")


def _with_classes(path: Path) -> str:
    """The small dataset with a class recorded for each robot, as `simnet encoder dataset` now
    records them: here every other robot of a kind in a class of its own, so that the class term
    has something to pull together (arms and legged bodies are apart already)."""
    data = TransferDataset.load(SMALL)
    robots = [{**r, "class": f"{r['kind']}-{i % 2}"} for i, r in enumerate(data.meta["robots"])]
    TransferDataset(data.bodies, data.transfers, {**data.meta, "robots": robots}).save(path)
    return str(path)


def test_the_shipped_recipe_from_the_shell_is_the_recipe_in_python(tmp_path):
    """`--split-by name --classes` holds out by name and adds the class term, as
    `sim.assets.build_encoder` does: the same weights, to the byte, as `train_encoder` called on
    the same split with the dataset's recorded classes."""
    dataset = _with_classes(tmp_path / "classes.json.gz")
    weights = tmp_path / "w.safetensors"
    args = ["--holdout", "0.25", "--split-by", "name", "--epochs", "20"]
    code, out = run(
        "encoder",
        "train",
        "--dataset",
        dataset,
        "--out",
        str(weights),
        *args,
        "--classes",
        "--json",
    )
    assert code == 0, out
    data = TransferDataset.load(dataset)
    train, held = data.split(0.25, seed=0, by="name")
    training = data.subset(train)
    same = train_encoder(training, epochs=20, classes=[data.classes[n] for n in training.names])
    assert json.loads(out)["version"] == same.version == LearnedEncoder(weights).version
    assert json.loads(out)["bodies"] == len(train) and held
    without = train_encoder(training, epochs=20)
    assert without.version != same.version  # the class term is in it


def test_the_class_term_needs_a_dataset_that_records_classes(tmp_path):
    code, out = run(
        "encoder", "train", "--dataset", SMALL, "--out", str(tmp_path / "w"), "--classes"
    )
    assert code == 2 and "records no class for" in out and "simnet encoder dataset" in out
    assert not (tmp_path / "w").exists()

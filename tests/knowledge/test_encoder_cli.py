"""`simnet encoder train/report` and `simnet skills query --encoder`, through the real click
group."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import knowledge
from knowledge import Embodiment, FeatureEncoder, LearnedEncoder
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

import json

from click.testing import CliRunner

import knowledge
from knowledge import SiteHome
from knowledge.cli import main
from sim import EntryPointRef, load_skill
from sim.cli import evaluate_command, reproduce_command


def test_evaluate_prints_a_summary_and_writes_the_record(tmp_path):
    runner = CliRunner()
    record = tmp_path / "record.json"
    result = runner.invoke(
        evaluate_command,
        [
            "walker_forward_degraded",
            "--task",
            "walker_forward",
            "--branches",
            "16",
            "--seed",
            "3",
            "--record",
            str(record),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("walker_forward: ") and "/16 succeeded" in result.output
    data = json.loads(record.read_text())
    assert data["layout"]["branches"] == 16 and data["sampler"]["seed"] == 3
    assert data["policy"]["skill_hash"] == load_skill("walker_forward_degraded").hash
    again = runner.invoke(reproduce_command, [str(record), "walker_forward_degraded", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["exact"] is True
    other = runner.invoke(reproduce_command, [str(record), "walker_forward_good"])
    assert other.exit_code != 0  # the record names another skill


def test_evaluate_with_sprt_and_json(tmp_path):
    task_file = tmp_path / "task.json"
    from sim import load_task

    task_file.write_text(json.dumps(load_task("arm_reach").replace(horizon=60).to_json()))
    result = CliRunner().invoke(
        evaluate_command,
        [
            "arm_reach_good",
            "--task",
            str(task_file),
            "--branches",
            "64",
            "--wave",
            "8",
            "--sprt",
            "0.5",
            "0.9",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["sequential"]["decision"] == "accept" and len(record["outcomes"]["branch"]) < 64


def test_unknown_names_are_usage_errors():
    result = CliRunner().invoke(evaluate_command, ["backflip", "--task", "arm_reach"])
    assert result.exit_code == 2 and "neither a shipped skill" in result.output


def test_publishing_a_skill_that_names_an_entry_point_is_a_usage_error(tmp_path, installed_policy):
    """Only MLP skills publish (their weights become a blob); an entry point's factory is code."""
    ref = EntryPointRef("stand_still", "fleetctl", "1.2.0")
    key = knowledge.Identity.generate()
    key.save(tmp_path / SiteHome.KEY_FILE)
    with knowledge.open(tmp_path / SiteHome.STORE_FILE, key) as kb:
        skill = kb.skills.publish("stand-still", "walk", policy=ref.to_json())
    result = CliRunner().invoke(
        main, ["--home", str(tmp_path), "publish", skill.id[:12], "--name", "x", "--task", "walk"]
    )
    assert result.exit_code == 2 and "only MLP skills" in result.output, result.output

"""What an operator sees of a real validator: `simnet validate --once` on a site with a skill to
certify and one it cannot evaluate, then `simnet status`, and a `simnet serve --validate` process's
/metrics, status page and /v1/status. This test may import both sim and federation: it checks that
the state file sim writes is the one federation reads."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

import knowledge
import sim
from federation._status import read_validator_state


def test_an_operator_sees_the_validators_work(fleet, run_simnet, wait):
    site = fleet.add("validating")
    task = sim.load_task("arm_reach").replace(horizon=20)
    with knowledge.open(site.home / "site.db", site.key, policy=site.home / "trust.toml") as kb:
        good = sim.publish_skill(
            kb, sim.load_skill("arm_reach_good"), "reach", "reach", tasks=[task]
        )
        record = dict(good.policy)
        record["architecture"] = {**record["architecture"], "hidden": [8]}  # not its weights' shape
        kb.skills.publish("wrong-spec", "reach", policy=record, blobs=good.blobs, tasks=good.tasks)

    run_simnet(site.home, "validate", "--once", "--branches", "16")
    written = json.loads((site.home / "validator.json").read_text())
    read = read_validator_state(site.home)
    assert set(written) <= set(read)  # every key sim writes is one federation reads
    for key in written:
        if key not in ("queue", "current", "failed", "waiting"):
            assert read[key] == written[key], key
    [failure] = written["failed"]
    assert read["failed"] == [failure]  # a job's shape too

    status = json.loads(run_simnet(site.home, "status", "--json").stdout)["validator"]
    assert status["certificates"] == 1 and status["branches_evaluated"] == 16
    assert status["queued"] == 0 and status["current"] is None and status["branches_per_s"] > 0
    assert [f["name"] for f in status["failed"]] == ["wrong-spec"]
    assert "PolicyPayloadError" in status["failed"][0]["reason"]
    assert status["state"] == "stopped" and status["stale"] is None  # `--once` is done
    human = run_simnet(site.home, "status").stdout
    assert "validator " in human and "certificates 1  spot_checks 0  disputes 0" in human
    assert "failed   evaluate wrong-spec (uncertified): PolicyPayloadError" in human

    site.start("--validate")  # the server's validator takes over the state file
    wait(
        lambda: (read_validator_state(site.home) or {}).get("pid") == site.process.pid,
        60,
        "the server's validator to write its state",
    )
    status = json.loads(run_simnet(site.home, "status", "--json").stdout)["validator"]
    assert status["stale"] is None and status["state"] in ("idle", "busy")
    assert status["certificates"] == 1  # its totals carried over from the last run

    site.process.kill()  # killed: its last word stays, marked stale
    site.process.wait()
    status = json.loads(run_simnet(site.home, "status", "--json").stdout)["validator"]
    assert status["state"] in ("idle", "busy") and "is not running" in status["stale"]
    site.start("--validate")
    wait(
        lambda: (read_validator_state(site.home) or {}).get("pid") == site.process.pid,
        60,
        "the restarted server's validator to write its state",
    )

    families = {
        f.name: f for f in text_string_to_metric_families(httpx.get(f"{site.url}/metrics").text)
    }
    value = {name: f.samples[0].value for name, f in families.items() if len(f.samples) == 1}
    assert value["simnet_evaluation_branches"] == 16
    assert value["simnet_validator_certificates"] == 1
    assert value["simnet_validator_disputes"] == 0 and value["simnet_validator_stale"] == 0
    jobs = {s.labels["state"]: s.value for s in families["simnet_validator_jobs"].samples}
    assert jobs == {"failed": 1.0, "waiting": 0.0}

    page = httpx.get(f"{site.url}/status").text
    section = page[page.index("<h2>Evaluation queue</h2>") : page.index("<h2>Forks caught</h2>")]
    assert "certificates 1 · spot checks 0 · disputes 0 · branches 16" in section
    assert "wrong-spec" in section and "PolicyPayloadError" in section
    assert site.status()["validator"]["certificates"] == 1  # GET /v1/status, signed

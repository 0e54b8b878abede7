"""The validator's state file (`validator.json`, written by sim.validation) as a site shows it:
`simnet status`, the status page, /metrics and /v1/status. Federation never imports the simulator,
so these tests write the file by hand, shaped exactly as `Validator.status()` writes it
(tests/system/test_validator_status.py checks the shapes agree with a real `simnet validate`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from federation._status import VALIDATOR_FILE, read_validator_state

SKILL, OTHER, CERT = "5a" * 32, "6b" * 32, "7c" * 32
WRITER = "ce" * 32  # who wrote the job's skill or certificate
VALIDATOR = "8d" * 32
METRICS = {
    "simnet_evaluation_branches",
    "simnet_evaluation_branches_per_second",
    "simnet_validator_queue_jobs",
    "simnet_validator_jobs",
    "simnet_validator_certificates",
    "simnet_validator_spot_checks",
    "simnet_validator_disputes",
    "simnet_validator_stale",
}


def written(**changes) -> dict:
    """What `Validator.status()` writes while evaluating a skill, with two more queued, one
    failed and one waiting."""
    now = time.time()
    state = {
        "pid": os.getpid(),
        "validator": VALIDATOR,
        "updated": now,
        "state": "busy",
        "current": {
            "kind": "evaluate",
            "skill": SKILL,
            "name": "reach",
            "certificate": None,
            "why": "used 3 times here",
            "writer": WRITER,
            "done": 48,
            "total": 128,
            "started": now - 5,
        },
        "queued": 3,
        "queue": [
            {
                "kind": "evaluate",
                "skill": SKILL,
                "name": "reach",
                "certificate": None,
                "why": "used 3 times here",
                "writer": WRITER,
            },
            {
                "kind": "spot_check",
                "skill": OTHER,
                "name": "pick-box",
                "certificate": CERT,
                "why": "spot check",
                "writer": WRITER,
            },
            {
                "kind": "evaluate",
                "skill": "9e" * 32,
                "name": "wave",
                "certificate": None,
                "why": "uncertified",
                "writer": WRITER,
            },
        ],
        "certificates": 4,
        "spot_checks": 2,
        "disputes": 1,
        "branches_evaluated": 512,
        "branches_spot_checked": 24,
        "busy_s": 13.4,
        "branches_per_s": 40.0,
        "failed": [
            {
                "kind": "evaluate",
                "skill": "af" * 32,
                "name": "wrong-spec",
                "certificate": None,
                "why": "uncertified",
                "writer": WRITER,
                "reason": "PolicyPayloadError: the weights do not fit the architecture",
                "attempts": 3,
                "retry_at": None,
            }
        ],
        "waiting": [
            {
                "kind": "evaluate",
                "skill": "b0" * 32,
                "name": "no-weights",
                "certificate": None,
                "why": "uncertified",
                "writer": WRITER,
                "reason": "waiting: blob 00000000 is not held here and no peer has it",
                "attempts": 1,
                "retry_at": now + 30,
            }
        ],
        "settings": {
            "branches": 128,
            "workers": 1,
            "threads": 1,
            "embodiments": [],
            "retry_s": 30.0,
            "max_attempts": 3,
            "idle_s": 1.0,
        },
    }
    return {**state, **changes}


def write(home, state) -> None:
    text = state if isinstance(state, str | bytes) else json.dumps(state)
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(home / VALIDATOR_FILE, mode) as out:
        out.write(text)


def dead_pid() -> int:
    """The process id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- the reader -----------------------------------------------------------------------------------


def test_no_file_is_no_validator(tmp_path):
    assert read_validator_state(tmp_path) is None


def test_a_live_validators_state_reads_as_written(tmp_path):
    state = written()
    write(tmp_path, state)
    read = read_validator_state(tmp_path)
    assert read["stale"] is None and read["error"] is None and read["age_s"] < 60
    for key in state:
        assert read[key] == state[key], key


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"pid": "dead"}, "is not running"),
        ({"updated": time.time() - 3600}, "no update for"),
        ({"updated": None}, "never said when"),
    ],
)
def test_a_dead_or_silent_validator_is_stale(tmp_path, changes, why):
    if changes.get("pid") == "dead":
        changes = {"pid": dead_pid()}
    write(tmp_path, written(**changes))
    read = read_validator_state(tmp_path)
    assert why in read["stale"] and read["error"] is None
    assert read["certificates"] == 4  # what it last said still shows


def test_a_stopped_validator_is_not_stale(tmp_path):
    write(tmp_path, written(pid=dead_pid(), state="stopped", current=None))
    assert read_validator_state(tmp_path)["stale"] is None


@pytest.mark.parametrize(
    "text, error",
    [
        ('{"pid": 1, "state": "bu', "not JSON"),  # cut short
        ("", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        ("[1, 2, 3]", "holds list"),
        ("null", "holds NoneType"),
    ],
)
def test_a_corrupt_file_is_unreadable_never_a_crash(tmp_path, text, error):
    write(tmp_path, text)
    read = read_validator_state(tmp_path)
    assert read["state"] == "unreadable" and error in read["error"] and read["stale"]
    assert read["queue"] == [] and read["certificates"] == 0


def test_missing_and_mistyped_fields_read_as_empty(tmp_path):
    write(
        tmp_path,
        {
            "state": 7,
            "current": {"kind": "evaluate", "done": "lots"},
            "queue": [{"name": ["x"]}, "not a job", {"kind": "evaluate", "name": "ok"}],
            "certificates": -3,
            "disputes": True,
            "branches_per_s": "fast",
            "failed": {"not": "a list"},
            "settings": [],
        },
    )
    read = read_validator_state(tmp_path)
    assert read["state"] == "unknown" and read["error"] is None
    assert read["current"]["done"] == 0 and read["current"]["name"] == ""
    assert [j["name"] for j in read["queue"]] == ["", "ok"] and read["queued"] == 2
    assert (read["certificates"], read["disputes"], read["branches_per_s"]) == (0, 0, 0.0)
    assert read["failed"] == [] and read["settings"] == {} and read["pid"] == 0
    assert "never said when" in read["stale"]


# --- simnet status --------------------------------------------------------------------------------


def test_simnet_status_shows_the_validator(tmp_path, cli):
    home = tmp_path / "a"
    assert cli(home, "init", "--name", "a", "--listen", "127.0.0.1:0").code == 0
    plain = cli(home, "status", "--json")
    assert plain.json["validator"] is None and "validator" not in cli(home, "status").out

    write(home, written())
    data = cli(home, "status", "--json").json
    assert data["validator"]["current"]["done"] == 48 and data["validator"]["queued"] == 3
    human = cli(home, "status").out
    assert f"validator busy  key {VALIDATOR[:16]}" in human and "STALE" not in human
    assert "now      evaluate reach (used 3 times here): 48/128 branches (37%)" in human
    assert "queue    3 jobs\n           evaluate reach (used 3 times here)\n" in human
    assert "           spot check pick-box (spot check)\n" in human
    assert "certificates 4  spot_checks 2  disputes 1  branches 536 (40.0/s busy)" in human
    assert "failed   evaluate wrong-spec (uncertified): PolicyPayloadError" in human
    assert "3 attempts, given up" in human
    assert "waiting  evaluate no-weights (uncertified): waiting: blob" in human
    assert "1 attempt, retry in" in human

    write(home, written(pid=dead_pid()))
    assert "STALE: its process" in cli(home, "status").out
    write(home, '{"state": "busy", "queue": [')
    result = cli(home, "status")
    assert result.code == 0 and result.traceback is None
    assert "validator unreadable: validator.json is not JSON" in result.out
    assert cli(home, "status", "--json").json["validator"]["state"] == "unreadable"


# --- the status page, /metrics and /v1/status over the real app -----------------------------------


def get(site, path: str, identity=None) -> httpx.Response:
    async def go():
        if identity is not None:
            async with site.client(identity) as client:
                return await client.get(path)
        transport = httpx.ASGITransport(app=site.app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return await client.get(path)

    return asyncio.run(go())


def test_the_page_shows_the_evaluation_queue(make_site):
    a = make_site("a")
    assert "no validator has run here" in get(a, "/status").text
    write(a.home, written())
    html = get(a, "/status").text
    section = html[html.index("<h2>Evaluation queue</h2>") : html.index("<h2>Forks caught</h2>")]
    assert f"<code>{VALIDATOR[:16]}</code> <span class='busy'>busy</span>" in section
    assert "certificates 4 · spot checks 2 · disputes 1 · branches 536" in section
    assert "<progress value='48' max='128'></progress> 48/128 branches" in section
    assert "<h3>Queued (3)</h3>" in section and f"<code>{CERT[:16]}</code>" in section
    assert "PolicyPayloadError" in section and "3, given up" in section
    assert "waiting: blob" in section and "1, next in" in section

    write(a.home, written(pid=dead_pid()))
    assert "<span class='failing'>stale: its process" in get(a, "/status").text
    write(a.home, "{")
    page = get(a, "/status")
    assert page.status_code == 200 and "state unreadable: validator.json is not JSON" in page.text


def test_what_the_file_says_is_escaped_on_the_page(make_site):
    a = make_site("a")
    evil = "<script>alert('x')</script>"
    job = {"kind": evil, "skill": evil, "name": evil, "certificate": None, "why": evil}
    trouble = {**job, "reason": evil, "attempts": 1, "retry_at": None}
    write(
        a.home,
        written(
            state=evil,
            validator=evil,
            current={**job, "done": 1, "total": 2, "started": 0},
            queue=[job],
            failed=[trouble],
            waiting=[trouble],
        ),
    )
    html = get(a, "/status").text
    assert "<script>" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html


def scrape(site) -> dict[tuple[str, tuple], float]:
    text = get(site, "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def families(site) -> set[str]:
    return {f.name for f in text_string_to_metric_families(get(site, "/metrics").text)}


def test_metrics_only_where_a_validator_has_run(make_site):
    a = make_site("a")
    assert not METRICS & families(a)  # no file: none of them
    write(a.home, written())
    seen = scrape(a)
    assert seen[("simnet_evaluation_branches_total", ())] == 536
    assert seen[("simnet_evaluation_branches_per_second", ())] == 40.0
    assert seen[("simnet_validator_queue_jobs", ())] == 3
    assert seen[("simnet_validator_jobs", (("state", "failed"),))] == 1
    assert seen[("simnet_validator_jobs", (("state", "waiting"),))] == 1
    assert seen[("simnet_validator_certificates_total", ())] == 4
    assert seen[("simnet_validator_spot_checks_total", ())] == 2
    assert seen[("simnet_validator_disputes_total", ())] == 1
    assert seen[("simnet_validator_stale", ())] == 0
    assert seen[("simnet_skills", (("state", "active"),))] == 0  # the rest is still there

    write(a.home, written(updated=time.time() - 3600))
    assert scrape(a)[("simnet_validator_stale", ())] == 1
    write(a.home, b"\x00\x01")  # unreadable: stale, and no counter that would seem to reset
    assert METRICS & families(a) == {"simnet_validator_stale"}
    assert scrape(a)[("simnet_validator_stale", ())] == 1


def test_v1_status_includes_the_validator_as_its_schema_says(make_site):
    a = make_site("a")
    b = make_site("b", trust=(a.key,))
    schema = get(b, "/v1/openapi.json").json()
    status_schema = {
        **schema["components"]["schemas"]["Status"],
        "components": schema["components"],
    }
    answer = get(b, "/v1/status", a.identity).json()
    assert answer["validator"] is None
    jsonschema.validate(answer, status_schema)
    write(b.home, written())
    answer = get(b, "/v1/status", a.identity).json()
    expected = read_validator_state(b.home)
    assert {**answer["validator"], "age_s": None} == {**expected, "age_s": None}
    jsonschema.validate(answer, status_schema)

"""`simnet status`: this site's key, server, peers (last sync, lag, feeds withheld from them),
counts of what it knows, and its validator's queue, as text or JSON. It reads the files a running
server and its gossip keep (`_status`), so it answers whether or not a server runs.
"""

from __future__ import annotations

import json
import time

import click

from knowledge import Identity, SiteHome
from knowledge.cli import emit

from ._config import SiteConfig, withheld_from
from ._status import STATE_FILE, ago, knowledge_counts, read_validator_state, running_server


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def status(home: SiteHome, as_json: bool) -> None:
    """This site: key, server, peers (last sync, lag), counts of what it knows, and its
    validator."""
    config = SiteConfig.load(home.path)
    identity = Identity.load(config.key_path)
    with home.open_readonly() as kb:
        counts = knowledge_counts(kb)
        withheld = {
            p.name: sorted(a.hex() for a in withheld_from(config, kb, p.key)) for p in config.peers
        }
    states = {s["name"]: s for s in peer_states(home)}
    now = time.time()
    peers = [
        {
            "name": p.name,
            "url": p.url,
            **{
                k: states.get(p.name, {}).get(k)
                for k in ("last_success", "last_error", "failures", "last_pulled", "last_pushed")
            },
            "lag_s": round(now - states[p.name]["last_success"], 1)
            if states.get(p.name, {}).get("last_success")
            else None,
            "withheld": withheld[p.name],
        }
        for p in config.peers
    ]
    own_withheld_from = [n for n, keys in withheld.items() if identity.public_key_hex in keys]
    data = {
        "name": config.name,
        "key": identity.public_key_hex,
        "key_id": identity.key_id,
        "server": running_server(home.path),
        **counts,
        "peers": peers,
        "own_feed_withheld_from": own_withheld_from,
        "validator": (validator := read_validator_state(home.path, now)),
    }
    human = [
        f"site {config.name}  key {identity.key_id}  server {data['server'] or 'not running'}",
        "  ".join(
            f"{k} {counts[k]}"
            for k in (
                "skills",
                "active_skills",
                "certificates",
                "revocations",
                "equivocations",
                "writers",
            )
        ),
    ]
    human += [
        f"  peer {p['name']:14} {last_sync(states.get(p['name'], {}))}"
        + (f"; {len(p['withheld'])} feeds withheld (private maps)" if p["withheld"] else "")
        for p in peers
    ]
    if own_withheld_from:  # a private map written with the site's key takes its whole feed along
        human.append(
            "WARNING: this site's own key wrote a private map, so its whole feed (revocations, "
            f"delegations, certificates) is withheld from {', '.join(own_withheld_from)}: write "
            "private maps with a device key of their own"
        )
    if validator is not None:
        human += _validator_lines(validator, now)
    emit(data, as_json, "\n".join(human))


SHOWN_JOBS = 5  # queued jobs `simnet status` lists (--json has the file's first 50)


def _validator_lines(v: dict, now: float) -> list[str]:
    """The validator section of `simnet status` (`v` from `read_validator_state`)."""
    if v["error"]:
        return [f"validator unreadable: {v['error']}"]
    head = f"validator {v['state']}"
    if v["validator"]:
        head += f"  key {v['validator'][:16]}"
    if v["age_s"] is not None:
        head += f"  updated {ago(v['age_s'])}"
    lines = [head + (f"  STALE: {v['stale']}" if v["stale"] else "")]
    if v["current"]:
        lines.append(f"  now      {_job(v['current'])}: {_progress(v['current'])}")
    shown = v["queue"][:SHOWN_JOBS]
    lines.append(f"  queue    {v['queued']} jobs")
    lines += [f"           {_job(j)}" for j in shown]
    if shown and v["queued"] > len(shown):
        lines.append(f"           and {v['queued'] - len(shown)} more")
    branches = v["branches_evaluated"] + v["branches_spot_checked"]
    lines.append(
        f"  done     certificates {v['certificates']}  spot_checks {v['spot_checks']}  "
        f"disputes {v['disputes']}  branches {branches} ({v['branches_per_s']:.1f}/s busy)"
    )
    for label, jobs in (("failed", v["failed"]), ("waiting", v["waiting"])):
        lines += [f"  {label:8} {_job(j)}: {j['reason']} ({_retry(j, now)})" for j in jobs]
    return lines


def _job(job: dict) -> str:
    kind = "spot check" if job["kind"] == "spot_check" else job["kind"] or "job"
    return f"{kind} {job['name'] or job['skill'][:16]}" + (f" ({job['why']})" if job["why"] else "")


def _progress(job: dict) -> str:
    if not job["total"]:
        return "starting" if job["kind"] != "spot_check" else "re-running waves"
    return f"{job['done']}/{job['total']} branches ({100 * job['done'] // job['total']}%)"


def _retry(job: dict, now: float) -> str:
    tries = f"{job['attempts']} attempt{'s' if job['attempts'] != 1 else ''}"
    if job["retry_at"] is None:
        return f"{tries}, given up"
    wait = job["retry_at"] - now
    return f"{tries}, retry in {wait:.0f} s" if wait > 0 else f"{tries}, retry due"


def peer_states(home: SiteHome) -> list[dict]:
    """Each peer's last round as the gossip scheduler wrote it (none if it never has)."""
    try:
        return json.loads((home.path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return []


def last_sync(state: dict) -> str:
    """One peer's last round in words: how long ago it succeeded, and why it fails if it does."""
    if state.get("last_success"):
        ago = time.time() - state["last_success"]
        text = f"last sync {ago:.0f} s ago"
    else:
        text = "never synced"
    return text + (f"; failing: {state['last_error']}" if state.get("last_error") else "")

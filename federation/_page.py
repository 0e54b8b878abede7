"""The site's status page (`GET /status`): what an operator checks in a browser.

Read-only, server-rendered HTML (no script), refreshed every 10 s: the site, its peers and their
last rounds, its skills with their activation and certificates, its validator's queue (from
`validator.json`), forks caught, and the latest refusals. A browser cannot sign requests, so the
page is served to loopback clients only; reach it from elsewhere through an SSH tunnel.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path
from typing import Any

from knowledge import KnowledgeBase

from ._site import Site
from ._status import ago, read_validator_state

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }
.active { color: #080; } .inactive { color: #a60; } .revoked, .failing { color: #b00; }
code { font-size: 12px; }
.busy { color: #06c; } .idle, .stopped { color: #666; }
"""
QUEUED_SHOWN = 10  # queued jobs the page lists


def render(site: Site) -> str:
    """The page for `site` as it is now (call it off the event loop: it reads the store)."""
    kb, now = site.kb, time.time()
    peers = site.gossip.states() if site.gossip is not None else []
    sections = [
        f"<h1>{escape(site.config.name)}</h1><p>root key <code>{site.key.hex()}</code></p>",
        _table("Peers", ["peer", "url", "last sync", "failures", "last error"], _peers(peers, now)),
        _table(
            "Skills",
            ["skill", "id", "task", "state", "certificates", "why"],
            _skills(kb),
        ),
        _validator(site.config.home, now),
        _table(
            "Forks caught",
            ["author", "at seq"],
            [[f"<code>{escape(a[:16])}</code>", str(s)] for a, s in kb.equivocations()],
        ),
        _table(
            "Latest refusals",
            ["when", "from", "reason", "detail"],
            [
                [ago(now - at), escape(via), escape(r.reason), escape(r.detail[:200])]
                for at, via, r in site.metrics.recent
            ],
        ),
    ]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='refresh' content='10'>"
        f"<title>{escape(site.config.name)}: simnet site</title><style>{STYLE}</style></head>"
        f"<body>{''.join(sections)}</body></html>"
    )


def _peers(states: list[dict[str, Any]], now: float) -> list[list[str]]:
    rows = []
    for state in states:
        last = state.get("last_success")
        failing = state.get("failures", 0) > 0
        rows.append(
            [
                escape(state["name"]),
                escape(state["url"]),
                ago(now - last) if last else "never",
                f"<span class='{'failing' if failing else ''}'>{state.get('failures', 0)}</span>",
                escape((state.get("last_error") or "")[:200]),
            ]
        )
    return rows


def _skills(kb: KnowledgeBase) -> list[list[str]]:
    rows = []
    for skill in kb.skills.list(include_withdrawn=True):
        activation = kb.activation(skill.id)
        state = (
            "revoked" if kb.is_revoked(skill.id) else "active" if activation.active else "inactive"
        )
        rows.append(
            [
                escape(skill.name),
                f"<code>{skill.id[:16]}</code>",
                escape(skill.task),
                f"<span class='{state}'>{state}</span>",
                str(len(kb.certificates.for_skill(skill.id))),
                escape("; ".join(activation.reasons)),
            ]
        )
    return rows


def _validator(home: Path, now: float) -> str:
    """The "Evaluation queue" section: the validator's state file, as `simnet status` shows it."""
    title = "<h2>Evaluation queue</h2>"
    v = read_validator_state(home, now)
    if v is None:
        return f"{title}<p>no validator has run here (<code>simnet serve --validate</code>)</p>"
    if v["error"]:
        return f"{title}<p class='failing'>state unreadable: {escape(v['error'])}</p>"
    state = escape(v["state"])
    head = (
        f"validator <code>{escape(v['validator'][:16])}</code> <span class='{state}'>{state}</span>"
    )
    if v["age_s"] is not None:
        head += f", updated {ago(v['age_s'])}"
    if v["stale"]:
        head += f" <span class='failing'>stale: {escape(v['stale'])}</span>"
    branches = v["branches_evaluated"] + v["branches_spot_checked"]
    totals = (
        f"certificates {v['certificates']} · spot checks {v['spot_checks']} · "
        f"disputes {v['disputes']} · branches {branches} ({v['branches_per_s']:.1f}/s while busy)"
    )
    current = v["current"]
    now_rows = [] if current is None else [[*_job(current), _progress(current)]]
    queued = [_job(j) for j in v["queue"][:QUEUED_SHOWN]]
    if v["queued"] > len(queued):
        queued.append(["", "", f"and {v['queued'] - len(queued)} more", ""])
    troubles = {
        label: [[*_job(j)[:3], escape(j["reason"]), _retry(j, now)] for j in v[label]]
        for label in ("failed", "waiting")
    }
    trouble_head = ["job", "skill", "id", "reason", "attempts"]
    return "".join(
        [
            f"{title}<p>{head}</p><p>{totals}</p>",
            _table("Now", ["job", "skill", "id", "why", "progress"], now_rows, level=3),
            _table(f"Queued ({v['queued']})", ["job", "skill", "id", "why"], queued, level=3),
            _table("Failed", trouble_head, troubles["failed"], level=3),
            _table("Waiting", trouble_head, troubles["waiting"], level=3),
        ]
    )


def _job(job: dict[str, Any]) -> list[str]:
    kind = "spot check" if job["kind"] == "spot_check" else job["kind"]
    ident = job["certificate"] or job["skill"]  # a spot check names the certificate it re-runs
    return [
        escape(kind),
        escape(job["name"]),
        f"<code>{escape(ident[:16])}</code>",
        escape(job["why"]),
    ]


def _progress(job: dict[str, Any]) -> str:
    done, total = job["done"], job["total"]
    if not total:
        return "starting"
    return f"<progress value='{done}' max='{total}'></progress> {done}/{total} branches"


def _retry(job: dict[str, Any], now: float) -> str:
    attempts = str(job["attempts"])
    if job["retry_at"] is None:
        return f"{attempts}, given up"
    wait = job["retry_at"] - now
    return f"{attempts}, next in {wait:.0f} s" if wait > 0 else f"{attempts}, next due"


def _table(title: str, head: list[str], rows: list[list[str]], level: int = 2) -> str:
    """A titled table of cells that are already HTML (escaped by the caller)."""
    heading = f"<h{level}>{escape(title)}</h{level}>"
    if not rows:
        return f"{heading}<p>none</p>"
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"{heading}<table><tr>{header}</tr>{body}</table>"

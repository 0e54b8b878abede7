"""The site's status page (`GET /status`): what an operator checks in a browser.

Read-only, server-rendered HTML (no script), refreshed every 10 s: the site, its peers and their
last rounds, its skills with their activation and certificates, forks caught, and the latest
refusals. A browser cannot sign requests, so the page is served to loopback clients only; reach it
from elsewhere through an SSH tunnel.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from knowledge import KnowledgeBase

from ._site import Site

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }
.active { color: #080; } .inactive { color: #a60; } .revoked, .failing { color: #b00; }
code { font-size: 12px; }
"""


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
        _table(
            "Forks caught",
            ["author", "at seq"],
            [[f"<code>{escape(a[:16])}</code>", str(s)] for a, s in kb.equivocations()],
        ),
        _table(
            "Latest refusals",
            ["when", "from", "reason", "detail"],
            [
                [_ago(now - at), escape(via), escape(r.reason), escape(r.detail[:200])]
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
                _ago(now - last) if last else "never",
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


def _table(title: str, head: list[str], rows: list[list[str]]) -> str:
    """A titled table of cells that are already HTML (escaped by the caller)."""
    if not rows:
        return f"<h2>{escape(title)}</h2><p>none</p>"
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h2>{escape(title)}</h2><table><tr>{header}</tr>{body}</table>"


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"

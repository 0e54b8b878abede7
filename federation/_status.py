"""A site's status as its own CLI and its /v1/status report it: whether a server runs for a home
(`serve.json`), its peers' last rounds (`peers.json`) and counts of what it knows.

Nothing here needs the server's libraries: `simnet status` works where only the core is installed.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import replace
from pathlib import Path

import httpx

from knowledge import KnowledgeBase

from ._config import SiteConfig

SERVE_FILE = "serve.json"  # written by a running server: its URL, process id and certificate
STATE_FILE = "peers.json"  # written by the gossip scheduler after every round


def running_server(home: Path) -> str | None:
    """The URL of the server running for `home`, if one answers; None otherwise."""
    try:
        info = json.loads((home / SERVE_FILE).read_text())
        response = httpx.get(f"{info['url']}/v1/health", timeout=2.0, verify=local_verify(home))
        return info["url"] if response.status_code == 200 else None
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return None


def local_verify(home: Path) -> ssl.SSLContext:
    """How the site's own CLI verifies its running server: the site's anchors and the certificate
    that server was started with (which `simnet serve --tls-cert` may have named)."""
    tls = SiteConfig.load(home).tls
    try:
        cert = json.loads((home / SERVE_FILE).read_text()).get("cert")
    except (OSError, ValueError):
        cert = None
    return replace(tls, cert=Path(cert) if cert else tls.cert).client_context()


def knowledge_counts(kb: KnowledgeBase) -> dict[str, int]:
    skills = kb.skills.list(include_withdrawn=True)
    return {
        "skills": len(skills),
        "active_skills": sum(kb.is_active(s.id) for s in skills),
        "certificates": sum(len(kb.certificates.for_skill(s.id)) for s in skills),
        "revocations": sum(kb.is_revoked(s.id) for s in skills),
        "equivocations": len(kb.equivocations()),
        "writers": len(kb.heads()),
        "envelopes": sum(h.seq for h in kb.heads().values()),
    }

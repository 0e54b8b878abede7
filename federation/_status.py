"""A site's status as its own CLI and its /v1/status report it: whether a server runs for a home
(`serve.json`), its peers' last rounds (`peers.json`), counts of what it knows, and its validator's
queue (`validator.json`).

Nothing here needs the server's libraries: `simnet status` works where only the core is installed.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from knowledge import Head, KnowledgeBase, TrustPolicy

from ._config import SiteConfig

SERVE_FILE = "serve.json"  # written by a running server: its URL, process id and certificate
STATE_FILE = "peers.json"  # written by the gossip scheduler after every round
# written by the validator service (`simnet validate`, `simnet serve --validate`; sim.validation)
# after every change. Only its JSON is read here: federation never imports the simulator.
VALIDATOR_FILE = "validator.json"
# per-skill counts are made again after this even if nothing changed: activation depends on the time
COUNTS_MAX_AGE_S = 5.0
VALIDATOR_STALE_S = 600.0  # no update for this long (or 10 idle periods, if longer): stale
_VALIDATOR_COUNTS = (
    "queued",
    "certificates",
    "spot_checks",
    "disputes",
    "branches_evaluated",
    "branches_spot_checked",
)


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
    """What `kb` holds, by kind. Anyone may ask (/metrics is unauthenticated), so the per-skill
    counts (activation of every skill) are made again only when the knowledge base changed (its
    heads or its policy) or after `COUNTS_MAX_AGE_S` (activation also depends on the time), and
    callers asking at once wait for one count instead of each making their own."""
    with _counting:
        heads, policy, now = kb.heads(), kb.policy, time.monotonic()
        last = _skill_counts.get(kb)
        if (
            last is None
            or last.heads != heads
            or last.policy is not policy
            or now - last.at > COUNTS_MAX_AGE_S
        ):
            last = _skill_counts[kb] = _SkillCounts(heads, policy, now, _count_skills(kb))
        return {
            **last.counts,
            "equivocations": len(kb.equivocations()),
            "writers": len(heads),
            "envelopes": sum(h.seq for h in heads.values()),
        }


@dataclass(frozen=True)
class _SkillCounts:
    """The per-skill counts of a knowledge base, and what they were made from."""

    heads: dict[str, Head]
    policy: TrustPolicy
    at: float  # time.monotonic() when made
    counts: dict[str, int]


_skill_counts: weakref.WeakKeyDictionary[KnowledgeBase, _SkillCounts] = weakref.WeakKeyDictionary()
_counting = threading.Lock()


def _count_skills(kb: KnowledgeBase) -> dict[str, int]:
    skills = kb.skills.list(include_withdrawn=True)
    return {
        "skills": len(skills),
        "active_skills": sum(kb.is_active(s.id) for s in skills),
        "certificates": sum(len(kb.certificates.for_skill(s.id)) for s in skills),
        "revocations": sum(kb.is_revoked(s.id) for s in skills),
    }


def ago(seconds: float) -> str:
    """A duration past, as the CLI and the status page say it."""
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs on this machine (a zombie, exited but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except ProcessLookupError:
        return False
    except OSError:
        return True  # no /proc here, or not ours to signal: it exists
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_validator_state(home: Path, now: float | None = None) -> dict[str, Any] | None:
    """The validator's state file of the site at `home`, checked and completed; None if there is
    none (no validator has run for this site).

    Every key of `Validator.status()` is present, with its type (a missing or mistyped one gets
    its empty value; jobs are dicts of strings and numbers), plus:
    `age_s` (seconds since `updated`), `stale` (None, or why the state cannot be believed: the
    process that wrote it is gone while it says idle or busy, or it has not been updated for
    `VALIDATOR_STALE_S`), and `error` (None, or why the file cannot be read; `state` is then
    "unreadable"). Never raises for what the file holds.
    """
    path = Path(home) / VALIDATOR_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _unreadable(f"cannot read {path.name}: {exc.strerror or exc}")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return _unreadable(f"{path.name} is not JSON ({exc})")
    if not isinstance(data, dict):
        return _unreadable(f"{path.name} holds {type(data).__name__}, not an object")
    now = time.time() if now is None else now
    state, current = data.get("state"), data.get("current")
    out: dict[str, Any] = {
        "state": state if isinstance(state, str) and state else "unknown",
        "pid": _int(data.get("pid")),
        "validator": _text(data.get("validator")),
        "updated": _number(data.get("updated")) or None,
        "current": _job(current, "current") if isinstance(current, dict) else None,
        **{name: _int(data.get(name)) for name in _VALIDATOR_COUNTS},
        "busy_s": _number(data.get("busy_s")),
        "branches_per_s": _number(data.get("branches_per_s")),
        "queue": _jobs(data.get("queue"), "queued"),
        "failed": _jobs(data.get("failed"), "trouble"),
        "waiting": _jobs(data.get("waiting"), "trouble"),
        "requested": [r for r in data.get("requested") or () if isinstance(r, str)][:100]
        if isinstance(data.get("requested"), list)
        else [],
        "settings": data["settings"] if isinstance(data.get("settings"), dict) else {},
        "error": None,
    }
    out["queued"] = max(out["queued"], len(out["queue"]))
    out["age_s"] = None if out["updated"] is None else round(max(0.0, now - out["updated"]), 1)
    out["stale"] = _staleness(out)
    return out


def _staleness(state: dict[str, Any]) -> str | None:
    if state["state"] == "stopped":
        return None  # stopped on purpose: its last word stands
    pid, age = state["pid"], state["age_s"]
    if pid and not pid_alive(pid):
        return f"its process ({pid}) is not running"
    idle_s = _number(state["settings"].get("idle_s"))
    limit = max(VALIDATOR_STALE_S, 10 * idle_s)
    if age is None:
        return "it never said when it was updated"
    if age > limit:
        return f"no update for {age:.0f} s (hung, or a very long evaluation wave)"
    return None


def _unreadable(error: str) -> dict[str, Any]:
    return {
        "state": "unreadable",
        "pid": 0,
        "validator": "",
        "updated": None,
        "current": None,
        **dict.fromkeys(_VALIDATOR_COUNTS, 0),
        "busy_s": 0.0,
        "branches_per_s": 0.0,
        "queue": [],
        "failed": [],
        "waiting": [],
        "requested": [],
        "settings": {},
        "error": error,
        "age_s": None,
        "stale": error,
    }


def _jobs(value: object, kind: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    return [_job(x, kind) for x in value if isinstance(x, dict)]


def _job(value: dict[str, Any], kind: str) -> dict[str, Any]:
    """A job shaped as `Validator.status()` writes it: `kind` "queued" (kind, skill, name,
    certificate, why, writer), "current" (and done, total, started) or "trouble" (and reason,
    attempts, retry_at: None once given up). Text is text and numbers are numbers; what the file
    did not say is empty."""
    job: dict[str, Any] = {
        "kind": _text(value.get("kind")),
        "skill": _text(value.get("skill")),
        "name": _text(value.get("name")),
        "certificate": _text(value.get("certificate")) or None,
        "why": _text(value.get("why")),
        "writer": _text(value.get("writer")),
    }
    if kind == "current":
        job.update(
            done=_int(value.get("done")),
            total=_int(value.get("total")),
            started=_number(value.get("started")) or None,
        )
    elif kind == "trouble":
        job.update(
            reason=_text(value.get("reason")),
            attempts=_int(value.get("attempts")),
            retry_at=_number(value.get("retry_at")) or None,
        )
    return job


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if value >= 0 and value == value and value != float("inf") else 0.0

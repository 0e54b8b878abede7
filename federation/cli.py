"""The site commands of `simnet`: init, key, serve, stop, peer add/list/remove, sync, status,
revoke, device add/revoke (status is `_cli_status`'s).

Commands that write (sync, revoke) use the running server when there is one — a store has one writer
process — and open the store themselves otherwise.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import httpx

import knowledge
from knowledge import Identity, Role, SiteHome, TrustPolicy
from knowledge.cli import emit, skill_by_prefix

from ._auth import SimnetAuth
from ._cli_status import last_sync, peer_states
from ._cli_status import status as status  # `simnet status` is registered from here
from ._client import sync_with
from ._config import PeerConfig, SiteConfig, withheld_from
from ._errors import FederationError, PeerError
from ._status import (
    SERVE_FILE,
    local_verify,
    pid_alive,
    running_server,
)

LOG_FILE = "serve.log"  # where `simnet serve --detach` sends the server's output
START_TIMEOUT_S = 60.0


def _roles(text: str) -> list[Role]:
    """Comma-separated role names; a clear error (and nothing changed) for an unknown one."""
    try:
        return [Role(r.strip()) for r in text.split(",") if r.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; roles are publish, validate, revoke") from None


def _config(home: SiteHome) -> SiteConfig:
    return SiteConfig.load(home.path)


def _admin(home: SiteHome, url: str, path: str, body: dict) -> dict:
    """Call the running server's admin endpoint, signed with the site's own key."""
    config = _config(home)
    identity = Identity.load(config.key_path)
    response = httpx.post(
        f"{url}{path}",
        json=body,
        auth=SimnetAuth(identity, identity.public_key),
        timeout=120,
        verify=local_verify(home.path),
    )
    if response.status_code != 200:
        try:  # our own server: its JSON error says what was wrong, whole
            answer = response.json()
            said = f"{answer['error']}: {answer['detail']}"
        except (ValueError, KeyError, TypeError):
            said = response.text[:300]
        raise PeerError(f"server answered {response.status_code}: {said}", response.status_code)
    return response.json()


@click.command()
@click.option("--name", default=None, help="The site's name (default: the directory's name).")
@click.option(
    "--listen",
    default="127.0.0.1:7070",
    show_default=True,
    help="host:port to serve on (port 0: any).",
)
@click.pass_obj
def init(home: SiteHome, name: str | None, listen: str) -> None:
    """Create a site here: its root key (mode 0600), store, trust policy and simnet.toml."""
    home.path.mkdir(parents=True, exist_ok=True)
    config = SiteConfig(home.path, name=name or home.path.resolve().name, listen=listen)
    if (home.path / "simnet.toml").exists():
        raise click.ClickException(f"{home.path} already holds a site (simnet.toml exists)")
    identity = Identity.generate()
    identity.save(config.key_path)
    config.policy_path.write_text(TrustPolicy().to_toml())
    knowledge.open(config.store_path, identity, policy=config.policy_path).close()
    config.save()
    click.echo(
        f"site {config.name} created in {home.path}\nkey id     {identity.key_id}\n"
        f"public key {identity.public_key_hex}\nlisten     {config.listen}"
    )


@click.command("serve")
@click.option("--no-gossip", is_flag=True, help="Serve requests but never start a sync round.")
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="Serve HTTPS with this PEM certificate chain (else simnet.toml's [tls] cert, if any).",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False),
    help="The certificate's PEM private key (with --tls-cert).",
)
@click.option(
    "--detach",
    is_flag=True,
    help="Run the server in the background (output to <home>/serve.log); return once it answers.",
)
@click.option(
    "--validate",
    is_flag=True,
    help="Also run the validator service (`simnet validate`; needs the sim extra) beside gossip.",
)
@click.pass_obj
def serve_command(
    home: SiteHome,
    no_gossip: bool,
    tls_cert: str | None,
    tls_key: str | None,
    detach: bool,
    validate: bool,
) -> None:
    """Serve this site over HTTP and gossip with its peers until interrupted."""
    services = [home.service("validate")] if validate else []  # an import error shows here
    if detach:
        flags = ["--no-gossip"] if no_gossip else []
        flags += ["--validate"] if validate else []
        if tls_cert is not None:
            flags += ["--tls-cert", str(Path(tls_cert).resolve())]
        if tls_key is not None:
            flags += ["--tls-key", str(Path(tls_key).resolve())]
        _start_detached(home.path, flags)
        return
    logging.getLogger("federation").setLevel(min(logging.getLogger().level, logging.INFO))
    from ._serve import serve  # the server's libraries (the server extra) load only here

    serve(home.path, gossip=not no_gossip, tls_cert=tls_cert, tls_key=tls_key, services=services)


def _start_detached(home: Path, flags: list[str]) -> None:
    """Start `simnet serve` for `home` in its own session and wait until it answers /v1/health, so
    the next command of a script finds it; if it exits first, say why from its log."""
    _config(SiteHome(home))  # a missing or broken site is reported here, not in the log
    if running_server(home) is not None:
        raise click.ClickException(f"a server already runs for {home} (`simnet stop` stops it)")
    (home / SERVE_FILE).unlink(missing_ok=True)  # left by a killed server: not an answer
    command = [sys.executable, "-c", "from knowledge.cli import run; run()"]
    with open(home / LOG_FILE, "ab") as log:
        process = subprocess.Popen(
            [*command, "--home", str(home.resolve()), "serve", *flags],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the shell's Ctrl-C and hang-up do not reach it
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while (url := running_server(home)) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            lines = (home / LOG_FILE).read_text(errors="replace").strip().splitlines()
            raise click.ClickException(
                f"the server did not start: {lines[-1] if lines else 'no output'} "
                f"(log: {home / LOG_FILE})"
            )
        time.sleep(0.1)
    click.echo(f"serving on {url} (pid {process.pid}; log {home / LOG_FILE}; `simnet stop`)")


@click.command("stop")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the exit.")
@click.pass_obj
def stop_command(home: SiteHome, timeout: float) -> None:
    """Stop this site's running server (SIGTERM: it finishes its requests and closes the store)."""
    if running_server(home.path) is None:
        raise click.ClickException(f"no server is running for {home.path}")
    pid = json.loads((home.path / SERVE_FILE).read_text())["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while (home.path / SERVE_FILE).exists() or pid_alive(pid):
        if time.monotonic() > deadline:
            raise click.ClickException(f"the server (pid {pid}) did not stop in {timeout:g} s")
        time.sleep(0.1)
    click.echo(f"stopped the server (pid {pid})")


@click.command("key")
@click.pass_obj
def key_command(home: SiteHome) -> None:
    """Print this site's public key (64 hex), as its peers give it to `peer add --key`."""
    click.echo(Identity.load(_config(home).key_path).public_key_hex)


@click.group()
def peer() -> None:
    """The sites this site syncs with."""


@peer.command("add")
@click.argument("name")
@click.argument("url")
@click.option(
    "--key", help="The peer's root key (64 hex). Without it, it is asked from the peer: check it!"
)
@click.option(
    "--trust",
    default="",
    help="Also trust the peer's root for these roles, e.g. publish,validate,revoke.",
)
@click.pass_obj
def peer_add(home: SiteHome, name: str, url: str, key: str | None, trust: str) -> None:
    """Add a peer (and, with --trust, trust its site root)."""
    config = _config(home)
    if key is None:
        try:
            verify = _config(home).tls.client_context()
            key = httpx.get(f"{url.rstrip('/')}/v1/health", timeout=5, verify=verify).json()["key"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise click.ClickException(
                f"cannot ask {url} for its key ({exc}); pass --key"
            ) from None
        click.echo(f"peer {name} says its key is {key}: compare it with the peer's `simnet status`")
    public_key = knowledge.parse_public_key(key)
    roles = _roles(trust)
    config.peers = [p for p in config.peers if p.name != name] + [
        PeerConfig(name, url.rstrip("/"), public_key)
    ]
    config.save()
    if roles:
        policy = TrustPolicy.load(config.policy_path).with_root(public_key, roles, name=name)
        config.policy_path.write_text(policy.to_toml())
        click.echo(
            f"trusting {name} for {', '.join(r.value for r in roles)} "
            "(takes effect when the store is reopened)"
        )
    click.echo(f"peer {name} added: {url}")


@peer.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def peer_list(home: SiteHome, as_json: bool) -> None:
    """List peers and the state of the last sync with each."""
    config = _config(home)
    states = {s["name"]: s for s in peer_states(home)}
    rows = [
        {"name": p.name, "url": p.url, "key": p.key.hex(), **states.get(p.name, {})}
        for p in config.peers
    ]
    lines = [f"{r['name']:16} {r['url']:32} {last_sync(r)}" for r in rows]
    emit(
        rows,
        as_json,
        "\n".join(lines) if rows else "no peers; add one with `simnet peer add NAME URL`",
    )


@peer.command("remove")
@click.argument("name")
@click.pass_obj
def peer_remove(home: SiteHome, name: str) -> None:
    """Stop syncing with a peer (its data stays; trust is unchanged)."""
    config = _config(home)
    if not any(p.name == name for p in config.peers):
        raise click.ClickException(f"no peer named {name!r}")
    config.peers = [p for p in config.peers if p.name != name]
    config.save()
    click.echo(f"peer {name} removed")


@click.command("sync")
@click.argument("peer_name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def sync_command(home: SiteHome, peer_name: str | None, as_json: bool) -> None:
    """Sync now with one peer, or with every peer."""
    url = running_server(home.path)
    if url is not None:
        reports = _admin(home, url, "/v1/admin/sync", {"peer": peer_name})["reports"]
    else:
        config = _config(home)
        peers = [config.peer(peer_name)] if peer_name else config.peers
        reports = []
        with home.open_writer() as kb:
            kb.expect_own_feed_from(p.key for p in config.peers)
            for p in peers:
                try:
                    r = sync_with(
                        kb,
                        p.url,
                        p.key,
                        page=config.limits.max_page,
                        timeout=config.limits.timeout_s,
                        deadline=config.limits.sync_deadline_s,
                        withhold=withheld_from(config, kb, p.key),
                        verify=config.tls.client_context(),
                    )
                    reports.append(
                        {
                            "peer": p.name,
                            "ok": True,
                            "pulled": r.pulled,
                            "pushed": r.pushed,
                            "rejected": len(r.rejected),
                            "refused_by_peer": r.refused_by_peer,
                        }
                    )
                except FederationError as exc:
                    reports.append({"peer": p.name, "ok": False, "error": str(exc)})
    lines = [
        f"{r['peer']:16} pulled {r['pulled']:6} pushed {r['pushed']:6}"
        if r["ok"]
        else f"{r['peer']:16} failed: {r['error']}"
        for r in reports
    ]
    emit(reports, as_json, "\n".join(lines) if lines else "no peers")
    if any(not r["ok"] for r in reports):
        raise SystemExit(1)


def _write(
    home: SiteHome, admin_path: str, body: dict, local: Callable[[knowledge.KnowledgeBase], None]
) -> None:
    """Make a write as this site: through the running server if there is one, else on the store
    itself."""
    url = running_server(home.path)
    if url is not None:
        _admin(home, url, admin_path, body)
        return
    with home.open_writer() as kb:
        local(kb)


@click.command()
@click.argument("skill_id")
@click.option("--reason", default="", help="Why (recorded with the revocation).")
@click.pass_obj
def revoke(home: SiteHome, skill_id: str, reason: str) -> None:
    """Revoke a skill fleet-wide (irreversible; publish a corrected skill instead of
    un-revoking)."""
    with home.open_readonly() as kb:
        skill = skill_by_prefix(kb, skill_id)
    _write(
        home,
        "/v1/admin/revoke",
        {"skill": skill.id, "reason": reason},
        lambda kb: kb.revoke(skill.id, reason),
    )
    click.echo(f"revoked {skill.id} ({skill.name})")


class _Duration(click.ParamType):
    """A length of time as a number and a unit: 90s, 30m, 8h, 7d."""

    name = "duration"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime.timedelta:
        if isinstance(value, datetime.timedelta):
            return value
        text = str(value).strip()
        try:
            number = float(text[:-1]) if text[-1:] in self._UNITS else None
        except ValueError:
            number = None
        try:
            if number is not None and 0 < number:
                return datetime.timedelta(seconds=number * self._UNITS[text[-1]])
        except OverflowError:
            pass
        self.fail(f"{value!r} is no duration: write a number > 0 and s, m, h or d (8h)")


@click.group()
def device() -> None:
    """The device keys (robots, validators) allowed to write for this site."""


@device.command("add")
@click.argument("key")
@click.option(
    "--roles",
    default="publish",
    show_default=True,
    help="Comma-separated: publish, validate, revoke.",
)
@click.option(
    "--expires-in",
    "lasting",
    type=_Duration(),
    default=None,
    help="End the grant after this long by this site's clock: 90s, 30m, 8h, 7d (default: never).",
)
@click.pass_obj
def device_add(home: SiteHome, key: str, roles: str, lasting: datetime.timedelta | None) -> None:
    """Delegate roles to a device's public key (64 hex)."""
    public_key = knowledge.parse_public_key(key)
    granted = _roles(roles)
    body: dict[str, object] = {"device": public_key.hex(), "roles": [r.value for r in granted]}
    if lasting is not None:
        body["lasting_s"] = lasting.total_seconds()
    _write(
        home,
        "/v1/admin/delegate",
        body,
        lambda kb: kb.delegate(public_key, granted, lasting=lasting),
    )
    with home.open_readonly() as kb:
        root = any(r.key == public_key for r in kb.policy.roots)
    listed = ", ".join(r.value for r in granted)
    if root:  # a root's roles here come from the policy; the grant counts where it is no root
        click.echo(
            f"delegated {listed} to {knowledge.key_id(public_key)}, a root of this site's trust "
            "policy: here its roles stay the policy's; the delegation counts at sites that do not "
            "trust it as a root"
        )
    else:
        ends = datetime.datetime.now(datetime.UTC) + lasting if lasting else None
        until = f" until {ends:%Y-%m-%d %H:%M:%S} UTC" if ends else ""
        click.echo(f"device {knowledge.key_id(public_key)} may now {listed}{until}")


@device.command("revoke")
@click.argument("key")
@click.option(
    "--last-seq",
    type=click.IntRange(min=0),
    required=True,
    help="The device's last envelope still accepted.",
)
@click.option("--reason", default="", help="Why (recorded with the revocation).")
@click.pass_obj
def device_revoke(home: SiteHome, key: str, last_seq: int, reason: str) -> None:
    """Stop accepting a device's writes after --last-seq (a seq, never a time: clocks can lie)."""
    public_key = knowledge.parse_public_key(key)
    _write(
        home,
        "/v1/admin/revoke-key",
        {"device": public_key.hex(), "last_seq": last_seq, "reason": reason},
        lambda kb: kb.revoke_key(public_key, last_seq, reason),
    )
    click.echo(f"device {knowledge.key_id(public_key)} revoked after seq {last_seq}")

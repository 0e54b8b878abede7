"""A site's home directory and its configuration file, `simnet.toml`.

<home>/site.key      the site root's Ed25519 key (mode 0600)
<home>/site.db       the knowledge store
<home>/trust.toml    the trust and activation policy (knowledge.TrustPolicy)
<home>/simnet.toml   this file: listen address, peers, gossip, limits, read rules
<home>/replay.db     the nonces of signed requests accepted in the last minute (see _auth)

[site]
name = "site-a"
listen = "127.0.0.1:7070"

[gossip]
interval_s = 5.0        # one sync with a random peer per interval
jitter = 0.2            # +-20% so sites do not synchronize their rounds
max_backoff_s = 120.0   # a failing peer is retried after interval * 2**failures, capped here

[limits]
max_body_bytes = 16777216
max_page = 1000         # envelopes per request and per answer
max_concurrent_syncs = 8 # pages read or applied at once; further requests wait their turn
                        # in a queue
max_queued_syncs = 256  # requests waiting for a turn; beyond it (or after queue_timeout_s)
                        # 503 + Retry-After
queue_timeout_s = 10.0  # how long a request waits for its turn
timeout_s = 30.0        # to receive a request's body (and each read of the answer to our own
                        # requests)
sync_deadline_s = 120.0 # one whole sync round with a peer (gossip, admin sync, `simnet sync`): a
                        # peer still answering then, however slowly its bytes trickle, is abandoned
                        # and the round counts as failed (backoff); other peers' rounds go on
                        # meanwhile
header_timeout_s = 10.0 # a connection's next request line and headers must arrive within this; and
                        # a client that stops taking in our answer for this long is disconnected
max_connections = 512   # open connections; above it the longest-idle one is closed (fewer if the
                        # process may open few files: see federation._http)
max_blob_store_bytes = 0 # all blobs in the store together, partly fetched ones too (0: no quota);
                        # a blob fetched or put past it is refused (knowledge.BlobQuotaError)

[tls]                   # serve HTTPS (both or neither); paths relative to the home
cert = "site.crt"       # PEM certificate chain
key = "site.key.pem"    # PEM private key
ca = "fleet-ca.pem"     # optional: trust anchors for https:// peers (default: the system's)

[[peers]]
name = "site-b"
url = "http://127.0.0.1:7071"
key = "<64 hex: site-b's root key>"

[[private]]             # maps only these readers may receive (feeds holding them are withheld)
maps = ["floor-3-secure"]
readers = ["<64 hex>"]
"""

from __future__ import annotations

import functools
import math
import os
import ssl
import tomllib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import tomli_w

from knowledge import IdentityError, KnowledgeBase, SiteHome, parse_public_key

from ._errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    _Section = TypeVar("_Section", bound=DataclassInstance)

CONFIG_FILE = "simnet.toml"
REPLAY_FILE = "replay.db"


@dataclass(frozen=True)
class PeerConfig:
    name: str
    url: str
    key: bytes


@dataclass(frozen=True)
class GossipConfig:
    interval_s: float = 5.0
    jitter: float = 0.2
    max_backoff_s: float = 120.0


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 16 << 20
    max_page: int = 1000
    max_concurrent_syncs: int = 8
    max_queued_syncs: int = 256
    queue_timeout_s: float = 10.0
    timeout_s: float = 30.0
    sync_deadline_s: float = 120.0
    header_timeout_s: float = 10.0
    max_connections: int = 512
    max_blob_store_bytes: int = 0


@dataclass(frozen=True)
class TlsConfig:
    """HTTPS for the server (`cert` and `key`) and the trust anchors for https:// peers (`ca`)."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    @property
    def serving(self) -> bool:
        return self.cert is not None

    def client_context(self) -> ssl.SSLContext:
        """How this site verifies the servers it calls: the system's anchors, plus `ca`, plus its
        own certificate (so its CLI can call its own server when that certificate is
        self-signed). Built once per set of files as they are on disk (loading anchors costs tens
        of milliseconds; gossip asks for every round), and again when one is replaced."""
        return _client_context(self.ca, self.cert, _stamp(self.ca), _stamp(self.cert))


def _stamp(path: Path | None) -> tuple[int, int] | None:
    """A file's (mtime, size), so a cached context is rebuilt when the file changes."""
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return None  # loading it says what is wrong
    return None if stat is None else (stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _client_context(
    ca: Path | None, cert: Path | None, *stamps: tuple[int, int] | None
) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for anchors in (ca, cert):
        if anchors is not None:
            try:
                context.load_verify_locations(cafile=anchors)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"[tls] cannot load {anchors}: {exc}") from None
    return context


@dataclass(frozen=True)
class PrivateMaps:
    maps: tuple[str, ...]
    readers: tuple[bytes, ...]


@dataclass
class SiteConfig:
    home: Path
    name: str = "site"
    listen: str = "127.0.0.1:7070"
    peers: list[PeerConfig] = field(default_factory=list)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    limits: ServerLimits = field(default_factory=ServerLimits)
    private: list[PrivateMaps] = field(default_factory=list)
    tls: TlsConfig = field(default_factory=TlsConfig)

    @property
    def key_path(self) -> Path:
        return SiteHome(self.home).key

    @property
    def store_path(self) -> Path:
        return SiteHome(self.home).store

    @property
    def policy_path(self) -> Path:
        return SiteHome(self.home).policy

    @property
    def replay_path(self) -> Path:
        return self.home / REPLAY_FILE

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    def peer(self, name_or_url: str) -> PeerConfig:
        for peer in self.peers:
            if name_or_url in (peer.name, peer.url):
                return peer
        raise ConfigError(f"no peer named {name_or_url!r}; known: {[p.name for p in self.peers]}")

    @classmethod
    def load(cls, home: str | os.PathLike[str]) -> SiteConfig:
        home = Path(home)
        path = home / CONFIG_FILE
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"no {CONFIG_FILE} in {home}; run `simnet init` there first"
            ) from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        try:
            return cls._from_dict(home, data)
        except (ConfigError, IdentityError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def _from_dict(cls, home: Path, data: dict[str, Any]) -> SiteConfig:
        _only(data, {"site", "gossip", "limits", "peers", "private", "tls"}, "top level")
        site = data.get("site", {})
        _only(site, {"name", "listen"}, "[site]")
        peers: list[PeerConfig] = []
        for i, p in enumerate(_tables(data, "peers")):
            _only(p, {"name", "url", "key"}, f"peers[{i}]")
            name, url = _text(p, "name", f"peers[{i}]"), _text(p, "url", f"peers[{i}]")
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(
                    f"peers[{i}].url {url!r} must start with http:// or https:// and name a host"
                )
            if any(peer.name == name for peer in peers):
                raise ConfigError(f"two peers are named {name!r}; peer names must be unique")
            peers.append(
                PeerConfig(name, url.rstrip("/"), parse_public_key(_text(p, "key", f"peers[{i}]")))
            )
        private = []
        for i, rule in enumerate(_tables(data, "private")):
            _only(rule, {"maps", "readers"}, f"private[{i}]")
            maps, readers = (
                _texts(rule, "maps", f"private[{i}]"),
                _texts(rule, "readers", f"private[{i}]"),
            )
            private.append(PrivateMaps(tuple(maps), tuple(parse_public_key(k) for k in readers)))
        config = cls(
            home,
            name=str(site.get("name", "site")),
            listen=str(site.get("listen", "127.0.0.1:7070")),
            peers=peers,
            gossip=_section(GossipConfig, data.get("gossip", {}), "[gossip]"),
            limits=_section(ServerLimits, data.get("limits", {}), "[limits]"),
            private=private,
            tls=_tls(home, data.get("tls", {})),
        )
        if config.gossip.jitter > 1:
            raise ConfigError(
                "[gossip] jitter is a fraction of the interval, at most 1, "
                f"not {config.gossip.jitter}"
            )
        for name in ("max_page", "max_concurrent_syncs", "max_body_bytes", "max_connections"):
            if getattr(config.limits, name) < 1:
                raise ConfigError(f"[limits] {name} must be at least 1")
        if config.limits.max_queued_syncs < 0:
            raise ConfigError("[limits] max_queued_syncs must be at least 0")
        for name in ("header_timeout_s", "sync_deadline_s", "queue_timeout_s"):
            if getattr(config.limits, name) <= 0:
                raise ConfigError(f"[limits] {name} must be more than 0 seconds")
        host, _, port = config.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(
                f"[site] listen {config.listen!r} must be host:port with a port in 0-65535"
            )
        return config

    def save(self) -> None:
        """Write simnet.toml atomically (write a temporary file, then rename)."""
        data = {
            "site": {"name": self.name, "listen": self.listen},
            "gossip": asdict(self.gossip),
            "limits": asdict(self.limits),
            "peers": [{"name": p.name, "url": p.url, "key": p.key.hex()} for p in self.peers],
            "private": [
                {"maps": list(r.maps), "readers": [k.hex() for k in r.readers]}
                for r in self.private
            ],
        }
        tls = {name: str(path) for name, path in asdict(self.tls).items() if path is not None}
        if tls:
            data["tls"] = tls
        tmp = self.home / (CONFIG_FILE + ".tmp")
        tmp.write_text(tomli_w.dumps(data))
        os.replace(tmp, self.home / CONFIG_FILE)


def _tls(home: Path, table: Any) -> TlsConfig:
    _only(table, {"cert", "key", "ca"}, "[tls]")
    paths = {name: home / _text(table, name, "[tls]") for name in table}
    if ("cert" in paths) != ("key" in paths):
        raise ConfigError("[tls] needs both cert and key to serve HTTPS (or neither)")
    for name, path in paths.items():
        if not path.is_file():
            raise ConfigError(f"[tls] {name} {path} is not a file")
    return TlsConfig(**paths)


def _only(table: Any, allowed: set[str], where: str) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(table) - allowed
    if unknown:
        raise ConfigError(
            f"unknown key(s) {sorted(unknown)} in {where}; allowed: {sorted(allowed)}"
        )


def _section(cls: type[_Section], table: Any, where: str) -> _Section:
    _only(table, {f.name for f in fields(cls)}, where)
    values = {}
    for key, value in table.items():
        default = getattr(cls(), key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value >= 0
            or math.isinf(value)
        ):
            raise ConfigError(f"{where} {key} must be a non-negative number, not {value!r}")
        if isinstance(default, int) and value != int(value):
            raise ConfigError(f"{where} {key} must be a whole number, not {value!r}")
        values[key] = type(default)(value)
    return cls(**values)


def _tables(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be an array of tables ([[{key}]])")
    return value


def _text(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key} must be a non-empty string, not {value!r}")
    return value


def _texts(table: dict[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key} must be a list of strings, not {value!r}")
    return value


def withheld_from(config: SiteConfig, kb: KnowledgeBase, caller: bytes) -> Withheld:
    """Feeds `caller` may not receive (by pull or push): those holding a private map it cannot
    read, but its own (a robot re-flashed with its key must get its feed back before it writes
    again, or it forks it)."""
    private = {m for rule in config.private if caller not in rule.readers for m in rule.maps}
    return Withheld(kb, frozenset(private), caller)


class Withheld:
    """The feeds one caller may not receive, judged each time an author is looked up, not once:
    `envelopes_since` looks under the lock it makes a page under, so a feed whose first write to a
    private map arrives while a round is under way (the peer slow to answer, another peer pushing
    meanwhile) is withheld from that page on, never sent in the rest of the round."""

    def __init__(self, kb: KnowledgeBase, maps: frozenset[str], caller: bytes) -> None:
        self.kb, self.maps, self.caller = kb, maps, caller

    def __contains__(self, author: object) -> bool:
        return (
            bool(self.maps)
            and isinstance(author, bytes)
            and author != self.caller
            and self.kb.writes_maps(author, self.maps)
        )

    def __iter__(self) -> Iterator[bytes]:
        """The feeds withheld now."""
        return iter(self.kb.authors_writing(self.maps) - {self.caller} if self.maps else ())

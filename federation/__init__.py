"""simnet federation: sites sync their knowledge bases peer to peer over HTTP.

    from federation import sync_with
    report = sync_with(kb, "http://site-b:7070", site_b_root_key)   # one anti-entropy round

Run a site with `simnet serve` (or `federation.serve(home)`); it gossips with its peers.

The client side (`sync_with`, signed requests, pages) needs only the core install. The server side
(`Site`, `create_app`, `serve`, `Gossip`, ...) needs the `server` extra
(`pip install 'simnet-fleet[server]'`): its names import Starlette and uvicorn on first use.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from knowledge import __version__ as __version__  # one distribution, one version

from ._auth import RequestVerifier, SimnetAuth
from ._blobs import PeerBlobSource, attach_site_peers
from ._client import SyncReport, async_sync_with, exchange, sync_with
from ._config import GossipConfig, PeerConfig, PrivateMaps, ServerLimits, SiteConfig
from ._errors import AuthError, BusyError, ConfigError, FederationError, PeerError, WireError
from ._wire import PAGE_TYPE, decode_page, encode_page

_SERVER = {
    "Gossip": "._gossip",
    "PeerState": "._gossip",
    "Site": "._site",
    "create_app": "._server",
    "open_site": "._serve",
    "running_server": "._status",
    "serve": "._serve",
}
"""The server side's names, by the module that defines them: imported on first use."""

if TYPE_CHECKING:
    from ._gossip import Gossip, PeerState
    from ._serve import open_site, serve
    from ._server import create_app
    from ._site import Site
    from ._status import running_server


def _import_on_first_use(name: str) -> object:
    """A name of the server side: import its module now (Starlette, uvicorn, prometheus-client)."""
    module = _SERVER.get(name)
    if module is None:
        raise AttributeError(f"module 'federation' has no attribute {name!r}")
    try:
        value = getattr(import_module(module, "federation"), name)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"federation.{name} needs the server extra ({exc.name} is missing): "
            "pip install 'simnet-fleet[server]'",
            name=exc.name,
        ) from exc
    globals()[name] = value  # later lookups find it without coming here
    return value


if not TYPE_CHECKING:  # type checkers see the names imported above, and no others
    __getattr__ = _import_on_first_use


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AuthError",
    "BusyError",
    "ConfigError",
    "FederationError",
    "Gossip",
    "GossipConfig",
    "PAGE_TYPE",
    "PeerBlobSource",
    "PeerConfig",
    "PeerError",
    "PeerState",
    "PrivateMaps",
    "RequestVerifier",
    "ServerLimits",
    "SimnetAuth",
    "Site",
    "SiteConfig",
    "SyncReport",
    "WireError",
    "async_sync_with",
    "attach_site_peers",
    "create_app",
    "decode_page",
    "encode_page",
    "exchange",
    "open_site",
    "running_server",
    "serve",
    "sync_with",
]

"""simnet federation: sites sync their knowledge bases peer to peer over HTTP.

    from federation import sync_with
    report = sync_with(kb, "http://site-b:7070", site_b_root_key)   # one anti-entropy round

Run a site with `simnet serve` (or `federation.serve(home)`); it gossips with its peers.
"""

from knowledge import __version__ as __version__  # one distribution, one version

from ._auth import RequestVerifier, SimnetAuth
from ._client import SyncReport, async_sync_with, exchange, sync_with
from ._config import GossipConfig, PeerConfig, PrivateMaps, ServerLimits, SiteConfig
from ._errors import AuthError, BusyError, ConfigError, FederationError, PeerError, WireError
from ._gossip import Gossip, PeerState
from ._serve import open_site, running_server, serve
from ._server import create_app
from ._site import Site
from ._wire import PAGE_TYPE, decode_page, encode_page

__all__ = [
    "AuthError",
    "BusyError",
    "ConfigError",
    "FederationError",
    "Gossip",
    "GossipConfig",
    "PAGE_TYPE",
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
    "create_app",
    "decode_page",
    "encode_page",
    "exchange",
    "open_site",
    "running_server",
    "serve",
    "sync_with",
]

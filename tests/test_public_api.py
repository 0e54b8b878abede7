"""The public surface of each package, pinned: a name added, renamed or dropped is a visible change.

Each package's `__all__` is sorted, every name in it resolves, and it is exactly the list below. A
change here is a change to the library's API: update the list and the README together.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC: dict[str, list[str]] = {
    "federation": [
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
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_sorted_and_pinned(package):
    module = importlib.import_module(package)
    assert module.__all__ == sorted(module.__all__)
    assert module.__all__ == PUBLIC[package]


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []

"""federation._config: simnet.toml round trips, and every malformed file is a ConfigError naming the
problem."""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from federation import ConfigError, GossipConfig, PeerConfig, PrivateMaps, ServerLimits, SiteConfig

KEY = "ab" * 32
KEY2 = "cd" * 32

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
keys = st.binary(min_size=32, max_size=32)
hosts = st.sampled_from(["127.0.0.1", "0.0.0.0", "[::1]", "site-b.example", "10.1.2.3"])
ports = st.integers(0, 65535)
urls = st.builds(
    lambda scheme, host, port, path: f"{scheme}://{host}:{port}{path}",
    st.sampled_from(["http", "https"]),
    hosts,
    st.integers(1, 65535),
    st.sampled_from(["", "/simnet", "/a/b"]),
)
finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
positive = st.integers(1, 2**40)


@st.composite
def configs(draw, home: Path) -> SiteConfig:
    peer_names = draw(st.lists(names, unique=True, max_size=4))
    return SiteConfig(
        home,
        name=draw(names),
        listen=f"{draw(hosts)}:{draw(ports)}",
        peers=[PeerConfig(n, draw(urls), draw(keys)) for n in peer_names],
        gossip=GossipConfig(
            interval_s=draw(finite.filter(lambda x: x > 0)),
            jitter=draw(st.floats(0, 1)),
            max_backoff_s=draw(finite),
        ),
        limits=ServerLimits(
            max_body_bytes=draw(positive),
            max_page=draw(positive),
            max_concurrent_syncs=draw(st.integers(1, 1000)),
            timeout_s=draw(finite.filter(bool)),
        ),
        private=[
            PrivateMaps(
                tuple(draw(st.lists(names, min_size=1, max_size=3))),
                tuple(draw(st.lists(keys, max_size=3))),
            )
            for _ in range(draw(st.integers(0, 2)))
        ],
    )


@given(st.data())
def test_save_load_round_trip(data):
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        config = data.draw(configs(home))
        config.save()
        assert SiteConfig.load(home) == config
        assert sorted(os.listdir(home)) == [
            "simnet.toml"
        ]  # atomic save leaves no temporary file behind


def test_defaults_round_trip(tmp_path):
    SiteConfig(tmp_path).save()
    loaded = SiteConfig.load(tmp_path)
    assert loaded == SiteConfig(tmp_path)
    assert (
        loaded.gossip == GossipConfig() and loaded.limits == ServerLimits() and loaded.peers == []
    )


def test_an_empty_file_is_the_defaults(tmp_path):
    (tmp_path / "simnet.toml").write_text("")
    assert SiteConfig.load(tmp_path) == SiteConfig(tmp_path)


def test_paths_and_listen_address(tmp_path):
    config = SiteConfig(tmp_path, listen="[::1]:7071")
    assert config.host_port == ("::1", 7071)
    assert SiteConfig(tmp_path, listen=":7072").host_port == ("127.0.0.1", 7072)
    assert (config.key_path, config.store_path, config.policy_path) == (
        tmp_path / "site.key",
        tmp_path / "site.db",
        tmp_path / "trust.toml",
    )


def test_peer_lookup_by_name_or_url(tmp_path):
    (tmp_path / "simnet.toml").write_text(
        f'[[peers]]\nname = "b"\nurl = "http://127.0.0.1:7071/"\nkey = "{KEY}"\n'
    )
    config = SiteConfig.load(tmp_path)
    assert config.peers == [
        PeerConfig("b", "http://127.0.0.1:7071", bytes.fromhex(KEY))
    ]  # trailing / dropped
    assert config.peer("b") is config.peer("http://127.0.0.1:7071") is config.peers[0]
    with pytest.raises(ConfigError, match=r"no peer named 'c'; known: \['b'\]"):
        config.peer("c")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"no simnet.toml in .*; run `simnet init` there first"):
        SiteConfig.load(tmp_path / "nowhere")


def test_invalid_toml_names_the_file(tmp_path):
    (tmp_path / "simnet.toml").write_text("[site\nname = 'x'\n")
    with pytest.raises(ConfigError, match=r"simnet\.toml: .*line 1"):
        SiteConfig.load(tmp_path)


def test_unreadable_file_is_a_config_error(tmp_path):
    (tmp_path / "simnet.toml").mkdir()  # a directory where the file should be
    with pytest.raises(ConfigError, match="simnet.toml"):
        SiteConfig.load(tmp_path)


PEER = f'name = "b"\nurl = "http://127.0.0.1:7071"\nkey = "{KEY}"\n'

MALFORMED = {
    # what simnet.toml says -> what the ConfigError must mention
    "unknown top-level table": (
        "[sites]\nname = 'x'\n",
        r"unknown key\(s\) \['sites'\] in top level",
    ),
    "unknown key in [site]": ("[site]\nport = 7070\n", r"unknown key\(s\) \['port'\] in \[site\]"),
    "site not a table": ("site = 5\n", r"\[site\] must be a table"),
    "unknown key in [gossip]": (
        "[gossip]\nintervall_s = 1.0\n",
        r"unknown key\(s\) \['intervall_s'\] in \[gossip\]",
    ),
    "gossip not a table": ("gossip = [1]\n", r"\[gossip\] must be a table"),
    "negative interval": (
        "[gossip]\ninterval_s = -1.0\n",
        r"\[gossip\] interval_s must be a non-negative number, not -1.0",
    ),
    "string interval": (
        '[gossip]\ninterval_s = "5"\n',
        r"\[gossip\] interval_s must be a non-negative number, not '5'",
    ),
    "boolean interval": (
        "[gossip]\ninterval_s = true\n",
        r"interval_s must be a non-negative number, not True",
    ),
    "NaN interval": ("[gossip]\ninterval_s = nan\n", r"interval_s"),
    "jitter over 1 (negative sleeps)": ("[gossip]\njitter = 3.0\n", r"jitter"),
    "unknown key in [limits]": (
        "[limits]\nmax_pages = 5\n",
        r"unknown key\(s\) \['max_pages'\] in \[limits\]",
    ),
    "negative limit": (
        "[limits]\nmax_page = -1\n",
        r"\[limits\] max_page must be a non-negative number, not -1",
    ),
    "limit as a string": (
        '[limits]\nmax_body_bytes = "16M"\n',
        r"max_body_bytes must be a non-negative number",
    ),
    "zero max_page (no page can ever pass)": ("[limits]\nmax_page = 0\n", r"max_page"),
    "zero max_concurrent_syncs (every sync busy)": (
        "[limits]\nmax_concurrent_syncs = 0\n",
        r"max_concurrent_syncs",
    ),
    "fractional count silently truncated": ("[limits]\nmax_page = 1.5\n", r"max_page"),
    "zero max_connections (no one can connect)": (
        "[limits]\nmax_connections = 0\n",
        r"max_connections must be at least 1",
    ),
    "zero header_timeout_s (every connection closed at once)": (
        "[limits]\nheader_timeout_s = 0\n",
        r"header_timeout_s must be more than 0 seconds",
    ),
    "zero sync_deadline_s (every round abandoned at once)": (
        "[limits]\nsync_deadline_s = 0\n",
        r"sync_deadline_s must be more than 0 seconds",
    ),
    "listen without a port": ('[site]\nlisten = "nonsense"\n', r"listen"),
    "listen port out of range": ('[site]\nlisten = "127.0.0.1:99999"\n', r"listen"),
    "peers not an array of tables": ("peers = 5\n", r"peers"),
    "peer not a table": ('peers = ["b"]\n', r"peers\[0\] must be a table"),
    "peer without url": (f'[[peers]]\nname = "b"\nkey = "{KEY}"\n', r"url"),
    "peer without key": ('[[peers]]\nname = "b"\nurl = "http://127.0.0.1:1"\n', r"key"),
    "peer without name": (f'[[peers]]\nurl = "http://127.0.0.1:1"\nkey = "{KEY}"\n', r"name"),
    "peer with unknown key": (
        f"[[peers]]\n{PEER}trust = 'all'\n",
        r"unknown key\(s\) \['trust'\] in peers\[0\]",
    ),
    "peer url not http": (
        f'[[peers]]\nname = "b"\nurl = "ftp://x"\nkey = "{KEY}"\n',
        r"peers\[0\]\.url 'ftp://x' must start with http:// or https://",
    ),
    "peer url without a host": (f'[[peers]]\nname = "b"\nurl = "http://"\nkey = "{KEY}"\n', r"url"),
    "peer key not hex": (
        '[[peers]]\nname = "b"\nurl = "http://x:1"\nkey = "zz"\n',
        r"public key 'zz' is not hex",
    ),
    "peer key too short": (
        '[[peers]]\nname = "b"\nurl = "http://x:1"\nkey = "abcd"\n',
        r"has 2 bytes, expected 32",
    ),
    "peer key not a string": ('[[peers]]\nname = "b"\nurl = "http://x:1"\nkey = 5\n', r"key"),
    "two peers with one name": (
        f"[[peers]]\n{PEER}[[peers]]\n{PEER.replace('7071', '7072')}",
        r"'b'",
    ),
    "private not an array of tables": ("private = 3\n", r"private"),
    "private rule with unknown key": (
        '[[private]]\nmaps = ["m"]\nreaders = []\nwriters = []\n',
        r"unknown key\(s\) \['writers'\] in private\[0\]",
    ),
    "private rule without readers": ('[[private]]\nmaps = ["m"]\n', r"readers"),
    "private reader not a key": (
        '[[private]]\nmaps = ["m"]\nreaders = ["nope"]\n',
        r"public key 'nope' is not hex",
    ),
    # a string where a list belongs: "floor-3" must not silently become the maps f, l, o, o, r, -, 3
    "private maps as one string": (
        f'[[private]]\nmaps = "floor-3"\nreaders = ["{KEY}"]\n',
        r"maps",
    ),
}


@pytest.mark.parametrize("text, message", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_config_is_a_config_error_naming_the_problem(tmp_path, text, message):
    home = tmp_path / "home"
    home.mkdir()
    (home / "simnet.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        SiteConfig.load(home)
    text = str(caught.value)
    assert text.startswith(str(home / "simnet.toml") + ": "), text
    assert re.search(message, text.removeprefix(str(home / "simnet.toml"))), text


def test_numbers_of_either_toml_type_are_accepted_and_typed(tmp_path):
    (tmp_path / "simnet.toml").write_text(
        "[gossip]\ninterval_s = 2\n[limits]\ntimeout_s = 5\nmax_page = 10\n"
    )
    config = SiteConfig.load(tmp_path)
    assert config.gossip.interval_s == 2.0 and isinstance(config.gossip.interval_s, float)
    assert config.limits.timeout_s == 5.0 and isinstance(config.limits.timeout_s, float)
    assert config.limits.max_page == 10 and isinstance(config.limits.max_page, int)


def test_saved_file_is_what_the_docstring_describes(tmp_path):
    config = SiteConfig(
        tmp_path,
        name="site-a",
        listen="127.0.0.1:7070",
        peers=[PeerConfig("site-b", "http://127.0.0.1:7071", bytes.fromhex(KEY))],
        private=[PrivateMaps(("floor-3-secure",), (bytes.fromhex(KEY2),))],
    )
    config.save()
    data = tomllib.loads((tmp_path / "simnet.toml").read_text())
    assert data["site"] == {"name": "site-a", "listen": "127.0.0.1:7070"}
    assert data["peers"] == [{"name": "site-b", "url": "http://127.0.0.1:7071", "key": KEY}]
    assert data["private"] == [{"maps": ["floor-3-secure"], "readers": [KEY2]}]
    assert set(data["gossip"]) == {"interval_s", "jitter", "max_backoff_s"}
    assert set(data["limits"]) == {
        "max_body_bytes",
        "max_page",
        "max_concurrent_syncs",
        "max_queued_syncs",
        "queue_timeout_s",
        "timeout_s",
        "header_timeout_s",
        "max_connections",
        "sync_deadline_s",
        "max_blob_store_bytes",
    }

"""A site's home directory: where its store, root key and trust policy live, by fixed names.

The CLI, the federation server and the simulator's commands all open a site from its directory;
this is the one place that knows the file names.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from . import _kb
from ._errors import StoreError
from ._identity import Identity


class SiteHome:
    """A site's directory (``simnet --home``): ``site.db``, ``site.key`` and ``trust.toml``.

    Other packages keep their own files here too (federation's ``simnet.toml``, sim's worlds).

    `blob_setup` names (``"module:attr"``) functions called as ``f(home, kb)`` before a knowledge
    base opened here first stores or fetches a blob (see `Blobs.defer_setup`): how the top of the
    program lets any command fetch the blobs it lacks from the site's peers (the `simnet` command
    names federation's) while `knowledge` imports neither them nor the commands. `services` names
    the same way the background services a server may run (``f(home, kb, stop)``: `simnet serve
    --validate` runs sim's validator), so the server runs them without importing the simulator.
    """

    STORE_FILE = "site.db"
    KEY_FILE = "site.key"
    POLICY_FILE = "trust.toml"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        blob_setup: Iterable[str] = (),
        services: Mapping[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.blob_setup = tuple(blob_setup)
        self.services = dict(services or {})

    def service(self, name: str) -> Callable[[SiteHome, _kb.KnowledgeBase, threading.Event], None]:
        """The background service named `name`, imported now; KeyError if none is named so."""
        if name not in self.services:
            raise KeyError(f"no service {name!r}; services: {sorted(self.services)}")
        return _resolve(self.services[name])  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"SiteHome({str(self.path)!r})"

    @property
    def store(self) -> Path:
        return self.path / self.STORE_FILE

    @property
    def key(self) -> Path:
        return self.path / self.KEY_FILE

    @property
    def policy(self) -> Path:
        return self.path / self.POLICY_FILE

    def open_readonly(self) -> _kb.KnowledgeBase:
        """The store, read-only, under the site's trust policy as the file says now.

        A reader never needs the key and never blocks a running server; it judges what is active by
        the same policy the site does (a broken policy file is a PolicyError here too).
        """
        self._need_store()
        return self._attach(_kb.open(self.store, policy=self._policy_file()))

    def open_writer(self) -> _kb.KnowledgeBase:
        """The store opened as the site's key under its policy; StoreLockedError if a server holds
        it."""
        self._need_store()
        identity = Identity.load(self.key)
        return self._attach(_kb.open(self.store, identity, policy=self._policy_file()))

    def _attach(self, kb: _kb.KnowledgeBase) -> _kb.KnowledgeBase:
        for name in self.blob_setup:
            kb.blobs.defer_setup(functools.partial(self._set_up, name, kb))
        return kb

    def _set_up(self, name: str, kb: _kb.KnowledgeBase) -> None:
        _resolve(name)(self, kb)

    def _policy_file(self) -> Path | None:
        return self.policy if self.policy.exists() else None

    def _need_store(self) -> None:
        if not self.store.exists():
            raise StoreError(
                f"no knowledge base in {self.path}; run `simnet init` there, or pass --home"
            )


def _resolve(name: str) -> Callable[[SiteHome, _kb.KnowledgeBase], object]:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)

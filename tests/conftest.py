"""Shared fixtures: identities and knowledge bases on real SQLite files."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import knowledge

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "quick",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("SIMNET_HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def identity() -> knowledge.Identity:
    return knowledge.Identity.generate()


@pytest.fixture
def open_kb(tmp_path):
    """open_kb(name, identity=None, policy=None) -> KnowledgeBase on a real file; all closed at
    teardown."""
    opened = []

    def _open(name: str = "site", identity: knowledge.Identity | None = None, **kwargs):
        kb = knowledge.open(
            tmp_path / f"{name}.db", identity or knowledge.Identity.generate(), **kwargs
        )
        opened.append(kb)
        return kb

    yield _open
    for kb in opened:
        kb.close()

"""Shared fixtures: identities and knowledge bases on real SQLite files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Where PYTHONDONTWRITEBYTECODE is set, every process the suite starts (the xdist workers and the
# many `simnet` commands, servers and child processes of the tests) compiled every module it
# imported (torch, numpy, starlette, ...) from source again: a fifth of the suite's CPU time. The
# suite keeps compiled bytecode in .cache/pycache instead (ignored by git, nothing written beside
# the sources); a PYTHONPYCACHEPREFIX set by the caller is kept.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(Path(__file__).parents[1] / ".cache" / "pycache")
    sys.dont_write_bytecode = False
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

# The suite runs on several xdist workers (pyproject's addopts): one OpenMP/BLAS thread (torch,
# faiss, numpy) in each worker and in every process it starts. Their default, a thread per core in
# every process, spins threads against each other once the cores are busy: tests/sim/test_distill.py
# took 390 s instead of 26 s on a loaded machine. Set before anything loads those libraries; an
# OMP_NUM_THREADS set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import knowledge  # noqa: E402

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


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): a worker per core and one more, as many tests spend their
    time waiting for processes they started (servers, `simnet` commands) rather than computing."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 1


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """`--dist loadgroup` (pyproject's addopts) runs the tests of one xdist group on one worker:

    - "ray": every test on Ray (those using `ray_session`; a parametrized backend marks its "ray"
      case itself), so one local Ray serves them all instead of one per worker;
    - a module's tests that share a module-scoped fixture (a `simnet serve` site, a peer process, a
      recorded evaluation), so it is built once rather than on every worker.
    """
    for item in items:  # before xdist reads the groups
        if item.get_closest_marker("xdist_group"):
            continue
        if "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    result = yield
    if getattr(config.option, "loadgroup", False):  # set on xdist workers under loadgroup
        _tell_xdist_the_groups(items)
    return result


def _tell_xdist_the_groups(items: list[pytest.Item]) -> None:
    """pytest-xdist 3.8 tells its scheduler a test's group by appending "@group" to the test's node
    id through `item._nodeid`, which pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386):
    `--dist loadgroup` then silently groups nothing. Append it where pytest 9.2 keeps the id."""
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # pytest's record of the fixtures a test uses
    if info is None:
        return False
    return any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs)


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

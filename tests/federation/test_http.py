"""federation._http: the rate-limited log filter and the connection cap derived from the open-file
limit.

(The guarded connection protocol itself is attacked from outside in
tests/redteam/test_connections.py.)
"""

from __future__ import annotations

import logging
import resource

import pytest

from federation import _http
from federation._http import IN_FLIGHT, RESERVED_FILES, RateLimited, connection_cap


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def records(monkeypatch):
    """(logger, what passed, clock): a logger with a RateLimited(10 s) filter on a test clock."""
    clock = Clock()
    monkeypatch.setattr(_http, "time", clock)
    passed: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            passed.append(record)

    logger = logging.getLogger("federation.test-rate-limited")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addFilter(RateLimited(10.0))
    logger.addHandler(Keep())
    yield logger, passed, clock
    logger.filters.clear()
    logger.handlers.clear()


def boom() -> BaseException:
    try:
        raise OSError(24, "Too many open files")
    except OSError as exc:
        return exc


def test_the_first_of_a_kind_passes_whole_then_one_per_interval_with_a_count(records):
    logger, passed, clock = records
    for _ in range(1000):
        logger.error("accept failed\nsocket: <fd=7>", exc_info=boom())
    assert len(passed) == 1 and passed[0].exc_info is not None  # the first keeps its traceback
    clock.now += 10
    logger.error("accept failed\nsocket: <fd=7>", exc_info=boom())
    assert len(passed) == 2
    second = passed[1]
    assert second.exc_info is None and second.exc_text is None
    assert second.getMessage() == (
        "accept failed (OSError: [Errno 24] Too many open files) "
        "[and 999 more like it in the last 10 s]"
    )


def test_kinds_are_told_apart_by_template_level_and_subject(records):
    logger, passed, clock = records
    for _ in range(5):
        logger.warning("sync with %s failed (%s)", "hostile", "garbage")
        logger.warning("sync with %s failed (%s)", "honest", "timeout")
        logger.info("sync with %s failed (%s)", "hostile", "garbage")
        logger.warning("closed %d connections", 7)
    assert [r.getMessage() for r in passed] == [
        "sync with hostile failed (garbage)",
        "sync with honest failed (timeout)",
        "sync with hostile failed (garbage)",
        "closed 7 connections",
    ]
    clock.now += 11
    logger.warning("closed %d connections", 9)
    assert passed[-1].getMessage() == "closed 9 connections [and 4 more like it in the last 10 s]"


def test_too_many_kinds_start_over_rather_than_grow(records):
    logger, passed, _ = records
    for i in range(RateLimited.MAX_KINDS * 3):
        logger.warning(f"distinct message {i}")
    assert len(passed) == RateLimited.MAX_KINDS * 3
    assert len(logger.filters[0]._kinds) <= RateLimited.MAX_KINDS


@pytest.mark.parametrize(
    "soft, limit, cap",
    [
        (1024, 512, 512),  # room enough: the configured limit
        (448, 512, 448 - IN_FLIGHT - RESERVED_FILES),  # a small open-file limit lowers it
        (100, 512, 1),  # never below one
        (resource.RLIM_INFINITY, 512, 512),
    ],
)
def test_the_connection_cap_fits_the_open_file_limit(monkeypatch, soft, limit, cap):
    monkeypatch.setattr(
        _http.resource, "getrlimit", lambda which: (soft, soft)
    )  # soft = hard: cannot be raised
    assert connection_cap(limit) == cap


def test_the_open_file_limit_is_raised_to_the_hard_limit_first(monkeypatch):
    limits = {"soft": 1024, "hard": 4096}
    monkeypatch.setattr(_http.resource, "getrlimit", lambda which: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(
        _http.resource, "setrlimit", lambda which, pair: limits.update(soft=pair[0])
    )
    assert connection_cap(512) == 512 and limits["soft"] == 4096
    limits.update(soft=448, hard=448)
    assert connection_cap(512) == 448 - IN_FLIGHT - RESERVED_FILES

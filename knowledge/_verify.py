"""Envelope signatures verified ahead, on every core, while ingest works through a page in order.

Ed25519 verification in `cryptography` releases the GIL, so a thread pool verifies a page's
signatures while the ingesting thread checks and applies the envelopes before them; the ingesting
thread takes each verdict when it reaches that envelope (and verifies a batch itself if no worker
has started it yet, rather than wait). Ingest chooses what is verified ahead: only envelopes it
would verify anyway, so a page of strangers' or duplicate envelopes costs no more than before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ._envelope import Envelope

_BATCH = 8  # envelopes per task: one task's overhead is about one verification's time

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process it was made in, the pool)
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The pool of this process (a forked child makes its own: it inherits no threads)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            workers = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="knowledge-verify")
            _pool = (os.getpid(), workers)
        return _pool[1]


def _verify_all(envelopes: Sequence[Envelope]) -> list[bool]:
    return [env.signature_valid() for env in envelopes]


class _Batch:
    __slots__ = ("future", "envelopes", "verdicts")

    def __init__(self, envelopes: Sequence[Envelope], future: Future[list[bool]]) -> None:
        self.envelopes, self.future = envelopes, future
        self.verdicts: list[bool] | None = None

    def result(self) -> list[bool]:
        if self.verdicts is None:
            if self.future.cancel():  # no worker has started it: verify it here, not wait
                self.verdicts = _verify_all(self.envelopes)
            else:
                self.verdicts = self.future.result()
        return self.verdicts


class Verdicts:
    """Signature verdicts of `envelopes`, computed ahead; `valid` answers for any envelope."""

    def __init__(self, envelopes: Sequence[Envelope]) -> None:
        self._ahead: dict[bytes, tuple[_Batch, int]] = {}
        if len(envelopes) < 2:
            return  # nothing to overlap
        pool = _executor()
        for start in range(0, len(envelopes), _BATCH):
            chunk = envelopes[start : start + _BATCH]
            batch = _Batch(chunk, pool.submit(_verify_all, chunk))
            for i, env in enumerate(chunk):
                self._ahead[env.hash] = (batch, i)

    def valid(self, env: Envelope) -> bool:
        """Whether `env`'s signature verifies (as `env.signature_valid()`)."""
        found = self._ahead.pop(env.hash, None)
        if found is None:
            return env.signature_valid()
        batch, i = found
        return batch.result()[i]

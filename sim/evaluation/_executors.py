"""Executors: where work runs, and nothing about what it is.

A `Worker` holds one object, built where the worker runs by a picklable factory (a shard host, a
wave worker), and runs its methods: `inline` in this process, `process` in a worker process forked
from a preloaded forkserver, or `ray` in a Ray actor. A `Pool` holds `workers` such objects and maps
one of their methods over items, results in item order. Every call ships a whole unit of work and
returns its result; a worker that dies raises `WorkerLost`, and its owner decides what to rebuild.
Callers (evaluation, the world's shard hosts) pass the factory: this module imports neither.
"""

from __future__ import annotations

import abc
import concurrent.futures
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import _ray

BACKENDS = ("process", "ray", "inline")


class WorkerLost(Exception):
    """The worker died during a call (internal: its owner rebuilds it)."""


def raising(error: BaseException) -> Callable[[], Any]:
    """A waiter for a call that failed before it could be waited on: it raises the call's error."""

    def wait() -> Any:
        raise error

    return wait


class Worker(abc.ABC):
    """One object somewhere (this process, a worker process, a Ray actor); `call` runs one of its
    methods and returns a function that waits for the result."""

    @property
    def pid(self) -> int | None:
        """The worker's process id (its start is awaited here, so workers start in parallel)."""
        return self._pid()

    @abc.abstractmethod
    def _pid(self) -> int | None: ...

    @abc.abstractmethod
    def call(self, method: str, *args: Any) -> Callable[[], Any]: ...

    @abc.abstractmethod
    def restart(self) -> None:
        """A new worker with a new object from the factory: what the old one held is gone."""

    @abc.abstractmethod
    def close(self) -> None: ...


class InlineWorker(Worker):
    """The object in this process: no isolation, no parallelism, no transport."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self.held = factory()

    def _pid(self) -> int:
        return os.getpid()

    def call(self, method: str, *args: Any) -> Callable[[], Any]:
        """Runs the method now, but raises its error on wait, as the other workers do: the owner's
        cleanup after a failed call runs there."""
        try:
            result = getattr(self.held, method)(*args)
        except Exception as exc:  # noqa: BLE001 - raised by the waiter
            return raising(exc)
        return lambda: result

    def restart(self) -> None:
        self.held = self._factory()

    def close(self) -> None:
        self.held = None


class ProcessWorker(Worker):
    """The object in a process of its own (a one-process pool from the preloaded forkserver)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._start()

    def _start(self) -> None:
        self._pool = process_pool(1, _hold, (self._factory, ()))
        self._started = self._pool.submit(os.getpid)

    def _pid(self) -> int:
        return self._started.result()

    def call(self, method: str, *args: Any) -> Callable[[], Any]:
        try:
            future = self._pool.submit(_call_held, method, args)
        except BrokenProcessPool as exc:
            raise WorkerLost(str(exc)) from exc

        def result() -> Any:
            try:
                return future.result()
            except BrokenProcessPool as exc:
                raise WorkerLost(str(exc)) from exc

        return result

    def restart(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._start()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayWorker(Worker):
    """The object in a Ray actor from the session's pool."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._lost = _ray.lost_errors()
        self._start()

    def _start(self) -> None:
        self.actor = _ray.acquire()
        self._wait(
            self.actor.build.remote(self._factory, ())
        )  # a failed build raises its own error
        self._started = self.actor.pid.remote()

    def _pid(self) -> int:
        return self._wait(self._started)

    def _wait(self, ref: Any) -> Any:
        try:
            return _ray.ray_module().get(ref)
        except self._lost as exc:
            raise WorkerLost(str(exc)) from exc

    def call(self, method: str, *args: Any) -> Callable[[], Any]:
        ref = self.actor.call.remote(method, args)
        return lambda: self._wait(ref)

    def restart(self) -> None:
        self._start()

    def close(self) -> None:
        _ray.release(self.actor)


def make_worker(backend: str, factory: Callable[[], Any]) -> Worker:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    kinds: dict[str, Callable[[Callable[[], Any]], Worker]] = {
        "process": ProcessWorker,
        "ray": RayWorker,
        "inline": InlineWorker,
    }
    return kinds[backend](factory)


# ---- pools: `workers` copies of one object, a method mapped over items ----


class Pool(abc.ABC):
    """`workers` objects `factory(*args)`, each built once where it runs; `map` calls a method of
    theirs on each item, results in item order. A context manager: leaving it frees the workers."""

    @abc.abstractmethod
    def map(self, method: str, items: list) -> Iterable: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessPool(Pool):
    """Worker processes from the preloaded forkserver."""

    def __init__(self, workers: int, factory: Callable[..., Any], args: tuple) -> None:
        self._processes = process_pool(workers, _hold, (factory, args))

    def map(self, method: str, items: list) -> Iterable:
        return self._processes.map(_call_one, [method] * len(items), items)

    def close(self) -> None:
        self._processes.shutdown()


class RayPool(Pool):
    """Ray actors from the session's pool, given back when closed."""

    def __init__(self, workers: int, factory: Callable[..., Any], args: tuple) -> None:
        ray = _ray.ray_module()
        from ray.util import ActorPool

        self._actors = [_ray.acquire() for _ in range(workers)]
        try:
            ray.get([a.build.remote(factory, args) for a in self._actors])
        except BaseException:
            self.close()
            raise
        self._pool = ActorPool(self._actors)

    def map(self, method: str, items: list) -> Iterable:
        return self._pool.map(lambda actor, item: actor.call.remote(method, (item,)), items)

    def close(self) -> None:
        for actor in self._actors:
            _ray.release(actor)


def make_pool(backend: str, workers: int, factory: Callable[..., Any], args: tuple) -> Pool:
    if backend not in ("process", "ray"):
        raise ValueError(f"a pool's backend is 'process' or 'ray', got {backend!r}")
    return (RayPool if backend == "ray" else ProcessPool)(workers, factory, args)


_HELD: Any = None  # in a worker process: the object it holds


def _hold(factory: Callable[..., Any], args: tuple) -> None:
    global _HELD
    _HELD = factory(*args)


def _call_held(method: str, args: tuple) -> Any:
    return getattr(_HELD, method)(*args)


def _call_one(method: str, item: Any) -> Any:
    return getattr(_HELD, method)(item)


# ---- worker processes ----


def process_pool(
    workers: int, initializer: Callable[..., None] | None = None, initargs: tuple = ()
) -> concurrent.futures.ProcessPoolExecutor:
    """Worker processes (forked from the preloaded forkserver where there is one) that exit when
    this process dies. (A pool's workers otherwise wait on its queue forever once their parent is
    killed, each holding torch and MuJoCo.)"""
    return concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=_context(), initializer=_start_worker, initargs=(initializer, initargs)
    )


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(
            target=_exit_with, args=(parent,), name="exit with parent", daemon=True
        ).start()
    if initializer is not None:
        initializer(*initargs)


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    parent.join()  # returns when the parent process has exited, however it ended
    os._exit(1)


def _context() -> multiprocessing.context.BaseContext:
    """forkserver with `sim` and its torch side preloaded: workers fork from a clean,
    single-threaded process that has imported torch and mujoco once, instead of each paying for
    those imports (spawn). `import sim` alone does not import torch; a worker runs policies."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["sim", "sim._torch_mlp"])
    return context

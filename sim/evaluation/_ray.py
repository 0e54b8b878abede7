"""The optional Ray backend: a pool of generic actors for the executors.

An actor imports MuJoCo once, and torch once it runs a policy (seconds), so actors are kept in a
pool for the life of the Ray session and reused across worlds and evaluations; one that dies is
dropped. An actor holds one object (a shard host, a wave worker) built from a factory it is sent,
and runs its methods: calls ship whole units of work, an `advance` of a shard or a wave of branches,
never one control step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .._errors import BackendError

_LOCK = threading.Lock()
_IDLE: list[Any] = []
_ACTOR_CLASS: Any = None
_SESSION: str | None = None


def ray_module() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise BackendError(
            "the Ray backend needs the ray extra: pip install 'simnet-fleet[ray]'"
        ) from exc
    return ray


def use_ray(address: str | None = None, **init: Any) -> None:
    """Connect to a Ray cluster at `address` ("auto", "ray://host:10001", ...), or start a local one
    (keyword arguments go to `ray.init`, e.g. num_cpus=2); a session already started is kept."""
    ray = ray_module()
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, include_dashboard=False, **init)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BackendError(
            f"cannot start or reach Ray at {address or 'a local node'}: {exc}"
        ) from exc


class Actor:
    """One Ray actor: it holds whatever object it was last asked to build and runs its methods."""

    def __init__(self) -> None:
        self.held: Any = None

    def pid(self) -> int:
        return os.getpid()

    def build(self, factory: Callable[..., Any], args: tuple) -> None:
        self.held = factory(*args)

    def call(self, method: str, args: tuple) -> Any:
        return getattr(self.held, method)(*args)

    def clear(self) -> None:
        self.held = None


def acquire() -> Any:
    """An idle actor of the pool, or a new one (Ray places it; it reserves no CPU, as a process
    would not)."""
    global _ACTOR_CLASS, _SESSION
    ray = ray_module()
    use_ray()
    with _LOCK:
        context = ray.get_runtime_context()
        session = f"{context.get_node_id()}/{context.get_job_id()}"
        if session != _SESSION:  # a new Ray session: the pooled actors belonged to the old one
            _IDLE.clear()
            _ACTOR_CLASS, _SESSION = ray.remote(num_cpus=0, max_restarts=0)(Actor), session
        if _IDLE:
            return _IDLE.pop()
    return _ACTOR_CLASS.options(scheduling_strategy="SPREAD").remote()


def release(actor: Any) -> None:
    """Give an actor back to the pool, its object dropped; a dead one is dropped instead."""
    ray = ray_module()
    try:
        ray.get(actor.clear.remote())
    except ray.exceptions.RayActorError:
        return
    with _LOCK:
        _IDLE.append(actor)


def lost_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean an actor died during a call."""
    return (ray_module().exceptions.RayActorError,)

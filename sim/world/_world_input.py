"""What a world accepts from its callers, checked before anything is logged: a log is replayed for
as long as the world lives, so an event that cannot apply, or a tick that is not one, would fail
every replay or hold its shard back. (What can only be known when an event applies, a mass scaled
below zero, say, is rejected by the engine, the same way on every replay.)"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import HistoryError, MutationError
from .._numbers import finite_floats
from .._patches import OPS, Mutation
from .._templates import Template
from ._entities import entity_of

MAX_TICK = 2**62  # ticks are SQLite integers: far beyond any history, and still room to add to
# ticks an event may be scheduled past its shard's head (a typo must not hold a shard back)
MAX_AHEAD = 1_000_000


def as_int(value: Any) -> int | None:
    """An integer given by a caller (numpy's too) as an int; None for anything else, bools
    included."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_tick(name: str, tick: object) -> int:
    """A tick given by a caller, as an int in 0..MAX_TICK, or HistoryError. (A float tick, once
    logged, would fail every advance of its shard.)"""
    value = as_int(tick)
    if value is None or not 0 <= value <= MAX_TICK:
        raise HistoryError(f"{name} must be an integer tick in 0..{MAX_TICK}, got {tick!r}")
    return value


def check_text(name: str, text: object) -> str:
    """A label or provenance given by a caller: a str that UTF-8 can store (no lone surrogates)."""
    if isinstance(text, str) and text.isascii():  # the usual case, checked in constant time
        return text
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string, got {text!r}")
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be valid Unicode text: {exc}") from None
    return text


def check_steps(steps: object) -> int:
    """A number of ticks to advance, as an int, at least 0."""
    value = as_int(steps)
    if value is None or value < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    return value


def mutate_event(
    template: Template, tick: int, mutations: Sequence[Mutation], provenance: str
) -> tuple:
    """A "mutate" event as the store appends it, each mutation checked against `template` first; its
    entity is the one all its mutations address, if any."""
    changes, entities = [], set()
    for mutation in mutations:
        changes.append(check_mutation(template, mutation))
        entities.add(entity_of(mutation.target))
    return (
        tick,
        entities.pop() if len(entities) == 1 else "",
        "mutate",
        {"mutations": changes},
        provenance,
    )


def check_mutation(template: Template, mutation: Mutation) -> dict:
    """What can be checked before a mutation is logged (its target, op, width, and a `set`'s
    values); returns it as the log holds it. Nothing that fails here may reach a log: it would fail
    every replay."""
    if not isinstance(mutation, Mutation) or not isinstance(mutation.target, str):
        raise MutationError(
            str(mutation)[:60], "an event's mutations are sim.Mutation objects with a str target"
        )
    target, op, value = mutation.target, mutation.op, mutation.value
    slot = template.slot(target)
    if op not in OPS:
        raise MutationError(target, f"op must be one of {OPS}, got {op!r}")
    values = finite_floats(value)
    if values is None:
        raise MutationError(target, f"values must be a sequence of finite numbers, got {value!r}")
    if len(values) != 1 and len(values) != slot.size:
        raise MutationError(target, f"needs 1 or {slot.size} values, got {len(values)}")
    if slot.quaternion and (
        op != "set" or len(values) != slot.size or abs(np.linalg.norm(values[-4:]) - 1.0) > 1e-9
    ):
        raise MutationError(
            target, f"holds a quaternion: only 'set' with {slot.size} values of unit norm"
        )
    if (
        op == "set"
        and slot.domain != "any"
        and (min(values) <= 0 if slot.domain == "positive" else min(values) < 0)
    ):
        raise MutationError(target, f"must stay {'> 0' if slot.domain == 'positive' else '>= 0'}")
    return {
        "op": op,
        "target": target,
        "value": values,
    }  # floats, as the engine and the file hold them

"""Persistent, sharded worlds: a site's digital twin, its store (SQLite plus a redo file), the
engines that step its shards, the workers that host them (inline, worker processes, Ray actors),
branches, replays, migrations, and the `simnet world` commands."""

from ._branches import Branch, Intervention, Migration, Replay
from ._entities import Entity
from ._segments import Event
from ._world import World

__all__ = ["Branch", "Entity", "Event", "Intervention", "Migration", "Replay", "World"]

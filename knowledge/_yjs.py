"""A structural reader for Yjs v1 updates: which client ids an update writes, references and deletes.

`pycrdt.get_state(update)` is not enough for this: it reports the state an update reaches when applied
to an empty document, so an incremental update (whose structs start past clock 0) shows no clients at
all, a forged one included. This reader walks the update's bytes as the Yjs v1 format lays them out
(struct groups per client, then the delete set) without applying anything, and fails on any structure
it cannot account for — so it doubles as a strict pre-check before a byte reaches pycrdt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_GC, _DELETED, _JSON, _BINARY, _STRING, _EMBED, _FORMAT, _TYPE, _ANY, _DOC, _SKIP = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
_XML_ELEMENT, _XML_HOOK = 3, 5  # type refs followed by a name
# What a map of JSON strings ever holds: values (Any), deleted items, and their garbage-collected forms.
MAP_CONTENTS = frozenset({_GC, _DELETED, _ANY, _SKIP})
_MAX_DEPTH = 64


class MalformedUpdate(ValueError):
    """The bytes are not a well-formed Yjs v1 update."""


@dataclass
class ParsedUpdate:
    """What a Yjs v1 update touches, read from its bytes alone.

    `writes`: clients whose structs it carries. `references`: (client, clock) ids its items point at
    (left and right origins, parent items). `deletes`: (client, clock, length) ranges it deletes.
    `root_inserts`: (root name, client, clock, length) of items placed directly in a root type with no
    origins, i.e. map entries written for the first time.
    """

    writes: set[int] = field(default_factory=set)
    contents: set[int] = field(default_factory=set)  # the struct content kinds present (GC=0 ... SKIP=10)
    roots: set[str] = field(default_factory=set)  # root types it names
    references: list[tuple[int, int]] = field(default_factory=list)
    deletes: list[tuple[int, int, int]] = field(default_factory=list)
    root_inserts: list[tuple[str, int, int, int]] = field(default_factory=list)

    def clients(self) -> set[int]:
        return self.writes | {c for c, _ in self.references} | {c for c, _, _ in self.deletes}


def _uint(data: bytes, pos: int) -> tuple[int, int]:
    """A lib0 var-uint at `pos`; returns (value, next position). Fast path for one-byte values."""
    try:
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift = byte & 0x7F, 7
        while True:
            pos += 1
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + 1
            shift += 7
            if shift > 63:
                raise MalformedUpdate(f"variable-length integer too long at byte {pos}")
    except IndexError:
        raise MalformedUpdate(f"update ends early at byte {pos}") from None


def _skip(data: bytes, pos: int, n: int) -> int:
    end = pos + n
    if end > len(data):
        raise MalformedUpdate(f"a length of {n} at byte {pos} runs past the end of the update")
    return end


def _buffer(data: bytes, pos: int) -> int:
    """Skip a var-length byte buffer (also a var-string)."""
    n, pos = _uint(data, pos)
    return _skip(data, pos, n)


def _any(data: bytes, pos: int, depth: int = 0) -> int:
    if depth > _MAX_DEPTH:
        raise MalformedUpdate("values nested too deeply")
    if pos >= len(data):
        raise MalformedUpdate(f"update ends early at byte {pos}")
    tag = data[pos]
    pos += 1
    if tag in (127, 126, 121, 120):  # undefined, null, false, true
        return pos
    if tag == 125:  # var-int
        return _uint(data, pos)[1]
    if tag == 124:
        return _skip(data, pos, 4)
    if tag in (123, 122):
        return _skip(data, pos, 8)
    if tag in (119, 116):  # string, bytes
        return _buffer(data, pos)
    if tag == 118:  # object
        n, pos = _uint(data, pos)
        for _ in range(n):
            pos = _any(data, _buffer(data, pos), depth + 1)
        return pos
    if tag == 117:  # array
        n, pos = _uint(data, pos)
        for _ in range(n):
            pos = _any(data, pos, depth + 1)
        return pos
    raise MalformedUpdate(f"unknown value tag {tag} at byte {pos - 1}")


def parse_update(update: bytes) -> ParsedUpdate:
    """Walk a Yjs v1 update; MalformedUpdate if it is not one, down to its last byte."""
    data, found = bytes(update), ParsedUpdate()
    if not data:
        raise MalformedUpdate("empty update")
    groups, pos = _uint(data, 0)
    for _ in range(groups):
        structs, pos = _uint(data, pos)
        client, pos = _uint(data, pos)
        clock, pos = _uint(data, pos)
        found.writes.add(client)
        for _ in range(structs):
            pos, length = _struct(data, pos, client, clock, found)
            clock += length
    clients, pos = _uint(data, pos)
    for _ in range(clients):
        client, pos = _uint(data, pos)
        ranges, pos = _uint(data, pos)
        for _ in range(ranges):
            clock, pos = _uint(data, pos)
            length, pos = _uint(data, pos)
            found.deletes.append((client, clock, length))
    if pos != len(data):
        raise MalformedUpdate(f"{len(data) - pos} trailing bytes after the delete set")
    return found


def _id(data: bytes, pos: int, found: ParsedUpdate) -> int:
    client, pos = _uint(data, pos)
    clock, pos = _uint(data, pos)
    found.references.append((client, clock))
    return pos


def _struct(data: bytes, pos: int, client: int, clock: int, found: ParsedUpdate) -> tuple[int, int]:
    """Skip one struct; returns (next position, its length in clock units)."""
    if pos >= len(data):
        raise MalformedUpdate(f"update ends early at byte {pos}")
    info = data[pos]
    pos += 1
    ref = info & 0x1F
    found.contents.add(ref)
    if ref in (_GC, _SKIP):
        length, pos = _uint(data, pos)
        return pos, length
    root = None
    if info & 0x80:
        pos = _id(data, pos, found)  # left origin
    if info & 0x40:
        pos = _id(data, pos, found)  # right origin
    if not info & 0xC0:  # no origins: the parent is named
        named, pos = _uint(data, pos)
        if named == 1:
            root = _root_name(data, pos)
            found.roots.add(root)
            pos = _buffer(data, pos)  # a root type's name
        else:
            pos = _id(data, pos, found)
        if info & 0x20:
            pos = _buffer(data, pos)  # parent sub (the map key)
    pos, length = _content(data, pos, ref)
    if root is not None:
        found.root_inserts.append((root, client, clock, length))
    return pos, length


def _root_name(data: bytes, pos: int) -> str:
    n, pos = _uint(data, pos)
    return data[pos : pos + n].decode("utf-8", "replace")


def _content(data: bytes, pos: int, ref: int) -> tuple[int, int]:
    if ref == _ANY:
        n, pos = _uint(data, pos)
        for _ in range(n):
            pos = _any(data, pos)
        return pos, n
    if ref == _DELETED:
        n, pos = _uint(data, pos)
        return pos, n
    if ref == _JSON:
        n, pos = _uint(data, pos)
        for _ in range(n):
            pos = _buffer(data, pos)
        return pos, n
    if ref == _STRING:  # clock length counts UTF-16 code units, as Yjs does
        n, start = _uint(data, pos)
        end = _skip(data, start, n)
        try:
            return end, len(data[start:end].decode("utf-8", "surrogatepass").encode("utf-16-le", "surrogatepass")) // 2
        except UnicodeError:
            raise MalformedUpdate(f"string content at byte {start} is not UTF-8") from None
    if ref in (_BINARY, _EMBED):
        return _buffer(data, pos), 1
    if ref == _FORMAT:
        return _buffer(data, _buffer(data, pos)), 1
    if ref == _TYPE:
        type_ref, pos = _uint(data, pos)
        return (_buffer(data, pos) if type_ref in (_XML_ELEMENT, _XML_HOOK) else pos), 1
    if ref == _DOC:
        return _any(data, _buffer(data, pos)), 1
    raise MalformedUpdate(f"unknown struct content {ref} at byte {pos - 1}")

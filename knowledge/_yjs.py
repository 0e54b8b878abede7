"""A structural reader for Yjs v1 updates: which client ids an update writes, references and
deletes.

`pycrdt.get_state(update)` is not enough for this: it reports the state an update reaches when
applied to an empty document, so an incremental update (whose structs start past clock 0) shows no
clients at all, a forged one included. This reader walks the update's bytes as the Yjs v1 format
lays them out (struct groups per client, then the delete set) without applying anything, and fails
on any structure it cannot account for — so it doubles as a strict pre-check before a byte reaches
pycrdt.

It reads every field as yrs (the Yjs core inside pycrdt) does, and refuses any value yrs would read
differently from the plain number in the bytes. yrs keeps clocks, lengths and counts as u32, reading
a wider var-uint with its high bits dropped or wrapped onto low ones (a clock of 2**32 is clock 0; a
6-byte var-uint ORs its last byte in at bit 3), and adds them without overflow checks (a struct
group at clock 2**32 - 1 made it panic and take the process down); it keeps the low 53 bits of a
client id. A reader taking these numbers at face value would let a signed update aim at clocks it
never named. Measured with yrs 0.28 (pycrdt 0.14).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_GC, _DELETED, _JSON, _BINARY, _STRING, _EMBED, _FORMAT, _TYPE, _ANY, _DOC, _SKIP = (
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
)
# Nested type refs yrs and Yjs read alike: array, map, text, XML element (followed by its name), XML
# fragment, XML text, subdocument, undefined. (An XML hook's name and a weak link's ids only Yjs
# reads.)
_TYPE_REFS, _XML_ELEMENT = frozenset({0, 1, 2, 3, 4, 6, 9, 15}), 3
# What a map of JSON strings ever holds: values (Any), deleted items, and their garbage-collected
# forms.
MAP_CONTENTS = frozenset({_GC, _DELETED, _ANY})
MAX_CLOCK = 2**32 - 1  # yrs holds clocks, and clock + length, in a u32
MAX_CLIENT = 2**53 - 1  # yrs keeps the low 53 bits of a client id
_MAX_DEPTH = 64
_MAP_ENTRY = _ANY | 0x20  # an item of Any content with a parent sub (a map key) and no origins
_MAP_ENTRY_BYTE = bytes([_MAP_ENTRY])
_MAX_VARINT_BYTES = 10


class MalformedUpdate(ValueError):
    """The bytes are not a well-formed Yjs v1 update, or not one yrs reads as written."""


@dataclass
class ParsedUpdate:
    """What a Yjs v1 update touches, read from its bytes alone.

    `writes`: clients whose structs it carries. `groups`: (client, first clock, total length) of
    each client's struct group. `structs`: (client, clock, length) of every struct. `references`:
    (client, clock) ids its items point at (left and right origins, parent items). `deletes`:
    (client, clock, length) ranges it deletes. `root_inserts`: (root name, client, clock, length) of
    items placed directly in a root type with no origins, i.e. map entries written for the first
    time. `strings`: every string value in its Any content (a simnet record each, for map values).
    """

    writes: set[int] = field(default_factory=set)
    contents: set[int] = field(
        default_factory=set
    )  # the struct content kinds present (GC=0 ... SKIP=10)
    roots: set[str] = field(default_factory=set)  # root types it names
    groups: list[tuple[int, int, int]] = field(default_factory=list)
    structs: list[tuple[int, int, int]] = field(default_factory=list)
    references: list[tuple[int, int]] = field(default_factory=list)
    nested: int = 0  # items whose parent is another item (a nested type): never in simnet feeds
    deletes: list[tuple[int, int, int]] = field(default_factory=list)
    root_inserts: list[tuple[str, int, int, int]] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)

    def clients(self) -> set[int]:
        return self.writes | {c for c, _ in self.references} | {c for c, _, _ in self.deletes}


def _uint(data: bytes, pos: int) -> tuple[int, int]:
    """A lib0 var-uint at `pos`, at face value; returns (value, next position). Fast path for one
    byte."""
    try:
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift, start = byte & 0x7F, 7, pos
        while True:
            pos += 1
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + 1
            shift += 7
            if pos + 1 - start >= _MAX_VARINT_BYTES:
                raise MalformedUpdate(f"variable-length integer too long at byte {start}")
    except IndexError:
        raise MalformedUpdate(f"update ends early at byte {pos}") from None


def _u32(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """A var-uint yrs reads as u32: refused if it does not fit, as yrs would read other bits than
    written."""
    value, end = _uint(data, pos)
    if value > MAX_CLOCK:
        raise MalformedUpdate(
            f"{what} {value} at byte {pos} is beyond 2**32 - 1, where yrs reads another value"
        )
    return value, end


def _client(data: bytes, pos: int) -> tuple[int, int]:
    value, end = _uint(data, pos)
    if value > MAX_CLIENT:
        raise MalformedUpdate(
            f"client id {value} at byte {pos} is not below 2**53, where yrs reads another id"
        )
    return value, end


def _end(clock: int, length: int, what: str) -> int:
    """clock + length, refused where yrs's u32 sum would overflow."""
    if clock + length > MAX_CLOCK:
        raise MalformedUpdate(
            f"{what} at clock {clock} of length {length} runs past 2**32 - 1, where yrs wraps"
        )
    return clock + length


def _skip(data: bytes, pos: int, n: int) -> int:
    end = pos + n
    if end > len(data):
        raise MalformedUpdate(f"a length of {n} at byte {pos} runs past the end of the update")
    return end


def _buffer(data: bytes, pos: int) -> int:
    """Skip a var-length byte buffer."""
    n, pos = _u32(data, pos, "buffer length")
    return _skip(data, pos, n)


def _string(data: bytes, pos: int) -> tuple[str, int]:
    """A var-string; refused unless UTF-8 (yrs takes string bytes unchecked)."""
    n, start = _u32(data, pos, "string length")
    end = _skip(data, start, n)
    try:
        return data[start:end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise MalformedUpdate(f"string at byte {start} is not UTF-8") from None


def _any(data: bytes, pos: int, found: ParsedUpdate, depth: int = 0) -> int:
    if depth > _MAX_DEPTH:
        raise MalformedUpdate("values nested too deeply")
    if pos >= len(data):
        raise MalformedUpdate(f"update ends early at byte {pos}")
    tag = data[pos]
    pos += 1
    if tag in (127, 126, 121, 120):  # undefined, null, false, true
        return pos
    if tag == 125:  # var-int (signed; only its extent matters here)
        return _uint(data, pos)[1]
    if tag == 124:
        return _skip(data, pos, 4)
    if tag in (123, 122):
        return _skip(data, pos, 8)
    if tag == 119:
        text, pos = _string(data, pos)
        found.strings.append(text)
        return pos
    if tag == 116:  # bytes
        return _buffer(data, pos)
    if tag == 118:  # object
        n, pos = _u32(data, pos, "object size")
        for _ in range(n):
            pos = _any(data, _string(data, pos)[1], found, depth + 1)
        return pos
    if tag == 117:  # array
        n, pos = _u32(data, pos, "array size")
        for _ in range(n):
            pos = _any(data, pos, found, depth + 1)
        return pos
    raise MalformedUpdate(f"unknown value tag {tag} at byte {pos - 1}")


def parse_update(update: bytes) -> ParsedUpdate:
    """Walk a Yjs v1 update; MalformedUpdate if it is not one, down to its last byte, or if yrs
    would read any of it differently."""
    data = bytes(update)
    found = ParsedUpdate()
    if not data:
        raise MalformedUpdate("empty update")
    groups, pos = _u32(data, 0, "group count")
    for _ in range(groups):
        structs, pos = _u32(data, pos, "struct count")
        at = pos
        client, pos = _client(data, pos)
        start, pos = _u32(data, pos, "clock")
        if (
            client in found.writes
        ):  # yrs would append the second group to the first, whatever its clock
            raise MalformedUpdate(f"client {client} has two struct groups (at byte {at})")
        if not structs:
            raise MalformedUpdate(f"the struct group of client {client} is empty")
        found.writes.add(client)
        clock = start
        for _ in range(structs):
            # the common struct (`_map_entry`) read here, the rest by `_struct`
            entry = _map_entry(data, pos + 1) if data[pos : pos + 1] == _MAP_ENTRY_BYTE else None
            if entry is None:
                pos, length = _struct(data, pos, client, clock, found)
            else:
                pos, root, text = entry
                length = 1
                found.contents.add(_ANY)
                found.roots.add(root)
                found.strings.append(text)
                found.root_inserts.append((root, client, clock, 1))
            found.structs.append((client, clock, length))
            end = clock + length
            clock = end if end <= MAX_CLOCK else _end(clock, length, "a struct")
        found.groups.append((client, start, clock - start))
    clients, pos = _u32(data, pos, "delete set size")
    seen: set[int] = set()
    for _ in range(clients):
        at = pos
        client, pos = _client(data, pos)
        if client in seen:  # yrs keeps only the last ranges given for a client
            raise MalformedUpdate(f"client {client} appears twice in the delete set (at byte {at})")
        seen.add(client)
        ranges, pos = _u32(data, pos, "range count")
        for _ in range(ranges):
            clock, pos = _u32(data, pos, "deleted clock")
            length, pos = _u32(data, pos, "deleted length")
            if not length:
                raise MalformedUpdate(f"an empty delete range at clock {clock}")
            _end(clock, length, "a deleted range")
            found.deletes.append((client, clock, length))
    if pos != len(data):
        raise MalformedUpdate(f"{len(data) - pos} trailing bytes after the delete set")
    return found


def _id(data: bytes, pos: int, client: int, clock: int, found: ParsedUpdate) -> int:
    """An id an item points at; one of its own client's must come before it (else yrs holds the
    item)."""
    at = pos
    ref_client, pos = _client(data, pos)
    ref_clock, pos = _u32(data, pos, "clock")
    if ref_client == client and ref_clock >= clock:
        raise MalformedUpdate(
            f"the item at clock {clock} points at clock {ref_clock} (byte {at}), not before it"
        )
    found.references.append((ref_client, ref_clock))
    return pos


def _struct(data: bytes, pos: int, client: int, clock: int, found: ParsedUpdate) -> tuple[int, int]:
    """Read one struct; returns (next position, its length in clock units). (`parse_update` reads
    the common map entry itself, `_map_entry`, and calls this for every other struct.)"""
    if pos >= len(data):
        raise MalformedUpdate(f"update ends early at byte {pos}")
    info = data[pos]
    pos += 1
    ref = info & 0x1F
    if (
        ref in (_GC, _SKIP) and info != ref
    ):  # yrs takes only the bare byte for these, else an item of kind ref & 15
        raise MalformedUpdate(
            f"struct info byte {info:#x} at byte {pos - 1} is read differently by yrs"
        )
    found.contents.add(ref)
    if ref in (_GC, _SKIP):
        length, pos = _u32(data, pos, "length")
        return pos, _nonzero(length, clock)
    root = None
    if info & 0x80:
        pos = _id(data, pos, client, clock, found)  # left origin
    if info & 0x40:
        pos = _id(data, pos, client, clock, found)  # right origin
    if not info & 0xC0:  # no origins: the parent is named
        named, pos = _u32(data, pos, "parent kind")
        if named == 1:
            root, pos = _string(data, pos)  # a root type's name
            found.roots.add(root)
        elif named == 0:
            pos = _id(data, pos, client, clock, found)
            found.nested += 1
        else:
            raise MalformedUpdate(
                f"parent kind {named} at clock {clock} is neither 0 (an item) nor 1 (a root)"
            )
        if info & 0x20:
            pos = _string(data, pos)[1]  # parent sub (the map key)
    pos, length = _content(data, pos, ref, found)
    if root is not None:
        found.root_inserts.append((root, client, clock, length))
    return pos, _nonzero(length, clock)


def _map_entry(data: bytes, pos: int) -> tuple[int, str, str] | None:
    """(next position, root name, value) of a struct that sets one string under a key of a root
    map, with short names and no origins: what feeds are mostly made of, read as the general path
    reads it, in fewer steps. None if the struct is anything else (the general path reads it, and
    says what is wrong with it)."""
    try:
        if data[pos] != 1 or data[pos + 1] >= 0x80:  # a root parent with a short name
            return None
        end = pos + 2 + data[pos + 1]
        root = data[pos + 2 : end].decode("utf-8")
        size = data[end]  # the key's
        if size >= 0x80:
            return None
        data[end + 1 : end + 1 + size].decode("utf-8")
        end += 1 + size
        if data[end] != 1 or data[end + 1] != 119:  # one value: a string
            return None
    except (IndexError, UnicodeDecodeError):
        return None
    start = end + 3  # the value's bytes, if its length is one byte (as `_string` reads it)
    if end + 2 < len(data) and data[end + 2] < 0x80 and start + data[end + 2] <= len(data):
        try:
            return start + data[end + 2], root, data[start : start + data[end + 2]].decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedUpdate(f"string at byte {start} is not UTF-8") from None
    text, end = _string(data, end + 2)
    return end, root, text


def _nonzero(length: int, clock: int) -> int:
    if not length:
        raise MalformedUpdate(
            f"an empty struct at clock {clock}"
        )  # yrs drops it; Yjs never writes one
    return length


def _content(data: bytes, pos: int, ref: int, found: ParsedUpdate) -> tuple[int, int]:
    if ref == _ANY:
        n, pos = _u32(data, pos, "value count")
        for _ in range(n):
            pos = _any(data, pos, found)
        return pos, n
    if ref == _DELETED:
        length, pos = _u32(data, pos, "length")
        return pos, length
    if ref == _STRING:  # clock length counts UTF-16 code units, as Yjs does
        text, end = _string(data, pos)
        return end, len(text.encode("utf-16-le")) // 2
    if ref == _BINARY:
        return _buffer(data, pos), 1
    if ref == _EMBED:  # JSON text
        return _string(data, pos)[1], 1
    if ref == _FORMAT:  # a key, then JSON text
        return _string(data, _string(data, pos)[1])[1], 1
    if ref == _TYPE:  # yrs reads the type ref as one byte, Yjs as a var-uint: the same below 128
        type_ref = data[pos] if pos < len(data) else None
        if type_ref not in _TYPE_REFS:
            raise MalformedUpdate(
                f"nested type ref {type_ref} at byte {pos} is not one yrs and Yjs read alike"
            )
        return (_string(data, pos + 1)[1] if type_ref == _XML_ELEMENT else pos + 1), 1
    if ref == _DOC:  # a guid, then options
        return _any(data, _string(data, pos)[1], ParsedUpdate()), 1  # its options are no record
    if ref == _JSON:  # yrs reads one string more than the count Yjs writes
        raise MalformedUpdate(f"JSON content at byte {pos} is read differently by yrs and Yjs")
    raise MalformedUpdate(f"unknown struct content {ref} at byte {pos - 1}")

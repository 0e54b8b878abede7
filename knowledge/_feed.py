"""One writer's feed as held at this site: its pycrdt Doc, its head, and what the last change
touched.

A feed's Doc has two root maps. ``immutable`` holds the records that are written once and never
replaced or removed (skills, certificates, revocations); ``records`` holds everything else. The feed
tracks the Yjs clock ranges of its immutable items, so an update that would replace or delete one is
recognized from its bytes (`check`) and refused before it reaches pycrdt.

It also tracks the author's next Yjs clock, and takes only updates that continue it exactly and
point at nothing beyond it (`foreign_structure`): yrs integrates a struct past a gap behind a hole,
holds back an item whose origin it lacks, and keeps a delete of clocks it lacks to apply to whatever
arrives there later — so otherwise what an update changes would depend on what came before and after
it.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from pycrdt import Doc, Map, TransactionEvent

from ._envelope import ZERO_HASH
from ._errors import RecordError, reraise_interrupts
from ._records import IMMUTABLE_PREFIXES
from ._yjs import _SKIP, MAP_CONTENTS, ParsedUpdate, parse_update

IMMUTABLE_MAP = "immutable"
RECORDS_MAP = "records"


def client_id_for(author: bytes) -> int:
    """The Yjs client id of a writer: 53 bits of a hash of its key (Yjs ids must stay below
    2**53)."""
    return (
        int.from_bytes(hashlib.sha256(b"simnet-client-id\x00" + author).digest()[:8], "big") >> 11
    )


def is_immutable(key: str) -> bool:
    return key.startswith(IMMUTABLE_PREFIXES)


ANY_MAP = "*"
"""In a feed's `map_names` (no map is named so): it may have written any map (fork evidence whose
bytes cannot be read), so read rules withhold it wherever a map is withheld."""


class Feed:
    """The replica of one author's Doc. Only the author's own Feed is ever written locally."""

    def __init__(self, author: bytes) -> None:
        self.author = author
        self.client_id = client_id_for(author)
        self.reset()

    def reset(self) -> None:
        """Forget everything (before rebuilding the feed from the store)."""
        self.seq, self.head, self.hlc = 0, ZERO_HASH, 0
        self._doc: Doc[Map[str]] | None = None  # made on first use (`doc`)
        self._subscriptions: list[Any] = []  # the observers of its two root maps
        self._state: bytes | None = None  # a snapshot's document state, applied on first use
        self._load_state: Callable[[], bytes | None] | None = None  # or where to read it then
        self._maps: dict[bool, Map[str]] = {}
        self._frozen: list[
            int
        ] = []  # sorted, disjoint [start, end) clock ranges of immutable items, flattened
        # clock units of the author's client held (or queued) here: where its next update starts
        self.next_clock = 0
        self._changes: dict[str, str | None] = {}
        self.misplaced: list[str] = []  # keys written to the wrong root map: never shown
        self.map_names: set[str] = (
            set()
        )  # semantic maps this feed ever wrote to (read rules withhold feeds by map)
        self._queued: list[bytes] = []
        self._last_update = b""

    @property
    def doc(self) -> Doc[Map[str]]:
        """The feed's Doc; a feed restored from a snapshot builds it from the snapshot's state on
        first use (a store opens without loading every document)."""
        if self._doc is None:
            self._doc = Doc(client_id=self.client_id, allow_multithreading=True)
            self._maps = {
                True: self._doc.get(IMMUTABLE_MAP, type=Map),
                False: self._doc.get(RECORDS_MAP, type=Map),
            }
            # Observed below pycrdt's event wrapper, which walks every change for nested types to
            # wrap (a feed holds none: only strings) and took most of a remote update's apply.
            self._subscriptions = [
                root.integrated.observe(self._observer(immutable))
                for immutable, root in self._maps.items()
            ]
            state = self._saved_state()
            if state is not None:
                self._state, misplaced = None, list(self.misplaced)
                self._doc.apply_update(state)
                self._changes, self.misplaced = {}, misplaced  # nothing changed: it was there
        return self._doc

    def _saved_state(self) -> bytes | None:
        if self._state is None and self._load_state is not None:
            self._state, self._load_state = self._load_state(), None
        return self._state

    def export(self) -> dict[str, Any]:
        """What a snapshot keeps of this feed (see `restore`)."""
        return {
            "seq": self.seq,
            "head": self.head,
            "hlc": self.hlc,
            "state": self._saved_state() if self._doc is None else self.state(),
            "frozen": list(self._frozen),
            "next_clock": self.next_clock,
            "map_names": set(self.map_names),
            "misplaced": list(self.misplaced),
        }

    @classmethod
    def restore(
        cls,
        author: bytes,
        saved: dict[str, Any],
        load_state: Callable[[], bytes | None] | None = None,
    ) -> Feed:
        """A feed as `export` saw it; its Doc is built when first used, from the saved state, or
        without one, from what `load_state` returns then."""
        feed = cls(author)
        feed.seq, feed.head, feed.hlc = saved["seq"], saved["head"], saved["hlc"]
        feed._state = saved.get("state")
        feed._load_state = load_state
        feed._frozen = list(saved["frozen"])
        feed.next_clock = saved["next_clock"]
        feed.map_names = set(saved["map_names"])
        feed.misplaced = list(saved["misplaced"])
        return feed

    def _observer(self, immutable: bool) -> Callable[[Any], None]:
        def on_change(event: Any) -> None:
            keys: dict[str, dict[str, Any]] = event.keys  # {key: {"action", "newValue", ...}}
            changes, names = self._changes, self.map_names
            for key, change in keys.items():
                if key.startswith(IMMUTABLE_PREFIXES) != immutable:
                    self.misplaced.append(key)
                    continue
                changes[key] = None if change["action"] == "delete" else change["newValue"]
                if key.startswith(("cell/", "tile/")):
                    names.add(key[5:].partition("/")[0])

        return on_change

    def _on_transaction(self, event: TransactionEvent) -> None:
        self._last_update = event.update

    def _drain(self) -> dict[str, str | None]:
        changes, self._changes = self._changes, {}
        return changes

    # --- structure and immutable ranges -----------------------------------------------------------
    def foreign_structure(self, parsed: ParsedUpdate) -> str | None:
        """Why this update cannot belong to this feed as it stands, or None.

        Feeds are two root maps of JSON strings; other content (text, XML, formats, nested types) is
        not ours, and refusing it keeps odd inputs away from the Yjs core. The author's structs must
        start at its next clock, and its items and deletes point only at clocks the feed will then
        hold. A full state (a checkpoint: structs from clock 0) may also reach a feed that holds
        part of it already: yrs skips the part it holds.
        """
        if _SKIP in parsed.contents:
            return "a Skip struct leaves a gap in the author's clocks"
        odd = parsed.contents - MAP_CONTENTS
        if odd:
            return f"content kinds {sorted(odd)} do not occur in simnet feeds"
        unknown = parsed.roots - {IMMUTABLE_MAP, RECORDS_MAP}
        if unknown:
            return f"root types {sorted(unknown)[:3]} do not exist in simnet feeds"
        if parsed.nested:
            return "items nested in other items do not occur in simnet feeds"
        own, held = self.client_id, self.next_clock
        end = held
        for client, start, length in parsed.groups:
            if (
                client == own
            ):  # one group per client (the reader sees to it); other clients the caller refuses
                if start != held and not (start == 0 and length >= held):
                    return (
                        f"the author's structs start at clock {start}, not at its next clock {held}"
                    )
                end = start + length
        for client, clock in parsed.references:
            if client == own and clock >= end:
                return f"an item points at clock {clock}, which the author's feed would not hold"
        for client, clock, length in parsed.deletes:
            if client == own and clock + length > end:
                return (
                    f"deletes clocks up to {clock + length - 1}, "
                    f"past the {end} the author's feed would hold"
                )
        return None

    def _in_frozen(self, start: int, end: int) -> bool:
        return _overlaps(self._frozen, start, end)

    def check(self, parsed: ParsedUpdate) -> str | None:
        """Why this update would replace or remove an immutable record, or None; notes its new ones.

        Immutable items are only ever inserted fresh into the immutable root; any origin, parent or
        delete that points at one (already held, or new in this very update) means a rewrite.

        A full state reaching a feed that holds part of it is integrated from the feed's next clock:
        yrs skips what it holds, and the struct that crosses that clock continues from the item just
        before it, as if it named that item as its origin (in its root, under that item's key: so
        the part of an immutable-root insert past the clock is a fresh immutable item too). Passing
        advances the feed's next clock.
        """
        own, held = self.client_id, self.next_clock
        fresh = [
            (max(clock, held), clock + length)
            for root, client, clock, length in parsed.root_inserts
            if root == IMMUTABLE_MAP and client == own and clock + length > held
        ]  # what yrs integrates
        references = list(parsed.references)
        if any(
            client == own and clock < held < clock + length
            for client, clock, length in parsed.structs
        ):
            references.append((own, held - 1))

        fresh_flat = [
            x for lo, hi in sorted(fresh) for x in (lo, hi)
        ]  # disjoint: this update's own inserts

        def frozen(start: int, end: int) -> bool:
            return self._in_frozen(start, end) or _overlaps(fresh_flat, start, end)

        for client, clock in references:
            if client == own and frozen(clock, clock + 1):
                return f"an item refers to the immutable record at clock {clock}"
        for client, clock, length in parsed.deletes:
            if client == own and frozen(clock, clock + length):
                return f"deletes clocks {clock}..{clock + length - 1}, which hold immutable records"
        for start, end in fresh:
            self._freeze(start, end)
        self.next_clock = max(
            [held] + [start + length for client, start, length in parsed.groups if client == own]
        )
        return None

    def lacks_held(self, state: bytes) -> str | None:
        """Why a full state (a checkpoint) reaching past what this feed holds does not continue it,
        or None.

        Live, yrs skips the part of a full state a feed holds; but a stored checkpoint is where the
        feed restarts from, so it must be the held state plus what follows: the held state with the
        part of the checkpoint beyond it must encode exactly as the checkpoint does (Yjs names items
        by client and clock, so other content at a held clock shows only this way). The state has
        passed the structural checks.
        """
        claimed: Doc[Map[str]] = Doc()
        rebuilt: Doc[Map[str]] = Doc()
        try:
            claimed.apply_update(state)
            rebuilt.apply_update(self.state())
            rebuilt.apply_update(claimed.get_update(self.doc.get_state()))
        except BaseException as exc:
            reraise_interrupts(exc)  # pycrdt raises ValueError, or a Rust panic (a BaseException)
            return f"checkpoint's update is unreadable: {exc}"
        if rebuilt.get_update() != claimed.get_update():
            return f"checkpoint lacks or changes what the author's envelopes 1..{self.seq} wrote"
        return None

    def _freeze(self, start: int, end: int) -> None:
        if self._frozen and self._frozen[-1] == start:
            self._frozen[-1] = end  # the common case: contiguous with the newest range
        elif not self._frozen or self._frozen[-1] < start:
            self._frozen += [start, end]
        else:
            ranges = list(zip(self._frozen[::2], self._frozen[1::2], strict=True)) + [(start, end)]
            merged: list[list[int]] = []
            for lo, hi in sorted(ranges):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self._frozen = [x for pair in merged for x in pair]

    # --- applying and writing ---------------------------------------------------------------------
    def apply(self, update: bytes) -> dict[str, str | None]:
        """Apply an update that passed the checks; return {key: new JSON text, or None if
        deleted}."""
        self.doc.apply_update(update)
        return self._drain()

    def replay(self, update: bytes) -> None:
        """Queue an update from this site's own store (checked when it arrived); `apply_queued`
        applies."""
        self.check(parse_update(update))
        self.queue(update)

    def queue(self, update: bytes) -> None:
        """Queue an update that passed the checks; `apply_queued` applies the queue in one
        transaction."""
        self._queued.append(update)

    def apply_queued(self) -> dict[str, str | None]:
        """Apply queued updates in one Doc transaction: one change event for the lot, not one
        each."""
        queued, self._queued = self._queued, []
        with self.doc.transaction():
            for update in queued:
                self.doc.apply_update(update)
        return self._drain()

    def write(self, changes: dict[str, str | None]) -> tuple[bytes, dict[str, str | None]]:
        """Make `changes` in one local transaction; return its Yjs update and the keys it changed.

        RecordError if peers would refuse the update (it rewrites an immutable record); the Doc then
        holds the change already, and the caller must restore the feed from its store.
        """
        self._last_update = b""
        watching = self.doc.observe(self._on_transaction)  # only local writes need the update
        try:
            with self.doc.transaction():
                for key, text in changes.items():
                    root = self._roots()[is_immutable(key)]
                    if text is None:
                        root.pop(key, None)
                    else:
                        root[key] = text
        finally:
            self.doc.unobserve(watching)
        update = self._last_update
        refusal = (
            self.check(parse_update(update)) if update else None
        )  # writes only make map entries
        changed = self._drain()
        if refusal is not None:
            raise RecordError(f"this write would be refused by peers: {refusal}")
        return update, changed

    def state(self) -> bytes:
        """The whole Doc as one update (the body of a checkpoint)."""
        return self.doc.get_update()

    def _roots(self) -> dict[bool, Map[str]]:
        self.doc  # noqa: B018 - builds it (and the maps) if it is not yet
        return self._maps

    def items(self) -> Iterator[tuple[str, str]]:
        for immutable, root in self._roots().items():
            for key, value in root.items():
                if is_immutable(key) == immutable:
                    yield key, value

    def get(self, key: str) -> str | None:
        return self._roots()[is_immutable(key)].get(key)


def _overlaps(ranges: list[int], start: int, end: int) -> bool:
    """Whether [start, end) meets one of the sorted, disjoint [lo, hi) ranges flattened in `ranges`
    (log time)."""
    i = bisect.bisect_right(ranges, start)
    return i % 2 == 1 or (i < len(ranges) and ranges[i] < end)

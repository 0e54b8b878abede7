"""Typed CRDT views over every trusted feed, kept up to date record by record.

Each author's feed holds at most one current record per key. The views keep, for every key, the
current record of each author allowed to write it, and merge across authors on read:

- skills: the union of published records minus those withdrawn by a writer of a site that vouches
  for the publisher (every publish is a fresh element whose id covers author and time, so
  observed-remove reduces to this);
- semantic-map cells: the record with the highest (confidence, hlc, author key), tombstones
  included, over per-cell records and tile records alike (`MapViews`);
- counters: per author a PN pair of grow-only counts; the value is the sum of P minus the sum of N;
- certificates, spot checks, task definitions and revocations: grow-only unions (a revoked skill
  stays revoked).

A record counts if a grant admits the envelope that last wrote it with the role the record needs
(`written` maps each author's keys to that envelope's (seq, hlc)); the sites of those grants vouch
for it. The merge is a pure function of the feeds, so two sites holding the same envelopes show the
same views.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from ._cellrows import one_map
from ._errors import RecordError
from ._mapview import MapViews
from ._models import Counts, RecordIssue
from ._records import (
    COUNTER_FIELDS,
    MAX_CELL_CHARS,
    REQUIRED_ROLE,
    FutureVersion,
    ParsedKey,
    RecordType,
    Role,
    check_record,
    is_map_name,
    parse_key,
    plain_cell,
    policy_key,
)
from ._recordtext import PlainCells
from ._tiles import Tile, decode
from ._trust import Authority

Index = str | tuple[str, str]
_MAX_LOG = 1_000_000
_SKILL_STATE = frozenset(
    {
        RecordType.SKILL,
        RecordType.WITHDRAW,
        RecordType.REVOKE,
        RecordType.CERT,
        RecordType.CHECK,
        RecordType.OUTCOME,
        RecordType.SUSPEND,
    }
)
_ABOUT_SKILL = (RecordType.CERT, RecordType.CHECK)  # keyed by their own id, naming a skill
# records whose arrival or removal can change which blobs are named (`naming_position`)
_NAMING = frozenset(
    {RecordType.SKILL, RecordType.WITHDRAW, RecordType.REVOKE, RecordType.CERT, RecordType.TASK}
)
_VOUCHED = frozenset(
    {
        RecordType.SKILL,
        RecordType.WITHDRAW,
        RecordType.CERT,
        RecordType.COUNTER,
        RecordType.CHECK,
        RecordType.OUTCOME,
        RecordType.SUSPEND,
    }
)  # sites read
_MAP_TYPES = (RecordType.CELL, RecordType.TILE)  # merged by MapViews
Written = Mapping[bytes, Mapping[str, tuple[int, int]]]
# what a snapshot of the views leaves out
_TRANSIENT = ("authority", "written", "loaded", "plain", "naming_writes", "_revoked_policies")
Grants = dict[tuple[Role | None, int | None, int], frozenset[bytes]]  # sites, by role, seq, hlc


def _index(key: ParsedKey) -> Index:
    return key.name


class Views:
    def __init__(self, authority: Authority, written: Written | None = None) -> None:
        self.authority = authority
        self.written: Written = {} if written is None else written
        self.generation = 0  # bumped by every rebuild: derived caches built before it are stale
        self.naming_writes = 0  # `_NAMING` records folded in or out (see `naming_position`)
        # records ingest parsed while checking them, by text: what `load_record` gives for it,
        # taken (once) instead of parsing again; ingest clears what is left
        self.loaded: dict[str, dict[str, Any]] = {}
        self.plain = PlainCells()  # likewise cell records of the common shape, read as columns
        # skills whose record, withdrawal, revocation or certificates changed
        self._skill_log: list[str] = []
        self._clear()

    def _clear(self) -> None:
        self._entries: dict[RecordType, dict[Index, dict[bytes, dict[str, Any]]]] = {
            t: {} for t in RecordType
        }
        self.maps = MapViews()
        self._certs_by_skill: dict[str, set[str]] = defaultdict(set)
        self._checks_by_cert: dict[str, set[str]] = defaultdict(set)
        self._disputes_by_validator: dict[str, set[str]] = defaultdict(set)
        # who vouches, for _VOUCHED
        self._sites: dict[tuple[RecordType, Index, bytes], frozenset[bytes]] = {}
        self._revoked_policies: dict[str, dict[bytes, dict[str, Any]]] | None = None

    def rebuild(
        self, authority: Authority, feeds: Iterable[tuple[bytes, Iterable[tuple[str, str]]]]
    ) -> None:
        """Recompute everything (after a trust change); issues found again are not reported
        twice."""
        self.authority = authority
        self._clear()
        for author, items in feeds:
            self.update(author, dict(items), [])
        self.generation += 1
        self._skill_log.clear()

    def update(
        self, author: bytes, changes: dict[str, str | None], issues: list[RecordIssue]
    ) -> None:
        """Fold one author's changed keys into the views; skipped records are appended to
        `issues`."""
        author_hex = author.hex()
        written = self.written.get(author, {})
        grants: Grants = {}  # one envelope writes many keys: its grants are looked up once
        if self._plain_run(author, changes, written, grants):
            self.maps.flush()
            return
        cells: dict[str, list[tuple[str, dict[str, Any] | None, Any]]] = {}  # by map
        plain: dict[str, tuple[list[str], list[int]]] = {}  # by map: cells, rows in `self.plain`
        for key, text in self._cells(author, changes, written, grants, cells, plain):
            try:
                parsed = parse_key(key)
            except RecordError as exc:
                issues.append(RecordIssue(author_hex, key, f"invalid_key: {exc}"))
                continue
            if parsed is None:
                issues.append(
                    RecordIssue(author_hex, key, "unknown_type: kept and forwarded, not shown")
                )
                continue
            if parsed.type in _MAP_TYPES:
                entry = (author, parsed, key, text, written.get(key))
                self._update_map(*entry, issues, grants, cells)
                continue
            bucket = self._entries[parsed.type]
            index = _index(parsed)
            old = bucket.get(index, {}).get(author)
            self._discard(parsed.type, index, author)
            if parsed.type in _ABOUT_SKILL:
                if old is not None:
                    self._log(old["skill"])
            elif parsed.type in _SKILL_STATE:
                self._log(parsed.name)
            if parsed.type is RecordType.REVOKE:  # other skills with its policy change too
                self.generation += 1
                self._skill_log.clear()
            if parsed.type in _NAMING:
                self.naming_writes += 1
            if text is None:
                continue
            role = REQUIRED_ROLE[parsed.type]
            sites = self._vouching(author, role, written.get(key), grants)
            if not sites:
                needed = role.value if role else "site root"
                issues.append(
                    RecordIssue(author_hex, key, f"unauthorized: needs the {needed} role")
                )
                continue
            try:
                record = check_record(parsed, text, author_hex, loaded=self.loaded.pop(text, None))
            except FutureVersion as exc:
                issues.append(
                    RecordIssue(author_hex, key, f"newer_schema: v{exc.args[0]} kept, not shown")
                )
                continue
            except RecordError as exc:
                issues.append(RecordIssue(author_hex, key, f"invalid_record: {exc}"))
                continue
            bucket.setdefault(index, {})[author] = record
            if parsed.type in _VOUCHED:
                self._sites[(parsed.type, index, author)] = sites
            if parsed.type in _ABOUT_SKILL:
                self._log(record["skill"])
            if parsed.type is RecordType.CERT:
                self._certs_by_skill[record["skill"]].add(parsed.name)
            elif parsed.type is RecordType.CHECK:
                self._checks_by_cert[record["certificate"]].add(parsed.name)
                if record["verdict"] == "disputed":
                    self._disputes_by_validator[record["validator"]].add(parsed.name)
                    # it may stop every certificate of that validator counting: start over
                    self.generation += 1
                    self._skill_log.clear()
        for name, entries in cells.items():
            self.maps.put_cells(author, name, entries)
        for name, (names, rows) in plain.items():  # other cells than those above: in any order
            self.maps.put_plain(author, name, names, rows, self.plain)
        self.maps.flush()

    def _plain_run(
        self,
        author: bytes,
        changes: dict[str, str | None],
        written: Mapping[str, tuple[int, int]],
        grants: Grants,
    ) -> bool:
        """Put `changes` in the maps at one go if they are all records ingest read into
        `self.plain` (a bulk write's), under cell keys of one map, by an author they count for;
        False (having done nothing) otherwise."""
        at = self.plain.at
        rows = [at[text] for text in changes.values() if text in at]  # (None is no text)
        named = one_map(list(changes)) if len(rows) == len(changes) else None
        if named is None or not all(
            self._vouching(author, Role.PUBLISH, stamp, grants)
            for stamp in set(map(written.get, changes))
        ):
            return False
        self.maps.put_plain(author, *named, rows, self.plain)
        return True

    def _update_map(
        self,
        author: bytes,
        parsed: ParsedKey,
        key: str,
        text: str | None,
        written: tuple[int, int] | None,
        issues: list[RecordIssue],
        grants: Grants,
        cells: dict[str, list[tuple[str, dict[str, Any] | None, Any]]],
    ) -> None:
        """Hand a tile record to the map views, or queue a cell record in `cells`: its content if
        it counts, else None."""
        content = None
        if text is not None:
            content = self._map_content(author, parsed, key, text, written, issues, grants)
        if parsed.type is RecordType.CELL:
            assert parsed.cell is not None and not isinstance(content, Tile)
            cells.setdefault(parsed.name, []).append((parsed.cell, content, None))
        else:
            self.maps.put(author, parsed, content)

    def _cells(
        self,
        author: bytes,
        changes: dict[str, str | None],
        written: Mapping[str, tuple[int, int]],
        grants: Grants,
        cells: dict[str, list[tuple[str, dict[str, Any] | None, Any]]],
        plain: dict[str, tuple[list[str], list[int]]],
    ) -> list[tuple[str, str | None]]:
        """Queue the cell records of the common kind in `cells` (a bulk ingest's many), to be put
        in the maps at one go: by an author they count for, in the shape writers make
        (`plain_cell`); those ingest read as columns in `plain`. Returns the other changes: the
        general path takes them."""
        rest = []
        names: dict[str, bool] = {}  # map names seen, and whether they are valid
        loaded, read = self.loaded, self.plain.at
        for key, text in changes.items():
            if not key.startswith("cell/"):
                rest.append((key, text))
                continue
            name, _, cell = key[5:].partition("/")
            valid = names.get(name)
            if valid is None:
                valid = names[name] = is_map_name(name)
            if not valid or not 0 < len(cell) <= MAX_CELL_CHARS:
                rest.append((key, text))  # parse_key says what is wrong
                continue
            if text is None:
                cells.setdefault(name, []).append((cell, None, None))
                continue
            row = read.get(text)
            record = loaded.get(text) if row is None else None
            shape = None if record is None else plain_cell(record)
            stamp = written.get(key)
            sites = grants.get((Role.PUBLISH, *stamp)) if stamp else None  # see _vouching
            if sites is None:
                sites = self._vouching(author, Role.PUBLISH, stamp, grants)
            if (row is None and shape is None) or not sites:
                rest.append((key, text))
            elif row is not None:
                names_rows = plain.setdefault(name, ([], []))
                names_rows[0].append(cell)
                names_rows[1].append(row)
            else:
                del loaded[text]
                cells.setdefault(name, []).append((cell, record, shape))
        return rest

    def _vouching(
        self, author: bytes, role: Role | None, written: tuple[int, int] | None, grants: Grants
    ) -> frozenset[bytes]:
        """`authority.sites` for a record `written` by the envelope at (seq, hlc), through
        `grants` (the authority does not change while one author's changes are folded)."""
        seq, hlc = written or (None, 0)
        found = grants.get((role, seq, hlc))
        if found is None:
            found = grants[(role, seq, hlc)] = self.authority.sites(author, role, seq, hlc)
        return found

    def _map_content(
        self,
        author: bytes,
        parsed: ParsedKey,
        key: str,
        text: str,
        written: tuple[int, int] | None,
        issues: list[RecordIssue],
        grants: Grants,
    ) -> Tile | dict[str, Any] | None:
        if not self._vouching(author, REQUIRED_ROLE[parsed.type], written, grants):
            issues.append(RecordIssue(author.hex(), key, "unauthorized: needs the publish role"))
            return None
        if parsed.type is RecordType.TILE:
            tile = self.maps.take_prepared(author, key, text)  # checked by ingest or its writer
            if tile is not None:
                return tile
        loaded = self.loaded.pop(text, None)
        if loaded is not None and parsed.type is RecordType.CELL and plain_cell(loaded):
            return loaded  # the common shape: what check_record would accept
        try:
            record = check_record(parsed, text, author.hex(), loaded=loaded)
            return decode(record) if parsed.type is RecordType.TILE else record
        except FutureVersion as exc:
            issues.append(
                RecordIssue(author.hex(), key, f"newer_schema: v{exc.args[0]} kept, not shown")
            )
        except RecordError as exc:
            issues.append(RecordIssue(author.hex(), key, f"invalid_record: {exc}"))
        return None

    def export_state(self) -> dict[str, Any]:
        """Everything the views hold but `_TRANSIENT` (the grants, `written`, which the snapshot
        keeps itself, and what lives only between ingests), as builtin values."""
        state = {k: v for k, v in vars(self).items() if k not in _TRANSIENT}
        state["maps"] = self.maps.export()
        return state

    def import_state(self, state: dict[str, Any]) -> None:
        """Hold what `export_state` gave (ValueError if it is not the same shape); readers of
        `skill_changes` start over."""
        if set(state) != set(vars(self)) - set(_TRANSIENT):
            raise ValueError("the saved views hold other indexes than these views")
        try:
            maps = MapViews.restore(state["maps"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"the saved map views are unreadable: {exc}") from None
        vars(self).update(state)
        self.maps, self._revoked_policies = maps, None
        self.generation += 1
        self._skill_log.clear()

    def reset_author(self, author: bytes, items: Iterable[tuple[str, str]]) -> None:
        """Replace everything the views hold from `author` by `items` (after its feed was
        restored)."""
        self.generation += 1  # too coarse to log skill by skill: derived indexes start over
        self._skill_log.clear()
        for rtype, bucket in self._entries.items():
            for index in [i for i, by_author in bucket.items() if author in by_author]:
                self._discard(rtype, index, author)
        self.maps.drop(author)
        self.update(author, dict(items), [])

    def _log(self, skill_id: str) -> None:
        if len(self._skill_log) >= _MAX_LOG:  # nobody is reading it closely: readers start over
            self.generation += 1
            self._skill_log.clear()
        self._skill_log.append(skill_id)

    def skill_changes(self, since: tuple[int, int]) -> tuple[set[str] | None, tuple[int, int]]:
        """Skill ids whose state changed since the position `since` (None: rebuilt, start over).

        Positions are (generation, log length); a derived index (FAISS) calls this to stay in step.
        """
        generation, length = since
        now = (self.generation, len(self._skill_log))
        if generation != self.generation:
            return None, now
        return set(self._skill_log[length:]), now

    def naming_position(self) -> tuple[int, int]:
        """Moves whenever the blobs that held records name may change: a skill, withdrawal,
        revocation, certificate or task folded in or out, or anything that bumps `generation`
        (a rebuild after a trust change, a feed reset, a reopen, a dispute). Outcomes, checks and
        suspensions name no blob, so a device reporting outcomes does not move it."""
        return self.generation, self.naming_writes

    def _discard(self, rtype: RecordType, index: Index, author: bytes) -> None:
        if rtype in (RecordType.SKILL, RecordType.REVOKE):
            self._revoked_policies = None
        self._sites.pop((rtype, index, author), None)
        bucket = self._entries[rtype]
        by_author = bucket.get(index)
        if by_author is not None:
            by_author.pop(author, None)
            if not by_author:
                del bucket[index]

    # --- reads ------------------------------------------------------------------------------------
    def indexes(self, rtype: RecordType) -> list[Index]:
        return list(self._entries[rtype])

    def skill(self, skill_id: str) -> dict[str, Any] | None:
        by_author = self._entries[RecordType.SKILL].get(skill_id)
        return next(iter(by_author.values())) if by_author else None

    def withdrawn(self, skill_id: str) -> bool:
        sites = self.skill_sites(skill_id)
        withdrawers = self._entries[RecordType.WITHDRAW].get(skill_id, {})
        return any(self._sites[(RecordType.WITHDRAW, skill_id, w)] & sites for w in withdrawers)

    def skill_sites(self, skill_id: str) -> frozenset[bytes]:
        """The sites that vouch for a skill's publisher (whose writers may withdraw it)."""
        record = self.skill(skill_id)
        if record is None:
            return frozenset()
        return self._sites[(RecordType.SKILL, skill_id, bytes.fromhex(record["author"]))]

    def cert_sites(self, cert_id: str, validator: bytes) -> frozenset[bytes]:
        """The sites whose grants admit the envelope that wrote this certificate with the validate
        role."""
        return self._sites.get((RecordType.CERT, cert_id, validator), frozenset())

    def revocations(self, skill_id: str) -> dict[bytes, dict[str, Any]]:
        """The revocations of a skill, by revoker: its own, and those of any skill that runs the
        same policy (`policy_key`: the same weights published again under a new record are the
        behaviour that was revoked)."""
        own = self._entries[RecordType.REVOKE].get(skill_id, {})
        key = policy_key((self.skill(skill_id) or {}).get("policy"))
        if key is None:
            return own
        if self._revoked_policies is None:
            self._revoked_policies = {}
            for revoked, by_revoker in self._entries[RecordType.REVOKE].items():
                revoked_key = policy_key((self.skill(str(revoked)) or {}).get("policy"))
                if revoked_key is not None:
                    self._revoked_policies.setdefault(revoked_key, {}).update(by_revoker)
        same = self._revoked_policies.get(key)
        return {**same, **own} if same else own

    def certificates(self, skill_id: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for cert_id in sorted(self._certs_by_skill.get(skill_id, ())):
            by_author = self._entries[RecordType.CERT].get(cert_id)
            if by_author:
                out.append((cert_id, next(iter(by_author.values()))))
        return out

    def certificate(self, cert_id: str) -> dict[str, Any] | None:
        by_author = self._entries[RecordType.CERT].get(cert_id)
        return next(iter(by_author.values())) if by_author else None

    def checks(self, cert_id: str) -> list[tuple[str, bytes, dict[str, Any], frozenset[bytes]]]:
        """(check id, checker, record, the sites vouching for the checker) of each spot check of a
        certificate."""
        return self._vouched_checks(self._checks_by_cert.get(cert_id, ()))

    def disputes(self, validator: str) -> list[tuple[str, bytes, dict[str, Any], frozenset[bytes]]]:
        """The same, for every dispute against certificates of `validator` (hex key)."""
        return self._vouched_checks(self._disputes_by_validator.get(validator, ()))

    def all_disputes(self) -> list[tuple[str, bytes, dict[str, Any], frozenset[bytes]]]:
        return self._vouched_checks(set().union(*self._disputes_by_validator.values()))

    def _vouched_checks(
        self, check_ids: Iterable[str]
    ) -> list[tuple[str, bytes, dict[str, Any], frozenset[bytes]]]:
        out = []
        for check_id in sorted(check_ids):
            for checker, record in self._entries[RecordType.CHECK].get(check_id, {}).items():
                sites = self._sites[(RecordType.CHECK, check_id, checker)]
                out.append((check_id, checker, record, sites))
        return out

    def by_author(
        self, rtype: RecordType, skill_id: str
    ) -> list[tuple[bytes, dict[str, Any], frozenset[bytes]]]:
        """(author, record, the sites vouching for it) of each author's record of `rtype` about a
        skill (field outcomes, suspensions), in author order."""
        return [
            (author, record, self._sites[(rtype, skill_id, author)])
            for author, record in sorted(self._entries[rtype].get(skill_id, {}).items())
        ]

    def task(self, task_hash: str) -> dict[str, Any] | None:
        by_author = self._entries[RecordType.TASK].get(task_hash)
        return next(iter(by_author.values())) if by_author else None

    def cell(self, map_name: str, cell: str) -> tuple[bytes, dict[str, Any]] | None:
        return self.maps.cell(map_name, cell)

    def cells(self, map_name: str) -> list[str]:
        return self.maps.cells(map_name)

    def map_names(self) -> list[str]:
        return self.maps.map_names()

    def counts(self, skill_id: str) -> dict[bytes, Counts]:
        """Per site: the PN-counter values recorded for a skill by that site's writers (a writer
        that two sites vouch for with the publish role is filed under the smaller site key)."""
        per_site: dict[bytes, Counts] = {}
        for author, rec in self._entries[RecordType.COUNTER].get(skill_id, {}).items():
            site = min(self._sites[(RecordType.COUNTER, skill_id, author)])
            value = Counts(*(rec["p"][f] - rec["n"][f] for f in COUNTER_FIELDS))
            per_site[site] = per_site.get(site, Counts()) + value
        return per_site

    def delegation_records(
        self,
    ) -> tuple[dict[bytes, dict[bytes, dict]], dict[bytes, dict[bytes, dict]]]:
        """{root: {device: record}} for delegations and for key revocations, as the views hold
        them."""
        result: tuple[dict[bytes, dict[bytes, dict]], dict[bytes, dict[bytes, dict]]] = ({}, {})
        for out, rtype in zip(result, (RecordType.DELEGATE, RecordType.KEY_REVOKE), strict=True):
            for device, by_root in self._entries[rtype].items():
                for root, record in by_root.items():
                    out.setdefault(root, {})[bytes.fromhex(str(device))] = record
        return result

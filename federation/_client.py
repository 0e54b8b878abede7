"""One anti-entropy round with a peer, over HTTP: pull what we lack, push what they lack, fetch
the blobs asked for (`blobs`) and give the peer ours (`push_blobs`: a device gives its site the
weights of the skills it published and the scene assets of their tasks).

The round is written once, as a generator that yields `Call`s (requests to make) and receives
`httpx.Response`s (no I/O of its own), and driven by `sync_with` (blocking, `httpx.Client`) or
`async_sync_with` (`httpx.AsyncClient`, with the knowledge-base work run in a worker thread).

httpx's `timeout` bounds each network operation (connect, one read, one write), not an answer: a
peer that sends one byte per read-timeout keeps a read going for ever. So both drivers also hold the
whole round to a `deadline` (seconds of wall time; default `DEADLINE_FACTOR` * timeout): past it the
round stops with a `PeerError` (code "deadline"). `async_sync_with` runs the round inside a cancel
scope; `sync_with` checks the deadline between chunks and shuts the round's sockets down when it
passes, so a blocked read or write ends too.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Container, Generator, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import anyio
import httpx

from knowledge import BlobError, BlobQuotaError, Head, KnowledgeBase, Rejection

from ._auth import SimnetAuth, answer_signed_by
from ._calls import (
    MAX_RETRIES,
    WIRE_BYTES,
    Body,
    Deadline,
    Watchdog,
    client_verify,
    deadline_s,
    retry_after,
)
from ._errors import PeerError, WireError
from ._wire import (
    COMPLETE_HEADER,
    PAGE_TYPE,
    PUSH_BYTES,
    decode_page,
    encode_page,
    parse_heads,
    parse_json,
    peer_time,
    with_hashes,
    within,
)

API = "/v1"
DEFAULT_PAGE = 1000
MAX_PAGES = 100_000  # a hard stop: a round never loops forever, whatever the peer answers
HELD_EVERYTHING = 2**62  # a head that tells the peer to send nothing of a feed
MAX_REFUSED_AUTHORS = 10_000  # feeds skipped in one round before the round gives up on the peer


@dataclass
class SyncReport:
    """What one round moved. `rejected` are envelopes from the peer that we refused; `held`, those
    we hold until our clock reaches them. `refused_by_peer` counts ours that the peer refused, and
    `refused_by_peer_reasons` counts them by reason (`clock_skew`, `gap`, ...: docs/PROTOCOL.md);
    `held_by_peer`, those it holds until its clock reaches them (they are applied then). A peer
    refuses the envelopes after a refused one of the same feed with `gap`. `verified` counts the
    envelopes pulled to check checkpoints we took feeds from (`unchecked_checkpoints`; they are
    not stored, bar the last of each check). `clock_offset_ms` is the peer's clock minus ours,
    from its `Simnet-Time` header (None if it sent none). `heads_signed`: the peer signed its heads
    answer (see `federation._auth`); only then does a writer take them as the peer's word on how
    far its own feed goes."""

    peer: str
    pulled: int = 0
    pushed: int = 0
    duplicates: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    held: int = 0
    verified: int = 0
    refused_by_peer: int = 0
    refused_by_peer_reasons: dict[str, int] = field(default_factory=dict)
    held_by_peer: int = 0
    clock_offset_ms: int | None = None
    heads_signed: bool = False
    blobs: int = 0
    blobs_pushed: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0


class Call(NamedTuple):
    """One HTTP request the round wants made; the driver builds it with its client's defaults."""

    method: str
    url: str
    content: bytes = b""
    headers: dict[str, str] = {}


Exchange = Generator[Call, httpx.Response, SyncReport]


def _json_call(url: str, body: object) -> Call:
    return Call(
        "POST",
        url,
        json.dumps(body, separators=(",", ":")).encode(),
        {"content-type": "application/json"},
    )


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            body = response.json()
            code, detail = body.get("error"), body.get("detail", "")
        except (ValueError, AttributeError):
            code, detail = None, response.text[:200]
        raise PeerError(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {code}: {detail}",
            response.status_code,
            code,
        )
    return response


def exchange(
    kb: KnowledgeBase,
    base_url: str,
    *,
    page: int = DEFAULT_PAGE,
    blobs: Iterable[str] = (),
    push_blobs: Iterable[str] = (),
    withhold: Container[bytes] = (),
    peer_key: bytes | None = None,
) -> Exchange:
    """The round as a sans-I/O generator (see module docstring). Feeds of the authors in `withhold`
    are never pushed (read rules: a peer without read rights to a private map must not be sent it).
    A device syncing with its own site (`peer_key` is its policy's `device_of`) takes the site's
    heads as the word on how far its own feed goes, after pulling: see
    `KnowledgeBase.learn_site_heads`; a site root whose store does not know yet takes its peers':
    see `KnowledgeBase.learn_peer_heads`. Either only from heads signed by `peer_key`."""
    report = SyncReport(peer=base_url)
    started = time.perf_counter()
    limit = kb.limits.max_checkpoint_bytes

    def send(call: Call) -> Generator[Call, httpx.Response, httpx.Response]:
        report.bytes_sent += len(call.content)
        response = _check((yield call))
        report.bytes_received += response.extensions.get(WIRE_BYTES, response.num_bytes_downloaded)
        return response

    # Pull: ask for what our heads lack, page by page, until the peer has nothing new for us. Feeds
    # we refuse (untrusted writers, say) are claimed as held for the rest of the round, so that a
    # page full of them cannot hide the feeds behind them.
    kb.release_held()  # what we hold from earlier rounds and is due now
    refused_here: dict[str, int] = {}
    for _ in range(MAX_PAGES):
        heads = kb.heads()
        body = {
            "heads": {a: h.seq for a, h in heads.items()} | refused_here,
            "limit": page,
            "hashes": {a: h.hash for a, h in heads.items() if a not in refused_here and h.seq},
            "equivocators": [a for a, h in heads.items() if h.equivocated_at is not None],
        }
        to_check = kb.unchecked_checkpoints()
        unchecked = {  # checkpoints we took feeds from: a peer holding their history sends it
            a: {"seq": seq, "after": after}
            for a, (seq, after) in to_check.items()
            if a not in refused_here
        }
        if unchecked:
            body["unchecked"] = unchecked
        response = yield from send(_json_call(f"{base_url}{API}/sync", body))
        envelopes = decode_page(response.content, max_count=page, max_envelope_bytes=limit)
        if not envelopes:
            break
        ingested = kb.ingest(envelopes)
        report.pulled += len(ingested.accepted)
        report.duplicates += ingested.duplicates
        report.rejected += ingested.rejected
        report.held += len(ingested.held)
        report.verified += ingested.verified
        skipped = {r.author for r in ingested.rejected if r.author} | {
            h.author for h in ingested.held
        }
        newly_refused = skipped - refused_here.keys()
        if (
            not ingested.accepted
            and not ingested.verified
            and (not newly_refused or len(refused_here) >= MAX_REFUSED_AUTHORS)
        ):
            # nothing we can use, and nothing new to skip (or a peer feeding us endless strangers)
            break
        refused_here.update(dict.fromkeys(newly_refused, HELD_EVERYTHING))
        if (
            response.headers.get(COMPLETE_HEADER) == "1"
            and not ingested.verified
            and not ingested.equivocations
            and kb.unchecked_checkpoints() == to_check
        ):
            # the peer sent all it has for our heads, and our next request would ask for no more
            # (what we took moved our heads to theirs; what we refused we would not ask for again)
            break

    # Push: what their heads lack, page by page, until they hold everything we hold. Feeds they
    # refuse are left out for the rest of the round, for the same reason.
    refused_there: set[bytes] = set()
    response = yield from send(Call("GET", f"{base_url}{API}/heads"))
    theirs = _peer_heads(parse_json(response.content))
    site_ms = peer_time(response.headers)
    if site_ms is not None:
        report.clock_offset_ms = site_ms - kb.clock.physical()
    report.heads_signed = answer_signed_by(response, peer_key)
    if report.heads_signed and peer_key == kb.policy.device_of:
        kb.learn_site_heads(theirs)
        if site_ms is not None:
            kb.learn_site_time(site_ms)
    if report.heads_signed:  # a re-installed site root: how far its feed goes, in the peer's word
        kb.learn_peer_heads(theirs, peer=peer_key)
    push_page = page
    for _ in range(MAX_PAGES):
        lacking = kb.envelopes_since(
            theirs, limit=push_page, exclude=_Either(refused_there, withhold), max_bytes=PUSH_BYTES
        )
        envelopes = within(lacking, PUSH_BYTES)
        if not envelopes:
            break
        try:
            response = yield from send(
                Call(
                    "POST",
                    f"{base_url}{API}/envelopes",
                    encode_page(envelopes),
                    {"content-type": PAGE_TYPE},
                )
            )
        except PeerError as exc:
            if exc.status != 413 or len(envelopes) == 1:
                raise
            push_page = max(1, len(envelopes) // 2)  # the peer takes smaller pages: halve, again
            continue
        answer = parse_json(response.content)
        accepted, rejected, held = _push_answer(answer, len(envelopes))
        theirs = _peer_heads(answer)
        report.pushed += accepted
        report.refused_by_peer += len(rejected)
        report.held_by_peer += len(held)
        for reason in rejected.values():
            report.refused_by_peer_reasons[reason] = (
                report.refused_by_peer_reasons.get(reason, 0) + 1
            )
        refused_now = {envelopes[i][2:34] for i in [*rejected, *held]} - refused_there
        if not accepted and not refused_now:
            break
        refused_there |= refused_now

    # Blobs the caller asked for, by hash; each verified before it is stored.
    for blob_hash in kb.blobs.missing(blobs):
        response = yield from send(Call("GET", f"{base_url}{API}/blobs/{blob_hash}"))
        try:
            kb.blobs.put(response.content, expected=blob_hash)
        except BlobQuotaError:
            raise
        except BlobError as exc:
            raise PeerError(f"blob {blob_hash[:16]}… from {base_url} is corrupt: {exc}") from exc
        report.blobs += 1

    # Blobs we give the peer (a device's skill weights to its site): after the envelopes, so that
    # the skill naming each is there; the peer verifies the hash.
    for blob_hash in push_blobs:
        response = yield from send(
            Call(
                "PUT",
                f"{base_url}{API}/blobs/{blob_hash}",
                kb.blobs.get(blob_hash),
                {"content-type": "application/octet-stream"},
            )
        )
        report.blobs_pushed += response.status_code == 201

    report.seconds = time.perf_counter() - started
    return report


class _Either:
    """Membership in either of two containers, without copying them."""

    def __init__(self, first: Container[bytes], second: Container[bytes]) -> None:
        self.first, self.second = first, second

    def __contains__(self, item: object) -> bool:
        return item in self.first or item in self.second


def _push_answer(answer: object, sent: int) -> tuple[int, dict[int, str], list[int]]:
    """(accepted count, reason per index of a refused envelope, indexes of held envelopes) from a
    push answer; PeerError if malformed."""
    if not isinstance(answer, dict):
        raise PeerError("the peer's push answer is not a JSON object")
    accepted, rejected = answer.get("accepted", 0), answer.get("rejected", [])
    held = answer.get("held", [])  # older peers send none
    if not isinstance(accepted, int) or isinstance(accepted, bool) or not 0 <= accepted <= sent:
        raise PeerError(f"the peer's push answer says accepted={accepted!r} for {sent} envelopes")
    for name, listed in (("rejections", rejected), ("held envelopes", held)):
        if not isinstance(listed, list) or not all(
            isinstance(r, dict) and isinstance(r.get("index"), int) and 0 <= r["index"] < sent
            for r in listed
        ):
            raise PeerError(f"the peer's push answer lists {name} without valid envelope indexes")
    reasons = {r["index"]: _reason(r.get("reason")) for r in rejected}
    return accepted, reasons, [r["index"] for r in held]


def _reason(reason: object) -> str:
    """A peer's refusal reason as a short identifier (anything else: "unknown")."""
    if isinstance(reason, str) and 0 < len(reason) <= 64 and reason.isidentifier():
        return reason
    return "unknown"


def _peer_heads(answer: object) -> dict[str, Head | int]:
    """A peer's heads answer as `envelopes_since` reads it (authors it knows forked carry
    equivocated_at)."""
    if not isinstance(answer, dict):
        raise PeerError("the peer's heads answer is not a JSON object")
    try:
        heads = with_hashes(
            parse_heads(answer.get("heads"), max_authors=1 << 20), answer.get("hashes")
        )
    except WireError as exc:
        raise PeerError(f"the peer's heads answer is malformed: {exc}") from None
    equivocators = answer.get("equivocators", [])
    for author in (
        {a for a in equivocators if isinstance(a, str)} if isinstance(equivocators, list) else ()
    ):
        if (head := heads.get(author)) is not None:
            heads[author] = Head(head.seq, head.hash, equivocated_at=1)
    return dict(heads)


def _answer_cap(kb: KnowledgeBase) -> int:
    """The largest answer a round reads: a blob, or a page of envelopes (64 MiB), whichever is
    larger."""
    return max(kb.limits.max_blob_bytes, 64 << 20)


def _client_kwargs(
    kb: KnowledgeBase, url: str, peer_key: bytes, timeout: float, verify: ssl.SSLContext | bool
) -> dict:
    if kb.identity is None:
        raise PeerError(
            "syncing needs a knowledge base opened with an identity (requests are signed)"
        )
    return {
        "auth": SimnetAuth(kb.identity, peer_key),
        "timeout": timeout,
        "follow_redirects": False,
        "verify": client_verify(url, verify),
    }


def _step(rounds: Exchange, response: httpx.Response | None) -> Call | SyncReport:
    """Advance the round: the next request to make, or the finished report."""
    try:
        return next(rounds) if response is None else rounds.send(response)
    except StopIteration as done:
        return done.value


def sync_with(
    kb: KnowledgeBase,
    url: str,
    peer_key: bytes,
    *,
    page: int = DEFAULT_PAGE,
    blobs: Iterable[str] = (),
    push_blobs: Iterable[str] = (),
    timeout: float = 30.0,
    deadline: float | None = None,
    withhold: Container[bytes] = (),
    transport: httpx.BaseTransport | None = None,
    verify: ssl.SSLContext | bool = True,
) -> SyncReport:
    """Run one anti-entropy round with the site at `url` whose root key is `peer_key` (blocking);
    then fetch the `blobs` we lack from it, and upload `push_blobs` to it (each named by a live
    skill or a task it holds; `SyncReport.blobs_pushed` counts those it did not hold yet).

    `timeout` bounds each network operation; `deadline` (default `DEADLINE_FACTOR` * timeout) the
    whole round: past it, a `PeerError` with code "deadline" (see the module docstring). `verify`
    checks an https:// peer's certificate (an `ssl.SSLContext` with the fleet's anchors; True: the
    system's)."""
    url = url.rstrip("/")
    limit = Deadline(url, deadline_s(deadline, timeout))
    rounds = exchange(
        kb, url, page=page, blobs=blobs, push_blobs=push_blobs, withhold=withhold, peer_key=peer_key
    )
    cap = _answer_cap(kb)
    try:
        with (
            Watchdog(limit) as watchdog,
            httpx.Client(
                transport=transport, **_client_kwargs(kb, url, peer_key, timeout, verify)
            ) as client,
        ):
            step = _step(rounds, None)
            while isinstance(step, Call):
                limit.check()
                for attempt in range(MAX_RETRIES + 1):
                    try:
                        # No single operation may outlast the deadline (the watchdog is the
                        # backstop).
                        with client.stream(
                            step.method,
                            step.url,
                            content=step.content,
                            headers=step.headers,
                            timeout=min(timeout, max(limit.remaining(), 0.001)),
                            extensions={"trace": watchdog.trace},
                        ) as answer:
                            body = Body(step.method, step.url, cap)
                            for chunk in answer.iter_bytes():
                                body.add(chunk)
                                limit.check()
                            response = body.response(answer)
                    except httpx.HTTPError as exc:
                        if watchdog.fired or limit.remaining() <= 0:
                            raise limit.error() from None
                        raise PeerError(f"cannot reach {step.url}: {exc}") from exc
                    wait = retry_after(response, attempt, limit.remaining())
                    if wait is None:
                        break
                    time.sleep(wait)
                step = _step(rounds, response)
    finally:
        rounds.close()
    return step


async def async_sync_with(
    kb: KnowledgeBase,
    url: str,
    peer_key: bytes,
    *,
    page: int = DEFAULT_PAGE,
    blobs: Iterable[str] = (),
    push_blobs: Iterable[str] = (),
    timeout: float = 30.0,
    deadline: float | None = None,
    withhold: Container[bytes] = (),
    transport: httpx.AsyncBaseTransport | None = None,
    verify: ssl.SSLContext | bool = True,
) -> SyncReport:
    """`sync_with` for asyncio: network I/O on the event loop, knowledge-base work in a worker
    thread.

    The whole round runs in a cancel scope that expires at the deadline (a knowledge-base step
    already running in its thread finishes first: those are bounded by the page size)."""
    url = url.rstrip("/")
    limit = Deadline(url, deadline_s(deadline, timeout))
    rounds = exchange(
        kb,
        url,
        page=page,
        blobs=list(blobs),
        push_blobs=list(push_blobs),
        withhold=withhold,
        peer_key=peer_key,
    )
    cap = _answer_cap(kb)
    try:
        with anyio.move_on_after(limit.seconds):
            async with httpx.AsyncClient(
                transport=transport, **_client_kwargs(kb, url, peer_key, timeout, verify)
            ) as client:
                step = await anyio.to_thread.run_sync(_step, rounds, None)
                while isinstance(step, Call):
                    for attempt in range(MAX_RETRIES + 1):
                        try:
                            async with client.stream(
                                step.method, step.url, content=step.content, headers=step.headers
                            ) as answer:
                                body = Body(step.method, step.url, cap)
                                async for chunk in answer.aiter_bytes():
                                    body.add(chunk)
                                response = body.response(answer)
                        except httpx.HTTPError as exc:
                            raise PeerError(f"cannot reach {step.url}: {exc}") from exc
                        wait = retry_after(response, attempt, limit.remaining())
                        if wait is None:
                            break
                        await anyio.sleep(wait)
                    step = await anyio.to_thread.run_sync(_step, rounds, response)
                return step
        raise limit.error()  # the scope expired: the round was cancelled where it stood
    finally:
        rounds.close()

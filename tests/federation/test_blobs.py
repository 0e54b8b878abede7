"""Blobs on demand over HTTP: byte ranges on GET /v1/blobs/{sha256}, `PeerBlobSource` (signed,
resuming a cut fetch with Range), the next peer after a corrupt answer, a device's site fetching
what it lacks from its peers (and sites never asking on each other's behalf), the quota.

Real sites (real keys, SQLite, the ASGI app served by uvicorn on loopback); the only fakes are
transports that inject a fault (`fault`, and `Cut`, which drops a connection midway).
"""

from __future__ import annotations

import hashlib
import os

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import federation
import knowledge
from federation import PeerBlobSource, PeerConfig, ServerLimits, WireError
from federation._blobs import _content_range, parse_range
from knowledge import BlobError, BlobQuotaError, Identity, TrustPolicy
from knowledge._store import BLOB_PART

BLOB = os.urandom(3 * BLOB_PART + 999)
HASH = hashlib.sha256(BLOB).hexdigest()


class _CutStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, after: int) -> None:
        self.inner, self.after = inner, after

    def __iter__(self):
        sent = 0
        for chunk in self.inner:
            if sent + len(chunk) >= self.after:
                yield chunk[: self.after - sent]
                raise httpx.ReadError("the connection was cut")
            sent += len(chunk)
            yield chunk

    def close(self) -> None:
        self.inner.close()


class Cut(httpx.BaseTransport):
    """Passes requests to `inner`; the first blob answer stops with a ReadError after `after` bytes
    of its body (a connection dropped midway). `bodies` records each blob answer's status and the
    bytes its body carried."""

    def __init__(self, inner: httpx.BaseTransport, after: int | None) -> None:
        self.inner, self.after = inner, after
        self.bodies: list[tuple[int, str | None, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not request.url.path.startswith("/v1/blobs/"):
            return response
        body = response.read()
        self.bodies.append((response.status_code, request.headers.get("range"), len(body)))
        stream = httpx.ByteStream(body)
        if self.after is not None:
            stream, self.after = _CutStream(stream, self.after), None
        return httpx.Response(response.status_code, headers=response.headers, stream=stream)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def holder(make_site, serve_app):
    """(a, b, b's URL): site b holds BLOB and serves it; a trusts b and b trusts a."""
    a, b = make_site("a"), make_site("b")
    a.trust(b.key)
    b.trust(a.key)
    assert b.kb.blobs.put(BLOB) == HASH
    return a, b, serve_app(b.app)


def source(site, url: str, identity: Identity, **kwargs) -> PeerBlobSource:
    return PeerBlobSource(site.name, url, site.key, identity, timeout=10, **kwargs)


# --- Range on the blob endpoint -------------------------------------------------------------------


def test_a_range_gets_those_bytes_and_no_range_the_whole(holder):
    a, b, url = holder
    with httpx.Client(base_url=url, auth=federation.SimnetAuth(a.identity, b.key)) as client:
        whole = client.get(f"/v1/blobs/{HASH}")
        assert whole.status_code == 200 and whole.content == BLOB
        assert whole.headers["accept-ranges"] == "bytes"
        for header, (start, end) in {
            "bytes=1000-": (1000, len(BLOB)),
            f"bytes={BLOB_PART - 1}-{BLOB_PART}": (BLOB_PART - 1, BLOB_PART + 1),
            "bytes=5-9999999999": (5, len(BLOB)),
            "bytes=-10": (len(BLOB) - 10, len(BLOB)),
        }.items():
            part = client.get(f"/v1/blobs/{HASH}", headers={"range": header})
            assert part.status_code == 206, header
            assert part.content == BLOB[start:end], header
            assert part.headers["content-range"] == f"bytes {start}-{end - 1}/{len(BLOB)}"
        beyond = client.get(f"/v1/blobs/{HASH}", headers={"range": f"bytes={len(BLOB)}-"})
        assert beyond.status_code == 416 and beyond.json()["error"] == "range_not_satisfiable"
        assert beyond.headers["content-range"] == f"bytes */{len(BLOB)}"
        for bad in ("bytes=1-2,5-6", "items=1-", "bytes=9-3", "bytes=-", "bytes=x-"):
            refused = client.get(f"/v1/blobs/{HASH}", headers={"range": bad})
            assert refused.status_code == 400, bad
            assert refused.json()["error"] == "bad_request" and "Range" in refused.json()["detail"]


@given(
    size=st.integers(min_value=0, max_value=10_000),
    first=st.one_of(st.none(), st.integers(min_value=0, max_value=12_000)),
    last=st.one_of(st.none(), st.integers(min_value=0, max_value=12_000)),
)
def test_parse_range_agrees_with_slicing(size, first, last):
    """Any single range header, against Python's slicing of the same bytes (the model)."""
    header = f"bytes={'' if first is None else first}-{'' if last is None else last}"
    data = bytes(range(256)) * 40
    data = data[:size]
    if first is None and last is None:
        expected = 400
    elif first is None:
        expected = data[-last:] if last and size else 416
    elif last is not None and last < first:
        expected = 400
    elif first >= size:
        expected = 416
    else:
        expected = data[first : None if last is None else last + 1]
    try:
        start, end = parse_range(header, size)
    except WireError as exc:
        assert exc.status == expected
        return
    assert data[start:end] == expected
    content_range = f"bytes {start}-{end - 1}/{size}"
    assert _content_range(content_range, "peer") == (start, size)  # and the header parses back


def test_a_content_range_that_does_not_add_up_is_a_peer_error():
    for value in ("bytes 5-4/10", "bytes 0-10/10", "bytes */10", "bytes 1-2", "octets 0-1/2"):
        with pytest.raises(federation.PeerError, match="Content-Range"):
            _content_range(value, "peer")


# --- PeerBlobSource -------------------------------------------------------------------------------


def test_a_peer_source_fetches_a_blob_verified_and_stores_it(holder):
    a, b, url = holder
    peer = source(b, url, a.identity)
    assert a.kb.blobs.fetch(HASH, sources=[peer]) == BLOB
    assert a.kb.blobs.get(HASH) == BLOB and peer.bytes_received == len(BLOB)


def test_a_cut_fetch_resumes_with_a_range_and_moves_only_the_rest(holder):
    a, b, url = holder
    cut_at = BLOB_PART + 4321
    cutting = Cut(httpx.HTTPTransport(), after=cut_at)
    peer = source(b, url, a.identity, transport=cutting)
    with pytest.raises(BlobError, match=f"connection was cut.*{cut_at} bytes are held"):
        a.kb.blobs.fetch(HASH, sources=[peer])
    assert HASH not in a.kb.blobs and a.kb.blobs.stored_bytes() == cut_at
    assert a.kb.blobs.fetch(HASH, sources=[peer]) == BLOB
    assert cutting.bodies[-1] == (206, f"bytes={cut_at}-", len(BLOB) - cut_at)  # only the rest
    assert peer.bytes_received == len(BLOB)  # every byte crossed once
    assert a.kb.blobs.stored_bytes() == len(BLOB)


def test_a_corrupt_answer_is_refused_and_the_next_peer_used(make_site, serve_app, fault, caplog):
    a, b, c = make_site("a"), make_site("b"), make_site("c")
    for x, y in ((a, b), (a, c), (b, a), (c, a)):
        x.trust(y.key)
    b.kb.blobs.put(BLOB)
    c.kb.blobs.put(BLOB)

    def flip(request, status, headers, body):
        return status, headers, body[:-1] + bytes([body[-1] ^ 1])

    lying = source(b, serve_app(b.app), a.identity, transport=fault(httpx.HTTPTransport(), flip))
    honest = source(c, serve_app(c.app), a.identity)
    with caplog.at_level("WARNING", "knowledge"):
        assert a.kb.blobs.fetch(HASH, sources=[lying, honest]) == BLOB
    assert "b sent bytes that do not hash to it; refused" in caplog.text
    assert lying.bytes_received == len(BLOB) and honest.bytes_received == len(BLOB)


def test_a_blob_no_peer_has_is_one_clear_error(holder, make_site, serve_app):
    a, b, url = holder
    c = make_site("c")
    c.trust(a.key)
    missing = hashlib.sha256(b"no one has this").hexdigest()
    peers = [
        source(b, url, a.identity),
        source(c, serve_app(c.app), a.identity),
        PeerBlobSource("gone", "http://127.0.0.1:9", b.key, a.identity, timeout=2),
    ]
    with pytest.raises(BlobError) as caught:
        a.kb.blobs.fetch(missing, sources=peers)
    message = str(caught.value)
    assert message.startswith(f"blob {missing[:16]}… is not stored here and no source could")
    assert "b: does not hold it; c: does not hold it; gone: cannot fetch blob from gone" in message
    assert "\n" not in message and missing not in a.kb.blobs


def test_a_peer_that_refuses_the_caller_is_named_with_its_reason(holder, make_site):
    a, b, url = holder
    stranger = Identity.generate()
    with pytest.raises(BlobError, match="b answered 403: key .* is not trusted"):
        a.kb.blobs.fetch(HASH, sources=[source(b, url, stranger)])


def test_the_quota_refuses_a_peer_blob_before_a_byte_is_kept(holder):
    a, b, url = holder
    a.kb.blobs.set_quota(len(BLOB) - 1)
    peer = source(b, url, a.identity)
    with pytest.raises(BlobQuotaError):
        a.kb.blobs.fetch(HASH, sources=[peer])
    assert a.kb.blobs.stored_bytes() == 0 and peer.bytes_received == 0


# --- a device asks its site; the site asks its peers ----------------------------------------------


@pytest.fixture
def chain(make_site, serve_app):
    """a has b as its peer (b trusts a; b holds BLOB); a device of a's; c, a site a trusts."""
    a, b, c = make_site("a"), make_site("b"), make_site("c")
    b.trust(a.key)
    a.trust(c.key)
    b.kb.blobs.put(BLOB)
    a.config.peers = [PeerConfig("b", serve_app(b.app), b.key)]
    device = Identity.generate()
    a.kb.delegate(device.public_key, ["publish"])
    a.kb.skills.publish("reach", "reach", policy={"weights": HASH}, blobs=[HASH])
    return a, b, c, device, serve_app(a.app)


def test_a_device_gets_a_blob_its_site_fetches_from_a_peer(chain):
    a, _b, _c, device, a_url = chain
    robot = knowledge.open(":memory:", device, policy=TrustPolicy().for_device_of(a.key))
    robot.blobs.add_source(PeerBlobSource("a", a_url, a.key, device, timeout=10))
    assert robot.blobs.fetch(HASH) == BLOB
    assert a.kb.blobs.get(HASH) == BLOB  # the site keeps it for its next device
    robot.close()


def test_a_site_asking_a_site_gets_only_what_it_holds(chain):
    a, _b, c, _device, a_url = chain
    with pytest.raises(BlobError, match="a: does not hold it"):
        c.kb.blobs.fetch(HASH, sources=[source(a, a_url, c.identity)])
    assert HASH not in a.kb.blobs  # a did not ask b on c's behalf


def test_a_device_asking_for_a_blob_no_peer_has_gets_a_404_naming_the_peers(chain):
    a, _b, _c, device, a_url = chain
    missing = hashlib.sha256(b"nowhere").hexdigest()
    a.kb.skills.publish("lost", "reach", blobs=[missing])
    with httpx.Client(base_url=a_url, auth=federation.SimnetAuth(device, a.key)) as client:
        answer = client.get(f"/v1/blobs/{missing}")
    assert answer.status_code == 404 and answer.json()["error"] == "not_found"
    assert "no source could supply it (b: does not hold it)" in answer.json()["detail"]


def test_a_site_fetches_for_a_device_only_what_its_records_name(chain):
    """Otherwise a device could fill its site's blob quota with blobs nothing here needs, which
    the garbage collector never frees (it frees what withdrawn and revoked skills name)."""
    a, b, _c, device, a_url = chain
    stray = b.kb.blobs.put(b"a blob b holds that no record at a names" * 10)
    with httpx.Client(base_url=a_url, auth=federation.SimnetAuth(device, a.key)) as client:
        answer = client.get(f"/v1/blobs/{stray}")
    assert (answer.status_code, answer.json()["error"]) == (404, "not_found")
    assert "no skill or task held here names it" in answer.json()["detail"]
    assert stray not in a.kb.blobs and a.kb.blobs.stored_bytes() == 0


def test_a_device_blob_past_the_site_quota_is_a_507(chain):
    a, _b, _c, device, a_url = chain
    a.kb.blobs.set_quota(1000)
    with httpx.Client(base_url=a_url, auth=federation.SimnetAuth(device, a.key)) as client:
        answer = client.get(f"/v1/blobs/{HASH}")
    assert answer.status_code == 507 and answer.json()["error"] == "insufficient_storage"
    assert HASH not in a.kb.blobs and a.kb.blobs.stored_bytes() == 0


# --- a device gives its site the weights of a skill it published --------------------------------


def test_a_device_uploads_its_skills_weights_with_its_sync(chain):
    a, _b, _c, device, a_url = chain
    robot = knowledge.open(":memory:", device, policy=TrustPolicy().for_device_of(a.key))
    federation.sync_with(robot, a_url, a.key)  # learns its delegation
    weights = robot.blobs.put(b"weights of a skill made here" * 100)
    robot.skills.publish("reach", "reach", policy={"weights": weights}, blobs=[weights])
    report = federation.sync_with(robot, a_url, a.key, push_blobs=[weights])
    assert report.blobs_pushed == 1 and a.kb.blobs.get(weights) == robot.blobs.get(weights)
    again = federation.sync_with(robot, a_url, a.key, push_blobs=[weights])
    assert again.blobs_pushed == 0  # held already
    robot.close()


def test_a_device_uploads_the_files_of_a_task_it_published(chain):
    """A task's scene assets are blobs its record names: its site takes them as it takes weights."""
    a, _b, _c, device, a_url = chain
    robot = knowledge.open(":memory:", device, policy=TrustPolicy().for_device_of(a.key))
    federation.sync_with(robot, a_url, a.key)
    mesh = b"solid mesh of a link" * 50
    digest = hashlib.sha256(mesh).hexdigest()
    task = robot.tasks.publish(
        {"scene": "<mujoco/>", "assets": {"link.stl": digest}}, assets={"link.stl": mesh}
    )
    report = federation.sync_with(robot, a_url, a.key, push_blobs=[digest])
    assert report.blobs_pushed == 1 and a.kb.blobs.get(digest) == mesh
    assert a.kb.tasks.assets(task) == {"link.stl": digest} and a.kb.blobs.is_named(digest)
    robot.close()


def test_an_upload_no_skill_names_a_wrong_hash_or_a_writer_without_publish_is_refused(chain):
    a, _b, _c, device, a_url = chain
    unnamed = hashlib.sha256(b"junk").hexdigest()
    reader = Identity.generate()
    a.kb.delegate(reader.public_key, ["validate"])
    a.kb.skills.publish("s", "t", blobs=[a.kb.blobs.put(BLOB)])
    fresh = b"other weights"
    named = hashlib.sha256(fresh).hexdigest()
    a.kb.skills.publish("s2", "t", blobs=[named])
    old = b"weights of a withdrawn skill"
    a.kb.skills.withdraw(a.kb.skills.publish("s3", "t", blobs=[hashlib.sha256(old).hexdigest()]).id)
    with httpx.Client(base_url=a_url, auth=federation.SimnetAuth(device, a.key)) as client:
        withdrawn = client.put(f"/v1/blobs/{hashlib.sha256(old).hexdigest()}", content=old)
        nobody = client.put(f"/v1/blobs/{unnamed}", content=b"junk")
        wrong = client.put(f"/v1/blobs/{named}", content=b"not those bytes")
        held = client.put(f"/v1/blobs/{HASH}", content=BLOB)
    with httpx.Client(base_url=a_url, auth=federation.SimnetAuth(reader, a.key)) as client:
        no_role = client.put(f"/v1/blobs/{named}", content=fresh)
    assert (nobody.status_code, nobody.json()["error"]) == (404, "not_found")
    assert withdrawn.status_code == 404  # its skill's blobs are garbage here
    assert "push its envelope first" in nobody.json()["detail"]
    assert (wrong.status_code, wrong.json()["error"]) == (400, "bad_request")
    assert held.status_code == 200 and held.json() == {"stored": False, "bytes": len(BLOB)}
    assert (no_role.status_code, no_role.json()["error"]) == (403, "not_authorized")
    assert unnamed not in a.kb.blobs and named not in a.kb.blobs


# --- a site's home: simnet.toml's peers and quota -------------------------------------------------


def test_attach_site_peers_reads_the_peers_and_quota_of_simnet_toml(holder):
    a, b, url = holder
    a.config.peers = [PeerConfig("b", url, b.key)]
    a.config.limits = ServerLimits(max_blob_store_bytes=len(BLOB) * 2)
    a.config.save()
    home = knowledge.SiteHome(a.home, blob_setup=["federation:attach_site_peers"])
    a.kb.close()  # the home opens its own writer
    with home.open_writer() as kb:
        assert kb.blobs.quota == len(BLOB) * 2
        assert [(s.name, s.url) for s in kb.blobs.sources] == [("b", url)]
        assert kb.blobs.fetch(HASH) == BLOB
    bare = knowledge.SiteHome(b.home)
    (b.home / "simnet.toml").unlink()
    federation.attach_site_peers(bare, b.kb)  # no simnet.toml: nothing to attach
    assert b.kb.blobs.sources == ()


def test_simnet_blobs_lists_and_collects_the_garbage(tmp_path, cli):
    home = tmp_path / "site"
    assert cli(home, "init", "--name", "site").code == 0
    config = federation.SiteConfig.load(home)
    config.limits = ServerLimits(max_blob_store_bytes=10_000)
    config.save()
    with knowledge.SiteHome(home).open_writer() as kb:
        live, dead, loose, mesh = (kb.blobs.put(bytes([i]) * 1000) for i in range(4))
        kb.skills.publish("live", "pick", blobs=[live])
        kb.revoke(kb.skills.publish("dead", "pick", blobs=[dead, mesh]).id)
        kb.tasks.publish({"name": "reach", "assets": {"link.stl": mesh}})
    listed = cli(home, "blobs", "list", "--json")
    assert listed.code == 0 and listed.traceback is None
    rows = {r["hash"]: r for r in listed.json["blobs"]}
    assert (listed.json["bytes"], listed.json["quota"]) == (4000, 10_000)
    assert rows[live]["skills"] == ["live"] and not rows[live]["garbage"]
    assert rows[dead]["skills"] == ["dead"] and rows[dead]["garbage"]
    assert rows[loose]["skills"] == [] and not rows[loose]["garbage"]
    assert rows[mesh]["tasks"] == ["reach:link.stl"] and not rows[mesh]["garbage"]
    assert cli(home, "blobs", "gc", "--dry-run").out.strip() == "would free 1000 bytes in 1 blob(s)"
    assert cli(home, "blobs", "gc", "--json").json == {dead: 1000}
    assert cli(home, "blobs", "gc").out.strip() == "freed 0 bytes in 0 blob(s)"
    with knowledge.SiteHome(home).open_readonly() as kb:
        assert sorted(kb.blobs.list()) == sorted([live, loose, mesh])
    with knowledge.SiteHome(home, blob_setup=["federation:attach_site_peers"]).open_writer() as kb:
        with pytest.raises(BlobQuotaError):
            kb.blobs.put(b"z" * 9000)  # simnet.toml's quota holds for every command


class NoRanges(httpx.BaseTransport):
    """A peer (or a proxy before it) that ignores Range: the header never reaches the server."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.headers.pop("range", None)
        return self.inner.handle_request(request)


def test_a_peer_that_ignores_ranges_sends_the_whole_blob_and_it_is_taken_whole(holder):
    a, b, url = holder
    cut = source(b, url, a.identity, transport=Cut(httpx.HTTPTransport(), after=5000))
    with pytest.raises(BlobError, match="5000 bytes are held"):
        a.kb.blobs.fetch(HASH, sources=[cut])
    whole = source(b, url, a.identity, transport=NoRanges(httpx.HTTPTransport()))
    assert a.kb.blobs.fetch(HASH, sources=[whole]) == BLOB
    assert whole.bytes_received == len(BLOB)  # from byte 0: the bytes held were dropped


def test_more_bytes_held_than_the_peer_has_start_over_from_byte_0(holder):
    """A 416 (the range starts past the peer's blob) means the bytes held are not its blob's."""
    a, b, url = holder

    class Overlong:
        name = "overlong"

        def fetch_blob(self, blob: knowledge.IncomingBlob) -> bool:
            blob.write(BLOB + b"junk")
            raise BlobError("dropped")

    with pytest.raises(BlobError, match=f"{len(BLOB) + 4} bytes are held"):
        a.kb.blobs.fetch(HASH, sources=[Overlong()])
    honest = source(b, url, a.identity)
    assert a.kb.blobs.fetch(HASH, sources=[honest]) == BLOB
    assert honest.bytes_received == len(BLOB)
    assert a.kb.blobs.stored_bytes() == len(BLOB)

"""The surfaces added for scene assets, checkpoint checks, own-feed waiting and map tiles, attacked
from outside: real `simnet serve` sites on loopback ports, real SQLite and signatures, and hostile
peers that are plain HTTP servers an attacker wrote (`HostilePeer`), not simnet code.

- Blobs: a device uploads only bytes that hash to a name a task held at its site gives, and only
  with the publish role; an oversized body is 413; a path that is not a hash is 400.
- Scene assets: a task's asset names cannot leave its virtual file system (`..`, absolute paths,
  `package://`, drive letters, backslashes), and a scene compiles from the bytes its task carries
  even where the validating process's working directory holds files of the same names.
- Checkpoint checks: a peer sending a checkpointed writer's envelopes out of order, replayed
  endlessly, or other writers' envelopes settles nothing and forks nothing; an honest holder of
  the history then checks it.
- Own feed: a peer that pulls from a re-installed root does not confirm its feed for it, and a
  configured peer claiming more of the root's feed, or another envelope at its head, keeps the
  root waiting (named in the refusal), never writing at a seq that forks it. Whoever answers at a
  configured peer's address without its key (a man in the middle) confirms nothing either, not
  even by replaying a heads answer that peer once signed.
- Tiles: a trusted device pushing a hostile tile record to a live site gets the envelope refused
  with the tile's reason; the site's map and heads are unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

import federation
import knowledge
import sim
from federation import PAGE_TYPE, ServerLimits, encode_page
from federation._wire import decode_page
from knowledge import Identity, NotAuthorizedError, Role, TrustPolicy
from sim import TaskDefinitionError

from .conftest import SIMNET, assert_refused, signed
from .test_forks import push, simnet, trust

# --- a hostile peer: an attacker's HTTP server ----------------------------------------------------


class HostilePeer:
    """A plain HTTP server on a loopback port that answers `POST /v1/sync` with `page(n)` (the
    n-th pull, from 0), `GET /v1/heads` with `heads()` and `POST /v1/envelopes` by accepting
    nothing. It ignores signatures: it is not simnet code. `requests` counts pulls."""

    def __init__(
        self, page: Callable[[int], list[bytes]], heads: Callable[[], dict] | None = None
    ) -> None:
        self.page_for = page
        self.heads_for = heads or (lambda: {"heads": {}, "hashes": {}, "equivocators": []})
        self.heads_answer: tuple[bytes, dict[str, str]] | None = None  # replayed as is, if set
        self.pulls = 0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                body, headers = peer.heads_answer or (json.dumps(peer.heads_for()).encode(), {})
                self._answer(200, body, "application/json", **headers)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path.startswith("/v1/sync"):
                    n, peer.pulls = peer.pulls, peer.pulls + 1
                    self._answer(200, encode_page(peer.page_for(n)), PAGE_TYPE)
                else:
                    body = {"accepted": 0, "duplicates": 0, "rejected": [], "equivocations": 0}
                    body |= {"held": [], **peer.heads_for()}
                    self._answer(200, json.dumps(body).encode(), "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile_peers():
    made: list[HostilePeer] = []

    def make(page, heads=None) -> HostilePeer:
        made.append(HostilePeer(page, heads))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


def wire_heads(kb: knowledge.KnowledgeBase) -> dict:
    """`kb`'s heads as `GET /v1/heads` answers them."""
    heads = kb.heads()
    return {
        "heads": {a: h.seq for a, h in heads.items()},
        "hashes": {a: h.hash for a, h in heads.items() if h.seq},
        "equivocators": [],
    }


def device(site, tmp_path, name: str, roles: str) -> knowledge.KnowledgeBase:
    """A device of `site` delegated `roles`, its store in tmp_path, synced once (so it writes)."""
    key = Identity.generate()
    simnet(site, "device", "add", key.public_key_hex, "--roles", roles)
    kb = knowledge.open(
        tmp_path / f"{name}.db", key, policy=TrustPolicy().for_device_of(site.key.public_key)
    )
    federation.sync_with(kb, site.url, site.key.public_key)
    return kb


# --- blobs over the wire --------------------------------------------------------------------------


def test_blob_uploads_need_publish_a_held_name_matching_bytes_and_room(live, tmp_path):
    site = live("site", limits=ServerLimits(max_body_bytes=64 << 10)).start()
    publisher = device(site, tmp_path, "publisher", "publish")
    validator = device(site, tmp_path, "validator", "validate")
    mesh = b"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n" * 100
    big = b"x" * (80 << 10)  # over the body limit, and named by the task all the same
    named = {
        "meshes/a.obj": hashlib.sha256(mesh).hexdigest(),
        "meshes/big.bin": hashlib.sha256(big).hexdigest(),
    }
    definition = {"format": "simnet.task/1", "name": "t", "assets": named}
    publisher.tasks.publish(definition, assets={"meshes/a.obj": mesh, "meshes/big.bin": big})
    federation.sync_with(publisher, site.url, site.key.public_key)  # the record, no blobs
    unnamed = b"nothing names me"
    mesh_hash, big_hash = named["meshes/a.obj"], named["meshes/big.bin"]

    def put(who: Identity, blob_hash: str, body: bytes) -> httpx.Response:
        target = f"/v1/blobs/{blob_hash}"
        headers = {
            "authorization": signed(who, site.key.public_key, "PUT", target, body),
            "content-type": "application/octet-stream",
        }
        with httpx.Client(base_url=site.url, timeout=10) as client:
            return client.put(target, content=body, headers=headers)

    def held(blob_hash: str) -> int:
        with site.client() as client:  # the site's own key: answered from what is held
            return client.get(f"/v1/blobs/{blob_hash}").status_code

    assert_refused(put(validator.identity, mesh_hash, mesh), 403, "not_authorized", "publish")
    assert_refused(
        put(publisher.identity, hashlib.sha256(unnamed).hexdigest(), unnamed),
        404,
        "not_found",
        "push its envelope first",
    )
    assert_refused(put(publisher.identity, mesh_hash, mesh + b"#"), 400, "bad_request", "hash")
    assert put(publisher.identity, big_hash, big).status_code == 413
    assert held(mesh_hash) == held(big_hash) == 404  # nothing refused was kept

    stored = put(publisher.identity, mesh_hash, mesh)
    assert stored.status_code == 201 and stored.json() == {"stored": True, "bytes": len(mesh)}
    again = put(publisher.identity, mesh_hash, b"other bytes")  # held: the body is not compared
    assert again.status_code == 200 and again.json()["stored"] is False
    with site.client() as client:
        assert client.get(f"/v1/blobs/{mesh_hash}").content == mesh
        for path in (
            "/v1/blobs/" + mesh_hash.upper(),
            "/v1/blobs/" + mesh_hash[:63],
            "/v1/blobs/..%2f..%2fsite.key",
            "/v1/blobs/" + mesh_hash[:62] + "%00a",
        ):
            answer = client.get(path)
            assert answer.status_code in (400, 404), (path, answer.status_code)
            assert answer.json()["error"] in ("bad_request", "not_found"), answer.text
    assert not list(site.home.glob("*.obj"))  # nothing was written beside the store
    site.assert_no_traceback()
    publisher.close(), validator.close()


# --- scene assets: names and files --------------------------------------------------------------

BOX = "".join(
    f"v {x} {y} {z}\n" for x in (0, 0.1) for y in (-0.1, 0.1) for z in (-0.1, 0.1)
) + "".join(f"f {f}\n" for f in ("1 2 4 3", "5 7 8 6", "1 5 6 2", "3 4 8 7", "1 3 7 5", "2 6 8 4"))


def scene(compiler: str, file: str) -> str:
    return f"""<mujoco model="m">{compiler}
  <asset><mesh name="link" file="{file}"/></asset>
  <worldbody><body name="link"><joint name="pan" axis="0 0 1"/>
    <geom type="mesh" mesh="link"/><site name="tip" pos="0.1 0 0"/></body></worldbody>
  <actuator><motor joint="pan" ctrlrange="-1 1"/></actuator>
</mujoco>"""


@pytest.fixture(scope="module")
def carried_task(tmp_path_factory) -> sim.Task:
    """A reach task whose scene loads one carried mesh, `meshes/link.obj` (a 0.1 m box), built
    from files that are gone once it is built."""
    robot = tmp_path_factory.mktemp("meshbot")
    (robot / "meshes").mkdir()
    (robot / "meshes" / "link.obj").write_text(BOX)
    (robot / "scene.xml").write_text(scene('<compiler meshdir="meshes"/>', "link.obj"))
    task = sim.reach_task(robot / "scene.xml", end_effector="tip", horizon=5)
    assert set(task.assets) == {"meshes/link.obj"}
    for path in (robot / "meshes" / "link.obj", robot / "scene.xml"):
        path.unlink()
    return task


@pytest.mark.parametrize(
    "name",
    [
        "../outside.obj",
        "meshes/../../outside.obj",
        "/etc/passwd",
        "//host/share.obj",
        "package://robot/meshes/link.obj",
        "C:/Windows/link.obj",
        "meshes\\..\\..\\link.obj",
        "meshes/./link.obj",
        "",
        "meshes/link\x00.obj",
        "meshes/\nlink.obj",
    ],
)
def test_an_asset_name_that_could_leave_the_tasks_files_is_refused_naming_it(carried_task, name):
    definition = carried_task.to_json()
    digest = definition["assets"]["meshes/link.obj"]
    definition["assets"] = {**definition["assets"], name: digest}
    with pytest.raises(TaskDefinitionError) as refused:
        sim.Task(definition, {**carried_task.assets, name: BOX.encode()})
    assert "is not a relative file name" in str(refused.value) and repr(name) in str(refused.value)


def respelled(task: sim.Task, compiler: str, file: str) -> str:
    """The task's scene (as MuJoCo's writer wrote it) with compiler attributes added and its
    mesh's file spelled `file`."""
    xml = task.to_json()["scene"]
    assert '<compiler angle="radian"/>' in xml and 'file="meshes/link.obj"' in xml
    xml = xml.replace('<compiler angle="radian"/>', f'<compiler angle="radian" {compiler}/>')
    return xml.replace('file="meshes/link.obj"', f'file="{file}"')


@pytest.mark.parametrize(
    ("compiler", "file"),
    [
        ('meshdir="meshes/sub"', "../link.obj"),
        ('meshdir="meshes"', "./link.obj"),
        ('meshdir="meshes/"', "link.obj"),
        ('meshdir="./meshes"', "link.obj"),
        ('meshdir="x/../meshes"', "link.obj"),
        ("", "meshes//link.obj"),
        ('strippath="true" meshdir="meshes"', "/anywhere/link.obj"),
    ],
)
def test_a_scene_compiles_from_the_carried_bytes_not_a_file_of_that_name_on_disk(
    carried_task, tmp_path, monkeypatch, compiler, file
):
    """Attack: spellings of the carried name that a path lookup resolves elsewhere; the validating
    process's working directory holds a different mesh (a 5 m box) under every such path."""
    decoy = BOX.replace("0.1", "5.0")
    for path in ("link.obj", "meshes/link.obj", "meshes/sub/link.obj", "anywhere/link.obj"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(decoy)
    monkeypatch.chdir(tmp_path)
    task = carried_task.replace(scene=respelled(carried_task, compiler, file))
    assert task.hash != carried_task.hash
    assert float(task.template.model.mesh_vert.max()) == pytest.approx(0.1)


def test_a_scene_naming_a_file_its_task_does_not_carry_is_refused_before_mujoco_reads_it(
    carried_task, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc.xml").write_text("<mujoco/>")
    (tmp_path / "other.obj").write_text(BOX)
    xml = carried_task.to_json()["scene"]
    for text, phrase in (
        (respelled(carried_task, 'meshdir="/"', str(tmp_path / "other.obj")), "does not carry"),
        (respelled(carried_task, "", "other.obj"), "does not carry"),
        (respelled(carried_task, "", "meshes/../other.obj"), "does not carry"),
        (xml.replace("<worldbody>", "<include file='inc.xml'/><worldbody>"), "includes 'inc.xml'"),
        (  # a default namespace: ElementTree names the tag {urn:x}include, MuJoCo reads include
            xml.replace("<mujoco ", '<mujoco xmlns="urn:x" ', 1).replace(
                "<worldbody>", "<include file='inc.xml'/><worldbody>"
            ),
            "cannot carry",
        ),
    ):
        with pytest.raises(TaskDefinitionError, match=phrase):
            carried_task.replace(scene=text)


def test_a_held_task_with_hostile_asset_names_fails_to_compile_and_reads_nothing(
    carried_task, tmp_path, monkeypatch
):
    """A trusted writer's task record names `../site.key`: knowledge keeps it as data; fetching it
    as a task is a TaskDefinitionError naming the name, and no blob is asked for."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.key").write_text(BOX)
    writer = Identity.generate()
    definition = carried_task.to_json()
    definition["assets"] = {"../site.key": hashlib.sha256(BOX.encode()).hexdigest()}
    asked: list[str] = []

    class Watching:
        name = "watching"

        def fetch_blob(self, blob) -> bool:
            asked.append(blob.hash)
            return False

    with (
        knowledge.open(tmp_path / "w.db", writer) as author,
        knowledge.open(
            tmp_path / "v.db",
            Identity.generate(),
            policy=TrustPolicy().with_root(writer.public_key),
        ) as here,
    ):
        task_hash = author.tasks.publish(definition, assets={"../site.key": BOX.encode()})
        here.ingest(author.envelopes_since({}))
        here.blobs.add_source(Watching())
        with pytest.raises(TaskDefinitionError, match=r"'\.\./site\.key'"):
            sim.fetch_task(here, task_hash)
        assert asked == []


# --- checkpoint checks ----------------------------------------------------------------------------


def test_a_hostile_peer_cannot_settle_or_fork_an_unchecked_checkpoint(
    live, tmp_path, hostile_peers
):
    """The peer holds the writer's real history and a stranger's feed, and sends: envelopes 2..5
    without 1; the stranger's envelopes; envelope 1 again on every pull, for ever. Every round
    ends, nothing is kept as a fork, the check gets no further than envelope 1; an honest holder
    of the history then checks the checkpoint."""
    writer, stranger, newcomer = Identity.generate(), Identity.generate(), Identity.generate()
    p = live("p")
    trust(p, writer.public_key)
    trust(p, newcomer.public_key)
    p.start()
    real = knowledge.open(tmp_path / "real.db", writer)
    for i in range(5):
        real.skills.publish(f"skill-{i}", "pick")
    federation.sync_with(real, p.url, p.key.public_key)
    with knowledge.open(tmp_path / "stranger.db", stranger) as other:
        other.skills.publish("planted", "pick")
        foreign = other.envelopes_since({})
    history = real.envelopes_since({})
    assert len(history) == 5
    policy = TrustPolicy().with_root(writer.public_key).with_root(p.key.public_key)
    with knowledge.open(tmp_path / "new.db", newcomer, policy=policy) as site:
        site.ingest([real.checkpoint().raw])
        unchecked = {writer.public_key_hex: (5, 0)}
        assert site.unchecked_checkpoints() == unchecked
        for pages in (
            lambda n: history[1:],  # a hole where envelope 1 should be
            lambda n: foreign,  # envelopes of a writer nobody trusts here
            lambda n: history[4:] + foreign,
            lambda n: history[:1],  # envelope 1, replayed on every pull
        ):
            peer = hostile_peers(pages, lambda: wire_heads(site))
            started = time.monotonic()
            federation.sync_with(site, peer.url, Identity.generate().public_key, page=5)
            assert time.monotonic() - started < 20 and peer.pulls <= 3, peer.pulls
            assert site.equivocations() == []
            assert site.heads()[writer.public_key_hex].seq == 5  # the checkpoint's head stands
            assert len(site.skills.list()) == 5
            done = site.unchecked_checkpoints()[writer.public_key_hex]
            assert done[0] == 5 and done[1] <= 1, done
        report = federation.sync_with(site, p.url, p.key.public_key, page=2)
        assert not report.rejected and site.unchecked_checkpoints() == {}
        assert site.equivocations() == [] and len(site.skills.list()) == 5
    assert p.heads()["equivocators"] == []
    p.assert_no_traceback()
    real.close()


def test_a_pull_naming_many_unchecked_writers_gets_only_the_histories_it_may_read(live, tmp_path):
    """Attack: a trusted peer names every writer it can think of as unchecked, with every `after`,
    to make the site send histories in bulk; the page stays within its limit and holds only the
    named writers' envelopes after `after`, and a body naming more than the body limit allows is
    refused with 413 before it is parsed."""
    writer, peer = Identity.generate(), Identity.generate()
    p = live("p", limits=ServerLimits(max_body_bytes=256 << 10))
    trust(p, writer.public_key)
    trust(p, peer.public_key)
    p.start()
    with knowledge.open(tmp_path / "w.db", writer) as real:
        for i in range(6):
            real.skills.publish(f"skill-{i}", "pick")
        federation.sync_with(real, p.url, p.key.public_key)
        history = real.envelopes_since({})
    heads = {writer.public_key_hex: 6, p.key.public_key_hex: 10**6}
    unchecked = {bytes([i]).hex() * 32: {"seq": 9, "after": 0} for i in range(200)}
    unchecked[writer.public_key_hex] = {"seq": 5, "after": 2}
    body = json.dumps({"heads": heads, "unchecked": unchecked, "limit": 2}).encode()
    headers = {
        "authorization": signed(peer, p.key.public_key, "POST", "/v1/sync", body),
        "content-type": "application/json",
    }
    with httpx.Client(base_url=p.url, timeout=10) as client:
        answer = client.post("/v1/sync", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert (
            decode_page(answer.content, max_count=2, max_envelope_bytes=1 << 20) == history[2:4]
        )  # envelopes 3 and 4: at most `limit`
        huge = {"heads": {}, "unchecked": {f"{i:064x}": {"seq": 2} for i in range(20_000)}}
        body = json.dumps(huge).encode()
        headers["authorization"] = signed(peer, p.key.public_key, "POST", "/v1/sync", body)
        assert client.post("/v1/sync", content=body, headers=headers).status_code == 413
    assert p.heads()["heads"][writer.public_key_hex] == 6
    p.assert_no_traceback()


# --- own-feed waiting ----------------------------------------------------------------------------


def root_trusted_by_b(live, tmp_path):
    """(b, root_key, key_path, policy): a live site b trusting a site root whose key is saved to a
    file, and the root's policy trusting b."""
    b = live("b")
    root_key = Identity.generate()
    key_path = tmp_path / "root.key"
    root_key.save(key_path)
    trust(b, root_key.public_key, (Role.PUBLISH, Role.VALIDATE))
    b.start()
    return b, root_key, key_path, TrustPolicy().with_root(b.key.public_key)


def three_envelopes_at_b(tmp_path, b, root_key: Identity, policy: TrustPolicy) -> str:
    """The root writes 3 envelopes and gives them to b; the hash of its head."""
    with knowledge.open(tmp_path / "old.db", root_key, policy=policy) as old:
        for i in range(3):
            old.skills.publish(f"s{i}", "pick")
        federation.sync_with(old, b.url, b.key.public_key)
        return old.heads()[root_key.public_key_hex].hash


def reinstalled_root(tmp_path, name: str, key_path, peers: list[bytes], policy: TrustPolicy):
    """A site root's store re-created empty for its old key, loaded from its file (not new)."""
    kb = knowledge.open(tmp_path / f"{name}.db", Identity.load(key_path), policy=policy)
    kb.expect_own_feed_from(peers)
    return kb


def test_a_configured_peer_claiming_more_of_a_roots_feed_keeps_it_waiting_and_never_forks(
    live, tmp_path, hostile_peers
):
    """The root wrote 3 envelopes, held by its honest peer b. Re-installed with an empty store, it
    syncs with b (its feed back) and with a hostile configured peer h whose heads claim the root's
    feed at seq 10^6, or at seq 3 under another hash: h never confirms, so the root does not
    write, and says it waits for h. Dropping h from the peers it waits for lets it write seq 4."""
    b, root_key, key_path, policy = root_trusted_by_b(live, tmp_path)
    real_hash = three_envelopes_at_b(tmp_path, b, root_key, policy)
    h_key = Identity.generate().public_key
    for claim in ({"seq": 10**6, "hash": "ab" * 32}, {"seq": 3, "hash": "cd" * 32}):

        def lying_heads(claim=claim) -> dict:
            author = root_key.public_key_hex
            return {
                "heads": {author: claim["seq"]},
                "hashes": {author: claim["hash"]},
                "equivocators": [],
            }

        h = hostile_peers(lambda n: [], lying_heads)
        name = f"new-{claim['seq']}"
        root = reinstalled_root(tmp_path, name, key_path, [b.key.public_key, h_key], policy)
        with root:
            with pytest.raises(NotAuthorizedError, match="sync with every peer first"):
                root.skills.publish("too early", "pick")
            federation.sync_with(root, h.url, h_key)
            federation.sync_with(root, b.url, b.key.public_key)
            assert root.heads()[root_key.public_key_hex].hash == real_hash  # its feed, back
            for _ in range(2):  # and asked again: h's word never changes
                federation.sync_with(root, h.url, h_key)
            with pytest.raises(NotAuthorizedError, match=h_key.hex()[:16]):
                root.skills.publish("would follow a lie", "pick")
            assert root.heads()[root_key.public_key_hex].seq == 3
            root.expect_own_feed_from([b.key.public_key])  # the operator drops h
            root.skills.publish("after", "pick")
            assert root.heads()[root_key.public_key_hex].seq == 4
    assert b.heads()["equivocators"] == []
    b.assert_no_traceback()


def test_whoever_answers_at_a_peers_address_without_its_key_confirms_nothing(
    live, tmp_path, hostile_peers
):
    """A man in the middle answers in b's place with heads showing none of the re-installed root's
    feed: first unsigned, then replaying a heads answer b really signed (captured before b held
    the feed). Neither is b's word on this request, so the root keeps waiting; b itself then
    confirms and the root writes seq 4, not seq 1 again."""
    b, root_key, key_path, policy = root_trusted_by_b(live, tmp_path)
    auth = federation.SimnetAuth(root_key, b.key.public_key)
    captured = httpx.get(f"{b.url}/v1/heads", auth=auth)  # genuine, signed, none of the feed
    signature = {"simnet-signature": captured.headers["simnet-signature"]}
    three_envelopes_at_b(tmp_path, b, root_key, policy)
    impostor = hostile_peers(lambda n: [])
    with reinstalled_root(tmp_path, "new", key_path, [b.key.public_key], policy) as root:
        for answer in (None, (captured.content, signature)):
            impostor.heads_answer = answer
            report = federation.sync_with(root, impostor.url, b.key.public_key)
            assert not report.heads_signed
            with pytest.raises(NotAuthorizedError, match=b.key.public_key.hex()[:16]):
                root.skills.publish("would fork", "pick")
        assert federation.sync_with(root, b.url, b.key.public_key).heads_signed
        root.skills.publish("after", "pick")
        assert root.heads()[root_key.public_key_hex].seq == 4
    assert b.heads()["equivocators"] == []
    b.assert_no_traceback()


def test_a_peer_pulling_from_a_waiting_root_does_not_confirm_its_feed(live, tmp_path):
    """A re-installed site root waits for its configured peer b. Another site x that the root
    trusts pulls from it (as x, with heads showing none of the root's feed) and so does b: neither
    pull is b's word read by the root, so the root still refuses to write, and names b."""
    a, b, x = live("a"), live("b"), live("x")
    for site in (a, b, x):
        for other in (a, b, x):
            if other is not site:
                trust(site, other.key.public_key)
        site.start()
    simnet(a, "peer", "add", "b", b.url, "--key", b.key.public_key_hex)
    simnet(a, "device", "add", Identity.generate().public_key_hex, "--roles", "publish")
    simnet(a, "sync")
    assert b.heads()["heads"][a.key.public_key_hex] == 1
    a.stop()
    for path in a.home.glob("site.db*"):
        path.unlink()
    a.start()
    hashes = {a.key.public_key_hex: "ef" * 32}
    for who in (x.key, b.key):
        body = json.dumps({"heads": {a.key.public_key_hex: 0}, "hashes": {}}).encode()
        for method, target, content in (
            ("POST", "/v1/sync", body),
            ("GET", "/v1/heads", b""),
            (
                "POST",
                "/v1/sync",
                json.dumps({"heads": {a.key.public_key_hex: 1}, "hashes": hashes}).encode(),
            ),
        ):
            headers = {"authorization": signed(who, a.key.public_key, method, target, content)}
            with httpx.Client(base_url=a.url, timeout=10) as client:
                answer = client.request(method, target, content=content, headers=headers)
            assert answer.status_code == 200, answer.text
    simnet(x, "peer", "add", "a", a.url, "--key", a.key.public_key_hex)
    simnet(x, "sync", "a")  # a whole round, as x
    answer = subprocess_device_add(a)
    assert answer.returncode != 0 and "Traceback" not in answer.stderr, answer
    assert (
        "sync with every peer first" in answer.stderr and b.key.public_key_hex[:16] in answer.stderr
    )
    assert a.key.public_key_hex not in a.heads()["heads"]
    simnet(a, "sync", "b")
    simnet(a, "device", "add", Identity.generate().public_key_hex, "--roles", "publish")
    simnet(a, "sync")
    for site in (a, b):
        heads = site.heads()
        assert heads["heads"][a.key.public_key_hex] == 2 and heads["equivocators"] == []
        site.assert_no_traceback()


def subprocess_device_add(site):
    return subprocess.run(
        [*SIMNET, "--home", str(site.home), "device", "add", Identity.generate().public_key_hex],
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- map tiles over the wire ----------------------------------------------------------------------


def _tile_text(columns=(), **fields) -> str:
    """A tile record of two cells (as tests/knowledge/test_ingest.py builds them), with some of
    its columns or fields changed."""
    packed = {
        "idx": ("<u2", [0, 5]),
        "conf": ("<f8", [0.5, 0.9]),
        "hlc": ("<u8", [1, 2]),
        "code": ("<u4", [0, 0]),
        "deleted": ("u1", [0, 0]),
    }
    for name, value in dict(columns).items():
        packed[name] = (packed[name][0], value)
    conf = packed.pop("conf")
    raw = b"".join(np.array(v, dtype).tobytes() for dtype, v in packed.values())
    record = {"v": 1, "hlc": 2, "n": 2, "values": ["wall"]}
    record["cells"] = base64.b64encode(zlib.compress(raw)).decode()
    record["confidence"] = base64.b64encode(np.array(conf[1], conf[0]).tobytes()).decode()
    record.update(fields)
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def test_a_hostile_tile_pushed_to_a_live_site_is_refused_with_its_reason(live, tmp_path):
    """A device with the publish role writes tile records its own checks would refuse (a NaN
    confidence, a cell index outside the tile, a key beyond 32-bit coordinates, a record time
    after its envelope's) and pushes them: each envelope is refused with the tile's reason, the
    site's map shows only the good tile, and its heads stop before the first bad envelope."""
    site = live("site").start()
    robot = device(site, tmp_path, "robot", "publish")
    robot.maps["m"].observe_many([(0, 0), (1, 0)], ["wall", "door"], 0.5)
    federation.sync_with(robot, site.url, site.key.public_key)
    good_seq = robot.heads()[robot.identity.public_key_hex].seq
    for key, text, reason, phrase in (
        ("tile/m/1,1", _tile_text({"conf": [0.5, float("nan")]}), "invalid_tile", "nan"),
        ("tile/m/1,1", _tile_text({"idx": [0, 4096]}), "invalid_tile", "outside the tile"),
        ("tile/m/33554432,0", _tile_text(), "invalid_tile", "beyond 32-bit"),
        ("tile/m/0,0", _tile_text(hlc=2**63), "record_clock_ahead", ""),
    ):
        with knowledge.open(":memory:", robot.identity, policy=robot.policy) as twin:
            twin.ingest(robot.envelopes_since({}))
            twin.learn_site_heads(robot.heads())
            twin._replica.write({key: text})  # as a writer that skips its own checks
            (bad,) = twin.envelopes_since(robot.heads())
        answer = push(site, robot.identity, [bad])
        (refused,) = answer["rejected"]
        assert refused["reason"] == reason and phrase in refused["detail"], refused
        assert answer["accepted"] == 0
        assert site.heads()["heads"][robot.identity.public_key_hex] == good_seq
    site.stop()
    with knowledge.open(site.home / "site.db") as view:
        cells = view.maps["m"].region((0, 0), (64, 64))
        assert sorted(cells.values.tolist()) == ["door", "wall"]
    site.start()
    site.assert_no_traceback()
    robot.close()

import errno
import os
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import CorruptLogError, WorldError
from sim.world._redo import Record, RedoFile

# a record: what JSON holds, and blobs stored as they are
records = st.lists(
    st.tuples(
        st.lists(st.text(max_size=40), max_size=4), st.lists(st.binary(max_size=60), max_size=3)
    ),
    min_size=1,
    max_size=8,
)
settings_ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def numbered(items, first=1):
    return [Record(n, meta, blobs) for n, (meta, blobs) in enumerate(items, start=first)]


def written(path, world_id, items):
    redo = RedoFile(path, world_id, fsync=False, folded=0)
    ends = []
    for meta, blobs in items:
        redo.append(meta, blobs)
        ends.append(redo.size)
    redo.close()
    return ends


def test_records_are_numbered_read_back_in_order_and_survive_reopening(tmp_path):
    written(tmp_path / "w-redo", "world", [({"a": [1, "x"]}, []), ({"b": None}, [])])
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=True, folded=0)
    assert redo.unfolded and redo.unfolded_records() == [
        Record(1, {"a": [1, "x"]}, []),
        Record(2, {"b": None}, []),
    ]
    redo.close()
    redo = RedoFile(
        tmp_path / "w-redo", "world", fsync=True, folded=1
    )  # the SQLite file holds the first
    assert redo.unfolded_records() == [Record(2, {"b": None}, [])] and redo.last == 1
    redo.last = 2
    redo.append({"c": 3})
    assert [r.n for r in redo.unfolded_records()] == [2, 3]
    redo.folded_to(3)
    assert (
        not redo.unfolded
        and redo.unfolded_records() == []
        and (tmp_path / "w-redo").stat().st_size == 0
    )
    redo.append({"d": 4})
    assert redo.unfolded_records() == [Record(4, {"d": 4}, [])]
    redo.close()


@settings_
@given(items=records, cut=st.floats(0, 1, exclude_max=True))
def test_a_torn_last_record_is_cut_off_and_the_whole_ones_kept(tmp_path_factory, items, cut):
    """Whatever byte the writer died at, the records before it read back and the file ends after
    them."""
    path = tmp_path_factory.mktemp("r") / "w-redo"
    ends = written(path, "world", items)
    at = int(cut * ends[-1])
    with open(path, "r+b") as file:
        file.truncate(at)
    whole = [end for end in ends if end <= at]
    redo = RedoFile(path, "world", fsync=False, folded=0)
    assert redo.unfolded_records() == numbered(items[: len(whole)])
    assert path.stat().st_size == redo.size == (whole[-1] if whole else 0)
    redo.close()


@settings_
@given(items=records, where=st.floats(0, 1, exclude_max=True), flip=st.integers(1, 255))
def test_any_changed_byte_is_an_error_and_the_file_is_left_as_it_is(
    tmp_path_factory, items, where, flip
):
    """Except in the last record's checksum or payload: a power loss can leave that torn at full
    length."""
    path = tmp_path_factory.mktemp("r") / "w-redo"
    ends = written(path, "world", items)
    data = bytearray(path.read_bytes())
    at = int(where * ends[-1])
    data[at] ^= flip
    path.write_bytes(bytes(data))
    redo = RedoFile(path, "world", fsync=False, folded=0)
    last = ends[-2] if len(ends) > 1 else 0
    if at >= last + 20:  # past the last record's marker, length and header check
        assert redo.unfolded_records() == numbered(items[:-1]) and path.stat().st_size == last
    else:
        with pytest.raises(
            CorruptLogError, match="fails its checksum; nothing was applied from it or after it"
        ):
            redo.unfolded_records()
        assert path.read_bytes() == data
    redo.close()


def test_another_worlds_records_are_refused(tmp_path):
    written(tmp_path / "w-redo", "one world", [({}, [])])
    redo = RedoFile(tmp_path / "w-redo", "another world", fsync=False, folded=0)
    with pytest.raises(
        CorruptLogError, match="the header of the commit at byte 0 fails its checksum"
    ):
        redo.unfolded_records()
    redo.close()


def test_a_torn_write_that_cannot_be_undone_closes_the_file_and_the_next_open_cuts_it(
    tmp_path, monkeypatch
):
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    redo.append({})
    pwrite = os.pwrite

    def full(
        fd, data, offset
    ):  # faults: half the record reaches the file, the disk is full, and stays so
        pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    def stuck(fd, length):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(os, "ftruncate", stuck)
    with pytest.raises(WorldError, match="could not be written .*No space left"):
        redo.append({"pad": "x" * 100})
    monkeypatch.undo()
    with pytest.raises(
        WorldError, match="could not be written"
    ):  # nothing is written after a torn record
        redo.append({})
    assert redo.unfolded_records() == [
        Record(1, {}, [])
    ]  # what it acknowledged can still be folded: its own rows
    redo._kept = None  # as if another process had written them
    with pytest.raises(WorldError, match="cannot be read"):
        redo.unfolded_records()
    reopened = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    assert (
        reopened.unfolded_records() == [Record(1, {}, [])]
        and reopened.size == (tmp_path / "w-redo").stat().st_size
    )
    reopened.close()


@pytest.mark.parametrize("where", ["fdatasync", "pwrite"])
def test_an_interrupted_append_takes_its_record_back(tmp_path, monkeypatch, where):
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=True, folded=0)
    redo.append({})
    call = getattr(os, where)

    def interrupted(*args):  # Ctrl-C while the record is synced, or just after it is written
        call(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        redo.append({"lost": True})
    monkeypatch.undo()
    assert (redo.last, redo.size) == (1, (tmp_path / "w-redo").stat().st_size)
    redo.append({"after": True})
    assert redo.unfolded_records() == [Record(1, {}, []), Record(2, {"after": True}, [])]
    redo.close()


def test_a_zero_filled_tail_is_cut_off_and_numbers_out_of_sequence_are_refused(tmp_path):
    written(tmp_path / "w-redo", "world", [({}, []), ({}, [b"\x00" * 9])])
    with open(tmp_path / "w-redo", "ab") as file:
        file.write(bytes(5000))  # blocks a power loss allocated and never wrote
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    assert (
        redo.unfolded_records() == [Record(1, {}, []), Record(2, {}, [b"\x00" * 9])]
        and (tmp_path / "w-redo").stat().st_size == redo.size
    )
    redo.close()
    redo = RedoFile(
        tmp_path / "w-redo", "world", fsync=False, folded=5
    )  # the file is behind the SQLite file
    redo.last = 5
    redo.append({})
    redo.last = 1
    redo.append({})  # a record numbered 2 after 6
    with pytest.raises(CorruptLogError, match="commit 2 comes after commit 6"):
        redo.unfolded_records()
    redo.close()
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    with pytest.raises(CorruptLogError, match=r"commit 3 is missing \(found 6\)"):
        redo.unfolded_records()
    redo.close()


def test_a_fold_takes_this_processs_own_records_from_memory_and_reads_the_file_otherwise(
    tmp_path, monkeypatch
):
    written(tmp_path / "w-redo", "world", [({"a": 1}, [])])  # a session that died before folding
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    reads = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda *args: reads.append(args) or pread(*args))
    assert (
        redo.unfolded_records() == [Record(1, {"a": 1}, [])] and len(reads) == 1
    )  # another's records: from the file
    redo.folded_to(1)
    redo.append({"b": 2})
    redo.append({"c": 3})
    assert (
        redo.unfolded_records() == [Record(2, {"b": 2}, []), Record(3, {"c": 3}, [])]
        and len(reads) == 1
    )  # its own
    redo.last += (
        1  # a record it wrote but lost track of (an interrupt after the write): the file again
    )
    with pytest.raises(CorruptLogError, match="commit 4 is missing"):
        redo.unfolded_records()
    assert len(reads) == 2
    redo.close()


def test_blobs_are_stored_as_they_are(tmp_path):
    state = bytes(range(256)) * 4
    written(tmp_path / "w-redo", "world", [(["events"], [b'[[1,"a"]]', state])])
    data = (tmp_path / "w-redo").read_bytes()
    assert data.startswith(b"SIMREDO\x02") and data.endswith(b'[[1,"a"]]' + state)
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    assert redo.unfolded_records() == [Record(1, ["events"], [b'[[1,"a"]]', state])]
    redo.close()


def test_records_of_format_1_are_read_and_a_torn_one_cut_off(tmp_path, format_1):
    """What an older simnet left unfolded (a SHA-256 and a JSON payload) is read back."""
    first, second = format_1("world", 1, {"rows": ["a"]}), format_1("world", 2, {"rows": []})
    (tmp_path / "w-redo").write_bytes(first + second[:-3])  # its writer died in the second
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    assert redo.unfolded_records() == [Record(1, {"rows": ["a"]}, None)]
    assert (tmp_path / "w-redo").stat().st_size == len(first)
    redo.last = 1
    redo.append({"rows": ["b"]})  # after a fold whose file could not be emptied: formats in turn
    assert redo.unfolded_records() == [
        Record(1, {"rows": ["a"]}, None),
        Record(2, {"rows": ["b"]}, []),
    ]
    redo.close()


def sealed(mark, payload, world_id=b"world"):
    """A record under sound checksums, whatever its payload."""
    length = struct.pack("<Q", len(payload))
    salted = zlib.crc32(world_id)
    return (
        struct.pack(
            "<8sQII",
            mark,
            len(payload),
            zlib.crc32(length, zlib.crc32(mark, salted)),
            zlib.crc32(payload, salted),
        )
        + payload
    )


@pytest.mark.parametrize(
    ("mark", "payload", "error"),
    [
        (b"SIMREDO\x03", b"\x00" * 10, "is in redo format 3, which this simnet does not read"),
        (b"SIMREDO\x02", struct.pack("<I", 3) + b"[1,", "passes its checksum but cannot be read"),
    ],
)
def test_a_record_of_another_format_or_unreadable_is_refused(tmp_path, mark, payload, error):
    record = sealed(mark, payload)
    (tmp_path / "w-redo").write_bytes(record)
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False, folded=0)
    with pytest.raises(CorruptLogError, match=error):
        redo.unfolded_records()
    assert (tmp_path / "w-redo").read_bytes() == record
    redo.close()

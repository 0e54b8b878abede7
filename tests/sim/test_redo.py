import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import CorruptLogError, WorldError
from sim._redo import RedoFile

records = st.lists(st.fixed_dictionaries({"n": st.integers(0, 10**6), "rows": st.lists(st.text(max_size=40), max_size=4)}),
                   min_size=1, max_size=8)
settings_ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def written(path, world_id, items):
    redo = RedoFile(path, world_id, fsync=False)
    ends = []
    for record in items:
        redo.append(record)
        ends.append(redo.size)
    redo.close()
    return ends


def test_records_read_back_in_order_and_survive_reopening(tmp_path):
    written(tmp_path / "w-redo", "world", [{"n": 1, "a": [1, "x"]}, {"n": 2, "b": None}])
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=True)
    assert redo.records() == [{"n": 1, "a": [1, "x"]}, {"n": 2, "b": None}]
    redo.append({"n": 3})
    assert [r["n"] for r in redo.records()] == [1, 2, 3]
    redo.clear()
    assert redo.records() == [] and (tmp_path / "w-redo").stat().st_size == 0
    redo.close()


@settings_
@given(items=records, cut=st.floats(0, 1, exclude_max=True))
def test_a_torn_last_record_is_cut_off_and_the_whole_ones_kept(tmp_path_factory, items, cut):
    """Whatever byte the writer died at, the records before it read back and the file ends after them."""
    path = tmp_path_factory.mktemp("r") / "w-redo"
    ends = written(path, "world", items)
    at = int(cut * ends[-1])
    with open(path, "r+b") as file:
        file.truncate(at)
    whole = [end for end in ends if end <= at]
    redo = RedoFile(path, "world", fsync=False)
    assert redo.records() == items[:len(whole)]
    assert path.stat().st_size == redo.size == (whole[-1] if whole else 0)
    redo.close()


@settings_
@given(items=records, where=st.floats(0, 1, exclude_max=True), flip=st.integers(1, 255))
def test_any_changed_byte_is_an_error_and_the_file_is_left_as_it_is(tmp_path_factory, items, where, flip):
    path = tmp_path_factory.mktemp("r") / "w-redo"
    ends = written(path, "world", items)
    data = bytearray(path.read_bytes())
    data[int(where * ends[-1])] ^= flip
    path.write_bytes(bytes(data))
    redo = RedoFile(path, "world", fsync=False)
    with pytest.raises(CorruptLogError, match="fails its checksum; nothing was applied from it or after it"):
        redo.records()
    assert path.read_bytes() == data
    redo.close()


def test_another_worlds_records_are_refused(tmp_path):
    written(tmp_path / "w-redo", "one world", [{"n": 1}])
    redo = RedoFile(tmp_path / "w-redo", "another world", fsync=False)
    with pytest.raises(CorruptLogError, match="the commit at byte 0 fails its checksum"):
        redo.records()
    redo.close()


def test_a_torn_write_that_cannot_be_undone_closes_the_file_and_the_next_open_cuts_it(tmp_path, monkeypatch):
    redo = RedoFile(tmp_path / "w-redo", "world", fsync=False)
    redo.append({"n": 1})
    pwrite = os.pwrite

    def full(fd, data, offset):  # faults: half the record reaches the file, the disk is full, and stays so
        pwrite(fd, data[:len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    def stuck(fd, length):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(os, "ftruncate", stuck)
    with pytest.raises(WorldError, match="could not be written .*No space left"):
        redo.append({"n": 2, "pad": "x" * 100})
    monkeypatch.undo()
    with pytest.raises(WorldError, match="could not be written"):  # nothing is written after a torn record
        redo.append({"n": 3})
    with pytest.raises(WorldError, match="cannot be read"):
        redo.records()
    reopened = RedoFile(tmp_path / "w-redo", "world", fsync=False)
    assert reopened.records() == [{"n": 1}] and reopened.size == (tmp_path / "w-redo").stat().st_size
    reopened.close()

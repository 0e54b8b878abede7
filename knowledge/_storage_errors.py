"""Why a store could not be opened or written, in words: a full disk, a read-only file, folder
or file system, or another failure, each a `StoreError` subclass naming the store's path. SQLite
and the OS report these as codes; a user needs to know what to fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from pathlib import Path

from ._errors import StoreError, StoreFullError, StoreReadOnlyError

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_READ_ONLY_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_READ_ONLY_CODES = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM})
_LOW_SPACE = 64 << 10  # bytes free below which an I/O error is taken for a full disk


def is_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk is full: SQLITE_FULL, or an OSError ENOSPC, EDQUOT or EFBIG."""
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def storage_error(path: str | os.PathLike[str], exc: BaseException, doing: str) -> StoreError:
    """The StoreError for an sqlite3.Error or OSError met while `doing` ("open", "write", ...) the
    store at `path`: StoreFullError, StoreReadOnlyError, or StoreError, each naming the path.

    SQLite reports some failures of a full disk as I/O errors (growing the log's index): an I/O
    error on a disk with (almost) no space left is taken for a full disk."""
    where = f"cannot {doing} the store {path}"
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    io_error = code == sqlite3.SQLITE_IOERR or (isinstance(exc, OSError) and exc.errno == errno.EIO)
    if is_full(exc) or (io_error and _no_space(Path(path).absolute().parent)):
        detail = getattr(exc, "sqlite_errorname", None) or _reason(exc)
        kept = "; nothing of this write was kept" if doing == "write" else ""
        return StoreFullError(
            f"{where}: the disk is full ({detail}){kept}. Free space on the disk and retry"
        )
    if doing != "read" and (
        (isinstance(exc, OSError) and exc.errno in _READ_ONLY_ERRNOS)
        or code in _READ_ONLY_CODES
        or (code == sqlite3.SQLITE_CANTOPEN and _read_only_part(Path(path)) is not None)
    ):
        return StoreReadOnlyError(
            f"cannot write the store {path}: {_read_only_part(Path(path)) or 'it is read-only'} "
            "(it can still be opened read-only)"
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOENT:
        folder = Path(path).absolute().parent
        if not folder.is_dir():
            return StoreError(f"{where}: its folder {folder} does not exist")
    return StoreError(f"{where}: {_reason(exc)}")


def _no_space(folder: Path) -> bool:
    """Whether the file system holding `folder` has (almost) no space, or no inodes, left for us."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    blocks, inodes = (st.f_bfree, st.f_ffree) if os.geteuid() == 0 else (st.f_bavail, st.f_favail)
    return blocks * st.f_frsize < _LOW_SPACE or (st.f_files > 0 and inodes == 0)


def _reason(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _read_only_part(path: Path) -> str | None:
    """What makes the store at `path` read-only for this process, if anything does."""
    folder = path.absolute().parent
    with contextlib.suppress(OSError):
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"it is on a file system mounted read-only ({folder})"
    for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")):
        if part.exists() and not os.access(part, os.W_OK, effective_ids=True):
            return f"the file {part} is read-only"
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
        return f"its folder {folder} is read-only"
    return None

"""Advisory file locks: one run per program (and per view) at a time on a warehouse."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from incr.errors import StorageError


@contextlib.contextmanager
def locked(path: Path, what: str) -> Iterator[None]:
    """Holds an exclusive lock on ``path``; fails at once if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise StorageError(f"{what} is being updated by {holder}; wait for it to finish "
                               f"(lock file {path})") from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)

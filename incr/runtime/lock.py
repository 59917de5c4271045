"""Advisory file locks, one per thing a run writes: the ledger, a source's row index, a view.

A program's tasks lock only what they write, so Airflow's parallel ``apply_<view>`` tasks
never wait for each other: each holds its own view's lock, ``prepare`` holds the ledger's
and the row indexes', and a whole ``incr run`` holds them all.  Locks are ``flock`` locks,
released by the kernel when the holder dies, so a crashed run never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from incr.errors import StorageError

_POLL_S = 0.05


@contextlib.contextmanager
def locked(path: Path, what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Holds an exclusive lock on ``path``.

    Waits up to ``wait_s`` seconds for another holder (0: fails at once), then raises a
    StorageError naming the holder (its pid) and the lock file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                    waited = f" (waited {wait_s:g} s)" if wait_s else ""
                    raise StorageError(f"{what} is being updated by {holder}{waited}; wait for it to "
                                       f"finish (lock file {path})") from e
                time.sleep(_POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)


class Locks:
    """The locks of one program on one warehouse, and which of them this object holds.

    A lock is taken at most once per object: asking again for one already held (the ledger
    while a whole run holds it) is a no-op, so code that writes the ledger can ask for its
    lock whether or not its caller took it.
    """

    def __init__(self, root: Path, program: str):
        self.root = root
        self.program = program
        self._held: set[str] = set()

    @contextlib.contextmanager
    def hold(self, *, ledger: bool = False, indexes: tuple[str, ...] = (),
             views: tuple[str, ...] = (), wait_s: float = 0.0) -> Iterator[None]:
        """Takes the named locks in one global order (ledger, indexes, views), so two holders
        can never wait on each other in a cycle."""
        wanted = ([("ledger", f"the ledger of program {self.program}")] if ledger else [])
        wanted += [(f"rows-{t}", f"the row index of {t} (program {self.program})")
                   for t in sorted(indexes)]
        wanted += [(f"view-{v}", f"view {v} (program {self.program})") for v in sorted(views)]
        with contextlib.ExitStack() as stack:
            for name, what in wanted:
                if name in self._held:
                    continue
                stack.enter_context(locked(self.root / f"{name}.lock", what, wait_s))
                self._held.add(name)
                stack.callback(self._held.discard, name)
            yield

"""Advisory file locks, one per thing a run writes: the ledger, a source's row index, a view.

A program's tasks lock only what they write, so Airflow's parallel ``apply_<view>`` tasks
never wait for each other: each holds its own view's lock, ``prepare`` holds the ledger's
and the row indexes', and a whole ``incr run`` holds them all.  Views sharing a state hold
its lock exclusively to fold into it; a view whose shared state is already folded holds it
*shared* (readers: no fold moves the state meanwhile) and its own answer's lock while it
publishes, so the views of one state publish at once.  Locks are ``flock`` locks, released
by the kernel when the holder dies, so a crashed run never leaves a stale lock.

In a warehouse kept in a bucket (:mod:`incr.runtime.bucket`) each lock is also a lease in the
bucket, for the machines that share it. Taking locks there brings the working copy up to the
bucket (what the locks now guard may have changed elsewhere), and letting them go pushes
what changed here first.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from incr.errors import StorageError
from incr.runtime import faults

if TYPE_CHECKING:
    from incr.runtime.bucket import BucketWarehouse

_POLL_S = 0.05
_PID_WIDTH = 32
_HOLDER_WAIT_S = 0.5


def _holder(fd: int) -> str:
    """Who holds the lock, as ``pid N``, for the message of a process that cannot take it.

    The holder writes its pid just after taking the lock, so for a moment the file still
    names the previous holder (maybe dead); that is read again until it names a live process.
    """
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        text = os.pread(fd, _PID_WIDTH, 0).decode(errors="replace").strip()
        pid = text.removeprefix("pid ")
        if pid.isdigit() and alive(int(pid)):
            return text
        if time.monotonic() >= deadline:
            return "another process (its pid is not recorded yet)"
        time.sleep(_POLL_S)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


@contextlib.contextmanager
def locked(path: Path, what: str, wait_s: float = 0.0, shared: bool = False) -> Iterator[int]:
    """Holds an exclusive lock on ``path`` (with ``shared``, one that other shared holders
    hold too, and an exclusive one excludes); yields the lock file's descriptor.

    Waits up to ``wait_s`` seconds for another holder (0: fails at once), then raises a
    StorageError naming the holder (its pid) and the lock file.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StorageError(f"cannot take the lock of {what}: {e.strerror} ({path}); incr needs to "
                           f"write in the warehouse") from e
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    waited = f" (waited {wait_s:g} s)" if wait_s else ""
                    raise StorageError(f"{what} is being updated by {holder}{waited}; wait for it to "
                                       f"finish (lock file {path})") from e
                time.sleep(_POLL_S)
        # One write of a fixed width: a reader never sees the file empty or half-written.
        # (Shared holders each write theirs: the file names one of them.)
        os.pwrite(fd, f"pid {os.getpid()}".ljust(_PID_WIDTH).encode(), 0)
        os.ftruncate(fd, _PID_WIDTH)
        yield fd
    finally:
        os.close(fd)


class Locks:
    """The locks of one program on one warehouse, and which of them this object holds.

    A lock is taken at most once per object: asking again for one already held (the ledger
    while a whole run holds it) is a no-op, so code that writes the ledger can ask for its
    lock whether or not its caller took it.
    """

    def __init__(self, root: Path, program: str,
                 shared: Mapping[str, tuple[str, ...]] | None = None,
                 bucket: BucketWarehouse | None = None):
        """``shared``: the views of each state several views share (its lock is theirs).
        ``bucket``: the warehouse's bucket, when ``root`` is in its working copy."""
        self.root = root
        self.bucket = bucket
        self.program = program
        self.shared = dict(shared or {})
        self._held: dict[str, bool] = {}  # the locks held, and whether shared
        self._taken: dict[str, int] = {}  # when each lock held was taken (see holding())
        self._takes = itertools.count()

    def holding(self, view: str) -> int | None:
        """While this object holds the lock of ``view`` (a view's or a shared state's, in
        either mode), a number that stands for this hold of it, else None.  No other process
        refreshes the view meanwhile, so what the hold saw of its state stays true until
        the number changes."""
        return self._taken.get(f"view-{view}")

    @contextlib.contextmanager
    def hold(self, *, ledger: bool = False, indexes: tuple[str, ...] = (),
             views: tuple[str, ...] = (), reading: tuple[str, ...] = (),
             answers: tuple[str, ...] = (), wait_s: float = 0.0) -> Iterator[None]:
        """Takes the named locks in one global order (ledger, indexes, views, answers), so
        two holders can never wait on each other in a cycle.

        ``views``: the locks of views (or of the states they share) taken exclusively;
        ``reading``: such locks taken shared, by publishers of a state no one folds
        meanwhile; ``answers``: the locks of views' answer tables, which shared holders
        each take for the answer they write.
        """
        wanted = ([("ledger", f"the ledger of program {self.program}", False)] if ledger else [])
        wanted += [(f"rows-{t}", f"the row index of {t} (program {self.program})", False)
                   for t in sorted(indexes)]
        for v in sorted({*views, *reading}):
            if v in views and v in reading:
                raise ValueError(f"the lock of {v} is asked for both shared and exclusive")
            what = f"the state views {', '.join(self.shared[v])} share" if v in self.shared \
                else f"view {v}"
            wanted.append((f"view-{v}", f"{what} (program {self.program})", v in reading))
        wanted += [(f"answer-{v}", f"the answer of view {v} (program {self.program})", False)
                   for v in sorted(answers)]
        with contextlib.ExitStack() as stack:
            taken = False
            for name, what, shared in wanted:
                if name in self._held:
                    if shared != self._held[name]:
                        raise ValueError(f"the lock of {what} is held in the other mode")
                    continue
                path = self.root / f"{name}.lock"
                fd = stack.enter_context(locked(path, what, wait_s, shared))
                if self.bucket is not None:
                    stack.enter_context(self.bucket.lease(path, what, wait_s, fd))
                self._held[name] = shared
                self._taken[name] = next(self._takes)
                stack.callback(self._held.pop, name)
                stack.callback(self._taken.pop, name)
                taken = True
            if taken and self.bucket is not None:
                self.bucket.pull()
                stack.callback(self.bucket.push)  # before the leases are let go
            faults.pause_point("locks.held")
            yield

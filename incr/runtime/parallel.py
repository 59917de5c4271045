"""Driver-side work that need not wait for itself: a few threads beside the caller's.

A batch on the driver searches and writes tens of files (a table's files by key, one new
file per bucket), and pyarrow, numpy and delta-rs do most of that with the GIL released,
so on a machine of two cores the files of one search or one write go about twice as fast
side by side.  Three uses:

- :func:`each`: the same work over independent items (files), results in order;
- :func:`start` and :func:`wait`: pieces of work started one by one as the caller makes
  them (a MERGE per state table, each as soon as its rows are computed), waited for
  together;
- :func:`later`: one piece of work a caller need not wait for until a later point (a
  batch's row index, which no fold reads), while it goes on.

``INCR_DRIVER_THREADS`` sets the threads (0: the machine's cores, at most 4; 1: none, all
on the caller's thread).  Work run by :func:`each` on a pool thread runs its own
:func:`each` inline, so a pool never waits on itself.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from incr.config import setting

T = TypeVar("T")
R = TypeVar("R")


class _Pools:
    """The pools made so far, by name, and the lock that makes each once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.made: dict[str, ThreadPoolExecutor] = {}

    def forget(self) -> None:
        """In a forked child: the parent's pool threads are not there (and its lock may be
        held by one of them), so the child makes its own; work handed to the parent's
        executors would wait for ever."""
        self.lock = threading.Lock()
        self.made = {}


_pools = _Pools()
_inside = threading.local()
os.register_at_fork(after_in_child=_pools.forget)


def threads() -> int:
    """How many threads :func:`each` spreads work over (1: the caller's alone)."""
    wanted = setting("driver_threads")
    return wanted if wanted > 0 else max(1, min(4, os.cpu_count() or 1))


def _pool(name: str, workers: int) -> ThreadPoolExecutor:
    with _pools.lock:
        pool = _pools.made.get(name)
        if pool is None:
            pool = _pools.made[name] = ThreadPoolExecutor(workers, thread_name_prefix=f"incr-{name}")
        return pool


def each(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[work(item) for item in items]``, the items spread over :func:`threads` threads.

    The first exception raised is raised here, once every item has finished or failed.
    """
    if len(items) < 2 or threads() < 2 or getattr(_inside, "active", False):
        return [work(item) for item in items]
    return wait([start(functools.partial(work, item)) for item in items])


def start(work: Callable[[], R]) -> Future[R]:
    """Starts ``work`` on one of :func:`each`'s threads while the caller goes on; the caller
    must :func:`wait` for it.

    On the caller's thread, before this returns, when there is one thread or the caller is
    itself a pool thread (a pool never waits on itself); what it raises is raised here then.
    """
    count = threads()
    if count < 2 or getattr(_inside, "active", False):
        return done(work())

    def run() -> R:
        _inside.active = True
        try:
            return work()
        finally:
            _inside.active = False
    return _pool("each", count).submit(run)


def wait(futures: Sequence[Future[R]]) -> list[R]:
    """The results of ``futures`` (from :func:`start`), in order, once every one has
    finished or failed; the first exception raised is raised here."""
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def later(work: Callable[[], R]) -> Future[R]:
    """Starts ``work`` on a background thread (at once on the caller's when
    ``INCR_DRIVER_THREADS`` is 1); its future gives the result, or raises what it raised."""
    if threads() > 1:
        return _pool("later", 1).submit(work)
    future: Future[R] = Future()
    try:
        future.set_result(work())
    except BaseException as e:  # as the pool's future holds it  # noqa: BLE001
        future.set_exception(e)
    return future


def done(value: R) -> Future[R]:
    """A future that already holds ``value``."""
    future: Future[R] = Future()
    future.set_result(value)
    return future

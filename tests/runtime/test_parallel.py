"""Driver-side work on a few threads (incr.runtime.parallel)."""

from __future__ import annotations

import threading
import time

import pytest

from incr.runtime import parallel


def test_each_keeps_the_order_and_uses_more_than_one_thread(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")
    seen: set[str] = set()
    barrier = threading.Barrier(2, timeout=10)

    def work(i: int) -> int:
        seen.add(threading.current_thread().name)
        if i < 2:
            barrier.wait()  # only passes when two items run at the same time
        return i * i

    assert parallel.each(work, list(range(6))) == [i * i for i in range(6)]
    assert len(seen) == 2


def test_each_on_one_thread_runs_on_the_callers(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "1")
    names = parallel.each(lambda _: threading.current_thread().name, [1, 2, 3])
    assert names == [threading.current_thread().name] * 3


def test_each_raises_the_first_failure_after_every_item_ended(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")
    ended: list[int] = []

    def work(i: int) -> int:
        if i == 1:
            raise ValueError("item 1")
        time.sleep(0.05)
        ended.append(i)
        return i

    with pytest.raises(ValueError, match="item 1"):
        parallel.each(work, [0, 1, 2, 3])
    assert sorted(ended) == [0, 2, 3]


def test_each_inside_each_runs_inline(monkeypatch):
    """A pool thread waiting on the pool could wait for ever once every thread does."""
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")

    def outer(i: int) -> list[int]:
        return parallel.each(lambda j: i * 10 + j, [0, 1, 2])

    assert parallel.each(outer, [1, 2, 3, 4]) == [[i * 10 + j for j in range(3)] for i in (1, 2, 3, 4)]


def test_start_runs_beside_the_caller_and_wait_gives_the_results_in_order(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")
    go = threading.Event()
    first = parallel.start(lambda: go.wait(10) and "first")
    second = parallel.start(lambda: "second")
    assert not first.done()  # the caller went on, and so did the second piece
    assert second.result(10) == "second"
    go.set()
    assert parallel.wait([first, second]) == ["first", "second"]


def test_wait_raises_the_first_failure_once_every_piece_ended(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")
    go = threading.Event()
    ended: list[str] = []

    def slow() -> None:
        go.wait(10)
        time.sleep(0.05)
        ended.append("slow")

    def fail() -> None:
        go.set()
        raise ValueError("the MERGE failed")
    futures = [parallel.start(slow), parallel.start(fail)]
    with pytest.raises(ValueError, match="the MERGE failed"):
        parallel.wait(futures)
    assert ended == ["slow"]


def test_start_on_one_thread_runs_at_once_and_raises_there(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "1")
    ran: list[str] = []
    future = parallel.start(lambda: ran.append(threading.current_thread().name) or 3)
    assert future.done() and ran == [threading.current_thread().name]
    assert parallel.wait([future]) == [3]

    def fail() -> None:
        raise RuntimeError("the MERGE failed")
    with pytest.raises(RuntimeError, match="the MERGE failed"):
        parallel.start(fail)


def test_start_on_a_pool_thread_runs_inline(monkeypatch):
    """A piece started from a pool thread and waited for there could wait for ever."""
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")

    def outer(i: int) -> list[int]:
        return parallel.wait([parallel.start(lambda j=j: i * 10 + j) for j in range(3)])

    assert parallel.each(outer, [1, 2, 3, 4]) == [[i * 10 + j for j in range(3)] for i in (1, 2, 3, 4)]


def test_later_runs_beside_the_caller_and_gives_its_result_or_error(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")
    go = threading.Event()
    future = parallel.later(lambda: go.wait(10) and "done")
    assert not future.done()  # the caller went on
    go.set()
    assert future.result(10) == "done"

    def fail() -> None:
        raise RuntimeError("the write failed")
    with pytest.raises(RuntimeError, match="the write failed"):
        parallel.later(fail).result(10)


def test_later_on_one_thread_runs_at_once(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "1")
    ran: list[str] = []
    future = parallel.later(lambda: ran.append(threading.current_thread().name))
    assert future.done() and ran == [threading.current_thread().name]


def test_later_on_one_thread_holds_the_error_in_its_future(monkeypatch):
    monkeypatch.setenv("INCR_DRIVER_THREADS", "1")

    def fail() -> None:
        raise RuntimeError("the write failed")
    future = parallel.later(fail)
    with pytest.raises(RuntimeError, match="the write failed"):
        future.result()


_FORKING = """
import os, sys, time
from incr.runtime import parallel

# the parent's pool exists now, its threads idle (so it would start no new one)
assert parallel.each(lambda i: time.sleep(0.05) or i, [1, 2, 3]) == [1, 2, 3]
assert parallel.later(lambda: 1).result(10) == 1
pid = os.fork()
if pid == 0:  # the child: exits 0 only if its work ran
    ok = False
    try:
        ok = (parallel.each(lambda i: i + 1, [1, 2]) == [2, 3]
              and parallel.later(lambda: 7).result(10) == 7)
    finally:
        os._exit(0 if ok else 1)
deadline = time.monotonic() + 20
while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
if done[0] == 0:  # its work waits on threads it does not have
    os.kill(pid, 9)
    sys.exit("the forked child's work never ran")
sys.exit(os.waitstatus_to_exitcode(done[1]))
"""


def test_a_forked_child_makes_its_own_threads():
    """A process forked after the pools started (a task runner forking a worker) has none of
    their threads: its work must not be handed to them.

    The fork is made by a fresh interpreter: forking this one would copy the test session's
    other threads' locks (Spark's gateway, whose finalizers a child's garbage collection
    runs), which is no part of what is tested and can hang the child by itself.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(parallel.__file__).resolve().parents[2])
    env = {**os.environ, "INCR_DRIVER_THREADS": "2",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _FORKING], env=env, capture_output=True, check=False,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr

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

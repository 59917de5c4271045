"""The bounded LRU cache (:mod:`incr.runtime.bounded`) that keeps mirrors and vectors."""

from __future__ import annotations

from incr.runtime.bounded import Bounded


def test_the_least_recently_used_go_once_the_weights_pass_the_limit():
    cache: Bounded[str, str] = Bounded(5, lambda key, value: len(value))
    cache.put("a", "xx")
    cache.put("b", "xx")
    assert cache.get("a") == "xx"  # now the most recent: b goes first
    cache.put("c", "xx")
    assert cache.get("b") is None and cache.values() == ["xx", "xx"]
    cache.put("a", "x")  # replacing an entry counts its new weight only
    cache.put("d", "xx")
    assert cache.get("c") == "xx" and cache.get("a") == "x" and cache.get("d") == "xx"
    cache.put("e", "too heavy")  # the newest stays, whatever its weight
    assert cache.values() == ["too heavy"]


def test_entries_count_one_each_by_default():
    cache: Bounded[int, int] = Bounded(2)
    for i in range(4):
        cache.put(i, i)
    assert cache.values() == [2, 3] and cache.get(0) is None

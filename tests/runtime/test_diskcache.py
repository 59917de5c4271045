"""What is kept on disk between processes: found again by the same parts and generation only,
never a wrong value, bounded, and never a failure."""

from __future__ import annotations

import json

from incr.runtime.diskcache import DiskCache


def test_a_value_kept_is_found_by_a_new_cache_of_the_same_generation(tmp_path):
    DiskCache(tmp_path, "g1").put(("SELECT 1", "None"), {"sql": "SELECT 1"})
    assert DiskCache(tmp_path, "g1").get(("SELECT 1", "None")) == {"sql": "SELECT 1"}
    assert DiskCache(tmp_path, "g1").get(("SELECT 1", "Bucket")) is None
    assert DiskCache(tmp_path, "g2").get(("SELECT 1", "None")) is None


def test_a_new_generation_removes_the_old_ones_when_it_first_writes(tmp_path):
    DiskCache(tmp_path, "old").put(("q",), 1)
    newer = DiskCache(tmp_path, "new")
    assert (tmp_path / "old").is_dir()  # reading removes nothing
    assert newer.get(("q",)) is None
    assert newer.put(("q",), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
    assert DiskCache(tmp_path, "old").get(("q",)) is None


def test_an_entry_of_other_parts_or_unreadable_is_a_miss_and_is_written_again(tmp_path):
    cache = DiskCache(tmp_path, "g")
    cache.put(("a",), "A")
    path = next((tmp_path / "g").glob("*.json"))
    # a file under the right name holding another query's value (a collision, a copy)
    path.write_text(json.dumps({"parts": ["b"], "value": "B"}))
    assert cache.get(("a",)) is None
    path.write_text('{"parts": ["a"], "val')  # a torn write
    assert cache.get(("a",)) is None
    path.write_text("[1, 2]")
    assert cache.get(("a",)) is None
    assert cache.put(("a",), "A") and cache.get(("a",)) == "A"
    assert not list((tmp_path / "g").glob(".incr-*"))  # nothing left aside


def test_a_generation_keeps_at_most_its_limit(tmp_path):
    cache = DiskCache(tmp_path, "g", limit=3)
    assert [cache.put((str(i),), i) for i in range(5)] == [True, True, True, False, False]
    assert [cache.get((str(i),)) for i in range(5)] == [0, 1, 2, None, None]
    # a later process counts what is there
    assert not DiskCache(tmp_path, "g", limit=3).put(("x",), 0)
    assert DiskCache(tmp_path, "g", limit=4).put(("x",), 0)


def test_a_file_in_the_way_of_the_folder_costs_only_the_time(tmp_path):
    (tmp_path / "kept").write_text("not a folder")
    cache = DiskCache(tmp_path / "kept", "g")
    assert cache.put(("q",), 1) is False
    assert cache.get(("q",)) is None


def test_what_a_killed_writer_left_aside_goes_once_it_is_old(tmp_path):
    import os
    import time

    (tmp_path / "g").mkdir()
    old, new = tmp_path / "g" / ".incr-old.tmp", tmp_path / "g" / ".incr-new.tmp"
    old.write_text("{")
    new.write_text("{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert DiskCache(tmp_path, "g").put(("q",), 1)
    assert not old.exists() and new.exists()  # the other may be another writer's, still going

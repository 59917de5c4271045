"""The log of the groups each fold of a shared state touched (:mod:`incr.runtime.touchlog`).

test_share runs it as Airflow's tasks do; these check the chain a late view follows: every
fold between its answer and the state, or nothing when a link is missing.
"""

from __future__ import annotations

import pyarrow as pa

from incr.runtime.touchlog import DIRECTORY, KEEP, TouchLog, union_touched


def _groups(*keys: str) -> pa.Table:
    return pa.table({"_bucket": pa.array([hash(k) % 4 for k in keys], pa.int32()),
                     "k": pa.array(list(keys), pa.string())})


def _keys(table: pa.Table | None) -> list[str] | None:
    return None if table is None else sorted(table.column("k").to_pylist())


def test_a_late_view_gets_the_groups_of_every_fold_since_its_answer(tmp_path):
    log = TouchLog(tmp_path)
    log.record(3, 2, _groups("a", "b"))
    log.record(5, 3, _groups("b", "c"))  # a step of batches 4 and 5
    log.record(6, 5, _groups("d"))
    assert _keys(log.since(5, 6)) == ["d"]
    assert _keys(log.since(2, 6)) == ["a", "b", "c", "d"]  # each group once
    assert _keys(log.since(3, 5)) == ["b", "c"]
    assert log.since(4, 6) is None  # 4 is inside a step: no fold ended there
    assert log.since(1, 6) is None  # the fold from 1 is not logged
    assert log.since(6, 6) is None  # nothing to publish
    assert (tmp_path / DIRECTORY).is_dir() and not list((tmp_path / DIRECTORY).glob(".incr-*"))


def test_a_missing_or_unreadable_link_gives_nothing(tmp_path):
    log = TouchLog(tmp_path)
    log.record(1, 0, _groups("a"))
    log.record(2, 1, _groups("b"))
    (tmp_path / DIRECTORY / f"{1:012d}.arrow").write_bytes(b"not arrow")
    assert log.since(0, 2) is None
    assert _keys(log.since(1, 2)) == ["b"]


def test_only_the_last_folds_are_kept(tmp_path):
    log = TouchLog(tmp_path)
    for batch in range(1, KEEP + 6):
        log.record(batch, batch - 1, _groups(f"g{batch}"))
    assert len(list((tmp_path / DIRECTORY).glob("*.arrow"))) == KEEP
    assert log.since(0, KEEP + 5) is None  # the first folds were pruned
    assert len(_keys(log.since(5, KEEP + 5)) or []) == KEEP


def test_the_union_of_touched_groups_needs_every_part():
    assert union_touched(_groups("a"), None) is None
    assert _keys(union_touched(_groups("a", "b"), _groups(), _groups("b"))) == ["a", "b"]

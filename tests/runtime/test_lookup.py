"""Rows found by key in a table with deletion vectors (:mod:`incr.runtime.lookup`), against
delta-rs's own reader of the table filtered in Python, and the positions a MERGE by vectors
takes from the last read against those it finds by scanning."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from incr.compiler.plan import BUCKET
from incr.runtime import lookup, sparkhash
from incr.runtime.store import DeltaStore

GONE = "_gone"
SCHEMA = pa.schema([(BUCKET, pa.int32()), ("k", pa.int64()), ("f", pa.float64()),
                    ("s", pa.string()), ("v", pa.int64())])
KEYS = [None, *range(40)]
FLOATS = [None, 0.0, -0.0, 1.5, float("nan"), 1e308]
STRINGS = [None, "", "a", "b", "é", "zz"]


def _bucket(k: int | None) -> int:
    """The row's ``_bucket``: ``k`` hashed into 3 buckets, as incr's state tables hash θ."""
    return sparkhash.buckets([pa.array([k], pa.int64())], 3)[0].as_py()


def _row(i: int) -> dict:
    k = KEYS[i % len(KEYS)]
    return {BUCKET: _bucket(k), "k": k, "f": FLOATS[i % len(FLOATS)],
            "s": STRINGS[i % len(STRINGS)], "v": i}


def _same(a, b) -> bool:
    """SQL's IS NOT DISTINCT FROM, as the MERGE compares keys."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def _vectored(tmp_path: Path, rows: int = 400, mirror_rows: int | None = None
              ) -> tuple[DeltaStore, Path]:
    """A table of several files and row groups per bucket, with vectors deleting some rows."""
    store = DeltaStore(mirror_rows)
    path = tmp_path / "t"
    data = pa.Table.from_pylist([_row(i) for i in range(rows)], SCHEMA)
    for part in range(3):
        store.write(path, data.slice(part * rows // 3, rows // 3 + 1), mode="append", batch=part,
                    partition_by=[BUCKET])
    # delete the rows of some (k, v) pairs by vectors; insert a few new ones
    gone = [{BUCKET: _bucket(k), "k": k, "f": None, "s": None, "v": v, GONE: True}
            for k, v in [(KEYS[i % len(KEYS)], i) for i in range(0, rows, 7)]]
    new = [{**_row(i), "v": 10_000 + i, GONE: False} for i in range(0, 60, 5)]
    source = pa.Table.from_pylist(gone + new, SCHEMA.append(pa.field(GONE, pa.bool_())))
    (store.merge(path, source).on_groups((BUCKET, "k", "v"), GONE).when_matched_delete()
     .when_not_matched_insert_all(f"NOT s.{GONE}").with_deletion_vectors().for_batch(3).execute())
    return store, path


@pytest.fixture(scope="module", params=[0, 1], ids=["parquet", "mirrored"])
def vectored(tmp_path_factory, request):
    """The table, its files searched as Parquet or (a search on an integer column) in key
    mirrors of every file."""
    return _vectored(tmp_path_factory.mktemp("lookup"), mirror_rows=request.param)


POOLS = {"k": KEYS + [999], "f": FLOATS + [2.5], "s": STRINGS + ["nope"]}


@settings(max_examples=60, deadline=None)
@given(columns=st.lists(st.sampled_from(["k", "f", "s"]), min_size=1, max_size=3, unique=True),
       picks=st.lists(st.integers(0, 60), max_size=12), every=st.booleans(),
       buckets=st.one_of(st.none(), st.sets(st.integers(0, 2))), hashed=st.booleans())
def test_rows_found_by_key_are_the_live_rows_delta_rs_reads(vectored, columns, picks, every,
                                                            buckets, hashed):
    """Values of one column or several (a row matching some, or with ``every`` all of them);
    ``hashed``: each bucket's files searched only for the values of ``k`` hashing to it."""
    store, path = vectored
    values = {c: [POOLS[c][(i + n) % len(POOLS[c])] for i in picks] for n, c in enumerate(columns)}
    matching = {c: pa.array(v, SCHEMA.field(c).type) for c, v in values.items()}
    got = store.read_matching(path, matching, buckets=buckets, every=every,
                              bucketed_by=("k", 3) if hashed else None)
    live = pa.table(DeltaTable(str(path)).scan()).to_pylist()
    holds = all if every else any
    expected = [r for r in live if holds(any(_same(r[c], v) for v in values[c]) for c in columns)
                and (buckets is None or r[BUCKET] in buckets)]
    assert sorted(r["v"] for r in got.to_pylist()) == sorted(r["v"] for r in expected)
    assert got.schema == pa.schema(DeltaTable(str(path)).schema().to_arrow())
    for r in got.to_pylist():  # whole rows, partition column included
        e = next(e for e in expected if e["v"] == r["v"])
        assert r.keys() == e.keys() and all(_same(r[c], e[c]) for c in r), (r, e)


def test_a_merge_takes_the_positions_the_last_read_found(tmp_path, monkeypatch):
    """After a read of the touched keys, the MERGE that deletes their rows searches only the
    rows read (no file is opened again) and finds the same positions a scan finds; a key the
    read did not cover, or another version, scans."""
    store, path = _vectored(tmp_path)
    keys = pa.table({"k": pa.array([3, None, 17], pa.int64()), "v": pa.array([4, 0, 18], pa.int64())})
    scanned = store.matched_rows(path, keys)
    assert sum(len(p) for p in scanned.values()) == 2  # (3, 4) and (17, 18) live; (NULL, 0) gone
    store.read_matching(path, {"k": pa.array([3, 17, None, 5], pa.int64())})
    opened = []
    real = lookup.pq.ParquetFile
    monkeypatch.setattr(lookup.pq, "ParquetFile", lambda p: opened.append(p) or real(p))
    remembered = store.matched_rows(path, keys)
    assert opened == []
    assert {n: p.tolist() for n, p in remembered.items()} == \
        {n: p.tolist() for n, p in scanned.items()}
    # a read on every key column covers the keys too
    store.read_matching(path, {"k": pa.array([3, 17, None], pa.int64()),
                               "v": pa.array([4, 18, 0, 99], pa.int64())}, every=True)
    opened.clear()
    assert store.matched_rows(path, keys).keys() == scanned.keys() and opened == []
    # a value the read did not cover: the files are searched
    store.matched_rows(path, pa.table({"k": pa.array([4], pa.int64()), "v": pa.array([4], pa.int64())}))
    assert opened
    # another version: searched again
    store.read_matching(path, {"k": pa.array([3, 17], pa.int64())})
    store.append(path, pa.Table.from_pylist([_row(1)], SCHEMA), batch=4)
    opened.clear()
    store.matched_rows(path, pa.table({"k": pa.array([3], pa.int64()), "v": pa.array([3], pa.int64())}))
    assert opened


def test_integer_statistics_skip_files_and_row_groups(tmp_path, monkeypatch):
    """Keys in a narrow range read only the files (and row groups) whose range holds them."""
    store = DeltaStore()
    path = tmp_path / "t"
    for part in range(4):
        rows = pa.table({"k": pa.array(np.arange(part * 1000, (part + 1) * 1000)),
                         "v": pa.array(np.zeros(1000, dtype=np.int64))})
        store.write(path, rows, mode="append", batch=part)
    store.enable_deletion_vectors(path)
    reads = []
    real = lookup._matches
    monkeypatch.setattr(lookup, "_matches", lambda f, w, e: reads.append(f) or real(f, w, e))
    got = store.read_matching(path, {"k": pa.array([1500, 1501, 99_999])})
    assert sorted(got.column("k").to_pylist()) == [1500, 1501]
    assert len(reads) == 1


def test_a_column_a_file_lacks_reads_as_null(tmp_path):
    store = DeltaStore()
    path = tmp_path / "t"
    store.write(path, pa.table({"k": pa.array([1, 2])}), mode="append", batch=0)
    store.write(path, pa.table({"k": pa.array([3]), "x": pa.array([7])}), mode="append", batch=1,
                add_columns=True)
    store.enable_deletion_vectors(path)
    got = store.read_matching(path, {"x": pa.array([None, 7], pa.int64())})
    assert sorted(got.column("k").to_pylist()) == [1, 2, 3]
    got = store.read_matching(path, {"k": pa.array([2, 3])})
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == [{"k": 2, "x": None}, {"k": 3, "x": 7}]
    for x, found in ((None, [1]), (7, [3]), (8, [])):
        got = store.read_matching(path, {"k": pa.array([1, 3]), "x": pa.array([x], pa.int64())},
                                  every=True)
        assert got.column("k").to_pylist() == found


def test_string_keys_are_found_whatever_arrow_type_they_come_as(tmp_path):
    """delta-rs gives a string column's type as string_view, which Arrow cannot hash; values
    of any string type find the rows."""
    store = DeltaStore()
    path = tmp_path / "t"
    store.write(path, pa.table({"who": ["ann", "bob", None], "n": [1, 2, 3]}), mode="append", batch=0)
    store.write(path, pa.table({"who": pa.array(["bob", "cy"], pa.string_view()), "n": [4, 5]}),
                mode="append", batch=1)  # a file of string_view data
    store.enable_deletion_vectors(path)
    for typ in (pa.string(), pa.large_string(), pa.string_view()):
        got = store.read_matching(path, {"who": pa.array(["bob", None, "zed"], typ)})
        assert sorted(got.column("n").to_pylist()) == [2, 3, 4]


def test_a_merge_by_vectors_matches_string_view_keys(tmp_path):
    """Keys of several columns, one of them a string the table types as string_view: the
    MERGE's match (after the read that kept the rows, and without it) deletes their rows."""
    store = DeltaStore()
    path = tmp_path / "t"
    schema = pa.schema([("who", pa.string_view()), ("n", pa.int64()), ("v", pa.int64())])
    rows = pa.table({"who": pa.array(["ann", "bob", None, "bob"], pa.string_view()),
                     "n": [1, 2, 3, 4], "v": [0, 0, 0, 0]}, schema=schema)
    store.write(path, rows, mode="append", batch=0)
    store.enable_deletion_vectors(path)
    flagged = schema.append(pa.field(GONE, pa.bool_()))
    for batch, (read_first, who, n) in enumerate([(True, "bob", 2), (False, None, 3)], start=1):
        if read_first:
            store.read_matching(path, {"who": pa.array([who], pa.string_view())})
        source = pa.table({"who": pa.array([who], pa.string_view()), "n": [n], "v": [None],
                           GONE: [True]}, schema=flagged)
        result = (store.merge(path, source).on_groups(("who", "n"), GONE).when_matched_delete()
                  .when_not_matched_insert_all(f"NOT s.{GONE}").with_deletion_vectors()
                  .for_batch(batch).execute())
        assert result.deleted == 1
    assert sorted(store.read(path).column("n").to_pylist()) == [1, 4]


def test_wanted_values_split_by_the_bucket_they_hash_to():
    """Each part holds exactly the values hashing to its bucket; NULL stays wanted in all;
    a column of another type is not split."""
    wanted = lookup.Wanted("k", pa.array([None, *range(50)], pa.int64()), pa.int64())
    parts = wanted.by_bucket(3)
    assert sorted(parts) == ["0", "1", "2"]
    assert sorted(v for p in parts.values() for v in p.ordered.tolist()) == list(range(50))
    for bucket, part in parts.items():
        assert all(_bucket(v) == int(bucket) for v in part.ordered.tolist())
        assert part.has_null and len(part.values) == len(part.ordered) < 50
    assert lookup.Wanted("s", pa.array(["a"]), pa.string()).by_bucket(3) is None

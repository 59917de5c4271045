"""Delta tables written by Spark's executors and committed by delta-rs (``write_delta``).

What the rest of incr relies on: every column type a state table holds comes back as it
went in, through both readers (delta-rs and Spark's file list); the commit carries the
batch marker and metadata exactly like a driver-side write; the file statistics taken from
the Parquet footers are right wherever they are given (delta-rs's MERGE and ``reach`` skip
files by them) and absent where they could be wrong; and files written by either side mix
in one table.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from incr.compiler.plan import BUCKET
from incr.errors import StorageError
from incr.runtime.session import read_delta, write_delta
from incr.runtime.store import APP_ID, TABLE_PROPERTIES, DeltaStore, _footer_stats

UTC = dt.UTC
#: Every type a state table holds (the declared types of incr.runtime.types, a timestamp
#: with a zone as Spark computes one, and the decimals sums widen to), plus the bucket.
SCHEMA = pa.schema([
    (BUCKET, pa.int32()), ("id", pa.int64()), ("s", pa.string()), ("i", pa.int32()),
    ("sm", pa.int16()), ("ti", pa.int8()), ("d", pa.float64()), ("f", pa.float32()),
    ("b", pa.bool_()), ("day", pa.date32()), ("ts", pa.timestamp("us")),
    ("tz", pa.timestamp("us", UTC)), ("dec", pa.decimal128(18, 2)),
    ("wide", pa.decimal128(38, 10)),
])
#: The columns whose footer bounds are committed as statistics.
BOUNDED = ("id", "s", "i", "sm", "ti", "b", "day")


def _rows(n: int = 40) -> pa.Table:
    """Rows with NULLs, extremes, NaN, non-ASCII strings and dates before 1582."""
    rows = []
    for k in range(n):
        rows.append({
            BUCKET: k % 4, "id": k if k != 7 else -(2**63), "s": [None, "", "é€", "zz", "a"][k % 5],
            "i": None if k % 6 == 0 else k * 1000 - 2**31 + 1, "sm": k - 20, "ti": (k % 9) - 4,
            "d": [math.nan, None, -0.5, 1e300][k % 4], "f": None if k % 3 else float(k) / 4,
            "b": [True, False, None][k % 3],
            "day": dt.date(1000 + 37 * k, 1 + k % 12, 1 + k % 28) if k % 5 else None,
            "ts": dt.datetime(1500 + 13 * k, 2, 3, 4, 5, 6, 7 * k) if k % 7 else None,
            "tz": dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=k * 10**11 + 3),
            "dec": Decimal(k * 137 - 2000) / 100 if k % 4 else None,
            "wide": Decimal(f"{k}12345678901234567890.0123456789") * (-1 if k % 2 else 1),
        })
    rows.append({**rows[0], "id": 2**63 - 1})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _create(store: DeltaStore, path: Path, partitioned: bool, schema: pa.Schema = SCHEMA) -> None:
    """The table as incr creates state: empty, nullable, partitioned by bucket."""
    store.write(path, schema.empty_table(), mode="append", batch=None,
                partition_by=[BUCKET] if partitioned else None)


def _sorted(table: pa.Table) -> list[dict]:
    """Rows by id, NaN made comparable."""
    def norm(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    rows = table.select(SCHEMA.names).sort_by("id").to_pylist()
    return [{k: norm(v) for k, v in r.items()} for r in rows]


def _spark_rows(spark, table: pa.Table):
    return spark.createDataFrame(table).repartition(3)


def _spark_read(spark, store: DeltaStore, path: Path, buckets: list[int] | None = None) -> pa.Table:
    """The table as Spark reads it, its zone-less timestamps back from Spark's UTC ones
    (``read_delta`` gives Spark the session's TIMESTAMP, the session is in UTC)."""
    rows = read_delta(spark, store, str(path), buckets).toArrow()
    return rows.cast(pa.schema([SCHEMA.field(n) for n in rows.column_names]))


@pytest.mark.parametrize("partitioned", [True, False], ids=["by_bucket", "flat"])
def test_every_state_type_reads_back_through_both_readers(spark, tmp_path, partitioned):
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned)
    data = _rows()
    written = write_delta(spark, store, path, _spark_rows(spark, data), mode="append", batch=0)
    assert written == data.num_rows
    assert store.schema(path) == SCHEMA
    assert _sorted(store.read(path)) == _sorted(data)
    assert _sorted(_spark_read(spark, store, path)) == _sorted(data)
    assert store.row_count(path) == data.num_rows
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(("_", "part-"))) == []
    if partitioned:  # one file per bucket, in delta-rs's own layout
        files = store.table(path).file_uris()
        assert len(files) == 4
        assert all(Path(f).parent.name.startswith(f"{BUCKET}=") for f in files)
        assert store.row_count(path, [1, 2]) == len(data.filter(pc.is_in(
            data[BUCKET], pa.array([1, 2], pa.int32()))))


def test_driver_and_spark_files_mix_in_one_table(spark, tmp_path):
    """Spark reads a table with one base path: files Spark wrote land where delta-rs puts
    its own, or reading the table back would fail on two directory layouts."""
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned=True)
    data = _rows()
    first, second = data.slice(0, 20), data.slice(20)
    store.append(path, first, batch=0)
    write_delta(spark, store, path, _spark_rows(spark, second), mode="append", batch=1)
    assert _sorted(_spark_read(spark, store, path)) == _sorted(data)
    assert _sorted(_spark_read(spark, store, path, [0, 3])) == _sorted(
        data.filter(pc.is_in(data[BUCKET], pa.array([0, 3], pa.int32()))))
    assert _sorted(store.read(path, version=1)) == _sorted(first)


def test_the_commit_carries_the_batch_and_metadata(spark, tmp_path):
    store = DeltaStore()
    path = tmp_path / "new"  # no table yet: the commit creates it
    df = spark.range(10).selectExpr("id", "CAST(id AS STRING) AS s")
    write_delta(spark, store, path, df, mode="append", batch=3, description="a test table",
                metadata={"incr.program": "p", "incr.batch": "3"})
    assert store.batch_version(path) == 3
    assert store.table(path).transaction_version(APP_ID) == 3
    assert store.last_commit_metadata(path, "incr.program") == "p"
    assert store.table(path).metadata().description == "a test table"
    assert store.table(path).metadata().configuration == TABLE_PROPERTIES  # checkpoints often
    assert store.schema(path) == pa.schema([("id", pa.int64()), ("s", pa.string())])
    write_delta(spark, store, path, df, mode="append", batch=4, metadata={"incr.batch": "4"})
    assert store.applied_through(path) == 4
    assert store.history(path, 1)[0]["incr.batch"] == "4"
    assert store.read(path).num_rows == 20


def test_overwrite_replaces_the_rows_and_may_replace_the_schema(spark, tmp_path):
    store = DeltaStore()
    path = tmp_path / "answer"
    write_delta(spark, store, path, spark.range(100).selectExpr("id AS k", "id * 2 AS v"),
                mode="overwrite", batch=0, sort_by=["k"], target_file_size=200)
    assert store.read(path).sort_by("k")["v"].to_pylist() == [2 * k for k in range(100)]
    assert len(store.table(path).file_uris()) > 4  # split by size
    write_delta(spark, store, path, spark.range(5).selectExpr("id AS k", "id * 3 AS v"),
                mode="overwrite", batch=1)
    assert store.read(path).sort_by("k")["v"].to_pylist() == [0, 3, 6, 9, 12]
    assert store.read(path, version=0).num_rows == 100  # the old version stays readable
    changed = spark.range(3).selectExpr("CAST(id AS STRING) AS k", "id / 2 AS half")
    write_delta(spark, store, path, changed, mode="overwrite", batch=2, replace_schema=True)
    assert store.schema(path) == pa.schema([("k", pa.string()), ("half", pa.float64())])
    assert store.read(path).sort_by("k").to_pylist() == [
        {"k": "0", "half": 0.0}, {"k": "1", "half": 0.5}, {"k": "2", "half": 1.0}]
    assert read_delta(spark, store, str(path)).count() == 3
    assert store.batch_version(path) == 2
    # a timestamp without zone needs a table feature the table does not have yet
    stamped = spark.sql("SELECT 1L AS k, TIMESTAMP_NTZ'2020-01-02 03:04:05' AS at")
    write_delta(spark, store, path, stamped, mode="overwrite", batch=3, replace_schema=True,
                metadata={"incr.batch": "3"})
    assert store.read(path).to_pylist() == [{"k": 1, "at": dt.datetime(2020, 1, 2, 3, 4, 5)}]
    assert store.batch_version(path) == 3 and store.last_commit_metadata(path, "incr.batch") == "3"


def test_a_sorted_write_gives_each_file_a_narrow_range(spark, tmp_path):
    """What a MERGE of a few groups needs to leave most of an answer's files unread."""
    store = DeltaStore()
    path = tmp_path / "answer"
    df = spark.range(2000).selectExpr("(id * 7919) % 2000 AS k", "id AS v").repartition(4)
    write_delta(spark, store, path, df, mode="overwrite", batch=0, sort_by=["k"],
                target_file_size=4000)
    files = len(store.table(path).file_uris())
    assert files >= 8
    assert store.reach(path, "k", pa.array([5], pa.int64())) <= 2 / files


def test_statistics_are_the_files_own_and_only_where_exact(spark, tmp_path):
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned=False)
    write_delta(spark, store, path, _spark_rows(spark, _rows()), mode="append", batch=0)
    actions = pa.table(store.table(path).get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == 3
    for action in actions:
        rows = pq.read_table(path / action["path"])
        assert action["num_records"] == rows.num_rows
        for name in SCHEMA.names:
            column = rows[name]
            if name == BUCKET or name in BOUNDED:
                bounds = pc.min_max(column).as_py()
                assert action[f"min.{name}"] == bounds["min"], name
                assert action[f"max.{name}"] == bounds["max"], name
            else:  # floats (NaN), decimals, timestamps: read rather than risk a wrong bound
                assert action.get(f"min.{name}") is None, name
                assert action.get(f"max.{name}") is None, name
            assert action[f"null_count.{name}"] == column.null_count, name


def test_footer_statistics_need_every_row_group(tmp_path):
    """Bounds come from all row groups; a row group without them (not all NULL) drops the
    column's bounds, a row group of NULLs only does not."""
    table = pa.table({"a": pa.array([1, 2, None, None, 9, 3], pa.int64()),
                      "b": pa.array(["x", "y", "z", "w", "v", None]),
                      "c": pa.array([None, None, 5, 6, 7, 8], pa.int64())})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=2, write_statistics=["a", "c"])
    stats = json.loads(_footer_stats(pq.read_metadata(path), table.schema))
    assert stats["numRecords"] == 6
    assert stats["minValues"] == {"a": 1, "c": 5} and stats["maxValues"] == {"a": 9, "c": 8}
    assert stats["nullCount"] == {"a": 2, "c": 2}  # b has no statistics at all
    pq.write_table(table.slice(2, 2).select(["a"]), path)  # one row group, NULLs only
    stats = json.loads(_footer_stats(pq.read_metadata(path), table.schema))
    assert "minValues" not in stats and stats["nullCount"] == {"a": 2}


def test_a_merge_after_a_spark_append_sees_every_row(spark, tmp_path):
    """delta-rs's MERGE prunes files by the statistics the commit took from the footers:
    a bound too narrow would turn updates into duplicate inserts."""
    store = DeltaStore()
    path = tmp_path / "state"
    schema = pa.schema([(BUCKET, pa.int32()), ("k", pa.string()), ("day", pa.date32()),
                        ("n", pa.int64())])
    _create(store, path, partitioned=True, schema=schema)
    keys = [f"k{i:03d}" for i in range(200)]
    state = pa.table({BUCKET: pa.array([i % 4 for i in range(200)], pa.int32()), "k": keys,
                      "day": [dt.date(2000, 1, 1) + dt.timedelta(days=i) for i in range(200)],
                      "n": [1] * 200}, schema=schema)
    df = spark.createDataFrame(state).repartition(5)
    write_delta(spark, store, path, df, mode="append", batch=0, sort_by=["k"])
    touched = [0, 51, 102, 199]
    source = pa.table({BUCKET: pa.array([i % 4 for i in touched] + [1], pa.int32()),
                       "k": [keys[i] for i in touched] + ["new"],
                       "day": [dt.date(2000, 1, 1) + dt.timedelta(days=i) for i in touched]
                       + [dt.date(1999, 1, 1)],
                       "n": [10] * 5}, schema=schema)
    result = (store.merge(path, source).on(("k", "day"), buckets=source[BUCKET].to_pylist())
              .when_matched_update({"n": "t.n + s.n"}).when_not_matched_insert_all()
              .for_batch(1).execute())
    assert (result.updated, result.inserted) == (4, 1)
    after = {r["k"]: r["n"] for r in store.read(path).to_pylist()}
    assert len(after) == 201 == store.read(path).num_rows
    assert after["new"] == 10 and all(after[keys[i]] == 11 for i in touched)
    assert sum(after.values()) == 196 + 44 + 10


def test_an_empty_write_commits_the_marker(spark, tmp_path):
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned=True)
    empty = spark.createDataFrame(SCHEMA.empty_table())
    assert write_delta(spark, store, path, empty, mode="append", batch=5) == 0
    assert store.batch_version(path) == 5 and store.is_empty(path)
    new = tmp_path / "new"  # no table yet: created with the rows' schema, no file
    assert write_delta(spark, store, new, spark.range(0), mode="append", batch=0) == 0
    assert store.schema(new) == pa.schema([("id", pa.int64())]) and store.is_empty(new)
    write_delta(spark, store, path, _spark_rows(spark, _rows()), mode="append", batch=6)
    assert write_delta(spark, store, path, empty, mode="overwrite", batch=7) == 0
    assert store.is_empty(path) and store.read(path).num_rows == 0
    assert [p.name for p in path.iterdir() if p.name.startswith("spark-")] == []


def test_rows_that_do_not_fit_the_table_are_refused(spark, tmp_path):
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned=True)
    with pytest.raises(StorageError, match="do not fit its schema"):
        write_delta(spark, store, path, spark.range(3), mode="append", batch=0)
    assert store.batch_version(path) is None
    assert [p.name for p in path.iterdir() if p.name.startswith("spark-")] == []


def test_a_staging_directory_holds_only_what_spark_writes(tmp_path):
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned=True)
    with pytest.raises(StorageError, match="not a staging directory"):
        store.commit_files(path, tmp_path / "elsewhere", mode="append", batch=0)
    with store.staging(path) as directory:
        (directory / f"{BUCKET}=1").mkdir(parents=True)
        pq.write_table(_rows().drop_columns([BUCKET]), directory / "stray.parquet")
        with pytest.raises(StorageError, match=r"unexpected .*stray\.parquet"):
            store.commit_files(path, directory, mode="append", batch=0)
    assert not directory.exists() and store.batch_version(path) is None


def test_files_a_crash_left_are_never_read_and_a_full_vacuum_deletes_them(spark, tmp_path):
    """Exactly once: files become part of the table only by the commit with the batch."""
    store = DeltaStore()
    path = tmp_path / "t"
    _create(store, path, partitioned=True)
    stray = path / "spark-0123"  # as a process killed while Spark was writing leaves it
    (stray / f"{BUCKET}=1").mkdir(parents=True)
    pq.write_table(_rows().drop_columns([BUCKET]), stray / f"{BUCKET}=1" / "part-0.parquet")
    write_delta(spark, store, path, _spark_rows(spark, _rows(8)), mode="append", batch=0)
    assert store.read(path).num_rows == read_delta(spark, store, str(path)).count() == 9
    store.table(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False,
                             full=True)
    assert not list(stray.rglob("*.parquet"))
    assert store.read(path).num_rows == 9

"""The driver-side path: which queries it takes, and that it answers what Spark answers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from incr.compiler import compile_text
from incr.runtime.local import LocalSql, prepare

PROGRAM = """-- incr: buckets = 8
CREATE TABLE s (x BIGINT, y BIGINT, name VARCHAR, d DECIMAL(9,2));
CREATE VIEW plain AS SELECT x, AVG(y) AS a, COUNT(*) AS n, SUM(d) AS total FROM s GROUP BY x;
CREATE VIEW texty AS SELECT upper(name) AS u, COUNT(*) AS n FROM s GROUP BY upper(name);
CREATE VIEW widened AS SELECT d * 2 AS dd, x + 1 AS x1, COUNT(*) AS n FROM s GROUP BY d * 2, x + 1;
"""


def _h_sql(compiled, view: str) -> str:
    plan = next(p for p in compiled.plans if p.view == view)
    return plan.h_sql(plan.main_tables[0].name, "batch")


def test_prepare_takes_plain_aggregates_and_refuses_other_functions():
    compiled = compile_text(PROGRAM, path="local.sql", name="local")
    prepared = prepare(_h_sql(compiled, "plain"))
    assert prepared is not None and prepared.bucket == ("_bucket", ("x",), 8)
    assert "xxhash64" not in prepared.sql.lower()
    assert prepare(_h_sql(compiled, "texty")) is None  # upper(): Spark's semantics decide
    assert prepare("SELECT CAST(x AS STRING) AS s FROM batch") is None  # text formatting
    assert prepare("SELECT x FROM batch TABLESAMPLE (10 PERCENT)") is None
    assert prepare("SELECT pmod(xxhash64(x), 4) AS b FROM batch") is None  # not the bucket form


@pytest.mark.parametrize("view", ["plain", "widened"])
def test_query_equals_spark_h_buckets_and_types_included(spark, view):
    """``widened`` groups by expressions whose DuckDB type is not Spark's (DECIMAL(9,2) * 2 is
    DECIMAL(20,2) in Spark, whose hash is over bytes, not a long): buckets must follow Spark."""
    compiled = compile_text(PROGRAM, path="local.sql", name="local")
    sql = _h_sql(compiled, view)
    rng = np.random.default_rng(3)
    n = 3000
    batch = pa.table({
        "x": pa.array(np.where(rng.random(n) < 0.05, None, rng.integers(-50, 50, n)), pa.int64()),
        "y": pa.array(rng.integers(0, 1000, n), pa.int64()),
        "name": pa.array(["n"] * n),
        "d": pa.array([None if i % 7 == 0 else f"{i % 1000}.25" for i in range(n)]).cast(
            pa.decimal128(9, 2)),
        "_row": pa.array(range(1, n + 1), pa.int64()),
    })
    spark.createDataFrame(batch).createOrReplaceTempView("batch")
    expected = spark.sql(sql).toArrow()
    schema = pa.schema([f.with_nullable(True) for f in expected.schema])
    engine = LocalSql()
    got = engine.query(sql, {"batch": batch}, schema)
    assert got is not None and engine.queries == 1
    key = [(c, "ascending") for c in schema.names if c != "_bucket"]
    assert got.sort_by(key).equals(expected.cast(schema).sort_by(key))


def test_query_gives_way_when_the_result_does_not_fit():
    engine = LocalSql()
    batch = pa.table({"x": pa.array([2**62, 2**62], pa.int64())})
    sum_sql = "SELECT coalesce(sum(x), 0) AS s FROM batch"
    assert engine.query(sum_sql, {"batch": batch}, pa.schema([("s", pa.int64())])) is None
    assert engine.query(sum_sql, {"batch": batch}, pa.schema([("t", pa.int64())])) is None
    assert engine.query("SELECT x AS s FROM batch", {"batch": batch},
                        pa.schema([("s", pa.int64())])) is not None

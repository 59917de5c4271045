"""Our ``xxhash64`` equals Spark's, value for value, for every declared column type.

The driver-side path writes ``_bucket`` values and row-index fingerprints that Spark-written
rows must agree with, so this compares against Spark itself, NULLs, edge values and
multi-column chains included.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from incr.runtime import sparkhash

_COLUMNS = {
    "b": pa.array([True, False, None, True, False, True], pa.bool_()),
    "i8": pa.array([0, -1, 127, -128, None, 5], pa.int8()),
    "i16": pa.array([0, -1, 32767, -32768, 7, None], pa.int16()),
    "i32": pa.array([0, -1, 2**31 - 1, -(2**31), None, 10000], pa.int32()),
    "i64": pa.array([0, -1, 2**63 - 1, -(2**63), 123456789012, None], pa.int64()),
    "f64": pa.array([0.0, -0.0, float("nan"), 1.5, -1e300, None], pa.float64()),
    "f32": pa.array([0.0, -0.0, float("nan"), 1.5, -3.25, None], pa.float32()),
    "s": pa.array(["", "a", "incr-row-index", "ünïcødé ☃", None, "x" * 40], pa.string()),
    "d": pa.array([dt.date(1970, 1, 1), dt.date(1969, 12, 31), None, dt.date(2024, 2, 29),
                   dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()),
    "ts": pa.array([dt.datetime(1970, 1, 1), dt.datetime(2024, 5, 6, 7, 8, 9, 123456), None,
                    dt.datetime(1900, 1, 1), dt.datetime(2000, 1, 1), dt.datetime(1970, 1, 1, 0, 0, 1)],
                   pa.timestamp("us")),
    "dec": pa.array([Decimal("0.00"), Decimal("-1.25"), Decimal("12345.67"), None,
                     Decimal("-99999.99"), Decimal("0.01")], pa.decimal128(7, 2)),
    "wide": pa.array([Decimal(0), Decimal(-1), Decimal("12345678901234567890.123"), None,
                      Decimal(-128), Decimal(255)], pa.decimal128(30, 3)),
}


def _spark_hashes(spark, table: pa.Table, exprs: list[str]) -> list[list[int]]:
    df = spark.createDataFrame(table).selectExpr("_i", *[f"{e} AS h{n}" for n, e in enumerate(exprs)])
    rows = sorted(df.collect(), key=lambda r: r["_i"])
    return [[r[f"h{n}"] for r in rows] for n in range(len(exprs))]


def test_every_type_alone_and_chained(spark):
    table = pa.table({**_COLUMNS, "_i": pa.array(range(6), pa.int64())})
    names = list(_COLUMNS)
    exprs = [f"xxhash64(`{n}`)" for n in names]
    exprs.append("xxhash64(" + ", ".join(f"`{n}`" for n in names) + ")")
    exprs.append("xxhash64(" + ", ".join(f"`{n}` IS NULL, `{n}`" for n in names) + ")")
    exprs.append("CAST(pmod(xxhash64(`i32`, `s`), 8) AS INT)")
    expected = _spark_hashes(spark, table, exprs)
    for name, want in zip(names, expected):
        assert sparkhash.xxhash64([table[name]]).tolist() == want, name
    assert sparkhash.xxhash64([table[n] for n in names]).tolist() == expected[-3]
    flags = []
    for n in names:
        flags += [table[n].is_null(), table[n]]
    assert sparkhash.xxhash64(flags).tolist() == expected[-2]
    assert sparkhash.buckets([table["i32"], table["s"]], 8).to_pylist() == expected[-1]


def test_string_literal_seed_and_random_values(spark):
    rng = np.random.default_rng(7)
    n = 2000
    table = pa.table({
        "x": pa.array(rng.integers(-(2**62), 2**62, n), pa.int64()),
        "y": pa.array(rng.normal(size=n)),
        "s": pa.array(["".join(chr(c) for c in rng.integers(32, 0x2FF, rng.integers(0, 30)))
                       for _ in range(n)]),
        "_i": pa.array(range(n), pa.int64()),
    })
    want, = _spark_hashes(spark, table, ["xxhash64('incr-row-index', x, y, s)"])
    seed = sparkhash.string_hash("incr-row-index")
    assert sparkhash.xxhash64([table["x"], table["y"], table["s"]], seed=seed).tolist() == want


def test_unsupported_type_is_refused():
    with pytest.raises(sparkhash.UnsupportedType):
        sparkhash.xxhash64([pa.array([b"x"], pa.binary())])

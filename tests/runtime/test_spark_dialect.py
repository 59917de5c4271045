"""The compiler's Spark text of scalar expressions computes what DuckDB computes
(incr.compiler.dialect.render_expression), held against both engines over a grid of values."""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlglot

from incr.compiler.dialect import SPARK, render_expression
from incr.oracle import connect

TEXTS = ["", "a", "abc", "abcdef", None]
NUMBERS = [*range(-8, 9), None]
ROWS = [(s, p, n) for s in TEXTS for p in NUMBERS for n in NUMBERS]


def _both(spark, expression: str) -> tuple[list[object], list[object]]:
    """``expression`` over the grid ``(s, p, n)`` (p and n BIGINT): Spark's values of its
    rendered text, the oracle's of the text itself."""
    grid = pa.table({"s": pa.array([r[0] for r in ROWS], pa.string()),
                     "p": pa.array([r[1] for r in ROWS], pa.int64()),
                     "n": pa.array([r[2] for r in ROWS], pa.int64())})
    text = render_expression(sqlglot.parse_one(expression, read="duckdb"), SPARK)
    frame = spark.createDataFrame(ROWS, "s STRING, p BIGINT, n BIGINT")
    got = [r[0] for r in frame.selectExpr(f"{text} AS x").collect()]
    oracle = connect()
    oracle.register("grid", grid)
    want = [r[0] for r in oracle.sql(f"SELECT {expression} FROM grid").fetchall()]
    return got, want


@pytest.mark.parametrize("expression", [
    "substr(s, p, n)", "substr(s, p)", "substring(s, 0, n)", "substr(s, p, 2)", "substr(s, p, -2)",
    "substr(s, 3, n)", "substr(s, -3, n)", "substr(s, 0, 3)", "substr(s, 3, -2)", "substr(s, 0, -1)",
    "substr(s, -2, -1)", "substr(s, 5, -9)", "substr(substr(s, p, 4), 0, n)",
])
def test_a_substring_takes_duckdb_s_characters_in_spark(spark, expression):
    """DuckDB reads a start of 0 as the place before the first character and a negative
    length as the characters before the start; Spark reads 0 as 1 and takes nothing.  A
    substring's Spark text takes DuckDB's characters for every start and length, NULL and
    text shorter than either included."""
    got, want = _both(spark, expression)
    differ = [(row, g, w) for row, g, w in zip(ROWS, got, want, strict=True) if g != w]
    assert not differ, differ[:5]


@pytest.mark.parametrize("expression", ["(p % n) % 3", "9 % (p % n)", "(p / n) / 2", "2 / (p / n)",
                                        "p / (n - n)"])
def test_a_nested_division_or_remainder_is_null_on_a_zero_divisor(spark, expression):
    """Each ``/`` and ``%`` of an expression is rewritten, inner ones too: Spark's ANSI mode
    fails a batch on a zero divisor, where the oracle's value (:func:`incr.oracle.connect`)
    is NULL."""
    got, want = _both(spark, expression)
    assert got == want

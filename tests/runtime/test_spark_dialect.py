"""The compiler's Spark text of scalar expressions computes what DuckDB computes
(incr.compiler.dialect.render_expression), held against both engines over a grid of values."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
import sqlglot

from incr.compiler.dialect import SPARK, render_expression
from incr.oracle import connect

TEXTS = ["", "a", "abc", "abcdef", None]
NUMBERS = [*range(-8, 9), None]
#: Beyond Spark's INT, which its substr takes (DuckDB's takes up to 2^32 - 1).
WIDE = [2**31 - 1, 2**31, 3_000_000_000, -(2**31), -3_000_000_000]
ROWS = [(s, p, n) for s in TEXTS for p in NUMBERS for n in NUMBERS]
WIDE_ROWS = [(s, p, n) for s in TEXTS for p in [*NUMBERS, *WIDE] for n in [*NUMBERS, *WIDE]
             if p in WIDE or n in WIDE]


def _both(spark, expression: str, rows: list[tuple] = ROWS) -> tuple[list[object], list[object]]:
    """``expression`` over the grid ``rows`` of ``(s, p, n)`` (p and n BIGINT): Spark's
    values of its rendered text, the oracle's of the text itself."""
    grid = pa.table({"s": pa.array([r[0] for r in rows], pa.string()),
                     "p": pa.array([r[1] for r in rows], pa.int64()),
                     "n": pa.array([r[2] for r in rows], pa.int64())})
    text = render_expression(sqlglot.parse_one(expression, read="duckdb"), SPARK)
    frame = spark.createDataFrame(rows, "s STRING, p BIGINT, n BIGINT")
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


@pytest.mark.parametrize("expression", [
    "substr(s, p, n)", "substr(s, p)", "substr(s, 0, n)", "substr(s, -3, n)", "substr(s, p, 2)",
    "substr(s, 3000000000)", "substr(s, -3000000000)", "substr(s, 2, 3000000000)",
    "substr(s, 2147483648, -2147483647)", "substr(s, -3000000000, 3000000002)",
    "substr(s, 0, 2147483648)",
])
def test_a_substring_beyond_spark_s_int_takes_duckdb_s_characters(spark, expression):
    """Spark's substr takes INT starts and lengths, where ANSI mode fails a batch on a
    BIGINT beyond them; DuckDB's takes BIGINTs.  Starts and lengths beyond 2^31 - 1, written
    out or computed by rows, take DuckDB's characters in Spark."""
    rows = WIDE_ROWS if "p" in expression or "n" in expression.replace("substr", "") else ROWS
    got, want = _both(spark, expression, rows)
    differ = [(row, g, w) for row, g, w in zip(rows, got, want, strict=True) if g != w]
    assert not differ, differ[:5]


@pytest.mark.parametrize("expression", ["(p % n) % 3", "9 % (p % n)", "(p / n) / 2", "2 / (p / n)",
                                        "p / (n - n)"])
def test_a_nested_division_or_remainder_is_null_on_a_zero_divisor(spark, expression):
    """Each ``/`` and ``%`` of an expression is rewritten, inner ones too: Spark's ANSI mode
    fails a batch on a zero divisor, where the oracle's value (:func:`incr.oracle.connect`)
    is NULL."""
    got, want = _both(spark, expression)
    assert got == want


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_a_batch_of_substring_places_beyond_spark_s_int_is_folded_as_duckdb_takes_it(
        spark, dirs, local_rows):
    """A view grouped by substrings whose start and length come from a BIGINT column holding
    values beyond 2^31 folds its batch in Spark (ANSI mode once failed it casting them to
    INT) and on the driver alike, equal to DuckDB's answer."""
    from pyarrow import parquet as pq

    from incr.compiler import compile_text
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    landing, warehouse = dirs
    compiled = compile_text(
        "CREATE TABLE t (k VARCHAR, p BIGINT);\n"
        "CREATE VIEW parts AS SELECT substr(k, p) AS tail, substr(k, 2, p) AS head, "
        "COUNT(*) AS n FROM t GROUP BY substr(k, p), substr(k, 2, p);\n", name="wide")
    rows = pa.table({"k": ["abc", "abc", "abcd", "x", "abc"],
                     "p": pa.array([3_000_000_000, -3_000_000_000, 2, None, 2**31], pa.int64())})
    (landing / "t").mkdir()
    pq.write_table(rows, landing / "t" / "0000.parquet")
    report = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()
    assert report.rejected is None, report.rejected
    (plan,) = compiled.plans
    answer, _ = read_answer(warehouse, plan)
    assert diff_answers(oracle_answer(plan.select, {"t": rows}), answer) is None


#: A week and a day of dates over a year's end (every day of the week, Sunday 2026-12-27 among
#: them), each with a time of a fractional second, and NULL.
DAYS = [dt.date(2026, 12, 26) + dt.timedelta(days=i) for i in range(8)] + [None]
TIMES = [None if d is None else dt.datetime(d.year, d.month, d.day, i, 59, 58, 750_000)
         for i, d in enumerate(DAYS)]


@pytest.mark.parametrize("expression", [
    "dayofweek(d)", "weekday(d)", "isodow(d)", "extract(dow FROM d)", "extract(isodow FROM t)",
    "extract(weekday FROM t)", "date_part('dow', t)", "datepart('isodow', d)",
    "extract(second FROM t)", "date_part('second', t)", "second(t)", "monthname(d)",
    "dayname(t)", "monthname(t) || ' ' || dayname(d)", "extract(year FROM d)",
    "date_part('month', t)", "dayofweek(d) * 10 + isodow(t)",
])
def test_days_of_the_week_seconds_and_names_take_duckdb_s_values(spark, expression):
    """DuckDB counts the day of the week from Sunday 0 (``dayofweek``, ``weekday``, EXTRACT
    and ``date_part`` of ``dow``) and its ISO day from Monday 1, keeps a second whole and
    writes month and day names in full; Spark's functions of those names count from Sunday
    1 (``weekday`` from Monday 0), know no ISODOW, keep the second's fraction and write
    ``Dec`` and ``Sun``.  Their Spark text takes DuckDB's values, NULL included."""
    grid = pa.table({"d": pa.array(DAYS, pa.date32()), "t": pa.array(TIMES, pa.timestamp("us"))})
    text = render_expression(sqlglot.parse_one(expression, read="duckdb"), SPARK)
    frame = spark.createDataFrame(grid).selectExpr("d", "CAST(t AS TIMESTAMP_NTZ) AS t")
    got = [r[0] for r in frame.selectExpr(f"{text} AS x").collect()]
    oracle = connect()
    oracle.register("grid", grid)
    want = [r[0] for r in oracle.sql(f"SELECT {expression} FROM grid").fetchall()]
    assert [g if g is None or isinstance(g, str) else int(g) for g in got] == \
        [w if w is None or isinstance(w, str) else int(w) for w in want], text

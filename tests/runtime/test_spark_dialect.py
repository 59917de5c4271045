"""The compiler's Spark text of scalar expressions computes what DuckDB computes
(incr.compiler.dialect.render_expression), held against both engines over a grid of values."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pyarrow as pa
import pytest
import sqlglot

from incr.compiler.dialect import SPARK, render_expression
from incr.compiler.program import DUCKDB
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


@pytest.mark.parametrize("expression", ["concat(s, p)", "concat(s, NULL, n)", "concat(p)",
                                        "concat(p, '/', n, s)", "concat_ws('-', s, p)"])
def test_concat_takes_numbers_and_skips_nulls_as_duckdb_does(spark, expression):
    """DuckDB's ``concat`` writes each argument as text and a NULL as nothing; sqlglot's
    Spark text coalesced each argument to ``''``, which ANSI mode refuses for a number."""
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


#: Instants around the boundaries date_diff counts: a second's fraction either side, hours
#: and days before 1970 (where counting units down differs from truncating), year and ISO
#: year ends, a leap day, a century's first year; every pair of them is a row.
INSTANTS = [dt.datetime(2026, 1, 1, 0, 0, 0, 900_000), dt.datetime(2026, 1, 1, 0, 0, 1, 100_000),
            dt.datetime(1969, 12, 31, 22, 30), dt.datetime(1969, 12, 31, 23, 59, 59, 500_000),
            dt.datetime(1970, 1, 1, 0, 30), dt.datetime(2026, 12, 27, 23, 0),
            dt.datetime(2026, 12, 28, 1, 0), dt.datetime(2027, 1, 4, 0, 0, 0, 1),
            dt.datetime(2024, 2, 29, 12), dt.datetime(2000, 1, 1), dt.datetime(1999, 12, 31, 23),
            dt.datetime(2001, 1, 1, 6), None]
PAIRS = [(a, b) for a in INSTANTS for b in INSTANTS]


@pytest.mark.parametrize("expression", [
    *(f"date_diff('{unit}', da, db)" for unit in (
        "millennium", "century", "decade", "year", "isoyear", "quarter", "month", "week",
        "yearweek", "day", "dow", "doy", "hour", "minute", "second", "millisecond")),
    *(f"date_diff('{unit}', a, b)" for unit in (
        "year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond",
        "microsecond")),
    "datediff('month', a, db)", "date_diff('hours', da, b)", "date_diff('mins', a, b)",
    "epoch(a)", "epoch(da)", "extract(epoch FROM a)", "millisecond(a)", "microsecond(a)",
    "extract(millisecond FROM a)", "date_part('microseconds', a)", "extract(decade FROM da)",
    "extract(century FROM a)", "extract(millennium FROM da)", "isoyear(da)",
    "extract(isoyear FROM a)", "yearweek(da)", "date_part('yearweek', a)", "week(da)", "week(a)",
    "da + INTERVAL 1 DAY", "da + INTERVAL 1 MONTH", "INTERVAL 2 HOUR + da", "da - INTERVAL 3 DAY",
    "a + INTERVAL 90 MINUTE", "a - INTERVAL 1 MONTH", "date_trunc('month', da + INTERVAL 1 DAY)",
    "date_add(da, INTERVAL 1 DAY)", "date_add(a, INTERVAL 2 HOUR)",
])
def test_date_diffs_and_the_parts_spark_lacks_take_duckdb_s_values(spark, expression):
    """DuckDB's ``date_diff`` counts its part's boundaries (one month from 31 January to
    1 February; Spark's DATEDIFF of a MONTH counts whole months, none); its ``epoch`` keeps
    the second's fraction (Spark's ``unix_timestamp`` drops it); Spark has no
    ``millisecond``, ``microsecond``, ``isoyear``, ``yearweek`` or ``week``, nor EXTRACT of
    the epoch, decade, century or millennium; a DATE plus an INTERVAL is a TIMESTAMP in
    DuckDB and a DATE in Spark.  Their Spark text takes DuckDB's values, NULL included."""
    def day(t):
        return None if t is None else t.date()
    grid = pa.table({"a": pa.array([a for a, _ in PAIRS], pa.timestamp("us")),
                     "b": pa.array([b for _, b in PAIRS], pa.timestamp("us")),
                     "da": pa.array([day(a) for a, _ in PAIRS], pa.date32()),
                     "db": pa.array([day(b) for _, b in PAIRS], pa.date32())})
    text = render_expression(sqlglot.parse_one(expression, read="duckdb"), SPARK)
    frame = spark.createDataFrame(grid).selectExpr(
        "CAST(a AS TIMESTAMP_NTZ) AS a", "CAST(b AS TIMESTAMP_NTZ) AS b", "da", "db")
    got = [r[0] for r in frame.selectExpr(f"{text} AS x").collect()]
    oracle = connect()
    oracle.register("grid", grid)
    want = [r[0] for r in oracle.sql(f"SELECT {expression} FROM grid").fetchall()]
    differ = [(pair, g, w) for pair, g, w in zip(PAIRS, got, want, strict=True) if g != w]
    assert not differ, (text, differ[:3])


TEXTS_TO_MATCH = ["", "abc", "abcabc", "aXbxc", "x%y_z", "ÄÖü ß", "a\nb\nc", "ab,,cd,", "  a b ",
                  "🙂x🙂", None]


@pytest.mark.parametrize("expression", [
    "regexp_replace(s, '[a-c]', 'X')", "regexp_replace(s, '[a-c]', 'X', 'g')",
    "regexp_replace(s, 'B', '-', 'i')", "regexp_replace(s, 'ä', '<\\0>', 'gi')",
    "regexp_replace(s, 'X', '_', 'ic')", "regexp_replace(s, '(b)(c)?', '\\2\\1$1\\\\9')",
    "regexp_replace(s, 'x*', '-')", "regexp_replace(s, '\\s', '_', 'g')",
    "regexp_replace(s, '^.', '')", "regexp_replace(s, ',+$', '')", "regexp_replace(s, 'b.', '|')",
    "regexp_replace(s, '(?i)A|C', '$')", "regexp_replace(s, 'b+', '[\\0]')",
    "regexp_replace(s, '(a)(b)(c)', '\\3\\2\\1\\0')", "regexp_replace(s, 'a|b', '\\0\\0', 'g')",
    "regexp_replace(regexp_replace(s, 'a', 'b'), 'b', '1')",
    "prefix(s, 'a')", "suffix(s, 'c')", "prefix(s, '')",
])
def test_regexp_replace_replaces_what_duckdb_replaces(spark, expression):
    """DuckDB's ``regexp_replace`` replaces the first match unless its options say ``g``
    (Spark's every match), names a group ``\\1`` and reads ``$`` as itself (Spark's ``$1``
    and an escape); ``i`` folds case beyond ASCII.  DuckDB's ``prefix`` and ``suffix`` are
    Spark's ``startswith`` and ``endswith``.  Their Spark text replaces what DuckDB does."""
    _over_texts(spark, expression, TEXTS_TO_MATCH)


def _over_texts(spark, expression: str, texts: list[str | None]) -> None:
    """``expression`` of a text ``s``, read as a program is (:data:`DUCKDB`), has the
    oracle's values over ``texts`` in Spark."""
    grid = pa.table({"s": pa.array(texts, pa.string())})
    text = render_expression(sqlglot.parse_one(expression, read=DUCKDB), SPARK)
    got = [r[0] for r in spark.createDataFrame(grid).selectExpr(f"{text} AS x").collect()]
    oracle = connect()
    oracle.register("grid", grid)
    want = [r[0] for r in oracle.sql(f"SELECT {expression} FROM grid").fetchall()]
    assert got == want, text


#: Texts at the edges where RE2 and Java read a pattern apart: line breaks other than
#: ``\n``, a last ``\n``, a vertical tab, letters beyond ASCII next to word characters, the
#: Kelvin sign and the long s (which fold to ``k`` and ``s``), brackets and ampersands.
TEXTS_FOR_PATTERNS = ["", "ab", "a\nb", "a\rb", "a\u2028b", "a\u0085b", "abc\n", "a\x0bb",
                      "ÉX", "éa", "Straße", "\u212a", "\u017f", "a{,3}", "[&]", "a]", "aab",
                      "ab\nab", "A\nb", "x_y z", "k", "a\x00.b*", None]


@pytest.mark.parametrize("expression", [
    # '.' and '$' as RE2 reads them: every line break but \n, the very end
    "regexp_matches(s, 'a.b')", "regexp_matches(s, 'a.b', 's')", "regexp_matches(s, 'c$')",
    "regexp_matches(s, '(?m)^b$')", "regexp_matches(s, '(?m)b$|^$')", "regexp_matches(s, '(?s:.)b')",
    # ASCII word boundaries, \s without the vertical tab, \v the vertical tab alone
    "regexp_matches(s, '\\ba')", "regexp_matches(s, 'a\\b')", "regexp_matches(s, '\\Bb')",
    "regexp_matches(s, '\\s')", "regexp_matches(s, '[^\\S]')", "regexp_matches(s, '\\v')",
    "regexp_matches(s, '\\w+$')", "regexp_matches(s, '\\W')",
    # POSIX classes, and [ & ] { as themselves
    "regexp_matches(s, '^[[:alpha:]]+$')", "regexp_matches(s, '[[:^alpha:][:digit:]]')",
    "regexp_matches(s, '[[&]')", "regexp_matches(s, '[a&&b]')", "regexp_matches(s, '[]a]')",
    "regexp_matches(s, 'a{,3}')", "regexp_matches(s, 'a{2}')",
    # DuckDB's options: case folded beyond ASCII (the Kelvin sign is a k), literal text
    "regexp_matches(s, 'é', 'i')", "regexp_matches(s, 'k', 'i')", "regexp_matches(s, '\\w', 'i')",
    "regexp_matches(s, '(?i)S$')", "regexp_matches(s, 'A', 'ic')", "regexp_matches(s, 'A', 'ci')",
    "regexp_matches(s, 'a.b', 'l')", "regexp_matches(s, '[&]', 'li')",
    "regexp_matches(s, '(?i:A)(?-i)b')", "regexp_matches(s, '\\p{Greek}|\\pN')",
    "regexp_matches(s, '^[[:lower:]]+$', 'i')", "regexp_matches(s, '[[:^alpha:]]', 'i')",
    # RE2's (?U): quantifiers lazy, and lazy ones greedy
    "regexp_extract(s, '(?U)a+')", "regexp_extract(s, '(?U)(a+?)b')", "regexp_escape(s)",
    # a full match, ~ included (DuckDB before 2.0 reads it so), and its negation
    "regexp_full_match(s, 'a.b')", "regexp_full_match(s, 'ab|a', 'i')", "s ~ 'a.*'",
    "s !~ '[a-c]+'", "s ~ '(?P<first>a)b'",
    # what regexp_extract takes: a group, options; '' where the group took no part
    "regexp_extract(s, 'a(.)')", "regexp_extract(s, '(a)(x)?b', 2)",
    "regexp_extract(s, '(?P<n>[a-c]+)$', 1, 'i')", "regexp_extract(s, '\\w+\\b', 0)",
    "regexp_extract_all(s, '[a-c]', 0, 'i')",
    "regexp_replace(s, '.$', '<\\0>', 's')", "regexp_replace(s, 'a.b', '-', 'gl')",
])
def test_patterns_match_what_duckdb_matches(spark, expression):
    """A pattern is RE2's under DuckDB's options; its Spark text is a Java pattern of the
    same matches (:mod:`incr.compiler.patterns`), over texts where the two engines read
    the original apart."""
    _over_texts(spark, expression, TEXTS_FOR_PATTERNS)


def _insert_then_delete(spark, dirs, local_rows: int, program: str, rows: pa.Table,
                        deleted: int) -> None:
    """Runs ``program`` over ``rows`` of its table ``t``, then over a delete of the first
    ``deleted`` of them, each view's answer equal to DuckDB's after each batch."""
    from pyarrow import parquet as pq

    from incr.compiler import compile_text
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    landing, warehouse = dirs
    compiled = compile_text(program, name="calls")
    (landing / "t" / "_deletes").mkdir(parents=True)
    pq.write_table(rows, landing / "t" / "0000.parquet")
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    for step, live in ((0, rows), (1, rows.slice(deleted))):
        if step:
            pq.write_table(rows.slice(0, deleted), landing / "t" / "_deletes" / "0001.parquet")
        report = pipeline.run()
        assert report.rejected is None, report.rejected
        for plan in compiled.plans:
            answer, _ = read_answer(warehouse, plan)
            assert diff_answers(oracle_answer(plan.select, {"t": live}), answer) is None, plan.view


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_views_grouped_by_date_diffs_intervals_and_replacements_equal_duckdb(spark, dirs,
                                                                            local_rows):
    """Views grouped by DuckDB's ``date_diff``, ``epoch``, ``yearweek``, a DATE plus an
    INTERVAL and ``regexp_replace``, one of them regrouped from another's state
    (``share = rollup``), publish DuckDB's answers after an insert and a delete."""
    program = (
        "-- incr: share = rollup\n"
        "CREATE TABLE t (k VARCHAR, day DATE, sold_at TIMESTAMP, v BIGINT);\n"
        "CREATE VIEW by_day AS SELECT day, k, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY day, k;\n"
        "CREATE VIEW by_month AS SELECT date_diff('month', DATE '2026-11-30', day) AS months, "
        "yearweek(day) AS week, day + INTERVAL 1 DAY AS next, SUM(v) AS s FROM t GROUP BY 1, 2, 3;\n"
        "CREATE VIEW by_text AS SELECT regexp_replace(k, '([a-c])', '<\\1>') AS first, "
        "regexp_replace(k, '[a-c]', '#', 'g') AS every, epoch(sold_at) AS e, "
        "date_diff('hour', TIMESTAMP '2026-12-31 23:30:00', sold_at) AS hours, MAX(v) AS top "
        "FROM t GROUP BY 1, 2, 3, 4;\n")
    days = [dt.date(2026, 11, 30) + dt.timedelta(days=i * 9) for i in range(8)]
    rows = pa.table({"k": ["abc", "cab", "xyz", None, "abc", "bb", "c", "abc"],
                     "day": pa.array(days, pa.date32()),
                     "sold_at": pa.array([dt.datetime(2026, 12, 31, 23, 59, 59, 250_000)
                                     + dt.timedelta(hours=7 * i) for i in range(8)],
                                    pa.timestamp("us")),
                     "v": pa.array(range(8), pa.int64())})
    _insert_then_delete(spark, dirs, local_rows, program, rows, deleted=3)


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_rounding_casts_and_days_between_dates_take_duckdb_s_values(spark, dirs, local_rows):
    """DuckDB rounds a DOUBLE to decimals in floating point (the average of 1.00 and 1.01
    rounds to 1.0; Spark's ROUND of the decimal it prints, 1.01), casts a DOUBLE to an
    integer half to even and a DECIMAL half away from zero (Spark truncates both), keeps
    ``floor``, ``ceil`` and ``trunc`` of a DOUBLE a DOUBLE (Spark's BIGINT saturates at
    2^63) and counts the days between two DATEs (Spark's an INTERVAL).  Views of them
    publish DuckDB's answers after an insert and a delete."""
    program = (
        "CREATE TABLE t (k VARCHAR, x DOUBLE, y DOUBLE, p DECIMAL(10, 3), a DATE, b DATE, "
        "v BIGINT);\n"
        "CREATE VIEW averages AS SELECT k, round(AVG(x), 2) AS a2, round(SUM(x) / 7, 3) AS s3, "
        "CAST(AVG(x) AS INTEGER) AS ai, CAST(SUM(p) AS INTEGER) AS pi FROM t GROUP BY k;\n"
        "CREATE VIEW wholes AS SELECT CAST(x AS BIGINT) AS xi, TRY_CAST(p AS SMALLINT) AS ps, "
        "floor(y) AS fy, ceil(y) AS cy, trunc(y) AS ty, CAST(x AS DECIMAL(20, 2)) AS xd, "
        "COUNT(*) AS n FROM t GROUP BY 1, 2, 3, 4, 5, 6;\n"
        "CREATE VIEW spans AS SELECT a - b AS days, round(x, 2) AS r, SUM(v) AS s "
        "FROM t GROUP BY 1, 2;\n")
    xs = [1.0, 1.01, 2.675, 0.285, 2.5, 3.5, -2.5, -0.5, 0.5, 1.005, -1.005, None]
    ys = [1e20, -3e19, 2.5, -2.5, 4503599627370497.0, -0.5, 7.0, None, 1.5, -1e300, 0.25, 3.75]
    ps = ["2.500", "-2.500", "1.499", "0.500", "-0.500", "3.500", None, "7.250", "1.500",
          "-1.500", "0.001", "2.000"]
    rows = pa.table({
        "k": ["a", "a", "b", "c", "d", "d", "e", "e", "f", "g", "g", "h"],
        "x": pa.array(xs, pa.float64()), "y": pa.array(ys, pa.float64()),
        "p": pa.array([None if p is None else Decimal(p) for p in ps], pa.decimal128(10, 3)),
        "a": pa.array([dt.date(2026, 12, 1) + dt.timedelta(days=3 * i) for i in range(12)],
                      pa.date32()),
        "b": pa.array([dt.date(2026, 1, 31) + dt.timedelta(days=40 * i) for i in range(11)]
                      + [None], pa.date32()),
        "v": pa.array(range(12), pa.int64())})
    _insert_then_delete(spark, dirs, local_rows, program, rows, deleted=2)


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_views_filtered_and_grouped_by_patterns_equal_duckdb(spark, dirs, local_rows):
    """Views grouped by ``regexp_extract`` with an option and filtered by ``~`` (a full
    match in DuckDB before 2.0), ``regexp_matches`` and ``regexp_full_match`` over texts
    with line breaks and letters beyond ASCII publish DuckDB's answers after an insert and
    a delete."""
    program = (
        "CREATE TABLE t (k VARCHAR, v BIGINT);\n"
        "CREATE VIEW codes AS SELECT regexp_extract(k, '^([a-z]+)-(\\d+)?', 1, 'i') AS code, "
        "COUNT(*) AS n, SUM(v) AS s FROM t WHERE k ~ '[[:alnum:]-]+' GROUP BY 1;\n"
        "CREATE VIEW lines AS SELECT regexp_matches(k, 'x.y') AS dotted, "
        "regexp_full_match(k, '.*\\bend$', 's') AS ends, MAX(v) AS top FROM t GROUP BY 1, 2;\n")
    texts = ["AB-12", "ab-", "x\ry", "x\ny end", "cd-7 end\n", "Kelvin \u212a", None, "ab-12",
             "x\u2028y", "Straße end", "zz-9"]
    rows = pa.table({"k": pa.array(texts, pa.string()),
                     "v": pa.array(range(len(texts)), pa.int64())})
    _insert_then_delete(spark, dirs, local_rows, program, rows, deleted=3)


#: Texts, numbers and times at the edges where DuckDB's text and number calls and Spark's
#: of the same name part ways: empty and non-ASCII texts, NULL, zero, a negative count, a
#: count beyond Spark's INT, NaN and infinities, a time before 1970 with microseconds.
_EDGES = pa.table({
    "r": pa.array(range(10), pa.int64()),
    "s": pa.array(["", "a", "a,b,,c", "héllo wörld", "日本語", "ab🙂d", None, "x,y", "ß", "a\\_b%"]),
    "t": pa.array(["b", "", "abc", "hello", "日", "🙂", "a", None, "ss", "a\\_%"]),
    "i": pa.array([-2, -1, 0, 1, 2, 3, 2**31, None, -(2**31) - 5, 7], pa.int64()),
    "j": pa.array([3, 0, 2, -2, None, 7, -1, 4, 0, 2], pa.int64()),
    "x": pa.array([0.5, -7.5, float("nan"), float("inf"), float("-inf"), None, -0.0, 1e300,
                   2.675, 12.0], pa.float64()),
    "q": pa.array([Decimal("7.50"), Decimal("-7.50"), None, Decimal("0.01"), Decimal("1.00"),
                   Decimal("2.68"), Decimal("-0.50"), Decimal("99.99"), Decimal("3.00"),
                   Decimal("5.25")], pa.decimal128(12, 2)),
    "ts": pa.array([dt.datetime(1960, 1, 1, 0, 0, 0, 3), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                    dt.datetime(1970, 1, 1), None, dt.datetime(2024, 2, 29, 12, 34, 56, 789012),
                    dt.datetime(2000, 1, 1), dt.datetime(1900, 3, 1, 1, 1, 1, 1),
                    dt.datetime(2038, 1, 19, 3, 14, 8), dt.datetime(2001, 1, 1), dt.datetime(1999, 12, 31)],
                   pa.timestamp("us")),
    "d": pa.array([dt.date(1960, 1, 1), None, dt.date(2000, 12, 31), dt.date(2001, 1, 1),
                   dt.date(1999, 1, 1), dt.date(1000, 1, 1), dt.date(2024, 2, 29),
                   dt.date(1969, 12, 31), dt.date(2100, 1, 1), dt.date(1970, 1, 1)], pa.date32()),
})
_EDGE_TABLE = ("CREATE TABLE e (r BIGINT, s VARCHAR, t VARCHAR, i BIGINT, j BIGINT, x DOUBLE, "
               "q DECIMAL(12, 2), ts TIMESTAMP, d DATE);\n")


@pytest.mark.parametrize("expression", [
    "left(s, i)", "right(s, i)", "left(s, -1)", "right(s, -2)", "left(s, 3000000000)",
    "split_part(s, ',', i)", "split_part(s, ',', j)", "split_part(s, ',', 0)",
    "split_part(s, t, 2)", "strlen(s)", "unicode(s)", "ord(s)", "levenshtein(s, t)",
    "isnan(x)", "isinf(x)", "isfinite(x)", "i // j", "x // 2", "q // 2", "q // j", "i // 2",
    "printf('%05d|%s', i, s)", "epoch_ms(ts)", "epoch_ms(d)", "epoch_us(ts)", "nanosecond(ts)",
    "century(d)", "decade(d)", "millennium(d)",
    "trunc(q, 1)", "trunc(x, 2)", "trunc(x, -1)", "trunc(q, -1)", "trunc(i, -1)",
    "date_trunc('decade', d)", "date_trunc('century', ts)", "date_trunc('millennium', d)",
    "date_trunc('isoyear', d)", "s LIKE '%\\%'", "s LIKE 'a\\_%'", "s LIKE t", "s ILIKE '%\\%'",
    "s NOT LIKE '%\\_b%'", "strftime(ts, '%d/%m/%Y %I:%M %p')", "strftime(ts, '%j|%-j|%-d')",
    "strftime(ts, '%H:%M:%S.%g %f')", "strftime(ts, '100%% T''x [q] #')",
    "strftime(d, '%a %A %b %B')",
])
def test_text_and_number_calls_take_duckdb_s_values(spark, expression):
    """Each call computed by a compiled view's h, in Spark and on the driver when it takes
    it, equals DuckDB's over edge values (:data:`_EDGES`).  On the code before, 41 of these
    48 failed: Spark's first batch failed for 23 (an unknown function, a count beyond its
    INT, a zero divisor or part, a format letter it refuses) and 18 took other values (a
    negative count, NULL, ``''``, bytes, dropped decimals, a backslash read as an escape,
    a format's text read as letters)."""
    _takes_duckdb_s_values(spark, expression, _EDGES, _EDGE_TABLE)


@pytest.mark.parametrize("expression", [
    "epoch(ts - TIMESTAMP '2000-01-01 00:00:00')", "extract(epoch FROM (ts - d))",
    "date_part('epoch', ts - TIMESTAMP '1970-01-01 00:00:00.5')", "epoch_ms(ts - d)",
    "epoch_us(TIMESTAMP '1999-12-31 23:59:59' - ts)",
])
def test_a_duration_s_seconds_take_duckdb_s_values(spark, expression):
    """The seconds (milliseconds, microseconds) of a TIMESTAMP minus a TIMESTAMP or a DATE, an
    INTERVAL: Spark cast the interval to a TIMESTAMP and refused the view's first batch, on
    the code before, in all five."""
    _takes_duckdb_s_values(spark, expression, _EDGES, _EDGE_TABLE)


#: Numbers as text: ``s`` of every kind (``t`` only those DuckDB's CAST takes).
_NUMBERS_AS_TEXT = pa.table({
    "r": pa.array(range(12), pa.int64()),
    "s": pa.array(["12", " 12.5 ", "-12.5", "1e3", "3.0", ".5", "12a", "", "2147483647.5",
                   "\u0663", "1.999999999999999999999", None]),
    "t": pa.array(["12", " 12.5 ", "-12.5", "1e3", "3.0", ".5", "-.5", "5e-1", "+7",
                   "\t7\n", "1.999999999999999999999", None]),
})


@pytest.mark.parametrize("expression", [
    "TRY_CAST(s AS INTEGER)", "TRY_CAST(s AS BIGINT)", "TRY_CAST(s AS SMALLINT)",
    "CAST(t AS INTEGER)", "CAST(t AS BIGINT)",
])
def test_text_cast_to_an_integer_reads_a_fraction_as_duckdb_does(spark, expression):
    """DuckDB reads ``'12.5'`` as 13 (half away from zero), ``'1e3'`` as 1000 and ``'3.0'``
    as 3, where Spark's cast failed the batch (TRY_CAST: NULL); Arabic-Indic digits, which
    Java reads, are NULL in both.  All five fail on the code before."""
    _takes_duckdb_s_values(spark, expression, _NUMBERS_AS_TEXT,
                           "CREATE TABLE e (r BIGINT, s VARCHAR, t VARCHAR);\n")


#: Texts whose case Java's full mapping (Spark's) takes otherwise than DuckDB's.
_CASED = pa.table({
    "r": pa.array(range(9), pa.int64()),
    "s": pa.array(["Straße", "\u039f\u0394\u039f\u03a3 \u03a3\u0391\u03a3.", "\u0130stanbul",
                   "\u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3", "abc", None, "\u1e9e",
                   "ab\U0001f642\u00df", "\u03c3\u03c2"]),
})


@pytest.mark.parametrize("expression", [
    "upper(s)", "lower(s)", "ucase(s)", "lcase(s)", "lower(upper(s))", "length(upper(s))",
    "upper(s) LIKE '%SS%'", "lower(s) = 'istanbul'",
])
def test_upper_and_lower_case_text_as_duckdb_does(spark, expression):
    """``upper`` and ``lower`` in Spark take DuckDB's case of German, Turkish and Greek text:
    Java's is ``STRASSE`` for ``Straße`` (DuckDB ``STRAẞE``), ``i̇`` for ``İ`` (DuckDB ``i``),
    the final sigma for a capital one ending a word (DuckDB the small sigma).  All eight
    cases fail on the code before."""
    _takes_duckdb_s_values(spark, expression, _CASED,
                           "CREATE TABLE e (r BIGINT, s VARCHAR);\n", beyond_ascii=True)


#: DOUBLEs DuckDB's ``sign`` and ``round(x, -n)`` take otherwise than Spark's.
_ODD_DOUBLES = pa.table({
    "r": pa.array(range(9), pa.int64()),
    "x": pa.array([float("nan"), float("inf"), float("-inf"), None, 15.0, -25.0, 1e300, -0.5,
                   12345.678], pa.float64()),
})


@pytest.mark.parametrize("expression", ["sign(x)", "round(x, -1)", "round(x, -2)",
                                        "sign(x) + round(x / 2, -1)"])
def test_sign_and_round_to_tens_of_nan_and_infinity_are_duckdb_s(spark, expression):
    """DuckDB's ``sign`` of NaN is 0 and its ``round(x, n)`` of a negative ``n`` is 0 of NaN
    and of either infinity, where Spark kept them.  All four fail on the code before."""
    _takes_duckdb_s_values(spark, expression, _ODD_DOUBLES, "CREATE TABLE e (r BIGINT, x DOUBLE);\n")


#: Texts and patterns Java's lower case (Spark's ILIKE) matches otherwise than DuckDB's.
_BLIND = pa.table({
    "r": pa.array(range(8), pa.int64()),
    "s": ["\u039f\u0394\u039f\u03a3", "\u03bf\u03b4\u03bf\u03c2", "\u0130stanbul", "istanbul",
          "\u0391\u03a3 \u0392", "Stra\u00dfe", None, "\u03a3\u0391\u03a3"],
    "t": ["\u03bf\u03b4\u03bf\u03c3", "\u039f\u0394\u039f\u03a3", "istanbul",
          "\u0130STANBUL", "\u03b1\u03c3%", "STRASSE", "x", "%\u03c3"],
})


@pytest.mark.parametrize("expression", [
    "s ILIKE t", "s NOT ILIKE t", "s ILIKE '%\u03c3'", "s ILIKE '\u03b1\u03c3%'",
    "s ILIKE 'ISTANBUL'", "NOT (s ILIKE t)",
])
def test_ilike_folds_case_as_duckdb_does(spark, expression):
    """DuckDB's ``a ILIKE b`` is ``lower(a) LIKE lower(b)`` by DuckDB's ``lower``; Spark's
    lowered both by Java's, so ``'ΟΔΟΣ' ILIKE 'οδοσ'`` was false (a final sigma) and
    ``'İstanbul' ILIKE 'istanbul'`` too (a combining dot).  All six fail on the code before."""
    _takes_duckdb_s_values(spark, expression, _BLIND,
                           "CREATE TABLE e (r BIGINT, s VARCHAR, t VARCHAR);\n", beyond_ascii=True)


def _takes_duckdb_s_values(spark, expression: str, edges: pa.Table, table: str,
                           beyond_ascii: bool = False) -> None:
    """``expression`` computed by a compiled view's h over ``edges`` (declared by ``table``),
    in Spark and on the driver when it takes it, equals DuckDB's.

    ``beyond_ascii``: the driver gives the text functions of text beyond ASCII to Spark
    (:func:`incr.runtime.local._ascii_text`), so it must decline ``edges``.
    """
    from incr.compiler import compile_text
    from incr.runtime.local import LocalSql, prepare

    compiled = compile_text(table + f"CREATE VIEW v AS SELECT r, {expression} AS v, "
                            f"COUNT(*) AS n FROM e GROUP BY r, v;", path="v.sql", name="v")
    plan = compiled.plans[0]
    h = plan.h_query(plan.main_tables[0].name, "batch")
    oracle = connect()
    oracle.register("e", edges)
    want = _nan_free(dict(oracle.sql(f"SELECT r, {expression} FROM e").fetchall()))
    spark.createDataFrame(edges).createOrReplaceTempView("batch")
    result = spark.sql(h.sql)
    value = result.columns[2]
    assert _nan_free({row["r"]: row[value] for row in result.collect()}) == want
    if prepare(h) is not None:
        schema = pa.schema([f.with_nullable(True) for f in result.toArrow().schema])
        driver = LocalSql().query(h, {"batch": edges}, schema)
        if beyond_ascii:
            assert driver is None
            return
        assert driver is not None
        assert _nan_free(dict(zip(driver["r"].to_pylist(), driver[value].to_pylist()))) == want


def _nan_free(values: dict[int, object]) -> dict[int, object]:
    """``values`` with NaN as the text ``'NaN'``, which compares equal to itself."""
    return {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_aggregate_shorthand_takes_duckdb_s_values(spark, dirs, local_rows):
    """FILTER, bool_or, bool_and, count_if and mean, written out as CASEs and counts, and
    GROUP BY ALL / ORDER BY ALL as positions, publish DuckDB's answers in both engines: over
    a group whose values are all NULL, one the filter empties, and after a delete that takes
    a group's only true value (bool_or turns false, bool_and true) and every row of another."""
    program = (
        "CREATE TABLE t (k VARCHAR, v BIGINT, ok BOOLEAN);\n"
        "CREATE VIEW flags AS SELECT k, bool_or(ok), bool_and(ok) AS every_ok, count_if(ok) AS c, "
        "COUNT(*) FILTER (WHERE ok) AS n_ok, SUM(v) FILTER (WHERE NOT ok) AS s, "
        "COUNT(DISTINCT v) FILTER (v > 1) AS d, mean(v) FILTER (WHERE ok) AS m "
        "FROM t GROUP BY ALL ORDER BY ALL DESC NULLS FIRST;\n"
        "CREATE VIEW overall AS SELECT 'all' AS label, bool_and(v > 0) AS positive, "
        "count_if(v > 2) FILTER (WHERE ok IS NULL) AS c FROM t GROUP BY ALL;\n"
        "CREATE VIEW running AS SELECT k, v, bool_or(ok) OVER (PARTITION BY k ORDER BY v) AS seen, "
        "count_if(ok) OVER (PARTITION BY k) AS c FROM t;\n")
    rows = pa.table({"k": ["d", "a", "b", "b", "c", "c", None, "a"],
                     "v": pa.array([0, 1, 2, 3, None, 5, 6, 7], pa.int64()),
                     "ok": pa.array([True, True, False, None, None, None, True, False])})
    # the delete takes d's only row (and the only v not above 0) and a's only true value
    _insert_then_delete(spark, dirs, local_rows, program, rows, deleted=2)

"""The driver-side path: which queries it takes, and that it answers what Spark answers."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot

from incr.compiler import compile_text
from incr.compiler.dialect import SPARK, Query, render_expression
from incr.compiler.program import DUCKDB
from incr.oracle import connect
from incr.runtime.local import LocalSql, prepare

PROGRAM = """-- incr: buckets = 8
CREATE TABLE s (x BIGINT, y BIGINT, name VARCHAR, d DECIMAL(9,2));
CREATE VIEW plain AS SELECT x, AVG(y) AS a, COUNT(*) AS n, SUM(d) AS total FROM s GROUP BY x;
CREATE VIEW texty AS SELECT reverse(name) AS u, COUNT(*) AS n FROM s GROUP BY reverse(name);
CREATE VIEW widened AS SELECT d * 2 AS dd, x + 1 AS x1, COUNT(*) AS n FROM s GROUP BY d * 2, x + 1;
"""


def _h_sql(compiled, view: str) -> Query:
    plan = next(p for p in compiled.plans if p.view == view)
    return plan.h_query(plan.main_tables[0].name, "batch")


def _driver_equals_spark(spark, sql: Query, batch: pa.Table) -> LocalSql:
    """Runs ``sql`` over ``batch`` (as ``batch``) on the driver and in Spark: the same rows,
    buckets and types; returns the driver's engine."""
    spark.createDataFrame(batch).createOrReplaceTempView("batch")
    expected = spark.sql(sql.sql).toArrow()
    schema = pa.schema([f.with_nullable(True) for f in expected.schema])
    engine = LocalSql()
    got = engine.query(sql, {"batch": batch}, schema)
    assert got is not None and engine.queries == 1
    assert got.num_rows == expected.num_rows
    key = [(c, "ascending") for c in schema.names if c != "_bucket"]
    assert got.sort_by(key).equals(expected.cast(schema).sort_by(key))
    return engine


def test_prepare_takes_plain_aggregates_and_refuses_other_functions():
    compiled = compile_text(PROGRAM, path="local.sql", name="local")
    prepared = prepare(_h_sql(compiled, "plain"))
    assert prepared is not None and prepared.bucket == ("_bucket", ("x",), 8)
    assert "xxhash64" not in prepared.sql.lower()
    assert prepare(_h_sql(compiled, "texty")) is None  # reverse(): Spark's semantics decide
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
    _driver_equals_spark(spark, sql, batch)


LISTS = """-- incr: buckets = 8
CREATE TABLE s (x BIGINT, y BIGINT, name VARCHAR, d DECIMAL(9,2));
CREATE VIEW listed AS SELECT x, name, SUM(y) AS s, COUNT(*) AS n FROM s
  WHERE x NOT IN (1, 2) AND (name IN ('a', 'c', NULL) OR x IN (3, 4, 5))
    AND y NOT BETWEEN 7 AND 8 GROUP BY x, name;
"""


def test_in_lists_and_between_equal_spark_nulls_included(spark):
    """``IN`` and ``NOT IN`` of a list (literals, NULL among them, or columns) and ``BETWEEN``
    are computed on the driver, equal to Spark's, NULL where a NULL leaves the answer
    unknown: a WHERE on a view's keys (``region IN ('north', 'south')``) and the HAVING it
    becomes run there, not in a Spark job.  ``IN`` of a subquery stays Spark's."""
    compiled = compile_text(LISTS, path="lists.sql", name="lists")
    rng = np.random.default_rng(5)
    n = 400
    batch = pa.table({
        "x": pa.array(np.where(rng.random(n) < 0.1, None, rng.integers(-1, 7, n)), pa.int64()),
        "y": pa.array(rng.integers(0, 9, n), pa.int64()),
        "name": pa.array([[None, "a", "b", "c", "d"][i] for i in rng.integers(0, 5, n)]),
        "d": pa.array([None if i % 9 == 0 else f"{i % 4}.25" for i in range(n)]).cast(
            pa.decimal128(9, 2)),
        "_row": pa.array(range(1, n + 1), pa.int64()),
    })
    _driver_equals_spark(spark, _h_sql(compiled, "listed"), batch)
    truths = Query("SELECT _row, x IN (1, 2, NULL) AS a, x NOT IN (3, 4) AS b, "
                   "name IN ('a', 'b') AS c, NOT name IN ('c') AS nc, d IN (1.25, 2.25) AS e, "
                   "y IN (x, x + 1) AS f, y BETWEEN 2 AND 5 AS g, x NOT BETWEEN 0 AND 3 AS h, "
                   "y BETWEEN x AND NULL AS i, d BETWEEN 1 AND 2.5 AS j FROM batch")
    _driver_equals_spark(spark, truths, batch)
    assert prepare("SELECT x FROM batch WHERE x IN (SELECT y FROM batch)") is None


def test_like_of_plain_patterns_and_date_literals_equal_spark(spark):
    """``LIKE`` of an ASCII pattern and a DATE literal in the ISO form (a dashboard's ``name
    LIKE 'ab%'``, ``code LIKE 'A_1%'``, ``day >= DATE '2026-01-01'``) are computed on the
    driver, equal to Spark's over text beyond ASCII (``_`` one code point in both: an emoji
    one, a combining accent, a flag and CR LF two), line breaks and NULLs; patterns with a
    backslash or text beyond ASCII, and other date texts, stay Spark's."""
    names = ["ab", "abc", "xab", "a\nb", "ä-ab", "a%b", "a_b", "", None, "AB", "b", "aäb",
             "a\U0001F600b", "e\u0301", "a\r\nb", "\U0001F1E9\U0001F1EA", "\U0001F600"]
    days = [dt.date(2020, 12, 31), dt.date(2021, 1, 1), dt.date(2024, 2, 29), None]
    rows = [(n, d) for n in names for d in days]
    batch = pa.table({
        "name": pa.array([n for n, _ in rows]),
        "day": pa.array([d for _, d in rows], pa.date32()),
        "_row": pa.array(range(1, len(rows) + 1), pa.int64()),
    })
    truths = Query(
        "SELECT _row, name LIKE 'a%' AS a, name LIKE '%b' AS b, name LIKE '%a%b%' AS c, "
        "name NOT LIKE 'ab' AS d, name LIKE '%' AS e, name LIKE '' AS f, "
        "name LIKE 'a_b' AS u1, name LIKE '_' AS u2, name NOT LIKE '__' AS u3, "
        "name LIKE '%_b' AS u4, name LIKE 'a__b%' AS u5, "
        "day >= DATE '2021-01-01' AS g, day BETWEEN DATE '2020-12-31' AND DATE '2024-02-28' AS h, "
        "DATE '2024-02-29' AS i FROM batch")
    _driver_equals_spark(spark, truths, batch)
    for refused in ("name LIKE 'a\\\\%'", "name LIKE 'ä%'", "name LIKE name",
                    "day >= DATE '2026-1-05'", "day >= DATE '2026-02-30'",
                    "day >= CAST('+2026-01-05' AS DATE)", "day >= DATE '\u0662\u0660\u0662\u0666-01-05'"):
        assert prepare(f"SELECT _row FROM batch WHERE {refused}") is None, refused



#: DuckDB calls of patterns, compiled to Spark text, each with whether the driver takes it.
PATTERN_CALLS = [
    ("regexp_matches(name, '^/check')", True), ("name ~ '[a-c]+'", True),
    ("regexp_matches(name, 'a.b$', 'i')", True), ("regexp_matches(name, 'a.b', 's')", True),
    ("regexp_full_match(name, '(?P<x>a)(?i:B)')", True), ("regexp_matches(name, '\\s|\\d{2,}?')", True),
    ("regexp_extract(name, '([a-c]+)(x)?', 2)", True), ("regexp_extract(name, '\\w+', 0, 'i')", True),
    ("regexp_matches(name, 'a.b*(', 'l')", True), ("regexp_matches(name, '(?U)a+b')", True),
    # look-around for \b and a multi-line ^, POSIX classes as \p{…}: RE2 reads them otherwise
    ("regexp_matches(name, '\\bab')", False), ("regexp_matches(name, '(?m)^b')", False),
    ("regexp_matches(name, '[[:alpha:]]')", False), ("regexp_matches(name, '[^\\S]')", False),
]


def test_patterns_re2_reads_as_java_does_equal_spark(spark):
    """A compiled pattern RE2 reads as Java does (``^``, ``.``, ``$``, classes, options,
    ``~``) is computed on the driver, equal to Spark's over line breaks, letters beyond
    ASCII, the Kelvin sign and NULL; one it reads otherwise (``\\b``, a multi-line ``^``,
    a POSIX class) stays Spark's."""
    names = ["/checkout", "ab", "a\nb", "a\rb", "AxB\n", "a.b*(", "aab", "x 12 3", "éa", "\u212a",
             "b\nab", "", None, "/CHECK"]
    batch = pa.table({"name": pa.array(names), "_row": pa.array(range(len(names)), pa.int64())})
    texts = [render_expression(sqlglot.parse_one(call, read=DUCKDB), SPARK)
             for call, _ in PATTERN_CALLS]
    alike = [f"{t} AS p{i}" for i, (t, (_, driver)) in enumerate(zip(texts, PATTERN_CALLS))
             if driver]
    _driver_equals_spark(spark, Query(f"SELECT _row, {', '.join(alike)} FROM batch"), batch)
    for text, (call, driver) in zip(texts, PATTERN_CALLS):
        taken = prepare(f"SELECT _row FROM batch WHERE {text} IS NOT NULL") is not None
        assert taken == driver, call


WINDOWS = """-- incr: buckets = 4
CREATE TABLE e (day DATE, local TIMESTAMP, v BIGINT);
CREATE VIEW recent AS SELECT day, SUM(v) AS s, COUNT(*) AS n FROM e
  WHERE local >= TIMESTAMP '2021-01-01 00:00:00' AND day < TIMESTAMP '2021-01-01 12:00:00'
  GROUP BY day;
"""


def test_timestamp_literals_equal_spark_in_the_session_s_zone(spark):
    """A TIMESTAMP or TIMESTAMP_NTZ literal in the ISO form (a dashboard's ``at >= TIMESTAMP
    '2026-12-01 00:00:00'``) is computed on the driver, equal to Spark's against a TIMESTAMP
    column, a TIMESTAMP_NTZ one and a DATE, at a microsecond's edges and over NULLs (both
    engines read the literal in UTC); a ``T``, a zone, nanoseconds or a time that is none
    stay Spark's."""
    utc = dt.UTC
    ats = [dt.datetime(2020, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
           dt.datetime(2021, 1, 1, 0, 0, tzinfo=utc), dt.datetime(2024, 2, 29, 12, tzinfo=utc),
           dt.datetime(2024, 2, 29, 12, 0, 0, 1, tzinfo=utc), None]
    days = [dt.date(2020, 12, 31), dt.date(2021, 1, 1), None]
    rows = [(a, d) for a in ats for d in days]
    batch = pa.table({
        "at": pa.array([a for a, _ in rows], pa.timestamp("us", tz="UTC")),
        "local": pa.array([a and a.replace(tzinfo=None) for a, _ in rows], pa.timestamp("us")),
        "day": pa.array([d for _, d in rows], pa.date32()),
        "_row": pa.array(range(1, len(rows) + 1), pa.int64()),
    })
    truths = Query(
        "SELECT _row, at >= TIMESTAMP '2021-01-01 00:00:00' AS a, "
        "at < TIMESTAMP '2024-02-29 12:00:00.000001' AS b, at = TIMESTAMP '2021-01-01' AS c, "
        "local BETWEEN TIMESTAMP '2021-01-01' AND TIMESTAMP_NTZ '2024-02-29 12:00:00' AS d, "
        "local > TIMESTAMP '2020-12-31 23:59:59.999999' AS e, "
        "at = TIMESTAMP_NTZ '2024-02-29 12:00:00.000001' AS f, "
        "day >= TIMESTAMP '2020-12-31 00:00:01' AS g, day = TIMESTAMP_NTZ '2021-01-01' AS h, "
        "CAST('2024-02-29 23:59:59.5' AS TIMESTAMP) AS i, TIMESTAMP_NTZ '2021-01-01 08:00:00' AS j "
        "FROM batch WHERE at IS NULL OR at <> TIMESTAMP '1999-01-01 00:00:00'")
    _driver_equals_spark(spark, truths, batch)
    # a program's time window: its TIMESTAMP (no zone, as DuckDB's) is Spark's TIMESTAMP_NTZ
    compiled = compile_text(WINDOWS, path="windows.sql", name="windows")
    h = _h_sql(compiled, "recent")
    assert "TIMESTAMP_NTZ" in h.sql
    _driver_equals_spark(spark, h, batch.drop_columns(["at"]).append_column(
        "v", pa.array(range(len(rows)), pa.int64())))
    for refused in ("TIMESTAMP '2026-01-01T00:00:00'", "TIMESTAMP '2026-01-01 00:00:00Z'",
                    "TIMESTAMP '2026-01-01 00:00:00+02:00'", "TIMESTAMP '2026-01-01 00:00'",
                    "TIMESTAMP '2026-01-01 00:00:00.1234567'", "TIMESTAMP '2026-01-01 24:00:00'",
                    "TIMESTAMP '2026-02-30 00:00:00'", "TIMESTAMP '2026-01-01 0:00:00'",
                    "TIMESTAMP_NTZ '2026-1-01'", "TIMESTAMP ' 2026-01-01'"):
        assert prepare(f"SELECT _row FROM batch WHERE at >= {refused}") is None, refused



DAYS = """-- incr: buckets = 4
CREATE TABLE e (day DATE, local TIMESTAMP, note VARCHAR, v BIGINT);
CREATE VIEW daily AS SELECT CAST(local AS DATE) AS d, CAST(day AS DATE) AS dd, SUM(v) AS s
  FROM e WHERE CAST(local AS DATE) >= DATE '2021-01-01' OR local IS NULL
  GROUP BY CAST(local AS DATE), CAST(day AS DATE);
CREATE VIEW noted_days AS SELECT CAST(note AS DATE) AS d, COUNT(*) AS n FROM e
  GROUP BY CAST(note AS DATE);
"""


def test_the_day_of_a_timestamp_equals_spark(spark):
    """A daily grain (``CAST(sold_at AS DATE)``, Spark's ``to_date(sold_at)``) is computed on
    the driver, equal to Spark's for a TIMESTAMP (its day in UTC, the zone of incr's
    sessions), a TIMESTAMP_NTZ and a DATE, a microsecond before and at midnight, NULLs and
    buckets included; the day of text, which Spark parses by its own rules, and
    ``to_date`` with a format stay Spark's."""
    utc = dt.UTC
    ats = [dt.datetime(2020, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
           dt.datetime(2021, 1, 1, 0, 0, tzinfo=utc), dt.datetime(2024, 2, 29, 12, tzinfo=utc),
           dt.datetime(1, 1, 1, tzinfo=utc), None]
    days = [dt.date(2020, 12, 31), dt.date(2024, 2, 29), None]
    rows = [(a, d) for a in ats for d in days]
    batch = pa.table({
        "day": pa.array([d for _, d in rows], pa.date32()),
        "local": pa.array([a and a.replace(tzinfo=None) for a, _ in rows], pa.timestamp("us")),
        "at": pa.array([a for a, _ in rows], pa.timestamp("us", tz="UTC")),
        "note": pa.array(["2021-1-5"] * len(rows)),
        "v": pa.array(range(len(rows)), pa.int64()),
        "_row": pa.array(range(1, len(rows) + 1), pa.int64()),
    })
    truths = Query("SELECT _row, CAST(at AS DATE) AS a, to_date(at) AS b, to_date(local) AS c, "
                   "to_date(day) AS d, CAST(local AS DATE) = DATE '2021-01-01' AS e, "
                   "year(to_date(at)) AS f FROM batch WHERE to_date(at) >= DATE '2021-01-01' "
                   "OR at IS NULL")
    _driver_equals_spark(spark, truths, batch)
    compiled = compile_text(DAYS, path="days.sql", name="days")
    _driver_equals_spark(spark, _h_sql(compiled, "daily"), batch.drop_columns(["at"]))
    noted = _h_sql(compiled, "noted_days")
    assert prepare(noted) is not None  # DuckDB refuses the day of text when it plans it:
    schema = spark.sql(noted.sql).toArrow().schema
    assert LocalSql().query(noted, {"batch": batch.drop_columns(["at"])}, schema) is None
    assert prepare("SELECT _row FROM batch WHERE to_date(note, 'yyyy-M-d') > DATE '2021-01-01'") is None


DATES = """-- incr: buckets = 8
CREATE TABLE e (day DATE, at TIMESTAMP, note VARCHAR, v BIGINT);
CREATE VIEW grains AS SELECT year(day) AS y, quarter(day) AS q, month(day) AS m,
    dayofmonth(day) AS dm, dayofyear(day) AS dy, weekofyear(day) AS w, year(at) AS ya,
    month(at) AS ma, day(at) AS da, weekofyear(at) AS wa, SUM(v) AS s
  FROM e GROUP BY year(day), quarter(day), month(day), dayofmonth(day), dayofyear(day),
    weekofyear(day), year(at), month(at), day(at), weekofyear(at);
CREATE VIEW noted AS SELECT year(note) AS y, COUNT(*) AS n FROM e GROUP BY year(note);
CREATE VIEW clock AS SELECT hour(at) AS h, minute(at) AS mi, second(at) AS sec, hour(day) AS hd,
    date_trunc('MONTH', day) AS md, date_trunc('WEEK', at) AS wa, date_trunc('HOUR', at) AS ha,
    date_trunc('QUARTER', day) AS qd, v % 3 AS r, v % (v - 4) AS rv, SUM(v % 4) AS s
  FROM e GROUP BY hour(at), minute(at), second(at), hour(day), date_trunc('MONTH', day),
    date_trunc('WEEK', at), date_trunc('HOUR', at), date_trunc('QUARTER', day), v % 3, v % (v - 4);
CREATE VIEW odd_units AS SELECT date_trunc('MILLISECOND', at) AS ms, COUNT(*) AS n FROM e
  GROUP BY date_trunc('MILLISECOND', at);
"""


def test_date_parts_equal_spark_at_the_calendar_s_edges(spark):
    """A time grain's keys (year, quarter, month, day, day of year, ISO week) of a DATE and
    of a TIMESTAMP (in UTC, as incr's sessions) are computed on the driver, equal to Spark's
    at year ends, ISO weeks 53 and 1, a leap day and an instant just before midnight UTC,
    buckets included; a date part of text, which Spark casts to a date, is left to Spark.
    So are the clock's parts, ``date_trunc`` and remainders (a bucket's key)."""
    compiled = compile_text(DATES, path="dates.sql", name="dates")
    sql = _h_sql(compiled, "grains")
    assert prepare(sql) is not None
    days = [dt.date(2020, 12, 31), dt.date(2021, 1, 1), dt.date(2021, 1, 3), dt.date(2021, 1, 4),
            dt.date(2024, 2, 29), dt.date(2024, 12, 30), dt.date(2026, 12, 1), None]
    utc = dt.UTC
    ats = [dt.datetime(2020, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
           dt.datetime(2021, 1, 1, 0, 0, tzinfo=utc), dt.datetime(2024, 2, 29, 12, tzinfo=utc),
           dt.datetime(2027, 1, 1, 0, 30, tzinfo=utc), None]
    rows = [(d, a, i) for i, (d, a) in enumerate((d, a) for d in days for a in ats)]
    batch = pa.table({
        "day": pa.array([d for d, _, _ in rows], pa.date32()),
        "at": pa.array([a for _, a, _ in rows], pa.timestamp("us", tz="UTC")),
        "note": pa.array(["2024-01-05"] * len(rows)),
        "v": pa.array([i for _, _, i in rows], pa.int64()),
        "_row": pa.array(range(1, len(rows) + 1), pa.int64()),
    })
    engine = _driver_equals_spark(spark, sql, batch)
    noted = _h_sql(compiled, "noted")
    assert engine.query(noted, {"batch": batch}, spark.sql(noted.sql).toArrow().schema) is None
    # the clock's parts (0 of a DATE), truncations of a DATE and a TIMESTAMP, remainders by
    # a number and by a column (NULL where it is 0, with a negative dividend too)
    clock = _h_sql(compiled, "clock")
    assert "try_mod" in clock.sql.lower() and prepare(clock) is not None
    _driver_equals_spark(spark, clock, batch.set_column(
        3, "v", pa.array([i - 9 for i in range(len(rows))], pa.int64())))
    assert prepare(_h_sql(compiled, "odd_units")) is None  # a unit left to Spark


TEXT = """-- incr: buckets = 4
CREATE TABLE w (name VARCHAR, v BIGINT);
CREATE VIEW words AS SELECT upper(name) AS u, lower(name) AS l, length(name) AS n,
    substr(name, 2, 3) AS mid, substr(name, 3) AS tail, length(upper(substr(name, 1, 2))) AS n2,
    SUM(v) AS s
  FROM w GROUP BY upper(name), lower(name), length(name), substr(name, 2, 3), substr(name, 3),
    length(upper(substr(name, 1, 2)));
"""


def test_text_s_case_length_and_substrings_equal_spark_while_it_is_ascii(spark):
    """A key like ``upper(name)`` or ``substr(zip, 1, 3)`` is computed on the driver, equal to
    Spark's (buckets and types included) for ASCII text, empty text and NULL; text beyond
    ASCII, where the engines' case rules differ (Java's ``'ß'.toUpperCase()`` is ``SS``),
    sends the query to Spark, and so does a substring from position 0, which Spark reads
    as 1."""
    compiled = compile_text(TEXT, path="text.sql", name="text")
    sql = _h_sql(compiled, "words")
    names = ["Ann", "bob", "", None, "x", "Hello World", "a-b_c!", "ZZ top 9"]
    batch = pa.table({"name": pa.array(names), "v": pa.array(range(len(names)), pa.int64()),
                      "_row": pa.array(range(1, len(names) + 1), pa.int64())})
    engine = _driver_equals_spark(spark, sql, batch)
    beyond = batch.set_column(0, "name", pa.array(["straße", *names[1:]]))
    spark.createDataFrame(beyond).createOrReplaceTempView("batch")
    schema = spark.sql(sql.sql).toArrow().schema
    assert engine.query(sql, {"batch": beyond}, schema) is None
    # (the compiler refuses such a view; the driver refuses such SQL all the same)
    assert prepare("SELECT substring(name, 0, 2) AS p FROM batch") is None


def test_query_gives_way_when_the_result_does_not_fit():
    engine = LocalSql()
    batch = pa.table({"x": pa.array([2**62, 2**62], pa.int64())})
    sum_sql = "SELECT coalesce(sum(x), 0) AS s FROM batch"
    assert engine.query(sum_sql, {"batch": batch}, pa.schema([("s", pa.int64())])) is None
    assert engine.query(sum_sql, {"batch": batch}, pa.schema([("t", pa.int64())])) is None
    assert engine.query("SELECT x AS s FROM batch", {"batch": batch},
                        pa.schema([("s", pa.int64())])) is not None


JOIN_PROGRAM = """-- incr: buckets = 4
CREATE TABLE xs (a BIGINT, c BIGINT);
CREATE TABLE ys (b BIGINT, c BIGINT);
CREATE VIEW j AS SELECT xs.a, SUM(ys.b) AS total, COUNT(*) AS n FROM xs JOIN ys ON xs.c = ys.c
GROUP BY xs.a;
"""


@pytest.mark.parametrize("vectors", [False, True], ids=["merge", "vectors"])
def test_a_join_folds_on_the_driver_inserts_and_deletes(spark, tmp_path, vectors):
    """Δ of the join against the other side table, h and the side tables' h all run in
    DuckDB for small batches (no Spark DataFrame is even made), and the answer is exact."""
    import pyarrow.csv as pacsv

    from incr.config import Settings
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    compiled = compile_text(JOIN_PROGRAM, path="j.sql", name="j")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark,
                        config=Settings(state_deletion_vectors=vectors, state_vector_rows=0))
    counts = []
    rng = np.random.default_rng(5)
    live = {"xs": [], "ys": []}
    steps = [("xs", False), ("ys", False), ("xs", False), ("ys", True), ("xs", True), ("ys", False)]
    for seq, (table, delete) in enumerate(steps):
        if delete:
            rows = live[table][: len(live[table]) // 2]
            live[table] = live[table][len(rows):]
        else:
            first = "a" if table == "xs" else "b"
            rows = [{first: int(rng.integers(0, 5)), "c": int(rng.integers(0, 4))} for _ in range(30)]
            live[table] += rows
        folder = landing / table / ("_deletes" if delete else "")
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.Table.from_pylist(rows), folder / f"{seq:04d}.csv")
        before = pipeline.local.queries
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        counts.append(pipeline.local.queries - before)
        plan = compiled.plans[0]
        answer, _ = read_answer(warehouse, plan)
        sources = {t: pa.Table.from_pylist(live[t], schema=pa.schema(
            [("a" if t == "xs" else "b", pa.int64()), ("c", pa.int64())])) for t in live}
        assert diff_answers(oracle_answer(plan.select, sources), answer, ordered=False) is None
    # MERGE: the batch's join keys (the other side is read where it meets them), h of the
    # main table, h of the batch's side table, and a(state).  The first run also creates the
    # three tables with Spark's types: each one's h(∅) is computed where it is defined (it
    # hashes a bucket) and read again for the table, 6 queries; and its a(state) is the
    # answer's first publish, now on the driver too.
    # With deletion vectors, once the join's state holds rows (2nd batch of ys): the touched
    # keys' values (the state is read where it meets them), h(Δ⁺) and h(Δ⁻), the changed and
    # the live rows of ⊗= instead of h alone.
    assert counts == [10] + [4] * 5 if not vectors else [10, 4] + [8] * 4, counts
    # the next task's process reads their DuckDB forms instead of translating them again
    assert len(list((warehouse / "_incr" / "j" / "sql").glob("*/*.json"))) >= 4


ANTI_PROGRAM = """-- incr: buckets = 4
CREATE TABLE xs (a BIGINT, c BIGINT);
CREATE TABLE ys (b BIGINT, c BIGINT);
CREATE VIEW lonely AS SELECT xs.a, COUNT(*) AS n FROM xs
WHERE NOT EXISTS (SELECT * FROM ys WHERE ys.c = xs.c) GROUP BY xs.a;
"""


@pytest.mark.parametrize("program", [JOIN_PROGRAM, ANTI_PROGRAM], ids=["join", "anti"])
def test_inserts_into_a_large_side_table_are_appended_and_summed_when_read(spark, tmp_path,
                                                                          program):
    """Past INCR_STATE_VECTOR_ROWS a side table takes an all-insert batch as rows of its
    own, without reading the rows it holds: a θ inserted by two batches has two rows.  A
    delete of that θ sums them and leaves one row of the remaining count.  An anti input's
    side table answers "no match", so it keeps one row per θ.  The answer equals the oracle
    after every batch."""
    import pyarrow.compute as pc

    from incr.config import Settings
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer
    from incr.runtime.store import DeltaStore

    compiled = compile_text(program, path="p.sql", name="p")
    plan = compiled.plans[0]
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark,
                        config=Settings(state_vector_rows=0))
    rows = {"xs": [{"a": i % 3, "c": i % 5} for i in range(10)],
            "ys": [{"b": i, "c": i % 4} for i in range(6)]}
    steps = [("xs", rows["xs"], False), ("ys", rows["ys"], False),
             ("xs", rows["xs"], False), ("ys", rows["ys"][:2], False),
             ("xs", rows["xs"][:4], True), ("ys", rows["ys"][:3], True)]
    live: dict[str, list[dict]] = {"xs": [], "ys": []}
    spans = {}
    for seq, (table, batch, delete) in enumerate(steps):
        folder = landing / table / ("_deletes" if delete else "")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(batch), folder / f"{seq:04d}.parquet")
        if delete:
            for row in batch:
                live[table].remove(row)
        else:
            live[table] += batch
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        sources = {t: pa.Table.from_pylist(live[t], schema=pa.schema(
            [("a" if t == "xs" else "b", pa.int64()), ("c", pa.int64())])) for t in live}
        answer, _ = read_answer(warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, sources), answer, ordered=False) is None
        for side in (t for t in plan.top.tables if t.side_of is not None):
            held = DeltaStore().read(pipeline.views[plan.view].table_path(side.name))
            per = held.group_by(list(side.key_columns)).aggregate([("_n", "count"),
                                                                    ("_n", "sum")])
            spans[(seq, side.side_of)] = pc.max(per["_n_count"]).as_py() or 0
            if side.side_of not in live:  # NOT EXISTS's: the distinct ys.c, a stage's output
                assert plan.top.anti(side.side_of) and spans[(seq, side.side_of)] <= 1
                continue
            read = [c.split("__", 1)[1] for c in side.key_columns]  # xs__c → c
            distinct = {tuple(r[c] for c in read) for r in live[side.side_of]}
            assert (pc.sum(per["_n_sum"]).as_py() or 0) == len(live[side.side_of])
            assert per.num_rows == len(distinct)  # every θ live, none of count 0
    # The second batch of xs doubled every θ of xs: appended beside the first's rows.
    assert spans[(2, "xs")] == 2, spans
    assert spans[(4, "xs")] == 2  # θs the delete did not touch keep their two rows
    if "ys" in {t.side_of for t in plan.top.tables}:
        assert spans[(3, "ys")] == 2, spans
        assert spans[(5, "ys")] == 1, spans  # the delete summed the rows of its θ
    else:
        assert any(plan.top.anti(t.side_of) for t in plan.top.tables if t.side_of), spans


def test_a_side_table_is_read_where_every_key_meets_the_batch(spark, tmp_path):
    """A side table's first column may be one most rows share (here every ``ys.b`` is 1): the
    touched rows of a batch are read by every key column, the join key first, so the rows
    read stay about the batch's (under INCR_LOCAL_STATE_ROWS) and it folds on the driver;
    read by the first column alone they were the whole table, and the batch went to Spark."""
    from incr.config import Settings
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    compiled = compile_text(JOIN_PROGRAM, path="j.sql", name="j")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    live = {"xs": [{"a": i % 7, "c": i} for i in range(300)],
            "ys": [{"b": 1, "c": i} for i in range(300)]}
    for table, rows in live.items():
        (landing / table).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), landing / table / "0000.parquet")
    Pipeline(compiled, landing, warehouse, spark=spark).run()
    config = Settings(state_vector_rows=0, local_state_rows=50)
    for seq, table in ((1, "ys"), (2, "xs")):
        rows = ([{"b": 1, "c": 5}, {"b": 1, "c": 400}] if table == "ys"
                else [{"a": 3, "c": 5}, {"a": 1, "c": 401}])
        live[table] += rows
        pq.write_table(pa.Table.from_pylist(rows), landing / table / f"{seq:04d}.parquet")
        report = Pipeline(compiled, landing, warehouse, spark=spark, config=config).run()
        assert report.rejected is None, str(report.rejected)
        (metrics,) = report.applied[0].views
        assert metrics.engine == "driver", metrics
    plan = compiled.plans[0]
    answer, _ = read_answer(warehouse, plan)
    sources = {t: pa.Table.from_pylist(r) for t, r in live.items()}
    assert diff_answers(oracle_answer(plan.select, sources), answer, ordered=False) is None


def test_integer_casts_truncate_as_spark_does(spark):
    """DuckDB's CAST(2.7 AS BIGINT) is 3, Spark's is 2: the driver-side form truncates first,
    so a group key or a value cast to an integer is the same on both engines."""
    sql = ("SELECT CAST(x AS BIGINT) AS b, CAST(x AS INT) AS i, CAST(d AS BIGINT) AS bd, "
           "CAST(n AS SMALLINT) AS s FROM batch")
    batch = pa.table({"x": pa.array([2.7, -2.7, 2.5, -0.5, None], pa.float64()),
                      "d": pa.array(["9.99", "-9.99", "0.50", "1.00", None]).cast(pa.decimal128(5, 2)),
                      "n": pa.array([1, -2, 3, 4, None], pa.int64())})
    spark.createDataFrame(batch).createOrReplaceTempView("batch")
    expected = spark.sql(sql).toArrow()
    schema = pa.schema([f.with_nullable(True) for f in expected.schema])
    got = LocalSql().query(sql, {"batch": batch}, schema)
    assert got is not None and got.equals(expected.cast(schema))
    assert got["b"].to_pylist() == [2, -2, 2, 0, None]


def test_decimal38_sums_cast_to_bigint_exactly_at_every_magnitude(spark):
    """A DECIMAL(38, 0) (how incr keeps SUMs) is cast to an integer type through DECIMAL(18, 0)
    on the driver when it fits there (DuckDB's fast path), as written otherwise: the values
    at either side of that range and of BIGINT's are the same as Spark's, and a value past
    BIGINT (or, for TRY_CAST, past INT) is refused or NULL as there."""
    edge = [0, 1, -1, 10**18 - 1, -(10**18 - 1), 10**18, -(10**18), 2**63 - 1, -(2**63), None]
    sql = "SELECT CAST(d AS BIGINT) AS b, TRY_CAST(d AS INT) AS i FROM batch"
    batch = pa.table({"d": pa.array(edge, pa.decimal128(38, 0))})
    spark.createDataFrame(batch).createOrReplaceTempView("batch")
    expected = spark.sql(sql).toArrow()
    schema = pa.schema([f.with_nullable(True) for f in expected.schema])
    got = LocalSql().query(sql, {"batch": batch}, schema)
    assert got is not None and got.equals(expected.cast(schema))
    assert got["b"].to_pylist() == edge
    assert got["i"].to_pylist() == [0, 1, -1] + [None] * 7
    # a DOUBLE keeps the cast as written: DuckDB's DOUBLE to DECIMAL cast rounds large values
    doubles = pa.table({"f": pa.array([8589932544.0 * 2**20, -(2.0**62) - 2048.5, 1e18 - 128], pa.float64())})
    spark.createDataFrame(doubles).createOrReplaceTempView("doubles")
    sql = "SELECT CAST(f AS BIGINT) AS b FROM doubles"
    got = LocalSql().query(sql, {"doubles": doubles}, pa.schema([("b", pa.int64())]))
    assert got is not None and got["b"].to_pylist() == spark.sql(sql).toArrow()["b"].to_pylist()
    assert got["b"].to_pylist()[0] == 8589932544 * 2**20
    past = pa.table({"d": pa.array([2**63], pa.decimal128(38, 0))})
    assert LocalSql().query("SELECT CAST(d AS BIGINT) AS b FROM batch", {"batch": past},
                            pa.schema([("b", pa.int64())])) is None  # refused: Spark says why
    # a power of two with an integral exponent is exact in both engines; any other is Spark's
    assert prepare("SELECT power(2, CAST(n AS INT)) AS p FROM batch") is not None
    assert prepare("SELECT power(2, n) AS p FROM batch") is None
    assert prepare("SELECT power(x, 2) AS p FROM batch") is None


def test_a_new_process_reads_the_translations_an_earlier_one_kept(tmp_path, monkeypatch):
    """With translations kept (a pipeline keeps them in the warehouse), a fresh engine (a new
    task's process) runs a query and learns a refusal without sqlglot; a changed translator
    (sqlglot, or incr's rewrites) translates again."""
    from incr.runtime import local

    batch = pa.table({"x": pa.array([1, 1, 2], pa.int64()), "name": pa.array(["a", "b", "c"])})
    counted = "SELECT x, CAST(COUNT(*) AS INT) AS n FROM batch GROUP BY x ORDER BY x"
    texty = "SELECT reverse(name) AS x, 1 AS n FROM batch"
    schema = pa.schema([("x", pa.int64()), ("n", pa.int64())])
    expected = pa.table({"x": [1, 2], "n": [2, 1]}, schema=schema)
    folder = tmp_path / "sql"

    def fresh() -> LocalSql:
        engine = LocalSql()
        engine.keep_translations(folder)
        return engine

    first = fresh()
    assert first.query(counted, {"batch": batch}, schema).equals(expected)
    assert first.query(texty, {"batch": batch}, schema) is None
    assert len(list(folder.glob("*/*.json"))) == 2

    def no_sqlglot(*args):
        raise AssertionError("translated again")
    monkeypatch.setattr(local, "_prepare", no_sqlglot)
    again = fresh()
    assert again.query(counted, {"batch": batch}, schema).equals(expected)
    assert again.query(texty, {"batch": batch}, schema) is None  # refused, from disk

    monkeypatch.setattr(local, "translator", lambda: "another")
    with pytest.raises(AssertionError, match="translated again"):
        fresh().query(counted, {"batch": batch}, schema)


def _scanned(store, path, max_state_rows: int = 1) -> pa.Table:
    """The table at ``path`` as the driver's read of its files (DriverEngine.scan) gives it,
    when it holds more than ``max_state_rows``.  A query over it may then give as many rows
    (the limit is raised once the table is registered)."""
    from incr.runtime.local import DriverEngine

    sql = LocalSql(max_state_rows=max_state_rows)
    engine = DriverEngine(sql, store)
    try:
        name = engine.scan("t", path)
        sql.max_state_rows = 1_000
        return engine.collect(f"SELECT * FROM {name}", store.schema(path))
    finally:
        engine.close()


def test_a_table_larger_than_the_driver_holds_is_scanned_as_a_read_gives_it(tmp_path):
    """DuckDB reading a table's Parquet files (the partition values from their folders, the
    rows of its deletion vectors left out) gives the rows and types a whole read does."""
    from datetime import date, datetime
    from decimal import Decimal

    from incr.compiler.plan import BUCKET
    from incr.runtime.store import DeltaStore

    path = tmp_path / "wh with space" / "t"
    n = 12
    data = pa.table({
        BUCKET: pa.array([i % 3 for i in range(n)], pa.int32()),
        "k": pa.array(range(n), pa.int64()),
        "s": pa.array([None if i == 5 else f"s{i}" for i in range(n)]),
        "d": pa.array([Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
        "day": pa.array([date(2026, 1, 1 + i) for i in range(n)]),
        "at": pa.array([datetime(2026, 1, 1, i) for i in range(n)], pa.timestamp("us")),
    })
    store = DeltaStore()
    store.write(path, data.slice(0, 7), mode="append", batch=0, partition_by=[BUCKET])
    store.write(path, data.slice(7), mode="append", batch=1, partition_by=[BUCKET])

    def same() -> None:
        got, want = _scanned(store, path), store.read(path)
        assert got.schema == want.schema
        assert got.sort_by("k").equals(want.sort_by("k"))

    same()
    store.replace_rows(path, pa.table({"k": pa.array([2, 4, 9], pa.int64())}),
                       data.slice(0, 0), batch=2)
    assert store.deleted_rows(path) == (3, n)  # in their files, marked deleted
    same()
    assert sorted(_scanned(store, path)["k"].to_pylist()) == [0, 1, 3, 5, 6, 7, 8, 10, 11]


def test_a_scan_within_the_driver_limit_reads_the_table_and_odd_names_go_to_spark(tmp_path):
    from incr.compiler.plan import BUCKET
    from incr.runtime.engine import NotLocal
    from incr.runtime.store import DeltaStore

    store = DeltaStore()
    small = tmp_path / "small"
    store.write(small, pa.table({"k": [1, 2]}), mode="append", batch=0)
    assert _scanned(store, small, max_state_rows=10)["k"].to_pylist() == [1, 2]
    odd = tmp_path / "a{1}" / "t"  # a pattern to DuckDB's reader
    store.write(odd, pa.table({BUCKET: pa.array([0, 1], pa.int32()), "k": [1, 2]}),
                mode="append", batch=0, partition_by=[BUCKET])
    with pytest.raises(NotLocal, match="by its name"):
        _scanned(store, odd)
    assert sorted(_scanned(store, odd, max_state_rows=10)["k"].to_pylist()) == [1, 2]


def test_a_query_over_a_scanned_table_gives_way_past_the_driver_limit(tmp_path):
    """What the driver takes from a table it did not hold is bounded too: a result of more
    than INCR_LOCAL_STATE_ROWS rows goes to Spark (NotLocal), a smaller one is kept."""
    from incr.compiler.plan import BUCKET
    from incr.runtime.engine import NotLocal
    from incr.runtime.local import DriverEngine
    from incr.runtime.store import DeltaStore

    store = DeltaStore()
    path = tmp_path / "t"
    store.write(path, pa.table({BUCKET: pa.array([i % 2 for i in range(6)], pa.int32()),
                                "k": pa.array([i % 3 for i in range(6)], pa.int64())}),
                mode="append", batch=0, partition_by=[BUCKET])
    engine = DriverEngine(LocalSql(max_state_rows=4), store)
    try:
        name = engine.scan("t", path)
        with pytest.raises(NotLocal, match="more than INCR_LOCAL_STATE_ROWS=4"):
            engine.collect(f"SELECT k FROM {name}", pa.schema([("k", pa.int64())]))
        groups = engine.collect(f"SELECT k, COUNT(*) AS n FROM {name} GROUP BY k",
                                pa.schema([("k", pa.int64()), ("n", pa.int64())]))
        assert sorted(groups.to_pylist(), key=lambda r: r["k"]) == [
            {"k": k, "n": 2} for k in range(3)]
    finally:
        engine.close()


def test_a_table_whose_files_duckdb_refuses_goes_to_spark(tmp_path):
    """A file DuckDB cannot read as Parquet (here: not one) is no error of the run: the
    table is left to Spark, which says what it finds."""
    from incr.compiler.plan import BUCKET
    from incr.runtime.engine import NotLocal
    from incr.runtime.local import DriverEngine
    from incr.runtime.store import DeltaStore, table_files

    store = DeltaStore()
    path = tmp_path / "t"
    store.write(path, pa.table({BUCKET: pa.array([0, 1], pa.int32()), "k": [1, 2]}),
                mode="append", batch=0, partition_by=[BUCKET])
    broken = table_files(store.table(path))[0]
    with open(broken, "wb") as f:
        f.write(b"not parquet")
    engine = DriverEngine(LocalSql(max_state_rows=1), store)
    try:
        with pytest.raises(NotLocal, match="DuckDB refused its files"):
            engine.scan("t", path)
    finally:
        engine.close()


def test_filters_keep_nan_rows_as_duckdb_and_spark_do(spark):
    """A filter of a DOUBLE keeps a NaN above every number, as DuckDB and Spark compare it.
    DuckDB pushes a filter into its scan of an Arrow table, which compared NaN as IEEE does
    (``NaN > 0`` false) and lost those rows on the driver; a batch holding a NaN is copied
    into a DuckDB table instead."""
    nan = float("nan")
    batch = pa.table({"k": pa.array(["a", "a", "b", "b", "c", None]),
                      "x": pa.array([nan, 1.0, -0.0, nan, None, 2.5], pa.float64())})
    spark.createDataFrame(batch).createOrReplaceTempView("batch")
    oracle = connect()
    oracle.register("rows", batch)
    oracle.execute("CREATE TABLE batch AS SELECT * FROM rows")  # a scan no filter enters
    schema = pa.schema([("k", pa.string()), ("x", pa.float64())])
    for where in ("x > 0", "x >= 1", "x <> 1.0", "x = CAST('NaN' AS DOUBLE)", "x < 3"):
        sql = f"SELECT k, x FROM batch WHERE {where}"
        engine = LocalSql()
        got = engine.query(Query(sql), {"batch": batch}, schema)
        assert got is not None and engine.queries == 1, where
        want = _rows(oracle.sql(sql).fetchall())
        assert _rows(zip(got["k"].to_pylist(), got["x"].to_pylist())) == want, where
        assert _rows(tuple(r) for r in spark.sql(sql).collect()) == want, where


def test_a_table_registered_again_with_or_without_nan_replaces_the_last():
    """A name registered again replaces what it named, whether either holds a NaN (then a
    DuckDB table, else a view of the Arrow rows)."""
    from incr.runtime.local import DriverEngine

    engine = DriverEngine(LocalSql())
    schema = pa.schema([("n", pa.int64())])
    for xs in ([1.0, 2.0], [float("nan"), 3.0, 4.0], [float("nan")], [5.0]):
        engine.table("batch", pa.table({"x": pa.array(xs, pa.float64())}))
        counted = engine.collect(Query("SELECT count(*) AS n FROM batch WHERE x > 0"), schema)
        assert counted["n"][0].as_py() == len(xs)
    engine.close()


def _rows(rows) -> list[tuple[str, str]]:
    """Rows of (k, x) as sorted text, NaN as ``nan`` (which equals itself)."""
    return sorted((str(k), repr(x)) for k, x in rows)

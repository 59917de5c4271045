"""Spark's result types found on the driver (:mod:`incr.runtime.sparktypes`), held against
Spark's own: each rule, and every table a new program creates."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql.pandas.types import to_arrow_schema

from incr.compiler import compile_program, compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.engine import NotLocal
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from incr.runtime.session import arrow_frame
from incr.runtime.sparktypes import SparkTypes
from incr.runtime.store import DeltaStore
from incr.runtime.types import arrow_schema, nullable

REPO = Path(__file__).resolve().parents[2]

#: A relation with a column of every type a source may declare.
T = pa.schema([("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()), ("i64", pa.int64()),
               ("f32", pa.float32()), ("f64", pa.float64()), ("d", pa.decimal128(10, 2)),
               ("wide", pa.decimal128(38, 0)), ("fine", pa.decimal128(30, 5)),
               ("s", pa.string()), ("b", pa.bool_()), ("day", pa.date32()),
               ("at", pa.timestamp("us"))])

#: Expressions over T whose types are known here: each rule's cases, and the forms the
#: compiler writes (exact sums, buckets, averages of state columns).
KNOWN = [
    # literals
    "1", "2147483648", "99999999999999999999", "4294967296.0", "0.05", "1.50", "1.5e3", "'x'",
    "NULL", "TRUE", "-5",
    # columns and casts
    "i8", "at", "day", "s", "CAST(i32 AS BIGINT)", "CAST(f64 AS DECIMAL(20, 3))",
    "CAST(i64 AS DOUBLE)", "CAST(i64 AS SMALLINT)", "CAST(s AS STRING)", "CAST(day AS DATE)",
    "CAST(i32 AS DECIMAL)", "try_cast(f64 AS INT)",
    # integer arithmetic
    "i8 + i16", "i16 * i32", "i32 - i64", "i32 / i32", "i64 % 3", "-i32", "abs(i16)",
    "i32 + 1", "i8 + 1", "i64 * 2",
    # floating point
    "f32 + f32", "f32 + i32", "f32 + i8", "f32 * d", "f64 + i64", "f64 / 2", "f32 / f32",
    "f64 + d", "power(2, CAST(i32 AS INT))", "sqrt(f64)", "isnan(f64)", "sign(i32)",
    # decimals
    "d + d", "d + i32", "d + i64", "d + 1", "d * 4294967296", "d * i8", "d - fine",
    "wide + fine", "wide * wide", "d / 3", "d / d", "fine / wide", "i32 / d",
    "try_divide(d, CAST(i32 AS DOUBLE))", "try_divide(CAST(i64 AS DOUBLE), f64)",
    "CAST(d AS DECIMAL(20,0)) * CAST(4294967296 AS DECIMAL(11,0))", "d * 1.5", "d + 0.001",
    # branches
    "CASE WHEN b THEN 1 ELSE 2.5 END", "CASE WHEN b THEN i32 END", "CASE WHEN b THEN d ELSE i64 END",
    "coalesce(d, 0)", "coalesce(i8, i64)", "coalesce(fine, wide)", "coalesce(d, f64)",
    "coalesce(NULL, s)", "if(b, i16, i32)", "greatest(i32, i64)", "greatest(f32, i32)",
    "CASE WHEN b THEN 1 END",
    # predicates
    "i32 > 1", "d = 1", "s IS NULL", "i32 IN (1, 2)", "NOT b", "b AND i32 <=> 2",
    # functions the compiler writes
    "CAST(pmod(xxhash64(s, i64), 8) AS INT)", "pmod(xxhash64(s), 8)", "xxhash64(i32)",
    # date parts (a time grain's keys)
    "year(day)", "month(day)", "quarter(day)", "dayofmonth(day)", "day(day)", "dayofyear(day)",
    "weekofyear(day)", "year(at)", "month(at)", "weekofyear(at)",
    # the clock's parts, truncations and remainders (a time grain's or a bucket's keys)
    "hour(at)", "minute(at)", "second(at)", "hour(day)",
    "date_trunc('MONTH', at)", "date_trunc('HOUR', at)", "date_trunc('WEEK', day)",
    "try_mod(i64, i32)", "try_mod(f64, i8)", "try_mod(i8, i16)", "i32 % 7",
    # the case, length and substrings of text
    "upper(s)", "lower(s)", "length(s)", "substr(s, 2, 3)", "substring(s, 1)",
]
AGGREGATES = [
    "count(*)", "count(DISTINCT s)", "sum(i8)", "sum(i64)", "sum(f32)", "sum(d)", "sum(fine)",
    "sum(wide)", "avg(i32)", "avg(f64)", "avg(d)", "avg(fine)", "avg(wide)", "min(d)", "max(s)",
    "min(at)", "var_pop(f64)", "stddev_samp(i32)", "coalesce(sum(CAST(i64 AS DECIMAL(38,0))), 0)",
    "CAST(coalesce(sum(d), 0) AS DECIMAL(38,2))",
]


def _spark_schema(spark, sql: str) -> pa.Schema:
    return nullable(to_arrow_schema(spark.sql(sql).schema))


def _compare(spark, expressions: list[str], shape: str) -> None:
    arrow_frame(spark, T.empty_table()).createOrReplaceTempView("t")
    sql = shape.format(", ".join(f"{e} AS c{i}" for i, e in enumerate(expressions)))
    got, want = SparkTypes({"t": T}).schema(sql), _spark_schema(spark, sql)
    wrong = [f"{e}: predicted {g.type}, Spark {w.type}"
             for e, g, w in zip(expressions, got, want) if g.type != w.type]
    assert not wrong, "\n".join(wrong)
    assert got.names == want.names


def test_each_rule_gives_the_type_spark_gives(spark):
    _compare(spark, KNOWN, "SELECT {} FROM t")
    _compare(spark, AGGREGATES, "SELECT {} FROM t GROUP BY s")


def test_relations_star_subqueries_joins_unions_and_lateral_views(spark):
    arrow_frame(spark, T.empty_table()).createOrReplaceTempView("t")
    types = SparkTypes({"t": T})
    for sql in [
        "SELECT * FROM t",
        "SELECT x.*, y.i32 AS other FROM t AS x JOIN t AS y ON x.i32 = y.i32",
        "SELECT n.k, n.total FROM (SELECT s AS k, sum(d) AS total FROM t GROUP BY s) AS n",
        "SELECT i32 AS a, d AS b FROM t UNION ALL SELECT i64, i8 FROM t",
        "SELECT i16 AS a, fine AS b FROM t EXCEPT SELECT i32, wide FROM t",
        "SELECT s, f32 AS x FROM t INTERSECT SELECT s, f64 FROM t",
        "WITH w AS (SELECT i16 AS k, avg(d) AS m FROM t GROUP BY i16) SELECT k, m * 2 AS m2 FROM w",
        ("SELECT * FROM (SELECT s, CAST(sum(i32) AS BIGINT) AS `_w` FROM t GROUP BY s) AS `_net` "
         "LATERAL VIEW explode(sequence(CAST(1 AS BIGINT), abs(`_w`))) AS `_copy` WHERE `_w` > 0"),
        ("SELECT a.s, b.total FROM t AS a LEFT JOIN (SELECT s, sum(f64) AS total FROM t GROUP BY s)"
         " AS b ON a.s = b.s CROSS JOIN (SELECT count(*) AS n FROM t) AS c"),
    ]:
        assert types.schema(sql) == _spark_schema(spark, sql), sql


@pytest.mark.parametrize("sql", [
    "SELECT rank() OVER (ORDER BY i32) AS r FROM t",  # a window
    "SELECT reverse(s) AS u FROM t",  # a string function
    "SELECT upper(i32) AS u FROM t",  # of a number: Spark casts it to text first
    "SELECT year(s) AS y FROM t",  # a date part of text: Spark casts it to a date first
    "SELECT CAST(at AS TIMESTAMP) AS z FROM t",  # a time zone
    "SELECT a.i32 FROM t AS a JOIN t AS b USING (i32)",  # merged columns
    "SELECT i32 FROM elsewhere",  # not registered
    "SELECT i32 + 1 FROM t",  # no name
    "SELECT i32 AS x FROM t AS a JOIN t AS b ON a.s = b.s",  # ambiguous
    "SELECT d % 2 AS r FROM t",  # a DECIMAL remainder
    "SELECT date_trunc('MONTH', s) AS m FROM t",  # of text: Spark casts it first
    "SELECT NULL + d AS z FROM t",
    "SELEC i32",
])
def test_what_it_does_not_know_it_refuses_and_says(sql):
    with pytest.raises(NotLocal) as e:
        SparkTypes({"t": T}).schema(sql)
    assert str(e.value)


# -- every table a new program creates ---------------------------------------------------------
WIDE = """
CREATE TABLE facts (k INTEGER, tiny TINYINT, small SMALLINT, big BIGINT, price DECIMAL(10,2),
                    huge DECIMAL(30,4), x DOUBLE, f FLOAT, label VARCHAR, day DATE, ok BOOLEAN);
CREATE TABLE dims (k INTEGER, name VARCHAR, weight DECIMAL(5,3));
CREATE VIEW by_label AS
SELECT label, SUM(price) AS revenue, AVG(price) AS avg_price, SUM(huge) AS h, AVG(huge) AS ah,
       SUM(tiny + small) AS ts, AVG(big) AS ab, MIN(day) AS first_day, MAX(f) AS top_f,
       COUNT(DISTINCT k) AS keys, SUM(price * big) AS pb, SUM(x * 2) AS x2, MAX(ok) AS any_ok
FROM facts WHERE big > 1 GROUP BY label HAVING COUNT(*) > 0;
CREATE VIEW joined AS
SELECT d.name, SUM(f.price * d.weight) AS weighted, COUNT(*) AS n, MIN(f.small) AS least
FROM facts f JOIN dims d ON f.k = d.k GROUP BY d.name;
CREATE VIEW overall AS
SELECT COUNT(*) AS n, SUM(price) AS s, AVG(x) AS a, VAR_POP(x) AS v, SUM(tiny) AS st FROM facts;
CREATE VIEW nested AS
SELECT revenue > 10 AS big_label, COUNT(*) AS labels, SUM(revenue) AS revenue
FROM (SELECT label, SUM(price) AS revenue FROM facts GROUP BY label) AS r GROUP BY revenue > 10;
"""


def _value(rng: random.Random, column) -> object:
    name = column.type.name
    if rng.random() < 0.1:
        return None
    if name in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT"):
        return rng.randint(1, 4)
    if name in ("DOUBLE", "FLOAT"):
        return rng.randint(1, 40) / 4
    if name == "DECIMAL":
        return Decimal(rng.randint(1, 999)).scaleb(-column.type.scale)
    if name == "DATE":
        return datetime.date(2026, 1, rng.randint(1, 9))
    if name == "BOOLEAN":
        return rng.random() < 0.5
    return rng.choice(["a", "b", "c"])


def _tables(root: Path) -> dict[str, DeltaTable]:
    return {str(log.parent.relative_to(root)): DeltaTable(str(log.parent))
            for log in root.rglob("_delta_log")}


def _rows(table: DeltaTable) -> list[tuple]:
    rows = DeltaStore().read(table.table_uri).to_pylist()
    return sorted(tuple(map(repr, row.values())) for row in rows)


@pytest.mark.parametrize("program", ["sql/examples/sales.sql", "sql/examples/regions.sql", "wide"])
def test_new_tables_have_the_types_spark_gives_them(spark, tmp_path, program):
    """A new program's state tables and first answers, created on the driver with the types
    found here, equal those Spark creates: every Delta table's schema and rows, in two
    warehouses fed the same batch.  The driver's run starts no Spark, and its answers equal
    DuckDB's."""
    compiled = compile_text(WIDE, name="wide") if program == "wide" else \
        compile_program(REPO / program)
    rng = random.Random(3)
    landing, sources = tmp_path / "landing", {}
    for decl in compiled.program.tables:
        rows = [{c.name: _value(rng, c) for c in decl.columns} for _ in range(12)]
        sources[decl.name] = pa.Table.from_pylist(rows, schema=arrow_schema(decl.columns))
        (landing / decl.name).mkdir(parents=True)
        pq.write_table(sources[decl.name], landing / decl.name / "000.parquet")
    Pipeline(compiled, landing, tmp_path / "spark", spark=spark, local_rows=0).run()
    driver = Pipeline(compiled, landing, tmp_path / "driver")  # starts Spark only if it must
    driver.run()
    assert driver.engines._spark is None, "a new program's first run started Spark"
    on_driver, in_spark = _tables(tmp_path / "driver"), _tables(tmp_path / "spark")
    assert sorted(on_driver) == sorted(in_spark)
    for name, table in on_driver.items():
        assert table.schema().to_arrow() == in_spark[name].schema().to_arrow(), name
        if name.startswith("state/"):  # answers are compared with DuckDB below
            assert _rows(table) == _rows(in_spark[name]), name
    for plan in compiled.plans:
        answer, _ = read_answer(tmp_path / "driver", plan)
        diff = diff_answers(oracle_answer(plan.select, sources), answer, ordered=plan.ordered)
        assert diff is None, f"view {plan.view}: {diff}"

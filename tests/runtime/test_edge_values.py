"""Values at the edges of their types, inserted and deleted, on both engines, against DuckDB.

NaN, ±Inf and −0.0 as measures and as group keys; an empty, a unicode and a 1 MB string key;
BIGINT sums up to 2^63 − 1 (their state is DECIMAL(38,0), so no MERGE wraps); a DECIMAL(38,2)
sum of 36 digits; timestamps at 0001-01-01 and 9999-12-31 23:59:59.999999.  A sum whose
answer leaves BIGINT, or a DECIMAL(38,2) sum past 36 digits before the point, is not wrapped,
truncated or turned into NULL: the batch stops the run with a message that says how to widen
the column, and the answer stays as it was.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from incr.compiler import compile_text
from incr.errors import OutOfRangeError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import describe_run, read_answer

PROGRAM = """
CREATE TABLE t (g VARCHAR, v BIGINT, d DECIMAL(38,2), x DOUBLE, ts TIMESTAMP);
CREATE VIEW per_key AS
SELECT g, SUM(v) AS sv, AVG(v) AS av, COUNT(*) AS n, SUM(d) AS sd, MIN(ts) AS lo, MAX(ts) AS hi,
       MIN(x) AS mx, SUM(x) AS sx
FROM t GROUP BY g;
CREATE VIEW per_x AS SELECT x, COUNT(*) AS n, SUM(v) AS sv FROM t GROUP BY x;
CREATE VIEW overall AS SELECT SUM(v) AS sv, MAX(LENGTH(g)) AS longest, COUNT(DISTINCT x) AS xs FROM t;
"""
SCHEMA = pa.schema([("g", pa.string()), ("v", pa.int64()), ("d", pa.decimal128(38, 2)),
                    ("x", pa.float64()), ("ts", pa.timestamp("us"))])
HUGE = "ü" * 500_000  # 1 MB of UTF-8
BIG = 2 ** 62
NINES = Decimal("9" * 34 + ".99")
FIRST = dt.datetime(1, 1, 1)
LAST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
INF, NAN = float("inf"), float("nan")


def _rows() -> list[list[dict]]:
    """Three insert batches and two delete batches (as ('insert'|'delete', rows))."""
    def r(g, v, d, x, ts):
        return {"g": g, "v": v, "d": d, "x": x, "ts": ts}

    first = [r("é✓", BIG, NINES, -0.0, FIRST), r("é✓", BIG - 1, NINES, 0.0, LAST),
             r("", -BIG, Decimal("-0.01"), NAN, None), r(HUGE, 7, None, INF, dt.datetime(1970, 1, 1)),
             r("日本", None, Decimal("1.5"), -INF, FIRST), r("日本", -BIG, NINES, 1e308, LAST)]
    second = [r("é✓", -5, Decimal("0.01"), NAN, LAST), r("", BIG, NINES, 2.5, FIRST),
              r("日本", -BIG, Decimal("-1.5"), 1e308, None)]
    third = [r(HUGE, BIG, NINES, -INF, LAST), r("z", 0, Decimal("0"), 5e-324, FIRST)]
    return [("insert", first), ("insert", second), ("delete", [first[0], first[2], second[0]]),
            ("insert", third), ("delete", [first[3], first[5], third[1]])]


def _land(landing: Path, seq: int, kind: str, rows: list[dict]) -> None:
    folder = landing / "t" / ("_deletes" if kind == "delete" else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"{seq:04d}.parquet")


@pytest.mark.parametrize("local_rows", [200_000, 0], ids=["driver", "spark"])
def test_edge_values_equal_duckdb_after_every_batch(spark, tmp_path, local_rows):
    compiled = compile_text(PROGRAM, path="edges.sql", name="edges")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    live: list[dict] = []
    for seq, (kind, rows) in enumerate(_rows()):
        _land(landing, seq, kind, rows)
        report = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()
        assert report.rejected is None, str(report.rejected)
        if kind == "insert":
            live += rows
        else:
            for row in rows:  # remove by identity of values (NaN != NaN, so not list.remove)
                live.pop(next(i for i, r in enumerate(live) if _same(r, row)))
        source = pa.Table.from_pylist(live, schema=SCHEMA)
        for plan in compiled.plans:
            answer, at = read_answer(warehouse, plan)
            assert at == seq
            diff = diff_answers(oracle_answer(plan.select, {"t": source}), answer)
            assert diff is None, f"batch {seq}, view {plan.view}: {diff}"


@pytest.mark.parametrize("local_rows", [200_000, 0], ids=["driver", "spark"])
def test_a_timestamp_column_keeps_no_zone_in_state_and_answer(spark, tmp_path, local_rows):
    """DuckDB's TIMESTAMP has no zone, nor may incr's: a zone (UTC) would make BI tools show
    the values shifted to their own zone.  (PySpark makes Arrow timestamps without zone
    TIMESTAMP with the session's zone unless told otherwise: this was a defect.)"""
    compiled = compile_text("CREATE TABLE t (g VARCHAR, ts TIMESTAMP);\n"
                            "CREATE VIEW a AS SELECT g, MIN(ts) AS lo FROM t GROUP BY g;",
                            path="ts.sql", name="ts")
    (tmp_path / "landing" / "t").mkdir(parents=True)
    (tmp_path / "landing" / "t" / "0001.csv").write_text("g,ts\na,2020-01-01 00:00:00\n")
    Pipeline(compiled, tmp_path / "landing", tmp_path / "warehouse", spark=spark,
             local_rows=local_rows).run()
    answer, _ = read_answer(tmp_path / "warehouse", compiled.plans[0])
    assert answer.schema.field("lo").type == pa.timestamp("us")
    assert answer.column("lo").to_pylist() == [dt.datetime(2020, 1, 1)]
    tables = list((tmp_path / "warehouse" / "state" / "a").glob("*/*"))
    assert tables
    for table in tables:
        types = [str(f.type) for f in DeltaTable(str(table)).schema().fields]
        assert 'PrimitiveType("timestamp")' not in types, (table, types)


def _same(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


@pytest.mark.parametrize("local_rows", [200_000, 0], ids=["driver", "spark"])
def test_a_sum_leaving_bigint_stops_the_run_and_keeps_the_answer(spark, tmp_path, local_rows):
    compiled = compile_text("CREATE TABLE t (g VARCHAR, v BIGINT);\n"
                            "CREATE VIEW s AS SELECT g, SUM(v) AS sv, COUNT(*) AS n FROM t GROUP BY g;",
                            path="big.sql", name="big")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    schema = pa.schema([("g", pa.string()), ("v", pa.int64())])
    (landing / "t").mkdir(parents=True)
    for seq in range(3):  # 2^62 a batch: the second makes 2^63, one past BIGINT's top
        pq.write_table(pa.Table.from_pylist([{"g": "a", "v": BIG}, {"g": "b", "v": seq}], schema=schema),
                       landing / "t" / f"{seq:04d}.parquet")
        report = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()
        answer, at = read_answer(warehouse, compiled.plans[0])
        if seq == 0:
            assert report.rejected is None
            continue
        assert isinstance(report.rejected, OutOfRangeError), report.rejected
        assert report.rejected_batch.seq == 1  # later batches wait behind it
        message = str(report.rejected)
        assert "0001.parquet" in message and "view s" in message and "9223372036854775808" in message
        assert "SUM(CAST(v AS DECIMAL(38,0)))" in message
        assert "out of range" in describe_run(report)
        assert at == 0 and sorted(answer.to_pylist(), key=str) == [
            {"g": "a", "sv": BIG, "n": 1}, {"g": "b", "sv": 0, "n": 1}], "the answer changed"

    # Widened as the message says, the view rebuilds from the ledger and answers DuckDB's HUGEINT.
    widened = compile_text("CREATE TABLE t (g VARCHAR, v BIGINT);\n"
                           "CREATE VIEW s AS SELECT g, SUM(CAST(v AS DECIMAL(38,0))) AS sv, COUNT(*) AS n "
                           "FROM t GROUP BY g;", path="big.sql", name="big")
    report = Pipeline(widened, landing, warehouse, spark=spark, local_rows=local_rows).run()
    assert report.rejected is None, str(report.rejected)
    answer, at = read_answer(warehouse, widened.plans[0])
    assert at == 2
    assert {r["g"]: r["sv"] for r in answer.to_pylist()} == {"a": 3 * BIG, "b": 3}


@pytest.mark.parametrize("local_rows", [200_000, 0], ids=["driver", "spark"])
@pytest.mark.parametrize("past", ["precision", "128 bits", "one batch"])
def test_a_decimal_sum_past_38_digits_stops_the_run_and_keeps_the_answer(spark, tmp_path, local_rows, past):
    """DECIMAL(38,2) holds 36 digits before the point.  A sum past them is refused on both
    engines, whether the state's MERGE makes it (still inside 128 bits, where DuckDB keeps a
    39-digit value in its DECIMAL(38,2) that no BI tool can read, or past them) or a batch's
    own rows do."""
    compiled = compile_text("CREATE TABLE t (g VARCHAR, d DECIMAL(38,2));\n"
                            "CREATE VIEW s AS SELECT g, SUM(d) AS sd, COUNT(*) AS n FROM t GROUP BY g;",
                            path="dec.sql", name="dec")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    schema = pa.schema([("g", pa.string()), ("d", pa.decimal128(38, 2))])
    # The first batch is applied; the second overflows: 6e35 + 6e35 has 37 digits before the
    # point; 2 x (10^36 - 0.01) is past 2^127 hundredths; two rows of 6e35 overflow in h.
    big = {"precision": Decimal("6e35"), "128 bits": Decimal("9" * 36 + ".99"),
           "one batch": Decimal(1)}[past]
    second = [Decimal("6e35")] * 2 if past == "one batch" else [big]
    (landing / "t").mkdir(parents=True)
    for seq, values in enumerate(([big], second)):
        rows = [{"g": "a", "d": d} for d in values] + [{"g": "b", "d": Decimal(seq)}]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), landing / "t" / f"{seq:04d}.parquet")
        report = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()
        answer, at = read_answer(warehouse, compiled.plans[0])
        if seq == 0:
            assert report.rejected is None, str(report.rejected)
            continue
        assert isinstance(report.rejected, OutOfRangeError), report.rejected
        message = str(report.rejected)
        assert "0001.parquet" in message and "view s" in message and "DECIMAL 38" in message, message
        assert at == 0 and sorted(answer.to_pylist(), key=str) == [
            {"g": "a", "sd": big, "n": 1}, {"g": "b", "sd": Decimal(0), "n": 1}], "the answer changed"

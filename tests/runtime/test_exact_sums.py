"""DOUBLE SUM/AVG/VAR/STDDEV under deletions: no float residue, on both engines.

A DOUBLE accumulator diminished by a deletion keeps the rounding of what left it (insert
1e16, 1 and 2, delete 1e16: it answers 2, not 3).  Sums are kept exactly per binary band
and moments are taken from the live values (:mod:`incr.algebra.exact`,
:mod:`incr.compiler.passes.infer_monoids`); these tests check it end to end against DuckDB
over the live rows, with the driver-side engine and with Spark, and that Spark computes the
bands and totals bit for bit as the reference (DuckDB's side: ``tests/algebra/test_exact.py``).
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr.algebra import exact
from incr.compiler import compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from tests.algebra.test_exact import EDGES

PROGRAM = """-- incr: buckets = 2
CREATE TABLE t (k VARCHAR, x DOUBLE, y DOUBLE);
CREATE VIEW sums AS SELECT k, SUM(x) AS sx, AVG(x) AS ax, COUNT(x) AS nx FROM t GROUP BY k;
CREATE VIEW total AS SELECT SUM(x) AS sx, AVG(y) AS ay FROM t;
CREATE VIEW moments AS SELECT k, STDDEV_SAMP(y) AS sd, VAR_POP(y) AS vp, SUM(y) AS sy
FROM t GROUP BY k;
CREATE VIEW spread AS SELECT STDDEV_POP(y) AS sd, VAR_SAMP(y) AS vs FROM t;
"""
SCHEMA = pa.schema([("k", pa.string()), ("x", pa.float64()), ("y", pa.float64())])

# x carries NaN and the infinities (sums follow IEEE); y stays finite, as DuckDB refuses
# moments of non-finite values.
BATCHES = [
    ("insert", [("a", 1e16, 1e16), ("a", 1.0, 1.0), ("a", 2.0, 2.0), ("b", math.nan, 5.0),
                ("b", 5.0, 7.0), ("c", math.inf, 0.5), ("c", -math.inf, 0.25), ("d", 0.1, 0.1),
                ("d", 0.2, 0.2), ("d", -0.3, 0.3), ("e", -0.0, None)]),
    ("delete", [("a", 1e16, 1e16)]),
    ("delete", [("b", math.nan, 5.0), ("c", -math.inf, 0.25)]),
    ("insert", [("a", 1e16, 1e16), ("c", 3.0, 3.0), ("e", 5e-324, 2.5)]),
    ("delete", [("a", 1e16, 1e16), ("c", math.inf, 0.5), ("d", 0.1, 0.1)]),
]


@pytest.mark.parametrize("local_rows", [200_000, 0], ids=["driver", "spark"])
def test_deletes_leave_no_float_residue(spark, tmp_path, local_rows):
    compiled = compile_text(PROGRAM, path="exact.sql", name="exact")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    live: list[tuple] = []
    for seq, (op, rows) in enumerate(BATCHES):
        folder = landing / "t" / ("_deletes" if op == "delete" else "")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows],
                                            schema=SCHEMA), folder / f"{seq:04d}.parquet")
        for r in rows:
            if op == "insert":
                live.append(r)
            else:
                live.remove(next(x for x in live if _same(x, r)))
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        source = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in live], schema=SCHEMA)
        for plan in compiled.plans:
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(oracle_answer(plan.select, {"t": source}), answer,
                                ordered=plan.ordered)
            assert diff is None, f"after batch {seq} ({op}), view {plan.view}:\n{diff}"
    if local_rows:  # the driver-side engine ran the band SQL itself, not only Spark
        assert pipeline.engines.local is not None and pipeline.engines.local.queries > 0
    sums = {r["k"]: r for r in read_answer(warehouse, compiled.plan("sums"))[0].to_pylist()}
    assert sums["a"]["sx"] == 3.0 and sums["a"]["ax"] == 1.5  # a DOUBLE state said 2 and 1
    assert sums["b"]["sx"] == 5.0 and sums["c"]["sx"] == 3.0  # NaN and -Inf gone for good
    assert sums["d"]["sx"] == 0.2 + -0.3


def _same(a: tuple, b: tuple) -> bool:
    return all(x == y or (isinstance(x, float) and isinstance(y, float)
                          and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_spark_computes_the_reference_bands_and_totals(spark):
    values = list(EDGES) + [math.nan, math.inf, -math.inf, None, 3.5, -7.25, 123456789.123]
    for b in range(exact.LOWEST + 1, exact.HIGHEST + 1):
        lower = 2.0 ** (exact.WIDTH * b)
        values += [lower, math.nextafter(lower, 0), -lower, math.nextafter(lower, math.inf)]
    spark.createDataFrame([(v,) for v in values], "v DOUBLE").createOrReplaceTempView("vals")
    banded = f"SELECT v, {exact.band_sql('v')} AS value FROM vals"
    rows = spark.sql(f"SELECT v, value, {exact.scaled_sql('v', 'value')} AS total "
                     f"FROM ({banded}) AS s").collect()
    assert len(rows) == len(values)
    for row in rows:
        x = row["v"]
        assert row["value"] == exact.band(x), (x, row["value"])
        if row["value"] is not None:
            want = exact.scaled(x) if row["value"] <= exact.HIGHEST else 0
            assert int(row["total"]) == want, (x, row["total"], want)


NESTED = """-- incr: buckets = 2
CREATE TABLE t (k VARCHAR, g VARCHAR, x DOUBLE, y DOUBLE);
CREATE VIEW by_sum AS SELECT s, COUNT(*) AS n FROM (SELECT k, SUM(x) AS s FROM t GROUP BY k) AS q
GROUP BY s;
CREATE VIEW by_var AS SELECT v, COUNT(*) AS n
FROM (SELECT k, VAR_POP(y) AS v FROM t GROUP BY k) AS q GROUP BY v;
CREATE VIEW sum_of_sums AS SELECT SUM(s) AS ss, AVG(a) AS aa, COUNT(*) AS n
FROM (SELECT k, SUM(x) AS s, AVG(y) AS a FROM t GROUP BY k) AS q;
CREATE VIEW rolled AS SELECT k, g, SUM(x) AS sx, VAR_SAMP(y) AS vy, COUNT(*) AS n
FROM t GROUP BY ROLLUP (k, g);
CREATE VIEW joined AS WITH a AS (SELECT k, AVG(x) AS ax FROM t GROUP BY k)
SELECT t.g, MAX(a.ax) AS mx, COUNT(*) AS n FROM t JOIN a ON t.k = a.k GROUP BY t.g;
"""
NESTED_SCHEMA = pa.schema([("k", pa.string()), ("g", pa.string()), ("x", pa.float64()),
                           ("y", pa.float64())])
# Values three bands apart: a group holding 1e16, 1 and 3e-10 sums to 1e16 added in one
# order and to 1e16 + 2 in another, so a nested stage recomputing what it handed on could
# take back other bits than it gave.
SPREAD = [1e16, 1.0, 3e-10, -7.5, 2.5e30, 0.1, 1e-20, 12345.678, -1e16, 0.3]


def test_nested_stages_take_back_exactly_what_they_handed_on(spark, tmp_path):
    """A DOUBLE SUM/AVG/VAR in a stage another stage reads (a FROM subquery, a CTE, a
    ROLLUP's finest grouping) is exact under deletes, and what its output loses is what it
    handed on, bit for bit, with batches applied alternately by the driver-side engine and
    Spark (each sums bands in its own order): every view equals DuckDB after every batch."""
    import random

    rnd = random.Random(17)
    compiled = compile_text(NESTED, path="nested.sql", name="nested")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    engines = [Pipeline(compiled, landing, warehouse, spark=spark, local_rows=rows)
               for rows in (200_000, 0)]
    live: list[tuple] = []
    for seq in range(8):
        deleting = seq % 3 == 2 and live
        if deleting:
            op, rows = "delete", rnd.sample(live, max(1, len(live) // 3))
        else:
            op, rows = "insert", [(rnd.choice("abc"), rnd.choice("pq"), rnd.choice(SPREAD),
                                   rnd.choice(SPREAD[1:4] + SPREAD[5:8])) for _ in range(9)]
        folder = landing / "t" / ("_deletes" if op == "delete" else "")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([dict(zip(NESTED_SCHEMA.names, r)) for r in rows],
                                            schema=NESTED_SCHEMA), folder / f"{seq:04d}.parquet")
        for r in rows:
            if op == "insert":
                live.append(r)
            else:
                live.remove(r)
        report = engines[seq % 2].run()
        assert report.rejected is None, str(report.rejected)
        source = pa.Table.from_pylist([dict(zip(NESTED_SCHEMA.names, r)) for r in live],
                                      schema=NESTED_SCHEMA)
        for plan in compiled.plans:
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(oracle_answer(plan.select, {"t": source}), answer,
                                ordered=plan.ordered)
            assert diff is None, f"after batch {seq} ({op}), view {plan.view}:\n{diff}"
    assert engines[0].engines.local is not None and engines[0].engines.local.queries > 0
    kept = [s.kept.name for p in compiled.plans for s in p.stages if s.kept is not None]
    assert {"s1_kept"} <= set(kept) and len(kept) >= 4, kept

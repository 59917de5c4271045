"""Replaying a landed stream batch by batch: incremental time against full recompute.

For each batch, in order, on one Spark session:

* **incremental**: ``Pipeline.run(through=batch)`` on a fresh warehouse (register, read,
  row index, h, ⊗/⊗̃ and a for every view over the batch's source);
* **recompute**: every view's own SQL run by Spark over all rows live after the batch
  (all insert files read again, minus all delete files), collected to the driver;
* **check**: the answer table must equal the recompute and DuckDB's answer on the same rows.

The demo prints this table; benchmarks build on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pyarrow as pa
import sqlglot

from incr.compiler import CompiledProgram
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.engine import Engines
from incr.runtime.ingest import ROW, load_batch
from incr.runtime.landing import DELETE
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class ReplayRow:
    """One batch of a replay."""

    batch: int
    kind: str
    path: str
    rows: int
    incremental_s: float
    recompute_s: float
    mismatches: list[str]

    @property
    def speedup(self) -> float:
        return self.recompute_s / self.incremental_s if self.incremental_s else float("nan")


def live_dataframe(spark: SparkSession, compiled: CompiledProgram, landing: Path, table: str,
                   batches: list) -> DataFrame:
    """All rows of ``table`` live after ``batches``: inserts minus deletes, as a bag."""
    decl = compiled.program.table(table)
    assert decl is not None
    engines = Engines(spark=spark)
    ins: DataFrame | None = None
    dels: DataFrame | None = None
    for b in batches:
        if b.table != table:
            continue
        df = load_batch(engines, decl, b.source(landing), str(b.source(landing)),
                        part=b.part).df.drop(ROW)
        if b.kind == DELETE:
            dels = df if dels is None else dels.unionByName(df)
        else:
            ins = df if ins is None else ins.unionByName(df)
    if ins is None:
        from incr.runtime.session import arrow_frame
        from incr.runtime.types import arrow_schema

        ins = arrow_frame(spark, arrow_schema(decl.columns).empty_table())
    return ins.exceptAll(dels) if dels is not None else ins


def recompute(spark: SparkSession, compiled: CompiledProgram, landing: Path,
              batches: list) -> dict[str, pa.Table]:
    """Every view recomputed by Spark from all rows live after ``batches``."""
    dialect = compiled.program.options.dialect
    for source in {s for p in compiled.plans for s in p.sources}:
        live_dataframe(spark, compiled, landing, source, batches).createOrReplaceTempView(source)
    out = {}
    for plan in compiled.plans:
        sql = sqlglot.transpile(plan.select, read=dialect, write="spark")[0]
        out[plan.view] = spark.sql(sql).toArrow()
    return out


def replay(compiled: CompiledProgram, landing: Path, warehouse: Path, spark: SparkSession,
           out: TextIO | None = None, check: bool = True) -> list[ReplayRow]:
    """Applies the landed stream one batch at a time, timing it against full recompute."""
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    pipeline.register()
    batches = pipeline.ledger.batches()
    rows: list[ReplayRow] = []
    if out:
        print(f"{'batch':>5} {'kind':<6} {'rows':>7} {'incremental_s':>13} {'recompute_s':>11} "
              f"{'ratio':>6}  check", file=out)
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        report = pipeline.run(through=batch.seq)
        incremental = time.perf_counter() - t0
        if report.rejected is not None:
            raise report.rejected
        t1 = time.perf_counter()
        recomputed = recompute(spark, compiled, landing, batches[: i + 1])
        recompute_s = time.perf_counter() - t1
        mismatches = check_answers(compiled, landing, warehouse, spark, batches[: i + 1],
                                   recomputed) \
            if check else []
        n = report.applied[0].rows if report.applied else 0
        row = ReplayRow(batch.seq, batch.kind, batch.path, n, incremental, recompute_s, mismatches)
        rows.append(row)
        if out:
            verdict = "ok" if not mismatches else "MISMATCH: " + "; ".join(mismatches)
            print(f"{row.batch:>5} {row.kind:<6} {row.rows:>7} {row.incremental_s:>13.2f} "
                  f"{row.recompute_s:>11.2f} {row.speedup:>6.2f}  {verdict}", file=out)
    return rows


def check_answers(compiled: CompiledProgram, landing: Path, warehouse: Path, spark: SparkSession,
                  batches: list, recomputed: dict[str, pa.Table]) -> list[str]:
    """Each answer table against DuckDB and the Spark recompute over the same live rows."""
    sources = {s for p in compiled.plans for s in p.sources}
    live = {s: live_dataframe(spark, compiled, landing, s, batches).toArrow() for s in sources}
    problems = []
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        expected = oracle_answer(plan.select, live)
        for who, other in (("DuckDB", expected), ("Spark recompute", recomputed[plan.view])):
            diff = diff_answers(other, answer, ordered=plan.ordered)
            if diff:
                problems.append(f"{plan.view} vs {who}: {diff}")
    return problems

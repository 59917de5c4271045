"""The baseline: recomputing the view from all data so far, as a Spark batch job would.

Per stream, every insert file landed so far is read in **one** scan
(``spark.read.schema(...).parquet(*files)``, the declared schema given so Spark infers
nothing), minus every delete file (``exceptAll``: bag difference, so a deleted row removes
one copy); then the view's own SQL (transpiled to Spark's dialect) runs over those rows and
its result is collected with ``.toArrow()``, like incr collects h.  Same SparkSession, same
settings as incr and the peer.

:func:`recompute_duckdb` does the same in DuckDB on the driver (2 threads), what a user on
one machine would compare an increment with.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import sqlglot

from incr.bench.workloads import Increment, Workload
from incr.compiler import CompiledProgram
from incr.runtime.landing import INSERT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def recompute(spark: SparkSession, compiled: CompiledProgram, workload: Workload, landing: Path,
              done: list[Increment]) -> dict[str, pa.Table]:
    """Every view of ``compiled`` over the rows live after the steps ``done``."""
    for stream in workload.streams:
        schema = ", ".join(f"{c} BIGINT" for c in stream.columns)
        inserts = [str(landing / s.files[stream.table]) for s in done if s.kind == INSERT]
        deletes = [str(landing / s.files[stream.table]) for s in done if s.kind != INSERT]
        rows = spark.read.schema(schema).parquet(*inserts)
        if deletes:
            rows = rows.exceptAll(spark.read.schema(schema).parquet(*deletes))
        rows.createOrReplaceTempView(stream.table)
    dialect = compiled.program.options.dialect
    out = {}
    for plan in compiled.plans:
        sql = sqlglot.transpile(plan.select, read=dialect, write="spark")[0]
        out[plan.view] = spark.sql(sql).toArrow()
    return out


def recompute_duckdb(compiled: CompiledProgram, workload: Workload, landing: Path,
                     done: list[Increment]) -> dict[str, pa.Table]:
    """Every view of ``compiled`` over the rows live after ``done``, computed by DuckDB."""
    from incr.oracle import connect

    con = connect()
    try:
        con.execute("SET threads TO 2")
        for stream in workload.streams:
            inserts = [str(landing / s.files[stream.table]) for s in done if s.kind == INSERT]
            deletes = [str(landing / s.files[stream.table]) for s in done if s.kind != INSERT]
            cols = ", ".join(stream.columns)
            sql = f"SELECT {cols} FROM read_parquet({inserts!r})"
            if deletes:
                sql += f" EXCEPT ALL SELECT {cols} FROM read_parquet({deletes!r})"
            con.execute(f"CREATE VIEW {stream.table} AS {sql}")
        dialect = compiled.program.options.dialect
        return {plan.view: con.execute(sqlglot.transpile(plan.select, read=dialect,
                                                         write="duckdb")[0]).to_arrow_table()
                for plan in compiled.plans}
    finally:
        con.close()

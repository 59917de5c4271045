"""The floor: the least an increment can cost on this Spark session.

Whatever incremental engine runs on Spark has to read the increment's file(s) and compute h
over them in at least one Spark job; the floor times exactly that, on the same session:
``spark.read.parquet(file)`` registered as Δ, then the view's own h (``plan.h_sql``) collected
with ``.toArrow()``.  For a single-source view that is h of its state table; for a join view
it is h of the side table mirroring that stream (the only h that reads the batch alone).
A join increment lands in both streams, so its floor is the sum over both files.

incr's time divided by the floor is the overhead of everything else (row index, MERGE,
answer, bookkeeping), which is what optimisation can remove.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from incr.bench.workloads import Increment, Workload
from incr.compiler.plan import WEIGHT, IncrementalPlan
from incr.runtime.landing import DELETE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def h_tables(plan: IncrementalPlan, table: str) -> list[str]:
    """State tables whose h reads a batch of ``table`` on its own."""
    sides = plan.side_tables(table)
    if sides:
        return [t.name for t in sides]
    return [t.name for t in plan.main_tables]


def floor_seconds(spark: SparkSession, plan: IncrementalPlan, workload: Workload, landing: Path,
                  step: Increment) -> float:
    """Seconds to read the step's files and compute h on them (summed over streams)."""
    sign = -1 if step.kind == DELETE else 1
    total = 0.0
    for stream in workload.streams:
        rel = step.files[stream.table]
        schema = ", ".join(f"{c} BIGINT" for c in stream.columns)
        view = f"incr_bench_floor_{stream.table}"
        t0 = time.perf_counter()
        (spark.read.schema(schema).parquet(str(landing / rel))
         .selectExpr("*", f"CAST({sign} AS BIGINT) AS {WEIGHT}").createOrReplaceTempView(view))
        for name in h_tables(plan, stream.table):
            spark.sql(plan.h_sql(name, view)).toArrow()
        total += time.perf_counter() - t0
        spark.catalog.dropTempView(view)
    return total

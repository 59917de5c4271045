"""The peer: Spark Structured Streaming doing the benchmark's job on the same files.

The peer is what a data engineer would write with Structured Streaming instead of incr:

* a **file source** per stream (``spark.readStream.schema(...).parquet(folder)``, no
  ``maxFilesPerTrigger``) over its own input folders, into which the harness links each
  landed file just before the trigger that should see it (the peer never sees an increment
  early);
* one ``trigger(availableNow=True)`` query run per increment and awaited, restarted from
  its checkpoint (in the work folder), state in Spark's state store (the default
  HDFS-backed provider), on the very SparkSession incr and the recompute use;
* its answer published as one Parquet file per trigger through ``foreachBatch`` (incr
  publishes a Delta answer table per batch, so both write a readable answer every time).

**groupBy** is Spark's own streaming aggregation, ``groupBy(x).agg(avg(y))`` in
``complete`` output mode.

**join-groupBy** cannot run as written: Spark 4.0.1 refuses a stream-stream join in
``complete`` and ``update`` mode ("Join between two streaming DataFrames/Datasets is not
supported in Complete output mode, only in Append output mode") and an aggregation without
an event-time watermark in ``append`` mode (``STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION``);
the benchmark has no event time.  So the peer is the hand-written equivalent: Spark's
stream-stream inner join (``append`` mode, both sides kept in the state store, no watermark)
emits the new joined rows of each trigger, and ``foreachBatch`` folds them into a running
aggregate ``(a, Σb, count)`` kept as Parquet: ``new = (previous ∪ h(joined rows)) grouped
by a`` written as a new version, the answer being that version.

**Deletions** Structured Streaming cannot retract, so the peer reads each stream's delete
folder as a second file source and carries a sign ``w`` (+1 insert, -1 delete): groupBy
becomes ``SUM(y·w) / SUM(w)`` with groups dropped at count 0; join-groupBy joins signed rows
(weight ``wx·wy``, bag semantics make the join bilinear) and the fold drops groups whose
count reaches 0.  The join state then keeps delete rows next to the rows they cancel.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.bench.workloads import Increment, Workload
from incr.runtime.landing import INSERT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

WEIGHT = "w"


class StreamingPeer:
    """One workload's Structured Streaming peer, fed and triggered once per increment."""

    def __init__(self, spark: SparkSession, workload: Workload, root: Path, deletes: bool):
        self.spark = spark
        self.workload = workload
        self.deletes = deletes
        shutil.rmtree(root, ignore_errors=True)
        self.inbox = root / "input"
        self.checkpoint = root / "checkpoint"
        self.sink = root / "sink"
        for stream in workload.streams:
            (self.inbox / "inserts" / stream.table).mkdir(parents=True)
            if deletes:
                (self.inbox / "deletes" / stream.table).mkdir(parents=True)
        self.sink.mkdir(parents=True)
        self.progress: list[dict] = []

    # -- feeding and running -----------------------------------------------------------------
    def feed(self, landing: Path, step: Increment) -> None:
        """Makes the step's landed files visible to the peer's file sources (hard links)."""
        kind = "inserts" if step.kind == INSERT else "deletes"
        for table, rel in step.files.items():
            target = self.inbox / kind / table / step.stem
            try:
                os.link(landing / rel, target)
            except OSError:
                shutil.copy2(landing / rel, target)

    def trigger(self) -> float:
        """Runs the query once with ``availableNow`` and waits; returns the wall-clock seconds.

        The time covers starting the query from its checkpoint, listing the new files, the
        micro-batch(es) with their state-store commits, and the answer write.
        """
        t0 = time.perf_counter()
        query = self._start()
        query.awaitTermination()
        elapsed = time.perf_counter() - t0
        if query.exception() is not None:
            raise RuntimeError(f"the Structured Streaming peer failed: {query.exception()}")
        self.progress = list(query.recentProgress or [])
        return elapsed

    def _start(self):
        if len(self.workload.streams) == 1:
            writer = (self._groupby().writeStream.outputMode("complete")
                      .foreachBatch(self._publish))
        else:
            writer = (self._join().writeStream.outputMode("append")
                      .foreachBatch(self._fold))
        return (writer.option("checkpointLocation", str(self.checkpoint))
                .trigger(availableNow=True).start())

    # -- the queries ---------------------------------------------------------------------------
    def _rows(self, table: str, columns: tuple[str, ...]) -> DataFrame:
        """The stream's rows; with deletions, inserts and deletes unioned with a sign ``w``."""
        from pyspark.sql import functions as F

        schema = ", ".join(f"{c} BIGINT" for c in columns)
        inserts = self.spark.readStream.schema(schema).parquet(str(self.inbox / "inserts" / table))
        if not self.deletes:
            return inserts.withColumn(WEIGHT, F.lit(1).cast("bigint"))
        deletes = self.spark.readStream.schema(schema).parquet(str(self.inbox / "deletes" / table))
        return inserts.withColumn(WEIGHT, F.lit(1).cast("bigint")).unionByName(
            deletes.withColumn(WEIGHT, F.lit(-1).cast("bigint")))

    def _groupby(self) -> DataFrame:
        from pyspark.sql import functions as F

        (stream,) = self.workload.streams
        key, val = stream.columns
        if not self.deletes:
            inserts = self.spark.readStream.schema(f"{key} BIGINT, {val} BIGINT").parquet(
                str(self.inbox / "inserts" / stream.table))
            return inserts.groupBy(key).agg(F.avg(val).alias(self.workload.value))
        rows = self._rows(stream.table, stream.columns)
        w = F.col(WEIGHT)
        agg = rows.groupBy(key).agg(F.sum(F.col(val) * w).alias("s"), F.sum(w).alias("n"),
                                    F.sum(F.when(F.col(val).isNotNull(), w).otherwise(0)).alias("c"))
        return agg.where("n > 0").select(
            key, F.when(F.col("c") > 0, F.col("s").cast("double") / F.col("c"))
            .alias(self.workload.value))

    def _join(self) -> DataFrame:
        from pyspark.sql import functions as F

        xs, ys = self.workload.streams
        left = self._rows(xs.table, xs.columns).withColumnRenamed(WEIGHT, "wx")
        right = self._rows(ys.table, ys.columns).withColumnRenamed(WEIGHT, "wy")
        joined = left.join(right, "c")
        return joined.select("a", "b", (F.col("wx") * F.col("wy")).alias(WEIGHT))

    # -- the sinks -----------------------------------------------------------------------------
    def _publish(self, df: DataFrame, batch_id: int) -> None:
        """groupBy: the complete answer of this trigger, as one Parquet file."""
        df.coalesce(1).write.mode("overwrite").parquet(str(self.sink / "answer"))

    def _fold(self, df: DataFrame, batch_id: int) -> None:
        """join-groupBy: running aggregate ← previous ⊕ h(new joined rows), as a new version."""
        from pyspark.sql import functions as F

        w = F.col(WEIGHT)
        h = df.groupBy("a").agg(F.sum(F.col("b") * w).alias("s"), F.sum(w).alias("n"),
                                F.sum(F.when(F.col("b").isNotNull(), w).otherwise(0)).alias("c"))
        previous = self._version(before=batch_id)
        if previous is not None:
            h = (self.spark.read.parquet(str(previous)).unionByName(h).groupBy("a")
                 .agg(F.sum("s").alias("s"), F.sum("n").alias("n"), F.sum("c").alias("c")))
        h.where("n <> 0").coalesce(1).write.mode("overwrite").parquet(
            str(self.sink / f"agg-{batch_id:06d}"))

    def _version(self, before: int | None = None) -> Path | None:
        """The newest complete aggregate version (older than micro-batch ``before``)."""
        done = sorted(p for p in self.sink.glob("agg-*") if (p / "_SUCCESS").exists()
                      and (before is None or int(p.name[4:]) < before))
        return done[-1] if done else None

    # -- the answer ----------------------------------------------------------------------------
    def answer(self) -> pa.Table:
        """The peer's current answer, with the view's column names (key, value)."""
        from pyspark.sql import functions as F

        key, value = self.workload.key, self.workload.value
        if len(self.workload.streams) == 1:
            path = self.sink / "answer"
            return self.spark.read.parquet(str(path)).select(key, value).toArrow()
        version = self._version()
        if version is None:
            return pa.table({key: pa.array([], pa.int64()), value: pa.array([], pa.int64())})
        df = self.spark.read.parquet(str(version))
        return df.select(F.col("a").alias(key), F.when(F.col("c") > 0, F.col("s"))
                         .alias(value)).toArrow()

    def durations(self) -> dict[str, int]:
        """Spark's own breakdown (ms) of the last trigger, summed over its micro-batches."""
        out: dict[str, int] = {}
        for progress in self.progress:
            for k, v in (progress.get("durationMs") or {}).items():
                out[k] = out.get(k, 0) + int(v)
        return out

"""The live rows of a source, so a deletion of a row that is not there is caught.

Deletion is only defined for rows that are live (seed Appendix A requires ΔS' ⊆ S): a
diminisher applied to anything else would silently corrupt every view.  View states cannot
tell (a group's sums do not say which rows made them), so each source that takes deletions
keeps a **row index**: a Delta table of (h1, h2, n) where (h1, h2) is a 128-bit fingerprint of
a whole row (two salted xxhash64 chains over every column and its NULL flag) and ``n`` a signed
count.  Insert batches append +count, delete batches append -count after checking that
every deleted row has enough live copies; compaction folds the log (rows summing to 0 go).

The index is per program and committed with the batch number, like every other table, so
checking and recording a batch happen exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.program import TableDecl
from incr.errors import InputError, Location
from incr.runtime.ingest import ROW
from incr.runtime.session import read_delta
from incr.runtime.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SCHEMA = pa.schema([("h1", pa.int64()), ("h2", pa.int64()), ("n", pa.int64())])
COMPACT_AFTER_FILES = 32
SHOW_BAD_ROWS = 3


@dataclass
class IndexMetrics:
    """What recording one batch did."""

    distinct_rows: int
    compacted: bool = False


class RowIndex:
    """The row index of one source table of one program."""

    def __init__(self, store: DeltaStore, path: Path, table: TableDecl):
        self.store = store
        self.path = path
        self.table = table

    def through(self) -> int:
        """Last batch recorded (-1: none)."""
        return self.store.applied_through(self.path)

    def fingerprints(self, df: DataFrame) -> DataFrame:
        """``df`` with columns h1, h2: the row fingerprint over the declared columns."""
        from pyspark.sql import functions as F

        parts = []
        for col in self.table.columns:
            parts += [F.col(col.name).isNull(), F.col(col.name)]
        return df.withColumn("h1", F.xxhash64(*parts)).withColumn(
            "h2", F.xxhash64(F.lit("incr-row-index"), *parts))

    def record_inserts(self, df: DataFrame, batch: int) -> IndexMetrics:
        """Adds the batch's rows to the live set."""
        from pyspark.sql import functions as F

        counts = (self.fingerprints(df).groupBy("h1", "h2").agg(F.count(F.lit(1)).alias("n"))
                  .toArrow())
        self._append(counts, batch)
        return IndexMetrics(counts.num_rows, self._maybe_compact())

    def record_deletes(self, spark: SparkSession, df: DataFrame, batch: int, display: str) -> IndexMetrics:
        """Checks every deleted row is live (enough copies), then removes them from the set.

        Raises:
            InputError: naming the file and the first rows that are not live; nothing is
                recorded.
        """
        from pyspark.sql import functions as F

        hashed = self.fingerprints(df)
        wanted = (hashed.groupBy("h1", "h2")
                  .agg(F.count(F.lit(1)).alias("d"), F.min(ROW).alias("first_row")).cache())
        try:
            live = (read_delta(spark, self.store, str(self.path))
                    .join(wanted.select("h1", "h2"), ["h1", "h2"], "left_semi")
                    .groupBy("h1", "h2").agg(F.sum("n").alias("live")))
            bad = (wanted.join(live, ["h1", "h2"], "left")
                   .where(F.coalesce(F.col("live"), F.lit(0)) < F.col("d")))
            offenders = (bad.join(hashed.select(ROW, *[c.name for c in self.table.columns]),
                                  bad.first_row == hashed[ROW])
                         .orderBy("first_row").limit(SHOW_BAD_ROWS).collect())
            if offenders:
                total = bad.count()
                raise InputError(self._message(offenders, total), Location(display))
            removed = wanted.select("h1", "h2", (-F.col("d")).alias("n")).toArrow()
        finally:
            wanted.unpersist()
        self._append(removed, batch)
        return IndexMetrics(removed.num_rows, self._maybe_compact())

    def _message(self, offenders: list, total: int) -> str:
        shown = []
        for r in offenders:
            values = ", ".join(f"{c.name}={r[c.name]!r}" for c in self.table.columns)
            live = r["live"] or 0
            shown.append(f"row {r['first_row']} ({values}): deleted {r['d']} time(s), "
                         f"{live} live cop{'y' if live == 1 else 'ies'} in {self.table.name}")
        more = f" (and {total - len(offenders)} more)" if total > len(offenders) else ""
        return ("the delete batch removes rows that are not live, so the whole batch was "
                "rejected and nothing changed: " + "; ".join(shown) + more +
                ". Deletions must match inserted rows exactly, column for column.")

    def _append(self, counts: pa.Table, batch: int) -> None:
        self.store.write(self.path, counts.select(_SCHEMA.names).cast(_SCHEMA), mode="append",
                         batch=batch, description=f"incr row index of {self.table.name}")

    def _maybe_compact(self) -> bool:
        dt = self.store.table(self.path)
        if len(dt.file_uris()) <= COMPACT_AFTER_FILES:
            return False
        data = dt.to_pyarrow_table()
        folded = data.group_by(["h1", "h2"]).aggregate([("n", "sum")]).rename_columns(
            ["h1", "h2", "n"])
        folded = folded.filter(pa.compute.not_equal(folded["n"], 0))
        self.store.write(self.path, folded.cast(_SCHEMA), mode="overwrite", batch=None)
        self.store.table(self.path).vacuum(retention_hours=0, enforce_retention_duration=False,
                                           dry_run=False)
        return True

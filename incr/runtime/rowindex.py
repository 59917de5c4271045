"""The live rows of a source, so a deletion of a row that is not there is caught.

Deletion is only defined for rows that are live (seed Appendix A requires ΔS' ⊆ S): a
diminisher applied to anything else would silently corrupt every view.  View states cannot
tell (a group's sums do not say which rows made them), so each source that takes deletions
keeps a **row index**: a Delta table of (h1, h2, n) where (h1, h2) is a 128-bit fingerprint of
a whole row (two salted xxhash64 chains over every column and its NULL flag; a column added
to the table later, only when it is set) and ``n`` a signed
count.  Insert batches append +count, delete batches append -count after checking that
every deleted row has enough live copies; compaction folds the log (rows summing to 0 go).
Small batches are fingerprinted and checked on the driver (:mod:`~incr.runtime.sparkhash`
gives the same numbers as Spark), large ones in Spark, whose executors then write the
batch's (h1, h2, n) rows themselves (:func:`~incr.runtime.session.write_delta`): an initial
load's index rows are about as many as its rows, too many to gather on the driver.
Compaction folds the log on the driver while it is small, else in Spark (written the same way).

The index is per program and committed with the batch number, like every other table, so
checking and recording a batch happen exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from incr.compiler.program import TableDecl
from incr.config import ROW_INDEX_COMPACT_FILES, SHOW_BAD_ROWS
from incr.errors import InputError, Location
from incr.runtime import parallel, sparkhash
from incr.runtime.engine import DRIVER, SPARK, NotLocal, per_engine
from incr.runtime.ingest import ROW
from incr.runtime.session import read_delta, write_delta
from incr.runtime.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from incr.runtime.engine import Engines

_SCHEMA = pa.schema([("h1", pa.int64()), ("h2", pa.int64()), ("n", pa.int64())])
_SALT = "incr-row-index"


@dataclass
class IndexMetrics:
    """What recording one batch did."""

    distinct_rows: int
    compacted: bool = False


class RowIndex:
    """The row index of one source table of one program."""

    def __init__(self, store: DeltaStore, path: Path, table: TableDecl,
                 added: Callable[[], frozenset[str]] = frozenset):
        """``added``: the (lower-case) columns declared after the table's first declaration
        (:meth:`~incr.runtime.schemas.SchemaLog.added`), read when a row is fingerprinted."""
        self.store = store
        self.path = path
        self.table = table
        self.added = added

    def through(self) -> int:
        """Last batch recorded (-1: none)."""
        return self.store.applied_through(self.path)

    @per_engine("row fingerprint", SPARK)
    def fingerprints(self, df: DataFrame) -> DataFrame:
        """``df`` with columns h1, h2: the row fingerprint over the declared columns."""
        from pyspark.sql import functions as F

        parts = []
        added = self.added()
        for col in self.table.columns:
            # A NULL adds nothing to Spark's hash: a column added later counts only when set,
            # so a row applied before it keeps its fingerprint.
            flag = F.when(F.col(col.name).isNotNull(), F.lit(True)) if col.name.lower() in added \
                else F.col(col.name).isNull()
            parts += [flag, F.col(col.name)]
        return df.withColumn("h1", F.xxhash64(*parts)).withColumn(
            "h2", F.xxhash64(F.lit(_SALT), *parts))

    @per_engine("row fingerprint", DRIVER)
    def local_fingerprints(self, data: pa.Table) -> pa.Table | None:
        """:meth:`fingerprints` computed on the driver (h1, h2 per row), the same numbers
        (:mod:`~incr.runtime.sparkhash`); None when a column type is not reproduced."""
        parts = []
        added = self.added()
        for col in self.table.columns:
            flag = pc.if_else(data[col.name].is_valid(), True, None) \
                if col.name.lower() in added else data[col.name].is_null()
            parts += [flag, data[col.name]]
        try:
            return pa.table({"h1": sparkhash.xxhash64(parts),
                             "h2": sparkhash.xxhash64(parts, seed=sparkhash.string_hash(_SALT))})
        except sparkhash.UnsupportedType:
            return None

    def record_inserts(self, engines: Engines, df: Callable[[], DataFrame], batch: int,
                       arrow: pa.Table | None = None) -> IndexMetrics:
        """Adds the batch's rows to the live set: on the driver when ``arrow`` has them and
        :meth:`Engines.choose` agrees, else in Spark over ``df()`` (the batch's DataFrame is
        only made when Spark needs it)."""
        return self.start_inserts(engines, df, batch, arrow, background=False)()

    def start_inserts(self, engines: Engines, df: Callable[[], DataFrame], batch: int,
                      arrow: pa.Table | None = None, *,
                      background: bool = True) -> Callable[[], IndexMetrics]:
        """Starts :meth:`record_inserts`; returns the call that waits for it to be committed
        and finishes it (the log's compaction, when due).

        With ``background``, the driver-side part (fingerprints, counts, their append) runs
        on a background thread (:func:`~incr.runtime.parallel.later`) while the caller goes
        on: nothing a fold does reads the index, and an insert batch is never refused by
        it, so the views may take the batch meanwhile (a crash in between leaves them ahead
        of the index, which the next run records, as after a crash between the two).  The
        Spark path runs on the caller's thread, when it waits.
        """
        def on_driver() -> int | None:  # the index rows written; None: Spark's to do
            hashed = self._driver_fingerprints(engines, "inserts", arrow)
            if hashed is None:
                return None
            counts = self._local_inserts(hashed)
            self._append(counts, batch)
            return counts.num_rows
        appended = parallel.later(on_driver) if background else parallel.done(on_driver())

        def finish() -> IndexMetrics:
            written = appended.result()
            if written is None:
                written = self._spark_inserts(engines.spark, df(), batch)
            return IndexMetrics(written, self._maybe_compact(engines))
        return finish

    @per_engine("row index inserts", DRIVER)
    def _local_inserts(self, hashed: pa.Table) -> pa.Table:
        """(h1, h2, n): copies per fingerprint, from the fingerprints on the driver."""
        grouped = hashed.group_by(["h1", "h2"]).aggregate([("h1", "count")])
        return pa.table({"h1": grouped["h1"], "h2": grouped["h2"], "n": grouped["h1_count"]})

    @per_engine("row index inserts", SPARK)
    def _spark_inserts(self, spark: SparkSession, df: DataFrame, batch: int) -> int:
        """(h1, h2, n): copies per fingerprint, computed in Spark and written to the index
        by its executors; returns the rows written."""
        from pyspark.sql import functions as F

        counts = self.fingerprints(df).groupBy("h1", "h2").agg(F.count(F.lit(1)).alias("n"))
        return self._write_from_spark(spark, counts, batch)

    def record_deletes(self, engines: Engines, df: Callable[[], DataFrame],
                       batch: int, display: str, arrow: pa.Table | None = None) -> IndexMetrics:
        """Checks every deleted row is live (enough copies), then removes them from the set.

        With ``arrow`` (the batch on the driver) and an index of at most
        ``local_index_rows`` rows (:mod:`incr.config`), the check runs on the driver; else
        in Spark over ``df``.

        Raises:
            InputError: naming the file and the first rows that are not live; nothing is
                recorded.
        """
        hashed = self._driver_fingerprints(engines, "deletes", arrow)
        removed = None
        if hashed is not None:
            assert arrow is not None
            try:
                removed = self._local_deletes(hashed, arrow, display,
                                              engines.settings.local_index_rows)
            except NotLocal as e:
                engines.fell_back("index", f"deletes of {self.table.name}", str(e))
        if removed is not None:
            self._append(removed, batch)
            rows = removed.num_rows
        else:
            rows = self._spark_deletes(engines.spark, df(), display, batch)
        return IndexMetrics(rows, self._maybe_compact(engines))

    def _driver_fingerprints(self, engines: Engines, what: str,
                             arrow: pa.Table | None) -> pa.Table | None:
        """The batch's fingerprints on the driver, or None when the step goes to Spark."""
        subject = f"{what} of {self.table.name}"
        rows = arrow.num_rows if arrow is not None else None
        if engines.choose("index", subject, rows=rows) != DRIVER:
            return None
        assert arrow is not None
        hashed = self.local_fingerprints(arrow)
        if hashed is None:
            engines.fell_back("index", subject, "a column type is not reproduced by sparkhash")
        return hashed

    @per_engine("row index deletes", DRIVER)
    def _local_deletes(self, hashed: pa.Table, arrow: pa.Table, display: str,
                       max_rows: int) -> pa.Table:
        """The index rows that remove ``arrow``'s rows, checked by pyarrow.

        Raises:
            NotLocal: the index is too large to read on the driver.
        """
        rows = self.store.row_count(self.path)
        if rows is None or rows > max_rows:
            raise NotLocal(f"the row index has {rows} rows > INCR_LOCAL_INDEX_ROWS={max_rows}")
        grouped = hashed.append_column(ROW, arrow[ROW]).group_by(["h1", "h2"]).aggregate(
            [(ROW, "count"), (ROW, "min")])
        wanted = pa.table({"h1": grouped["h1"], "h2": grouped["h2"],
                           "d": grouped[f"{ROW}_count"], "first_row": grouped[f"{ROW}_min"]})
        index = self.store.read(self.path, columns=["h1", "h2", "n"])
        index = index.filter(pc.is_in(index["h1"], value_set=wanted["h1"].combine_chunks()))
        summed = index.group_by(["h1", "h2"]).aggregate([("n", "sum")])
        live = pa.table({"h1": summed["h1"], "h2": summed["h2"], "live": summed["n_sum"]})
        joined = wanted.join(live, ["h1", "h2"], join_type="left outer")
        bad = joined.filter(pc.less(pc.fill_null(joined["live"], 0), joined["d"]))
        if bad.num_rows:
            names = [c.name for c in self.table.columns]
            offenders = [{**r, **arrow.slice(r["first_row"] - 1, 1).select(names).to_pylist()[0]}
                         for r in bad.sort_by("first_row").slice(0, SHOW_BAD_ROWS).to_pylist()]
            raise InputError(self._message(offenders, bad.num_rows), Location(display))
        return pa.table({"h1": wanted["h1"], "h2": wanted["h2"], "n": pc.negate(wanted["d"])})

    @per_engine("row index deletes", SPARK)
    def _spark_deletes(self, spark: SparkSession, df: DataFrame, display: str, batch: int) -> int:
        """The index rows that remove ``df``'s rows, checked by a semi-join in Spark and
        written to the index by its executors; returns the rows written."""
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
            removed = wanted.select("h1", "h2", (-F.col("d")).alias("n"))
            return self._write_from_spark(spark, removed, batch)
        finally:
            wanted.unpersist()

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
                         batch=batch, description=self._description())

    def _write_from_spark(self, spark: SparkSession, counts: DataFrame, batch: int) -> int:
        """:meth:`_append` of rows in Spark, written by its executors."""
        return write_delta(spark, self.store, self.path, counts, mode="append", batch=batch,
                           schema=_SCHEMA, description=self._description())

    def _description(self) -> str:
        return f"incr row index of {self.table.name}"

    def _maybe_compact(self, engines: Engines) -> bool:
        """Folds the log of ± counts once it holds too many files (fingerprints summing to
        0 go): on the driver while the index holds at most ``INCR_LOCAL_INDEX_ROWS`` rows,
        else by Spark's executors (the driver never holds a large index).  Returns True
        when it rewrote."""
        if self.store.file_count(self.path) <= ROW_INDEX_COMPACT_FILES:
            return False
        rows = self.store.row_count(self.path)
        if rows is not None and rows <= engines.settings.local_index_rows:
            self.store.write(self.path, self._local_compacted(), mode="overwrite", batch=None)
        else:
            self._spark_compact(engines.spark)
        self.store.vacuum_now(self.path)
        return True

    @per_engine("row index compaction", DRIVER)
    def _local_compacted(self) -> pa.Table:
        """The index folded to one row per live fingerprint, on the driver."""
        data = self.store.read(self.path)
        folded = data.group_by(["h1", "h2"]).aggregate([("n", "sum")]).rename_columns(
            ["h1", "h2", "n"])
        return folded.filter(pc.not_equal(folded["n"], 0)).cast(_SCHEMA)

    @per_engine("row index compaction", SPARK)
    def _spark_compact(self, spark: SparkSession) -> None:
        """The index folded to one row per live fingerprint, written by Spark's executors."""
        from pyspark.sql import functions as F

        folded = (read_delta(spark, self.store, str(self.path)).groupBy("h1", "h2")
                  .agg(F.sum("n").alias("n")).where(F.col("n") != 0))
        write_delta(spark, self.store, self.path, folded, mode="overwrite", batch=None)

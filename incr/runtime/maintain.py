"""Maintaining one view: ``state ← state ⊗ h(ΔS)`` (or ⊗̃ for deletes), then ``a(state)``.

Layout in the warehouse::

    WAREHOUSE/state/<view>/<state fingerprint>/<table>   Delta, partitioned by _bucket
    WAREHOUSE/answers/<view>                             Delta, one version per batch

Each state table and the answer table record the batches they committed, so applying a
batch to a view is idempotent at every step: after a crash, the tables already at the batch
are skipped and the rest catch up.  A changed view (new state fingerprint) gets a fresh
state directory and replays the ledger; the old directory is removed once it caught up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.plan import BUCKET, IncrementalPlan, MergeSpec, StateTable
from incr.errors import StorageError
from incr.runtime import faults
from incr.runtime.landing import DELETE
from incr.runtime.session import read_delta
from incr.runtime.store import DeltaStore
from incr.runtime.types import arrow_schema, nullable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COMPACT_FILES_PER_BUCKET = 4
ANSWER_FP = "incr.answer_fingerprint"


@dataclass
class ViewMetrics:
    """Timings and row counts of one view for one batch."""

    view: str
    batch: int
    h_s: float = 0.0
    merge_s: float = 0.0
    answer_s: float = 0.0
    state_rows_touched: int = 0
    answer_rows: int = 0
    tables: dict[str, dict] = field(default_factory=dict)


class ViewRuntime:
    """The state and answer tables of one view, and how batches reach them."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, spark: SparkSession,
                 warehouse: Path):
        self.plan = plan
        self.store = store
        self.spark = spark
        self.view_root = warehouse / "state" / plan.view
        self.state_root = self.view_root / plan.state_fingerprint
        self.answer_path = warehouse / "answers" / plan.view

    def table_path(self, table: str) -> Path:
        return self.state_root / table

    def state_through(self) -> int:
        """The last batch every main state table has applied (-1: none).

        Side tables of a join view only see their own input's batches, and a batch's side
        update commits before its answer, so the answer covers them.
        """
        return min(self.store.applied_through(self.table_path(t.name))
                   for t in self.plan.main_tables)

    def answer_through(self) -> int:
        """The batch the answer table reflects (-1: none, or written by another answer query)."""
        if self.store.last_commit_metadata(self.answer_path, ANSWER_FP) != self.plan.answer_fingerprint:
            return -1
        return self.store.applied_through(self.answer_path)

    def through(self) -> int:
        """The last batch fully applied: state and answer (-1: none)."""
        return min(self.state_through(), self.answer_through())

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str) -> ViewMetrics:
        """Folds a batch of ``source`` (temp view ``batch_view``) into state, then publishes a.

        For a join view, h reads Δjoined: the batch joined with the other inputs' side tables;
        the batch's own side table is updated after the main tables, so Δjoined never meets
        its own rows, and a re-run after a crash computes the same Δjoined.
        """
        metrics = ViewMetrics(self.plan.view, batch)
        specs = self.plan.diminish if kind == DELETE else self.plan.merge
        if kind == DELETE and len(specs) != len(self.plan.tables):
            raise StorageError(f"view {self.plan.view}: {self.plan.source} is append-only, yet a "
                               f"delete batch reached it")
        by_table = {s.table: s for s in specs}
        pending = [t for t in (*self.plan.main_tables, *self.plan.side_tables(source))
                   if self.store.applied_through(self.table_path(t.name)) < batch]
        joined = None
        if self.plan.join is not None and any(t.side_of is None for t in pending):
            joined = self._join_delta(source, batch_view)
        for table in pending:
            feed = batch_view if table.side_of is not None or joined is None else joined
            faults.crash_point("view.before_merge", batch)
            t0 = time.perf_counter()
            delta = self.spark.sql(self.plan.h_sql(table.name, feed)).toArrow()
            t1 = time.perf_counter()
            touched = self._merge(table, by_table[table.name], delta, batch, kind)
            t2 = time.perf_counter()
            metrics.h_s += t1 - t0
            metrics.merge_s += t2 - t1
            metrics.state_rows_touched += touched
            metrics.tables[table.name] = {"h_rows": delta.num_rows, "h_s": t1 - t0,
                                          "merge_s": t2 - t1}
            faults.crash_point("view.after_merge", batch)
        if joined is not None:
            self.spark.catalog.dropTempView(joined)
            self._joined_df.unpersist()
        faults.crash_point("view.after_state", batch)
        t3 = time.perf_counter()
        metrics.answer_rows = self.publish(batch)
        metrics.answer_s = time.perf_counter() - t3
        faults.crash_point("view.after_answer", batch)
        return metrics

    def _register_state(self, table: StateTable) -> str:
        name = f"incr_state_{self.plan.view}_{table.name}"
        read_delta(self.spark, self.store, str(self.table_path(table.name))).createOrReplaceTempView(name)
        return name

    def _join_delta(self, source: str, batch_view: str) -> str:
        """Registers Δjoined for a batch of ``source`` (cached: every main table's h reads it)."""
        assert self.plan.join is not None
        sides = {}
        for inp in self.plan.join.inputs:
            if inp.table.lower() == source.lower():
                continue
            table = self.plan.table(f"side_{inp.alias}")
            if self.store.exists(self.table_path(table.name)):
                sides[inp.alias] = self._register_state(table)
            else:  # that input has had no batch yet: the join is empty
                return self._as_view(self.spark.createDataFrame(
                    arrow_schema(self.plan.source_columns).empty_table()))
        return self._as_view(self.spark.sql(self.plan.join_delta_sql(source, batch_view, sides))
                             .cache())

    def _as_view(self, df: DataFrame) -> str:
        name = f"incr_joined_{self.plan.view}"
        self._joined_df = df
        df.createOrReplaceTempView(name)
        return name

    def _merge(self, table: StateTable, spec: MergeSpec, delta: pa.Table, batch: int,
               kind: str) -> int:
        path = self.table_path(table.name)
        sort_by = (BUCKET, *table.key_columns)
        if not self.store.exists(path):
            if kind == DELETE and delta.num_rows:
                raise StorageError(f"view {self.plan.view}: deletions reached state table "
                                   f"{table.name} before any insert; the row index should "
                                   f"have rejected them")
            # state ⊗ h(ΔS) with an empty state is h(ΔS) itself.
            data = delta.sort_by([(c, "ascending") for c in sort_by]) if delta.num_rows else delta
            self.store.write(path, data.cast(nullable(delta.schema)), mode="append", batch=batch,
                             partition_by=[BUCKET], description=self._description(table))
            return delta.num_rows
        merge = (self.store.merge(path, delta)
                 .on(spec.keys, buckets=delta.column(BUCKET).to_pylist())
                 .when_matched_delete(spec.delete_when)
                 .when_matched_update(dict(spec.updates)))
        if spec.insert_unmatched:
            merge = merge.when_not_matched_insert_all()
        result = merge.for_batch(batch).execute()
        if kind == DELETE and result.updated + result.deleted != result.source_rows:
            raise StorageError(
                f"view {self.plan.view}: {result.source_rows - result.updated - result.deleted} "
                f"rows of h(ΔS') matched no state row in {table.name}; the state is out of step "
                f"with the row index. Rebuild the view (delete WAREHOUSE/state/{self.plan.view}).")
        self.store.compact(path, sort_by, COMPACT_FILES_PER_BUCKET * self.plan.buckets)
        return result.source_rows

    def _description(self, table: StateTable) -> str:
        return (f"incr state {table.name} of view {self.plan.view} (program {self.plan.program}, "
                f"state {self.plan.state_fingerprint}); keyed by {', '.join(table.key_columns) or '()'}")

    # -- the answer --------------------------------------------------------------------------
    def compute_answer(self) -> pa.Table:
        """a(state) from the current state tables."""
        views = {t.name: self._register_state(t) for t in self.plan.main_tables}
        return self.spark.sql(self.plan.answer_sql(views)).toArrow()

    def publish(self, batch: int) -> int:
        """Writes a(state) as the answer table's version for ``batch`` (once)."""
        if self.answer_through() >= batch:
            return -1
        answer = self.compute_answer()
        self.store.write(self.answer_path, answer.cast(nullable(answer.schema)), mode="overwrite",
                         batch=batch, replace_schema=True,
                         description=f"incr answer of view {self.plan.view} (program "
                                     f"{self.plan.program})",
                         metadata={ANSWER_FP: self.plan.answer_fingerprint,
                                   "incr.state_fingerprint": self.plan.state_fingerprint,
                                   "incr.program": self.plan.program, "incr.batch": str(batch)})
        return answer.num_rows

    def drop_stale_state(self) -> None:
        """Removes state directories of earlier versions of this view."""
        if not self.view_root.is_dir():
            return
        for child in self.view_root.iterdir():
            if child.is_dir() and child.name != self.plan.state_fingerprint:
                self.store.remove(child)

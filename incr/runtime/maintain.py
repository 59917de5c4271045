"""Maintaining one view: ``state ← state ⊗ h(ΔS)`` (or ⊗̃ for deletes), then ``a(state)``.

Layout in the warehouse::

    WAREHOUSE/state/<view>/<state fingerprint>/<table>   Delta, partitioned by _bucket
    WAREHOUSE/answers/<view>                             Delta, one version per batch

A view is one or more stages (see :class:`~incr.compiler.plan.StagePlan`), producers
first.  A batch of a source flows through every stage it reaches, in order.  Changes move
between stages as *signed rows* (``_w``: +n copies in, -n copies out): a batch of a
source is all +1 or all -1, and a stage whose output feeds another hands on, per batch, the
rows its output lost (old values of the groups the batch touched) and gained (new values).

Per stage and batch:

1. Δ of the stage's input: the changed input itself, or for a join the sum over the subsets
   of changed inputs joined with the other inputs' side tables (before this batch).
2. Its main tables (aggregate state and bags) are updated:

   * *fast path*, when every row of Δ has the same sign and no stage reads this one:
     ``MERGE state ⊗ h(Δ)`` (or ⊗̃), the Delta MERGE of the seed paper;
   * otherwise the new rows of the touched keys are computed in Spark as
     ``old ⊗ h(Δ⁺) ⊗̃ h(Δ⁻)`` with the same monoid expressions, the stage's output change
     (new rows minus old rows of those keys) is written to its *outbox*, and the new rows
     replace the old ones in one MERGE;
   * a *streaming* stage (linear, read by another stage: a plain FROM subquery or UNION ALL
     branch, a join's rows before the aggregate above it) stores no main table at all:
     its outbox is h(Δ⁺) − h(Δ⁻), the output change of a bag of projected rows.

3. The side tables of the changed inputs are updated with a signed MERGE (⊗±).

Every table records the batches it committed, so applying a batch is idempotent at every
step: after a crash, tables already at the batch are skipped and the rest catch up.  The
order (outbox, then main tables, then side tables) keeps each recomputation identical to
the first attempt: Δ reads side tables that only change last, and the outbox is written
before the state it is computed from changes.  A changed view (new state fingerprint)
gets a fresh state directory and replays the ledger; the old directory is removed once it
caught up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.plan import BUCKET, ROW_COUNT, WEIGHT, IncrementalPlan, MergeSpec, StagePlan, StateTable
from incr.compiler.sqlgen import (
    delta_sign,
    q,
    render_anti_delta,
    render_combined,
    render_explode,
    render_rows,
    render_stage_delta,
)
from incr.errors import StorageError
from incr.runtime import faults
from incr.runtime.landing import DELETE
from incr.runtime.local import LocalFold, LocalSql, NotLocal
from incr.runtime.session import TempViews, read_delta
from incr.runtime.store import DeltaStore
from incr.runtime.types import arrow_schema, nullable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from incr.runtime.engine import Engines

COMPACT_FILES_PER_BUCKET = 4
ANSWER_FP = "incr.answer_fingerprint"
SIGNED = "signed"


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


@dataclass(frozen=True)
class _Delta:
    """Δ of a stage's input: a registered view, its sign (0: mixed) and whether its rows are
    plain (a source batch, one copy per row, no ``_w``) rather than signed."""

    view: str
    sign: int
    plain: bool = False


class ViewRuntime:
    """The state and answer tables of one view, and how batches reach them."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path):
        self.plan = plan
        self.store = store
        self.engines = engines
        self.view_root = warehouse / "state" / plan.view
        self.state_root = self.view_root / plan.state_fingerprint
        self.answer_path = warehouse / "answers" / plan.view
        self._ready = False
        self._views = TempViews(engines, f"incr_{plan.view}_")
        self._duck: LocalFold | None = None  # set while a fold runs on the driver
        self._register: Callable[[], None] | None = None  # makes the batch's temp view

    @property
    def spark(self) -> SparkSession:
        """The run's SparkSession (started on first use)."""
        return self.engines.spark

    @property
    def local(self) -> LocalSql | None:
        """The driver-side engine, when enabled."""
        return self.engines.local

    def table_path(self, table: str) -> Path:
        return self.state_root / table

    def _through(self, table: str) -> int:
        return self.store.applied_through(self.table_path(table))

    def state_through(self) -> int:
        """The last batch every main state table of the view's own stage has applied (-1: none).

        Every batch the view reads reaches its own stage (all stages feed it), and a batch's
        other tables commit before the answer, so the answer covers them.
        """
        return min(self._through(t.name) for t in self.plan.main_tables)

    def answer_through(self) -> int:
        """The batch the answer table reflects (-1: none, or written by another answer query)."""
        if self.store.last_commit_metadata(self.answer_path, ANSWER_FP) != self.plan.answer_fingerprint:
            return -1
        return self.store.applied_through(self.answer_path)

    def through(self) -> int:
        """The last batch fully applied: state and answer (-1: none)."""
        return min(self.state_through(), self.answer_through())

    # -- temporary views ---------------------------------------------------------------------
    def _view(self, name: str, df: DataFrame, cache: bool = False) -> str:
        return self._views.register(name, df, cache)

    def _sql_view(self, name: str, sql: str, cache: bool = False) -> str:
        if self._duck is not None:
            return self._duck.view(f"{self._views.prefix}{name}", sql)
        return self._view(name, self.spark.sql(sql), cache)

    def _collect(self, sql: str, table: str) -> pa.Table:
        """The rows of ``sql`` that go into state table ``table`` (its schema, on the driver)."""
        if self._duck is not None:
            return self._duck.collect(sql, self.store.schema(self.table_path(table)))
        return self.spark.sql(sql).toArrow()

    def _release(self) -> None:
        self._views.release()

    def _state_view(self, table: str) -> str:
        if self._duck is not None:  # small state only (no row count recorded: assume large)
            path = self.table_path(table)
            rows = self.store.row_count(path)
            if rows is None or rows > self.local.max_state_rows:
                raise NotLocal(table)
            return self._duck.table(f"{self._views.prefix}state_{table}", self.store.read(path))
        return self._view(f"state_{table}", read_delta(self.spark, self.store,
                                                       str(self.table_path(table))))

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None) -> ViewMetrics:
        """Folds a batch of ``source`` (temp view ``batch_view``) into state, then publishes a.

        ``arrow``, when given, holds the batch's rows on the driver (the caller passes it only
        for a batch small enough): the fold may then run there (:mod:`incr.runtime.local`).
        ``register``, when given, makes the temp view: it is called before Spark reads it.
        """
        metrics = ViewMetrics(self.plan.view, batch)
        if kind == DELETE and any(s.append_only and self.plan.depends_on(s, source)
                                  for s in self.plan.stages):
            raise StorageError(f"view {self.plan.view}: {source} is append-only, yet a delete "
                               f"batch reached it")
        self.fold(batch, source, batch_view, -1 if kind == DELETE else 1, metrics, arrow,
                  register)
        faults.crash_point("view.after_state", batch)
        t3 = time.perf_counter()
        metrics.answer_rows = self.publish(batch)
        metrics.answer_s = time.perf_counter() - t3
        faults.crash_point("view.after_answer", batch)
        return metrics

    def fold(self, batch: int, source: str, view: str, sign: int, metrics: ViewMetrics,
             arrow: pa.Table | None = None, register: Callable[[], None] | None = None) -> None:
        """Folds changes of ``source`` into every stage they reach; the answer is not written.

        ``view`` holds plain rows, all inserted (``sign`` +1) or all deleted (-1), or with
        ``sign`` 0 signed rows (a ``_w`` column of ±copies).  ``batch`` is the number every
        table records, which makes folding it again a no-op.
        """
        self.ensure_tables()
        reached = [s for s in self.plan.stages if self.plan.depends_on(s, source)]
        names = {s.name for s in reached}
        moved = {(s.name, i.alias) for s in reached for i in s.inputs
                 if (i.derived and i.table in names) or
                 (not i.derived and i.table.lower() == source.lower())}
        tables = [t.name for s in reached for t in self.plan.stored(s)
                  if t.side_of is None or (s.name, t.side_of) in moved]
        tables += [s.outbox for s in reached if s.outbox in self.plan.outboxes()]
        if all(self._through(t) >= batch for t in tables):
            return  # committed everywhere (and outboxes may have moved on to later numbers)
        self._register = register
        try:
            if (arrow is not None and self.local is not None and sign != 0
                    and all(self._local_capable(s) for s in reached)):
                self._duck = self.local.session()
                try:
                    self._duck.table(view, arrow)
                    self._fold_stages(batch, source, view, sign, metrics)
                    return
                except NotLocal:
                    pass  # tables this attempt committed are at the batch: Spark skips them
                finally:
                    self._duck.close()
                    self._duck = None
            self._spark_batch()
            self._fold_stages(batch, source, view, sign, metrics)
        finally:
            self._register = None
            self._release()

    def _fold_stages(self, batch: int, source: str, view: str, sign: int,
                     metrics: ViewMetrics) -> None:
        """:meth:`fold`'s work, on whichever engine is current (Spark, or the driver's)."""
        if sign == 0 or all(s.direct for s in self.plan.stages
                            if self.plan.depends_on(s, source)):
            signed = view  # direct stages read the plain batch (see _stage_delta)
        else:
            signed = self._sql_view(f"batch_{source}", f"SELECT *, CAST({sign} AS BIGINT) "
                                    f"AS {q(WEIGHT)} FROM {view}")
        outboxes: dict[str, str] = {}
        for stage in self.plan.stages:
            if not self.plan.depends_on(stage, source):
                continue
            changes: dict[str, tuple[str, int]] = {}
            for inp in stage.inputs:
                if inp.derived and inp.table in outboxes:
                    changes[inp.alias] = (outboxes[inp.table], 0)
                elif not inp.derived and inp.table.lower() == source.lower():
                    changes[inp.alias] = (signed, sign)
            virtual = self._apply_stage(stage, batch, changes, view, metrics)
            if virtual is not None:
                outboxes[stage.name] = virtual
            elif self.plan.consumers(stage.name):
                outboxes[stage.name] = self._outbox_view(stage, batch)

    def _local_capable(self, stage: StagePlan) -> bool:
        """True when the driver may fold a batch into the stage: it reads declared sources
        only, keeps its own state and hands nothing on, so Δ needs the batch and the side
        tables, and every result is a MERGE into a state table (no outbox)."""
        return (not self.plan.virtual(stage) and not self.plan.streams(stage)
                and not self.plan.consumers(stage.name)
                and not any(i.derived for i in stage.inputs))

    def _spark_batch(self) -> None:
        """Makes sure Spark can read the batch's temp view."""
        if self._register is not None:
            self._register()
            self._register = None

    def _apply_stage(self, stage: StagePlan, batch: int, changes: dict[str, tuple[str, int]],
                     batch_view: str, metrics: ViewMetrics) -> str | None:
        """Applies the batch to one stage; returns a virtual stage's output changes (a view)."""
        if self.plan.virtual(stage):
            t0 = time.perf_counter()
            view = self._sql_view(f"out_{stage.name}", self._passed_on(
                stage, self._stage_delta(stage, changes, batch_view)), cache=True)
            metrics.h_s += time.perf_counter() - t0
            return view
        pending = [t for t in self.plan.stored(stage)
                   if t.side_of is None and self._through(t.name) < batch]
        sides = [t for t in stage.tables if t.side_of is not None and t.side_of in changes]
        pending_sides = [t for t in sides if self._through(t.name) < batch]
        outbox = bool(self.plan.consumers(stage.name)) and \
            self.store.applied_through(self.table_path(stage.outbox)) < batch
        if pending or outbox:
            delta = self._stage_delta(stage, changes, batch_view)
            if self.plan.streams(stage):
                self._pass_on(stage, delta, batch, metrics)
            elif delta.sign != 0 and not outbox:
                self._fast_merge(stage, pending, delta, batch, metrics)
            else:
                self._combine_merge(stage, pending, delta, batch, outbox, metrics)
        for table in pending_sides:
            t0 = time.perf_counter()
            delta = self._collect(self.plan.h_sql(table.name, changes[table.side_of][0]), table.name)
            t1 = time.perf_counter()
            spec = next(s for s in stage.signed if s.table == table.name)
            touched = self._merge(table, spec, delta, batch, SIGNED)
            self._record(metrics, table.name, delta.num_rows, t1 - t0, time.perf_counter() - t1,
                         touched)
        return None

    def _stage_delta(self, stage: StagePlan, changes: dict[str, tuple[str, int]],
                     batch_view: str) -> _Delta:
        """Δ of the stage's input as a registered view of signed rows, with its sign.

        A direct stage over a declared source reads the batch itself (plain rows, one copy
        each, all of the batch's sign).
        """
        if stage.direct:
            (view, sign), = changes.values()
            return _Delta(batch_view, sign, plain=True) if sign != 0 else _Delta(view, 0)
        sides = {t.side_of: self._state_view(t.name) for t in stage.tables if t.side_of}
        anti = {}
        for branch in stage.branches:
            for a in branch.join.anti:
                if a.input.alias in changes and a.input.alias not in anti:
                    anti[a.input.alias] = self._sql_view(
                        f"dz_{stage.name}_{a.input.alias}",
                        render_anti_delta(a, changes[a.input.alias][0], sides[a.input.alias]),
                        cache=True)
        sql = render_stage_delta(stage, changes, sides, anti)
        assert sql is not None, f"stage {stage.name} was reached, yet none of its inputs changed"
        return _Delta(self._sql_view(f"delta_{stage.name}", sql, cache=True),
                      delta_sign(stage, changes))

    def _rows(self, delta: _Delta, stage: StagePlan, positive: bool | None) -> str:
        """Plain rows (one per copy) of the insertions, deletions or (None) all of Δ."""
        if delta.plain:
            return delta.view
        return self._sql_view(f"rows_{stage.name}_{positive}", render_explode(delta.view, positive))

    def _split(self, delta: _Delta, stage: StagePlan) -> tuple[str, str]:
        """Plain rows of Δ's insertions and of its deletions (one per copy), as two views."""
        if delta.plain:  # a batch of a source: one sign, one copy per row
            rows = self._sql_view(f"rows_{stage.name}", f"SELECT * FROM {delta.view}")
            empty = self._sql_view(f"none_{stage.name}", f"SELECT * FROM {delta.view} WHERE FALSE")
            return (rows, empty) if delta.sign > 0 else (empty, rows)
        return self._rows(delta, stage, True), self._rows(delta, stage, False)

    def _pass_on(self, stage: StagePlan, delta: _Delta, batch: int, metrics: ViewMetrics) -> None:
        """A streaming stage (:meth:`IncrementalPlan.streams`): its output change is h(Δ).

        Rows gained are h of Δ's insertions, rows lost h of its deletions; no state of the
        stage's own is read or written, only its outbox.
        """
        t0 = time.perf_counter()
        self._store_outbox(stage, self._passed_on(stage, delta), batch)
        metrics.h_s += time.perf_counter() - t0

    def _passed_on(self, stage: StagePlan, delta: _Delta) -> str:
        """SQL of a streaming stage's output changes: h(Δ⁺) gained, h(Δ⁻) lost."""
        main = stage.main_tables[0]
        plus, minus = self._split(delta, stage)
        gained = self._sql_view(f"hp_{main.name}", self.plan.h_sql(main.name, plus))
        lost = self._sql_view(f"hn_{main.name}", self.plan.h_sql(main.name, minus))
        return self._outbox_sql(stage, {main.name: lost}, {main.name: gained})

    def _fast_merge(self, stage: StagePlan, pending: list[StateTable], delta: _Delta,
                    batch: int, metrics: ViewMetrics) -> None:
        """``MERGE state ⊗ h(Δ)`` (⊗̃ for deletions) per pending table: Δ has one sign."""
        sign = delta.sign
        rows = self._rows(delta, stage, None)
        specs = {s.table: s for s in (stage.diminish if sign < 0 else stage.merge)}
        for table in pending:
            faults.crash_point("view.before_merge", batch)
            t0 = time.perf_counter()
            h = self._collect(self.plan.h_sql(table.name, rows), table.name)
            t1 = time.perf_counter()
            touched = self._merge(table, specs[table.name], h, batch, DELETE if sign < 0 else "insert")
            self._record(metrics, table.name, h.num_rows, t1 - t0, time.perf_counter() - t1, touched)
            faults.crash_point("view.after_merge", batch)

    def _combine_merge(self, stage: StagePlan, pending: list[StateTable], delta: _Delta,
                       batch: int, outbox: bool, metrics: ViewMetrics) -> None:
        """New rows of the touched keys computed in Spark, the outbox written, then upserts."""
        t0 = time.perf_counter()
        plus, minus = self._split(delta, stage)
        merges = {s.table: s for s in stage.merge}
        diminishes = {s.table: s for s in stage.diminish}
        old_views: dict[str, str] = {}
        new_views: dict[str, str] = {}
        changed: dict[str, str] = {}
        main = stage.main_tables[0]
        touched_keys = None
        for table in stage.main_tables:
            hp = self._sql_view(f"hp_{table.name}", self.plan.h_sql(table.name, plus), cache=True)
            hn = self._sql_view(f"hn_{table.name}", self.plan.h_sql(table.name, minus), cache=True)
            theta = [k.name for k in table.keys]
            if table is main:
                touched_keys = self._sql_view(
                    f"touched_{stage.name}",
                    f"SELECT DISTINCT {', '.join([q(BUCKET)] + [q(k) for k in theta])} FROM "
                    f"(SELECT * FROM {hp} UNION ALL SELECT * FROM {hn})", cache=True)
            # Old rows: every row of a touched θ (a bag's unchanged values count for a too).
            on = " AND ".join([f"t.{q(BUCKET)} = k.{q(BUCKET)}"] +
                              [f"t.{q(k)} <=> k.{q(k)}" for k in theta])
            state = self._state_view(table.name)
            old = self._sql_view(f"old_{table.name}",
                                 f"SELECT t.* FROM {state} AS t LEFT SEMI JOIN {touched_keys} AS k "
                                 f"ON {on}", cache=True)
            has_minus = diminishes.get(table.name) is not None
            new = self._sql_view(f"new_{table.name}", render_combined(
                table, merges[table.name], diminishes.get(table.name), old, hp,
                hn if has_minus else None), cache=True)
            keys = ", ".join([q(BUCKET)] + [q(k) for k in table.key_columns])
            changed[table.name] = self._sql_view(
                f"changed_{table.name}",
                f"SELECT n.* FROM {new} AS n LEFT SEMI JOIN (SELECT DISTINCT {keys} FROM "
                f"(SELECT * FROM {hp} UNION ALL SELECT * FROM {hn})) AS k ON "
                + " AND ".join([f"n.{q(BUCKET)} = k.{q(BUCKET)}"] +
                               [f"n.{q(c)} <=> k.{q(c)}" for c in table.key_columns]))
            live = f" WHERE {q(ROW_COUNT)} <> 0" if table.vanishes else ""
            old_views[table.name] = old
            new_views[table.name] = self._sql_view(f"live_{table.name}", f"SELECT * FROM {new}{live}")
        metrics.h_s += time.perf_counter() - t0
        if outbox:
            self._write_outbox(stage, old_views, new_views, batch)
        for table in pending:
            faults.crash_point("view.before_merge", batch)
            t1 = time.perf_counter()
            rows = self._collect(f"SELECT * FROM {changed[table.name]}", table.name)
            t2 = time.perf_counter()
            touched = self._upsert(table, rows, batch)
            self._record(metrics, table.name, rows.num_rows, t2 - t1, time.perf_counter() - t2, touched)
            faults.crash_point("view.after_merge", batch)

    def _write_outbox(self, stage: StagePlan, old: dict[str, str], new: dict[str, str],
                      batch: int) -> None:
        """Writes the stage's output change: its new rows of the touched keys minus the old."""
        self._store_outbox(stage, self._outbox_sql(stage, old, new), batch)

    def _outbox_sql(self, stage: StagePlan, old: dict[str, str], new: dict[str, str]) -> str:
        """Signed rows: the stage's output over ``new`` state views minus over ``old``."""
        before = render_rows(stage.answer, old)
        after = render_rows(stage.answer, new)
        cols = ", ".join(q(c) for c in stage.output)
        sql = (f"SELECT {cols}, CAST(sum({q(WEIGHT)}) AS BIGINT) AS {q(WEIGHT)} FROM (\n"
               f"SELECT * FROM ({after})\nUNION ALL\nSELECT {cols}, -{q(WEIGHT)} AS {q(WEIGHT)} "
               f"FROM ({before})) GROUP BY {cols} HAVING sum({q(WEIGHT)}) <> 0")
        return sql

    def _store_outbox(self, stage: StagePlan, sql: str, batch: int) -> None:
        if self._duck is not None:  # outboxes are for stages the driver does not fold
            raise NotLocal(stage.outbox)
        data = self.spark.sql(sql).toArrow()
        path = self.table_path(stage.outbox)
        self.store.write(path, data.cast(nullable(self.store.schema(path))), mode="overwrite",
                         batch=batch)

    def _outbox_view(self, stage: StagePlan, batch: int) -> str:
        path = self.table_path(stage.outbox)
        through = self.store.applied_through(path)
        if through != batch:
            raise StorageError(f"view {self.plan.view}: the output changes of stage {stage.name} "
                               f"are at batch {through}, not {batch}; rebuild the view (delete "
                               f"WAREHOUSE/state/{self.plan.view})")
        return self._view(f"out_{stage.name}", read_delta(self.spark, self.store, str(path)))

    def _record(self, metrics: ViewMetrics, table: str, rows: int, h_s: float, merge_s: float,
                touched: int) -> None:
        metrics.h_s += h_s
        metrics.merge_s += merge_s
        metrics.state_rows_touched += touched
        metrics.tables[table] = {"h_rows": rows, "h_s": h_s, "merge_s": merge_s}

    # -- writing state -----------------------------------------------------------------------
    def _merge(self, table: StateTable, spec: MergeSpec, delta: pa.Table, batch: int,
               kind: str) -> int:
        path = self.table_path(table.name)
        sort_by = (BUCKET, *table.key_columns)
        if kind != DELETE and delta.num_rows and self.store.is_empty(path):
            # state ⊗ h(ΔS) with an empty state is h(ΔS) itself.
            data = delta.sort_by([(c, "ascending") for c in sort_by])
            self.store.append(path, data, batch=batch)
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

    def _upsert(self, table: StateTable, rows: pa.Table, batch: int) -> int:
        """Replaces the touched rows by their new values; a vanishing row at count 0 goes."""
        path = self.table_path(table.name)
        gone = f"s.{ROW_COUNT} = 0" if table.vanishes else None
        merge = (self.store.merge(path, rows)
                 .on(table.key_columns, buckets=rows.column(BUCKET).to_pylist())
                 .when_matched_delete(gone)
                 .when_matched_update_all()
                 .when_not_matched_insert_all(f"s.{ROW_COUNT} <> 0" if table.vanishes else None))
        result = merge.for_batch(batch).execute()
        self.store.compact(path, (BUCKET, *table.key_columns),
                           COMPACT_FILES_PER_BUCKET * self.plan.buckets)
        return result.source_rows

    def _description(self, name: str, keys: tuple[str, ...]) -> str:
        return (f"incr state {name} of view {self.plan.view} (program {self.plan.program}, "
                f"state {self.plan.state_fingerprint}); keyed by {', '.join(keys) or '()'}")

    # -- creating the state: h(∅) -------------------------------------------------------------
    def ensure_tables(self) -> None:
        """Creates every missing state table with its content for no input at all, h(∅).

        That is empty for grouped state, the identity row for a global aggregate (SQL
        answers one row over no rows), and for a side table mirroring a stage, that
        stage's output over nothing.  Spark computes it all over empty sources, which also
        fixes every table's schema before the first batch, whichever source it comes from.
        """
        if self._ready:
            return
        paths = [t.name for s in self.plan.stages for t in self.plan.stored(s)]
        paths += list(self.plan.outboxes())
        if all(self.store.exists(self.table_path(p)) for p in paths):
            self._ready = True
            return
        try:
            self._create_tables()
        finally:
            self._release()
        self._ready = True

    def _create_tables(self) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        sources = {}
        for decl in self.plan.source_tables:
            name = decl.name
            empty = arrow_schema(decl.columns).empty_table()
            empty = empty.append_column(WEIGHT, pa.array([], pa.int64()))
            sources[name.lower()] = self._view(f"empty_{name}", self.spark.createDataFrame(empty))
        outputs: dict[str, str] = {}
        for stage in self.plan.stages:
            inputs = {i.alias: (outputs[i.table] if i.derived else sources[i.table.lower()], 0)
                      for i in stage.inputs}
            sides: dict[str, str] = {}
            for table in stage.tables:
                if table.side_of is None:
                    continue
                df = self.spark.sql(self.plan.h_sql(table.name, inputs[table.side_of][0]))
                sides[table.side_of] = self._view(f"init_{table.name}", df)
                self._create(table.name, df, table.key_columns, to_arrow_schema)
            if stage.direct:
                delta = inputs[stage.inputs[0].alias][0]
            else:  # one changed input per branch: every branch's columns, as one union
                empty_sides = {a: self._sql_view(f"void_{a}", f"SELECT * FROM {v} WHERE FALSE")
                               for a, v in sides.items()}
                first = {b.join.inputs[0].alias for b in stage.branches}
                anti = {a.input.alias: render_anti_delta(a, inputs[a.input.alias][0],
                                                         empty_sides[a.input.alias])
                        for b in stage.branches for a in b.join.anti if a.input.alias in first}
                delta = self._sql_view(f"init_delta_{stage.name}", render_stage_delta(
                    stage, {a: inputs[a] for a in first}, empty_sides, anti))
            rows = self._sql_view(f"init_rows_{stage.name}", f"SELECT * FROM {delta} WHERE FALSE")
            state: dict[str, str] = {}
            for table in stage.main_tables:
                df = self.spark.sql(self.plan.h_sql(table.name, rows))
                state[table.name] = self._view(f"init_{table.name}", df)
                if table in self.plan.stored(stage):
                    self._create(table.name, df, table.key_columns, to_arrow_schema)
            out = self.spark.sql(render_rows(stage.answer, state))
            outputs[stage.name] = self._view(f"init_out_{stage.name}", out)
            if stage.outbox in self.plan.outboxes():
                self._create(stage.outbox, out.where("FALSE"), (), to_arrow_schema)

    def _create(self, table: str, df: DataFrame, keys: tuple[str, ...], to_arrow_schema) -> None:
        path = self.table_path(table)
        if self.store.exists(path):
            return
        data = df.toArrow()
        schema = nullable(to_arrow_schema(df.schema))
        data = data.cast(schema) if data.num_rows else schema.empty_table()
        partition = [BUCKET] if BUCKET in schema.names else None
        self.store.write(path, data, mode="append", batch=None, partition_by=partition,
                         description=self._description(table, keys))

    # -- the answer --------------------------------------------------------------------------
    def compute_answer(self, published: bool | None = None) -> pa.Table:
        """a(state) from the current state tables (on the driver when the state is small).

        ``published``: whether this answer query has published before (its table's schema
        is then the target of the driver's result); None reads it from the answer table.
        """
        if published is None:
            published = self.answer_through() >= 0
        answer = self._local_answer() if published and self.local is not None else None
        if answer is not None:
            return answer
        try:
            views = {t.name: self._state_view(t.name) for t in self.plan.main_tables}
            return self.spark.sql(self.plan.answer_sql(views)).toArrow()
        finally:
            self._release()

    def _local_answer(self) -> pa.Table | None:
        """a(state) by DuckDB over the state read with delta-rs (the driver's fold session),
        cast to the schema Spark gave the published answer; None (use Spark) when a state
        table is large or the query is outside the driver-side set."""
        self._duck = self.local.session()
        try:
            views = {t.name: self._state_view(t.name) for t in self.plan.main_tables}
            return self._duck.collect(self.plan.answer_sql(views), self.store.schema(self.answer_path))
        except NotLocal:
            return None
        finally:
            self._duck.close()
            self._duck = None

    def publish(self, batch: int) -> int:
        """Writes a(state) as the answer table's version for ``batch`` (once)."""
        through = self.answer_through()
        if through >= batch:
            return -1
        answer = self.compute_answer(published=through >= 0)
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

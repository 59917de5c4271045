"""Maintaining one view: ``state ← state ⊗ h(ΔS)`` (or ⊗̃ for deletes), then ``a(state)``.

:class:`ViewRuntime` is a view's entry point.  It puts together the view's state tables
(:mod:`~incr.runtime.state`), the fold of a batch through its stages
(:mod:`~incr.runtime.fold`) and its answer table (:mod:`~incr.runtime.answer`), and it is
where the engine of a fold is chosen: the driver when the change (a batch, or an iterate's
move) is on the driver and small, whatever stages it reaches (their side tables are read
where they meet the change, their outboxes handed on as small tables); Spark otherwise, or
when a driver-side step gives way (tables the driver already committed are at the batch, so
Spark skips them).

A changed view (new state fingerprint) gets a fresh state directory and replays the
ledger; the old directory is removed once it caught up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from incr.compiler.plan import IncrementalPlan, StagePlan
from incr.errors import StorageError
from incr.runtime import faults
from incr.runtime.answer import AnswerTable
from incr.runtime.engine import DRIVER, SPARK, Engines, NotLocal
from incr.runtime.fold import Fold, ViewMetrics
from incr.runtime.landing import DELETE
from incr.runtime.state import ViewState
from incr.runtime.store import DeltaStore

__all__ = ["ViewMetrics", "ViewRuntime"]


class ViewRuntime:
    """The state and answer tables of one view, and how batches reach them."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path):
        self.plan = plan
        self.store = store
        self.engines = engines
        self.state = ViewState(plan, store, warehouse, engines)
        self.answer = AnswerTable(plan, store, self.state, engines, warehouse)
        self.view_root = self.state.view_root
        self.state_root = self.state.root
        self.answer_path = self.answer.path

    def table_path(self, table: str) -> Path:
        return self.state.path(table)

    # -- progress ------------------------------------------------------------------------------
    def state_through(self) -> int:
        """The last batch every main state table of the view's own stage has applied (-1: none).

        Every batch the view reads reaches its own stage (all stages feed it), and a batch's
        other tables commit before the answer, so the answer covers them.
        """
        return min(self.state.through(t.name) for t in self.plan.main_tables)

    def answer_through(self) -> int:
        """The batch the answer table reflects (-1: none, or written by another answer query)."""
        return self.answer.through()

    def through(self) -> int:
        """The last batch fully applied: state and answer (-1: none)."""
        return min(self.state_through(), self.answer_through())

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None) -> ViewMetrics:
        """Folds a batch of ``source`` (temp view ``batch_view``) into state, then publishes a.

        ``arrow``, when given, holds the batch's rows on the driver: the fold may then run
        there.  ``register``, when given, makes the batch's Spark temp view: it is called
        before Spark reads it.
        """
        metrics = ViewMetrics(self.plan.view, batch)
        if kind == DELETE and any(s.append_only and self.plan.depends_on(s, source)
                                  for s in self.plan.stages):
            raise StorageError(f"view {self.plan.view}: {source} is append-only, yet a delete "
                               f"batch reached it")
        # The answer may follow by change only from the state it was computed from: both at
        # the same batch before this fold (not, say, state already folded by a crashed run).
        answer_at = self.answer.through()
        in_step = answer_at >= 0 and answer_at == self.state_through() < batch
        touched = self.fold(batch, source, batch_view, -1 if kind == DELETE else 1, metrics,
                            arrow, register)
        faults.crash_point("view.after_state", batch)
        t3 = time.perf_counter()
        metrics.answer_rows = self.answer.publish(batch, touched if in_step else None,
                                                  metrics)
        metrics.answer_s = time.perf_counter() - t3
        faults.crash_point("view.after_answer", batch)
        return metrics

    def fold(self, batch: int, source: str, view: str, sign: int, metrics: ViewMetrics,
             arrow: pa.Table | None = None,
             register: Callable[[], None] | None = None) -> pa.Table | None:
        """Folds changes of ``source`` into every stage they reach; the answer is not written.

        ``view`` holds plain rows, all inserted (``sign`` +1) or all deleted (-1), or with
        ``sign`` 0 signed rows (a ``_w`` column of ±copies).  ``batch`` is the number every
        table records, which makes folding it again a no-op.  Returns θ (and bucket) of the
        view's groups this fold changed, None when it did not fold the view's own stage.
        """
        self.state.ensure_tables(self.engines)
        reached = [s for s in self.plan.stages if self.plan.depends_on(s, source)]
        if all(self.state.through(t) >= batch for t in self._written(reached, source)):
            return None  # committed everywhere (and outboxes may have moved on to later numbers)
        subject = f"batch {batch} of {source} into view {self.plan.view}"
        rows = arrow.num_rows if arrow is not None else None
        if self.engines.choose("fold", subject, rows=rows) == DRIVER:
            assert arrow is not None
            engine = self.engines.engine(DRIVER, self.store)
            fold = Fold(self.plan, self.state, engine, metrics)
            try:
                engine.table(view, arrow)
                fold.run(batch, source, view, sign)
                metrics.engine = DRIVER
                return fold.touched
            except NotLocal as e:
                self.engines.fell_back("fold", subject, str(e))
                touched = fold.touched  # Spark skips the tables the driver committed
            finally:
                engine.close()
        else:
            touched = None
        if register is not None:
            register()
        engine = self.engines.engine(SPARK, self.store)
        try:
            fold = Fold(self.plan, self.state, engine, metrics)
            fold.run(batch, source, view, sign)
            metrics.engine = SPARK
            return fold.touched if fold.touched is not None else touched
        finally:
            engine.close()

    def _written(self, reached: list[StagePlan], source: str) -> list[str]:
        """The tables a batch of ``source`` writes: the stages' own state, the side tables
        of the inputs it changes, and the outboxes (and kept rows) of stages others read."""
        names = {s.name for s in reached}
        moved = {(s.name, i.alias) for s in reached for i in s.inputs
                 if (i.derived and i.table in names) or
                 (not i.derived and i.table.lower() == source.lower())}
        tables = [t.name for s in reached for t in self.plan.stored(s)
                  if t.side_of is None or (s.name, t.side_of) in moved]
        return (tables + [s.outbox for s in reached if s.outbox in self.plan.outboxes()]
                + [t.name for t in self.plan.kept() if self.plan.stage_of(t.name) in reached])

    def ensure_tables(self) -> None:
        """Creates every missing state table (h(∅)); see :meth:`ViewState.ensure_tables`."""
        self.state.ensure_tables(self.engines)

    # -- the answer --------------------------------------------------------------------------
    def compute_answer(self, published: bool | None = None) -> pa.Table:
        """a(state) from the current state tables (see :meth:`AnswerTable.compute`)."""
        return self.answer.compute(published)

    def publish(self, batch: int) -> int:
        """Writes a(state) as the answer table's version for ``batch`` (once)."""
        return self.answer.publish(batch)

    def drop_stale_state(self) -> None:
        """Removes state directories of earlier versions of this view."""
        self.state.drop_stale()

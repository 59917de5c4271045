"""Maintaining one view: ``state ← state ⊗ h(ΔS)`` (or ⊗̃ for deletes), then ``a(state)``.

:class:`ViewRuntime` is a view's entry point.  It puts together the view's state tables
(:mod:`~incr.runtime.state`), the fold of a batch through its stages
(:mod:`~incr.runtime.fold`) and its answer table (:mod:`~incr.runtime.answer`), and it is
where the engine of a fold is chosen: the driver when the change (a batch, or an iterate's
move) is on the driver and small, whatever stages it reaches (their side tables are read
where they meet the change, their outboxes handed on as small tables); Spark otherwise, or
when a driver-side step gives way (tables the driver already committed are at the batch, so
Spark skips them).

**Build, then swap.**  A changed view (new state fingerprint), a changed answer query or a
full refresh (``incr refresh``: a new state generation) replays the ledger into its new
state beside the old one, and publishes nothing while it does: the answer table keeps
serving the old definition's last version, and time travel keeps showing what was
published at each batch.  Only at the last batch the run applies does the new answer
replace it, in one commit.  The old state directory stays until then, so a change that is
rejected or abandoned midway leaves the old view as it was (going back rebuilds nothing);
once the new answer is published the old state is removed.
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
        self.answer_path = self.answer.path

    @property
    def state_root(self) -> Path:
        """The directory of the view's current state generation."""
        return self.state.root

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

    def publish_at(self, batches: list[int]) -> int:
        """The first of ``batches`` (the batch numbers a run is about to apply to the view,
        ascending) whose answer the run publishes: every one's (-1) when the answer table
        is this view's, or there is none yet (a new view's versions show it as of each
        batch); when it shows a previous definition or state generation, only the last
        one's, so the view builds its new state while the old answer is served, and swaps
        in one commit once caught up."""
        if not batches or self.answer_through() >= 0 or self.answer.served()[0] < 0:
            return -1
        return batches[-1]

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None, publish_at: int = -1) -> ViewMetrics:
        """Folds a batch of ``source`` (temp view ``batch_view``) into state, then publishes a.

        ``arrow``, when given, holds the batch's rows on the driver: the fold may then run
        there.  ``register``, when given, makes the batch's Spark temp view: it is called
        before Spark reads it.  ``publish_at``: a batch before it is not published (see
        :meth:`publish_at`).
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
        if held_back(metrics, batch, publish_at):
            return metrics
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

    def drop_stale_state(self) -> list[str]:
        """Removes the state of other versions and generations of this view but the one its
        served answer was computed from, until this one has published (a change rejected
        or abandoned midway then costs no rebuild to go back); returns the names removed."""
        keep = None if self.answer.through() >= 0 else self.answer.served()[1]
        return self.state.drop_stale(keep)

    def refresh(self) -> Path:
        """Starts a full refresh: a new, empty state generation that the next batches build
        from batch 0 beside the current one, which keeps being served until the new one
        has caught up (the caller holds the view's lock)."""
        return self.state.new_generation()


def held_back(metrics: ViewMetrics, batch: int, publish_at: int) -> bool:
    """Whether ``batch``'s answer is not published (a rebuild catching up); noted in
    ``metrics``."""
    if batch >= publish_at:
        return False
    metrics.answer_mode = "building"
    metrics.answer_rows = -1
    return True

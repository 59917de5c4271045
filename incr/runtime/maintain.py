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
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from incr.compiler.plan import IncrementalPlan, StagePlan
from incr.errors import StorageError
from incr.runtime import faults
from incr.runtime.answer import AnswerTable
from incr.runtime.engine import DRIVER, SPARK, Engines, NotLocal
from incr.runtime.fold import Fold, ViewMetrics
from incr.runtime.landing import DELETE
from incr.runtime.session import SparkEngine
from incr.runtime.state import ViewState
from incr.runtime.store import DeltaStore
from incr.runtime.touchlog import union_touched

__all__ = ["Change", "ViewMetrics", "ViewRuntime", "WrappedRuntime", "union_touched"]


@dataclass(frozen=True)
class Change:
    """One batch of a source as a fold reads it: its source table, the name its rows are
    registered under, those rows on the driver (None: Spark reads them) and what makes
    Spark's temp view of them (None: nothing to do)."""

    source: str
    view: str
    arrow: pa.Table | None = None
    register: Callable[[], None] | None = None


class ViewRuntime:
    """The state and answer tables of one view, and how batches reach them."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path, state: ViewState | None = None):
        """``state``: the state object of another view sharing this one's
        (:attr:`IncrementalPlan.shares`), so the first of them to take a batch folds it
        and the others publish from what it folded."""
        self.plan = plan
        self.store = store
        self.engines = engines
        self.state = state or ViewState(plan, store, warehouse, engines)
        self.answer = AnswerTable(plan, store, self.state, engines, warehouse)
        self.view_root = self.state.view_root
        self.answer_path = self.answer.path

    @property
    def state_root(self) -> Path:
        """The directory of the view's current state generation."""
        return self.state.root

    def pin(self, holding: Callable[[], int | None]) -> None:
        """Tells the state how to know that the view's lock is held (:attr:`ViewState.pin`)."""
        self.state.pin = holding

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

    # -- one batch, or batches of several sources as one step ---------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None, publish_at: int = -1) -> ViewMetrics:
        """Folds a batch of ``source`` (temp view ``batch_view``) into state, then publishes a.

        ``arrow``, when given, holds the batch's rows on the driver: the fold may then run
        there.  ``register``, when given, makes the batch's Spark temp view: it is called
        before Spark reads it.  ``publish_at``: a batch before it is not published (see
        :meth:`publish_at`).
        """
        return self.apply_together(batch, kind, [Change(source, batch_view, arrow, register)],
                                   publish_at)

    def apply_together(self, batch: int, kind: str, changes: list[Change],
                       publish_at: int = -1) -> ViewMetrics:
        """Folds batches of distinct sources, all of ``kind``, as one step numbered ``batch``
        (the last of them), then publishes a once: see :meth:`together` for which batches
        may be folded so."""
        metrics = ViewMetrics(self.plan.view, batch)
        for change in changes:
            if kind == DELETE and any(s.append_only and self.plan.depends_on(s, change.source)
                                      for s in self.plan.stages):
                raise StorageError(f"view {self.plan.view}: {change.source} is append-only, yet "
                                   f"a delete batch reached it")
        # The answer may follow by change only from the state it was computed from: both at
        # the same batch before this fold (not, say, state already folded by a crashed run).
        answer_at = self.answer.through()
        before = self.state_through()
        touched = self._fold(batch, changes, -1 if kind == DELETE else 1, metrics)
        if touched is not None or metrics.engine:
            self.state.folded = (batch, before, touched)
            if (self.plan.shares is not None and touched is not None and 0 <= before < batch
                    and touched.num_rows <= self.engines.settings.local_state_rows):
                self.state.touch_log.record(batch, before, touched)
        elif self.plan.shares is not None and self.state.folded[0] == batch:
            _, before, touched = self.state.folded  # another view sharing the state folded it
            metrics.engine = "shared"
        in_step = answer_at >= 0 and answer_at == before < batch
        # Rows the fold of ``batch`` kept for the answer cover the groups of that fold only.
        noted = in_step
        if (not in_step and self.plan.shares is not None and 0 <= answer_at < batch
                and self.state_through() == batch == self.furthest()):
            # Another view's task (another process) folded the shared state, maybe over
            # several batches since this view's answer: the groups they touched are logged.
            logged = self.state.touch_log.since(answer_at, batch)
            if logged is not None:
                touched, in_step, noted = logged, True, False
                metrics.engine = metrics.engine or "shared"
        faults.crash_point("view.after_state", batch)
        if held_back(metrics, batch, publish_at):
            return metrics
        if touched is None and self.furthest() > batch:
            # A stopped run folded this batch with later ones as one step: the state holds
            # those too, so its answer is published by the step's last batch, not as this one.
            metrics.answer_mode, metrics.answer_rows = "ahead", -1
            return metrics
        t3 = time.perf_counter()
        metrics.answer_rows = self.answer.publish(batch, touched if in_step else None,
                                                  metrics, noted=noted)
        metrics.answer_s = time.perf_counter() - t3
        faults.crash_point("view.after_answer", batch)
        return metrics

    def together(self, pending: list[tuple[int, str, str]]) -> int:
        """How many of ``pending`` (number, source and kind of the batches this view folds
        next, ascending) it folds as one step.

        A step is batches of distinct sources and one kind: their changes are folded at
        once, every table records the step's last batch, and a is published once.  A run
        that stopped midway through a step left some tables at its last batch: exactly
        that step is folded again (the tables at it are skipped, the others catch up), so
        no table takes a batch twice and every outbox holds the change its readers expect;
        0 when ``pending`` does not reach its end (the view waits for a run that reads
        it).  A first batch every table it writes has committed is taken alone: the fold
        skips it.
        """
        first, source, kind = pending[0]
        end = self.resumes(first, source)
        if end >= 0:
            count = sum(1 for seq, _, _ in pending if seq <= end)
            return count if count and pending[count - 1][0] == end else 0
        if self._committed(first, source):
            return 1
        count, sources = 1, {source.lower()}
        for _, other, other_kind in pending[1:]:
            if other_kind != kind or other.lower() in sources:
                break
            count += 1
            sources.add(other.lower())
        return count

    def resumes(self, first: int, source: str) -> int:
        """The last batch of the step a stopped run began with batch ``first`` (of
        ``source``), or -1 when none did: some table is past ``first`` while one that
        batch writes is not at it yet."""
        if self._committed(first, source):
            return -1
        furthest = self.furthest()
        return furthest if furthest >= first else -1

    def _committed(self, batch: int, source: str) -> bool:
        """Whether every table a batch of ``source`` writes records ``batch`` or later."""
        reached = [s for s in self.plan.stages if self.plan.depends_on(s, source)]
        return all(self.state.through(t) >= batch for t in self._written(reached, [source]))

    def furthest(self) -> int:
        """The last batch any table of the view committed (-1: none)."""
        every = self._written(list(self.plan.stages), sorted(self.plan.sources))
        return max((self.state.through(t) for t in every), default=-1)

    def fold(self, batch: int, source: str, view: str, sign: int, metrics: ViewMetrics,
             arrow: pa.Table | None = None,
             register: Callable[[], None] | None = None) -> pa.Table | None:
        """Folds changes of ``source`` into every stage they reach; the answer is not written.

        ``view`` holds plain rows, all inserted (``sign`` +1) or all deleted (-1), or with
        ``sign`` 0 signed rows (a ``_w`` column of ±copies).  ``batch`` is the number every
        table records, which makes folding it again a no-op.  Returns θ (and bucket) of the
        view's groups this fold changed, None when it did not fold the view's own stage.
        """
        return self._fold(batch, [Change(source, view, arrow, register)], sign, metrics)

    def _fold(self, batch: int, changes: list[Change], sign: int,
              metrics: ViewMetrics) -> pa.Table | None:
        """:meth:`fold` of the changes of one or more sources, all of ``sign``."""
        self.state.ensure_tables(self.engines)
        sources = [c.source for c in changes]
        reached = [s for s in self.plan.stages
                   if any(self.plan.depends_on(s, source) for source in sources)]
        if all(self.state.through(t) >= batch for t in self._written(reached, sources)):
            return None  # committed everywhere (and outboxes may have moved on to later numbers)
        subject = f"batch {batch} of {', '.join(sources)} into view {self.plan.view}"
        arrows = [c.arrow for c in changes]
        rows = None if any(a is None for a in arrows) else sum(a.num_rows for a in arrows if a)
        folded = [(c.source, c.view, sign) for c in changes]
        if self.engines.choose("fold", subject, rows=rows) == DRIVER:
            engine = self.engines.engine(DRIVER, self.store)
            fold = Fold(self.plan, self.state, engine, metrics)
            try:
                for c in changes:
                    assert c.arrow is not None
                    engine.table(c.view, c.arrow)
                fold.run_together(batch, folded)
                metrics.engine = DRIVER
                return fold.touched
            except NotLocal as e:
                self.engines.fell_back("fold", subject, str(e))
                touched = fold.touched  # Spark skips the tables the driver committed
            finally:
                engine.close()
        else:
            touched = None
        for c in changes:
            if c.register is not None:
                c.register()
        engine = self.engines.engine(SPARK, self.store)
        try:
            fold = Fold(self.plan, self.state, engine, metrics)
            fold.run_together(batch, folded)
            metrics.engine = SPARK
            return fold.touched if fold.touched is not None else touched
        finally:
            engine.close()

    def _written(self, reached: list[StagePlan], sources: list[str]) -> list[str]:
        """The tables batches of ``sources`` write: the stages' own state, the side tables
        of the inputs they change, and the outboxes (and kept rows) of stages others read."""
        names = {s.name for s in reached}
        lowered = {source.lower() for source in sources}
        moved = {(s.name, i.alias) for s in reached for i in s.inputs
                 if (i.derived and i.table in names) or
                 (not i.derived and i.table.lower() in lowered)}
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
        if keep is not None:  # the name of a generation of this view's state directory, if any
            owner, _, generation = keep.rpartition("/")
            keep = generation if owner == (self.plan.shares or "") else None
        return self.state.drop_stale(keep)

    def refresh(self) -> Path:
        """Starts a full refresh: a new, empty state generation that the next batches build
        from batch 0 beside the current one, which keeps being served until the new one
        has caught up (the caller holds the view's lock)."""
        return self.state.new_generation()


class WrappedRuntime:
    """A view kept by the :class:`ViewRuntime` of its plan and a relation beside it (an
    iterative view's iterate, a recursive view's fixpoint).

    Its progress and answer are the inner runtime's; each batch's folds into the inner
    state are numbered ``batch * NUMBERS + 0 .. NUMBERS - 1`` (subclasses set NUMBERS).
    """

    NUMBERS = 1

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path):
        self.plan = plan
        self.store = store
        self.engines = engines
        self.inner = ViewRuntime(plan, store, engines, warehouse)
        self.answer_path = self.inner.answer_path
        # Spark temp views of rows held on the driver, for a fold that runs in Spark.
        self._spark_views = SparkEngine(engines, store)

    @property
    def answer(self) -> AnswerTable:
        """The inner runtime's answer table (the view's)."""
        return self.inner.answer

    def _state_number(self) -> int:
        """The last number every main state table of the inner runtime committed (-1: none)."""
        return min(self.store.applied_through(self.inner.table_path(t.name))
                   for t in self.plan.main_tables)

    def state_through(self) -> int:
        number = self._state_number()
        return number // self.NUMBERS if number >= 0 else -1

    def answer_through(self) -> int:
        return self.inner.answer_through()

    def through(self) -> int:
        return min(self.state_through(), self.answer_through())

    def publish_at(self, batches: list[int]) -> int:
        return self.inner.publish_at(batches)

    def publish(self, batch: int) -> int:
        return self.inner.publish(batch)

    def compute_answer(self) -> pa.Table:
        return self.inner.compute_answer()

    def drop_stale_state(self) -> list[str]:
        return self.inner.drop_stale_state()

    def pin(self, holding: Callable[[], int | None]) -> None:
        self.inner.pin(holding)

    def refresh(self) -> Path:
        return self.inner.refresh()

    def table_path(self, table: str) -> Path:
        return self.inner.table_path(table)

    def _through(self, path: Path) -> int:
        """The last number the table at ``path`` committed (-1: none, or no table)."""
        return self.store.applied_through(path) if self.store.exists(path) else -1

    def _registrar(self, name: str, rows: pa.Table) -> Callable[[], None]:
        """Makes ``rows`` the Spark temp view ``name`` when a Spark fold asks for it."""
        def register() -> None:
            self._spark_views.table(name, rows)

        return register


def held_back(metrics: ViewMetrics, batch: int, publish_at: int) -> bool:
    """Whether ``batch``'s answer is not published (a rebuild catching up); noted in
    ``metrics``."""
    if batch >= publish_at:
        return False
    metrics.answer_mode = "building"
    metrics.answer_rows = -1
    return True

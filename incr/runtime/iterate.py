"""The loop of an iterative view: Algorithm 1 of the seed paper over the step's state.

The step is compiled as an ordinary view that reads the previous iterate X as one more
source (:mod:`incr.compiler.iterate`); its answer a(T) is the next iterate.  A batch of a
source is applied like this::

    T ← T ⊗ h(X, ΔS)                    the batch, against the current iterate
    (first batch only) ΔX ← +g(ΔS)      the INITIAL rows, as a change of X
    repeat up to n-1 times (n on the first batch):
        ΔX ← a(T) ⊖ X                   rows of the next iterate that differ (by more than
                                        TOLERANCE) from X: the diffusion's frontier
        stop when ΔX is empty
        T ← T ⊗ h(ΔX)                   joined X: the rows of S meeting the changed keys, via
                                        the side tables; looked-up X: the batch's own rows,
                                        re-evaluated (old rows keep their assignment)
        X ← X ⊕ ΔX
    publish a(T)

so each batch runs n steps of the iteration warm-started from the previous answer, and a
step only touches the state reachable from what changed.  On the first batch this is
exactly the iteration from INITIAL.

Every move is numbered (``batch * MOVES + 2j`` and ``+ 2j + 1``) and each table records the
numbers it committed, so a crash at any point resumes where it stopped: ΔX is written to a
Delta table before it is applied, and X is committed last in each move.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.iterate import (
    INITIAL_SOURCE,
    apply_dx_sql,
    dx_sql,
    extend_sql,
    initial_dx_sql,
    lookup_pairs_sql,
    reassigned_sql,
    typed_sql,
)
from incr.compiler.plan import WEIGHT, IncrementalPlan
from incr.runtime import faults
from incr.runtime.landing import DELETE
from incr.runtime.maintain import ViewMetrics, ViewRuntime
from incr.runtime.session import SparkEngine, read_delta
from incr.runtime.store import DeltaStore
from incr.runtime.types import arrow_schema, nullable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.runtime.engine import Engines

#: Numbers per batch: a batch's moves are numbered batch * MOVES + 0 .. MOVES - 1.
MOVES = 2048
SEED = "incr.seed_batch"


def view_runtime(plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path) -> ViewRuntime | IterativeRuntime:
    """The runtime of a view: the loop for an iterative view, else the plain one."""
    if plan.iteration is not None:
        return IterativeRuntime(plan, store, engines, warehouse)
    return ViewRuntime(plan, store, engines, warehouse)


class IterativeRuntime:
    """An iterative view: its step's :class:`ViewRuntime` and the iterate X beside it."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path):
        assert plan.iteration is not None
        self.plan = plan
        self.it = plan.iteration
        self.store = store
        self.engines = engines
        self.step = ViewRuntime(plan, store, engines, warehouse)
        self.answer_path = self.step.answer_path
        self.iterate_path = self.step.state_root / "_iterate"
        self.dx_path = self.step.state_root / "_dx"
        self.log: list[dict] = []  # per batch: moves and |ΔX| (read by benchmarks and tests)
        self._views = SparkEngine(engines, store)  # the loop runs in Spark

    @property
    def spark(self) -> SparkSession:
        """The run's SparkSession (the loop runs there; started on first use)."""
        return self.engines.spark

    # -- progress, as ViewRuntime ------------------------------------------------------------
    def state_through(self) -> int:
        tables = [self.step.store.applied_through(self.step.table_path(t.name))
                  for t in self.plan.main_tables]
        return min(tables) // MOVES if min(tables) >= 0 else -1

    def answer_through(self) -> int:
        return self.step.answer_through()

    def through(self) -> int:
        return min(self.state_through(), self.answer_through())

    def publish(self, batch: int) -> int:
        return self.step.publish(batch)

    def compute_answer(self) -> pa.Table:
        return self.step.compute_answer()

    def drop_stale_state(self) -> None:
        self.step.drop_stale_state()

    def table_path(self, table: str) -> Path:
        return self.step.table_path(table)

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None) -> ViewMetrics:
        """Folds the batch, runs the loop, then publishes the new iterate.

        The loop runs in Spark, so ``arrow`` (the batch on the driver) is not used and the
        batch's temp view is made (``register``) before anything reads it.
        """
        if register is not None:
            register()
        metrics = ViewMetrics(self.plan.view, batch)
        base = batch * MOVES
        first = not self.store.exists(self.iterate_path) or self._seed_batch() == batch
        sign = -1 if kind == DELETE else 1
        lookups = [lk for lk in self.it.lookups if lk.table.lower() == source.lower()]
        trace = {"batch": batch, "moves": 0, "dx_rows": []}
        try:
            x_old = self._iterate_view("x_start")
            view = self._extend(batch_view, lookups, x_old, "start") if lookups else batch_view
            self.step.fold(base, source, view, sign, metrics)
            moves = self.it.iterations if first else self.it.iterations - 1
            done = max(self._through(self.iterate_path) - base, 0) // 2
            for j in range(done + 1, moves + 1):
                dx = self._dx(base + 2 * j, first and j == 1, batch_view, source)
                rows = self.spark.table(dx).count()
                trace["dx_rows"].append(rows)
                if rows == 0:
                    break
                trace["moves"] = j
                x_old = self._iterate_view(f"x_{j}")
                x_new = self._apply_dx(x_old, dx, j)
                if self.it.joined:
                    self.step.fold(base + 2 * j, self.it.name, dx, 0, metrics)
                if lookups and sign > 0:
                    moved = self._reassigned(batch_view, lookups, x_old, x_new, j)
                    self.step.fold(base + 2 * j + 1, source, moved, 0, metrics)
                self._write_iterate(x_new, base + 2 * j + 1, batch if first else None)
                faults.crash_point("iterate.after_move", batch)
        finally:
            self._release()
        self.log.append(trace)
        faults.crash_point("view.after_state", batch)
        t0 = time.perf_counter()
        metrics.answer_rows = self.publish(batch)
        metrics.answer_s = time.perf_counter() - t0
        faults.crash_point("view.after_answer", batch)
        return metrics

    # -- the iterate X -----------------------------------------------------------------------
    def _through(self, path: Path) -> int:
        return self.store.applied_through(path) if self.store.exists(path) else -1

    def _seed_batch(self) -> int | None:
        value = self.store.last_commit_metadata(self.iterate_path, SEED)
        return int(value) if value is not None else None

    def _iterate_view(self, name: str) -> str:
        if self.store.exists(self.iterate_path):
            df = read_delta(self.spark, self.store, str(self.iterate_path))
        else:
            df = self.spark.createDataFrame(nullable(arrow_schema(self.it.columns)).empty_table())
        return self._view(name, df, cache=True)

    def _write_iterate(self, view: str, number: int, seed_batch: int | None) -> None:
        data = self.spark.table(view).toArrow()
        data = data.cast(nullable(arrow_schema(self.it.columns)))
        seed = seed_batch if seed_batch is not None else self._seed_batch()
        self.store.write(self.iterate_path, data, mode="overwrite", batch=number,
                         description=f"incr iterate of view {self.plan.view}: the X the state "
                                     f"was last moved to",
                         metadata={SEED: str(seed)} if seed is not None else None)

    def _dx(self, number: int, seed: bool, batch_view: str, source: str) -> str:
        """ΔX for move ``number``: read back if written before a crash, else computed."""
        if self._through(self.dx_path) == number:
            return self._view(f"dx_{number}", read_delta(self.spark, self.store,
                                                         str(self.dx_path)), cache=True)
        if seed:
            for table in self.it.initial_tables:
                rows = batch_view if table.lower() == source.lower() else self._empty(table)
                self.spark.table(rows).createOrReplaceTempView(INITIAL_SOURCE + table.lower())
            sql = initial_dx_sql(self.it)
        else:
            sql = self._diff()
        data = self.spark.sql(sql).toArrow()
        schema = nullable(arrow_schema(self.it.columns))
        schema = schema.append(pa.field(WEIGHT, pa.int64()))
        self.store.write(self.dx_path, data.cast(schema), mode="overwrite", batch=number,
                         description=f"incr ΔX of view {self.plan.view} for the move being applied")
        for table in self.it.initial_tables:
            self.spark.catalog.dropTempView(INITIAL_SOURCE + table.lower())
        return self._view(f"dx_{number}", self.spark.createDataFrame(data.cast(schema)),
                          cache=True)

    def _empty(self, table: str) -> str:
        decl = next(t for t in self.plan.source_tables if t.name.lower() == table.lower())
        return self._view(f"empty_{table}", self.spark.createDataFrame(
            nullable(arrow_schema(decl.columns)).empty_table()))

    def _diff(self) -> str:
        """a(T) ⊖ X: new rows (+1) and the old rows they replace (-1), beyond TOLERANCE."""
        state = {t.name: self._view(f"state_{t.name}", read_delta(
            self.spark, self.store, str(self.step.table_path(t.name)))) for t in self.plan.main_tables}
        new = self._view("next", self.spark.sql(typed_sql(self.it, self.plan.answer_sql(state))),
                         cache=True)
        return dx_sql(self.it, new, self._iterate_view("x_diff"))

    def _apply_dx(self, x_old: str, dx: str, j: int) -> str:
        """X ⊕ ΔX: rows whose key ΔX removes go, its new rows come."""
        return self._view(f"x_new_{j}", self.spark.sql(apply_dx_sql(self.it, x_old, dx)), cache=True)

    # -- looked-up X -------------------------------------------------------------------------
    def _extend(self, batch_view: str, lookups, x: str, name: str) -> str:
        """The batch with each lookup's column computed against iterate ``x``."""
        return self._view(f"ext_{name}", self.spark.sql(extend_sql(self.it, lookups, batch_view, x)))

    def _reassigned(self, batch_view: str, lookups, x_old: str, x_new: str, j: int) -> str:
        """The batch's rows whose lookups change from ``x_old`` to ``x_new``: out, then in."""
        pairs = self._view(f"lk_{j}", self.spark.sql(
            lookup_pairs_sql(self.it, lookups, batch_view, x_old, x_new)), cache=True)
        columns = [f.name for f in self.spark.table(batch_view).schema.fields]
        return self._view(f"moved_{j}", self.spark.sql(reassigned_sql(lookups, pairs, columns)))

    # -- temp views (our own: the step's are dropped at the end of each fold) ----------------
    def _view(self, name: str, df, cache: bool = False) -> str:
        return self._views.frame(f"incr_{self.plan.view}_it_{name}", df, cache)

    def _release(self) -> None:
        self._views.close()

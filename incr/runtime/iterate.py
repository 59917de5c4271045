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

**Cost follows the frontier.**  ``a(T) ⊖ X`` is only computed for the step's groups that a
fold changed since they were last compared (the fold reports them): a group no fold touched
has the a(T) row it had when last compared, and X's row of it only changes by ΔX, so it
cannot differ now if it did not then.  That needs a per-group step answer (every θ shown,
see :mod:`incr.compiler.publish`) and an exact record of the touched groups; the first
batch (INITIAL moves X without a comparison), a resumed run and a per-row answer compare
every group instead.  The groups touched by a batch's last move, not compared yet, are
kept in ``_frontier`` for the next batch, valid only for the state version they were
written after.  A move whose ΔX and tables are small runs on the driver-side engine
(DuckDB, :class:`~incr.runtime.engine.Engines`), so a batch that moves few ranks starts
no Spark job; looked-up X (k-means) runs in Spark.

Every move is numbered (``batch * MOVES + 2j`` and ``+ 2j + 1``) and each table records the
numbers it committed, so a crash at any point resumes where it stopped: ΔX is written to a
Delta table before it is applied, and X is committed last in each move.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from incr.compiler.iterate import (
    INITIAL_SOURCE,
    apply_dx_sql,
    dx_sql,
    extend_sql,
    frontier_rows_sql,
    initial_dx_sql,
    lookup_pairs_sql,
    reassigned_sql,
    typed_sql,
)
from incr.compiler.plan import BUCKET, IncrementalPlan
from incr.compiler.sqlgen import render_all, render_old_rows
from incr.runtime import faults
from incr.runtime.engine import DRIVER, Engine
from incr.runtime.landing import DELETE
from incr.runtime.maintain import (
    ViewMetrics,
    ViewRuntime,
    WrappedRuntime,
    held_back,
    union_touched,
)
from incr.runtime.recursion import RecursiveRuntime
from incr.runtime.state import ViewState
from incr.runtime.store import DeltaStore
from incr.runtime.types import arrow_schema, nullable, signed

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.runtime.engine import Engines

log = logging.getLogger("incr.runtime")

#: Numbers per batch: a batch's moves are numbered batch * MOVES + 0 .. MOVES - 1.
MOVES = 2048
SEED = "incr.seed_batch"


def view_runtime(plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path, state: ViewState | None = None,
                 ) -> ViewRuntime | IterativeRuntime | RecursiveRuntime:
    """The runtime of a view: the loop for an iterative view, the fixpoint beside the query
    for a recursive one, else the plain one (with ``state``, when given: the state object of
    the views it shares state with)."""
    if plan.iteration is not None:
        return IterativeRuntime(plan, store, engines, warehouse)
    if plan.recursion is not None:
        return RecursiveRuntime(plan, store, engines, warehouse)
    return ViewRuntime(plan, store, engines, warehouse, state)


def _once(register: Callable[[], None] | None) -> Callable[[], None] | None:
    """``register``, doing its work on the first call only (the fold and INITIAL both ask)."""
    if register is None:
        return None
    done: list[bool] = []

    def once() -> None:
        if not done:
            register()
            done.append(True)

    return once


class IterativeRuntime(WrappedRuntime):
    """An iterative view: its step's :class:`ViewRuntime` and the iterate X beside it."""

    NUMBERS = MOVES

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path):
        super().__init__(plan, store, engines, warehouse)
        assert plan.iteration is not None
        self.it = plan.iteration
        self.step = self.inner
        self.log: list[dict] = []  # per batch: moves and |ΔX| (read by benchmarks and tests)
        self._x_schema = nullable(arrow_schema(self.it.columns))
        self._dx_schema = signed(self._x_schema)

    @property
    def iterate_path(self) -> Path:
        """X, beside the step's state (in its current generation)."""
        return self.step.state_root / "_iterate"

    @property
    def dx_path(self) -> Path:
        return self.step.state_root / "_dx"

    @property
    def frontier_path(self) -> Path:
        return self.step.state_root / "_frontier"

    @property
    def spark(self) -> SparkSession:
        """The run's SparkSession (started on first use)."""
        return self.engines.spark

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None, publish_at: int = -1) -> ViewMetrics:
        """Folds the batch, runs the loop, then publishes the new iterate.

        ``arrow`` (the batch on the driver) lets the batch's fold and the first batch's
        INITIAL run on the driver; ``register`` makes the batch's Spark temp view, called
        before Spark reads it; a batch before ``publish_at`` is not published
        (:meth:`ViewRuntime.publish_at`).
        """
        metrics = ViewMetrics(self.plan.view, batch)
        register = _once(register)
        base = batch * MOVES
        first = not self.store.exists(self.iterate_path) or self._seed_batch() == batch
        sign = -1 if kind == DELETE else 1
        lookups = [lk for lk in self.it.lookups if lk.table.lower() == source.lower()]
        trace = {"batch": batch, "moves": 0, "dx_rows": []}
        answer_at = self.step.answer.through()
        in_step = answer_at >= 0 and answer_at == self.state_through() < batch
        # Groups whose a(T) was not compared with X yet: from the last batch, then each fold's.
        pending = None if first else self._frontier(self._state_number())
        try:
            if lookups:  # every row looks X up in Spark (see incr.compiler.iterate)
                if register is not None:
                    register()
                x_old = self._x_for_lookups("x_start")
                view = self._lookup_view("ext_start", extend_sql(self.it, lookups, batch_view, x_old))
                touched = self.step.fold(base, source, view, sign, metrics)
            else:
                touched = self.step.fold(base, source, batch_view, sign, metrics, arrow, register)
            changed = touched  # every group this batch changed: what the answer follows
            pending = None if first else union_touched(pending, touched)
            moves = self.it.iterations if first else self.it.iterations - 1
            done = max(self._through(self.iterate_path) - base, 0) // 2
            if done:  # resumed after a crash: the folds before it were not seen
                pending = changed = None
            for j in range(done + 1, moves + 1):
                number = base + 2 * j
                seed = first and j == 1
                dx = self._dx(number, seed, arrow, batch_view, source, register, pending)
                trace["dx_rows"].append(dx.num_rows)
                # Every pending group was just compared; INITIAL compares none.
                pending = self._no_groups() if self._restricts() and not seed else None
                if dx.num_rows == 0:
                    break
                trace["moves"] = j
                x_old = self._read_iterate()
                x_new = self._apply_dx(x_old, dx)
                if self.it.joined:
                    name = f"incr_{self.plan.view}_it_dx_{number}"
                    t = self.step.fold(number, self.it.name, name, 0, metrics, dx,
                                       self._registrar(name, dx))
                    pending, changed = union_touched(pending, t), union_touched(changed, t)
                if lookups and sign > 0:
                    reassigned = self._reassigned(batch_view, lookups, x_old, x_new, j)
                    t = self.step.fold(number + 1, source, reassigned, 0, metrics)
                    pending, changed = union_touched(pending, t), union_touched(changed, t)
                self._write_iterate(x_new, number + 1, batch if first else None)
                faults.crash_point("iterate.after_move", batch)
            self._write_frontier(pending)
        finally:
            self._spark_views.close()
        self.log.append(trace)
        faults.crash_point("view.after_state", batch)
        if held_back(metrics, batch, publish_at):
            return metrics
        t0 = time.perf_counter()
        metrics.answer_rows = self.step.answer.publish(
            batch, changed if in_step and not first else None, metrics)
        metrics.answer_s = time.perf_counter() - t0
        faults.crash_point("view.after_answer", batch)
        return metrics

    # -- the iterate X, ΔX and the frontier --------------------------------------------------
    def _seed_batch(self) -> int | None:
        value = self.store.last_commit_metadata(self.iterate_path, SEED)
        return int(value) if value is not None else None

    def _read_iterate(self) -> pa.Table:
        if not self.store.exists(self.iterate_path):
            return self._x_schema.empty_table()
        return self.store.read(self.iterate_path).cast(self._x_schema)

    def _iterate(self, engine: Engine, name: str) -> str:
        """Registers the current X on ``engine`` (no rows before the first batch)."""
        if self.store.exists(self.iterate_path):
            return engine.delta(name, self.iterate_path)
        return engine.table(name, self._x_schema.empty_table())

    def _write_iterate(self, data: pa.Table, number: int, seed_batch: int | None) -> None:
        seed = seed_batch if seed_batch is not None else self._seed_batch()
        self.store.write(self.iterate_path, data.cast(self._x_schema), mode="overwrite",
                         batch=number,
                         description=f"incr iterate of view {self.plan.view}: the X the state "
                                     f"was last moved to",
                         metadata={SEED: str(seed)} if seed is not None else None)

    def _restricts(self) -> bool:
        """Whether ΔX may be compared over the touched groups only (a per-group step answer)."""
        return self.plan.publish.by_change

    def _no_groups(self) -> pa.Table:
        """No touched group, in the shape the fold reports them."""
        main = self.plan.main_tables[0]
        schema = self.step.state.schema(main.name)
        return pa.schema([schema.field(c) for c in (BUCKET, *main.key_columns)]).empty_table()

    def _frontier(self, number: int) -> pa.Table | None:
        """The groups the last batch's final fold touched and no move compared, if they were
        recorded after state version ``number`` (None: not known, compare every group)."""
        if not self._restricts() or self._through(self.frontier_path) != number:
            return None
        return self.store.read(self.frontier_path)

    def _write_frontier(self, pending: pa.Table | None) -> None:
        if not self._restricts():
            return
        if pending is None:
            self.store.remove(self.frontier_path)
            return
        self.store.write(self.frontier_path, pending, mode="overwrite",
                         batch=self._state_number(), replace_schema=True,
                         description=f"incr frontier of view {self.plan.view}: groups of the "
                                     f"step touched by the last move, not compared with X yet")

    def _dx(self, number: int, seed: bool, arrow: pa.Table | None, batch_view: str,
            source: str, register: Callable[[], None] | None,
            pending: pa.Table | None) -> pa.Table:
        """ΔX for move ``number``: read back if written before a crash, else computed."""
        if self._through(self.dx_path) == number:
            return self.store.read(self.dx_path).cast(self._dx_schema)
        data = self._initial(arrow, batch_view, source, register) if seed else self._diff(pending)
        data = data.select(self._dx_schema.names).cast(self._dx_schema)
        self.store.write(self.dx_path, data, mode="overwrite", batch=number,
                         description=f"incr ΔX of view {self.plan.view} for the move being applied")
        return data

    def _loop(self, what: str, rows: int | None, work: Callable[[Engine], pa.Table]) -> pa.Table:
        """``work`` on the engine :meth:`Engines.run` picks (Spark for looked-up X)."""
        blocker = "the step looks X up (Spark)" if self.it.lookups else None

        def run(name: str) -> pa.Table:
            engine = self.engines.engine(name, self.store)
            try:
                return work(engine)
            finally:
                engine.close()

        return self.engines.run("loop", f"{what} of view {self.plan.view}", run, rows=rows,
                                blocker=blocker)

    def _initial(self, arrow: pa.Table | None, batch_view: str, source: str,
                 register: Callable[[], None] | None) -> pa.Table:
        """The first ΔX: INITIAL over the first batch."""
        def work(engine: Engine) -> pa.Table:
            for table in self.it.initial_tables:
                name = INITIAL_SOURCE + table.lower()
                if table.lower() != source.lower():
                    decl = next(t for t in self.plan.source_tables
                                if t.name.lower() == table.lower())
                    engine.table(name, nullable(arrow_schema(decl.columns)).empty_table())
                elif engine.name == DRIVER:
                    assert arrow is not None
                    engine.table(name, arrow)
                else:
                    if register is not None:
                        register()
                    engine.view(name, render_all(batch_view))
            return engine.collect(initial_dx_sql(self.it), self._dx_schema)

        return self._loop("INITIAL", arrow.num_rows if arrow is not None else None, work)

    def _diff(self, pending: pa.Table | None) -> pa.Table:
        """a(T) ⊖ X, beyond TOLERANCE: over the ``pending`` groups only, or (None) every group."""
        prefix = f"incr_{self.plan.view}_it_"

        def work(engine: Engine) -> pa.Table:
            x = self._iterate(engine, prefix + "x")
            state: dict[str, str] = {}
            if pending is None:
                for t in self.plan.main_tables:
                    state[t.name] = engine.delta(prefix + f"state_{t.name}",
                                                 self.step.table_path(t.name))
                old = x
            else:
                keys = engine.table(prefix + "frontier", pending)
                buckets = pc.unique(pending.column(BUCKET)).to_pylist()
                for t in self.plan.main_tables:
                    whole = engine.delta(prefix + f"state_{t.name}",
                                         self.step.table_path(t.name), buckets)
                    state[t.name] = engine.view(prefix + f"touched_{t.name}",
                                                render_old_rows(t, whole, keys))
                old = engine.view(prefix + "x_frontier", frontier_rows_sql(
                    self.it, x, keys, self.plan.publish.keys))
            new = engine.view(prefix + "next", typed_sql(self.it, self.plan.answer_sql(state)))
            return engine.collect(dx_sql(self.it, new, old), self._dx_schema)

        return self._loop("a(T) ⊖ X", 0, work)

    def _apply_dx(self, x: pa.Table, dx: pa.Table) -> pa.Table:
        """X ⊕ ΔX: rows whose key ΔX removes go, its new rows come."""
        prefix = f"incr_{self.plan.view}_it_"

        def work(engine: Engine) -> pa.Table:
            sql = apply_dx_sql(self.it, engine.table(prefix + "x_old", x),
                               engine.table(prefix + "dx", dx))
            return engine.collect(sql, self._x_schema).cast(self._x_schema)

        return self._loop("X ⊕ ΔX", x.num_rows + dx.num_rows, work)

    # -- looked-up X (in Spark) --------------------------------------------------------------
    def _lookup_view(self, name: str, sql: str, cache: bool = False) -> str:
        return self._spark_views.view(f"incr_{self.plan.view}_it_{name}", sql, cache)

    def _x_for_lookups(self, name: str) -> str:
        return self._iterate(self._spark_views, f"incr_{self.plan.view}_it_{name}")

    def _reassigned(self, batch_view: str, lookups, x_old: pa.Table, x_new: pa.Table,
                    j: int) -> str:
        """The batch's rows whose lookups change from ``x_old`` to ``x_new``: out, then in."""
        prefix = f"incr_{self.plan.view}_it_"
        old = self._spark_views.table(f"{prefix}xo_{j}", x_old)
        new = self._spark_views.table(f"{prefix}xn_{j}", x_new)
        pairs = self._lookup_view(f"lk_{j}", lookup_pairs_sql(self.it, lookups, batch_view, old, new),
                            cache=True)
        columns = [f.name for f in self.spark.table(batch_view).schema.fields]
        return self._lookup_view(f"moved_{j}", reassigned_sql(lookups, pairs, columns))

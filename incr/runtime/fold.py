"""Folding one batch into a view's stages, on whichever engine was chosen.

A view is one or more stages (see :class:`~incr.compiler.plan.StagePlan`), producers
first.  A batch of a source flows through every stage it reaches, in order.  Changes move
between stages as *signed rows* (``_w``: +n copies in, -n copies out): a batch of a
source is all +1 or all -1, and a stage whose output feeds another hands on, per batch, the
rows its output lost (old values of the groups the batch touched) and gained (new values).

Per stage and batch:

1. Δ of the stage's input: the changed input itself, or for a join one term per changed
   input: its change joined with the inputs before it at their new rows (side table plus
   change) and the others' side tables (before this batch); see ``render_stage_delta``.
2. Its main tables (aggregate state and bags) are updated, by one of three strategies:

   * **fast** (:meth:`Fold._fast_merge`), when every row of Δ has the same sign and no
     stage reads this one: ``MERGE state ⊗ h(Δ)`` (or ⊗̃), the Delta MERGE of the seed paper;
   * **combine** (:meth:`Fold._combine_merge`), otherwise: the new rows of the touched keys
     are computed as ``old ⊗ h(Δ⁺) ⊗̃ h(Δ⁻)`` with the same monoid expressions, the stage's
     output change (new rows minus old rows of those keys) is written to its *outbox*, and
     the new rows replace the old ones (⊗=);
   * **pass on** (:meth:`Fold._pass_on`), for a *streaming* stage (linear, read by another
     stage): no state of its own, its outbox is h(Δ⁺) − h(Δ⁻); a streaming stage without a
     join is *virtual*: not even an outbox, its readers compute its change as a view.

3. The side tables of the changed inputs are updated with a signed MERGE (⊗±); a large one
   (:meth:`~incr.runtime.state.ViewState.vectors`) by deletion vectors instead, its touched
   rows' new counts computed as ``old ⊗̂ h(Δ)`` (:meth:`Fold._signed_by_vectors`), or, for
   inserts into one Δ reads only as counts, h(Δ) appended beside them
   (:meth:`Fold._append_side`).

Every query comes from the compiler (:mod:`incr.compiler.sqlgen`, printed by
``incr explain``); this module only names intermediate results and sequences the steps.
Every table records the batches it committed, so applying a batch is idempotent at every
step: after a crash, tables already at the batch are skipped and the rest catch up.  The
order (outbox, then main tables, then side tables) keeps each recomputation identical to
the first attempt: Δ reads side tables that only change last, and the outbox is written
before the state it is computed from changes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa

from incr.compiler.plan import BUCKET, IncrementalPlan, Query, StagePlan, StateTable
from incr.compiler.sqlgen import (
    delta_sign,
    render_all,
    render_anti_delta,
    render_changed_rows,
    render_combined,
    render_explode,
    render_handed_on,
    render_kept_change,
    render_kept_fold,
    render_kept_old,
    render_live_rows,
    render_none,
    render_old_rows,
    render_output_change,
    render_signed,
    render_stage_delta,
    render_touched_keys,
    render_values,
)
from incr.runtime import faults, parallel
from incr.runtime.engine import DRIVER, Engine, per_engine
from incr.runtime.landing import DELETE
from incr.runtime.session import SparkEngine
from incr.runtime.state import INSERT, REPLACED, SIGNED, ViewState


@dataclass
class ViewMetrics:
    """Timings and row counts of one view for one batch."""

    view: str
    batch: int
    engine: str = ""
    rows_in: int = 0
    h_s: float = 0.0
    merge_s: float = 0.0
    answer_s: float = 0.0
    state_rows_touched: int = 0
    answer_rows: int = 0
    #: "change" (a MERGE of the touched groups), "top" (a top-k from its old rows and the
    #: touched groups), "rewrite" (a(state) over the whole state), "building" (not
    #: published: the view's new state is catching up while its old answer is served) or
    #: "ahead" (not published: a stopped run folded this batch with later ones as one step).
    answer_mode: str = ""
    tables: dict[str, dict] = field(default_factory=dict)
    #: Seconds per stage the batch reached (producers first; the view's own stage last,
    #: under the view's name): where a nested view's time goes.
    stages: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Delta:
    """Δ of a stage's input: a registered view, its sign (0: mixed) and whether its rows are
    plain (a source batch, one copy per row, no ``_w``) rather than signed."""

    view: str
    sign: int
    plain: bool = False


class _Writes:
    """The writes of a stage's state tables in one fold.  On the driver each starts as soon
    as its rows are computed and runs beside the next table's rows and write: each is a
    Delta transaction on files of its own, which delta-rs and pyarrow run with the GIL
    released.  The last runs on the caller's thread, which has nothing else to do, so a
    stage of one table writes as before (its files spread over the driver's threads).  With
    Spark, whose rows may be large, each runs as it is added.

    At most one write per driver thread (:func:`~incr.runtime.parallel.threads`) is under
    way beside the caller, so no more tables' rows than that are held at once.  Used as a
    context manager: a failure, in a write or while the next rows are computed, is raised
    once every write started has ended; the next run folds the tables the batch did not
    reach, as after a crash between two of them.
    """

    def __init__(self, fold: Fold, batch: int, count: int) -> None:
        self._fold = fold
        self._batch = batch
        self._left = count if not isinstance(fold.engine, SparkEngine) else 0
        #: Per write started beside the caller: its table, the rows of h(Δ) and their
        #: seconds, and its future.
        self._started: list[tuple[StateTable, int, float, Future[tuple[int, float]]]] = []
        self._waited = 0.0  # seconds the caller spent starting writes (or running them)

    def __enter__(self) -> _Writes:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            futures.wait([f for *_, f in self._started])  # none goes on once the fold failed

    def add(self, table: StateTable, rows: int, h_s: float, write: Callable[[], int]) -> None:
        """Starts ``write`` of ``table`` (it returns the rows it folded), whose ``rows`` rows
        took ``h_s`` seconds to compute."""
        batch = self._batch

        def timed() -> tuple[int, float]:
            faults.crash_point("view.before_merge", batch)
            t0 = time.perf_counter()
            touched = write()
            faults.crash_point("view.after_merge", batch)
            return touched, time.perf_counter() - t0
        self._left -= 1
        if self._left <= 0:
            touched, merge_s = timed()
            self._fold._record(table.name, rows, h_s, merge_s, touched)
            return
        running = [f for *_, f in self._started]
        t0 = time.perf_counter()
        futures.wait(running[:max(0, len(running) + 1 - parallel.threads())])
        # parallel.start runs the write on the caller's thread when there is no other (one
        # driver thread, or a fold already on a pool thread): the caller waited all of it.
        self._started.append((table, rows, h_s, parallel.start(timed)))
        self._waited += time.perf_counter() - t0

    def finish(self) -> None:
        """Waits for every write started, and records each: its own seconds by table, and
        in the view's MERGE seconds the time the caller waited for them (the rest ran
        beside its other work), so a batch's parts add up to its time."""
        t0 = time.perf_counter()
        done = parallel.wait([f for *_, f in self._started])
        self._fold.metrics.merge_s += self._waited + time.perf_counter() - t0
        for (table, rows, h_s, _), (touched, merge_s) in zip(self._started, done, strict=True):
            self._fold._record(table.name, rows, h_s, merge_s, touched, beside=True)


class Fold:
    """One batch of one source through the stages of one view, on one engine."""

    def __init__(self, plan: IncrementalPlan, state: ViewState, engine: Engine,
                 metrics: ViewMetrics):
        self.plan = plan
        self.state = state
        self.engine = engine
        self.metrics = metrics
        self._prefix = f"incr_{plan.view}_"
        #: θ and bucket of every group of the view's own stage this fold changed (None: that
        #: stage's main table was not folded here, e.g. already at the batch after a crash).
        self.touched: pa.Table | None = None

    # -- naming results on the engine ---------------------------------------------------------
    def _view(self, name: str, sql: Query | str, cache: bool = False,
              table: str | None = None) -> str:
        """Names a query's rows; ``table``: the state table they have the types of."""
        schema = self.state.schema(table) if table is not None else None
        return self.engine.view(self._prefix + name, sql, cache, schema)

    def _state(self, table: str) -> str:
        return self.engine.delta(f"{self._prefix}state_{table}", self.state.path(table))

    def _collect(self, sql: Query | str, table: str) -> pa.Table:
        return self.engine.collect(sql, self.state.schema(table))

    # -- the batch ---------------------------------------------------------------------------
    def run(self, batch: int, source: str, view: str, sign: int) -> None:
        """Folds the changes of ``source`` (registered as ``view``) into every stage they reach.

        ``view`` holds plain rows, all inserted (``sign`` +1) or all deleted (-1), or with
        ``sign`` 0 signed rows (a ``_w`` column of ±copies).
        """
        self.run_together(batch, [(source, view, sign)])

    def run_together(self, batch: int, changes: list[tuple[str, str, int]]) -> None:
        """Folds the changes of several sources at once, as one step numbered ``batch``.

        ``changes``: (source, registered view, sign) per source, each as in :meth:`run`,
        the sources distinct.  A stage that joins two of them takes Δ of its input by the
        same rule as a self-join's (one term per changed input), so folding batches of
        ``xs`` and ``ys`` together equals folding them one after the other.
        """
        signed_of: dict[str, tuple[str, int]] = {}
        plain_of: dict[str, str] = {}
        for source, view, sign in changes:
            key = source.lower()
            assert key not in plain_of, f"two changes of {source} in one fold"
            plain_of[key] = view
            if sign == 0 or all(s.direct for s in self.plan.stages if self.plan.depends_on(s, source)):
                signed_of[key] = (view, sign)  # direct stages read the plain batch (see _stage_delta)
            else:
                signed_of[key] = (self._view(f"batch_{source}", render_signed(view, sign)), sign)
        outboxes: dict[str, str] = {}
        for stage in self.plan.stages:
            if not any(self.plan.depends_on(stage, source) for source, _, _ in changes):
                continue
            stage_changes: dict[str, tuple[str, int]] = {}
            batch_view = ""
            for inp in stage.inputs:
                if inp.derived and inp.table in outboxes:
                    stage_changes[inp.alias] = (outboxes[inp.table], 0)
                elif not inp.derived and inp.table.lower() in signed_of:
                    stage_changes[inp.alias] = signed_of[inp.table.lower()]
                    batch_view = plain_of[inp.table.lower()]
            t0 = time.perf_counter()
            virtual = self._apply_stage(stage, batch, stage_changes, batch_view)
            if virtual is not None:
                outboxes[stage.name] = virtual
            elif self.plan.consumers(stage.name):
                outbox = self._outbox(stage, batch)
                if stage.kept is not None:  # its readers take the change per output row
                    outbox = self._view(f"handed_{stage.name}", render_handed_on(stage, outbox))
                outboxes[stage.name] = outbox
            name = stage.name or self.plan.view
            self.metrics.stages[name] = self.metrics.stages.get(name, 0.0) + \
                time.perf_counter() - t0

    def _apply_stage(self, stage: StagePlan, batch: int, changes: dict[str, tuple[str, int]],
                     batch_view: str) -> str | None:
        """Applies the batch to one stage; returns a virtual stage's output changes (a view)."""
        if self.plan.virtual(stage):
            t0 = time.perf_counter()
            view = self._view(f"out_{stage.name}", self._passed_on(
                stage, self._stage_delta(stage, changes, batch_view)), cache=True)
            self.metrics.h_s += time.perf_counter() - t0
            return view
        pending = [t for t in self.plan.stored(stage)
                   if t.side_of is None and self.state.through(t.name) < batch]
        sides = [t for t in stage.tables if t.side_of is not None and t.side_of in changes]
        pending_sides = [t for t in sides if self.state.through(t.name) < batch]
        outbox = bool(self.plan.consumers(stage.name)) and self.state.through(stage.outbox) < batch
        if pending or outbox:
            delta = self._stage_delta(stage, changes, batch_view)
            if self.plan.streams(stage):
                t0 = time.perf_counter()
                self._write_outbox(stage, self._passed_on(stage, delta), batch)
                self.metrics.h_s += time.perf_counter() - t0
            elif delta.sign != 0 and not outbox and not self._by_vectors(pending):
                self._fast_merge(stage, pending, delta, batch)
            else:
                self._combine_merge(stage, pending, delta, batch, outbox)
        for table in pending_sides:
            change, sign = changes[table.side_of]
            if sign > 0 and self.state.vectors(table) and not stage.anti(table.side_of):
                self._append_side(table, change, batch)
                continue
            if self.state.vectors(table):
                self._signed_by_vectors(stage, table, change, batch)
                continue
            t0 = time.perf_counter()
            rows = self._collect(self.plan.h_query(table.name, change), table.name)
            t1 = time.perf_counter()
            spec = next(s for s in stage.signed if s.table == table.name)
            touched = self.state.merge(table, spec, rows, batch, SIGNED)
            self._record(table.name, rows.num_rows, t1 - t0, time.perf_counter() - t1, touched)
        if stage.kept is not None and self.plan.consumers(stage.name) and \
                self.state.through(stage.kept.name) < batch:
            self._keep(stage, batch)
        for table in [*pending, *pending_sides]:
            self.state.ready_for_vectors(table)
        return None

    def _outbox(self, stage: StagePlan, batch: int, name: str = "out") -> str:
        """The stage's outbox, holding its output change of ``batch``, as a view."""
        return self.engine.delta(f"{self._prefix}{name}_{stage.name}",
                                 self.state.check_outbox(stage, batch))

    def _keep(self, stage: StagePlan, batch: int) -> None:
        """Folds the output change the stage handed on for ``batch`` (its outbox, written
        first) into its kept rows: after a crash they catch up from the same rows."""
        assert stage.kept is not None and stage.keep is not None
        faults.crash_point("view.before_keep", batch)
        t0 = time.perf_counter()
        rows = self._collect(render_kept_fold(stage, self._outbox(stage, batch, "keep")), stage.kept.name)
        t1 = time.perf_counter()
        touched = self.state.merge(stage.kept, stage.keep, rows, batch, SIGNED)
        self._record(stage.kept.name, rows.num_rows, t1 - t0, time.perf_counter() - t1, touched)

    def _stage_delta(self, stage: StagePlan, changes: dict[str, tuple[str, int]],
                     batch_view: str) -> _Delta:
        """Δ of the stage's input as a registered view of signed rows, with its sign.

        A direct stage over a declared source reads the batch itself (plain rows, one copy
        each, all of the batch's sign).
        """
        if stage.direct:
            (view, sign), = changes.values()
            return _Delta(batch_view, sign, plain=True) if sign != 0 else _Delta(view, 0)
        sides = {t.side_of: self._side(stage, t, changes) for t in stage.tables if t.side_of}
        anti = {}
        for branch in stage.branches:
            for a in branch.join.anti:
                if a.input.alias in changes and a.input.alias not in anti:
                    anti[a.input.alias] = self._view(
                        f"dz_{stage.name}_{a.input.alias}",
                        render_anti_delta(a, changes[a.input.alias][0], sides[a.input.alias]),
                        cache=True)
        sql = render_stage_delta(stage, changes, sides, anti)
        assert sql is not None, f"stage {stage.name} was reached, yet none of its inputs changed"
        return _Delta(self._view(f"delta_{stage.name}", sql, cache=True), delta_sign(stage, changes))

    def _side(self, stage: StagePlan, table: StateTable,
              changes: dict[str, tuple[str, int]]) -> str:
        """A side table as Δ reads it: on the driver, only the rows whose join keys meet the
        change's (:meth:`~incr.compiler.plan.StagePlan.side_matches`), so a small change
        against a large side table reads little; whole otherwise."""
        assert table.side_of is not None
        matches = stage.side_matches(table.side_of, changes)
        if self.engine.name != DRIVER or matches is None:
            return self._state(table.name)
        schema = self.state.schema(table.name)
        matching: dict[str, pa.Array] = {}
        for m in matches:
            values = self.engine.collect(
                render_values(changes[m.changed][0], m.column),
                pa.schema([schema.field(m.side_column).with_name(m.column)]))
            found = values.column(0).combine_chunks()
            matching[m.side_column] = (pa.concat_arrays([matching[m.side_column], found])
                                       if m.side_column in matching else found)
        return self.engine.delta(f"{self._prefix}state_{table.name}", self.state.path(table.name),
                                 matching=matching, bucketed_by=stage.bucketed_by(table))

    def _split(self, delta: _Delta, stage: StagePlan) -> tuple[str, str]:
        """Plain rows of Δ's insertions and of its deletions (one per copy), as two views."""
        if delta.plain:  # a batch of a source: one sign, one copy per row
            rows = self._view(f"rows_{stage.name}", render_all(delta.view))
            empty = self._view(f"none_{stage.name}", render_none(delta.view))
            return (rows, empty) if delta.sign > 0 else (empty, rows)
        if delta.sign != 0:  # e.g. a join's Δ of an all-insert step: no scan for the other sign
            rows = self._view(f"rows_{stage.name}_None", render_explode(delta.view, None))
            empty = self._view(f"none_{stage.name}", render_none(rows))
            return (rows, empty) if delta.sign > 0 else (empty, rows)
        return (self._view(f"rows_{stage.name}_True", render_explode(delta.view, True)),
                self._view(f"rows_{stage.name}_False", render_explode(delta.view, False)))

    def _passed_on(self, stage: StagePlan, delta: _Delta) -> str:
        """A streaming stage's output changes: h(Δ⁺) gained, h(Δ⁻) lost (no state read)."""
        main = stage.main_tables[0]
        plus, minus = self._split(delta, stage)
        gained = self._view(f"hp_{main.name}", self.plan.h_query(main.name, plus, bucketed=False))
        lost = self._view(f"hn_{main.name}", self.plan.h_query(main.name, minus, bucketed=False))
        return render_output_change(stage, {main.name: lost}, {main.name: gained})

    def _by_vectors(self, pending: list[StateTable]) -> bool:
        """Whether the stage's tables take ⊗= by deletion vectors (the combine strategy) even
        for a one-signed Δ: a MERGE of h(Δ) would copy every file a key of Δ may be in.
        Only when every table does (:meth:`ViewState.vectors`: large and keyed; an empty
        one takes the initial load, h(Δ) appended, by Spark's executors when large)."""
        return bool(pending) and all(self.state.vectors(t) for t in pending)

    def _fast_merge(self, stage: StagePlan, pending: list[StateTable], delta: _Delta,
                    batch: int) -> None:
        """``MERGE state ⊗ h(Δ)`` (⊗̃ for deletions) per pending table: Δ has one sign."""
        sign = delta.sign
        rows = delta.view if delta.plain else self._view(f"rows_{stage.name}_None",
                                                         render_explode(delta.view, None))
        specs = {s.table: s for s in (stage.diminish if sign < 0 else stage.merge)}
        with _Writes(self, batch, len(pending)) as writes:
            for table in pending:
                t0 = time.perf_counter()
                if sign > 0 and isinstance(self.engine, SparkEngine) and self.state.is_empty(table.name):
                    # The initial load: h(ΔS) is the state, written by Spark's executors (no
                    # collect).  Its groups are not noted: the first answer is rewritten anyway.
                    faults.crash_point("view.before_merge", batch)
                    n = self.state.append_from_spark(self.engine, table,
                                                     self.plan.h_query(table.name, rows), batch)
                    self._record(table.name, n, 0.0, time.perf_counter() - t0, n)
                    faults.crash_point("view.after_merge", batch)
                    continue
                h = self._collect(self.plan.h_query(table.name, rows), table.name)
                self._note_touched(stage, table, h)
                writes.add(table, h.num_rows, time.perf_counter() - t0, functools.partial(
                    self.state.merge, table, specs[table.name], h, batch,
                    DELETE if sign < 0 else INSERT))
                del h  # its MERGE holds it while it runs, and no longer
            writes.finish()

    @per_engine("⊗/⊗̃ as MERGE and as a query", "query")
    def _combine_merge(self, stage: StagePlan, pending: list[StateTable], delta: _Delta,
                       batch: int, outbox: bool) -> None:
        """New rows of the touched keys computed as a query, the outbox written, then ⊗=."""
        t0 = time.perf_counter()
        plus, minus = self._split(delta, stage)
        diffusions = {s.table: s for s in stage.diffuse}
        diminishes = {s.table: s for s in stage.diminish}
        old_views: dict[str, str] = {}
        new_views: dict[str, str] = {}
        changed: dict[str, str] = {}
        main = stage.main_tables[0]
        touched_keys = ""
        for table in stage.main_tables:
            hp = self._view(f"hp_{table.name}", self.plan.h_query(table.name, plus), cache=True,
                            table=table.name)
            hn = self._view(f"hn_{table.name}", self.plan.h_query(table.name, minus), cache=True,
                            table=table.name)
            if table is main:
                touched_keys = self._view(f"touched_{stage.name}",
                                          render_touched_keys(table, hp, hn), cache=True)
            old = self._view(f"old_{table.name}",
                             render_old_rows(table, self._touched_state(table, touched_keys),
                                             touched_keys, exact=self._read_exactly(table)),
                             cache=True)
            # an all-insert Δ diminishes nothing: no join with its empty h(Δ⁻) (DuckDB
            # joins an empty side all the same; half of this query's time at 64K groups)
            diminish = diminishes.get(table.name) if delta.sign <= 0 else None
            new = self._view(f"new_{table.name}", render_combined(
                table, diffusions[table.name], diminish, old, hp, hn if diminish else None), cache=True)
            changed[table.name] = self._view(f"changed_{table.name}", render_changed_rows(
                table, new, hp, hn, own_keys=table is main))
            old_views[table.name] = old
            new_views[table.name] = self._view(f"live_{table.name}", render_live_rows(table, new))
        self.metrics.h_s += time.perf_counter() - t0
        if outbox and stage.kept is not None:  # what leaves the output: what was handed on
            kept = self._view(f"kept_{stage.name}", render_kept_old(
                stage, self._touched_state(stage.kept, touched_keys, main.keys[0].name
                                           if main.keys else None), touched_keys))
            self._write_outbox(stage, render_kept_change(stage, kept, new_views), batch)
        elif outbox:
            self._write_outbox(stage, render_output_change(stage, old_views, new_views), batch)
        replaces = {s.table: s for s in stage.replace}
        noted: list[tuple[str, pa.Table]] = []
        with _Writes(self, batch, len(pending)) as writes:
            for table in pending:
                t1 = time.perf_counter()
                rows = self._collect(render_all(changed[table.name]), table.name)
                live = self._live(table, rows) if self.state.vectors(table) else None
                self._note_touched(stage, table, rows)
                h_s = time.perf_counter() - t1
                if live is None:
                    writes.add(table, rows.num_rows, h_s, functools.partial(
                        self.state.merge, table, replaces[table.name], rows, batch, REPLACED))
                    continue
                writes.add(table, rows.num_rows, h_s, functools.partial(
                    self.state.replace_by_vectors, table, rows, live, batch))
                if stage is self.plan.top and table.key_columns == tuple(k.name for k in table.keys):
                    # every row of a touched group is a changed one (no bag): the answer's
                    # rows of those groups come from these, not from reading the state again
                    noted.append((table.name, live))
            writes.finish()
        for name, live in noted:  # once they are the state's
            self.state.note_rows(batch, name, live)

    def _append_side(self, table: StateTable, change: str, batch: int) -> None:
        """⊗± of an all-insert change into a large side table: h(Δ) appended as rows of
        their own, no old row read.  Δ reads a side table only as counts it multiplies by
        (never as "no match": ``stage.anti``), so a θ's count may be split over several
        rows; a later change of a θ that reads its old rows sums them
        (:func:`~incr.compiler.sqlgen.render_old_rows`) and replaces them all.  Searching
        5M-row side tables for every inserted key was a third of a join increment."""
        t0 = time.perf_counter()
        rows = self._collect(self.plan.h_query(table.name, change), table.name)
        t1 = time.perf_counter()
        self.state.append_by_vectors(table, rows, batch)
        self._record(table.name, rows.num_rows, t1 - t0, time.perf_counter() - t1, rows.num_rows)

    def _signed_by_vectors(self, stage: StagePlan, table: StateTable, change: str,
                           batch: int) -> None:
        """⊗± into a large side table by deletion vectors: the new rows of the keys h(Δ)
        reaches are ``old ⊗̂ h(Δ)`` (the compiled diffusion, signed counts added), and they
        replace the old ones as ⊗= does for main tables (:meth:`ViewState.replace_by_vectors`);
        a row whose count reaches 0 is only deleted.  The signed MERGE would copy every
        file a key of the change may be in: with join keys spread over the key range, all."""
        t0 = time.perf_counter()
        h = self._view(f"hs_{table.name}", self.plan.h_query(table.name, change), cache=True,
                       table=table.name)
        keys = self._view(f"touched_{table.name}", render_touched_keys(table, h, h), cache=True)
        old = self._view(f"old_{table.name}",
                         render_old_rows(table, self._touched_state(table, keys), keys), cache=True)
        diffuse = next(s for s in stage.diffuse if s.table == table.name)
        new = self._view(f"new_{table.name}", render_combined(table, diffuse, None, old, h, None),
                         cache=True)
        changed = self._view(f"changed_{table.name}",
                             render_changed_rows(table, new, h, h, own_keys=True))
        rows = self._collect(render_all(changed), table.name)
        live = self._live(table, rows)
        t1 = time.perf_counter()
        touched = self.state.replace_by_vectors(table, rows, live, batch)
        self._record(table.name, rows.num_rows, t1 - t0, time.perf_counter() - t1, touched)

    def _live(self, table: StateTable, rows: pa.Table) -> pa.Table:
        """The live ones of a table's changed ``rows``, already collected: filtered as they
        are, not computed again from the view that gave them."""
        return self._collect(render_live_rows(table, self.engine.table(
            f"{self._prefix}changed_rows_{table.name}", rows)), table.name)

    def _touched_state(self, table: StateTable, touched_keys: str,
                       touched_as: str | None = None) -> str:
        """``table`` as the old rows of the touched groups are read from it: on the driver
        only the rows whose θ columns each hold one of the touched groups' values (a
        filtered scan), so a batch whose keys are spread over a large state reads about
        their rows, not the state; whole otherwise (Spark's join reads what it needs).

        Every column of θ narrows the read: a side table's first one may be a value the
        change's rows share with most others, its join key not.  ``touched_as``: the first
        key's name in ``touched_keys`` when it differs (a kept table names θ apart; then
        only that key narrows it).
        """
        if self.engine.name != DRIVER or not table.keys:
            return self._state(table.name)
        schema = self.state.schema(table.name)
        theta = {k.name for k in table.keys}
        named = ({table.keys[0].name: touched_as} if touched_as is not None
                 else {c: c for c in table.sort_columns if c in theta})
        matching = {}
        for column, there in named.items():
            field = schema.field(column).with_name(there)
            values = self.engine.collect(render_values(touched_keys, there), pa.schema([field]))
            matching[column] = values.column(0).combine_chunks()
        return self.engine.delta(f"{self._prefix}state_{table.name}", self.state.path(table.name),
                                 matching=matching, every=True,
                                 bucketed_by=(self.plan.stage_of(table.name).bucketed_by(table)
                                              if touched_as is None else None))

    def _read_exactly(self, table: StateTable) -> bool:
        """Whether :meth:`_touched_state` (not ``touched_as``) reads the rows of exactly the
        touched groups: on the driver, for a θ of one column, which the read matches (with
        several, rows holding one touched group's first value and another's second match
        too)."""
        return self.engine.name == DRIVER and len(table.keys) == 1

    def _note_touched(self, stage: StagePlan, table: StateTable, rows: pa.Table) -> None:
        """Keeps the groups of the view's own stage that ``rows`` (about to be merged into
        its main table) touch: the answer rows that may change (:mod:`~incr.runtime.answer`)."""
        if stage is self.plan.top and table is stage.main_tables[0]:
            self.touched = rows.select([BUCKET, *table.key_columns])

    def _write_outbox(self, stage: StagePlan, sql: str, batch: int) -> None:
        self.state.write_outbox(stage, self.engine.collect(sql, self.state.schema(stage.outbox)),
                                batch)

    def _record(self, table: str, rows: int, h_s: float, merge_s: float, touched: int,
                beside: bool = False) -> None:
        """Notes a table's fold; ``beside``: its write ran beside the caller, whose wait
        for it :meth:`_Writes.finish` counts instead."""
        m = self.metrics
        m.h_s += h_s
        m.merge_s += 0.0 if beside else merge_s
        m.state_rows_touched += touched
        m.tables[table] = {"h_rows": rows, "h_s": h_s, "merge_s": merge_s}

"""A recursive view: its fixpoint R kept by semi-naive insertion and DRed, its query folded.

The view's recursive CTE ``r`` is kept as the set R in Delta (``_fixpoint``, beside the
state of the query after the CTE; each tuple with its rank), with a mirror of each source the
CTE reads (``_mirror_<t>``: each distinct row and how many copies of it are present).  A batch
of such a source is applied like this (the SQL comes from :mod:`incr.compiler.recursion`,
whose module doc gives the method)::

    ΔR ← semi-naive (insert) or DRed with rank support (delete) from the batch's changed rows
    the query's state ← ⊗ h(ΔS)         when the query also reads the source itself
    the query's state ← ⊗ h(ΔR)         ΔR as a signed batch of the pseudo-source r
    publish a(state)

Only the rows whose presence the batch changes count (a second copy of a link derives
nothing new), and every round reads the last round's tuples only.

**Crash safety.**  Each batch's work is numbered ``2·batch`` (the fold of the source) and
``2·batch + 1`` (ΔR and its fold), and each table records the number it committed: ΔR is
written (``_dr``) before R and the mirrors move, and the query's state last, so a run
stopped anywhere in between reads ΔR back instead of computing it against an R that has
already moved, and skips what committed.

Where it runs: the evaluation of ΔR on the driver-side engine (DuckDB) when the batch is on
the driver and small, in Spark otherwise, like every other step
(:class:`~incr.runtime.engine.Engines`).  On the driver it reads only the part of R the
batch can move when R falls apart by a column every step carries (a path's source:
:attr:`~incr.compiler.recursion.Recursion.partition`): the tuples of the partitions the
changed rows reach (:meth:`RecursiveRuntime._read_r`), so a closure of millions of paths
stays on the driver for a batch of a few links.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from incr.compiler.plan import WEIGHT, IncrementalPlan
from incr.compiler.program import Column
from incr.compiler.recursion import (
    MAX_ROUNDS,
    RANK,
    alive_sql,
    all_sql,
    changed_sql,
    frontier_sql,
    groups_sql,
    minus_sql,
    mirror_sql,
    named_sql,
    parts_sql,
    present_sql,
    ranked_sql,
    reach_keys,
    round_sql,
    signed_sql,
    superseded_sql,
    union_all_sql,
    within_sql,
)
from incr.config import COMPACT_FILES_PER_BUCKET
from incr.errors import InputError, Location
from incr.runtime import faults
from incr.runtime.engine import Engine
from incr.runtime.landing import DELETE
from incr.runtime.maintain import ViewMetrics, WrappedRuntime, held_back, union_touched
from incr.runtime.store import DeltaStore
from incr.runtime.types import arrow_schema, nullable, signed

if TYPE_CHECKING:
    from incr.runtime.engine import Engines

#: Numbers per batch: the source's fold, then ΔR (see the module doc).
NUMBERS = 2


class RecursiveRuntime(WrappedRuntime):
    """A recursive view: the query after the CTE as a :class:`ViewRuntime`, R beside it."""

    NUMBERS = NUMBERS

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, engines: Engines,
                 warehouse: Path):
        super().__init__(plan, store, engines, warehouse)
        assert plan.recursion is not None
        self.rec = plan.recursion
        self.outer = self.inner
        self.log: list[dict] = []  # per batch: rounds, derived, over-deleted, |ΔR| (benchmarks)
        #: Whether a delete keeps the tuples with a proof left from a lower rank; off, every
        #: tuple examined is over-deleted (the benchmark's figures without the check).
        self.rank_support = True
        #: Whether R keeps only the tuples no other beats when the view allows it (off: the
        #: benchmark's figures without aggregate selection).
        self.aggregate_selection = True
        tuples = nullable(arrow_schema(self.rec.columns))
        self._r_schema = tuples.append(pa.field(RANK, pa.int64()))  # R: tuples and ranks
        self._change_schema = signed(self._r_schema)  # R's change: -1 leaves, +1 enters
        self._dr_schema = signed(tuples)  # ΔR as the query reads it
        self._kept: dict[str, pa.Table] = {}  # each table an evaluation kept

    @property
    def fixpoint_path(self) -> Path:
        """R, beside the query's state (in its current generation)."""
        return self.outer.state_root / "_fixpoint"

    @property
    def dr_path(self) -> Path:
        return self.outer.state_root / "_dr"

    def mirror_path(self, source: str) -> Path:
        return self.outer.state_root / f"_mirror_{source.lower()}"

    # -- one batch ---------------------------------------------------------------------------
    def apply(self, batch: int, kind: str, source: str, batch_view: str,
              arrow: pa.Table | None = None,
              register: Callable[[], None] | None = None, publish_at: int = -1) -> ViewMetrics:
        """Moves R by the batch, folds the batch and ΔR into the query, publishes a."""
        metrics = ViewMetrics(self.plan.view, batch)
        base = batch * NUMBERS
        sign = -1 if kind == DELETE else 1
        answer_at = self.outer.answer.through()
        in_step = answer_at >= 0 and answer_at == self.state_through() < batch
        trace = {"batch": batch, "rounds": 0, "derived": 0, "over": 0, "pruned": 0,
                 "dr_rows": 0, "parts": None}
        folds: list[pa.Table | None] = []
        try:
            dr = None
            if self.rec.reads(source):
                if arrow is None:  # a batch too large for the driver: its rows from Spark
                    if register is not None:
                        register()
                    arrow = self._spark_views.collect(f"SELECT * FROM {batch_view}")
                dr = self._change(base + 1, source, sign, arrow, trace)
            if any(self.plan.depends_on(s, source) for s in self.plan.stages):
                folds.append(self.outer.fold(base, source, batch_view, sign, metrics, arrow,
                                             register))
            if dr is not None:
                name = f"incr_{self.plan.view}_rec_dr_{batch}"
                dr_sign, dr = _one_sign(dr)
                folds.append(self.outer.fold(base + 1, self.rec.name, name, dr_sign, metrics,
                                             dr, self._registrar(name, dr)))
        finally:
            self._spark_views.close()
        self.log.append(trace)
        faults.crash_point("view.after_state", batch)
        if held_back(metrics, batch, publish_at):
            return metrics
        touched = union_touched(*folds) if in_step else None
        t0 = time.perf_counter()
        metrics.answer_rows = self.outer.answer.publish(batch, touched, metrics)
        metrics.answer_s = time.perf_counter() - t0
        faults.crash_point("view.after_answer", batch)
        return metrics

    # -- R ---------------------------------------------------------------------------------------
    def _change(self, number: int, source: str, sign: int, rows: pa.Table,
                trace: dict) -> pa.Table:
        """ΔR for a batch of ``source`` (read back if written before a crash); moves R and
        the source's mirror to after the batch."""
        decl = self._decl(source)
        mirror_schema = _mirror_schema(decl.columns)
        rows = rows.select([c.name for c in decl.columns])
        mirror = None  # the source's mirror after the batch, once the evaluation computed it
        if self._through(self.dr_path) == number:
            change = self.store.read(self.dr_path).cast(self._change_schema)
        else:
            def work(name: str) -> tuple[pa.Table, pa.Table]:
                engine = self.engines.engine(name, self.store)
                try:
                    self._kept = {}
                    return self._evaluate(engine, source, sign, rows, trace)
                finally:
                    engine.close()
                    self._kept = {}

            change, mirror = self.engines.run("recursion", f"ΔR of view {self.plan.view}",
                                              work, rows=rows.num_rows)
            self.store.write(self.dr_path, change, mode="overwrite", batch=number,
                             description=f"incr change of R of view {self.plan.view} for "
                                         f"the batch being applied")
        faults.crash_point("recursion.after_dr", number // NUMBERS)
        if self._through(self.mirror_path(source)) < number:
            if mirror is None:  # resumed with ΔR read back
                mirror = self._moved_mirror(source, sign, rows, decl.columns, mirror_schema)
            self.store.write(self.mirror_path(source), mirror, mode="overwrite", batch=number,
                             description=f"incr mirror of {source} for view {self.plan.view}: "
                                         f"each row and its copies")
        if self._through(self.fixpoint_path) < number:
            self._move_fixpoint(change, number)
        faults.crash_point("recursion.after_fixpoint", number // NUMBERS)
        dr = _net(change, self._dr_schema)
        trace["dr_rows"] = dr.num_rows
        return dr

    def _evaluate(self, engine: Engine, source: str, sign: int, rows: pa.Table,
                  trace: dict) -> tuple[pa.Table, pa.Table]:
        """R's change on ``engine`` (tuples with ranks, -1 leaving and +1 entering):
        semi-naive for an insert, DRed with rank support for a delete (see
        :mod:`incr.compiler.recursion`); and the source's mirror after the batch, which it
        computes on the way."""
        rec, cols = self.rec, self.rec.columns
        p = f"incr_{self.plan.view}_rec_"
        before: dict[str, str] = {}  # each source's distinct rows before the batch
        for t in rec.sources:
            decl = self._decl(t)
            held = self._register(engine, p + f"m_{t.lower()}", self.mirror_path(t),
                                  _mirror_schema(decl.columns))
            self._keep(engine, p + f"s_{t.lower()}", present_sql(decl.columns, held),
                       _source_schema(decl.columns))
            before[t.lower()] = p + f"s_{t.lower()}"
        decl = self._decl(source)
        old = before[source.lower()]
        batch = engine.table(p + "batch", rows)
        mirror_schema = _mirror_schema(decl.columns)
        mirror = engine.collect(mirror_sql(decl.columns, p + f"m_{source.lower()}", batch, sign),
                                mirror_schema).select(mirror_schema.names).cast(mirror_schema)
        moved = engine.table(p + "moved", mirror)  # also what the mirror becomes
        schema = _source_schema(decl.columns)
        new = self._keep(engine, p + "s_new", present_sql(decl.columns, moved), schema)
        # The rows whose presence the batch changes: those now present, or no longer.
        first, second = (new, old) if sign > 0 else (old, new)
        changed = self._keep(engine, p + "changed",
                             minus_sql(decl.columns, f"SELECT * FROM {first}", second), schema)
        after = {**before, source.lower(): new}
        branches = (*rec.base, *rec.step)
        if not self._kept[changed].num_rows:
            trace["parts"] = 0  # R is not read at all
            return self._change_schema.empty_table(), mirror
        # R is read by every round's queries: held where the engine reads it fastest.
        r = engine.hold(p + "r", "SELECT * FROM " + self._read_r(
            engine, source, changed, before if sign < 0 else after, trace))

        sel = rec.selection if self.aggregate_selection else None
        held_r = r  # R as it was (``r`` may become R with a batch's new tuples)
        beaten: list[str] = []  # tuples of R or of a round that a better one put out

        def rounds(first: str | None, tables: dict[str, str], within: str | None,
                   without: tuple[str, ...], tag: str) -> list[str]:
            """Semi-naive: ``first``, then the step over each round's new tuples, kept
            ``within`` a set (when given), new against ``without`` and earlier rounds.

            Under aggregate selection a round keeps only the tuples nothing in ``without``
            or found so far beats, and what they beat goes to ``beaten``."""
            found: list[str] = []
            sql = first
            for k in range(MAX_ROUNDS):
                if sql is None:
                    return found
                if within is not None:
                    sql = within_sql(cols, sql, within)
                name = self._keep(engine, f"{p}{tag}{k}", minus_sql(cols, sql, *without, *found),
                                  self._r_schema)
                if sel is not None and self._kept[name].num_rows:
                    trace["pruned"] += self._kept[name].num_rows
                    name = self._keep(engine, f"{p}{tag}{k}b", frontier_sql(
                        rec, name, *without, *found), self._r_schema)
                    trace["pruned"] -= self._kept[name].num_rows
                    out = self._keep(engine, f"{p}{tag}{k}x", superseded_sql(
                        rec, (*without, *found), name), self._r_schema)
                    if self._kept[out].num_rows:
                        beaten.append(out)
                trace["derived"] += self._kept[name].num_rows
                if not self._kept[name].num_rows:
                    return found
                found.append(name)
                trace["rounds"] += 1
                sql = round_sql(rec, name, tables)
            raise self._unbounded()

        if sign > 0:
            tables = {**after, rec.name.lower(): r}
            added = rounds(changed_sql(rec, branches, source, changed, tables), tables, None,
                           (r,), "i")
            if not beaten:
                return self._signed(engine, added, +1), mirror
            # Tuples whose proof went through a beaten one are examined like a delete's.
            out = engine.view(p + "beaten",
                              f"SELECT DISTINCT * FROM ({union_all_sql(beaten)}) AS _b")
            held = engine.view(p + "held", union_all_sql(
                [engine.view(f"{p}held{i}", alive_sql(cols, t, out))
                 for i, t in enumerate([r, *added])]))
            tables = {**after, rec.name.lower(): held}
            first, r = round_sql(rec, out, tables), held
            gone = [out]
        else:
            tables = {**before, rec.name.lower(): r}
            first, gone = changed_sql(rec, branches, source, changed, tables), []
            added = []
        found_dead = self._over(engine, first, tables, after, r, trace)
        if found_dead is not None:
            trace["over"] += self._kept[found_dead].num_rows
            gone.append(found_dead)
        if not gone:
            return self._change_schema.empty_table(), mirror
        dead = gone[0] if len(gone) == 1 else \
            engine.view(p + "dead", f"SELECT DISTINCT * FROM ({union_all_sql(gone)}) AS _d")
        rest = engine.view(p + "rest", alive_sql(cols, r, dead))
        tables = {**after, rec.name.lower(): rest}
        if sel is None:
            back = rounds(all_sql(rec, tables, target=dead), tables, dead, (), "d")
        elif found_dead is not None:  # a group that lost its best tuples may have others
            # now; a beaten tuple's group has what beat it, which beats all it did
            groups = engine.view(p + "groups", groups_sql(rec, found_dead))
            back = rounds(all_sql(rec, tables, target=groups, grouped=True), tables, None,
                          (rest,), "d")
        else:
            back = []
        # R's change: what leaves R as it was, what the batch added and kept, what came back.
        left = dead if sign < 0 else \
            engine.view(p + "left", named_sql(cols, held_r, f"SELECT * FROM {dead}"))
        kept = [engine.view(f"{p}kept{i}", alive_sql(cols, a, dead)) for i, a in enumerate(added)]
        change = pa.concat_tables([self._signed(engine, [left], -1),
                                   self._signed(engine, [*kept, *back], +1)])
        return change, mirror

    def _over(self, engine: Engine, first: str | None, before: dict[str, str],
              after: dict[str, str], r: str, trace: dict) -> str | None:
        """The over-deletion O of a delete, rank by rank: the tuples of R derived from the
        deleted rows or from tuples found dead, less those with a proof left from a live
        tuple of lower rank (or a base branch) over the sources after the batch.

        Returns the table of every tuple found dead (None: none)."""
        rec, cols = self.rec, self.rec.columns
        p = f"incr_{self.plan.view}_rec_"
        dead: str | None = None  # every tuple found dead so far
        if first is None:
            return dead
        pending = self._kept[self._keep(engine, p + "pend0", named_sql(cols, r, first),
                                        self._r_schema)]
        for k in range(MAX_ROUNDS):
            if not pending.num_rows:
                return dead
            rank = pc.min(pending.column(RANK)).as_py()
            level = f"{p}lev{k}"
            self._kept[level] = pending.filter(pc.equal(pending.column(RANK), rank))
            engine.table(level, self._kept[level])
            later = [pending.filter(pc.greater(pending.column(RANK), rank))]
            trace["derived"] += pending.num_rows - later[0].num_rows
            trace["rounds"] += 1
            died = level
            if self.rank_support:
                below = alive_sql(cols, r, dead, below=rank)
                tables = {**after, rec.name.lower(): engine.view(f"{p}below{k}", below)}
                proof = all_sql(rec, tables, target=level)
                assert proof is not None
                died = self._keep(engine, f"{p}dead{k}", minus_sql(
                    cols, f"SELECT * FROM {level}", f"({within_sql(cols, proof, level)})"),
                    self._r_schema)
            if self._kept[died].num_rows:
                step = round_sql(rec, died, before)
                if step is not None:
                    later.append(self._kept[self._keep(engine, f"{p}next{k}", named_sql(
                        cols, f"({ranked_sql(r, '>', rank)})", step), self._r_schema)])
                so_far = f"{p}gone{k}"
                self._kept[so_far] = self._kept[died] if dead is None else \
                    pa.concat_tables([self._kept[dead], self._kept[died]])
                dead = engine.table(so_far, self._kept[so_far])
            both = pa.concat_tables(later)
            pending = both.group_by(both.column_names, use_threads=False).aggregate([])
        raise self._unbounded()

    def _read_r(self, engine: Engine, source: str, changed: str, tables: dict[str, str],
                trace: dict) -> str:
        """Registers the part of R a batch of ``source`` whose changed rows are ``changed``
        can move: the parts (:attr:`Recursion.partition`) of the tuples the base branches
        derive from the changed rows and of the r tuples a step joins with them
        (:func:`reach_keys`); the whole of R when the recursion does not fall apart so.

        The driver then holds what the batch reaches, not the closure: a few links of a
        network of millions of paths read the paths from the nodes that reach them.
        """
        p = f"incr_{self.plan.view}_rec_"
        path, rec = self.fixpoint_path, self.rec
        keys = reach_keys(rec, source)
        if keys is None or not engine.narrows or not self.store.exists(path):
            return self._register(engine, p + "read", path, self._r_schema)
        rows = self._kept[changed]
        matching: dict[str, pa.Array] = {}
        for column, r_column in keys:
            values = rows.column(column).combine_chunks()
            if r_column in matching:
                values = pa.concat_arrays([matching[r_column], values])
            matching[r_column] = values
        reached = []
        if matching:
            reached.append(f"SELECT * FROM {engine.delta(p + 'joined', path, matching=matching)}")
        base = changed_sql(rec, rec.base, source, changed, tables)
        if base is not None:
            reached.append(base)
        part = pa.schema([self._r_schema.field(rec.partition)])
        parts = engine.collect(parts_sql(rec, reached), part).column(0).combine_chunks() \
            if reached else pa.array([], part.field(0).type)
        trace["parts"] = len(parts)
        if not len(parts):
            return engine.table(p + "read", self._r_schema.empty_table())
        return engine.delta(p + "read", path, matching={rec.partition: parts})

    def _unbounded(self) -> InputError:
        return InputError(f"view {self.plan.view}: the recursion of {self.rec.name} did not "
                          f"reach a fixpoint in {MAX_ROUNDS} rounds; bound it (e.g. WHERE hops "
                          f"< 20 in its step)", Location(self.plan.program))

    def _decl(self, source: str):
        return next(t for t in self.plan.source_tables if t.name.lower() == source.lower())

    def _signed(self, engine: Engine, names: list[str], sign: int) -> pa.Table:
        """The rows of tables ``names`` (tuples with ranks) as a change of R, each ``sign``."""
        schema = self._change_schema
        if not names:
            return schema.empty_table()
        change = engine.collect(signed_sql(f"({union_all_sql(names)}) AS _r", sign), schema)
        return change.select(schema.names).cast(schema)

    def _keep(self, engine: Engine, name: str, sql: str, schema: pa.Schema) -> str:
        """Computes ``sql`` once, registers its rows (of ``schema``) as ``name`` (kept in
        ``_kept``)."""
        table = engine.collect(sql, schema).select(schema.names).cast(schema)
        engine.table(name, table)
        self._kept[name] = table
        return name

    def _register(self, engine: Engine, name: str, path: Path, schema: pa.Schema) -> str:
        if self.store.exists(path):
            return engine.delta(name, path)
        return engine.table(name, schema.empty_table())

    def _moved_mirror(self, source: str, sign: int, rows: pa.Table, columns,
                      schema: pa.Schema) -> pa.Table:
        """The source's mirror after the batch (computed on the driver: it is read whole)."""
        def work(name: str) -> pa.Table:
            engine = self.engines.engine(name, self.store)
            try:
                mirror = self._register(engine, "incr_rec_mirror", self.mirror_path(source),
                                        schema)
                batch = engine.table("incr_rec_mirror_batch", rows)
                return engine.collect(mirror_sql(columns, mirror, batch, sign), schema)
            finally:
                engine.close()

        table = self.engines.run("recursion", f"mirror of {source} for view {self.plan.view}",
                                 work, rows=rows.num_rows)
        return table.select(schema.names).cast(schema)

    def _move_fixpoint(self, change: pa.Table, number: int) -> None:
        """R moved by its change: the tuples leaving removed, those entering appended (a
        rederived tuple does both: it enters with its new rank).

        One MERGE by deletion vectors: the leaving tuples are marked deleted in the files
        that hold them and the entering ones written as one new file, so the write costs
        what the batch changed, not the size of R (a closure of millions of tuples that a
        delete moves by a few hundred).  Compaction then rewrites only the files that need
        it: the small files of earlier batches as one, a file whose vector deletes a
        quarter of it alone.
        """
        added = change.filter(pc.greater(change.column(WEIGHT), 0)).select(self._r_schema.names)
        removed = change.filter(pc.less(change.column(WEIGHT), 0)).select(self._r_schema.names)
        path = self.fixpoint_path
        what = f"incr fixpoint of view {self.plan.view}'s recursive {self.rec.name}"
        if not self.store.exists(path) or not removed.num_rows:
            created = not self.store.exists(path)
            self.store.write(path, added.cast(self._r_schema), mode="append", batch=number,
                             description=what)
            if created:
                self._ready_fixpoint()
            return
        self.store.replace_rows(path, removed, added, batch=number)
        self.store.compact_files(path, tuple(self._r_schema.names), COMPACT_FILES_PER_BUCKET)

    def _ready_fixpoint(self) -> None:
        """Readies R, just created by a first load, for the batches after it: deletion
        vectors on, and its large files mirrored by each integer column a batch searches
        them by (the partition column, the columns a changed row is joined on: see
        :meth:`_read_r`), so the first batch after a load costs what later ones do and the
        load pays for the mirrors (as :meth:`~incr.runtime.state.ViewState.ready_for_vectors`
        does for a state table)."""
        keys = [] if self.rec.partition is None else [
            self.rec.partition, *(r_column for t in self.rec.sources
                                  for _, r_column in reach_keys(self.rec, t) or ())]
        self.store.ready_for_vectors(self.fixpoint_path, keys, every=True)


def _net(change: pa.Table, schema: pa.Schema) -> pa.Table:
    """ΔR from R's change: each tuple's signs summed (a rederived tuple's cancel)."""
    keys = [n for n in schema.names if n != WEIGHT]
    summed = change.group_by(keys, use_threads=False).aggregate([(WEIGHT, "sum")])
    weight = summed.column(f"{WEIGHT}_sum")
    net = pa.table([*(summed.column(k) for k in keys), weight], names=[*keys, WEIGHT])
    return net.filter(pc.not_equal(weight, 0)).cast(schema)


def _one_sign(dr: pa.Table) -> tuple[int, pa.Table]:
    """ΔR as the query's fold takes it most cheaply: plain tuples of one sign (+1 when every
    tuple enters R, -1 when every one leaves) like a batch of a source, else signed (0).

    A first load, and every insert that beats nothing, is all +1: the fold then takes its
    one-signed path (on an empty state in Spark, h(ΔR) written by the executors) instead of
    combining old and new rows of every touched group.
    """
    weight = dr.column(WEIGHT)
    for sign in (1, -1):
        if dr.num_rows and pc.all(pc.equal(weight, sign)).as_py():
            return sign, dr.drop_columns([WEIGHT])
    return 0, dr


def _source_schema(columns: tuple[Column, ...]) -> pa.Schema:
    return nullable(arrow_schema(columns))


def _mirror_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """A source's mirror: its columns and how many copies of the row are present."""
    return signed(_source_schema(columns))

"""A view's answer table: a(state), published as one Delta version per applied batch.

Layout in the warehouse::

    WAREHOUSE/answers/<view>                             Delta, one version per batch

Two ways to write it, as the compiler decided (:mod:`incr.compiler.publish`, printed by
``incr explain``):

* **by change**, when a is per group and the answer was current before the batch: the
  answer rows of the groups the batch touched are recomputed from those groups' state rows
  only (read from the buckets they hash to; a view regrouped from a finer state reads its
  touched groups' rows in every bucket, and is rewritten when they are most of its groups)
  and applied with one MERGE: a tombstone per touched group deletes its old rows, its new
  rows are inserted.  The old rows are marked in their files' deletion vectors
  (:mod:`~incr.runtime.deletion`) and the new ones go to one new file, so a batch whose
  groups are spread over the whole key range rewrites no file; the files a quarter of whose
  rows the vectors delete, and the small files once there are 32, are compacted, file by
  file.  Cost and memory follow the batch, not the answer;
* **rewritten** otherwise (a global aggregate, ORDER BY/LIMIT, a group key not shown, the
  first publish, a changed answer query, a fold finished by an earlier run), and when the
  state a reads is small enough that this costs less than the MERGE
  (``INCR_ANSWER_REWRITE_ROWS``): a(state) over the whole state, written as the table's new
  version.

Either way a batch is one commit, so readers see one consistent version per batch.  Queries
come from the compiler (``answer_sql``, ``answer_change_sql``).  They run on the driver
when the answer has been published before (its table's schema is then the target the
driver's result is cast to) and the state rows they read are few; otherwise in Spark.  A
rewrite computed in Spark is written by Spark's executors (the whole answer need not fit
the driver's memory); the changed groups' rows and a top-k are few, and are collected.
Each version carries the answer query's fingerprint and the state generation it was
computed from, so a changed answer query (say ``LIMIT 10`` → ``LIMIT 5``) or a rebuilt
state is republished rather than mistaken for current; until then the old version is
served (build, then swap: :mod:`~incr.runtime.maintain`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from incr.compiler.passes.share import served_owner
from incr.compiler.plan import BUCKET, IncrementalPlan
from incr.compiler.publish import GONE
from incr.compiler.sqlgen import merge_ident, render_touched_rows
from incr.config import (
    ANSWER_COMPACT_FILES,
    ANSWER_TARGET_FILE_BYTES,
)
from incr.runtime import sparkhash
from incr.runtime.engine import DRIVER, Engine, Engines, log
from incr.runtime.state import ViewState, recorded_members
from incr.runtime.store import BATCH_KEY, DeltaStore, has_deletion_vectors
from incr.runtime.types import nullable

if TYPE_CHECKING:
    from incr.compiler import CompiledProgram
    from incr.runtime.fold import ViewMetrics

ANSWER_FP = "incr.answer_fingerprint"
#: The state generation an answer version was computed from (its directory's name).
STATE_KEY = "incr.state"
T = TypeVar("T")


class AnswerTable:
    """The published answer of one view."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, state: ViewState,
                 engines: Engines, warehouse: Path):
        self.plan = plan
        self.store = store
        self.state = state
        self.engines = engines
        self.path = warehouse / "answers" / plan.view

    def through(self) -> int:
        """The batch the answer table reflects (-1: none, or not this view's: written by
        another answer query or from another state generation)."""
        commit = self.store.last_commit(self.path)
        if commit.get(ANSWER_FP) != self.plan.answer_fingerprint or \
                served_state(commit) != self.state.served_name:
            return -1
        return self.store.applied_through(self.path)

    def served(self) -> tuple[int, str | None]:
        """The batch the answer table shows and the state generation it was computed from,
        whichever definition wrote it ((-1, None): no answer yet).  While a changed or
        refreshed view rebuilds, that is the old one, still served."""
        commit = self.store.last_commit(self.path)
        return self.store.applied_through(self.path), served_state(commit)

    def compute(self, published: bool | None = None) -> pa.Table:
        """a(state) from the current state tables, on the engine :meth:`Engines.choose` picks.

        ``published``: whether this answer query has published before; None reads it from
        the answer table.
        """
        if published is None:
            published = self.through() >= 0
        return self._on_engine(0, lambda name: self._run(name, published))

    def _on_engine(self, rows: int, step: Callable[[str], T]) -> T:
        return self.engines.run("answer", f"view {self.plan.view}", step, rows=rows)

    def _run(self, name: str, published: bool) -> pa.Table:
        """a(state) on engine ``name``.  On the driver, an answer that has published takes
        its table's types; a first one, the types Spark gives it
        (:class:`~incr.runtime.local.TypedDriverEngine`)."""
        schema = self.store.schema(self.path) if name == DRIVER and published else None
        engine = self.engines.engine(name, self.store, typed=not published)
        try:
            views = self._state_views(engine, scanned=published and self._small())
            return engine.collect(self.plan.answer_sql(views), schema)
        finally:
            engine.close()

    def _small(self) -> bool:
        """Whether the published answer holds at most ``INCR_LOCAL_STATE_ROWS`` rows: then
        the next one most likely does too, however large the state it is computed from (a
        view regrouped from a finer state, the first k rows, a HAVING that keeps few)."""
        rows = self.store.row_count(self.path)
        return rows is not None and rows <= self.engines.settings.local_state_rows

    def _state_views(self, engine: Engine, scanned: bool = False) -> dict[str, str]:
        """Each main state table a reads, whole, registered on ``engine``; ``scanned``: by
        :meth:`~incr.runtime.engine.Engine.scan`, for an answer smaller than the state."""
        register = engine.scan if scanned else engine.delta
        return {t.name: register(f"incr_{self.plan.view}_state_{t.name}", self.state.path(t.name))
                for t in self.plan.answer_tables}

    def _rewrite(self, batch: int, published: bool) -> int:
        """Writes a(state), computed over the whole state, as the version for ``batch``;
        returns its rows.

        Computed on the driver, it is written from there; computed in Spark, Spark's
        executors write it (:meth:`SparkEngine.write`), so the whole answer never passes
        through the driver.
        """
        def step(name: str) -> int:
            if name == DRIVER:
                return self._write(self._run(DRIVER, published), batch)
            return self._write_from_spark(batch)
        rows = self._on_engine(0, step)
        self._ready_for_vectors(rows)
        return rows

    def _ready_for_vectors(self, rows: int) -> None:
        """Readies a rewritten answer that later batches MERGE by deletion vectors: the
        feature enabled and its large files mirrored by their first integer key column, as
        the state's tables at a load (:meth:`~incr.runtime.state.ViewState.ready_for_vectors`).
        The first MERGE after a load otherwise mirrors every file of the answer it
        searches (0.5 s of a 5M-row answer), in the batch a user waits for."""
        settings = self.engines.settings
        if not (self.plan.publish.by_change and settings.answer_by_change
                and settings.answer_deletion_vectors) or not self.store.mirror_rows \
                or rows < self.store.mirror_rows:
            return
        self.store.ready_for_vectors(self.path, self.plan.publish.columns)

    def _write_from_spark(self, batch: int) -> int:
        """a(state) written by Spark's executors, as :meth:`_write` writes it."""
        from incr.runtime.session import SparkEngine

        engine = SparkEngine(self.engines, self.store)
        try:
            return engine.write(self.path, self.plan.answer_sql(self._state_views(engine)),
                                mode="overwrite", batch=batch, replace_schema=True,
                                sort_by=self._sort_by(), target_file_size=ANSWER_TARGET_FILE_BYTES,
                                description=self._description(), metadata=self._metadata(batch))
        finally:
            engine.close()

    def _write(self, answer: pa.Table, batch: int) -> int:
        """Writes ``answer`` (on the driver) as the version for ``batch``; returns its rows."""
        if self._sort_by() and answer.num_rows:
            answer = answer.sort_by([(c, "ascending") for c in self._sort_by()])
        self.store.write(self.path, answer.cast(nullable(answer.schema)), mode="overwrite",
                         batch=batch, replace_schema=True, target_file_size=ANSWER_TARGET_FILE_BYTES,
                         description=self._description(), metadata=self._metadata(batch))
        return answer.num_rows

    def _sort_by(self) -> tuple[str, ...]:
        """The columns a rewritten answer is sorted by: those later MERGEs match on, so each
        file holds a narrow key range and a MERGE leaves the files no touched group falls
        in unread (none when the answer is never maintained by change)."""
        return self.plan.publish.columns if self.plan.publish.by_change else ()

    def _description(self) -> str:
        return f"incr answer of view {self.plan.view} (program {self.plan.program})"

    def publish(self, batch: int, touched: pa.Table | None = None,
                metrics: ViewMetrics | None = None, noted: bool = True) -> int:
        """Writes the answer table's version for ``batch`` (once); returns the rows written
        (-1: already published).

        ``touched``: θ and ``_bucket`` of the groups the batch changed, given only when the
        answer was a(state) of the state before the batch; then a per-group answer is
        maintained by change (a regrouped one, of the coarse groups they fall in, while
        those are few: :meth:`_regrouped_change_pays`).  Otherwise (or when the setting is
        off) a(state) is rewritten.
        ``noted``: whether rows a fold of ``batch`` kept (:meth:`ViewState.touched_rows`)
        may stand for the state's rows of ``touched``; not when ``touched`` also holds
        groups of earlier folds, whose rows those do not include.
        """
        through = self.through()
        if through >= batch:
            return -1
        vectors = self.engines.settings.answer_deletion_vectors
        regrouped = (touched is not None and through >= 0 and self.plan.publish.by_change
                     and self.plan.answer.rollup is not None)
        if regrouped:
            touched = self.coarse_groups(touched)
        if (touched is not None and through >= 0 and self.plan.publish.by_change
                and self.engines.settings.answer_by_change and not self._rewrite_pays()
                and (self._regrouped_change_pays(touched) if regrouped
                     else vectors or self._merge_pays(touched))):
            change = self.compute_change(touched, batch if noted else -1)
            merge = (self.store.merge(self.path, change)
                     .on_groups(self.plan.publish.columns, GONE)
                     .when_matched_delete()
                     .when_not_matched_insert_all(f"NOT s.{merge_ident(GONE)}"))
            if vectors:
                merge = merge.with_deletion_vectors()
            result = merge.for_batch(batch, self._metadata(batch)).execute()
            self._compact(batch)
            if metrics is not None:
                metrics.answer_mode = "change"
            return result.inserted
        answer = None
        if (touched is not None and through >= 0 and self.plan.publish.top
                and self.engines.settings.answer_by_change):
            answer = self.compute_top(touched)
            if metrics is not None and answer is not None:
                metrics.answer_mode = "top"
        if answer is not None:
            return self._write(answer, batch)
        if metrics is not None:
            metrics.answer_mode = "rewrite"
        return self._rewrite(batch, published=through >= 0)

    def _compact(self, batch: int) -> None:
        """MERGEs add files and mix key ranges, and deletion vectors leave deleted rows in
        the files; once there are too many of either, a sorted rewrite (a version with the
        same rows; the older files stay for readers still on them): of the whole answer,
        or with deletion vectors of the files that need it
        (:meth:`~incr.runtime.store.DeltaStore.compact_files`).

        An answer larger than the driver-side limit (``INCR_LOCAL_STATE_ROWS``) is rewritten
        by Spark's executors, so the driver never holds it.
        """
        from incr.runtime.session import compact

        if has_deletion_vectors(self.store.table(self.path)):
            self.store.compact_files(self.path, self._sort_by(), ANSWER_COMPACT_FILES)
            return
        compact(self.engines, self.store, self.path, self._sort_by(), ANSWER_COMPACT_FILES,
                metadata=self._metadata(batch), vacuum=False,
                target_file_size=ANSWER_TARGET_FILE_BYTES)

    def _rewrite_pays(self) -> bool:
        """Whether a(state) rewritten costs less than the MERGE by change: the state tables
        a reads hold at most ``INCR_ANSWER_REWRITE_ROWS`` rows together (0: never).

        The MERGE's cost is mostly fixed: the touched groups' rows read by key, the
        answer's rows of those groups found in its files, their deletion vectors and a
        commit written by hand, 24–27 ms for a SUM by key up to 100K groups on two cores.
        A rewrite reads the state (often held from the fold already), computes a over it
        and writes the answer in one file: 12 ms at 400 groups, 16 ms at 20K, 27 ms at
        100K, 80 ms at 400K.  A view answering from small state tables (a dashboard's
        handful of regions, a coarse grouping of a shared state) is rewritten.  Those are
        the driver's figures: with the driver-side engine off, a rewrite would be a Spark
        job writing through its executors, and the MERGE stays.
        """
        limit = self.engines.settings.answer_rewrite_rows
        if limit <= 0 or self.engines.local is None:
            return False
        total = 0
        for t in self.plan.answer_tables:
            rows = self.store.row_count(self.state.path(t.name))
            if rows is None:
                return False
            total += rows
            if total > limit:
                return False
        log.info("answer view %s: its state holds %d rows; rewritten", self.plan.view, total)
        return True

    def _merge_pays(self, touched: pa.Table) -> bool:
        """Whether a MERGE beats a rewrite: it rewrites every file a touched group may be in
        (copy on write), so once those hold most of the answer, writing it anew is cheaper.

        Judged on the files' ranges of the first key column (the answer is written sorted
        by the key columns, so a change to few or nearby keys reaches few files).  The
        share is the setting ``INCR_ANSWER_MERGE_REACH``.
        """
        column, theta = self.plan.publish.keys[0]
        reach = self.store.reach(self.path, column, touched.column(theta))
        if reach > self.engines.settings.answer_merge_reach:
            log.info("answer view %s: the change reaches %.0f%% of the answer's rows; rewritten",
                     self.plan.view, 100 * reach)
            return False
        return True

    def _regrouped_change_pays(self, groups: pa.Table) -> bool:
        """Whether a regrouped answer follows by change: its touched ``groups`` are at most
        the share ``INCR_ANSWER_MERGE_REACH`` of its rows.

        Their rows of the finer state are read by a filtered scan of every bucket (a
        group's rows are spread over them), about that share of the state; a rewrite reads
        the whole state once for every view regrouped from it.  So a batch touching most
        groups (or a small answer most of whose groups it touches) rewrites the answer.
        """
        rows = self.store.row_count(self.path)
        if rows is None or groups.num_rows > self.engines.settings.answer_merge_reach * rows:
            log.info("answer view %s: the batch touches %d of its %s groups; rewritten",
                     self.plan.view, groups.num_rows, rows)
            return False
        return True

    def compute_change(self, touched: pa.Table, batch: int = -1) -> pa.Table:
        """The answer rows of the ``touched`` groups, with a tombstone per group
        (:meth:`~incr.compiler.plan.IncrementalPlan.answer_change_sql`), from the rows of
        them kept after the fold of ``batch`` (:meth:`ViewState.touched_rows`), else read
        from the touched buckets of the state only (-1: nothing kept applies)."""
        schema = self.store.schema(self.path).append(pa.field(GONE, pa.bool_()))
        # a regrouped answer's groups have rows in every bucket of the finer state
        buckets = (pc.unique(touched.column(BUCKET)).to_pylist()
                   if BUCKET in touched.column_names else None)
        return self._on_engine(touched.num_rows, lambda name: self._run_change(
            name, touched, buckets, schema, batch))

    def coarse_groups(self, touched: pa.Table) -> pa.Table:
        """The groups of a regrouped answer (:class:`~incr.compiler.plan.Rollup`) that the
        ``touched`` groups of the finer state fall in, once each, under the view's names for
        its keys: those whose answer rows a batch can change."""
        rollup = self.plan.answer.rollup
        assert rollup is not None, f"view {self.plan.view} is not regrouped"
        if rollup.derived:  # keys computed from θ: by a query, typed as the answer's columns
            answer = self.store.schema(self.path)
            column = {theta: col for col, theta in self.plan.publish.keys}
            schema = pa.schema([*((own, touched.schema.field(state).type)
                                  for state, own in rollup.keys),
                                *((own, answer.field(column[own]).type)
                                  for _, own in rollup.derived)])
            return self._on_engine(touched.num_rows, lambda name: self._run_coarse(
                name, touched, schema))
        names = [own for _, own in rollup.keys]
        fine = pa.table([touched.column(state) for state, _ in rollup.keys], names=names)
        return fine.group_by(names, use_threads=False).aggregate([])

    def _run_coarse(self, name: str, touched: pa.Table, schema: pa.Schema) -> pa.Table:
        engine = self.engines.engine(name, self.store)
        try:
            fine = engine.table(f"incr_{self.plan.view}_fine", touched)
            return engine.collect(self.plan.coarse_groups_sql(fine), schema)
        finally:
            engine.close()

    def compute_top(self, touched: pa.Table) -> pa.Table | None:
        """A top-k answer from the old top rows' groups and the ``touched`` groups (reading
        only their buckets of the state), or None when a touched row fell out of the top and
        a(state) must be recomputed whole (see :mod:`incr.compiler.publish`)."""
        subject = f"view {self.plan.view}"
        old = self.store.read(self.path)
        groups = self._groups_of(old, touched)
        if groups is None:
            return None
        schema = self.store.schema(self.path)
        buckets = pc.unique(groups.column(BUCKET)).to_pylist()
        exact, rows = self._on_engine(groups.num_rows, lambda name: self._run_top(
            name, groups, buckets, old, schema))
        if not exact:
            log.info("answer %s: a touched row fell out of the top %d; recomputed whole",
                     subject, self.plan.answer.limit)
            return None
        return rows

    def _groups_of(self, old: pa.Table, touched: pa.Table) -> pa.Table | None:
        """θ and ``_bucket`` of the touched groups and of the groups of the old answer rows
        (their θ read from the columns showing it, hashed as the state hashes it)."""
        main = self.plan.main_tables[0]
        state = self.state.schema(main.name)
        try:
            theta = {k: old.column(col).cast(state.field(k).type)
                     for col, k in self.plan.publish.keys}
            hashed = sparkhash.buckets(list(theta.values()),
                                       self.plan.top.buckets_of(main.name))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, sparkhash.UnsupportedType) as e:
            log.info("answer view %s: old top rows not hashed (%s); recomputed whole",
                     self.plan.view, e)
            return None
        names = [BUCKET, *theta]
        shape = pa.schema([state.field(n) for n in names])
        olds = pa.table([hashed.cast(shape.field(BUCKET).type), *theta.values()], schema=shape)
        return pa.concat_tables([touched.select(names).cast(shape), olds])

    def _run_top(self, name: str, groups: pa.Table, buckets: list[int], old: pa.Table,
                 schema: pa.Schema) -> tuple[bool, pa.Table]:
        engine = self.engines.engine(name, self.store)
        prefix = f"incr_{self.plan.view}_"
        try:
            views = self._touched_views(engine, groups, buckets)
            rows = engine.collect(self.plan.answer_sql(views), schema)
            limit = self.plan.answer.limit
            assert limit is not None
            if old.num_rows < limit:  # every live group was in the old top: none is missing
                return True, rows
            check = self.plan.top_check_sql(engine.table(f"{prefix}top_new", rows),
                                            engine.table(f"{prefix}top_old", old))
            n = engine.collect(check, pa.schema([("n", pa.int64())])).column("n")[0].as_py()
            return n >= limit, rows
        finally:
            engine.close()

    def _touched_views(self, engine: Engine, groups: pa.Table, buckets: list[int] | None,
                       batch: int = -1) -> dict[str, str]:
        """Each main state table restricted to the rows of ``groups`` (read from ``buckets``).

        On the driver only the state rows whose θ columns each hold one of the groups'
        values are read (a filtered scan), so the driver holds about the touched groups'
        rows, not their buckets: a batch of keys spread over the whole key range reaches
        every bucket.  A regrouped view's coarse groups computed from θ (``year(day)``) are
        found in ``main`` first, and the other tables read by the finer groups found there.
        ``batch``, when ``groups`` are the ones its fold touched: a table's
        rows kept after that fold (:meth:`ViewState.touched_rows`) are not read again, and
        on the driver the rows read are kept for the other views sharing the state.
        """
        prefix = f"incr_{self.plan.view}_"
        keys = engine.table(f"{prefix}touched", groups)
        rollup = self.plan.answer.rollup
        # Rows kept after a fold are those of its finer groups, not of a coarse group whole.
        kept = self.state.touched_rows(batch) if rollup is None else {}
        keep = (batch >= 0 and engine.name == DRIVER and self.plan.shares is not None
                and rollup is None)
        # A coarse group computed from θ is found by its function's values, which no read by
        # key narrows: its finer groups are read from ``main`` (a row per group), first, and
        # the bags by them.
        finer = rollup is not None and bool(rollup.derived) and engine.name == DRIVER
        main = self.plan.answer.main
        tables = sorted(self.plan.answer_tables, key=lambda t: t.name != main)
        views: dict[str, str] = {}
        groups_read: pa.Table | None = None  # finer: main's rows of the touched groups
        for t in tables:
            name = f"{prefix}touched_{t.name}"
            if t.name in kept:
                views[t.name] = engine.table(name, kept[t.name])
                continue
            matching: dict[str, pa.Array] | None
            if groups_read is not None:
                matching = {k.name: groups_read.column(k.name) for k in t.keys
                            if k.name in groups_read.column_names} or None
            else:
                if rollup is not None:  # state column: the view's name for it (not the derived)
                    columns = dict(rollup.keys)
                else:
                    columns = {k.name: k.name for k in t.keys if k.name in groups.column_names}
                matching = ({c: groups.column(own) for c, own in columns.items()}
                            if engine.name == DRIVER and columns else None)
            state = engine.delta(f"{prefix}state_{t.name}", self.state.path(t.name), buckets,
                                 matching=matching, every=True,
                                 bucketed_by=None if rollup else self.plan.top.bucketed_by(t))
            rows = render_touched_rows(self.plan.answer, t, state, keys)
            if finer and t.name == main:
                groups_read = engine.collect(rows, self.state.schema(t.name))
                views[t.name] = engine.table(name, groups_read)
            elif keep:
                read = engine.collect(rows, self.state.schema(t.name))
                self.state.note_rows(batch, t.name, read)
                views[t.name] = engine.table(name, read)
            else:
                views[t.name] = engine.view(name, rows)
        return views

    def _run_change(self, name: str, touched: pa.Table, buckets: list[int] | None,
                    schema: pa.Schema, batch: int) -> pa.Table:
        engine = self.engines.engine(name, self.store)
        try:
            views = self._touched_views(engine, touched, buckets, batch)
            keys = f"incr_{self.plan.view}_touched"
            return engine.collect(self.plan.answer_change_sql(views, keys), schema)
        finally:
            engine.close()

    def _metadata(self, batch: int) -> dict[str, str]:
        return {ANSWER_FP: self.plan.answer_fingerprint,
                "incr.state_fingerprint": self.plan.state_fingerprint,
                STATE_KEY: self.state.served_name,
                "incr.program": self.plan.program, BATCH_KEY: str(batch)}


def served_state(commit: dict[str, Any]) -> str | None:
    """The state generation an answer commit names (an answer written before generations
    were recorded names its state fingerprint, the directory of its generation 0)."""
    return commit.get(STATE_KEY) or commit.get("incr.state_fingerprint")


def settle(compiled: CompiledProgram, warehouse: Path, store: DeltaStore) -> CompiledProgram:
    """``compiled`` as it runs against ``warehouse``
    (:meth:`~incr.compiler.CompiledProgram.settled`): the views sharing a state keep the
    states their published answers are computed from, so adding a view (or switching
    sharing on), or removing one they shared with, never rebuilds a view that is being
    served; a refresh regroups them."""
    served: dict[str, str] = {}
    owners = {s.owner for s in compiled.shares}
    for view in [*(v for s in compiled.shares for v in s.views),
                 *(v for v, _ in compiled.unshared[1])]:
        state = served_state(store.last_commit(warehouse / "answers" / view))
        if state:
            served[view] = state
            if "/" in state:  # served from a shared state: its generations, and the view's own
                owners.update((served_owner(state, view), view))
    present: list[str] = []
    for owner in sorted(owners):
        root = warehouse / "state" / owner
        present += [f"{owner}/{p.name}" for p in root.iterdir() if p.is_dir()] \
            if root.is_dir() else []
    recorded = {state: members for state in set(served.values()) if "/" in state
                for members in [recorded_members(warehouse / "state" / state)] if members}
    return compiled.settled(served, present, recorded)

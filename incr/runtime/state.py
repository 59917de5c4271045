"""A view's state tables: where they live, how far they are, how they are created and written.

Layout in the warehouse::

    WAREHOUSE/state/<view>/<state fingerprint>/<table>   Delta, partitioned by _bucket
    WAREHOUSE/state/<view>/<state fingerprint>.r<N>/...  the same, rebuilt by ``incr refresh``
    WAREHOUSE/state/<shared>/<generation>/.members.json  the views a shared state was built for

A view's state lives in one *generation* directory: its fingerprint's newest (a changed
view gets a new fingerprint, a full refresh a new ``.r<N>`` beside the old one).  The
generation its published answer was computed from stays until the new one has caught up
and published (build, then swap; see :mod:`~incr.runtime.maintain`).

Every write goes through the storage adapter's MERGE (:class:`~incr.runtime.store.Merge`)
with a spec the compiler derived (⊗, ⊗̃, ⊗±, ⊗=), and records its batch number in the same
commit, so applying a batch is idempotent table by table.  After each MERGE a table is
compacted once it holds more than :data:`~incr.config.COMPACT_FILES_PER_BUCKET` files per
bucket *of its own* bucket count (a side table of a global aggregate has the program's
buckets, its main table one); a table larger than the driver-side limit is rewritten by
Spark's executors, so no compaction brings a large state to the driver.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.plan import (
    BUCKET,
    WEIGHT,
    IncrementalPlan,
    MergeSpec,
    Query,
    StagePlan,
    StateTable,
)
from incr.compiler.sqlgen import (
    render_anti_delta,
    render_consolidated,
    render_kept_fold,
    render_kept_rows,
    render_none,
    render_rows,
    render_stage_delta,
)
from incr.config import COMPACT_FILES_PER_BUCKET
from incr.errors import StorageError
from incr.runtime.engine import per_engine
from incr.runtime.landing import DELETE
from incr.runtime.store import DeltaStore, has_deletion_vectors
from incr.runtime.touchlog import TouchLog
from incr.runtime.types import arrow_schema, nullable

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame

    from incr.runtime.engine import Engine, Engines
    from incr.runtime.session import SparkEngine

#: What a MERGE folds: a batch's insertions (⊗), deletions (⊗̃), signed rows (⊗±) or rows
#: already combined by a query (⊗=).
INSERT, SIGNED, REPLACED = "insert", "signed", "replaced"

#: Beside a shared state's tables: the views it was built for, ``[[name, SELECT], ...]`` in
#: the order their aggregates were merged (:attr:`~incr.compiler.passes.share.Share.recorded`),
#: so the views that stay when some leave the program can keep it.
MEMBERS = ".members.json"

#: A table to create: its name, h(∅) with Spark's types, its keys, and whether it is
#: partitioned by bucket.
Initial = tuple[str, pa.Table, tuple[str, ...], bool]


def recorded_members(generation: Path) -> tuple[tuple[str, str], ...]:
    """The views the shared state generation at ``generation`` was built for (none when it
    recorded none: made before they were recorded, or unreadable)."""
    try:
        return tuple((str(n), str(q)) for n, q in json.loads((generation / MEMBERS).read_text()))
    except (OSError, ValueError, TypeError):
        return ()


class ViewState:
    """The state tables of one view (one state fingerprint), or of the views that share
    them (:mod:`incr.compiler.passes.share`): one object for them all in a run."""

    #: Generations this process started (:meth:`new_generation`), so a root kept while a
    #: lock is held (:attr:`pin`) is looked up again after one, whichever object made it.
    _started = 0

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, warehouse: Path,
                 engines: Engines | None = None, members: tuple[tuple[str, str], ...] = ()):
        """``engines``: the run's engines, so a large table is compacted in Spark (None:
        always on the driver).  ``members``: for a shared state, the views whose aggregates
        it holds (recorded beside it: :data:`MEMBERS`)."""
        self.plan = plan
        self.members = members
        self.store = store
        self.engines = engines
        self.view_root = warehouse / "state" / plan.state_owner
        self._ready: Path | None = None  # the generation whose tables are known to exist
        #: The live rows of the touched groups, per main table of the view's own stage, that
        #: a fold by deletion vectors wrote for a batch: ``(batch, {table: rows})``.
        self._touched_rows: tuple[int, dict[str, pa.Table]] = (-1, {})
        #: The last fold: ``(batch, the batch the state was at before it, the groups it
        #: touched)``, so the other views sharing the state publish by change after it.
        self.folded: tuple[int, int, pa.Table | None] = (-1, -1, None)
        #: While the view's lock is held, a number standing for that hold (else None):
        #: :meth:`Locks.holding <incr.runtime.lock.Locks.holding>`, set by the pipeline.
        #: The newest generation cannot change under a hold but by this process, so
        #: :attr:`root` is looked up once per hold rather than on every use.
        self.pin: Callable[[], int | None] | None = None
        self._pinned: tuple[tuple[int, int], Path] | None = None

    @property
    def root(self) -> Path:
        """The state directory: the newest generation of the view's state fingerprint.

        Looked up on every use (a directory listing), so a runtime built before a refresh
        made a new generation writes to the new one once it holds the view's lock; once
        per hold of that lock (:attr:`pin`), in which no other process starts one.
        """
        hold = self.pin() if self.pin is not None else None
        seen = None if hold is None else (hold, ViewState._started)
        if seen is not None and self._pinned is not None and self._pinned[0] == seen:
            return self._pinned[1]
        root = self.view_root / self.generation_name(self._generation())
        if seen is not None:
            self._pinned = (seen, root)
        return root

    @property
    def touch_log(self) -> TouchLog:
        """The groups each fold of this state touched, for the views sharing it that publish
        in another process (:mod:`~incr.runtime.touchlog`)."""
        return TouchLog(self.root)

    def _generation(self) -> int:
        """The newest refresh generation of the fingerprint present (0: the plain one)."""
        newest = 0
        prefix = f"{self.plan.state_fingerprint}.r"
        if self.view_root.is_dir():
            for child in self.view_root.iterdir():
                if child.name.startswith(prefix) and child.name[len(prefix):].isdigit():
                    newest = max(newest, int(child.name[len(prefix):]))
        return newest

    @property
    def served_name(self) -> str:
        """How an answer computed from this state names it (the answer's ``incr.state``):
        the generation's directory, under the shared state's name when views share it, so
        a view that starts or stops sharing never takes another state for its own."""
        name = self.root.name
        return name if self.plan.shares is None else f"{self.plan.shares}/{name}"

    def generation_name(self, generation: int) -> str:
        """The directory name of a generation of this view's state."""
        fingerprint = self.plan.state_fingerprint
        return fingerprint if generation == 0 else f"{fingerprint}.r{generation}"

    def new_generation(self) -> Path:
        """Starts a full refresh: an empty generation directory after the newest, which
        every later fold builds from batch 0 (the caller holds the view's lock)."""
        root = self.view_root / self.generation_name(self._generation() + 1)
        root.mkdir(parents=True)
        ViewState._started += 1
        return root

    def path(self, table: str) -> Path:
        return self.root / table

    def through(self, table: str) -> int:
        """The last batch ``table`` committed (-1: none)."""
        return self.store.applied_through(self.path(table))

    def schema(self, table: str) -> pa.Schema:
        return self.store.schema(self.path(table))

    def is_empty(self, table: str) -> bool:
        """True when ``table`` holds no row (before the initial load)."""
        return self.store.is_empty(self.path(table))

    # -- writing -----------------------------------------------------------------------------
    @per_engine("⊗/⊗̃ as MERGE and as a query", "delta-rs MERGE")
    def merge(self, table: StateTable, spec: MergeSpec, rows: pa.Table, batch: int, kind: str) -> int:
        """Folds ``rows`` into ``table`` with ``spec``; returns the source rows merged.

        Raises:
            StorageError: deleted rows (⊗̃) that match no state row: the state and the row
                index disagree, and the view must be rebuilt.
        """
        path = self.path(table.name)
        sort_by = (BUCKET, *table.sort_columns)
        if kind == INSERT and rows.num_rows and self.store.is_empty(path):
            # state ⊗ h(ΔS) with an empty state is h(ΔS) itself.
            self.store.append(path, rows.sort_by([(c, "ascending") for c in sort_by]), batch=batch)
            return rows.num_rows
        merge = self.store.merge(path, rows).on(spec.keys, buckets=rows.column(BUCKET).to_pylist())
        if spec.delete_when:
            merge = merge.when_matched_delete(spec.delete_when)
        merge = merge.when_matched_update(dict(spec.updates))
        if spec.insert_unmatched:
            merge = merge.when_not_matched_insert_all(spec.insert_when)
        result = merge.for_batch(batch).execute()
        if kind == DELETE and result.updated + result.deleted != result.source_rows:
            raise StorageError(
                f"view {self.plan.view}: {result.source_rows - result.updated - result.deleted} "
                f"rows of h(ΔS') matched no state row in {table.name}; the state is out of step "
                f"with the row index. Rebuild the view (delete WAREHOUSE/state/{self.plan.view}).")
        self.compact(table)
        return result.source_rows

    def vectors(self, table: StateTable) -> bool:
        """Whether the batch's ⊗= into ``table`` keeps deletion vectors
        (:meth:`replace_by_vectors`): for a keyed table of more rows than
        ``INCR_STATE_VECTOR_ROWS``, unless ``INCR_STATE_DELETION_VECTORS`` is off (and
        never without the run's engines).

        Below that size copying the files a MERGE reaches costs less than the vectors'
        extra queries (the old rows read, the live rows picked).  A side table that has
        vectors keeps them, whatever its size or the setting: inserts may have split a
        θ's count over several rows (``Fold._append_side``), which a MERGE would update
        each, and only the vectors' ⊗= sums.
        """
        if self.engines is None or not table.key_columns or self.is_empty(table.name):
            return False
        if table.side_of is not None and has_deletion_vectors(self.store.table(self.path(table.name))):
            return True
        if not self.engines.settings.state_deletion_vectors:
            return False
        rows = self.store.row_count(self.path(table.name))
        return rows is None or rows > self.engines.settings.state_vector_rows

    def ready_for_vectors(self, table: StateTable) -> None:
        """Readies a table the next batches ⊗ by deletion vectors (:meth:`vectors`) but
        that has no vectors yet (just loaded, or just grown past the threshold), while its
        batch is being applied anyway: the feature is enabled, so reads by key search only
        the rows the keys reach (not a filtered scan of every file), and its large files
        are mirrored by the column they are sorted by (:mod:`~incr.runtime.mirror`: the
        bucket's column, a side table's join key).  The first batch after a load then costs
        what later ones do; the load pays for the mirrors."""
        path = self.path(table.name)
        if not self.store.exists(path) or has_deletion_vectors(self.store.table(path)) \
                or not self.vectors(table):
            return
        self.store.ready_for_vectors(path, table.sort_columns)

    def replace_by_vectors(self, table: StateTable, changed: pa.Table, live: pa.Table,
                           batch: int) -> int:
        """⊗= by deletion vectors: the rows of ``changed``'s keys are marked deleted where
        they are, and ``live`` (those of ``changed`` still live) are written to one new
        file per bucket; returns the rows of ``changed``.

        The same rows as the ⊗= MERGE (:meth:`merge` with the stage's replace spec), which
        copies every file a changed key may be in: with keys spread over the key range,
        all of them.
        """
        keys = [BUCKET, *table.key_columns]
        self.store.replace_rows(self.path(table.name), changed.select(keys), live, batch=batch)
        self.compact(table)
        return changed.num_rows

    def append_by_vectors(self, table: StateTable, rows: pa.Table, batch: int) -> None:
        """Adds ``rows`` to a side table as rows of their own (one new file per bucket, in
        the commit that records ``batch``), beside any rows of the same θ: a side table's
        count of θ is the sum of its rows' (see ``Fold._append_side``)."""
        assert table.side_of is not None, f"{table.name}: only a side table's rows add up"
        keys = [BUCKET, *table.key_columns]
        self.store.replace_rows(self.path(table.name), rows.select(keys).slice(0, 0), rows,
                                batch=batch)
        self.compact(table)

    def note_rows(self, batch: int, table: str, rows: pa.Table) -> None:
        """Keeps ``rows``, every live row of the groups ``batch`` touched in ``table`` (a main
        table of the view's own stage) after its fold, for answers to read instead of the
        state: a fold by deletion vectors writes them, and the first view sharing the state
        to read them for its answer keeps them for the others."""
        if self._touched_rows[0] != batch:
            self._touched_rows = (batch, {})
        self._touched_rows[1][table] = rows

    def touched_rows(self, batch: int) -> dict[str, pa.Table]:
        """The rows :meth:`note_rows` kept for ``batch``, by table (those it kept)."""
        at, rows = self._touched_rows
        return rows if at == batch >= 0 else {}

    def append_from_spark(self, engine: SparkEngine, table: StateTable,
                          rows: Query | str | DataFrame, batch: int) -> int:
        """Writes h(ΔS) (``rows``, a query or DataFrame on ``engine``) into the empty
        ``table`` for ``batch``; returns the rows written.

        This is :meth:`merge` of an insert batch into an empty state (the initial load:
        state ⊗ h(ΔS) = h(ΔS)) with nothing collected: Spark's executors write one file
        per bucket, sorted by key as a compaction leaves it, and delta-rs commits them
        with the batch marker.

        Raises:
            StorageError: ``table`` holds rows (appending would duplicate keys; MERGE), or
                the rows do not fit its schema.
        """
        path = self.path(table.name)
        if not self.is_empty(table.name):
            raise StorageError(f"view {self.plan.view}: state table {table.name} holds rows; "
                               f"h(ΔS) must be merged into it, not appended")
        return engine.write(path, rows, mode="append", batch=batch, sort_by=table.sort_columns)

    def compact(self, table: StateTable) -> bool:
        """Rewrites ``table`` sorted once it has too many files for its own bucket count; a
        table with deletion vectors file by file (:meth:`DeltaStore.compact_files`: a
        bucket's small files as one, a file whose vector deletes a quarter of it alone).

        A table of more rows than the driver-side engine may hold
        (``INCR_LOCAL_STATE_ROWS``) is rewritten by Spark's executors, so compaction never
        brings a large state to the driver; a smaller one by delta-rs on the driver.
        """
        path = self.path(table.name)
        sort_by = (BUCKET, *table.sort_columns)
        if has_deletion_vectors(self.store.table(path)):
            return self.store.compact_files(path, sort_by, COMPACT_FILES_PER_BUCKET) > 0
        limit = COMPACT_FILES_PER_BUCKET * self.plan.stage_of(table.name).buckets_of(table.name)
        if self.engines is None:
            return self.store.compact(path, sort_by, limit)
        from incr.runtime.session import compact

        return compact(self.engines, self.store, path, sort_by, limit)

    def write_outbox(self, stage: StagePlan, rows: pa.Table, batch: int) -> None:
        """Replaces the stage's outbox by its output change for ``batch``."""
        path = self.path(stage.outbox)
        self.store.write(path, rows.cast(nullable(self.store.schema(path))), mode="overwrite",
                         batch=batch)

    def check_outbox(self, stage: StagePlan, batch: int) -> Path:
        """The outbox of ``stage``, which must hold the output change of ``batch``."""
        path = self.path(stage.outbox)
        through = self.store.applied_through(path)
        if through != batch:
            raise StorageError(f"view {self.plan.view}: the output changes of stage {stage.name} "
                               f"are at batch {through}, not {batch}; rebuild the view (delete "
                               f"WAREHOUSE/state/{self.plan.view})")
        return path

    def drop_stale(self, keep: str | None = None) -> list[str]:
        """Removes the state directories of other versions and generations of this view but
        ``keep`` (the one its served answer was computed from, until the new one takes
        over); returns the names removed."""
        if not self.view_root.is_dir():
            return []
        current = self.root.name
        gone = []
        for child in self.view_root.iterdir():
            if child.is_dir() and child.name not in (current, keep):
                self.store.remove(child)
                gone.append(child.name)
        return gone

    # -- creating the state: h(∅) -------------------------------------------------------------
    def ensure_tables(self, engines: Engines) -> None:
        """Creates every missing state table with its content for no input at all, h(∅).

        That is empty for grouped state, the identity row for a global aggregate (SQL
        answers one row over no rows), and for a side table mirroring a stage, that
        stage's output over nothing.  Each table takes the types Spark gives it, whichever
        engine later folds a batch into it: the driver computes h(∅) with those types
        (:class:`~incr.runtime.local.TypedDriverEngine`) where it knows them, and Spark
        otherwise.  Every table's rows are computed before any is written, so a step that
        gives way to Spark leaves nothing behind.
        """
        root = self.root
        if self._ready == root:
            return
        paths = [t.name for s in self.plan.stages for t in self.plan.stored(s)]
        paths += list(self.plan.outboxes()) + [t.name for t in self.plan.kept()]
        if not all(self.store.exists(self.path(p)) for p in paths):
            for table, rows, keys, partitioned in engines.run(
                    "create", f"the state tables of view {self.plan.view}",
                    lambda name: self._initial_rows(engines, name), rows=0):
                self._create(table, rows, keys, partitioned)
        self._record_members(root)
        self._ready = root

    def _record_members(self, root: Path) -> None:
        """Writes :data:`MEMBERS` beside a shared state that has none (written aside, then
        renamed: a reader sees all of it or nothing)."""
        if not self.members or (root / MEMBERS).exists():
            return
        tmp = root / f"{MEMBERS}.{os.getpid()}.tmp"  # one per process: they may race
        tmp.write_text(json.dumps([list(m) for m in self.members]))
        tmp.replace(root / MEMBERS)

    def _initial_rows(self, engines: Engines, name: str) -> list[Initial]:
        """h(∅) of every missing table, computed on engine ``name``."""
        engine = engines.engine(name, self.store, typed=True)
        try:
            return self._initial_tables(engine)
        finally:
            engine.close()

    def _initial_tables(self, engine: Engine) -> list[Initial]:
        """Each missing table's h(∅): the plan's stages run on ``engine`` over empty sources,
        each stage reading the previous ones' output over nothing."""
        initial: list[Initial] = []
        prefix = f"incr_{self.plan.view}_init_"
        sources = {}
        for decl in self.plan.source_tables:
            empty = arrow_schema(decl.columns).empty_table()
            empty = empty.append_column(WEIGHT, pa.array([], pa.int64()))
            sources[decl.name.lower()] = engine.table(f"{prefix}src_{decl.name}", empty)
        outputs: dict[str, str] = {}
        for stage in self.plan.stages:
            inputs = {i.alias: (outputs[i.table] if i.derived else sources[i.table.lower()], 0)
                      for i in stage.inputs}
            sides: dict[str, str] = {}
            for table in stage.tables:
                if table.side_of is None:
                    continue
                sides[table.side_of] = engine.view(
                    f"{prefix}{table.name}", self.plan.h_query(table.name, inputs[table.side_of][0]))
                initial += self._initial(table.name, engine, sides[table.side_of], table.key_columns)
            # The stage's input over nothing is not always empty: a global aggregate it reads
            # answers one row over no rows.  So h(∅) here is h of that input, built as the
            # change that brings every derived input from no rows to its output over nothing
            # (joined against empty sides, the one term with all of them is the whole join).
            if stage.direct:
                delta = inputs[stage.inputs[0].alias][0]
            else:  # every branch's columns, as one union
                empty_sides = {a: engine.view(f"{prefix}void_{a}", render_none(v))
                               for a, v in sides.items()}
                changed = {b.join.inputs[0].alias: inputs[b.join.inputs[0].alias]
                           for b in stage.branches}
                changed.update({i.alias: (inputs[i.alias][0], 1) for i in stage.inputs
                                if i.derived})
                anti = {a.input.alias: render_anti_delta(a, inputs[a.input.alias][0],
                                                         empty_sides[a.input.alias])
                        for b in stage.branches for a in b.join.anti if a.input.alias in changed}
                delta = engine.view(f"{prefix}delta_{stage.name}", render_stage_delta(
                    stage, changed, empty_sides, anti))
            columns = engine.schema_of(delta).names
            rows = engine.view(f"{prefix}rows_{stage.name}", render_consolidated(delta, columns))
            state: dict[str, str] = {}
            for table in stage.main_tables:
                state[table.name] = engine.view(f"{prefix}{table.name}",
                                               self.plan.h_query(table.name, rows))
                if table in self.plan.stored(stage):
                    initial += self._initial(table.name, engine, state[table.name],
                                             table.key_columns)
            outputs[stage.name] = engine.view(f"{prefix}out_{stage.name}",
                                             render_rows(stage.answer, state))
            if stage.outbox in self.plan.outboxes():
                handed = outputs[stage.name]
                if stage.kept is not None:  # the output over nothing is handed on from here
                    handed = engine.view(f"{prefix}kept_{stage.name}", render_kept_rows(stage, state))
                    kept = engine.view(f"{prefix}keep_{stage.name}", render_kept_fold(stage, handed))
                    initial += self._initial(stage.kept.name, engine, kept, stage.kept.key_columns)
                none = engine.view(f"{prefix}none_{stage.name}", render_none(handed))
                initial += self._initial(stage.outbox, engine, none, (), partitioned=False)
        return initial

    def _initial(self, table: str, engine: Engine, view: str, keys: tuple[str, ...],
                 partitioned: bool = True) -> list[Initial]:
        """The rows of ``view`` for the missing table ``table``, with Spark's types (none
        when the table exists)."""
        if self.store.exists(self.path(table)):
            return []
        schema = engine.schema_of(view)
        data = engine.collect(f"SELECT * FROM {view}", schema)
        return [(table, data.cast(schema) if data.num_rows else schema.empty_table(), keys,
                 partitioned)]

    def _create(self, table: str, data: pa.Table, keys: tuple[str, ...],
                partitioned: bool = True) -> None:
        """Writes h(∅) of ``table``.  ``partitioned``: by ``_bucket`` when it has one (an
        outbox, rewritten whole each batch, is not)."""
        path = self.path(table)
        if self.store.exists(path):
            return
        partition = [BUCKET] if BUCKET in data.schema.names and partitioned else None
        self.store.write(path, data, mode="append", batch=None, partition_by=partition,
                         description=f"incr state {table} of view {self.plan.view} (program "
                                     f"{self.plan.program}, state {self.plan.state_fingerprint}); "
                                     f"keyed by {', '.join(keys) or '()'}")

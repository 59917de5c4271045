"""A program's whole run: register landed files, then apply each batch exactly once.

For each batch, in batch-number order:

1. read the file strictly (:mod:`~incr.runtime.ingest`); a bad file rejects the batch;
2. the source's row index checks deletions and records the batch (not for append-only
   sources, which refuse delete batches);
3. every view over that source folds the batch into its state and publishes its answer.

Each step commits its batch number with its data, so a run that dies anywhere is finished by
the next run, and nothing is applied twice.  A Parquet file larger than the slice budget is
registered as several batches, one per slice of its row groups (:mod:`~incr.runtime.slicing`),
so a backfill of files far larger than Spark's memory goes a bounded slice at a time and a
killed run resumes at the slice it was applying.  A rejected batch stops the run: the batches
before it stay applied, it and the ones after wait, and every later run tries it again
until the file is fixed (or skipped on purpose with ``incr skip``).

The same steps are exposed separately for Airflow (:meth:`Pipeline.prepare` then one
:meth:`Pipeline.apply_view` per view), so views can run as parallel tasks: each step locks
only what it writes (:mod:`~incr.runtime.lock`), and nothing starts Spark unless a step
needs it (:mod:`~incr.runtime.engine`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from incr.compiler import CompiledProgram
from incr.compiler.passes.share import is_owned_by
from incr.compiler.program import TableDecl
from incr.config import Settings
from incr.errors import CompileError, InputError, Location, OutOfRangeError, StorageError
from incr.runtime import faults
from incr.runtime.answer import settle
from incr.runtime.bucket import BucketWarehouse
from incr.runtime.engine import Engines, log
from incr.runtime.ingest import LoadedBatch, load_batch, sweep_slices
from incr.runtime.iterate import view_runtime
from incr.runtime.landing import DELETE, INSERT, LandedFile, discover, sha256_of
from incr.runtime.ledger import Batch, Ledger
from incr.runtime.local import LocalSql
from incr.runtime.lock import Locks, alive
from incr.runtime.maintain import Change, ViewMetrics, ViewRuntime
from incr.runtime.progress import Emit, Progress
from incr.runtime.remote import RemoteLanding, is_remote
from incr.runtime.rowindex import RowIndex
from incr.runtime.schemas import SchemaLog
from incr.runtime.slicing import Part, parts, slice_budget
from incr.runtime.state import ViewState
from incr.runtime.store import DeltaStore, check_table_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Written in the program's folder while ``incr backfill`` runs (its pid, start and views).
BACKFILL_MARKER = "backfill.json"


@dataclass
class BatchReport:
    """What applying one batch did."""

    seq: int
    path: str
    table: str
    kind: str
    rows: int = 0
    read_s: float = 0.0
    index_s: float = 0.0
    total_s: float = 0.0
    views: list[ViewMetrics] = field(default_factory=list)
    part: str | None = None  # the slice of the file, e.g. "row groups 8-9 of 40"


@dataclass
class RunReport:
    """What a run did: batches registered and applied, and the rejection that stopped it."""

    program: str
    registered: int = 0
    applied: list[BatchReport] = field(default_factory=list)
    rejected: InputError | None = None
    rejected_batch: Batch | None = None
    ready_through: int | None = None


@dataclass
class ViewStatus:
    """Where one view stands (read from Delta logs: no data, no Spark).

    ``state_rows`` / ``state_bytes`` sum the view's current state tables (None: a table
    has no row counts in its log); ``answer_version`` is the answer table's Delta version
    (what a reader pinning a snapshot asks for), None before the first answer.
    """

    view: str
    state_batch: int | None
    answer_batch: int | None
    pending: int
    state_rows: int | None = None
    state_bytes: int = 0
    answer_version: int | None = None
    answer_rows: int | None = None
    #: While a changed or refreshed view rebuilds, the batch of the old answer it serves
    #: (None: the answer is the view's own, or there is none).
    serving_old: int | None = None


@dataclass
class Rejection:
    """The batch the last run stopped at, and why (from the run log)."""

    message: str
    seq: int | None = None
    table: str | None = None
    path: str | None = None
    at: float | None = None


@dataclass
class _Progress:
    """Batches each view and row index has applied, read once per run and kept current."""

    views: dict[str, int]
    indexes: dict[str, int]
    #: Views that stopped applying for this run (:meth:`Pipeline._fold_steps`).
    waiting: set[str] = field(default_factory=set)

    def index_done(self, batch: Batch) -> bool:
        return batch.table not in self.indexes or self.indexes[batch.table] >= batch.seq

    def applied_everywhere(self, batch: Batch, consumers: list[ViewRuntime]) -> bool:
        """True when every table that reads ``batch`` committed it (its file is not needed
        again but to rebuild a view)."""
        return self.index_done(batch) and all(
            self.views[v.plan.view] >= batch.seq for v in consumers)

    def validated(self, batch: Batch, consumers: list[ViewRuntime]) -> bool:
        """True when a table committed ``batch``: its file was read whole and found good
        (a view built later need not have Airflow's prepare step read it again)."""
        return (batch.table in self.indexes and self.indexes[batch.table] >= batch.seq) or any(
            self.views[v.plan.view] >= batch.seq for v in consumers)

    def applied_anywhere(self, batch: Batch, consumers: list[ViewRuntime]) -> bool:
        """True when any table committed ``batch`` (its file may then no longer change)."""
        if batch.table in self.indexes and self.indexes[batch.table] >= batch.seq:
            return True
        return any(v.state_through() >= batch.seq for v in consumers)


def _is_file_of(path: Path, batch: Batch) -> bool:
    """Whether the file at ``path`` is still the one ``batch`` registered (size and mtime)."""
    st = path.stat()
    return (st.st_size, st.st_mtime_ns) == (batch.size, batch.mtime_ns)


class Pipeline:
    """Runs one compiled program against a landing area and a warehouse."""

    def __init__(self, compiled: CompiledProgram, landing: Path | str, warehouse: Path | str,
                 spark: SparkSession | None = None, store: DeltaStore | None = None,
                 local_rows: int | None = None, config: Settings | None = None):
        """``spark``: a session to use instead of starting one when needed.
        ``local_rows``: batches of at most this many rows take the driver-side path
        (:mod:`incr.runtime.local`) where it applies; 0 keeps everything in Spark.
        The default is the setting ``INCR_LOCAL_ROWS``.  ``config``: every other setting
        (:mod:`incr.config`; default: the environment's)."""
        self.engines = Engines(config, spark=spark, local_rows=local_rows)
        # A warehouse in a bucket is worked on in a local copy (incr.runtime.bucket).
        self.bucket = (BucketWarehouse(str(warehouse), self.engines.settings)
                       if is_remote(warehouse) else None)
        self.warehouse = self.bucket.local if self.bucket is not None else Path(warehouse)
        check_table_root(self.warehouse)
        if self.bucket is not None:
            self.bucket.pull()
        # A landing area on an object store is read from a local copy (incr.runtime.remote).
        self.remote = RemoteLanding(str(landing)) if is_remote(landing) else None
        self.landing = (self.warehouse / "_incr" / compiled.name / "landing" if self.remote
                        else Path(landing))
        self.store = store or DeltaStore(self.engines.settings.mirror_rows,
                                         self.engines.settings.local_state_rows)
        self.planned = compiled  # as compiled; self.compiled is as it runs here (settle)
        self.meta = self.warehouse / "_incr" / compiled.name
        if self.engines.local is not None:
            self.engines.local.keep_translations(self.meta / "sql")
        self._views: dict[str, ViewRuntime] | None = None
        #: The views reading each table, for the views object they were found in.
        self._readers: tuple[dict[str, ViewRuntime] | None, dict[str, list[ViewRuntime]]] = (None, {})
        self._settle()
        self.ledger = Ledger(self.store, self.meta / "ledger")
        names = {s.lower() for p in compiled.plans for s in p.sources}
        self.tables: dict[str, TableDecl] = {t.name: t for t in compiled.program.tables
                                             if t.name.lower() in names}
        self.schemas = {name: SchemaLog(self.meta / "schema" / f"{name}.json", name)
                        for name in self.tables}
        self.indexes = {name: RowIndex(self.store, self.meta / "rows" / name, t,
                                       self.schemas[name].added)
                        for name, t in self.tables.items() if not t.append_only}
        self.scratch = self.meta / "slices"  # copies of slices for Spark to read

    def _settle(self) -> None:
        """Plans the program as it runs against this warehouse (views that share a state
        keep the states they serve from: :func:`~incr.runtime.answer.settle`)."""
        self.compiled = settle(self.planned, self.warehouse, self.store)
        self.locks = Locks(self.meta / "locks", self.compiled.name,
                           {s.owner: s.views for s in self.compiled.shares}, self.bucket)
        self._views = None

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def spark(self) -> SparkSession:
        """The run's SparkSession, started on first use."""
        return self.engines.spark

    @property
    def local(self) -> LocalSql | None:
        """The driver-side engine, when enabled."""
        return self.engines.local

    @property
    def views(self) -> dict[str, ViewRuntime]:
        if self._views is None:
            shared: dict[str, ViewState] = {}  # views sharing a state share its object
            members = {s.owner: s.recorded for s in self.compiled.shares}
            self._views = {}
            for p in self.compiled.plans:
                state = None
                if p.shares is not None:
                    if p.shares not in shared:
                        shared[p.shares] = ViewState(p, self.store, self.warehouse, self.engines,
                                                     members.get(p.shares, ()))
                    state = shared[p.shares]
                self._views[p.view] = view_runtime(p, self.store, self.engines, self.warehouse,
                                                   state)
                self._views[p.view].pin(functools.partial(self.locks.holding, p.state_owner))
        return self._views

    @property
    def owners(self) -> tuple[str, ...]:
        """The names the program's view locks go by: a view's own, or its shared state's
        for views that share one (they must not fold into it at once)."""
        return tuple(dict.fromkeys(p.state_owner for p in self.compiled.plans))

    def _view_runtime(self, name: str) -> ViewRuntime:
        for key, runtime in self.views.items():
            if key.lower() == name.lower():
                return runtime
        raise StorageError(f"program {self.compiled.name} has no view {name}; its views: "
                           f"{', '.join(self.views)}")

    def _wait(self, runtime: ViewRuntime) -> float:
        """How long a view's own work waits for its lock: at once when the lock is the
        view's alone (another holder is a run that covers it), up to INCR_SHARED_WAIT_S
        when views share it (Airflow runs their tasks at once; one folds, then the next)."""
        return self.engines.settings.shared_wait_s if runtime.plan.shares is not None else 0.0

    def hold_everything(self) -> contextlib.AbstractContextManager[None]:
        """Every lock of the program: a whole run or a skip writes anything."""
        return self.locks.hold(ledger=True, indexes=tuple(self.indexes), views=self.owners)

    # -- what is there ---------------------------------------------------------------------------
    def register(self) -> int:
        """Registers newly landed files as batches; returns how many.

        First the tables' declarations are logged (:mod:`~incr.runtime.schemas`): a column
        added since is NULL in the files registered before it.

        Raises:
            CompileError: a declaration drops or retypes a column.
        """
        self._record_declarations()
        if self.remote is not None:
            self.remote.sync(self.landing, self.tables,
                             {b.path: (b.size, b.mtime_ns) for b in self.ledger.batches()})
        files = discover(self.landing, self.tables)
        return len(self.ledger.register(files, self.landing, self._split))

    def _source(self, batch: Batch) -> Path:
        """Where ``batch``'s file is read (:meth:`Batch.source`); from a landing area on an
        object store, a cached copy that went missing is copied again."""
        path = batch.source(self.landing)
        if (self.remote is not None and batch.archived is None and not path.is_file()
                and not Path(batch.path).is_absolute()):
            self.remote.fetch(batch.path, path)
        return path

    def _shown(self, batch: Batch, path: Path) -> str:
        """How messages name ``batch``'s file: its object's URI when read from the cache."""
        if self.remote is not None and path.is_relative_to(self.landing):
            return self.remote.uri_of(batch.path)
        return str(path)

    def _record_declarations(self) -> None:
        """Logs the tables' declarations as of the next batch (the caller holds the ledger)."""
        next_batch = self.ledger.next_seq()
        for name, declared in self.schemas.items():
            declared.record(self.tables[name], next_batch)

    def register_folder(self, folder: Path | str) -> int:
        """Registers the files of a folder laid out like the landing area (``<table>/...``,
        ``<table>/_deletes/...``), read where they are: a backfill of history kept elsewhere.
        Each is named by its absolute path in the ledger; returns how many were registered.
        History in a bucket (a URI) is copied down first, into a folder of the program's
        that rebuilds read later (``_incr/<program>/backfill/<digest of the URI>``)."""
        if is_remote(folder):
            digest = hashlib.sha256(str(folder).rstrip("/").encode()).hexdigest()[:16]
            copy = self.meta / "backfill" / digest
            RemoteLanding(str(folder)).sync(copy, self.tables)
            folder = copy
        folder = Path(folder).resolve()
        files = [LandedFile(f.table, f.kind, (folder / f.relpath).as_posix(), f.size, f.mtime_ns)
                 for f in discover(folder, self.tables)]
        with self.locks.hold(ledger=True):
            self._record_declarations()
            return len(self.ledger.register(files, self.landing, self._split))

    def _split(self, path: Path, landed: LandedFile) -> list[Part]:
        """The slices a landed file is applied in ([]: whole)."""
        return parts(path, landed, self.slice_budget)

    @property
    def slice_budget(self) -> int:
        """Uncompressed bytes of Parquet one batch reads at most (a row group may exceed it)."""
        from incr.runtime.session import DEFAULTS

        conf = dict(DEFAULTS)
        conf.update(self.engines.settings.spark_settings())
        return slice_budget(self.engines.settings, conf)

    def _register_or_reject(self, report: RunReport) -> int:
        """:meth:`register`, with a landed file incr cannot take at all (e.g. ``.txt``) recorded
        as the run's rejection (no batch applies this run) instead of raised."""
        try:
            return self.register()
        except InputError as e:
            report.rejected = e
            return 0

    def _consumers(self, batch: Batch) -> list[ViewRuntime]:
        """The views that read ``batch``'s table (kept per table while the views are)."""
        views = self.views
        if self._readers[0] is not views:
            self._readers = (views, {})
        table = batch.table.lower()
        found = self._readers[1].get(table)
        if found is None:
            found = self._readers[1][table] = [
                v for v in views.values() if table in {s.lower() for s in v.plan.sources}]
        return found

    def _behind(self, batch: Batch, progress: _Progress,
                chosen: set[str] | None = None) -> list[ViewRuntime]:
        """The views (of ``chosen``, if given) that read ``batch`` and have not applied it yet."""
        return [v for v in self._consumers(batch) if progress.views[v.plan.view] < batch.seq
                and (chosen is None or v.plan.view in chosen) and v.plan.view not in progress.waiting]

    def _publish_from_shared_state(self, runtimes: Iterable[ViewRuntime], target: int) -> None:
        """Publishes a(state) for each view whose shared state other views already brought
        past its answer, instead of reading every batch again to fold nothing.

        A view added to a program whose shared state holds what it needs (its aggregates
        are among those the state keeps: the state's fingerprint is unchanged) costs one
        answer computation; a view whose shared state was rebuilt by another view's task
        swaps its answer in once the state reaches ``target``, the last batch to apply.
        An answer of this definition that lags behind its state is left to the batches,
        which publish each one's version (time travel shows every batch).
        """
        for v in runtimes:
            if not isinstance(v, ViewRuntime) or v.plan.shares is None:
                continue
            at = v.state_through()
            if at < 0 or v.furthest() != at or v.answer_through() >= 0:
                continue  # no state yet, a step half folded, or an answer of this definition
            if v.answer.served()[0] < 0 or at >= target:
                log.info("view %s: publishing its answer at batch %d from the state it shares "
                         "(%s)", v.plan.view, at, v.plan.shares)
                v.publish(at)

    def _drop_unshared_state(self) -> list[str]:
        """Removes the state directories no view of the program reads any more: a view's
        own once it publishes from a state it shares, a shared state once no view shares
        it and every view publishes from its current state (the caller holds every lock)."""
        root = self.warehouse / "state"
        owners = set(self.owners)
        gone: list[str] = []
        caught_up = all(v.answer_through() >= 0 for v in self.views.values())
        for v in self.views.values():
            own = root / v.plan.view
            if v.plan.shares is not None and v.answer_through() >= 0 and own.is_dir():
                gone.append(own.name)
        if caught_up and root.is_dir():
            gone += [child.name for child in root.iterdir() if child.is_dir()
                     and child.name not in owners and is_owned_by(child.name, self.compiled.name)]
        for name in gone:
            log.info("removing state %s: no view of program %s reads it", name, self.compiled.name)
            self.store.remove(root / name)
        return gone

    def _chosen(self, views: Iterable[str] | None) -> set[str] | None:
        """The views named (any case), or None for all."""
        return None if views is None else {self._view_runtime(v).plan.view for v in views}

    def _progress(self) -> _Progress:
        return _Progress({n: v.through() for n, v in self.views.items()},
                         {t: i.through() for t, i in self.indexes.items()})

    def unregistered(self) -> list[LandedFile]:
        """Batch files landed (in the folder, or the bucket) that no run registered yet, in
        apply order; read only, so ``incr status`` can say what the next run will take."""
        tables = list(self.tables)
        found = (self.remote.files(tables, check_types=False) if self.remote is not None
                 else discover(self.landing, tables, check_types=False))
        known = self.ledger.all_paths()
        return [f for f in found if f.relpath not in known]

    def status(self) -> list[ViewStatus]:
        """Per view: the batch its state and answer reflect, and batches still to apply."""
        batches = self.ledger.batches()
        out = []
        for v in self.views.values():
            done = v.through()
            pending = sum(1 for b in batches if v in self._consumers(b) and b.seq > done)
            status = ViewStatus(v.plan.view, v.state_through(), v.answer_through(), pending)
            served = v.answer.served()[0]
            if status.answer_batch < 0 <= served:
                status.serving_old = served
            rows: list[int | None] = []
            for table in {t.name for s in v.plan.stages for t in v.plan.stored(s)} | \
                    {t.name for t in v.plan.kept()}:
                path = v.table_path(table)
                if self.store.exists(path):
                    table_rows, table_bytes = self.store.totals(path)
                    rows.append(table_rows)
                    status.state_bytes += table_bytes
            status.state_rows = None if None in rows or not rows else sum(r or 0 for r in rows)
            if self.store.exists(v.answer_path):
                status.answer_version = self.store.table(v.answer_path).version()
                status.answer_rows = self.store.totals(v.answer_path)[0]
            out.append(status)
        return out

    def last_rejection(self) -> Rejection | None:
        """Why the last run (or Airflow's prepare step) stopped, if a batch was rejected."""
        log = self.meta / "runs.jsonl"
        if not log.exists():
            return None
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        if not lines:
            return None
        entry = json.loads(lines[-1])
        if not entry.get("rejected"):
            return None
        batch = entry.get("rejected_batch") or {}
        return Rejection(entry["rejected"], batch.get("seq"), batch.get("table"),
                         batch.get("path"), entry.get("at"))

    # -- running ---------------------------------------------------------------------------------
    def run(self, through: int | None = None, emit: Emit | None = None,
            views: Iterable[str] | None = None, backfill: bool = False) -> RunReport:
        """Registers and applies every pending batch; stops at the first rejected batch.

        With ``through``, batches after that number wait for a later run (benchmarks and
        the demo apply one batch at a time this way).  ``emit``: receives a progress line
        after each batch (:mod:`~incr.runtime.progress`).  ``views``: only these views
        apply batches (a backfill of some views); the row indexes advance all the same,
        and the other views catch up in a later run.  ``backfill``: marked as a backfill
        while it holds the locks (:meth:`backfill_running`).
        """
        report = RunReport(self.compiled.name)
        chosen = self._chosen(views)
        with self.hold_everything(), self._marked(backfill, chosen):
            self._check_answer_ownership()
            sweep_slices(self.scratch)
            report.registered = self._register_or_reject(report)
            batches = self.ledger.batches() if report.rejected is None else []
            last = max((b.seq for b in self.ledger.batches()), default=-1)
            self._publish_from_shared_state(
                [v for n, v in self.views.items() if chosen is None or n in chosen],
                last if through is None else min(through, last))
            progress = self._progress()
            # A batch every table that reads it has applied needs nothing more: the run's
            # bookkeeping then follows the batches still to apply, not every batch landed.
            batches = [b for b in batches if not progress.applied_everywhere(b, self._consumers(b))]
            publish_at = {name: self._publish_at(v, batches, progress, through)
                          for name, v in self.views.items()}
            meter = _meter(emit, [b for b in batches if (through is None or b.seq <= through)
                                  and (not progress.index_done(b)
                                       or self._behind(b, progress, chosen))])
            at = 0
            while at < len(batches):
                batch = batches[at]
                if through is not None and batch.seq > through:
                    break
                if progress.index_done(batch) and not self._behind(batch, progress, chosen):
                    at += 1
                    continue
                group, resume = self._group(batches, at, progress, chosen, through)
                applied, rejected = self._apply(group, resume, progress, chosen, publish_at)
                report.applied += applied
                for done in applied:
                    if meter is not None:
                        meter.advance(next(b.bytes for b in group if b.seq == done.seq),
                                      done.rows, done.path)
                    report.ready_through = done.seq
                if rejected is not None:
                    report.rejected, report.rejected_batch = rejected
                    break
                at = batches.index(next(b for b in group if b.seq == applied[-1].seq)) + 1
            if meter is not None:
                meter.finish()
            for v in self.views.values():
                v.drop_stale_state()
            self._drop_unshared_state()
            self._log(report)  # the ledger's lock guards the run log too
        return report

    def prepare(self) -> RunReport:
        """Airflow's first step: register, read and index every pending batch (no view work);
        a batch some table already committed is not read again.

        ``ready_through`` is the last batch that every view may apply.
        """
        report = RunReport(self.compiled.name)
        with self.locks.hold(ledger=True, indexes=tuple(self.indexes)):
            self._check_answer_ownership()
            sweep_slices(self.scratch)
            report.registered = self._register_or_reject(report)
            progress = self._progress()
            for batch in self.ledger.batches() if report.rejected is None else []:
                # A batch some table committed was read and found good then: a view that is
                # behind (new, or rebuilding) reads it in its own task, not here again.
                behind = self._behind(batch, progress)
                if not progress.index_done(batch) or (
                        behind and not progress.validated(batch, self._consumers(batch))):
                    try:
                        t0 = time.perf_counter()
                        loaded = self._load(batch, progress)
                        try:
                            finish = self._index(batch, loaded, progress)
                            if finish is not None:
                                finish()
                        finally:
                            loaded.release()
                        report.applied.append(BatchReport(batch.seq, batch.path, batch.table,
                                                          batch.kind, loaded.rows,
                                                          total_s=time.perf_counter() - t0))
                    except InputError as e:
                        report.rejected, report.rejected_batch = e, batch
                        break
                report.ready_through = batch.seq
            self._log(report)  # the ledger's lock guards the run log too
        return report

    def apply_view(self, view: str, through: int | None,
                   emit: Emit | None = None) -> list[ViewMetrics]:
        """Airflow's per-view step: applies batches up to ``through`` (from :meth:`prepare`).

        Only the view's own lock is held, so the views of a program apply in parallel.
        ``emit``: receives a progress line after each batch.
        """
        runtime = self._view_runtime(view)
        out: list[ViewMetrics] = []
        if through is None:
            return out
        published = self._publish_folded(runtime, through, emit)
        if published is not None:
            return published
        with self.locks.hold(views=(runtime.plan.state_owner,), wait_s=self._wait(runtime)):
            self._publish_from_shared_state([runtime], through)
            progress = self._progress()
            batches = self.ledger.batches()
            publish_at = {runtime.plan.view: self._publish_at(runtime, batches, progress, through)}
            meter = _meter(emit, [b for b in batches if b.seq <= through
                                  and runtime in self._behind(b, progress)])
            chosen = {runtime.plan.view}
            at = 0
            while at < len(batches) and batches[at].seq <= through:
                if runtime not in self._behind(batches[at], progress, chosen):
                    at += 1
                    continue
                group, resume = self._group(batches, at, progress, chosen, through)
                applied, rejected = self._apply(group, resume, progress, chosen, publish_at,
                                                index=False)
                for done in applied:
                    out += done.views
                    if meter is not None:
                        meter.advance(next(b.bytes for b in group if b.seq == done.seq),
                                      done.rows, done.path)
                if rejected is not None:
                    raise rejected[0]
                at = batches.index(next(b for b in group if b.seq == applied[-1].seq)) + 1
            runtime.drop_stale_state()
        return out

    def _publish_folded(self, runtime: ViewRuntime, through: int,
                        emit: Emit | None) -> list[ViewMetrics] | None:
        """A view task's work when another view's task already folded the state they share
        through every batch this view lacks (up to ``through``): only its answer, published
        from the state by the groups those folds logged (:mod:`~incr.runtime.touchlog`).

        It holds the state's lock shared (the other views' tasks publish at once; no fold
        moves the state meanwhile) and its answer's lock, and reads no batch.  None when
        that is not the case (the state is behind or ahead, or the answer is of another
        definition or state): the task then takes the state's lock to fold, as any.
        """
        if runtime.plan.shares is None:
            return None
        owner, view = runtime.plan.state_owner, runtime.plan.view
        with self.locks.hold(reading=(owner,), answers=(view,), wait_s=self._wait(runtime)):
            progress = self._progress()
            todo = [b for b in self.ledger.batches()
                    if b.seq <= through and runtime in self._behind(b, progress)]
            if not todo or runtime.answer_through() < 0:
                return None
            last = todo[-1]
            if not (runtime.state_through() == runtime.furthest() == last.seq
                    and all(runtime.resumes(b.seq, b.table) < 0 for b in todo)):
                return None  # (resumes: -1 once every table a batch writes committed it)
            # Every table is at the batch, so the fold reads nothing of it (it returns at once).
            metrics = runtime.apply(last.seq, last.kind, last.table, f"incr_batch_{last.table}")
            if emit is not None:
                emit(f"{len(todo)}/{len(todo)} batches · folded into {owner} by another view's "
                     f"task · answer published at batch {last.seq} ({metrics.answer_mode})", True)
            # The batches before it are in the state, not published apart (as a fold of
            # several batches as one step leaves them).
            return [ViewMetrics(view, b.seq, answer_mode="ahead", answer_rows=-1)
                    for b in todo[:-1]] + [metrics]

    def backfill(self, views: Iterable[str] | None = None, folder: Path | str | None = None,
                 start: int | None = None, through: int | None = None, rebuild: bool = False,
                 emit: Emit | None = None) -> RunReport:
        """Builds (or with ``rebuild``, rebuilds beside the served answers) ``views`` (default
        all) from the ledger's files, large ones in slices: ``incr backfill``.

        ``folder``: history laid out like the landing area, registered first and read where
        it is.  ``start``: the first batch meant to apply; a chosen view that has not applied
        every batch before it is an error (a backfill never leaves a gap).  ``through``: the
        last batch to apply (a later backfill or run goes on from there).

        Raises:
            StorageError: a view would skip batches before ``start``.
        """
        chosen = self._chosen(views)
        if rebuild and start:
            raise StorageError(f"--from {start} with --rebuild: a rebuild applies every batch "
                               f"from 0; leave --from out")
        if folder is not None:
            self.register_folder(folder)
        if rebuild:
            for name in chosen or self.views:
                self.refresh(name)
        if start is not None:
            with self.locks.hold(ledger=True), contextlib.suppress(InputError):
                self.register()  # the files landed so far count (a bad one: the run says why)
            progress = self._progress()
            for name in sorted(chosen or self.views):
                gap = [b.seq for b in self.ledger.batches()
                       if b.seq < start and self._behind(b, progress, {name})]
                if gap:
                    raise StorageError(
                        f"view {name} has not applied batch(es) {gap[0]}-{gap[-1]}, before "
                        f"--from {start}: a backfill applies batches in order; start at "
                        f"{gap[0]} (or leave --from out)")
        return self.run(through=through, emit=emit, views=chosen, backfill=True)

    @contextlib.contextmanager
    def _marked(self, backfill: bool, chosen: set[str] | None) -> Iterator[None]:
        """While a backfill holds the program's locks, says so in :data:`BACKFILL_MARKER`."""
        if not backfill:
            yield
            return
        marker = self.meta / BACKFILL_MARKER
        marker.write_text(json.dumps({"pid": os.getpid(), "at": time.time(),
                                      "views": sorted(chosen or self.views)}))
        try:
            yield
        finally:
            marker.unlink(missing_ok=True)

    def backfill_running(self) -> dict | None:
        """The backfill of this program running now (its pid, start time and views), if any:
        Airflow's scheduled runs give way to it instead of failing on its locks."""
        try:
            running = json.loads((self.meta / BACKFILL_MARKER).read_text())
        except (OSError, ValueError):
            return None
        return running if alive(int(running.get("pid", 0))) else None

    def refresh(self, view: str) -> Path:
        """Starts a full refresh of ``view``: its state is rebuilt from batch 0 in a new
        generation beside the current one, by the next run (or Airflow task) of the view,
        and its answer keeps being served until the new one has caught up and takes over
        in one commit.  Returns the new generation's directory."""
        runtime = self._view_runtime(view)
        planned = self.planned.plan(runtime.plan.view)
        owners = tuple(dict.fromkeys((runtime.plan.state_owner, planned.state_owner)))
        with self.locks.hold(views=owners, wait_s=self._wait(runtime)):
            if planned.state_owner == runtime.plan.state_owner and \
                    planned.state_fingerprint == runtime.plan.state_fingerprint:
                return runtime.refresh()
            # Kept apart from the views it may share with (settle): the refresh builds
            # the state the share pass plans for them all, which they then take.
            log.info("view %s: refreshing into the state it shares with %s (%s)", planned.view,
                     ", ".join(v.plan.view for v in self.views.values()
                               if self.planned.plan(v.plan.view).shares == planned.shares),
                     planned.shares)
            root = ViewState(planned, self.store, self.warehouse).new_generation()
        self._settle()
        return root

    def _publish_at(self, view: ViewRuntime, batches: list[Batch], progress: _Progress,
                    through: int | None) -> int:
        """The first batch of this run whose answer ``view`` publishes (see
        :meth:`ViewRuntime.publish_at`): while it rebuilds, the last one it will apply."""
        return view.publish_at([b.seq for b in batches if (through is None or b.seq <= through)
                                and view in self._behind(b, progress)])

    def skip(self, seq: int) -> Batch:
        """Drops a batch no table has applied (e.g. a bad file the producer will resend)."""
        with self.hold_everything():
            batch = next((b for b in self.ledger.batches() if b.seq == seq), None)
            if batch is None:
                raise StorageError(f"program {self.compiled.name} has no live batch {seq}")
            progress = self._progress()
            slices = self._slices_of(batch)  # a sliced file is skipped whole
            for b in slices:
                if progress.applied_anywhere(b, self._consumers(b)):
                    raise StorageError(
                        f"{b} is already applied by some tables; {batch} cannot be skipped "
                        f"(land a delete batch to undo its rows)" if b is batch else
                        f"{b}, a slice of the same file, is already applied by some tables; "
                        f"{batch} cannot be skipped alone (land a delete batch to undo the rows)")
            for b in slices:
                self.ledger.skip(b)
            return batch

    def archive(self, to: Path) -> list[Batch]:
        """Moves the files of batches every table has applied from the landing folder to ``to``.

        Each file keeps its path under ``to`` (``<table>/...``) and the ledger records where
        it went, so a rebuild reads it there and the landing folder holds only what is still
        to come.  Safe to interrupt: a file is copied, the ledger records it, and only then
        is it removed from the landing folder (a rerun finishes the job).  From a landing
        area on an object store, the object is deleted from it then, and the cached copy
        after.  Returns the batches moved.
        """
        to = Path(to).resolve()
        if to.is_relative_to(self.landing.resolve()):
            raise StorageError(f"the archive {to} must be outside the landing folder {self.landing}")
        with self.hold_everything():
            moved: list[tuple[Batch, Path]] = []
            for path, batches in self._applied_files().items():
                landed = self.landing / path
                if batches[0].archived is None:  # its cached copy, if the landing is remote
                    landed = self._source(batches[0])
                if not landed.is_file():
                    continue
                target = to / path
                copied = False
                for batch in batches:
                    if batch.archived is None or Path(batch.archived) != target:
                        if not copied:
                            target.parent.mkdir(parents=True, exist_ok=True)
                            tmp = target.with_name(f".{target.name}.incr-tmp")
                            shutil.copy2(landed, tmp)
                            tmp.replace(target)
                            copied = True
                        moved.append((batch, target))
            self.ledger.archive(moved)
            done = [b for b, _ in moved]
            for batch in self.ledger.batches():  # recorded: now the landing copy may go
                if Path(batch.path).is_absolute():
                    continue
                landed = self.landing / batch.path
                if (batch.archived is None or not Path(batch.archived).is_file()
                        or not landed.is_file()):
                    continue
                if not _is_file_of(landed, batch):
                    continue  # a new file landed under the same name
                if self.remote is not None:  # the object first, so no sync copies it again
                    self.remote.remove(batch.path, batch.size, batch.mtime_ns)
                landed.unlink()
            return done

    def _applied_files(self) -> dict[str, list[Batch]]:
        """The landing area's files (not a backfill folder's) whose batches every table
        that reads them has applied, each with its batches (slices)."""
        progress = self._progress()
        by_file: dict[str, list[Batch]] = {}
        for batch in self.ledger.batches():
            if not Path(batch.path).is_absolute():  # not one read from a backfill folder
                by_file.setdefault(batch.path, []).append(batch)
        return {path: batches for path, batches in by_file.items()
                if all(progress.applied_everywhere(b, self._consumers(b)) for b in batches)}

    def drop_landed_copies(self) -> list[str]:
        """Deletes the cached copies of applied files of a landing area on an object store
        (the caller holds every lock); returns their paths.

        The objects stay in the bucket: a rebuild copies what it reads again
        (:meth:`_source`), and registration does not copy back a registered object that did
        not change.  So the cache holds what is still to apply, not the bucket's history.
        """
        if self.remote is None:
            return []
        dropped = []
        for path, batches in self._applied_files().items():
            local = self.landing / path
            if batches[0].archived is not None or not local.is_file():
                continue
            if _is_file_of(local, batches[0]):
                local.unlink()
                dropped.append(path)
        return dropped

    # -- steps -----------------------------------------------------------------------------------
    def _group(self, batches: list[Batch], at: int, progress: _Progress,
               chosen: set[str] | None, through: int | None) -> tuple[list[Batch], int]:
        """The batches from ``batches[at]`` a run reads before it folds them: one step.

        A step is ``batches[at]`` and the batches after it of other sources, of the same
        kind, whole files (not slices) and still to apply, which every view folds as one
        (:meth:`ViewRuntime.together`): a run with batches of ``orders`` and ``customers``
        pending pays one fold, one MERGE per table and one answer commit per view, not
        two.  It always reaches the end of a step a stopped run began (whatever the rules
        say now), and :meth:`_apply` ends it early at a batch too large for the driver.
        Returns the batches, and the end of that stopped step (-1: none).
        """
        first = batches[at]
        resume = max((v.resumes(first.seq, first.table) for v in self._behind(first, progress, chosen)
                      if isinstance(v, ViewRuntime)), default=-1)
        group, tables = [first], {first.table.lower()}
        for batch in batches[at + 1:]:
            if not self._behind(batch, progress, chosen) and progress.index_done(batch):
                continue  # nothing to do for it: the step reads past it
            if batch.seq > resume and (
                    not self.engines.settings.group_batches or first.part is not None
                    or (through is not None and batch.seq > through) or batch.kind != first.kind
                    or batch.part is not None or batch.table.lower() in tables):
                break
            group.append(batch)
            tables.add(batch.table.lower())
        return group, resume

    def _apply(self, group: list[Batch], resume: int, progress: _Progress, chosen: set[str] | None,
               publish_at: dict[str, int], index: bool = True,
               ) -> tuple[list[BatchReport], tuple[InputError, Batch] | None]:
        """Reads and indexes (or with ``index`` False, as Airflow's view tasks do, finds
        indexed) the batches of a step (:meth:`_group`), then folds them into every view
        behind on them.  A batch that does not fit the driver beside the ones
        before it (or must be read by Spark) ends the step before it, unless a stopped
        run's step needs it; a rejected one ends it too, and the batches before it are
        folded all the same.  Returns the reports of the batches folded, and the rejection."""
        t0 = time.perf_counter()
        loaded: list[tuple[Batch, LoadedBatch]] = []
        reports: list[BatchReport] = []
        rejected: tuple[InputError, Batch] | None = None
        indexing: list[tuple[BatchReport, Callable[[], None]]] = []
        limit = self.engines.settings.local_rows
        try:
            for batch in group:
                t1 = time.perf_counter()
                faults.crash_point("batch.start", batch.seq)
                try:
                    batch_loaded = self._load(batch, progress)
                except InputError as e:
                    rejected = (e, batch)
                    break
                if loaded and batch.seq > resume and (
                        batch_loaded.arrow is None or batch_loaded.rows + sum(
                            b.rows for _, b in loaded) > limit):
                    batch_loaded.release()  # the next step begins with it
                    break
                loaded.append((batch, batch_loaded))
                consumers = self._behind(batch, progress, chosen)
                if len(consumers) > 1 or batch.table in self.indexes:
                    batch_loaded.cache()
                report = BatchReport(batch.seq, batch.path, batch.table, batch.kind,
                                     batch_loaded.rows, read_s=time.perf_counter() - t1,
                                     part=str(batch.part) if batch.part else None)
                report.total_s = report.read_s
                reports.append(report)
                t2 = time.perf_counter()
                if not index and not progress.index_done(batch):
                    raise StorageError(f"{batch} is not validated yet; run the prepare step first")
                try:
                    finish = self._index(batch, batch_loaded, progress)
                except InputError as e:
                    loaded.pop()[1].release()
                    reports.pop()
                    rejected = (e, batch)
                    break
                if finish is not None:
                    indexing.append((report, finish))
                report.index_s = time.perf_counter() - t2
                report.total_s += report.index_s
            by_seq = {r.seq: r for r in reports}
            folded, refused = self._fold_steps(loaded, progress, chosen, publish_at)
            while indexing:  # the inserts' index, recorded beside the fold
                report, finish = indexing.pop(0)
                t2 = time.perf_counter()
                finish()
                report.index_s += time.perf_counter() - t2
                report.total_s += time.perf_counter() - t2
            for metrics in folded:
                by_seq[metrics.batch].views.append(metrics)
            if refused is not None:  # a view cannot take a step: it and what follows wait
                rejected = refused
                reports = [r for r in reports if r.seq < refused[1].seq]
        finally:
            for _, finish in indexing:  # a failed fold: the index's writes end before the rows go
                try:
                    finish()
                except StorageError as e:  # the failure being raised says more
                    log.warning("recording the row index beside a failed fold failed too: %s", e)
            for _, batch_loaded in loaded:
                batch_loaded.release()
        if reports:  # the last batch's time includes the fold of the step
            reports[-1].total_s += time.perf_counter() - t0 - sum(r.total_s for r in reports)
        return reports, rejected

    def _load(self, batch: Batch, progress: _Progress) -> LoadedBatch:
        path = self._source(batch)
        display = self._shown(batch, path)
        if batch.kind == DELETE and batch.table not in self.indexes:
            raise InputError(f"{batch.table} is declared append-only (header option append_only), "
                             f"so delete batches are refused; remove the option to allow "
                             f"deletions", Location(display))
        self._check_unchanged(batch, path, display, progress)
        return load_batch(self.engines, self.tables[batch.table], path, display,
                          self.schemas[batch.table].absent_at(batch.seq), batch.part,
                          self.scratch)

    def _check_unchanged(self, batch: Batch, path: Path, display: str,
                         progress: _Progress) -> None:
        if not path.is_file():
            return  # load_batch says the file is gone
        st = path.stat()
        if (st.st_size, st.st_mtime_ns) == (batch.size, batch.mtime_ns):
            return
        digest = sha256_of(path)
        if digest == batch.sha256:
            return
        slices = self._slices_of(batch)
        if any(progress.applied_anywhere(b, self._consumers(b)) for b in slices):
            raise InputError(f"the file changed after {batch} was applied; incr never applies a "
                             f"batch twice. Restore the original file and land the change as a "
                             f"new batch (deletes of the old rows plus inserts)", Location(display))
        # A per-view task may get here too: the ledger's lock is short, so it waits for it.
        with self.locks.hold(ledger=True, wait_s=self.engines.settings.lock_wait_s):
            if batch.part is None:
                self.ledger.refresh(batch, st.st_size, st.st_mtime_ns, digest)
                return
            landed = LandedFile(batch.table, batch.kind, batch.path, st.st_size, st.st_mtime_ns)
            again = self.ledger.register_again(slices, landed, self.landing, self._split)
        raise InputError(f"the file changed after it was registered in {len(slices)} slices "
                         f"(batches {slices[0].seq}-{slices[-1].seq}), before anything applied "
                         f"it; it is registered again, as batch(es) {again[0].seq}-{again[-1].seq}, "
                         f"which the next run applies", Location(display))

    def _slices_of(self, batch: Batch) -> list[Batch]:
        """Every live batch of ``batch``'s file (itself alone unless the file is sliced)."""
        if batch.part is None:
            return [batch]
        return [b for b in self.ledger.batches() if b.path == batch.path]

    def _index(self, batch: Batch, loaded: LoadedBatch,
               progress: _Progress) -> Callable[[], None] | None:
        """Records ``batch`` in its table's row index (a delete batch is checked first, and
        refused by an InputError).  An insert batch's record may still be running when this
        returns (:meth:`RowIndex.start_inserts`): then the call that waits for it and marks
        it done is returned, for once the views have folded the batch."""
        index = self.indexes.get(batch.table)
        if index is None or progress.index_done(batch):
            return None

        def recorded() -> None:
            progress.indexes[batch.table] = batch.seq
            faults.crash_point("index.after_commit", batch.seq)
        if batch.kind == INSERT:
            started = index.start_inserts(self.engines, lambda: loaded.df, batch.seq, loaded.arrow)

            def finish() -> None:
                started()
                recorded()
            return finish
        index.record_deletes(self.engines, lambda: loaded.df, batch.seq,
                             self._shown(batch, batch.source(self.landing)), loaded.arrow)
        recorded()
        return None

    def _fold_steps(self, loaded: list[tuple[Batch, LoadedBatch]], progress: _Progress,
                    chosen: set[str] | None, publish_at: dict[str, int],
                    ) -> tuple[list[ViewMetrics], tuple[InputError, Batch] | None]:
        """Folds read batches into every view (of ``chosen``) behind on them, each view
        taking as many as one step as :meth:`ViewRuntime.together` says, and notes in
        ``progress`` how far each got.

        Returns the views' metrics, and the rejection that stopped the folding, if a view
        could not take a step (a value past its column's type): the step's first batch is
        the one rejected, since the batches of a step are one change to the view; the
        views folded before it keep what they folded, as they keep a batch another view
        refuses.
        """
        registered: set[str] = set()

        def change(batch: Batch, batch_loaded: LoadedBatch) -> Change:
            name = f"incr_batch_{batch.table}"

            def register() -> None:  # the temp view, once a view's fold needs Spark to read it
                if name not in registered:
                    batch_loaded.df.createOrReplaceTempView(name)
                    registered.add(name)
            return Change(batch.table, name, batch_loaded.arrow, register)

        out: list[ViewMetrics] = []
        views = {v.plan.view: v for batch, _ in loaded for v in self._behind(batch, progress, chosen)}
        for v in views.values():
            todo = [(b, bl) for b, bl in loaded if v in self._behind(b, progress, chosen)]
            while todo:
                count = v.together([(b.seq, b.table, b.kind) for b, _ in todo]) \
                    if isinstance(v, ViewRuntime) else 1
                if count == 0:  # a stopped run's step whose batches this run did not read
                    progress.waiting.add(v.plan.view)  # nothing after it either, this run
                    break
                step, todo = todo[:count], todo[count:]
                batch, last = step[-1]
                for b, _ in step:
                    registered.discard(f"incr_batch_{b.table}")  # another file of the table
                try:
                    if len(step) == 1:
                        c = change(batch, last)
                        m = v.apply(batch.seq, batch.kind, batch.table, c.view, c.arrow,
                                    c.register, publish_at[v.plan.view])
                    else:
                        assert isinstance(v, ViewRuntime)
                        m = v.apply_together(batch.seq, batch.kind,
                                             [change(b, bl) for b, bl in step],
                                             publish_at[v.plan.view])
                except Exception as e:
                    refused_by_spark = _refused_by_spark(e)
                    if refused_by_spark is not None:
                        raise CompileError(
                            f"view {v.plan.view}: Spark refused a query incr compiled for it: "
                            f"{refused_by_spark}. The view's SQL was accepted, but a form incr "
                            f"writes for it is one Spark cannot run (a gap in incr's compiler): "
                            f"write the expression Spark names another way (`incr explain` shows "
                            f"every query), or report it. The view's answer stays as it was; "
                            f"the next run takes the batch again") from e
                    overflow = _overflow(e)
                    if overflow is None:
                        raise
                    which = "this batch" if len(step) == 1 else "the batches " + ", ".join(
                        f"{b.seq} ({b.path})" for b, _ in step) + ", folded as one step"
                    refused = OutOfRangeError(
                        f"view {v.plan.view} cannot take {which}: {overflow}. A value of the view "
                        f"does not fit its column's type (a BIGINT holds up to 2^63-1, a DECIMAL 38 "
                        f"digits, its scale included); widen it in the query: an integer sum as "
                        f"SUM(CAST(v AS DECIMAL(38,0))), a DECIMAL one with fewer decimal places "
                        f"(CAST(d AS DECIMAL(38,0))) or as DOUBLE. The view's answer stays as it was",
                        Location(self._shown(step[0][0], step[0][0].source(self.landing))))
                    refused.__cause__ = e
                    return out, (refused, step[0][0])
                m.rows_in = sum(bl.rows for _, bl in step)
                stages = "" if len(m.stages) < 2 else "; stages " + ", ".join(
                    f"{name} {s:.3f}" for name, s in m.stages.items())
                log.info("batch %s (%s %s, %d rows) → view %s: %s, %d state rows touched, %.3f s "
                         "(h %.3f, merge %.3f, answer %.3f%s)",
                         "-".join(str(b.seq) for b, _ in step), batch.kind,
                         ", ".join(b.table for b, _ in step), m.rows_in, v.plan.view,
                         m.engine or "already applied", m.state_rows_touched,
                         m.h_s + m.merge_s + m.answer_s, m.h_s, m.merge_s, m.answer_s, stages)
                out.append(m)
                progress.views[v.plan.view] = batch.seq
        return out, None

    def _check_answer_ownership(self) -> None:
        for v in self.views.values():
            owner = self.store.last_commit_metadata(v.answer_path, "incr.program")
            if owner is not None and owner != self.compiled.name:
                raise StorageError(f"answer table {v.answer_path} belongs to program {owner}; "
                                   f"view names must be unique across programs sharing a warehouse")

    def _log(self, report: RunReport) -> None:
        self.meta.mkdir(parents=True, exist_ok=True)
        rejected = report.rejected_batch
        entry = {"at": time.time(), "program": report.program, "registered": report.registered,
                 "applied": [asdict(b) for b in report.applied],
                 "rejected": str(report.rejected) if report.rejected else None,
                 "rejected_batch": {"seq": rejected.seq, "table": rejected.table,
                                    "path": rejected.path} if rejected else None}
        with (self.meta / "runs.jsonl").open("a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")


def _meter(emit: Emit | None, todo: list[Batch]) -> Progress | None:
    """A progress meter over the batches ``todo`` (None: no one watches, or nothing to do)."""
    if emit is None or not todo:
        return None
    return Progress.over(((b.path, b.bytes) for b in todo), emit)


def _refused_by_spark(e: Exception) -> str | None:
    """The first line of Spark's analysis error when ``e`` is one (a compiled query Spark
    cannot run), else None.  A path Spark did not find is a storage problem, not the
    query's, and is raised as it is."""
    if "pyspark.errors" not in sys.modules:
        return None
    from pyspark.errors import AnalysisException

    if not isinstance(e, AnalysisException) or (e.getCondition() or "").startswith("PATH_NOT_FOUND"):
        return None
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return first if len(first) <= 400 else first[:400] + "…"


def _overflow(e: Exception) -> str | None:
    """What overflowed when ``e`` is Spark's arithmetic overflow error (ANSI) or a MERGE's, else None.

    The driver-side engine hands such a query to Spark, so Spark's error is the one raised.
    PySpark is only looked at when loaded: a run that never started Spark raised no error of it.
    """
    if isinstance(e, OutOfRangeError):  # a MERGE's sum left its 128 bits
        return str(e)
    if "pyspark.errors" not in sys.modules:
        return None
    from pyspark.errors import ArithmeticException

    if not isinstance(e, ArithmeticException):
        return None
    return str(e).splitlines()[0].split(" Use `try_", 1)[0].split(" If necessary", 1)[0].rstrip(". ")

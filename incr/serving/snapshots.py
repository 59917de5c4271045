"""The program-level snapshots a warehouse holds, read from Delta logs (delta-rs; no Spark).

A BI tool that shows several views of a program side by side needs them as of the same
batch: a dashboard whose "sales by region" includes batch 8 and whose "returns" stops at
batch 7 adds up to nothing.  Each view's answer is a Delta table with one version per
batch it applied, every commit marked with ``incr.batch``, so the answer of view V *as of
batch B* is V's last version whose ``incr.batch`` is at most B.  That holds only once V has
applied every batch up to B that it reads, and a batch of a table V does not read leaves
no commit in V's answer at all, so "V is at B" cannot be read from V's answer alone: it
takes the program's ledger (which batch belongs to which table) and the tables V reads.

A :class:`ProgramSnapshot` is then, for a batch B every view has applied through, each
view's answer version at B with its exact Parquet file list and schema: what a reader that
is not Delta-aware must be given instead of the answer's folder, which holds the files of
every version ever written (a plain Parquet glob over it counts old rows again).  A
version's files may also hold rows its Delta deletion vectors delete (incr marks the old
rows of the groups a batch changed instead of rewriting their files), so each version comes
with the positions of those rows too (:attr:`AnswerVersion.deleted`), and every reader built
from it leaves them out by file and position.
:class:`Snapshots` finds them: the live batches, the latest batch every view has applied
through (:meth:`Snapshots.latest_batch`), and the last few snapshots a BI user may pin
(:meth:`Snapshots.recent`).

Commits are trusted for the batch they name only while names grow with versions
(:func:`trusted_commits`): after a view's answer query changes, incr republishes it under
every earlier batch number from the current state, and those versions do not show the
answer as of the batch they name.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from incr.errors import StorageError
from incr.runtime.ledger import Ledger
from incr.runtime.store import (
    DeltaStore,
    commit_batches,
    deleted_positions,
    table_files,
    trusted_commits,
)

if TYPE_CHECKING:
    from incr.compiler import CompiledProgram

#: Reader features that make a version's files differ from its rows in a way serving does
#: not undo (renamed columns): such a table cannot be served from its files.  Deletion
#: vectors are served: :attr:`AnswerVersion.deleted` lists the rows to leave out.
UNSERVABLE_FEATURES = frozenset({"columnMapping"})
#: Columns of :meth:`AnswerVersion.deleted_rows`: a deleted row's file and its position there.
DELETED_SCHEMA = pa.schema([pa.field("file_name", pa.string(), nullable=False),
                            pa.field("row_index", pa.int64(), nullable=False)])
#: File lists kept per process: one entry per (view, version) asked for recently ...
_KEPT_FILE_LISTS = 4096
#: ... holding at most this many deleted positions in all (8 bytes each): a large answer's
#: vectors may delete millions of rows before it is compacted.
_KEPT_DELETED_ROWS = 20_000_000


@dataclass(frozen=True)
class ViewInputs:
    """A view and the source tables it reads (lower case, as the ledger is matched)."""

    view: str
    sources: frozenset[str]


@dataclass(frozen=True)
class ProgramLayout:
    """What snapshots need to know of a compiled program: its name and each view's inputs.

    Kept apart from :class:`~incr.compiler.CompiledProgram` so that a server or a test can
    describe a program without compiling it.
    """

    name: str
    views: tuple[ViewInputs, ...]

    @classmethod
    def of(cls, compiled: CompiledProgram) -> ProgramLayout:
        """The layout of a compiled program (views in declaration order)."""
        return cls(compiled.name, tuple(
            ViewInputs(p.view, frozenset(s.lower() for s in p.sources)) for p in compiled.plans))


@dataclass(frozen=True)
class AnswerVersion:
    """One view's answer as of a snapshot: a Delta version and exactly its files.

    Attributes:
        view: the view's name.
        path: the answer table's root (``<warehouse>/answers/<view>``).
        version: the Delta version.
        batch: the batch whose commit made this version (the last batch up to the
            snapshot's that changed the view).
        files: absolute paths (or URIs, for remote tables) of the version's Parquet files.
        schema: the version's schema.
        rows: live rows of the version: the log's file statistics less the rows deletion
            vectors delete (None: not recorded).
        deleted: the rows the version's deletion vectors delete, as positions in their file
            (int64, from 0, sorted), by the file as ``files`` spells it; files without
            deleted rows are absent.  The files hold these rows still, so a reader given
            the files must leave them out.  Not compared: a version's deletions follow from
            its table and version.
    """

    view: str
    path: str
    version: int
    batch: int
    files: tuple[str, ...]
    schema: pa.Schema
    rows: int | None
    deleted: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_deletions(self) -> bool:
        """Whether some file of the version holds deleted rows (its files alone show too many)."""
        return any(len(rows) for rows in self.deleted.values())

    def deleted_rows(self, name: Callable[[int, str], str]) -> pa.Table:
        """Every deleted row as (``file_name``, ``row_index``), sorted (:data:`DELETED_SCHEMA`).

        Args:
            name: the name a reader knows the file by, from its index in ``files`` and its
                path there (its link's name in a version folder, its path for DuckDB):
                the rows are matched on the name the reader reports.
        """
        names, positions = [], []
        for i, file in enumerate(self.files):
            rows = self.deleted.get(file)
            if rows is not None and len(rows):
                names.append(np.full(len(rows), name(i, file), dtype=object))
                positions.append(np.sort(np.asarray(rows, dtype=np.int64)))
        if not names:
            return DELETED_SCHEMA.empty_table()
        table = pa.table([pa.array(np.concatenate(names), pa.string()),
                          pa.array(np.concatenate(positions), pa.int64())], schema=DELETED_SCHEMA)
        return table.sort_by([("file_name", "ascending"), ("row_index", "ascending")])


@dataclass(frozen=True)
class ProgramSnapshot:
    """Every view of a program as of the same batch."""

    program: str
    batch: int
    answers: tuple[AnswerVersion, ...]

    def answer(self, view: str) -> AnswerVersion:
        """The answer of ``view`` (case-insensitive) in this snapshot."""
        for a in self.answers:
            if a.view.lower() == view.lower():
                return a
        raise KeyError(view)

    def versions(self) -> dict[str, int]:
        """Each view's Delta version, by view name."""
        return {a.view: a.version for a in self.answers}

    def describe(self) -> str:
        """One line: the batch and each view's version (for logs)."""
        views = ", ".join(f"{a.view} v{a.version}" for a in self.answers)
        return f"program {self.program} at batch {self.batch} ({views})"


@dataclass
class _AnswerLog:
    """What has been read of one answer table's log: up to ``version``."""

    version: int = -1
    commits: tuple[tuple[int, int], ...] = ()  # (version, batch) of every labelled commit
    trusted: tuple[tuple[int, int], ...] = ()

    @property
    def applied_through(self) -> int:
        """The batch of the newest labelled commit: the answer's applied-through mark."""
        return self.commits[-1][1] if self.commits else -1


class Snapshots:
    """The snapshots one program's answers hold in one warehouse, as of the last refresh.

    Every question is answered from what :meth:`refresh` read (the ledger first, then each
    answer's log), so one refresh sees one state of the warehouse: a view that commits in
    between is not seen half.  A refresh reads only the commits since the previous one.

    Args:
        warehouse: the warehouse folder (``<warehouse>/answers/<view>`` are the answers).
        layout: the program's name and views.
        store: the storage adapter to read with (a new one by default).
    """

    def __init__(self, warehouse: str | Path, layout: ProgramLayout, store: DeltaStore | None = None):
        self.warehouse = Path(warehouse)
        self.layout = layout
        self.store = store or DeltaStore()
        self.ledger = Ledger(self.store, self.warehouse / "_incr" / layout.name / "ledger")
        self._batches: tuple[tuple[int, str], ...] = ()  # (batch, table) of live batches
        self._logs: dict[str, _AnswerLog] = {v.view: _AnswerLog() for v in layout.views}
        self._versions: OrderedDict[tuple[str, int], AnswerVersion] = OrderedDict()
        self.refresh()

    def answer_path(self, view: str) -> Path:
        """Where the answer of ``view`` lives."""
        return self.warehouse / "answers" / view

    # -- reading ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Reads the ledger, then the commits each answer gained since the last refresh."""
        self._batches = tuple((b.seq, b.table.lower()) for b in self.ledger.batches())
        for view, log in self._logs.items():
            self._logs[view] = self._read_log(self.answer_path(view), log)

    def _read_log(self, path: Path, kept: _AnswerLog) -> _AnswerLog:
        if not self.store.exists(path):
            return _AnswerLog()
        current = self.store.table(path).version()
        if current < kept.version:  # the table was recreated: read it again whole
            kept = _AnswerLog()
        if current == kept.version:
            return kept
        fresh = tuple(commit_batches(path, kept.version + 1, current))
        commits = tuple(sorted(kept.commits + fresh))
        return _AnswerLog(current, commits, tuple(trusted_commits(commits)))

    # -- questions ----------------------------------------------------------------------------
    def batches(self) -> tuple[int, ...]:
        """The live batch numbers (registered and not skipped), ascending."""
        return tuple(seq for seq, _ in self._batches)

    def applied_through(self, view: str) -> int:
        """The last batch ``view``'s answer committed (-1: none)."""
        return self._logs[view].applied_through

    def covered_through(self, view: str) -> int | None:
        """The last batch ``view``'s answer is current at (None: no live batch yet).

        Every batch up to it that the view reads is applied.

        The view may be current well past its own last commit: the batches after it may all
        be of tables it does not read.
        """
        if not self._batches:
            return None
        inputs = next(v for v in self.layout.views if v.view == view).sources
        done = self.applied_through(view)
        waiting = [seq for seq, table in self._batches if seq > done and table in inputs]
        return waiting[0] - 1 if waiting else self._batches[-1][0]

    def latest_batch(self) -> int | None:
        """The last live batch every view has applied through and has an answer at.

        None: no such batch yet.
        """
        through = [self.covered_through(v.view) for v in self.layout.views]
        if not through or None in through:
            return None
        limit = min(t for t in through if t is not None)
        for seq in reversed(self.batches()):
            if seq <= limit and self._complete(seq):
                return seq
        return None

    def _complete(self, batch: int) -> bool:
        """Whether every view has a trusted answer version at ``batch``."""
        return all(self._version_at(v.view, batch) is not None for v in self.layout.views)

    def _version_at(self, view: str, batch: int) -> tuple[int, int] | None:
        """``(version, batch)`` of the last trusted commit of ``view`` at or before ``batch``."""
        trusted = self._logs[view].trusted
        i = bisect.bisect_right([b for _, b in trusted], batch)
        return trusted[i - 1] if i else None

    def snapshot(self, batch: int) -> ProgramSnapshot:
        """Every view's answer as of ``batch``, with its exact files.

        Raises:
            StorageError: ``batch`` is no live batch, some view has not applied through it,
                or some view has no answer at it (its first batch came later).
        """
        latest = self.latest_batch()
        if batch not in self.batches():
            raise StorageError(f"program {self.layout.name} has no live batch {batch}")
        if latest is None or batch > latest:
            raise StorageError(f"program {self.layout.name}: not every view has applied batch "
                               f"{batch} yet (the latest consistent batch is {latest})")
        answers = []
        for v in self.layout.views:
            found = self._version_at(v.view, batch)
            if found is None:
                raise StorageError(f"view {v.view} of program {self.layout.name} has no answer "
                                   f"at batch {batch}")
            version, made_by = found
            answers.append(self._answer_version(v.view, version, made_by))
        return ProgramSnapshot(self.layout.name, batch, tuple(answers))

    def latest(self) -> ProgramSnapshot | None:
        """The snapshot at :meth:`latest_batch` (None: none yet)."""
        batch = self.latest_batch()
        return None if batch is None else self.snapshot(batch)

    def recent(self, keep: int) -> list[ProgramSnapshot]:
        """The last ``keep`` snapshots, newest first (fewer when fewer batches have one)."""
        latest = self.latest_batch()
        if latest is None or keep <= 0:
            return []
        out = []
        for seq in reversed(self.batches()):
            if len(out) == keep:
                break
            if seq <= latest and self._complete(seq):
                out.append(self.snapshot(seq))
        return out

    def _answer_version(self, view: str, version: int, batch: int) -> AnswerVersion:
        """One version of ``view``'s answer (kept: a version never changes)."""
        key = (view, version)
        kept = self._versions.get(key)
        if kept is not None and kept.batch == batch:
            self._versions.move_to_end(key)
            return kept
        kept = answer_version(view, self.answer_path(view), version, batch)
        self._versions[key] = kept
        while len(self._versions) > 1 and (
                len(self._versions) > _KEPT_FILE_LISTS
                or sum(_deleted_count(a) for a in self._versions.values()) > _KEPT_DELETED_ROWS):
            self._versions.popitem(last=False)
        return kept


def _deleted_count(answer: AnswerVersion) -> int:
    return sum(len(rows) for rows in answer.deleted.values())


def answer_version(view: str, path: Path, version: int, batch: int) -> AnswerVersion:
    """Version ``version`` of the answer table at ``path``, read from its log.

    Its files, schema, live rows and the rows its deletion vectors delete.

    Args:
        view: the view's name.
        path: the answer table's root.
        version: the Delta version.
        batch: the batch whose commit made the version.

    Raises:
        StorageError: the version cannot be read, renames columns or is partitioned.
    """
    try:
        dt = DeltaTable(str(path), version=version)
    except DeltaError as e:
        raise StorageError(f"version {version} of the answer of view {view} at {path} cannot "
                           f"be read (its log may have been cleaned up): {e}") from e
    features = set(dt.protocol().reader_features or []) & UNSERVABLE_FEATURES
    if features:
        raise StorageError(f"the answer of view {view} at {path} uses "
                           f"{', '.join(sorted(features))}: its files alone do not give its "
                           f"rows, so it cannot be served to readers that are not Delta-aware")
    if dt.metadata().partition_columns:
        raise StorageError(f"the answer of view {view} at {path} is partitioned; incr writes "
                           f"answers unpartitioned and serves only those")
    files = tuple(table_files(dt))
    listed = set(files)
    # The store's own reading of the vectors (keyed as table_files spells the files), the one
    # incr's Spark reads apply: serving leaves out exactly the rows a batch's reads do.
    deleted = {f: rows for f, rows in deleted_positions(dt).items() if f in listed and len(rows)}
    counts = pa.table(dt.get_add_actions(flatten=True))["num_records"].to_pylist()
    rows = None if None in counts else sum(counts) - sum(len(r) for r in deleted.values())
    return AnswerVersion(view, str(path), version, batch, files, pa.schema(dt.schema().to_arrow()),
                         rows, MappingProxyType(deleted))

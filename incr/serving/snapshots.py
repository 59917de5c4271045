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
every version ever written (a plain Parquet glob over it counts old rows again).
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from incr.errors import StorageError
from incr.runtime.ledger import Ledger
from incr.runtime.store import DeltaStore, commit_batches, trusted_commits

if TYPE_CHECKING:
    from incr.compiler import CompiledProgram

#: Reader features that make a version's file list differ from its rows (deleted rows kept
#: in files, renamed columns): such a table cannot be served from its files.
UNSERVABLE_FEATURES = frozenset({"deletionVectors", "columnMapping"})
#: File lists kept per process: one entry per (view, version) asked for recently.
_KEPT_FILE_LISTS = 4096


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
        rows: rows of the version, from the log's file statistics (None: not recorded).
    """

    view: str
    path: str
    version: int
    batch: int
    files: tuple[str, ...]
    schema: pa.Schema
    rows: int | None


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
        self._files: OrderedDict[tuple[str, int], tuple[tuple[str, ...], pa.Schema, int | None]] = \
            OrderedDict()
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
            path = self.answer_path(v.view)
            files, schema, rows = self._file_list(v.view, path, version)
            answers.append(AnswerVersion(v.view, str(path), version, made_by, files, schema, rows))
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

    def _file_list(self, view: str, path: Path,
                   version: int) -> tuple[tuple[str, ...], pa.Schema, int | None]:
        """Files, schema and rows of one version (kept: a version never changes)."""
        key = (view, version)
        kept = self._files.get(key)
        if kept is not None:
            self._files.move_to_end(key)
            return kept
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
        schema = pa.schema(dt.schema().to_arrow())
        counts = pa.table(dt.get_add_actions(flatten=True))["num_records"].to_pylist()
        rows = None if None in counts else sum(counts)
        kept = (tuple(dt.file_uris()), schema, rows)
        self._files[key] = kept
        if len(self._files) > _KEPT_FILE_LISTS:
            self._files.popitem(last=False)
        return kept

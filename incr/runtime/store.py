"""The storage adapter: every Delta Lake write goes through :class:`DeltaStore`.

Tables are read and written with delta-rs (``deltalake``), because the delta-spark JARs are
not available here (DESIGN §4).  Two properties matter to the rest of incr:

* **Exactly once.** Every write for a batch carries an app transaction
  ``(app_id="incr", version=<batch number>)`` in the same commit as its data, and
  :meth:`DeltaStore.batch_version` reads it back.  A retried write first asks whether the
  batch is already in; a write with no data still commits the marker.
* **One MERGE.** :class:`Merge` is shaped like delta-rs's merge builder (clause-named
  methods, ``execute()`` returns metrics) and is the only place a MERGE is issued.

Rows computed in Spark are not collected to be written: Spark's executors write the Parquet
files into a fresh staging directory of the table (:meth:`DeltaStore.staging`) and
:meth:`DeltaStore.commit_files` moves them into the table's layout and commits them with
delta-rs, with statistics read from each file's footer.  The exactly-once rule holds the
same way: the files become part of the table only through that one commit, which carries the
batch marker.  A crash before it leaves files no version references (a staging directory, or
files already moved), never read: a retry writes its own, and a full vacuum
(``vacuum(full=True)``) deletes the strays, as it does a crashed delta-rs write's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from incr.compiler.plan import BUCKET
from incr.compiler.publish import GONE
from incr.compiler.sqlgen import answer_merge_condition, merge_condition, merge_ident
from incr.config import (
    CHECKPOINT_INTERVAL,
    DELETED_ROWS,
    DELETED_SHARE,
    READ_CACHE_ROWS,
    SMALL_FILE_BYTES,
    settings,
)
from incr.errors import OutOfRangeError, StorageError
from incr.runtime import deletion, deltalog, lookup, mirror, parallel
from incr.runtime.types import nullable

log = logging.getLogger("incr.runtime")

APP_ID = "incr"
#: Commit metadata naming the batch a commit belongs to (answer tables carry it).
BATCH_KEY = "incr.batch"
#: Commits that change no rows and carry none of incr's metadata (housekeeping, compaction
#: file by file, the feature a table's first deletion vectors need).
MAINTENANCE_OPERATIONS = frozenset({"VACUUM START", "VACUUM END", "OPTIMIZE", "ADD FEATURE",
                                    "SET TBLPROPERTIES"})
#: The table properties of every table incr creates (and gives one made before at its
#: housekeeping): a checkpoint every :data:`~incr.config.CHECKPOINT_INTERVAL` commits.
TABLE_PROPERTIES = {"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}
_UNSUPPORTED_FEATURES = {"columnMapping"}
DELETION_VECTORS = "deletionVectors"
#: Spark's name for a NULL partition value in a directory name.
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class Snapshot:
    """What Spark needs to read a table's current version."""

    root: str
    files: list[str]
    schema: pa.Schema
    partition_by: tuple[str, ...]
    version: int
    #: Rows the table's deletion vectors delete: positions (int64, from 0) by file, keyed
    #: as in ``files``; files without a vector are absent.
    deleted: Mapping[str, Any] = field(default_factory=dict)

    def deleted_rows(self, file: str, row: str, depth: int | None = None) -> pa.Table:
        """:attr:`deleted` as a table of one row per deleted row: the file (its last
        ``depth`` path parts when given, else its path as in ``files``) and the position,
        for an engine to leave those rows out of a read of the files by an anti-join."""
        files = list(self.deleted)
        names = [f if depth is None else "/".join(Path(f).parts[-depth:]) for f in files]
        return pa.table({
            file: pa.array(np.repeat(np.array(names, dtype=object),
                                     [len(self.deleted[f]) for f in files]), pa.string()),
            row: pa.array(np.concatenate([self.deleted[f] for f in files]) if files else [],
                          pa.int64())})


@dataclass
class MergeMetrics:
    """What a merge did (delta-rs's own metrics, plus the batch it recorded)."""

    batch: int | None
    source_rows: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    files_added: int = 0
    files_removed: int = 0
    raw: dict[str, Any] = field(default_factory=dict)


class DeltaStore:
    """Reads and writes Delta tables on a local (or fsspec-reachable) path.

    Opened tables are kept and brought up to date with ``update_incremental`` (reading only
    the commits since), which costs a fraction of opening the log again: a batch asks
    about the same few tables a dozen times.  A local table whose next commit file does not
    exist has had no commit since, and is not asked at all (a stat, where delta-rs lists
    the log).  A kept table is dropped when its last commit file is no longer the one it
    read (the directory was removed or the table recreated).
    """

    def __init__(self, mirror_rows: int | None = None, mirror_max_rows: int | None = None) -> None:
        """``mirror_rows``: files of at least this many rows of a table with deletion vectors
        are searched by key in a mirror (:mod:`~incr.runtime.mirror`); default
        ``INCR_MIRROR_ROWS``, 0 for none.  ``mirror_max_rows``: but none of more rows than
        this (writing a mirror reads its file whole into memory); default
        ``INCR_LOCAL_STATE_ROWS``, the rows the driver may hold, 0 for no limit."""
        self.mirror_rows = settings().mirror_rows if mirror_rows is None else mirror_rows
        self.mirror_max_rows = (settings().local_state_rows if mirror_max_rows is None
                                else mirror_max_rows)
        #: Each table opened: the object, and the commit stamp and version it was kept at.
        self._open: dict[str, tuple[DeltaTable, tuple[int, int] | None, int]] = {}
        self._adds: dict[str, tuple[int, dict[str, dict[str, Any]], tuple[int, int] | None]] = {}
        #: The last :meth:`read_matching` of a table with deletion vectors on one column or
        #: on every column it names: (version, what it matched, the rows with their positions).
        self._found: dict[str, tuple[int, tuple[lookup.Wanted, ...], lookup.Found]] = {}
        #: The batch each kept table's version last committed, by the version and commit
        #: stamp it was read at: a run asks it of every state table once per view per batch,
        #: and delta-rs answers from the whole log each time.
        self._batches: dict[str, tuple[int, tuple[int, int] | None, int | None]] = {}
        #: The newest commit info of each kept table, by the version and commit stamp it was
        #: read at: every view asks it of its answer table several times a batch
        #: (:meth:`last_commit`), and delta-rs reads the log's newest commits each time.
        self._commits: dict[str, tuple[int, tuple[int, int] | None, dict[str, Any]]] = {}
        #: Whole tables read (:meth:`read`), by the version and commit stamp they were read
        #: at: the views sharing a state each read its tables at the same version.  Only
        #: tables of at most :data:`READ_CACHE_ROWS` rows, and that many rows in all.
        self._reads: dict[str, tuple[int, tuple[int, int] | None, pa.Table]] = {}
        self._reads_lock = threading.Lock()  # a row index appends on a thread of its own
        #: Live rows of each kept table (of some buckets), by the version and commit stamp
        #: they were counted at: every view asks them of each state table it reads, to
        #: choose an engine, and delta-rs lists the version's files each time.
        self._counts: dict[tuple[str, tuple[int, ...] | None],
                           tuple[int, tuple[int, int] | None, int | None]] = {}

    # -- reading ---------------------------------------------------------------------------
    def exists(self, path: str | Path) -> bool:
        """True when ``path`` holds a Delta table.

        A local table is known by its first commit file or its last checkpoint's pointer
        (two file checks): delta-rs's own test lists the whole log, whose commits grow with
        every batch until housekeeping, and a batch asks this of each table many times.
        """
        key = str(path)
        if "://" not in key:
            log = os.path.join(key, "_delta_log")
            if not os.path.isdir(log):
                return False
            if _has_commit(key, 0) or os.path.exists(os.path.join(log, "_last_checkpoint")):
                return True
        return DeltaTable.is_deltatable(key)

    def table(self, path: str | Path) -> DeltaTable:
        """The table at ``path`` (current version), or a StorageError saying which is missing."""
        key = str(path)
        kept = self._open.get(key)
        if kept is not None:
            dt, stamp, version = kept
            if stamp is not None and _commit_stamp(key, version) == stamp:
                if dt.version() != version:
                    # The object committed itself (a MERGE, a write given it): it holds
                    # that commit's state, so it is kept at that version, not opened again.
                    self._open[key] = (dt, _commit_stamp(key, dt.version()), dt.version())
                if not _has_commit(key, dt.version() + 1):
                    return dt  # no commit since: a Delta version is the next commit file
                try:
                    dt.update_incremental()
                    self._open[key] = (dt, _commit_stamp(key, dt.version()), dt.version())
                    return dt
                except DeltaError:
                    pass
            del self._open[key]
        try:
            dt = DeltaTable(key)
        except TableNotFoundError as e:
            raise StorageError(f"no Delta table at {path}") from e
        self._open[key] = (dt, _commit_stamp(key, dt.version()), dt.version())
        return dt

    def schema(self, path: str | Path) -> pa.Schema:
        """The table's current schema as Arrow."""
        return pa.schema(self.table(path).schema().to_arrow())

    def row_count(self, path: str | Path, buckets: Iterable[int] | None = None) -> int | None:
        """Rows in the current version (of ``buckets`` only, when given), from the log's file
        statistics (None: not recorded), so deciding whether a table is small reads no data.

        Live rows, as a read yields them: a file's rows less those its deletion vector
        deletes (a table moved by vectors still holds them, and counting them would send a
        table at the driver-side limit to Spark after its first delete).
        """
        key = str(path)
        dt = self.table(path)
        version, stamp = dt.version(), self._open[key][1]  # table() keeps what it opens
        asked = (key, None if buckets is None else tuple(sorted(set(buckets))))
        seen = self._counts.get(asked)
        if stamp is not None and seen is not None and seen[:2] == (version, stamp):
            return seen[2]
        rows = self._live_rows(path, buckets)
        if stamp is not None:
            if len(self._counts) >= _COUNTS_KEPT:
                self._counts.clear()
            self._counts[asked] = (version, stamp, rows)
        return rows

    def totals(self, path: str | Path) -> tuple[int | None, int]:
        """Live rows (None: not recorded) and bytes of the current version's files, from the
        log: the files' rows less those their deletion vectors delete."""
        actions = pa.table(self.table(path).get_add_actions(flatten=True))
        size = int(sum(s or 0 for s in actions["size_bytes"].to_pylist()))
        return self._live_rows(path, None, actions), size

    def _live_rows(self, path: str | Path, buckets: Iterable[int] | None,
                   actions: pa.Table | None = None) -> int | None:
        """:meth:`row_count`; ``actions``: the version's add actions, if already read."""
        dt = self.table(path)
        if has_deletion_vectors(dt):
            wanted = None if buckets is None else {str(b) for b in buckets}
            live = 0
            for bucket, records, deleted in self._file_rows(path):
                if wanted is not None and bucket is not None and bucket not in wanted:
                    continue
                if records is None:
                    return None
                live += records - deleted
            return live
        if actions is None:
            actions = pa.table(dt.get_add_actions(flatten=True))
        counts = actions["num_records"]
        if buckets is not None:
            column = f"partition.{BUCKET}"
            if column in actions.column_names:
                keep = pc.is_in(actions[column].cast(pa.int64()),
                                value_set=pa.array(sorted(set(buckets)), pa.int64()))
                counts = counts.filter(keep)
        values = counts.to_pylist()
        return None if None in values else sum(values)

    def _file_rows(self, path: str | Path) -> Iterator[tuple[str | None, int | None, int]]:
        """Per live file, from its add action: its bucket (None: not partitioned by one), its
        rows (None: not recorded) and the rows its deletion vector deletes."""
        for add in self.live_adds(path).values():
            bucket = (add.get("partitionValues") or {}).get(BUCKET)
            records = json.loads(add.get("stats") or "{}").get("numRecords")
            yield (None if bucket is None else str(bucket),
                   None if records is None else int(records),
                   int((add.get("deletionVector") or {}).get("cardinality", 0)))

    def reach(self, path: str | Path, column: str, values: pa.Array) -> float:
        """The share of the table's rows in files whose ``column`` range (log statistics)
        may hold one of ``values``: what a MERGE matching on ``column`` would rewrite.

        A file without statistics counts as reached; a NULL value reaches files with NULLs.
        """
        dt = self.table(path)
        rows = pa.table(dt.get_add_actions(flatten=True))["num_records"].to_pylist()
        total = sum(r or 0 for r in rows)
        if not total:
            return 0.0
        hits = self._reached(dt, column, values)
        return sum((n or 0) for n, (_, hit) in zip(rows, hits, strict=True) if hit) / total

    @staticmethod
    def _reached(dt: DeltaTable, column: str, values: pa.Array) -> list[tuple[str, bool]]:
        """Each file of the table (its path in the log) and whether its ``column`` range
        may hold one of ``values`` (see :meth:`reach`)."""
        actions = pa.table(dt.get_add_actions(flatten=True))
        present = pc.drop_null(values)
        wanted = pc.unique(present).sort() if len(present) else present
        has_null = len(present) < len(values)
        lows = actions[f"min.{column}"] if f"min.{column}" in actions.column_names else None
        highs = actions[f"max.{column}"] if f"max.{column}" in actions.column_names else None
        nulls = (actions[f"null_count.{column}"].to_pylist()
                 if f"null_count.{column}" in actions.column_names else [None] * actions.num_rows)
        out = []
        for i, name in enumerate(actions["path"].to_pylist()):
            low = lows[i].as_py() if lows is not None else None
            high = highs[i].as_py() if highs is not None else None
            if low is None or high is None:
                hit = True
            else:
                inside = pc.and_(pc.greater_equal(wanted, pa.scalar(low, wanted.type)),
                                 pc.less_equal(wanted, pa.scalar(high, wanted.type)))
                hit = bool(pc.any(inside).as_py()) or (has_null and bool(nulls[i]))
            out.append((name, hit))
        return out

    def forget(self, path: str | Path) -> None:
        """Drops kept tables at or under ``path`` (after removing them)."""
        root = str(path)
        for kept in (self._open, self._adds, self._found, self._commits, self._reads):
            for key in [k for k in kept if k == root or k.startswith(root.rstrip("/") + "/")]:
                del kept[key]

    def live_adds(self, path: str | Path) -> dict[str, dict[str, Any]]:
        """The current ``add`` action of every file, by its path in the log, deletion vector
        included (:func:`~incr.runtime.deltalog.live_adds`; read on from the last call's)."""
        version = self.table(path).version()
        key = str(path)
        kept = self._adds.get(key)
        known = None
        if kept is not None and kept[2] is not None and _commit_stamp(key, kept[0]) == kept[2]:
            known = (kept[0], kept[1])  # (the same table: its commit file is still that one)
        try:
            adds = deltalog.live_adds(path, version, known)
        except FileNotFoundError:  # the log was cleaned up since: from its checkpoint
            adds = deltalog.live_adds(path, version)
        self._adds[key] = (version, adds, _commit_stamp(key, version))
        return adds

    def deleted_rows(self, path: str | Path) -> tuple[int, int]:
        """The rows the current files' deletion vectors delete, and the rows the files hold."""
        dt = self.table(path)
        if not has_deletion_vectors(dt):
            return 0, 0
        total = deleted = 0
        for _, records, gone in self._file_rows(path):
            total += records or 0
            deleted += gone
        return deleted, total

    def batch_version(self, path: str | Path) -> int | None:
        """The last batch committed to the table (None: table missing or never written by a batch)."""
        key = str(path)
        if key not in self._open and not self.exists(path):
            return None
        try:
            dt = self.table(path)
        except StorageError:
            if self.exists(path):
                raise
            return None  # a kept table whose directory is gone
        version, stamp = dt.version(), self._open[key][1]  # table() keeps what it opens
        seen = self._batches.get(key)
        if stamp is not None and seen is not None and seen[:2] == (version, stamp):
            return seen[2]
        batch = dt.transaction_version(APP_ID)
        self._batches[key] = (version, stamp, batch)
        return batch

    def applied_through(self, path: str | Path) -> int:
        """Like :meth:`batch_version`, with -1 for "no batch yet" (batches count from 0)."""
        version = self.batch_version(path)
        return -1 if version is None else version

    def snapshot(self, path: str | Path, buckets: Iterable[int] | None = None) -> Snapshot:
        """The current file list (of ``buckets`` only, when given and the table is partitioned
        by bucket) and schema, after checking Spark can read the files directly."""
        dt = self.table(path)
        protocol = dt.protocol()
        features = set(protocol.reader_features or []) & _UNSUPPORTED_FEATURES
        if features:
            raise StorageError(
                f"the Delta table at {path} uses {', '.join(sorted(features))}; Spark reads incr's "
                f"tables through their file lists, which would read the files' own column names. "
                f"Rewrite the table without those features.")
        schema = pa.schema(dt.schema().to_arrow())
        partitions = tuple(dt.metadata().partition_columns)
        only = _bucket_filter(partitions, buckets)
        files = [] if only == [] else table_files(dt, only)
        deleted = deleted_positions(dt) if files else {}
        return Snapshot(str(Path(path)), files, schema, partitions, dt.version(),
                        {f: deleted[f] for f in files if f in deleted})

    def read(self, path: str | Path, version: int | None = None,
             buckets: Iterable[int] | None = None,
             columns: list[str] | None = None) -> pa.Table:
        """The table's rows as Arrow (current version, or ``version`` by time travel).

        ``buckets``: read only those buckets' partitions (of the current version), the
        part of a state table a batch's keys reach.  ``columns``: only those.
        """
        if version is None:
            dt = self.table(path)
            if buckets is None and columns is None:
                return self._read_whole(str(path), dt)
            partitions = _bucket_filter(tuple(dt.metadata().partition_columns), buckets)
            if partitions == []:
                return pa.schema(dt.schema().to_arrow()).empty_table()
        else:
            dt = DeltaTable(str(path))  # time travel moves the object: not a kept one
            dt.load_as_version(version)
            partitions = None
        return _rows(dt, path, partitions, columns=columns)

    def _read_whole(self, key: str, dt: DeltaTable) -> pa.Table:
        """The current version's rows, read once per version and commit (:attr:`_reads`)."""
        version, stamp = dt.version(), self._open[key][1]  # table() keeps what it opens
        with self._reads_lock:
            seen = self._reads.pop(key, None)
            if stamp is not None and seen is not None and seen[:2] == (version, stamp):
                self._reads[key] = seen  # the most recently used goes last
                return seen[2]
        rows = _rows(dt, key)
        if stamp is None or rows.num_rows > READ_CACHE_ROWS:
            return rows
        with self._reads_lock:
            self._reads[key] = (version, stamp, rows)
            while sum(r.num_rows for _, _, r in self._reads.values()) > READ_CACHE_ROWS:
                del self._reads[next(iter(self._reads))]
        return rows

    def read_matching(self, path: str | Path, matching: Mapping[str, pa.Array],
                      buckets: Iterable[int] | None = None, every: bool = False,
                      bucketed_by: tuple[str, int] | None = None) -> pa.Table:
        """The rows whose column ``c`` holds one of ``matching[c]``, for some ``c`` (for every
        ``c`` with ``every``; current version; of ``buckets`` only, when given).
        ``bucketed_by``: (column, count) when the table's ``_bucket`` is that column's hash
        into ``count`` buckets, so a bucket's files need only be searched for its values.

        A filtered scan: files and row groups whose statistics exclude every value are
        skipped, and only matching rows are kept, so memory follows the matches.  A NULL
        among the values matches the rows where ``c`` is NULL (a group of NULL; a join on
        equality, which never meets NULL, merely reads them too).
        """
        import pyarrow.dataset as ds

        dt = self.table(path)
        partitions = _bucket_filter(tuple(dt.metadata().partition_columns), buckets)
        if partitions == [] or not matching:
            return pa.schema(dt.schema().to_arrow()).empty_table()
        schema = pa.schema(dt.schema().to_arrow())
        if has_deletion_vectors(dt):
            wanted = [lookup.Wanted(c, v, schema.field(c).type) for c, v in matching.items()]
            found = lookup.find(Path(path), self.live_adds(path), schema, wanted,
                                _VectorReader(dt, Path(path)), buckets=buckets, bucket=BUCKET,
                                every=every, mirror_rows=(self.mirror_rows, self.mirror_max_rows),
                                bucketed_by=bucketed_by)
            if buckets is None and (every or len(wanted) == 1):  # for the MERGE that deletes them
                self._found[str(path)] = (dt.version(), tuple(wanted), found)
            return found.rows
        wanted = None
        # Arrow's scan prunes row groups by statistics only where that is right: integer keys.
        # Float statistics leave NaN out (NaN rows would be skipped), and delta-rs gives
        # string statistics as string_view, which Arrow cannot compare with a string column.
        pushdown = all(pa.types.is_integer(schema.field(c).type) for c in matching)
        for column, values in matching.items():
            present = pc.unique(pc.drop_null(values)).cast(schema.field(column).type)
            term = ds.field(column).isin(present)
            if values.null_count:
                term = term | ds.field(column).is_null()
            wanted = term if wanted is None else (wanted & term if every else wanted | term)
        return _rows(dt, path, partitions, where=wanted, pushdown=pushdown)

    def history(self, path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
        """Commit infos, newest first (custom commit metadata included)."""
        return self.table(path).history(limit)

    def last_commit_metadata(self, path: str | Path, key: str) -> str | None:
        """A custom metadata value of the newest commit that is not housekeeping, or None.

        A VACUUM adds commits of its own; what incr wrote with the newest data (an answer's
        query fingerprint, its program) is read from the commit before them.
        """
        return self.last_commit(path).get(key)

    def last_commit(self, path: str | Path) -> dict[str, Any]:
        """The commit info (custom metadata included) of the newest commit that is not
        housekeeping; empty when there is none (or no table)."""
        key = str(path)
        if not self.exists(path):
            return {}
        version, stamp = self.table(path).version(), self._open[key][1]
        seen = self._commits.get(key)
        if stamp is not None and seen is not None and seen[:2] == (version, stamp):
            return dict(seen[2])
        found: dict[str, Any] = {}
        for limit in (4, None):
            commits = self.history(path, limit)
            found = next((c for c in commits
                          if c.get("operation") not in MAINTENANCE_OPERATIONS), {})
            if found or limit is None or len(commits) < limit:
                break
        self._commits[key] = (version, stamp, found)
        return dict(found)

    def housekeep(self, path: str | Path, *, keep_hours: float, keep_versions: Iterable[int] = ()
                  ) -> list[str]:
        """Checkpoints the table, drops expired log files, and deletes unneeded data files.

        A table made before incr set :data:`TABLE_PROPERTIES` on the tables it creates gets
        them first (a commit of its own, which serves the same rows).

        Kept: the newest version, every version of the last ``keep_hours`` hours and the
        ``keep_versions``; the VACUUM lists the whole folder, so files no commit names (left
        by a killed write) go too.  Only safe while no write to the table is in flight (the
        caller holds the program's locks).  Returns the deleted files.
        """
        dt = self.table(path)
        configuration = dt.metadata().configuration
        missing = {k: v for k, v in TABLE_PROPERTIES.items() if k not in configuration}
        if missing:
            dt.alter.set_table_properties(missing)
        dt.create_checkpoint()
        dt.cleanup_metadata()
        removed = dt.vacuum(retention_hours=math.ceil(keep_hours), dry_run=False,
                            enforce_retention_duration=False, full=True,
                            keep_versions=sorted(set(keep_versions)) or None)
        mirror.prune(Path(path))
        self.forget(path)
        return removed

    # -- writing ---------------------------------------------------------------------------
    def write(self, path: str | Path, data: pa.Table, *, mode: str, batch: int | None,
              partition_by: Iterable[str] | None = None, description: str | None = None,
              metadata: Mapping[str, str] | None = None, replace_schema: bool = False,
              target_file_size: int | None = None, add_columns: bool = False) -> None:
        """Appends or overwrites, recording ``batch`` in the same commit when given.

        ``mode`` is ``append`` or ``overwrite``; the table is created on first write.
        ``target_file_size`` (bytes) splits the data into files of about that size.
        ``add_columns``: columns of ``data`` the table lacks are added to it (NULL in the
        rows it holds).
        """
        Path(path).mkdir(parents=True, exist_ok=True)
        target: str | DeltaTable = str(path)
        if target in self._open:  # spares delta-rs opening the log again
            target = self.table(path)
        new = not isinstance(target, DeltaTable) and not self.exists(path)
        try:
            write_deltalake(
                target, data, mode=mode, configuration=TABLE_PROPERTIES if new else None,
                partition_by=list(partition_by) if partition_by else None,
                description=description,
                schema_mode="overwrite" if replace_schema else "merge" if add_columns else None,
                target_file_size=target_file_size,
                commit_properties=_commit(batch, metadata))
        except (DeltaError, OSError) as e:  # delta-rs raises OSError (no errno) on I/O
            raise _failed(f"writing the Delta table at {path}", path, e) from e

    def is_empty(self, path: str | Path) -> bool:
        """True when the table holds no data file (no rows)."""
        return not self.table(path).file_uris()

    def append(self, path: str | Path, data: pa.Table, *, batch: int | None) -> None:
        """Appends ``data`` cast to the table's schema, recording ``batch`` in the commit."""
        target = self.schema(path)
        self.write(path, data.select(target.names).cast(target), mode="append", batch=batch)

    def partition_columns(self, path: str | Path) -> tuple[str, ...]:
        """The table's partition columns (``_bucket`` for state tables, none for others)."""
        return tuple(self.table(path).metadata().partition_columns)

    def _enable_timestamp_ntz(self, path: Path, schema: pa.Schema) -> None:
        """Enables the ``timestampNtz`` feature when ``schema`` (an overwrite's new one) has a
        timestamp without zone and the table does not have it yet.

        delta-rs's own write enables it; its commit of given files refuses the schema
        instead.  This is a commit of its own, before the data's: a crash in between leaves
        the same rows, and no batch marker.
        """
        if not any(pa.types.is_timestamp(f.type) and f.type.tz is None for f in schema):
            return
        dt = self.table(path)
        if "timestampNtz" in (dt.protocol().writer_features or []):
            return
        dt.alter.add_feature(TableFeatures.TimestampWithoutTimezone,
                             allow_protocol_versions_increase=True)

    @contextmanager
    def staging(self, path: str | Path) -> Iterator[Path]:
        """A fresh directory for Spark to write files into, for :meth:`commit_files`; what
        is left of it (a failed write's files) is deleted on leaving the block.

        It is inside the table, so the files move into place by a rename, and its name
        starts with neither ``_`` nor ``.``, so a full vacuum deletes what a crash left there
        (it passes over such directories).
        """
        directory = Path(path) / f"spark-{uuid.uuid4().hex}"
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def commit_files(self, path: str | Path, directory: str | Path, *, mode: str,
                     batch: int | None, schema: pa.Schema | None = None,
                     partition_by: Iterable[str] | None = None,
                     metadata: Mapping[str, str] | None = None,
                     description: str | None = None) -> int:
        """Commits the Parquet files Spark wrote under ``directory`` (from :meth:`staging`)
        as one append or overwrite of the table at ``path``; returns the rows committed.

        The commit records ``batch`` and ``metadata`` like :meth:`write`, and creates the
        table when there is none.  The files first move to where delta-rs puts its own (the
        table root, or the Hive-style partition directories such as ``_bucket=3/`` that give
        their partition values), because Spark reads a table through its file list with one
        base path (:func:`~incr.runtime.session.read_delta`) and refuses files at two depths.
        Each file's statistics come from its Parquet footer (:func:`_footer_stats`): delta-rs's
        MERGE and :meth:`reach` skip files by them.  Files without rows are dropped, and the
        directory goes, with Spark's ``_SUCCESS`` and ``.crc`` files.

        Args:
            path: the table.
            directory: the directory of :meth:`staging` Spark wrote the files into.
            mode: ``append`` or ``overwrite`` (the files replace every current file).
            batch: the batch to record in the commit (None: none).
            schema: the files' schema; None for the table's.  An overwrite with another
                schema replaces the table's; a new table is created with it.
            partition_by: the partition columns of a new table (an existing table keeps its
                own).
            metadata: custom commit metadata.
            description: the description of a new table.

        Raises:
            StorageError: naming the table: the directory is not a staging directory of it,
                holds something Spark would not write there, or delta-rs refused the commit.
        """
        if mode not in ("append", "overwrite"):
            raise ValueError(f"mode must be append or overwrite, not {mode!r}")
        root, staged = Path(path), Path(directory)
        if staged.parent != root or staged.name.startswith(("_", ".")):
            raise StorageError(f"{staged} is not a staging directory of the Delta table at {path}")
        exists = self.exists(root)
        partitions = self.partition_columns(root) if exists else tuple(partition_by or ())
        if schema is None:
            if not exists:
                raise StorageError(f"no Delta table at {path}, and no schema to create it with")
            schema = self.schema(root)
        try:
            actions, rows = _place(root, staged, partitions, schema)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        commit = _commit(batch, metadata)
        try:
            if exists:
                changes: list[AddAction | RemoveAction] = [*actions]
                self._enable_timestamp_ntz(root, schema)
                self.table(root).create_write_transaction(
                    changes, mode, schema, partition_by=list(partitions) or None,
                    commit_properties=commit)
            else:
                create_table_with_add_actions(
                    str(root), DeltaSchema.from_arrow(schema), actions, mode="error",
                    partition_by=list(partitions) or None, description=description,
                    configuration=TABLE_PROPERTIES, commit_properties=commit)
        except (DeltaError, OSError) as e:  # delta-rs raises OSError (no errno) on I/O
            # The moved files are referenced by no version, and a full vacuum deletes them;
            # not here: a commit that landed and failed after (say in its checkpoint) needs them.
            raise _failed(f"committing the files Spark wrote to the Delta table at {path}", path, e) from e
        return rows

    def enable_deletion_vectors(self, path: str | Path) -> None:
        """Gives the table the ``deletionVectors`` feature (reader 3, writer 7), once.

        A commit of its own before the first vector's: a crash in between leaves the same
        rows and no batch marker.  delta-rs still writes, merges and compacts the table (its
        rewrites apply the vectors); readers must support the feature, as Spark's Delta,
        delta-rs, DuckDB's delta extension and Trino do.
        """
        dt = self.table(path)
        if has_deletion_vectors(dt):
            return
        try:
            dt.alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
        except (DeltaError, OSError) as e:
            raise _failed(f"enabling deletion vectors on the Delta table at {path}", path, e) from e

    def ready_for_vectors(self, path: str | Path, keys: Iterable[str], every: bool = False) -> None:
        """Readies a table the next batches change by deletion vectors, while it is being
        written anyway (a load, a rewrite): the feature enabled, and its large files
        mirrored by the first of ``keys`` that is an integer column (by each of them,
        ``every``), so the first batch after it searches by key at once instead of
        writing the mirrors itself."""
        self.enable_deletion_vectors(path)
        schema = self.schema(path)
        integers = [k for k in dict.fromkeys(keys)
                    if k in schema.names and pa.types.is_integer(schema.field(k).type)]
        for key in integers if every else integers[:1]:
            self.mirror_files(path, key)

    def mirror_files(self, path: str | Path, key: str) -> int:
        """Writes the key mirror by ``key`` (an integer column) of every current file of
        ``mirror_rows`` to ``mirror_max_rows`` rows that has none
        (:func:`~incr.runtime.mirror.ensure`); returns how many files have one."""
        root = Path(path)
        return sum(mirror.ensure(root, name, add, key, self.mirror_rows, self.mirror_max_rows)
                   for name, add in self.live_adds(path).items())

    def matched_rows(self, path: str | Path, keys: pa.Table) -> dict[str, np.ndarray]:
        """The positions of the current live rows whose columns ``keys.column_names`` equal
        (NULL equal to NULL) those of a row of ``keys``, by the file's path in the table's log.

        When the last :meth:`read_matching` of the table, at this version, read every row
        ``keys`` may match (it matched on columns of ``keys``, each for all of the values
        ``keys`` has in it), those rows (kept with their positions) are all that is searched.
        Otherwise only the files and row groups whose statistics may hold the keys' values
        are read, and only their key columns, each column matched where the ones before it
        did (:func:`~incr.runtime.lookup.find`); the tuples are then matched exactly.
        """
        if not keys.num_rows:
            return {}
        dt = self.table(path)
        root = Path(path)
        schema = pa.schema(dt.schema().to_arrow())
        wanted = [lookup.Wanted(c, keys.column(c), schema.field(c).type) for c in keys.column_names]
        found = self._found_before(path, dt.version(), wanted)
        if found is None:
            found = lookup.find(root, self.live_adds(path), schema, wanted,
                                _VectorReader(dt, root), columns=keys.column_names, every=True,
                                mirror_rows=(self.mirror_rows, self.mirror_max_rows))
        if not found.rows.num_rows:
            return {}
        keep = np.ones(found.rows.num_rows, dtype=bool)
        for w in wanted:
            keep &= w.mask(found.rows.column(w.column))
        if keys.num_columns > 1 and keep.any():
            index = "incr_row__"
            while index in keys.column_names:
                index += "_"
            candidates = (lookup.plain(found.rows.select(keys.column_names))
                          .append_column(index, pa.array(np.arange(found.rows.num_rows)))
                          .filter(pa.array(keep)))
            quoted = ['"' + c.replace('"', '""') + '"' for c in keys.column_names]
            on = " AND ".join(f"f.{q} IS NOT DISTINCT FROM k.{q}" for q in quoted)
            con = _duckdb()
            try:
                con.register("incr_rows", candidates)
                con.register("incr_keys", lookup.plain(keys))
                hits = con.execute(f'SELECT f."{index}" FROM incr_rows AS f SEMI JOIN '
                                   f"incr_keys AS k ON {on}").fetch_arrow_table()
            finally:
                con.unregister("incr_rows")
                con.unregister("incr_keys")
            keep = np.zeros(found.rows.num_rows, dtype=bool)
            keep[hits.column(0).to_numpy()] = True
        return found.positions_by_file(keep)

    def _found_before(self, path: str | Path, version: int,
                      wanted: list[lookup.Wanted]) -> lookup.Found | None:
        """The rows the table's last :meth:`read_matching` found, when it read ``version``
        on columns among ``wanted``'s, each for (at least) all of its values there."""
        kept = self._found.get(str(path))
        if kept is None or kept[0] != version:
            return None
        now = {w.column: w for w in wanted}
        for before in kept[1]:
            w = now.get(before.column)
            if w is None or (w.has_null and not before.has_null):
                return None
            if len(w.values) and not pc.all(pc.is_in(w.values, value_set=before.values)).as_py():
                return None
        return kept[2]

    def replace_rows(self, path: str | Path, gone: pa.Table, rows: pa.Table, *,
                     batch: int) -> MergeMetrics:
        """Deletes the rows equal (NULL equal to NULL) to a row of ``gone`` on its columns and
        inserts ``rows``, in one commit by deletion vectors (:meth:`Merge.with_deletion_vectors`):
        the cost follows the rows, not the files they are in.  The one spelling of that MERGE
        for every table whose changed rows are replaced (state by ⊗=, a recursion's R)."""
        shape = nullable(self.schema(path)).append(pa.field(GONE, pa.bool_()))
        tombstones = gone.cast(pa.schema([shape.field(c) for c in gone.column_names]))
        source = pa.concat_tables([_with_flag(tombstones, shape, True),
                                   _with_flag(rows.select(shape.names[:-1]), shape, False)])
        return (self.merge(path, source).on_groups(tuple(gone.column_names), GONE)
                .when_matched_delete().when_not_matched_insert_all(f"NOT s.{merge_ident(GONE)}")
                .with_deletion_vectors().for_batch(batch).execute())

    def merge(self, path: str | Path, source: pa.Table) -> Merge:
        """Starts a MERGE of ``source`` (alias ``s``) into the table at ``path`` (alias ``t``)."""
        return Merge(self, Path(path), source)

    def compact(self, path: str | Path, sort_by: tuple[str, ...], max_files: int, *,
                metadata: Mapping[str, str] | None = None, vacuum: bool = True,
                target_file_size: int | None = None) -> bool:
        """Rewrites the table sorted by ``sort_by`` once it has more than ``max_files`` files.

        Merges add a file per touched bucket; compaction keeps reads cheap and restores the
        sort order within buckets.  The rewrite keeps every app transaction, so exactly-once
        bookkeeping survives it, and commits ``metadata`` (what readers of the newest
        commit's metadata expect to find).  ``vacuum`` then deletes the replaced files at
        once: right for state only incr reads, wrong for a table others may be reading.
        Returns True when it rewrote.
        """
        if self.file_count(path) <= max_files:
            return False
        dt = self.table(path)
        data = _rows(dt, path)
        if data.num_rows:
            data = data.sort_by([(c, "ascending") for c in sort_by])
        self.write(path, data, mode="overwrite", batch=None, metadata=metadata,
                   partition_by=dt.metadata().partition_columns or None,
                   target_file_size=target_file_size)
        if vacuum:
            self.vacuum_now(path)
        return True

    def compact_files(self, path: str | Path, sort_by: tuple[str, ...], max_files: int, *,
                      small_bytes: int = SMALL_FILE_BYTES, deleted_share: float = DELETED_SHARE,
                      deleted_rows: int = DELETED_ROWS) -> int:
        """Compacts a table with deletion vectors file by file; returns the files rewritten.

        In each partition holding more than ``max_files`` files, files smaller than
        ``small_bytes`` (a MERGE's new rows, mostly) are rewritten as one, sorted by
        ``sort_by``: the smallest of them, and each next larger one while it is at most
        twice the size of those before it together (:func:`_merged`), so a row is rewritten
        a few times on its way to a large file, not once per compaction.  Every file whose
        vector deletes at least ``deleted_share`` of its rows (and at least
        ``deleted_rows``) is rewritten without them.  The other files, and
        their vectors, stay: the cost follows the files that need it, never the whole
        table.  One commit (an OPTIMIZE: no rows change, no batch marker); the replaced
        files stay for readers still on them, until housekeeping.
        """
        dt = self.table(path)
        partitions = tuple(dt.metadata().partition_columns)
        adds = self.live_adds(path)
        by_partition: dict[tuple, list[str]] = {}
        for name, add in adds.items():
            values = add.get("partitionValues", {})
            by_partition.setdefault(tuple(values.get(c) for c in partitions), []).append(name)
        groups: list[list[str]] = []
        for names in by_partition.values():
            small = [n for n in names if adds[n]["size"] < small_bytes]
            merged = _merged(small, adds) if len(names) > max_files and len(small) > 1 else []
            if merged:
                groups.append(merged)
            for name in names:
                deleted = (adds[name].get("deletionVector") or {}).get("cardinality", 0)
                held = int(json.loads(adds[name].get("stats") or "{}").get("numRecords", 0))
                if (name not in merged and deleted >= max(deleted_rows, 1)
                        and (not held or deleted >= deleted_share * held)):
                    groups.append([name])
        if not groups:
            return 0
        try:
            self._rewrite_files(Path(path), dt, adds, groups, sort_by, mirrors=self.mirror_rows > 0)
        except OSError as e:  # a full disk: the files written are in no version
            raise StorageError(f"compacting {path} failed: {e}") from e
        return sum(len(g) for g in groups)

    @staticmethod
    def _rewrite_files(root: Path, dt: DeltaTable, adds: Mapping[str, Mapping[str, Any]],
                       groups: list[list[str]], sort_by: tuple[str, ...], *, mirrors: bool) -> None:
        """Rewrites each group of files as new files without their deleted rows (one commit),
        with key mirrors when ``mirrors`` and the table has them.  The groups (a bucket's
        small files, one each) are rewritten side by side (:func:`~incr.runtime.parallel.each`):
        reading, sorting and writing Parquet leave the GIL, and a compaction of every bucket
        of a few tables was the slowest step of the batch that ran it."""
        partitions = tuple(dt.metadata().partition_columns)
        schema = pa.schema(dt.schema().to_arrow())
        deleted_of = _VectorReader(dt, root)
        now = int(time.time() * 1000)

        def rewrite(names: list[str]) -> list[dict[str, Any]]:
            parts, removed = [], []
            for name in names:
                add = adds[name]
                # A file delta-rs wrote from string_view data reads back as string_view,
                # which Arrow cannot filter: plain strings.
                data = lookup.plain(pq.read_table(root / unquote(name)))
                if add.get("deletionVector") is not None:
                    gone = deleted_of(name, add)
                    keep = np.ones(data.num_rows, dtype=bool)
                    keep[gone[gone < data.num_rows]] = False
                    data = data.filter(pa.array(keep))
                for column, value in add.get("partitionValues", {}).items():
                    field = schema.field(column)
                    data = data.append_column(field, lookup.partition_column(
                        value, field.type, data.num_rows))
                parts.append(data.select(schema.names).cast(schema))
                removed.append(_remove(name, add, now, data_change=False))
            rows = pa.concat_tables(parts)
            if rows.num_rows and sort_by:
                rows = rows.sort_by([(c, "ascending") for c in sort_by])
            written = _write_files(root, rows, schema, partitions, mirrors)
            for add in written:
                add["add"]["dataChange"] = False
            return removed + written

        actions = [action for group in parallel.each(rewrite, groups) for action in group]
        info = {"timestamp": now, "operation": "OPTIMIZE", "clientVersion": "incr",
                "operationParameters": {"files": str(sum(len(g) for g in groups)),
                                        "deletionVectors": "purged"},
                "readVersion": dt.version()}
        try:
            _commit_by_hand(root, dt, [{"commitInfo": info}, *actions])
        except deltalog.LogConflict as e:
            raise StorageError(f"compacting {root} failed: another writer committed to it meanwhile "
                               f"({e}); nothing was committed, the next run compacts again") from e

    def file_count(self, path: str | Path) -> int:
        """Data files of the current version."""
        return len(self.table(path).file_uris())

    def vacuum_now(self, path: str | Path) -> None:
        """Deletes the files no longer in the current version, at once (no retention): for
        tables only incr reads, right after it rewrote them.  Their key mirrors go too."""
        self.table(path).vacuum(retention_hours=0, enforce_retention_duration=False,
                                dry_run=False)
        mirror.prune(Path(path))

    def remove(self, path: str | Path) -> None:
        """Deletes a table directory (used for state that a changed view no longer owns)."""
        shutil.rmtree(path, ignore_errors=True)
        self.forget(path)


class Merge:
    """A MERGE under construction; see :meth:`DeltaStore.merge`."""

    def __init__(self, store: DeltaStore, path: Path, source: pa.Table):
        self._store = store
        self._path = path
        self._source = source
        self._predicate: str | None = None
        self._delete = False
        self._delete_when: str | None = None
        self._updates: dict[str, str] | None = None
        self._update_all = False
        self._insert = False
        self._insert_when: str | None = None
        self._batch: int | None = None
        self._metadata: Mapping[str, str] | None = None
        self._flag: str | None = None
        self._columns: tuple[str, ...] = ()
        self._vectors = False

    def on(self, keys: tuple[str, ...], buckets: Iterable[int] | None = None) -> Merge:
        """Joins on the bucket and the null-safe key columns; ``buckets`` prunes partitions."""
        self._predicate = merge_condition(keys)
        if buckets is not None:
            listed = ", ".join(str(int(b)) for b in sorted(set(buckets)))
            self._predicate += f" AND (t.{BUCKET} IN ({listed}))"
        return self

    def on_groups(self, columns: tuple[str, ...], flag: str) -> Merge:
        """Joins each source row flagged ``flag`` (a tombstone) to every target row with
        null-safe equal ``columns``; unflagged source rows join nothing.  ``flag`` stays in
        the source beside the target's columns (see :mod:`incr.compiler.publish`)."""
        self._predicate = answer_merge_condition(columns, flag)
        self._flag = flag
        self._columns = columns
        return self

    def with_deletion_vectors(self) -> Merge:
        """Deletes matched rows by marking them in their files' deletion vectors instead of
        rewriting the files, and writes the inserted rows as one new file (see
        :mod:`~incr.runtime.deletion`): the cost follows the matched rows, not the files
        they are in.  Only for a MERGE of :meth:`on_groups` that deletes what its tombstones
        match and inserts the other source rows (an answer maintained by change); the
        table gets the ``deletionVectors`` feature."""
        self._vectors = True
        return self

    def when_matched_delete(self, predicate: str | None = None) -> Merge:
        """Deletes matched rows (those satisfying ``predicate``; evaluated before any update)."""
        self._delete = True
        self._delete_when = predicate
        return self

    def when_matched_update(self, updates: Mapping[str, str]) -> Merge:
        """Sets each column of matched rows to an SQL expression over ``t`` and ``s``."""
        self._updates = dict(updates)
        return self

    def when_matched_update_all(self) -> Merge:
        """Replaces matched rows by the source rows (the source holds the combined state)."""
        self._update_all = True
        return self

    def when_not_matched_insert_all(self, predicate: str | None = None) -> Merge:
        """Inserts source rows that match no target row (those satisfying ``predicate``)."""
        self._insert = True
        self._insert_when = predicate
        return self

    def for_batch(self, batch: int, metadata: Mapping[str, str] | None = None) -> Merge:
        """Records ``batch`` in the merge's commit (exactly-once marker)."""
        self._batch = batch
        self._metadata = metadata
        return self

    def execute(self) -> MergeMetrics:
        """Runs the MERGE; with an empty source, commits just the batch marker."""
        if self._predicate is None:
            raise ValueError("Merge.on(...) was not called")
        dt = self._store.table(self._path)
        target = pa.schema(dt.schema().to_arrow())
        names = target.names + ([self._flag] if self._flag else [])
        shape = target.append(pa.field(self._flag, pa.bool_())) if self._flag else target
        try:
            source = self._source.select(names).cast(shape)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise StorageError(f"h(ΔS) does not fit the state table at {self._path}: {e}; the "
                               f"view changed without a new state fingerprint") from e
        metrics = MergeMetrics(self._batch)
        if source.num_rows and self._vectors:
            try:
                metrics = self._execute_with_vectors(source, target)
            except OSError as e:  # a full disk, a read-only folder: nothing was committed
                raise StorageError(f"MERGE into {self._path} failed: {e}") from e
        elif source.num_rows:
            # The source is small and in memory: not streamed, delta-rs derives from its
            # key ranges which target files can match and leaves the others unread.
            builder = dt.merge(source, self._predicate, source_alias="s", target_alias="t",
                               streamed_exec=False,
                               commit_properties=_commit(self._batch, self._metadata))
            if self._delete:
                builder = builder.when_matched_delete(predicate=self._delete_when)
            if self._updates:
                builder = builder.when_matched_update(updates=self._updates)
            if self._update_all:
                builder = builder.when_matched_update_all()
            if self._insert and self._flag:  # the flag is no target column: name them
                builder = builder.when_not_matched_insert(
                    updates={merge_ident(c): f"s.{merge_ident(c)}" for c in target.names},
                    predicate=self._insert_when)
            elif self._insert:
                builder = builder.when_not_matched_insert_all(predicate=self._insert_when)
            try:
                raw = builder.execute()
            except (DeltaError, OSError) as e:  # delta-rs raises OSError (no errno) on I/O
                if "Arithmetic overflow" in str(e):  # a combined sum left its 128 bits
                    raise OutOfRangeError(f"a value combined by the MERGE into {self._path} does not "
                                          f"fit its column ({str(e).splitlines()[0]})") from e
                raise _failed(f"MERGE into {self._path}", self._path, e) from e
            metrics = MergeMetrics(
                self._batch, raw.get("num_source_rows", 0), raw.get("num_target_rows_inserted", 0),
                raw.get("num_target_rows_updated", 0), raw.get("num_target_rows_deleted", 0),
                raw.get("num_target_files_added", 0), raw.get("num_target_files_removed", 0), raw)
        if self._batch is not None and self._store.batch_version(self._path) != self._batch:
            # Nothing changed (empty batch, or a merge that touched no row): the batch is
            # still applied, so its marker must be committed.
            self._store.write(self._path, target.empty_table(), mode="append", batch=self._batch,
                              metadata=self._metadata)
        return metrics

    def _execute_with_vectors(self, source: pa.Table, target: pa.Schema) -> MergeMetrics:
        """:meth:`execute` by deletion vectors: one commit that puts the tombstones' matches
        in the vectors of the files holding them and adds the inserted rows' files (one per
        partition).

        The partition columns are left out of the match: incr partitions by ``_bucket``,
        which the key columns determine, so equal keys are in the same partition.
        """
        if not (self._flag and self._delete and self._delete_when is None and self._insert
                and not self._updates and not self._update_all):
            raise ValueError("a MERGE with deletion vectors deletes the rows on_groups() matches "
                             "and inserts the rest; nothing else")
        store, root = self._store, self._path
        store.enable_deletion_vectors(root)
        dt = store.table(root)
        partitions = tuple(dt.metadata().partition_columns)
        flagged = pc.fill_null(source.column(self._flag), False)
        gone = source.filter(flagged).select([c for c in self._columns if c not in partitions])
        if not gone.column_names:
            raise ValueError("a MERGE with deletion vectors matches on a column besides the "
                             "partition columns")
        rows = source.filter(pc.invert(flagged)).select(target.names)
        adds = store.live_adds(root)
        matched = store.matched_rows(root, gone)
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = []
        deleted = 0
        deleted_of = _VectorReader(dt, root)
        for name, found in matched.items():
            old = adds[name]
            before = deleted_of(name, old)
            after = np.sort(np.concatenate([before, found]), kind="stable")  # two sorted runs
            after = after[np.r_[True, after[1:] != after[:-1]]] if len(after) else after
            if len(after) == len(before):
                continue
            deleted += len(after) - len(before)
            stats = json.loads(old.get("stats") or "{}")
            stats["tightBounds"] = False
            values = old.get("partitionValues", {})
            actions.append(_remove(name, old, now, data_change=True))
            actions.append({"add": {"path": name, "partitionValues": values, "size": old["size"],
                                    "modificationTime": old["modificationTime"], "dataChange": True,
                                    "stats": json.dumps(stats), "deletionVector": deletion.inline(after)}})
        files_removed = len(actions) // 2
        actions += _write_files(root, rows, target, partitions, store.mirror_rows > 0)
        info: dict[str, Any] = {"timestamp": now, "operation": "MERGE",
                                "operationParameters": {"mergePredicate": self._predicate,
                                                        "deletionVectors": "inline"},
                                "readVersion": dt.version(), "clientVersion": "incr",
                                **dict(self._metadata or {})}
        head: list[dict[str, Any]] = [{"commitInfo": info}]
        if self._batch is not None:
            head.append({"txn": {"appId": APP_ID, "version": self._batch, "lastUpdated": now}})
        try:
            _commit_by_hand(root, dt, head + actions)
        except deltalog.LogConflict as e:
            raise StorageError(f"MERGE into {root} failed: another writer committed to it meanwhile "
                               f"({e}). Nothing of this write was committed; run again once that "
                               f"writer is done, and let no job but incr write incr's tables") from e
        added = len(actions) - 2 * files_removed
        return MergeMetrics(self._batch, source.num_rows, rows.num_rows, 0, deleted, added,
                            files_removed,
                            {"deletion_vectors": files_removed, "num_target_rows_deleted": deleted})


class _VectorReader:
    """The rows a file's deletion vector deletes (ascending positions), from its ``add``
    action: decoded here when inline (incr's), else as delta-rs reads the table (another
    writer's, in a file)."""

    def __init__(self, dt: DeltaTable, root: Path):
        self._dt, self._root = dt, root.resolve()  # delta-rs names files by absolute path
        self._foreign: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()  # files are rewritten side by side: read them once

    def __call__(self, name: str, add: Mapping[str, Any]) -> np.ndarray:
        vector = add.get("deletionVector")
        if vector is None:
            return np.array([], dtype=np.int64)
        if vector.get("storageType") == deletion.INLINE:
            return deletion.positions_of(vector)
        with self._lock:
            if self._foreign is None:
                self._foreign = deleted_positions(self._dt)
        return self._foreign.get(str(self._root / unquote(name)), np.array([], dtype=np.int64))


def _with_flag(rows: pa.Table, shape: pa.Schema, flag: bool) -> pa.Table:
    """``rows`` in ``shape`` (missing columns NULL) with the flag column set to ``flag``."""
    columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names and f.name != GONE
               else pa.nulls(rows.num_rows, f.type) for f in shape]
    columns[shape.get_field_index(GONE)] = pa.array([flag] * rows.num_rows, pa.bool_())
    return pa.table(columns, schema=shape)


def _remove(name: str, add: Mapping[str, Any], now: int, *, data_change: bool) -> dict[str, Any]:
    """The ``remove`` action of the file the log last added as ``add``: its path and its
    deletion vector, if any (the protocol names a file with a vector by both)."""
    action = {"path": name, "deletionTimestamp": now, "dataChange": data_change,
              "extendedFileMetadata": True, "partitionValues": add.get("partitionValues", {}),
              "size": add["size"]}
    if add.get("deletionVector") is not None:
        action["deletionVector"] = add["deletionVector"]
    return {"remove": action}


def _merged(small: list[str], adds: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Which of a partition's small files a compaction merges: the smallest, then each next
    larger one while it is at most twice the size of those taken together; none when that
    is one file (the next batches' files will join it).

    Merging every small file each time rewrote a partition's newest large-ish file with
    every batch's few new rows until it passed the small-file size: at 5M rows, 0.8 s of
    every other batch.  Taken this way, sizes double from one merge to the next, like a
    binary counter's digits, and a row is rewritten about log2(small size / batch size)
    times in all.
    """
    ordered = sorted(small, key=lambda n: (adds[n]["size"], n))
    taken, total = ordered[:1], adds[ordered[0]]["size"] if ordered else 0
    for name in ordered[1:]:
        if adds[name]["size"] > 2 * total:
            break
        taken.append(name)
        total += adds[name]["size"]
    return sorted(taken) if len(taken) > 1 else []


def _write_files(root: Path, rows: pa.Table, schema: pa.Schema, partitions: tuple[str, ...],
                 mirrors: bool = False) -> list[dict[str, Any]]:
    """Writes ``rows`` into the table at ``root`` as one Parquet file per partition (in its
    ``column=value`` directory, without the partition columns, as delta-rs lays them out);
    returns their ``add`` actions, which no commit names yet (the files are written side
    by side: :func:`~incr.runtime.parallel.each`).  With ``mirrors``, each file
    gets the key mirrors the table's files have (:func:`~incr.runtime.mirror.keys_for_new_files`)."""
    if not rows.num_rows:
        return []
    groups: list[tuple[dict[str, str | None], pa.Table]] = [({}, rows)]
    if partitions:
        keys = rows.select(list(partitions)).group_by(list(partitions)).aggregate([]).to_pylist()
        groups = []
        for key in keys:
            mask = None
            for column, value in key.items():
                term = (pc.is_null(rows.column(column)) if value is None
                        else pc.equal(rows.column(column), pa.scalar(value, rows.schema.field(column).type)))
                mask = term if mask is None else pc.and_(mask, term)
            groups.append(({c: None if v is None else str(v) for c, v in key.items()},
                           rows.filter(mask).drop_columns(list(partitions))))
    data_schema = pa.schema([f for f in schema if f.name not in partitions])
    keys = mirror.keys_for_new_files(root, data_schema) if mirrors else []
    dictionary = _dictionary_columns(data_schema)

    def write(group: tuple[dict[str, str | None], pa.Table]) -> dict[str, Any]:
        values, part = group
        folder = "/".join(f"{c}={_HIVE_NULL if v is None else quote(v, safe='')}"
                          for c, v in values.items())
        name = (f"{folder}/" if folder else "") + f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        stored = part.select(data_schema.names).cast(data_schema)
        footer: list[pq.FileMetaData] = []
        pq.write_table(stored, root / name, compression="snappy", use_dictionary=dictionary,
                       metadata_collector=footer)
        plain = lookup.plain(stored) if keys else stored
        st = (root / name).stat()
        for key in keys:
            mirror.write_rows(root, name, st.st_size, plain, key)
        return {"add": {"path": name, "partitionValues": values, "size": st.st_size,
                        "modificationTime": st.st_mtime_ns // 1_000_000, "dataChange": True,
                        "stats": _footer_stats(footer[0], data_schema)}}

    return parallel.each(write, groups)


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns of a file incr writes that are dictionary-encoded: text and bytes, whose
    values repeat (a group's name).  A state table's numbers (its keys, counts and sums)
    hardly do, and encoding them was half the time of writing a batch's files."""
    return [f.name for f in schema
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)
            or pa.types.is_string_view(f.type) or pa.types.is_binary_view(f.type)]


def commit_batches(path: Path, first: int, last: int) -> Iterator[tuple[int, int]]:
    """``(version, batch)`` of the commits ``first`` to ``last`` that name a batch.

    Read from the commit files of the Delta table at ``path``, not through delta-rs's
    ``DeltaTable.history``: that lists the newest commits in the log and numbers them down
    from the version the table object has loaded, so a commit landing between loading and
    listing (a run applying batches while a reader looks for a batch's version) gets the number of the one
    before it.  A commit file is written once and never changes; one the log's cleanup
    removed is passed over (its version can no longer be served anyway).
    """
    log = Path(path) / "_delta_log"
    for version in range(first, last + 1):
        try:
            lines = (log / f"{version:020d}.json").read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            if '"commitInfo"' not in line:
                continue
            info = json.loads(line).get("commitInfo") or {}
            if BATCH_KEY in info:
                yield version, int(info[BATCH_KEY])
            break


def trusted_commits(commits: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``(version, batch)`` commits of an answer that show the answer as of their batch.

    Batches reach a view in order, so its commits name non-decreasing batches (a
    compaction names the batch of the version it rewrote).  A commit naming an earlier
    batch than one before it is a republish after the answer query changed: computed from
    the current state, it does not show the answer as of the batch it names, and is left
    out.  The versions before it stay: they are what the program answered at the time.

    Args:
        commits: ``(version, batch)`` pairs in any order.

    Returns:
        The trusted pairs, by version (their batches non-decreasing).
    """
    out: list[tuple[int, int]] = []
    high = -1
    for version, batch in sorted(commits):
        if batch >= high:
            out.append((version, batch))
            high = batch
    return out


def _dataset(dt: DeltaTable, path: str | Path,
             partitions: list[tuple[str, str, list[str]]] | None = None) -> Any:
    """The table's files (of ``partitions``) as an Arrow dataset.

    A local table is read through Arrow's own filesystem.  delta-rs's default (a Python
    filesystem over its Rust object store, called from Arrow's I/O threads) left threads
    running at interpreter exit: about one process in six that read a table aborted as it
    exited (``terminate called without an active exception``, exit 134) after finishing its
    work, ``incr answer`` among them.
    """
    location = str(path)
    filesystem = None
    if "://" not in location:
        filesystem = pa_fs.SubTreeFileSystem(str(Path(location).resolve()), pa_fs.LocalFileSystem())
    return dt.to_pyarrow_dataset(partitions=partitions, filesystem=filesystem)


def has_deletion_vectors(dt: DeltaTable) -> bool:
    """Whether the table may hold deletion vectors (its protocol has the feature)."""
    return DELETION_VECTORS in (dt.protocol().reader_features or [])


def _rows(dt: DeltaTable, path: str | Path,
          partitions: list[tuple[str, str, list[str]]] | None = None,
          columns: list[str] | None = None, where: Any = None, pushdown: bool = True) -> pa.Table:
    """The rows of the table's (loaded) version, of ``partitions``, ``columns`` and the
    rows ``where`` (an Arrow expression) holds.

    A table that may hold deletion vectors is read by delta-rs's own engine, which applies
    them; any other through Arrow's dataset (:func:`_dataset`), which is faster.  ``where``
    is pushed down to Arrow's scan (row groups its statistics exclude are skipped) unless
    ``pushdown`` is False (see :meth:`DeltaStore.read_matching`); then it is applied batch
    by batch as they are read, so memory follows the rows kept either way.
    """
    schema = pa.schema(dt.schema().to_arrow())
    if not has_deletion_vectors(dt):
        dataset = _dataset(dt, path, partitions)
        if where is None or pushdown:
            return dataset.to_table(columns=columns, filter=where)
        batches: Iterable[pa.RecordBatch] = dataset.to_batches()
    else:
        predicate = None
        if partitions:
            (column, _, values), = partitions
            predicate = f"{merge_ident(column)} IN ({', '.join(str(int(v)) for v in values)})"
        batches = pa.RecordBatchReader.from_stream(dt.scan(predicate=predicate))
    kept = []
    try:
        for batch in batches:
            part = pa.Table.from_batches([batch]).select(schema.names).cast(schema)
            kept.append(part.filter(where) if where is not None else part)
    except pa.ArrowInvalid as e:  # delta-rs's scan: a file of the version is gone (vacuumed)
        if "not found" in str(e):
            raise FileNotFoundError(f"a file of the Delta table at {path} is gone: {e}") from e
        raise
    data = pa.concat_tables(kept) if kept else schema.empty_table()
    return data.select(columns) if columns is not None else data


def deleted_positions(dt: DeltaTable) -> dict[str, np.ndarray]:
    """The rows each file's deletion vector deletes (positions from 0), by the file's path as
    ``file_uris`` gives it; files without a vector are absent."""
    if not has_deletion_vectors(dt):
        return {}
    vectors = pa.table(dt.deletion_vectors())
    out = {}
    for uri, keep in zip(vectors.column("filepath").to_pylist(),
                         vectors.column("selection_vector").combine_chunks(), strict=True):
        mask = keep.values.to_numpy(zero_copy_only=False)
        out[_file_path(uri)] = np.flatnonzero(~mask).astype(np.int64)
    return out


#: Characters delta-rs cannot open a local table under (it reads the path as a URL's host);
#: a ``%`` and two hex digits it decodes as an escape.
_UNOPENABLE = set("[]^|\\")
_local = threading.local()


def _duckdb() -> Any:
    """This thread's DuckDB connection, on which :meth:`DeltaStore.matched_rows` joins keys:
    kept, as opening one costs 10 ms; a forked process opens its own."""
    import duckdb

    kept = getattr(_local, "duckdb", None)
    if kept is None or kept[0] != os.getpid():
        kept = _local.duckdb = (os.getpid(), duckdb.connect())
    return kept[1]


def check_table_root(path: Path) -> None:
    """Refuses a folder Delta tables cannot be kept under, before anything is written there.

    Raises:
        StorageError: the absolute path holds a character delta-rs rejects.
    """
    text = str(Path(path).absolute())
    bad = [repr(c) for c in sorted(set(text) & _UNOPENABLE)]
    bad += [repr(e) for e in sorted(set(re.findall(r"%[0-9A-Fa-f]{2}", text)))]
    if bad:
        raise StorageError(f"the warehouse folder {path} holds {' '.join(bad)}, which delta-rs "
                           f"cannot open Delta tables under (it reads a %XX as an escaped "
                           f"character); use a folder without them")


def table_files(dt: DeltaTable, partitions: list[tuple[str, str, Any]] | None = None) -> list[str]:
    """The table's files (of ``partitions``, delta-rs filters), a local one by its plain path.

    ``DeltaTable.file_uris`` spells a local file percent-encoded (``/tmp/a%20b/part-0``),
    which Spark's reader looks for as written; the deletion vectors' keys and the serving
    links are plain paths too.
    """
    return [_file_path(uri) for uri in dt.file_uris(partitions)]


def _file_path(uri: str) -> str:
    """A file of a Delta table as a plain path when it is local, else its URI as given.

    delta-rs names a local file by a ``file://`` URI (deletion vectors) or by a
    percent-encoded path (``file_uris``); a remote one (``s3://...``) keeps its URI.
    """
    if uri.startswith("file://"):
        return unquote(uri[len("file://"):])
    return uri if "://" in uri else unquote(uri)


def _bucket_filter(partitions: tuple[str, ...],
                   buckets: Iterable[int] | None) -> list[tuple[str, str, list[str]]] | None:
    """delta-rs's partition filter for ``buckets`` (None: every file; [] means no bucket)."""
    if buckets is None or BUCKET not in partitions:
        return None
    listed = sorted({int(b) for b in buckets})
    return [(BUCKET, "in", [str(b) for b in listed])] if listed else []


def _place(root: Path, staged: Path, partitions: tuple[str, ...],
           schema: pa.Schema) -> tuple[list[AddAction], int]:
    """Moves the data files under ``staged`` to the same place in the table and returns
    their add actions and row count (files without rows are left to be removed)."""
    actions: list[AddAction] = []
    rows = 0
    for source, values in _staged_files(root, staged, partitions):
        footer = pq.read_metadata(source)
        if not footer.num_rows:
            continue
        relative = source.relative_to(staged)
        target = root / relative
        if target.exists():
            raise StorageError(f"Spark wrote {relative} for the Delta table at {root}, which "
                               f"already holds a file of that name")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)
        st = target.stat()
        actions.append(AddAction(relative.as_posix(), st.st_size, values,
                                 st.st_mtime_ns // 1_000_000, True,
                                 _footer_stats(footer, schema)))
        rows += footer.num_rows
    return actions, rows


def _staged_files(root: Path, staged: Path,
                  partitions: tuple[str, ...]) -> list[tuple[Path, dict[str, str | None]]]:
    """The data files Spark wrote under ``staged`` with their partition values, read from
    the ``column=value`` directories (one level per partition column, in order).

    Spark's bookkeeping (``_SUCCESS``, ``_temporary``, ``.crc`` files) is passed over;
    anything else is refused rather than committed or lost.
    """
    found: list[tuple[Path, dict[str, str | None]]] = []

    def walk(folder: Path, values: dict[str, str | None]) -> None:
        depth = len(values)
        for entry in sorted(folder.iterdir()):
            if (entry.is_dir() and depth < len(partitions)
                    and entry.name.startswith(f"{partitions[depth]}=")):
                raw = entry.name.partition("=")[2]
                walk(entry, {**values, partitions[depth]: None if raw == _HIVE_NULL else unquote(raw)})
            elif entry.name.startswith(("_", ".")):
                continue
            elif entry.is_file() and depth == len(partitions) and entry.name.endswith(".parquet"):
                name = entry.relative_to(staged).as_posix()
                if quote(name, safe="/=") != name:
                    raise StorageError(f"Spark wrote {entry} for the Delta table at {root}, a path "
                                       f"the Delta log would have to escape")
                found.append((entry, values))
            else:
                raise StorageError(f"unexpected {entry} among the files Spark wrote for the "
                                   f"Delta table at {root} (partitioned by "
                                   f"{', '.join(partitions) or 'nothing'})")

    walk(staged, {})
    return found


def _exact_bounds(t: pa.DataType) -> bool:
    """Whether a Parquet footer's min/max of type ``t`` are exact and Delta spells them as
    plain JSON values: integers, strings, booleans and dates.  Floats (NaN is no bound),
    decimals and timestamps (formats and units to get right) are left out."""
    return bool(pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_string_view(t) or pa.types.is_boolean(t) or pa.types.is_date32(t))


def _bound(value: Any, t: pa.DataType) -> Any:
    """A footer bound as Delta statistics spell it; None when it is not the expected kind."""
    if pa.types.is_boolean(t):
        return value if isinstance(value, bool) else None
    if pa.types.is_integer(t):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if pa.types.is_date32(t):
        return value.isoformat() if isinstance(value, date) else None
    return value if isinstance(value, str) else None


def _footer_stats(footer: pq.FileMetaData, schema: pa.Schema) -> str:
    """Delta statistics (JSON) of a Parquet file from its footer.

    ``numRecords`` always; ``nullCount`` of each top-level column every row group counts
    the NULLs of; ``minValues``/``maxValues`` of the columns of :func:`_exact_bounds` types
    that every row group bounds (a row group of NULLs only needs no bound).  Anything less
    certain is left out: a file without a bound is merely read, a wrong bound would make a
    MERGE or :meth:`DeltaStore.reach` pass over rows it should see.
    """
    leaves: dict[str, int] = {}
    for j in range(footer.num_columns):
        leaf = footer.schema.column(j)
        if leaf.path == leaf.name and leaf.max_repetition_level == 0:
            leaves[leaf.name] = j
    groups = [footer.row_group(g) for g in range(footer.num_row_groups)]
    nulls: dict[str, int] = {}
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    for column in schema:
        i = leaves.get(column.name)
        if i is None or not groups:  # a partition column (not in the file), or nested
            continue
        cells = [(g.num_rows, g.column(i).statistics) for g in groups]
        if any(c is None for _, c in cells):
            continue
        if all(c.has_null_count for _, c in cells):
            nulls[column.name] = sum(c.null_count for _, c in cells)
        if not _exact_bounds(column.type):
            continue
        bounded = [c for n, c in cells if c.has_min_max]
        unbounded = [(n, c) for n, c in cells if not c.has_min_max]
        if not bounded or any(not c.has_null_count or c.null_count != n for n, c in unbounded):
            continue
        low = [_bound(c.min, column.type) for c in bounded]
        high = [_bound(c.max, column.type) for c in bounded]
        if None in low or None in high:
            continue
        lows[column.name], highs[column.name] = min(low), max(high)
    stats: dict[str, Any] = {"numRecords": footer.num_rows}
    if lows:
        stats["minValues"], stats["maxValues"] = lows, highs
    if nulls:
        stats["nullCount"] = nulls
    return json.dumps(stats)


def _commit_by_hand(root: Path, dt: DeltaTable, actions: list[dict[str, Any]]) -> None:
    """Commits ``actions`` as the version after ``dt``'s, then writes a checkpoint when one
    is due (:func:`~incr.runtime.deltalog.checkpoint_due`), as delta-rs's writers do.

    The commit stands if its checkpoint fails (a full disk, say): a checkpoint only
    shortens the log replay, so a warning says so and the next due one (or housekeeping)
    writes it.

    Raises:
        deltalog.LogConflict: another writer committed that version first.
    """
    version = dt.version() + 1
    deltalog.commit(root, version, actions)
    if deltalog.checkpoint_due(version, dt.metadata().configuration):
        try:
            DeltaTable(str(root)).create_checkpoint()
        except (DeltaError, OSError) as e:
            log.warning("the checkpoint of %s at version %d failed (%s); the commit stands, "
                        "and the next checkpoint covers it", root, version, e)


#: How many row counts (:meth:`DeltaStore.row_count`) a store keeps before it forgets them all.
_COUNTS_KEPT = 4096


def _commit_stamp(root: str, version: int) -> tuple[int, int] | None:
    """Size and mtime of a table's commit file ``version`` (None: not a local file)."""
    try:
        st = os.stat(os.path.join(root, "_delta_log", f"{version:020d}.json"))
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _has_commit(root: str, version: int) -> bool:
    """Whether the local table at ``root`` has a commit file ``version``."""
    return os.path.exists(os.path.join(root, "_delta_log", f"{version:020d}.json"))


def _failed(what: str, path: str | Path, e: DeltaError | OSError) -> StorageError:
    """The error for a write delta-rs refused; a commit conflict says what to do about it.

    A conflict means another writer committed to the table since this write read it: only
    incr's own runs write its tables (and they lock each other out), so it is an outside
    job (an OPTIMIZE, a schema change, a stray append).  Nothing of this write was
    committed, so the next run redoes it from the table as it is then.
    """
    if isinstance(e, CommitFailedError):
        return StorageError(f"{what} failed: another writer committed to {path} meanwhile (Delta "
                            f"commit conflict: {str(e).splitlines()[0]}). Nothing of this write was "
                            f"committed; run again once that writer is done, and let no job but incr "
                            f"write incr's tables")
    return StorageError(f"{what} failed: {e}")


def _commit(batch: int | None, metadata: Mapping[str, str] | None) -> CommitProperties:
    txns = [Transaction(APP_ID, batch)] if batch is not None else None
    return CommitProperties(app_transactions=txns, custom_metadata=dict(metadata or {}) or None)

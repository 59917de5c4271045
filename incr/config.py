"""Every tunable of incr and the environment variable that sets it, in one place.

Modules take their limits from a :class:`Settings` (passed in, or :func:`settings` for the
process's environment) instead of reading ``os.environ`` themselves, so one table below is
the whole list an operator can turn, and a test can build a ``Settings`` without touching
the environment.

| variable                | default   | what it sets                                                      |
|-------------------------|-----------|-------------------------------------------------------------------|
| INCR_LANDING            | (none)    | the landing folder (or object store URI) of CLI commands and DAGs |
| INCR_WAREHOUSE          | (none)    | the warehouse folder (or ``s3://`` URI) of CLI commands and DAGs  |
| INCR_WORKING_COPIES     | ~/.cache/incr/warehouses | where a bucket warehouse's local working copies live |
| INCR_LEASE_TTL_S        | 60        | seconds a bucket warehouse's lock lease lasts unless renewed     |
| INCR_LOCAL_ROWS         | 200000    | largest batch the driver-side engine may take (0: Spark only)     |
| INCR_LOCAL_STATE_ROWS   | 1000000   | largest state/side table the driver-side engine reads             |
|                         |           | (and answer it computes from the files of a larger state)         |
| INCR_LOCAL_INDEX_ROWS   | 5000000   | largest row index the driver checks deletes against               |
| INCR_GROUP_BATCHES      | 1         | fold pending driver-sized batches of different sources as one step |
| INCR_ANSWER_BY_CHANGE   | 1         | 0: rewrite every answer whole, even where it could follow by change |
| INCR_ANSWER_MERGE_REACH | 0.5       | MERGE a per-group answer while its touched files hold ≤ this share |
|                         |           | (when it is MERGEd without deletion vectors)                      |
| INCR_ANSWER_DELETION_VECTORS | 1    | 0: a per-group answer's MERGE rewrites every file it touches      |
| INCR_ANSWER_REWRITE_ROWS | 50000    | a per-group answer over a state of at most this many rows is      |
|                         |           | rewritten, not MERGEd by change (0: always by change)             |
| INCR_STATE_DELETION_VECTORS | 1     | 0: a state MERGE rewrites every file it touches (copy on write)   |
|                         |           | (not a side table's that has vectors: see ViewState.vectors)      |
| INCR_STATE_VECTOR_ROWS  | 1000000   | ... which it does anyway for a state table of at most this many rows |
| INCR_MIRROR_ROWS        | 65536     | a file of a table with vectors this large is searched by key in a |
|                         |           | sorted, memory-mapped copy kept beside it (0: none)               |
| INCR_DRIVER_THREADS     | 0         | threads the driver spreads a search or write of many files over, |
|                         |           | and the writes of a stage's state tables; it runs a batch's row   |
|                         |           | index on one beside the fold (0: the cores, at most 4; 1: none)   |
| INCR_SLICE_BYTES        | 0         | a Parquet insert file larger than this (uncompressed) applies in  |
|                         |           | slices of row groups, a batch each (0: a quarter of Spark's memory) |
| INCR_SPARK_MASTER       | local[2]  | Spark master URL                                                  |
| INCR_SPARK_CONF         | (none)    | extra Spark settings, ``key=value,key=value``                     |
| INCR_LOCK_WAIT_S        | 30        | seconds a task waits for a short shared lock (the ledger's)       |
| INCR_LOG_LEVEL          | WARNING   | level of the ``incr`` loggers on the CLI (``-v`` sets INFO)       |
| INCR_SERVE_HOST         | 127.0.0.1 | address ``incr serve`` listens on (its ``--host``)                |
| INCR_SERVE_PORT         | 10000     | HiveServer2 port of ``incr serve`` (its ``--port``)               |
| INCR_SERVE_KEEP         | 5         | recent snapshots ``incr serve`` keeps pinnable (its ``--keep``)   |
| INCR_SERVE_POLL_S       | 2.0       | seconds between ``incr serve``'s refreshes (its ``--poll``)       |
| INCR_KEEP_BATCHES       | 100       | housekeeping keeps the answer versions of this many last batches  |
| INCR_KEEP_HOURS         | 168       | ... and every answer version of this many last hours (time travel) |
| INCR_MAINTAIN_EVERY_H   | 24        | hours between two housekeepings a DAG run does (``incr maintain``) |
| INCR_RETRIES            | 2         | how often Airflow retries a failed or killed task of a DAG        |
| INCR_RETRY_DELAY_S      | 30        | seconds Airflow waits before retrying it                          |
| INCR_CRASH_AT           | (none)    | tests only: kill the process at a named point (:mod:`faults`)     |
| INCR_PAUSE_AT           | (none)    | tests only: ``point:file``, wait at a point until the file exists |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

#: Merges add a file per touched bucket; a state table is rewritten sorted once it holds
#: more than this many files per bucket (of its own bucket count).
COMPACT_FILES_PER_BUCKET = 4
#: An answer maintained by change is rewritten sorted once its MERGEs left this many files.
ANSWER_COMPACT_FILES = 32
#: A table with deletion vectors is compacted file by file: in a partition with too many
#: files (for an answer: ANSWER_COMPACT_FILES), those smaller than SMALL_FILE_BYTES are
#: rewritten as one; a file whose vector deletes DELETED_SHARE of its rows, and at least
#: DELETED_ROWS (fewer cost a reader little), is rewritten without them; the other files
#: stay as they are.
DELETED_SHARE = 0.25
DELETED_ROWS = 10_000
SMALL_FILE_BYTES = 4 * 1024 * 1024
#: Answer files are written at about this size (sorted by key), so a MERGE of a few groups
#: rewrites a few files, not the whole answer.
ANSWER_TARGET_FILE_BYTES = 8 * 1024 * 1024
#: Whole tables a run keeps once read, for the next read of the same version (the views
#: sharing a state read its tables alike): at most this many rows in all.
READ_CACHE_ROWS = 1_000_000
#: Every Delta table incr creates checkpoints its log every this many commits (its
#: ``delta.checkpointInterval``; tables made before get it at their next housekeeping).
#: Opening a table replays the commits since its last checkpoint, and a batch opens each of
#: its tables a few times: at delta-rs's default of 100, one view's time per batch of 1,000
#: rows climbed from 0.17 s to 0.30 s over 100 batches; at 10 it stayed at 0.15-0.18 s.
#: (Delta Lake on Spark checkpoints every 10 commits too.)
CHECKPOINT_INTERVAL = 10
#: The row index's log of +/- counts is folded once it holds more files than this.
ROW_INDEX_COMPACT_FILES = 32
#: The ledger's event log is folded once it holds more files than this.
LEDGER_COMPACT_FILES = 64
#: How many offending rows a rejected delete batch names.
SHOW_BAD_ROWS = 3
#: ``incr serve`` deletes an answer version's folder once no served database has shown it
#: for this many seconds, so a query planned over its files before finishes reading them.
SERVE_GRACE_S = 600.0


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


@dataclass(frozen=True)
class Settings:
    """The tunables of one process (see the module's table for the variables)."""

    landing: str | None = field(default=None, metadata={"env": "INCR_LANDING"})
    warehouse: str | None = field(default=None, metadata={"env": "INCR_WAREHOUSE"})
    working_copies: str | None = field(default=None, metadata={"env": "INCR_WORKING_COPIES"})
    lease_ttl_s: float = field(default=60.0, metadata={"env": "INCR_LEASE_TTL_S"})
    local_rows: int = field(default=200_000, metadata={"env": "INCR_LOCAL_ROWS"})
    local_state_rows: int = field(default=1_000_000, metadata={"env": "INCR_LOCAL_STATE_ROWS"})
    local_index_rows: int = field(default=5_000_000, metadata={"env": "INCR_LOCAL_INDEX_ROWS"})
    group_batches: bool = field(default=True, metadata={"env": "INCR_GROUP_BATCHES"})
    answer_by_change: bool = field(default=True, metadata={"env": "INCR_ANSWER_BY_CHANGE"})
    answer_merge_reach: float = field(default=0.5, metadata={"env": "INCR_ANSWER_MERGE_REACH"})
    answer_deletion_vectors: bool = field(default=True,
                                          metadata={"env": "INCR_ANSWER_DELETION_VECTORS"})
    answer_rewrite_rows: int = field(default=50_000, metadata={"env": "INCR_ANSWER_REWRITE_ROWS"})
    state_deletion_vectors: bool = field(default=True,
                                         metadata={"env": "INCR_STATE_DELETION_VECTORS"})
    state_vector_rows: int = field(default=1_000_000, metadata={"env": "INCR_STATE_VECTOR_ROWS"})
    mirror_rows: int = field(default=65_536, metadata={"env": "INCR_MIRROR_ROWS"})
    driver_threads: int = field(default=0, metadata={"env": "INCR_DRIVER_THREADS"})
    slice_bytes: int = field(default=0, metadata={"env": "INCR_SLICE_BYTES"})
    spark_master: str = field(default="local[2]", metadata={"env": "INCR_SPARK_MASTER"})
    spark_conf: str = field(default="", metadata={"env": "INCR_SPARK_CONF"})
    lock_wait_s: float = field(default=30.0, metadata={"env": "INCR_LOCK_WAIT_S"})
    #: How long a view's task waits for another view folding the state they share (its
    #: fold may take as long as a batch does).
    shared_wait_s: float = field(default=3600.0, metadata={"env": "INCR_SHARED_WAIT_S"})
    log_level: str = field(default="WARNING", metadata={"env": "INCR_LOG_LEVEL"})
    serve_host: str = field(default="127.0.0.1", metadata={"env": "INCR_SERVE_HOST"})
    serve_port: int = field(default=10000, metadata={"env": "INCR_SERVE_PORT"})
    serve_keep: int = field(default=5, metadata={"env": "INCR_SERVE_KEEP"})
    serve_poll_s: float = field(default=2.0, metadata={"env": "INCR_SERVE_POLL_S"})
    keep_batches: int = field(default=100, metadata={"env": "INCR_KEEP_BATCHES"})
    keep_hours: float = field(default=168.0, metadata={"env": "INCR_KEEP_HOURS"})
    maintain_every_h: float = field(default=24.0, metadata={"env": "INCR_MAINTAIN_EVERY_H"})
    retries: int = field(default=2, metadata={"env": "INCR_RETRIES"})
    retry_delay_s: float = field(default=30.0, metadata={"env": "INCR_RETRY_DELAY_S"})
    crash_at: str | None = field(default=None, metadata={"env": "INCR_CRASH_AT"})
    pause_at: str | None = field(default=None, metadata={"env": "INCR_PAUSE_AT"})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings given by ``environ`` (default ``os.environ``); unset ones keep defaults."""
        environ = os.environ if environ is None else environ
        values = {f.name: _parsed(f, environ.get(f.metadata["env"])) for f in fields(cls)}
        return cls(**{n: v for n, v in values.items() if v is not None})  # type: ignore[arg-type]

    def spark_settings(self) -> dict[str, str]:
        """``spark_conf`` as a mapping (``key=value`` pairs separated by commas)."""
        out = {}
        for item in filter(None, self.spark_conf.split(",")):
            key, _, value = item.partition("=")
            out[key.strip()] = value.strip()
        return out


def settings() -> Settings:
    """The process's settings, read from the environment now (it may change between runs)."""
    return Settings.from_env()


def setting(name: str) -> Any:
    """One field of :func:`settings`, its variable alone read now.

    For the checks made many times a batch (a crash point), which need not parse every
    other variable each time.
    """
    f = next(f for f in fields(Settings) if f.name == name)
    value = _parsed(f, os.environ.get(f.metadata["env"]))
    return getattr(Settings, name) if value is None else value


def _parsed(f: Field, raw: str | None) -> object | None:
    """The value of setting ``f`` written ``raw`` in its variable (None: unset or empty)."""
    if raw is None or raw == "":
        return None
    if f.type in ("bool", bool):
        if raw not in ("0", "1"):
            raise ValueError(f"{f.metadata['env']} must be 0 or 1, not {raw!r}")
        return raw == "1"
    if f.type in ("int", int):
        return _int(raw, f.metadata["env"])
    if f.type in ("float", float):
        return float(raw)
    return raw

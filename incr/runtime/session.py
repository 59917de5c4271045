"""The SparkSession, the Spark engine, and reading and writing Delta tables without the JARs.

Spark reads a Delta table's current version through the table's file list (from delta-rs)
with ``basePath`` set so the ``_bucket=<n>`` partition directories become a column.  That is
only valid while the table uses no deletion vectors or column mapping; the storage adapter
checks the protocol and refuses otherwise.

Spark writes a Delta table's new files itself (:func:`write_delta`): its executors write
Parquet files shaped like delta-rs's own (see :data:`PARQUET_FOR_DELTA`) into a staging
directory, and the storage adapter commits them (:meth:`DeltaStore.commit_files`), so rows
computed in Spark never pass through the driver's memory on their way to a table.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.dialect import Query
from incr.config import settings
from incr.errors import StorageError
from incr.runtime.engine import SPARK, Engine, as_query, per_engine
from incr.runtime.store import DeltaStore
from incr.runtime.types import nullable

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from incr.runtime.engine import Engines

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Without a UI Spark's SQL listener still keeps each query's plan description, up to 1000
    # queries by default; a long-lived session (a test run, `incr bench`) running many large
    # incremental queries filled a 2g driver heap with them and spent its time in full GCs.
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    # ANSI arithmetic: an overflow or a cast that does not fit is an error, never a wrapped
    # number or a NULL; the driver-side engine follows the same rule (incr.runtime.local).
    "spark.sql.ansi.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "4g",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    # Quiet startup: no banner lines or native-library notice on stderr (see the file).
    "spark.driver.extraJavaOptions":
        f"-Dlog4j2.configurationFile={(Path(__file__).parent / 'log4j2.properties').as_uri()}",
}


def spark_session(master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """Returns the process's SparkSession, creating a local one on first use.

    ``master`` and ``conf`` default to the settings ``INCR_SPARK_MASTER`` (``local[2]``) and
    ``INCR_SPARK_CONF`` (``key=value`` pairs, e.g. ``spark.driver.memory=8g``) of
    :mod:`incr.config`, which add to :data:`DEFAULTS`; ``conf`` adds to (overrides) both.
    """
    config = settings()
    master = master or config.spark_master
    if on_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    values = dict(DEFAULTS)
    values.update(config.spark_settings())
    values.update(conf or {})
    _start_jvm(master, values)
    builder = SparkSession.builder.master(master)
    builder = builder.appName("incr")
    for key, value in values.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # PySpark logs every SQL error it re-raises as a multi-kilobyte JSON record; incr reports
    # the error itself, with the file and view it concerns.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    return spark


#: What the JVM prints on stderr that says nothing to an incr user: Spark 4 resolves the
#: incubating Vector API module, and Java announces it at every start (in every Airflow
#: task's log, at error level).
_JVM_NOISE = ("WARNING: Using incubator modules:",)


def _start_jvm(master: str, values: Mapping[str, str]) -> None:
    """Starts the driver JVM (unless this process has one) with its stderr read by a thread
    that passes every line on to ours except :data:`_JVM_NOISE`.

    pyspark starts the JVM with our stderr as its own; its developer hook ``popen_kwargs``
    of ``launch_gateway`` lets the caller take the stream instead.  The SparkContext made
    here is the one ``SparkSession.builder.getOrCreate()`` then finds.
    """
    import subprocess
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None or SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName("incr")
    for key, value in values.items():
        conf.set(key, value)
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stderr is not None:
        threading.Thread(target=_pass_on, args=(proc.stderr,), name="incr-jvm-stderr",
                         daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _pass_on(stream) -> None:
    """Copies the JVM's stderr to ours, line by line, leaving out :data:`_JVM_NOISE`."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        if not line.startswith(_JVM_NOISE):
            sys.stderr.write(line)
            sys.stderr.flush()


def on_loopback(master: str) -> bool:
    """Whether every process of ``master`` runs on this machine's loopback interface.

    Only then may the driver bind to 127.0.0.1 (SPARK_LOCAL_IP, set unless already set: it
    spares a local run the machine's hostname lookup): the driver advertises that address to
    the executors, and on a cluster with other hosts they would dial their own loopback and
    never reach it.  True for ``local[...]`` masters and for ``spark://`` URLs whose hosts are
    all 127.0.0.1 or localhost (such as :func:`incr.runtime.cluster.standalone_cluster`'s).
    """
    if master.startswith("local"):
        return True
    scheme, _, hosts = master.partition("://")
    if scheme != "spark" or not hosts:
        return False
    return all(part.rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]")
               for part in hosts.rstrip("/").split(","))


def arrow_frame(spark: SparkSession, data: pa.Table) -> DataFrame:
    """``data`` as a DataFrame of the same types: a timestamp without zone stays TIMESTAMP_NTZ
    (``createDataFrame`` alone makes it a timestamp with the session's zone)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(data, schema=from_arrow_schema(data.schema, prefer_timestamp_ntz=True))


@per_engine("Delta read from its files", SPARK)
def read_delta(spark: SparkSession, store: DeltaStore, path: str,
               buckets: Iterable[int] | None = None) -> DataFrame:
    """A DataFrame over the current version of the Delta table at ``path`` (only the files
    of ``buckets``, when given)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    snapshot = store.snapshot(path, buckets)
    # A timestamp without zone stays one (TIMESTAMP_NTZ): PySpark's default reads it with zone.
    schema = from_arrow_schema(snapshot.schema, prefer_timestamp_ntz=True)
    if not snapshot.files:
        return spark.createDataFrame(snapshot.schema.empty_table(), schema=schema)
    frame = spark.read.schema(schema).option("basePath", snapshot.root).parquet(
        *(literal_path(f) for f in snapshot.files))
    if snapshot.deleted:  # rows of the files' deletion vectors: left out by file and position
        from pyspark.sql import functions as F

        # A file is named by its path under the table (its partition directories and name):
        # Spark names the files of one partitioned write alike in every partition.
        depth = len(snapshot.partition_by) + 1
        gone = arrow_frame(spark, snapshot.deleted_rows("incr_file__", "incr_row__", depth))
        frame = (frame.withColumn("incr_file__",
                                  F.substring_index(F.col("_metadata.file_path"), "/", -depth))
                 .withColumn("incr_row__", F.col("_metadata.row_index"))
                 .join(gone, on=["incr_file__", "incr_row__"], how="left_anti"))
    return frame.select(*[_column(f.name) for f in snapshot.schema])


def _release(df: DataFrame) -> None:
    """Frees the blocks of a local checkpoint (:meth:`SparkEngine.frame`) now, not whenever
    the driver's garbage collector lets Spark's cleaner see the RDD is gone."""
    plan = df._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)
    else:
        df.unpersist()


def literal_path(path: str) -> str:
    """``path`` as Spark's file reader takes it as written: it expands Hadoop's glob
    characters (``{}[]*?\\``), so a folder named ``a{1}`` would not be found unescaped."""
    return re.sub(r"([{}\[\]*?\\])", r"\\\1", path)


#: Session settings of a write of files for delta-rs, set for the write only: Spark's
#: Parquet writer takes them from the session, not from the write's options.  Timestamps as
#: INT64 microseconds, as delta-rs writes them (Spark's default is the legacy INT96), the
#: standard layout of decimals and lists (not Spark's legacy one), and dates and timestamps
#: written as they are in the proleptic Gregorian calendar, as Arrow and delta-rs read them.
PARQUET_FOR_DELTA = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.writeLegacyFormat": "false",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
}
#: Write options (these do reach the Parquet writer): footer statistics whole, never
#: truncated, since the commit takes a string's footer bounds for exact ones.
_WRITE_OPTIONS = {"parquet.statistics.truncate.length": str(2**31 - 1)}


def arrow_types(df: DataFrame) -> pa.Schema:
    """The Arrow types of a DataFrame's rows, every field nullable: the schema a table
    created from it gets."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return nullable(to_arrow_schema(df.schema))


def write_delta(spark: SparkSession, store: DeltaStore, path: str | Path, df: DataFrame, *,
                mode: str, batch: int | None, schema: pa.Schema | None = None,
                replace_schema: bool = False, sort_by: Iterable[str] = (),
                target_file_size: int | None = None, metadata: Mapping[str, str] | None = None,
                description: str | None = None) -> int:
    """Writes ``df``'s rows to the Delta table at ``path`` without collecting them: Spark's
    executors write the files, delta-rs commits them with ``batch`` (see
    :meth:`DeltaStore.commit_files`, which creates a missing table); returns the rows.

    Each column is cast to the table's type, as a driver-side write casts its rows.  A
    partitioned table (state, by ``_bucket``) gets one file per partition value, sorted by
    ``sort_by`` within; an unpartitioned one is sorted by ``sort_by`` as a whole, so each file
    holds a narrow range of it and a MERGE matching on those columns skips most files.

    Args:
        mode: ``append`` or ``overwrite``.
        schema: the table's schema to cast to; None for the table's current one (``df``'s
            own, every column nullable, for a new table).
        replace_schema: write ``df``'s own schema (nullable), replacing the table's (an
            answer's schema follows its query).
        sort_by: the columns to sort the rows by.
        target_file_size: about how large a file may get, in bytes (estimated from the
            schema's column widths; None: one file per task and partition value).
        metadata: custom commit metadata.
        description: the description of a new table.

    Raises:
        StorageError: ``df`` lacks a column of the table or cannot be cast to its type, or
            the commit failed.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql.pandas.types import from_arrow_schema

    exists = store.exists(path)
    if replace_schema or (schema is None and not exists):
        schema = arrow_types(df)
    elif schema is None:
        schema = store.schema(path)
    partitions = store.partition_columns(path) if exists else ()
    try:
        rows = df.select(*[_column(f.name).cast(f.dataType).alias(f.name)
                           for f in from_arrow_schema(schema, prefer_timestamp_ntz=True)])
    except AnalysisException as e:
        raise StorageError(f"the rows written to the Delta table at {path} do not fit its "
                           f"schema: {e}") from e
    order = [_column(c) for c in sort_by]
    cached = None
    if partitions:
        rows = rows.repartition(*[_column(c) for c in partitions])
        rows = rows.sortWithinPartitions(*[_column(c) for c in partitions], *order)
    elif order:  # a range partitioning samples its input first: computed once, not twice
        cached = rows = rows.cache()
        rows = rows.orderBy(*order)
    writer = rows.write.format("parquet").mode("errorifexists").options(**_WRITE_OPTIONS)
    if partitions:
        writer = writer.partitionBy(*partitions)
    if target_file_size:
        writer = writer.option("maxRecordsPerFile", max(1, target_file_size // _row_bytes(schema)))
    try:
        with store.staging(path) as directory:
            with _session_settings(spark, PARQUET_FOR_DELTA):
                writer.save(str(directory.absolute()))
            return store.commit_files(path, directory, mode=mode, batch=batch, schema=schema,
                                      metadata=metadata, description=description)
    finally:
        if cached is not None:
            cached.unpersist()


def _column(name: str) -> Column:
    """A column by its exact name (answer columns may be named ``sum(x)`` or ``a.b``)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _row_bytes(schema: pa.Schema) -> int:
    """About how many bytes a row of ``schema`` takes (a fixed width, or 16 for strings and
    other variable-width values), to turn a file size into a row count."""
    total = 0
    for f in schema:
        try:
            total += max(1, f.type.bit_width // 8)
        except ValueError:
            total += 16
    return max(1, total)


@contextmanager
def _session_settings(spark: SparkSession, values: Mapping[str, str]) -> Iterator[None]:
    """The session's ``values`` while in the block, the previous ones after."""
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def compact(engines: Engines, store: DeltaStore, path: Path, sort_by: tuple[str, ...],
            max_files: int, *, metadata: Mapping[str, str] | None = None, vacuum: bool = True,
            target_file_size: int | None = None) -> bool:
    """:meth:`DeltaStore.compact` (same arguments), by Spark's executors for a table of more
    rows than the driver-side limit (``INCR_LOCAL_STATE_ROWS``), so that no compaction brings
    a large table to the driver.  Returns True when it rewrote."""
    if store.file_count(path) <= max_files:
        return False
    rows = store.row_count(path)
    if rows is not None and rows <= engines.settings.local_state_rows:
        return store.compact(path, sort_by, max_files, metadata=metadata, vacuum=vacuum,
                             target_file_size=target_file_size)
    engine = SparkEngine(engines, store)
    try:
        engine.write(path, read_delta(engine.spark, store, str(path)), mode="overwrite",
                     batch=None, sort_by=sort_by, target_file_size=target_file_size,
                     metadata=metadata)
    finally:
        engine.close()
    if vacuum:
        store.vacuum_now(path)
    return True


class SparkEngine(Engine):
    """The Spark engine (:class:`~incr.runtime.engine.Engine`): names are temporary views.

    Cached DataFrames are unpersisted on :meth:`close`, so a batch leaves nothing behind.
    Spark is only asked for when something is registered (it may not have started yet).
    """

    name = SPARK

    def __init__(self, engines: Engines, store: DeltaStore):
        self.engines = engines
        self.store = store
        self._names: list[str] = []
        self._cached: list[DataFrame] = []

    @property
    def spark(self) -> SparkSession:
        return self.engines.spark

    def frame(self, name: str, df: DataFrame, cache: bool = False) -> str:
        """Registers a DataFrame as ``name`` (materialized when asked); returns the name.

        A materialized frame is a local checkpoint: computed once, and read by later steps
        as a leaf, its lineage cut.  Spark inlines a temporary view's whole plan into every
        query reading it, so with ``cache()`` alone the plans of a nested view's combine step
        (each stage's change read by the next, each table's old, new and changed rows) grew
        with every step and filled the driver's heap with plan trees.
        """
        if cache:
            df = df.localCheckpoint(eager=True)
            self._cached.append(df)
        df.createOrReplaceTempView(name)
        self._names.append(name)
        return name

    def table(self, name: str, data: pa.Table) -> str:
        return self.frame(name, arrow_frame(self.spark, data))

    def delta(self, name: str, path: Path, buckets: Iterable[int] | None = None,
              matching: Mapping[str, pa.Array] | None = None, every: bool = False,
              bucketed_by: tuple[str, int] | None = None) -> str:
        # ``matching`` is not applied: Spark's join reads what it needs, and a filter built
        # from the change's values would cost a job of its own.
        return self.frame(name, read_delta(self.spark, self.store, str(path), buckets))

    @per_engine("compiled SQL", SPARK)
    def view(self, name: str, sql: Query | str, cache: bool = False,
             schema: pa.Schema | None = None) -> str:
        return self.frame(name, self.spark.sql(as_query(sql).sql), cache)

    @per_engine("result types", SPARK)
    def schema_of(self, name: str) -> pa.Schema:
        return arrow_types(self.spark.table(name))

    def collect(self, sql: Query | str, schema: pa.Schema | None = None) -> pa.Table:
        return self.spark.sql(as_query(sql).sql).toArrow()

    def write(self, path: Path, rows: Query | str | DataFrame, *, mode: str, batch: int | None,
              replace_schema: bool = False, sort_by: Iterable[str] = (),
              target_file_size: int | None = None, metadata: Mapping[str, str] | None = None,
              description: str | None = None) -> int:
        """Writes the rows of a query (or a DataFrame) to the Delta table at ``path`` from
        the executors, the driver collecting nothing; returns the rows written.  See
        :func:`write_delta` for the arguments."""
        from pyspark.sql import DataFrame

        df = rows if isinstance(rows, DataFrame) else self.spark.sql(as_query(rows).sql)
        return write_delta(self.spark, self.store, path, df, mode=mode, batch=batch,
                           replace_schema=replace_schema, sort_by=sort_by,
                           target_file_size=target_file_size, metadata=metadata,
                           description=description)

    def close(self) -> None:
        for name in self._names:
            self.spark.catalog.dropTempView(name)
        for df in self._cached:
            _release(df)
        self._names, self._cached = [], []

"""The SparkSession, the Spark engine, and reading Delta tables into Spark without the JARs.

Spark reads a Delta table's current version through the table's file list (from delta-rs)
with ``basePath`` set so the ``_bucket=<n>`` partition directories become a column.  That is
only valid while the table uses no deletion vectors or column mapping; the storage adapter
checks the protocol and refuses otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.compiler.dialect import Query
from incr.config import settings
from incr.runtime.engine import SPARK, Engine, as_query, per_engine
from incr.runtime.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from incr.runtime.engine import Engines

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "4g",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}


def spark_session(master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """Returns the process's SparkSession, creating a local one on first use.

    ``master`` and ``conf`` default to the settings ``INCR_SPARK_MASTER`` (``local[2]``) and
    ``INCR_SPARK_CONF`` (``key=value`` pairs, e.g. ``spark.driver.memory=8g``) of
    :mod:`incr.config`, which add to :data:`DEFAULTS`; ``conf`` adds to (overrides) both.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    config = settings()
    values = dict(DEFAULTS)
    values.update(config.spark_settings())
    values.update(conf or {})
    builder = SparkSession.builder.master(master or config.spark_master)
    builder = builder.appName("incr")
    for key, value in values.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # PySpark logs every SQL error it re-raises as a multi-kilobyte JSON record; incr reports
    # the error itself, with the file and view it concerns.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    return spark


def read_delta(spark: SparkSession, store: DeltaStore, path: str,
               buckets: Iterable[int] | None = None) -> DataFrame:
    """A DataFrame over the current version of the Delta table at ``path`` (only the files
    of ``buckets``, when given)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    snapshot = store.snapshot(path, buckets)
    if not snapshot.files:
        return spark.createDataFrame(snapshot.schema.empty_table())
    schema = from_arrow_schema(snapshot.schema)
    return (spark.read.schema(schema).option("basePath", snapshot.root)
            .parquet(*snapshot.files).select(*[f.name for f in snapshot.schema]))


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
        """Registers a DataFrame as ``name`` (cached when asked); returns the name."""
        if cache:
            df = df.cache()
            self._cached.append(df)
        df.createOrReplaceTempView(name)
        self._names.append(name)
        return name

    def table(self, name: str, data: pa.Table) -> str:
        return self.frame(name, self.spark.createDataFrame(data))

    def delta(self, name: str, path: Path, buckets: Iterable[int] | None = None) -> str:
        return self.frame(name, read_delta(self.spark, self.store, str(path), buckets))

    @per_engine("compiled SQL", SPARK)
    def view(self, name: str, sql: Query | str, cache: bool = False,
             schema: pa.Schema | None = None) -> str:
        return self.frame(name, self.spark.sql(as_query(sql).sql), cache)

    def collect(self, sql: Query | str, schema: pa.Schema | None = None) -> pa.Table:
        return self.spark.sql(as_query(sql).sql).toArrow()

    def close(self) -> None:
        for name in self._names:
            self.spark.catalog.dropTempView(name)
        for df in self._cached:
            df.unpersist()
        self._names, self._cached = [], []

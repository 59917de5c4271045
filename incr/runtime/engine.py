"""The two engines of a run (Spark, and DuckDB on the driver) and where Spark is started.

A run holds one :class:`Engines`: the driver-side engine (:class:`~incr.runtime.local.LocalSql`,
when enabled) and the SparkSession, which is only started the first time a step needs it.
An Airflow task whose batch stays on the driver therefore never pays a JVM start, and
``incr status`` never starts one at all.

Every choice between the engines, and every fall back from the driver to Spark, is logged
on the ``incr.runtime`` logger with the reason, so a run's log says which engine ran what.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from incr.config import Settings, settings
from incr.runtime.local import LocalSql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("incr.runtime")


class Engines:
    """The engines one run may use; Spark starts lazily (see the module docstring)."""

    def __init__(self, config: Settings | None = None, spark: SparkSession | None = None,
                 local_rows: int | None = None):
        """``spark``: a session to use (tests and benchmarks share one); ``local_rows``
        overrides the setting of the same name (0 turns the driver-side engine off)."""
        config = config or settings()
        if local_rows is not None:
            config = replace(config, local_rows=local_rows)
        self.settings = config
        self._spark = spark
        self.local = (LocalSql(config.local_rows, config.local_state_rows)
                      if config.local_rows > 0 else None)

    @property
    def spark_started(self) -> bool:
        """Whether this run has a SparkSession yet."""
        return self._spark is not None

    @property
    def spark(self) -> SparkSession:
        """The SparkSession, started on first use."""
        if self._spark is None:
            from incr.runtime.session import spark_session

            log.info("starting Spark (master %s)", self.settings.spark_master)
            self._spark = spark_session(self.settings.spark_master)
        return self._spark

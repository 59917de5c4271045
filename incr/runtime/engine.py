"""The two engines of a run, the one surface they share, and the one place that picks one.

incr computes with two engines over the same compiled SQL:

* **Spark** (:class:`~incr.runtime.session.SparkEngine`), for anything large;
* **the driver** (:class:`~incr.runtime.local.DriverEngine`): DuckDB over Arrow in this
  process, for small batches and small tables, where Spark's fixed cost per job would
  dwarf the work.

Both implement :class:`Engine`: register rows held on the driver (:meth:`Engine.table`) or
a Delta table (:meth:`Engine.delta`) under a name, define a named query over registered
names (:meth:`Engine.view`) and collect a query's rows (:meth:`Engine.collect`).  The
runtime's algorithms (the fold of a batch, the answer, the row index) are written once
against this surface; which engine runs a step is decided by :meth:`Engines.choose`, and a
driver-side step that meets something only Spark may do raises :class:`NotLocal`, after
which the step starts over in Spark (:meth:`Engines.fell_back` logs why).

A run holds one :class:`Engines`.  The SparkSession is only started the first time a step
needs it, so an Airflow task whose batch stays on the driver never pays a JVM start and
``incr status`` never starts one.  Every decision is logged on the ``incr.runtime`` logger
at INFO with its reason.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

import pyarrow as pa

from incr.compiler.dialect import Query
from incr.config import Settings, settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.runtime.local import LocalSql
    from incr.runtime.store import DeltaStore

log = logging.getLogger("incr.runtime")

SPARK = "spark"
DRIVER = "driver"

T = TypeVar("T")


class NotLocal(Exception):
    """A driver-side step met something only Spark may run; the step starts over in Spark.

    The message says what and why (it is logged as the reason of the fall back).
    """


class Engine(abc.ABC):
    """What the runtime asks of an engine; names are global to the engine's session."""

    name: ClassVar[str]
    #: Whether :meth:`delta` with ``matching`` registers the matching rows only (rather than
    #: more): a caller may then find what a change reaches in a few narrow reads.
    narrows: ClassVar[bool] = False

    @abc.abstractmethod
    def table(self, name: str, data: pa.Table) -> str:
        """Registers rows held on the driver as ``name``; returns the name."""

    @abc.abstractmethod
    def delta(self, name: str, path: Path, buckets: Iterable[int] | None = None,
              matching: Mapping[str, pa.Array] | None = None, every: bool = False,
              bucketed_by: tuple[str, int] | None = None) -> str:
        """Registers the current version of the Delta table at ``path`` as ``name``.

        ``buckets``: only those ``_bucket`` partitions (the part a batch's keys reach); the
        whole table when None or when the table is not partitioned by bucket.
        ``matching``: the caller only needs rows whose column ``c`` holds one of
        ``matching[c]`` for some ``c`` (a side table that a change joins), or with ``every``
        for every ``c`` (the groups a batch touched); an engine may register just those or
        more.  ``bucketed_by``: (column, count) when the table's ``_bucket`` is the hash of
        that one column into ``count`` buckets (a driver search of a bucket's files then
        looks for its own values only).
        """

    def scan(self, name: str, path: Path) -> str:
        """Registers the current version of the Delta table at ``path`` as ``name``, whole,
        for a query that keeps little of it (an aggregate to a few groups, the first k
        rows): an engine may read the table as the query runs rather than hold its rows,
        whatever its size.  By default, :meth:`delta`."""
        return self.delta(name, path)

    @abc.abstractmethod
    def view(self, name: str, sql: Query | str, cache: bool = False,
             schema: pa.Schema | None = None) -> str:
        """Defines ``name`` as the (Spark SQL) query ``sql``; ``cache`` when read repeatedly.

        ``schema``: the table whose types the rows have (a state table), for a query that
        hashes a bucket: the driver hashes Spark's types, so it computes such a view's rows
        at once, cast to ``schema``.
        """

    def hold(self, name: str, sql: str) -> str:
        """Computes ``sql`` once and keeps its rows as ``name`` where this engine reads them
        fastest, for a large table read by many queries (Spark: a cached view)."""
        return self.view(name, sql, cache=True)

    def schema_of(self, name: str) -> pa.Schema:
        """The types Spark gives the rows registered as ``name``, every field nullable
        (the types a table created from them gets)."""
        raise NotLocal(f"{name}: the {self.name} engine does not know Spark's types")

    @abc.abstractmethod
    def collect(self, sql: Query | str, schema: pa.Schema | None = None) -> pa.Table:
        """The rows of ``sql`` on the driver; ``schema`` is the table they are written to.

        The driver casts its result to ``schema`` (and fills ``_bucket`` as Spark would);
        Spark's result already has the types the table was created with.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Drops every name this engine registered."""


def as_query(sql: Query | str) -> Query:
    """A compiled query, or plain Spark SQL that computes no bucket, as a :class:`Query`."""
    return sql if isinstance(sql, Query) else Query(sql)


class Engines:
    """The engines one run may use and the rules that choose between them."""

    def __init__(self, config: Settings | None = None, spark: SparkSession | None = None,
                 local_rows: int | None = None):
        """``config``: the settings (default: the environment's); ``spark``: a session to use
        (tests and benchmarks share one); ``local_rows`` overrides the setting of the same
        name (0 turns the driver-side engine off)."""
        from incr.runtime.local import LocalSql

        config = config or settings()
        if local_rows is not None:
            config = replace(config, local_rows=local_rows)
        self.settings = config
        self._spark = spark
        self.local: LocalSql | None = (LocalSql(config.local_rows, config.local_state_rows)
                                       if config.local_rows > 0 else None)

    # -- the engines -----------------------------------------------------------------------
    @property
    def spark(self) -> SparkSession:
        """The SparkSession, started on first use."""
        if self._spark is None:
            from incr.runtime.session import spark_session

            log.info("starting Spark (master %s)", self.settings.spark_master)
            self._spark = spark_session(self.settings.spark_master)
        return self._spark

    def engine(self, name: str, store: DeltaStore, typed: bool = False) -> Engine:
        """A session of engine ``name`` (:data:`SPARK`, or :data:`DRIVER` once :meth:`choose`
        said so) reading Delta tables through ``store``; close it when done.

        ``typed``: the driver also works out the Spark types of what it computes
        (:meth:`Engine.schema_of`, and results with no table to take types from), for
        creating tables; Spark always knows them."""
        if name == DRIVER:
            from incr.runtime.local import DriverEngine, TypedDriverEngine

            assert self.local is not None, "the driver-side engine is off"
            return (TypedDriverEngine if typed else DriverEngine)(self.local, store)
        from incr.runtime.session import SparkEngine

        return SparkEngine(self, store)

    # -- choosing ----------------------------------------------------------------------------
    def choose(self, step: str, subject: str, *, rows: int | None,
               blocker: str | None = None) -> str:
        """:data:`DRIVER` or :data:`SPARK` for one step, logged with the reason.

        Args:
            step: what is decided (``read``, ``index``, ``fold``, ``answer``).
            subject: what it is about (a file, a table, a view).
            rows: how many input rows the step reads that are on (or would be read to) the
                driver; None when they are not there at all.
            blocker: why the step cannot run on the driver whatever its size (None: it can).
        """
        if self.local is None:
            reason = "the driver-side engine is off (INCR_LOCAL_ROWS=0)"
        elif blocker is not None:
            reason = blocker
        elif rows is None:
            reason = "its input is not on the driver"
        elif rows > self.local.max_rows:
            reason = f"{rows} rows > INCR_LOCAL_ROWS={self.local.max_rows}"
        else:
            log.info("%s %s: driver (%d rows)", step, subject, rows)
            return DRIVER
        log.info("%s %s: Spark, %s", step, subject, reason)
        return SPARK

    def run(self, step: str, subject: str, work: Callable[[str], T], *, rows: int | None,
            blocker: str | None = None) -> T:
        """``work(engine name)`` on the engine :meth:`choose` picks; again in Spark when the
        driver gives way (:class:`NotLocal`).  ``work`` must leave nothing half-done."""
        if self.choose(step, subject, rows=rows, blocker=blocker) == DRIVER:
            try:
                return work(DRIVER)
            except NotLocal as e:
                self.fell_back(step, subject, str(e))
        return work(SPARK)

    def fell_back(self, step: str, subject: str, reason: str) -> None:
        """Logs that a driver-side step gave way to Spark, and why."""
        log.info("%s %s: back to Spark, %s", step, subject, reason)


# -- rules that exist once per engine ----------------------------------------------------------
#: Semantic rules each engine computes its own way (a hash, a row number, a type), and the
#: test that drives both engines with the same inputs and asserts equal results.  Every
#: implementation is marked with :func:`per_engine`; ``tests/runtime/test_engines.py`` fails
#: when a rule has implementations on both engines but no test here, when a listed test is
#: missing, or when a function named like per-engine code (``local_*``, ``_spark_*``, ...) is
#: not marked.
CROSS_ENGINE_TESTS: dict[str, str] = {
    "row fingerprint": "tests/runtime/test_engines.py::test_row_index_is_the_same_from_both_engines",
    "columns declared after a file, NULL":
        "tests/runtime/test_engines.py::test_a_batch_reads_the_same_on_both_engines",
    "row index inserts": "tests/runtime/test_engines.py::test_row_index_is_the_same_from_both_engines",
    "row index compaction":
        "tests/runtime/test_engines.py::test_row_index_compaction_is_the_same_on_both_engines",
    "row index deletes": "tests/runtime/test_bad_input.py::"
                         "test_bad_delete_message_is_the_same_on_the_driver_and_in_spark",
    "batch rows, types and _row":
        "tests/runtime/test_engines.py::test_a_batch_reads_the_same_on_both_engines",
    "NOT NULL check": "tests/runtime/test_engines.py::test_not_null_is_refused_alike_on_both_engines",
    "state bucket": "tests/runtime/test_sparkhash.py::test_every_type_alone_and_chained",
    "compiled SQL": "tests/runtime/test_local.py::test_query_equals_spark_h_buckets_and_types_included",
    "result types": "tests/runtime/test_sparktypes.py::test_new_tables_have_the_types_spark_gives_them",
    "⊗/⊗̃ as MERGE and as a query": "tests/runtime/test_engines.py::test_merge_and_combined_query_agree",
    "Delta read from its files":
        "tests/runtime/test_engines.py::test_a_table_read_from_its_files_is_the_same_on_both_engines",
}
#: rule -> engine -> qualified names of the functions implementing it (filled by per_engine).
IMPLEMENTATIONS: dict[str, dict[str, list[str]]] = {}


def per_engine(rule: str, engine: str):
    """Marks a function as ``engine``'s implementation of ``rule`` (see CROSS_ENGINE_TESTS)."""
    def mark(fn):
        name = f"{fn.__module__}.{fn.__qualname__}"
        IMPLEMENTATIONS.setdefault(rule, {}).setdefault(engine, []).append(name)
        return fn
    return mark

"""``incr serve``: Spark's Thrift JDBC/ODBC server over the answers, kept current.

Spark's Thrift server (HiveServer2's protocol, so any Hive or Spark SQL JDBC/ODBC driver
connects) ships inside pyspark.  It is started in this process over a local SparkSession
(``HiveThriftServer2.startWithContext``), so every connection shares the session's
catalog, and a refresh loop keeps that catalog equal to the warehouse: every ``poll_s``
seconds, for each program served,

1. its snapshots are read again (:class:`~incr.serving.snapshots.Snapshots`);
2. the last ``keep`` snapshots each get a pinned database ``<program>_b<N>``
   (:meth:`~incr.serving.catalog.SparkCatalog.pin`), created whole before anything
   refers to it;
3. the latest database ``<program>`` is pointed at the newest of them, view by view;
4. pinned databases beyond the last ``keep`` are dropped; their version folders are deleted
   once unused for :data:`~incr.config.SERVE_GRACE_S` seconds, so queries already planned
   over them finish.

Every poll also checks that the databases are as registered and puts back anything found
changed (a dropped database or table, a table moved elsewhere, a view altered): the catalog
is the server's, rebuilt from the warehouse.

Clients only read: the read-only guard (:mod:`~incr.serving.guard`, a Spark session
extension) refuses, after analysis and before anything runs, every statement of a client's
session that is not a read of the served folders (DDL, writes, ``INSERT OVERWRITE
DIRECTORY``, ``ADD JAR``, ``TRANSFORM``, ``reflect``, files read from elsewhere); SHOW,
DESCRIBE, EXPLAIN, USE and SET work.  The served folders are the warehouse and the work
folder, which holds the version folders: a view of a version with deleted rows reads its
deleted rows' file there too (:mod:`~incr.serving.links`), so it passes the guard like
the data files.  The server's own session is the only one trusted.
There are no per-user grants: every authenticated client may read every served answer, so
the server's OS user should still have read-only access to the warehouse (defence in
depth), and the endpoint face BI service accounts.  Authentication is HiveServer2's:
``NONE`` (any user name, no password) by default, on 127.0.0.1; LDAP, Kerberos or a
custom provider are set with ``hive.server2.authentication`` and its sibling settings,
passed as ``spark.hadoop.hive.server2.*`` Spark settings.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake.exceptions import DeltaError

from incr.config import SERVE_GRACE_S
from incr.errors import IncrError
from incr.runtime.store import DeltaStore
from incr.serving.catalog import SparkCatalog, database_name, pinned_name
from incr.serving.guard import arm, build_guard, guard_conf
from incr.serving.links import LinkFolders
from incr.serving.snapshots import ProgramLayout, ProgramSnapshot, Snapshots

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.runtime.bucket import BucketWarehouse

log = logging.getLogger("incr.serving")


@dataclass(frozen=True)
class ServeOptions:
    """How and where to serve.

    Attributes:
        host: the address to listen on (127.0.0.1: this machine only).
        port: the HiveServer2 port.
        keep: how many recent snapshots stay pinnable as ``<program>_b<N>``.
        poll_s: seconds between refreshes.
        work: the server's own folder (version folders, Spark's scratch space); on the
            warehouse's filesystem, so answer files are hard-linked, not copied.
        grace_s: how long a version folder no database shows is kept for queries planned
            over it.
        conf: extra Spark settings (``spark.hadoop.hive.server2.*`` for HiveServer2's).
    """

    host: str = "127.0.0.1"
    port: int = 10000
    keep: int = 5
    poll_s: float = 2.0
    work: Path = Path("serving")
    grace_s: float = SERVE_GRACE_S
    conf: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The JDBC URL clients connect with."""
        return f"jdbc:hive2://{self.host}:{self.port}/"


#: Hive's scratch settings of the server, each a folder of ``<work>/hive`` (created at start:
#: HiveServer2 logs an error when a session closes and its folder is missing).
HIVE_FOLDERS = {
    "hive.downloaded.resources.dir": "resources",
    "hive.exec.local.scratchdir": "scratch",
    "hive.server2.logging.operation.log.location": "operation_logs",
}


def default_work(warehouse: Path, port: int) -> Path:
    """The server's folder when none is given: ``<warehouse>/_serving/<port>``.

    On the warehouse's filesystem (for hard links), and one per server.
    """
    return Path(warehouse) / "_serving" / str(port)


def spark_conf(options: ServeOptions) -> dict[str, str]:
    """The Spark settings of the serving session.

    The in-memory catalog (the server rebuilds it from the warehouse; no metastore to keep),
    HiveServer2's address, and Spark's warehouse folder, Hive's scratch folders and Derby's
    log inside the work folder (not the current folder or /tmp).  ``options.conf`` comes
    after these and wins, but the read-only guard's settings come last (extensions asked
    for in ``options.conf`` are kept beside it).
    """
    from incr.runtime.session import DEFAULTS

    work = options.work.resolve()
    java = DEFAULTS["spark.driver.extraJavaOptions"] + f" -Dderby.stream.error.file={work / 'derby.log'}"
    return {**_settings(options, work, java),
            **guard_conf(work / "guard", options.conf.get("spark.sql.extensions"))}


def _settings(options: ServeOptions, work: Path, java: str) -> dict[str, str]:
    return {
        "spark.sql.catalogImplementation": "in-memory",
        "spark.hadoop.hive.server2.thrift.bind.host": options.host,
        "spark.hadoop.hive.server2.thrift.port": str(options.port),
        "spark.sql.warehouse.dir": str(work / "spark-warehouse"),
        **{f"spark.hadoop.{key}": str(work / "hive" / folder) for key, folder in HIVE_FOLDERS.items()},
        "spark.driver.extraJavaOptions": java,
        **options.conf,
    }


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listening(host: str, port: int, timeout_s: float) -> bool:
    if host in ("", "0.0.0.0", "::"):  # every interface: this machine's is one of them
        host = "127.0.0.1"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


class BiServer:
    """The Thrift server over the answers of ``programs`` in ``warehouse``.

    Args:
        warehouse: the warehouse folder.
        programs: the programs to serve (each gets its databases).
        options: address, retention and polling.
    """

    def __init__(self, warehouse: Path, programs: Sequence[ProgramLayout], options: ServeOptions,
                 bucket: BucketWarehouse | None = None):
        names = [database_name(p.name) for p in programs]
        if len(set(names)) != len(names):
            raise IncrError(f"programs {', '.join(p.name for p in programs)} would share a database "
                            f"name; serve programs whose names differ (letters, digits and _)")
        self.warehouse = Path(warehouse)
        self.bucket = bucket  # the warehouse is this bucket's working copy: pulled each refresh
        if bucket is not None:
            bucket.pull()
        self.options = options
        self.store = DeltaStore()
        self.snapshots = [Snapshots(self.warehouse, p, self.store) for p in programs]
        self.links = LinkFolders(options.work / "versions")
        self.spark: SparkSession | None = None
        self.catalog: SparkCatalog | None = None
        self._server: Any = None
        # What each pinned database was created with, by batch: kept as it was, so the
        # database never changes (a compaction committed later under the same batch number
        # gives the same rows under a new version, and is not followed).
        self._pinned: dict[str, dict[int, ProgramSnapshot]] = {p.name: {} for p in programs}
        self._showing: dict[str, int] = {}
        self._owns_work = False  # set once start() found the port free

    # -- lifetime -----------------------------------------------------------------------------
    def start(self) -> None:
        """Starts Spark and the Thrift server; returns once clients can connect.

        What the warehouse holds is registered before the first client can connect.

        Raises:
            IncrError: the port is taken, or the server did not come up.
        """
        from incr.runtime.session import spark_session

        host, port = self.options.host, self.options.port
        if not _port_free(host, port):  # before touching the work folder: it may be in use
            raise IncrError(f"port {port} on {host} is in use; pick another with --port")
        self._owns_work = True
        self.options.work.mkdir(parents=True, exist_ok=True)
        self._clear()
        for folder in HIVE_FOLDERS.values():
            (self.options.work / "hive" / folder).mkdir(parents=True, exist_ok=True)
        build_guard(self.options.work / "guard")
        self.spark = spark_session(None, spark_conf(self.options))
        # Clients read the version folders (data links, deleted rows) under the work folder.
        arm(self.spark, [self.warehouse, self.options.work])
        self.catalog = SparkCatalog(self.spark, self.links)
        self.refresh_safely()
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        server_class = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
        self._server = server_class.startWithContext(self.spark._jsparkSession.sqlContext())
        if not _listening(host, port, 60.0):
            self.close()
            raise IncrError(f"the Thrift server did not start listening on {host}:{port}")
        log.info("serving %s on %s", ", ".join(s.layout.name for s in self.snapshots),
                 self.options.url)

    def close(self) -> None:
        """Stops the Thrift server and Spark, and deletes the version folders (if started)."""
        from py4j.protocol import Py4JError

        try:
            if self._server is not None:
                self._server.stop()
            if self.spark is not None:
                self.spark.stop()
        except Py4JError as e:  # the JVM is gone already: nothing left to stop
            log.warning("stopping Spark: %s", e)
        self._server = self.spark = None
        if self._owns_work:
            self._clear()

    def _clear(self) -> None:
        """Deletes what a server leaves in its work folder.

        The version folders, and the folders Spark made for databases (the catalog they
        belonged to lived in memory).
        """
        self.links.clear()
        shutil.rmtree(self.options.work / "spark-warehouse", ignore_errors=True)

    def run(self, stop: threading.Event) -> None:
        """Refreshes every ``poll_s`` seconds until ``stop`` is set.

        A refresh that fails (a log being written, a version that cannot be served) is
        logged and tried again at the next poll; the databases keep what they showed.
        """
        while not stop.wait(self.options.poll_s):
            self.refresh_safely()

    def refresh_safely(self) -> None:
        """:meth:`refresh`, logging a failure instead of raising it."""
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        try:
            self.refresh()
        except (IncrError, DeltaError, OSError, PySparkException, Py4JError) as e:
            log.warning("refresh failed (the databases keep what they showed; trying again in "
                        "%.1f s): %s", self.options.poll_s, e)

    # -- one refresh --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Brings every program's databases up to date with the warehouse (see the module)."""
        assert self.catalog is not None
        if self.bucket is not None:
            self.bucket.pull()
        in_use = set()
        for snapshots in self.snapshots:
            snapshots.refresh()
            recent = snapshots.recent(self.options.keep)
            self._serve(snapshots.layout.name, recent)
            in_use |= {self.links.folder_of(database_name(s.program), a)
                       for s in self._pinned[snapshots.layout.name].values() for a in s.answers}
        for folder in self.links.sweep(in_use, self.options.grace_s):
            log.info("deleted %s (unused for %.0f s)", folder, self.options.grace_s)

    def _serve(self, program: str, recent: list[ProgramSnapshot]) -> None:
        assert self.catalog is not None
        if not recent:
            if program not in self._showing:
                log.info("program %s: no batch that every view has applied yet; waiting", program)
                self._showing[program] = -1
            return
        pinned = self._pinned[program]
        recent = [pinned.get(s.batch, s) for s in recent]
        for snapshot in reversed(recent):  # oldest first: the newest is pinned last
            if not self.catalog.pinned_intact(snapshot):
                name = self.catalog.pin(snapshot)
                log.info("%s %s: %s", "repaired" if snapshot.batch in pinned else "pinned", name,
                         snapshot.describe())
                pinned[snapshot.batch] = snapshot
        latest = recent[0]
        if not self.catalog.latest_intact(latest):
            self.catalog.point_latest(latest)
            if self._showing.get(program) == latest.batch:
                log.info("restored database %s (batch %d) after a client changed it",
                         database_name(program), latest.batch)
            else:
                log.info("database %s shows batch %d (%s)", database_name(program), latest.batch,
                         ", ".join(f"{a.view} v{a.version}, {a.rows} rows" for a in latest.answers))
        self._showing[program] = latest.batch
        wanted = {s.batch for s in recent}
        for batch in sorted(set(pinned) - wanted):
            self.catalog.drop(pinned_name(program, batch))
            del pinned[batch]
            log.info("dropped %s (beyond the last %d snapshots)", pinned_name(program, batch),
                     self.options.keep)

    def showing(self) -> dict[str, int]:
        """The batch each program's latest database shows (-1: none yet)."""
        return dict(self._showing)

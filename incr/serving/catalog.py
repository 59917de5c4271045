"""Program snapshots registered in a Spark session's catalog, as BI users see them.

For each program, two kinds of database:

* ``<program>_b<N>``, a **pinned** snapshot: one table per view, each an external Parquet
  table over the version folder (:mod:`~incr.serving.links`) of that view's answer at batch
  N (or a view over two such tables, when the version deletes rows: see below).  Created
  whole, never changed after, dropped once it is no longer among the last few.
* ``<program>``, the **latest** consistent snapshot: one view per view, ``SELECT * FROM
  <program>_b<N>.<view>`` of the newest pinned database.  Moving it to a new batch is one
  ``ALTER VIEW`` per view, a single replacement of the view's catalog entry, so a query
  sees the view either before or after, never a table half registered.  (``CREATE OR
  REPLACE VIEW`` would not do: Spark drops the view, then creates it.)  A query resolves
  the view once, at planning, and keeps reading the files it planned.

Why tables over version folders: Spark has no Delta reader here, a catalog table has one
location, and a table's location must hold exactly one version's files.  A temporary view
over ``spark.read.parquet(*files)`` would read the exact list too, but temporary views
belong to one session (global ones to the single ``global_temp`` database), and a
permanent view may not refer to either.  The table schema is the Delta schema, given
explicitly, so an answer with no rows (no files) is still a table with its columns.

A version whose Delta deletion vectors delete rows of its files (incr marks the rows a
batch replaces deleted instead of rewriting the files that hold them) cannot be a table
over its files alone: they hold those rows still.  Its view is then, in the pinned database, a
permanent *view* over two tables of its version folder: ``_incr_<view>_files`` (the data
files, exactly as above) and ``_incr_<view>_deleted`` (the deleted rows' file name and
position, :data:`~incr.serving.links.DELETED_FOLDER`), anti-joined on Spark's
``_metadata.file_name`` and ``_metadata.row_index`` of each row read.  Both tables are
created before the view, and the three never change after, like every pinned table; a
version without deleted rows stays a plain table.

The catalog is Spark's in-memory one, rebuilt from the warehouse by the server: a BI
user's DDL changes nothing in the warehouse, and :meth:`SparkCatalog.pinned_intact` /
:meth:`SparkCatalog.latest_intact` let the server put back what such DDL changed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from incr.serving.links import LinkFolders
from incr.serving.snapshots import DELETED_SCHEMA, AnswerVersion, ProgramSnapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Database property naming the batch a database shows.
BATCH_PROPERTY = "incr.batch"


def database_name(program: str) -> str:
    """The database of a program's latest snapshot.

    The program's name in lower case, characters other than letters, digits and ``_``
    replaced by ``_``, so no BI tool needs to quote it.
    """
    return re.sub(r"[^a-z0-9_]", "_", program.lower())


def pinned_name(program: str, batch: int) -> str:
    """The database of a program's snapshot at ``batch``: ``<program>_b<batch>``."""
    return f"{database_name(program)}_b{batch}"


def files_table(view: str) -> str:
    """The table of a version's files behind ``view`` when the version deletes rows."""
    return f"_incr_{view}_files"


def deleted_table(view: str) -> str:
    """The table of the rows the version behind ``view`` deletes (file name, position)."""
    return f"_incr_{view}_deleted"


def quote(name: str) -> str:
    """A Spark SQL identifier in backquotes."""
    return "`" + name.replace("`", "``") + "`"


class SparkCatalog:
    """Registers program snapshots in ``spark``'s catalog, over folders of ``links``.

    Args:
        spark: the session whose (shared, in-memory) catalog every Thrift session sees.
        links: the version folders the tables are registered over.
    """

    def __init__(self, spark: SparkSession, links: LinkFolders):
        self.spark = spark
        self.links = links

    # -- what is there ------------------------------------------------------------------------
    def _external(self):  # the catalog behind every session's
        return self.spark._jsparkSession.sessionState().catalog().externalCatalog()

    def exists(self, database: str) -> bool:
        """Whether ``database`` exists."""
        return bool(self._external().databaseExists(database))

    def _entry(self, database: str, table: str):
        external = self._external()
        if not external.tableExists(database, table.lower()):
            return None
        return external.getTable(database, table.lower())

    def _location(self, database: str, table: str) -> str | None:
        entry = self._entry(database, table)
        if entry is None or not entry.storage().locationUri().isDefined():
            return None
        return str(entry.storage().locationUri().get().getPath()).rstrip("/")

    def _view_text(self, database: str, view: str) -> str | None:
        entry = self._entry(database, view)
        if entry is None or entry.tableType().name() != "VIEW" or not entry.viewText().isDefined():
            return None
        return str(entry.viewText().get())

    # -- pinned snapshots ---------------------------------------------------------------------
    def pinned_intact(self, snapshot: ProgramSnapshot) -> bool:
        """Whether the pinned database of ``snapshot`` is as registered.

        Each view's table must point at its version folder (for a version with deleted
        rows: both tables behind it at theirs, and the view's text unchanged), and the
        folder hold exactly the version's files.
        """
        database = pinned_name(snapshot.program, snapshot.batch)
        if not self.exists(database):
            return False
        program = database_name(snapshot.program)
        return all(self.links.is_intact(program, a) and self._answer_intact(database, program, a)
                   for a in snapshot.answers)

    def _answer_intact(self, database: str, program: str, answer: AnswerVersion) -> bool:
        folder = self.links.folder_of(program, answer)
        if not answer.has_deletions:
            return self._location(database, answer.view) == _path(folder)
        deleted = self.links.deleted_folder_of(program, answer)
        return (self._location(database, files_table(answer.view)) == _path(folder)
                and self._location(database, deleted_table(answer.view)) == _path(deleted)
                and self._view_text(database, answer.view) == _live_rows(database, answer.view))

    def pin(self, snapshot: ProgramSnapshot) -> str:
        """Creates (or repairs) the pinned database of ``snapshot``; returns its name.

        Each table is registered in one catalog call, with its schema and its (complete)
        version folder; a table found pointing elsewhere is registered again.  A version
        with deleted rows gets its two tables first, then the view that leaves those rows
        out (see the module).
        """
        program = database_name(snapshot.program)
        database = pinned_name(snapshot.program, snapshot.batch)
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote(database)} COMMENT "
                       f"'{_comment(snapshot)}' WITH DBPROPERTIES "
                       f"('{BATCH_PROPERTY}' = '{snapshot.batch}', 'incr.program' = "
                       f"'{_sql_text(snapshot.program)}')")
        for answer in snapshot.answers:
            folder = self.links.ensure(program, answer)
            about = (f"answer of view {answer.view} (program {snapshot.program}) at batch "
                     f"{snapshot.batch}: Delta version {answer.version}")
            if not answer.has_deletions:
                self._table(database, answer.view, folder, answer.schema, about)
                continue
            self._table(database, files_table(answer.view), folder, answer.schema,
                        f"files of the {about}, with the rows it deletes: read {answer.view}")
            self._table(database, deleted_table(answer.view),
                        self.links.deleted_folder_of(program, answer), DELETED_SCHEMA,
                        f"rows the deletion vectors of the {about} delete")
            self._view(database, answer.view, _live_rows(database, answer.view), about)
        return database

    def _table(self, database: str, table: str, folder: Path, schema: pa.Schema,
               description: str) -> None:
        """Registers ``table`` over ``folder`` unless it is there already."""
        from pyspark.sql.pandas.types import from_arrow_schema

        if self._location(database, table) == _path(folder):
            return
        self._drop(database, table)
        self.spark.catalog.createTable(
            f"{quote(database)}.{quote(table)}", path=_path(folder), source="parquet",
            schema=from_arrow_schema(schema, prefer_timestamp_ntz=True), description=description)

    def _view(self, database: str, view: str, query: str, description: str) -> None:
        """Creates ``view`` as ``query`` unless it is there already."""
        if self._view_text(database, view) == query:
            return
        self._drop(database, view)
        self.spark.sql(f"CREATE VIEW {quote(database)}.{quote(view)} COMMENT "
                       f"'{_sql_text(description)}' AS {query}")

    def _drop(self, database: str, name: str) -> None:
        """Drops the table or view ``name`` (each needs its own statement)."""
        entry = self._entry(database, name)
        if entry is not None:
            kind = "VIEW" if entry.tableType().name() == "VIEW" else "TABLE"
            self.spark.sql(f"DROP {kind} IF EXISTS {quote(database)}.{quote(name)}")

    def drop(self, database: str) -> None:
        """Drops a pinned database.

        Its tables are external: their folders stay until the server sweeps them.
        """
        self.spark.sql(f"DROP DATABASE IF EXISTS {quote(database)} CASCADE")

    # -- the latest snapshot ------------------------------------------------------------------
    def latest_intact(self, snapshot: ProgramSnapshot) -> bool:
        """Whether the program's latest database shows ``snapshot`` (every view's text)."""
        database = database_name(snapshot.program)
        if not self.exists(database):
            return False
        source = pinned_name(snapshot.program, snapshot.batch)
        return all(self._view_text(database, a.view) == _select(source, a.view)
                   for a in snapshot.answers)

    def point_latest(self, snapshot: ProgramSnapshot) -> None:
        """Points the program's latest database at the pinned database of ``snapshot``.

        That database must exist.  One atomic ``ALTER VIEW`` per view, then the database's
        batch property.
        """
        database = database_name(snapshot.program)
        source = pinned_name(snapshot.program, snapshot.batch)
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote(database)} COMMENT 'latest "
                       f"consistent snapshot of program {_sql_text(snapshot.program)}: every view "
                       f"at the batch of property {BATCH_PROPERTY}; pin one with "
                       f"{database}_b<batch>'")
        for answer in snapshot.answers:
            name = f"{quote(database)}.{quote(answer.view)}"
            text = self._view_text(database, answer.view)
            query = _select(source, answer.view)
            if text == query:
                continue
            if text is None:
                self._drop(database, answer.view)  # a table put there by hand
                self.spark.sql(f"CREATE VIEW {name} AS {query}")
            else:
                self.spark.sql(f"ALTER VIEW {name} AS {query}")
        self.spark.sql(f"ALTER DATABASE {quote(database)} SET DBPROPERTIES "
                       f"('{BATCH_PROPERTY}' = '{snapshot.batch}')")


def _select(database: str, view: str) -> str:
    """The text of a latest-database view over ``database``'s table of ``view``."""
    return f"SELECT * FROM {quote(database)}.{quote(view)}"


def _live_rows(database: str, view: str) -> str:
    """The text of a pinned view of a version with deleted rows: its files' rows but those.

    Each row read knows its file's name (as linked in the version folder) and its position
    there (``_metadata``, hidden columns of a file table that ``f.*`` leaves out); the
    deleted ones are dropped by an anti-join, as Delta's own readers apply the vectors.
    """
    files = f"{quote(database)}.{quote(files_table(view))}"
    deleted = f"{quote(database)}.{quote(deleted_table(view))}"
    return (f"SELECT f.* FROM {files} f LEFT ANTI JOIN {deleted} d "
            f"ON f._metadata.file_name = d.file_name AND f._metadata.row_index = d.row_index")


def _path(folder: Path) -> str:
    """A folder as the catalog records a table's location."""
    return str(folder.resolve())


def _sql_text(text: str) -> str:
    """``text`` safe inside a single-quoted SQL string literal."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _comment(snapshot: ProgramSnapshot) -> str:
    versions = ", ".join(f"{a.view} v{a.version}" for a in snapshot.answers)
    return _sql_text(f"program {snapshot.program} at batch {snapshot.batch}: {versions} "
                     f"(Delta versions of the answers)")

"""``incr catalog``: the same snapshots as a DuckDB database file, for DuckDB-based BI tools.

The file holds a schema per pinned snapshot, ``<program>_b<N>``, with one view per answer
over ``read_parquet([...])`` of exactly that version's files, and a schema ``<program>``
whose views select from the newest of them: the layout ``incr serve`` gives its databases.
A view reads the answer's files where they are (no copy, nothing to serve), so the file
is a catalog to open read-only, written again (``incr catalog`` once more) to move on to
newer batches.  incr never vacuums answer files, so its views keep working until someone
vacuums the answers.  An answer version without rows has no file to read; it is written as
an empty table with the answer's columns.

A version whose Delta deletion vectors delete rows of its files (incr marks the rows a
batch replaces deleted instead of rewriting the files that hold them) would show those
rows again through its files alone.  Its deleted rows are kept in the file itself, as the
table ``_incr_deleted.<view>_v<version>`` (``file_name``: the file's path as the view
lists it, ``row_index``: its position there, from 0), and its view anti-joins
``read_parquet``'s ``filename`` and ``file_row_number`` with it: the file stays the whole
catalog, with nothing beside it to lose or keep in step.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from incr.errors import StorageError
from incr.serving.catalog import database_name, pinned_name
from incr.serving.links import local_path
from incr.serving.snapshots import AnswerVersion, ProgramLayout, ProgramSnapshot, Snapshots

#: The schema of the tables of deleted rows (one per answer version that deletes rows).
DELETED_SCHEMA_NAME = "_incr_deleted"
#: The column ``read_parquet`` names each row's file in, for the anti-join (``filename``
#: itself may be a column of the answer).
FILE_COLUMN = "incr_file__"
#: The column ``read_parquet`` gives each row's position in its file in (DuckDB's name).
ROW_COLUMN = "file_row_number"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def write_catalog(out: Path, warehouse: Path, programs: Sequence[ProgramLayout],
                  keep: int) -> list[tuple[str, ProgramSnapshot]]:
    """Writes the DuckDB file ``out`` with the last ``keep`` snapshots of each program.

    The file is replaced whole, by a rename.  A program with no snapshot yet gets no schema.

    Returns:
        Each schema written (pinned ones, then the latest) and the snapshot it shows.
    """
    return write_snapshots(out, {layout.name: Snapshots(warehouse, layout).recent(keep)
                                 for layout in programs})


def write_snapshots(out: Path, programs: Mapping[str, Sequence[ProgramSnapshot]]
                    ) -> list[tuple[str, ProgramSnapshot]]:
    """Writes the DuckDB file ``out`` with the given snapshots of each program.

    Args:
        out: the file, replaced whole by a rename.
        programs: each program's snapshots to pin, newest first (the first is the latest).

    Returns:
        Each schema written (pinned ones, then the latest) and the snapshot it shows.
    """
    import duckdb

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.with_name(f".{out.name}-{uuid.uuid4().hex}")
    written: list[tuple[str, ProgramSnapshot]] = []
    con = duckdb.connect(str(building))
    try:
        for program, recent in programs.items():
            written += _program(con, program, recent)
        con.close()
        os.replace(building, out)
    finally:
        con.close()
        building.unlink(missing_ok=True)
        Path(f"{building}.wal").unlink(missing_ok=True)
    return written


def _program(con, program: str, recent: Sequence[ProgramSnapshot]) -> list[tuple[str, ProgramSnapshot]]:
    """The schemas of one program: one per snapshot, then the latest's over the newest."""
    written = []
    for snapshot in recent:
        schema = pinned_name(program, snapshot.batch)
        con.execute(f"CREATE SCHEMA {_ident(schema)}")
        for answer in snapshot.answers:
            _answer_view(con, schema, answer)
        written.append((schema, snapshot))
    if recent:
        latest = database_name(program)
        source = pinned_name(program, recent[0].batch)
        con.execute(f"CREATE SCHEMA {_ident(latest)}")
        for answer in recent[0].answers:
            con.execute(f"CREATE VIEW {_ident(latest)}.{_ident(answer.view)} AS "
                        f"SELECT * FROM {_ident(source)}.{_ident(answer.view)}")
        written.append((latest, recent[0]))
    return written


def _answer_view(con, schema: str, answer: AnswerVersion) -> None:
    """One answer version in ``schema``: a view over its exact files, or an empty table."""
    name = f"{_ident(schema)}.{_ident(answer.view)}"
    if not answer.files:
        con.register("incr_empty_answer", answer.schema.empty_table())
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM incr_empty_answer")
        con.unregister("incr_empty_answer")
        return
    files = ", ".join(_literal(_file_name(f)) for f in answer.files)
    if not answer.has_deletions:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{files}])")
        return
    clash = {FILE_COLUMN, ROW_COLUMN} & {c.lower() for c in answer.schema.names}
    if clash:
        raise StorageError(f"the answer of view {answer.view} has a column {', '.join(sorted(clash))}, "
                           f"which DuckDB's read_parquet needs to leave out the rows version "
                           f"{answer.version} deletes; rename the column to serve it to DuckDB")
    deleted = _deleted_table(con, answer)
    con.execute(
        f"CREATE VIEW {name} AS SELECT * EXCLUDE ({FILE_COLUMN}, {ROW_COLUMN}) FROM "
        f"read_parquet([{files}], filename = {_literal(FILE_COLUMN)}, {ROW_COLUMN} = true) AS f "
        f"ANTI JOIN {deleted} AS d ON f.{FILE_COLUMN} = d.file_name AND f.{ROW_COLUMN} = d.row_index")


def _deleted_table(con, answer: AnswerVersion) -> str:
    """The table of the rows ``answer`` deletes, written once however many schemas show it."""
    table = f"{answer.view}_v{answer.version}"
    name = f"{_ident(DELETED_SCHEMA_NAME)}.{_ident(table)}"
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(DELETED_SCHEMA_NAME)}")
    known = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
                        [DELETED_SCHEMA_NAME, table]).fetchone()
    if known is None or not known[0]:
        con.register("incr_deleted_rows", answer.deleted_rows(lambda _, f: _file_name(f)))
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM incr_deleted_rows")
        con.unregister("incr_deleted_rows")
    return name


def _file_name(uri: str) -> str:
    """A file of an answer as its view lists it, and so as ``read_parquet`` names its rows'."""
    return str(local_path(uri))

"""``incr catalog``: the same snapshots as a DuckDB database file, for DuckDB-based BI tools.

The file holds a schema per pinned snapshot, ``<program>_b<N>``, with one view per answer
over ``read_parquet([...])`` of exactly that version's files, and a schema ``<program>``
whose views select from the newest of them: the layout ``incr serve`` gives its databases.
A view reads the answer's files where they are (no copy, nothing to serve), so the file
is a catalog to open read-only, written again (``incr catalog`` once more) to move on to
newer batches.  incr never vacuums answer files, so its views keep working until someone
vacuums the answers.  An answer version without rows has no file to read; it is written as
an empty table with the answer's columns.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from incr.serving.catalog import database_name, pinned_name
from incr.serving.links import local_path
from incr.serving.snapshots import AnswerVersion, ProgramLayout, ProgramSnapshot, Snapshots


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
    import duckdb

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.with_name(f".{out.name}-{uuid.uuid4().hex}")
    written: list[tuple[str, ProgramSnapshot]] = []
    con = duckdb.connect(str(building))
    try:
        for layout in programs:
            recent = Snapshots(warehouse, layout).recent(keep)
            for snapshot in recent:
                schema = pinned_name(layout.name, snapshot.batch)
                con.execute(f"CREATE SCHEMA {_ident(schema)}")
                for answer in snapshot.answers:
                    _answer_view(con, schema, answer)
                written.append((schema, snapshot))
            if recent:
                latest = database_name(layout.name)
                source = pinned_name(layout.name, recent[0].batch)
                con.execute(f"CREATE SCHEMA {_ident(latest)}")
                for answer in recent[0].answers:
                    con.execute(f"CREATE VIEW {_ident(latest)}.{_ident(answer.view)} AS "
                                f"SELECT * FROM {_ident(source)}.{_ident(answer.view)}")
                written.append((latest, recent[0]))
        con.close()
        os.replace(building, out)
    finally:
        con.close()
        building.unlink(missing_ok=True)
        Path(f"{building}.wal").unlink(missing_ok=True)
    return written


def _answer_view(con, schema: str, answer: AnswerVersion) -> None:
    """One answer version in ``schema``: a view over its exact files, or an empty table."""
    name = f"{_ident(schema)}.{_ident(answer.view)}"
    if not answer.files:
        con.register("incr_empty_answer", answer.schema.empty_table())
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM incr_empty_answer")
        con.unregister("incr_empty_answer")
        return
    files = ", ".join(_literal(str(local_path(f))) for f in answer.files)
    con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{files}])")

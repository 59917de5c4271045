"""Which columns a source table had when each batch landed: schema evolution.

A source grows columns over the years.  Declaring a new nullable column in ``CREATE TABLE``
is how a program takes one in; the files registered before that declaration read as NULL
in it (dbt's ``on_schema_change: append_new_columns``; a file that had the column then was
read without it, and still is), while every
file registered after it must have it, as it must have every other declared column (a
file without one is still rejected: it is more often a broken export than an old one).

Each source table keeps a log of its declarations, one entry per change, with the first
batch number registered under it::

    WAREHOUSE/_incr/<program>/schema/<table>.json
        [{"first": 0, "columns": [[name, type, not_null], ...]}, {"first": 12, ...}]

Only additions of nullable columns are taken.  A declaration that drops a column, changes
its type or nullability, or adds a NOT NULL one is refused before anything is read or
written, with what to do instead: the rows already applied were read with that column, and
the views built from them would silently change meaning.  An entry no batch was registered
under yet is replaced freely (a declaration tried and taken back before any file landed).

The row index fingerprints a row by all its columns (:mod:`~incr.runtime.rowindex`); a
column added later counts only when it is not NULL, so the rows applied before it keep
their fingerprints and can still be deleted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from incr.compiler.program import TableDecl
from incr.errors import CompileError


@dataclass(frozen=True)
class Declared:
    """One declaration of a table: its columns (name, type, NOT NULL) from batch ``first`` on."""

    first: int
    columns: tuple[tuple[str, str, bool], ...]

    @property
    def names(self) -> set[str]:
        return {name.lower() for name, _, _ in self.columns}


class SchemaLog:
    """The declarations of one source table, oldest first."""

    def __init__(self, path: Path, table: str):
        self.path = path
        self.table = table
        self._entries: list[Declared] | None = None

    def entries(self) -> list[Declared]:
        if self._entries is None:
            if self.path.is_file():
                raw = json.loads(self.path.read_text())
                self._entries = [Declared(e["first"], tuple(tuple(c) for c in e["columns"]))
                                 for e in raw]
            else:
                self._entries = []
        return self._entries

    def added(self) -> frozenset[str]:
        """The (lower-case) names of columns declared after the first declaration."""
        entries = self.entries()
        if not entries:
            return frozenset()
        first = entries[0].names
        return frozenset(n for e in entries for n in e.names if n not in first)

    def absent_at(self, batch: int) -> frozenset[str]:
        """The columns a file registered as ``batch`` may lack (they were declared later)."""
        entries = self.entries()
        at = [e for e in entries if e.first <= batch]
        if not entries or not at:
            return frozenset()
        return frozenset(n for n in entries[-1].names if n not in at[-1].names)

    def record(self, decl: TableDecl, next_batch: int) -> bool:
        """Takes ``decl`` as the table's declaration from ``next_batch`` on; returns whether
        the log changed.

        Raises:
            CompileError: the declaration drops, retypes or tightens a column batches were
                registered with, or adds a NOT NULL column.
        """
        entries = self.entries()
        # The first declaration seen is the one every batch so far was registered with.
        now = Declared(next_batch if entries else 0,
                       tuple((c.name, str(c.type), c.not_null) for c in decl.columns))
        if entries and entries[-1].columns == now.columns:
            return False
        settled = [e for e in entries if e.first < next_batch]  # batches were registered under them
        if settled:
            self._check(settled[-1], now, decl)
        self._write(settled + [now])
        return True

    def _check(self, before: Declared, now: Declared, decl: TableDecl) -> None:
        had = {name.lower(): (name, type_, not_null) for name, type_, not_null in before.columns}
        has = {name.lower(): (name, type_, not_null) for name, type_, not_null in now.columns}
        where = (f"table {self.table} (batches from {before.first} on were registered with "
                 f"({', '.join(f'{n} {t}' for n, t, _ in before.columns)}))")
        for key, (name, type_, not_null) in had.items():
            if key not in has:
                raise CompileError(
                    f"column {name} of {where} is no longer declared; incr cannot drop a source "
                    f"column: the rows already applied were read with it. Declare it again (a "
                    f"view that does not read it is not affected by it), or declare a new table",
                    decl.location)
            _, new_type, new_not_null = has[key]
            if new_type != type_ or new_not_null != not_null:
                raise CompileError(
                    f"column {name} of {where} was declared {type_}"
                    f"{' NOT NULL' if not_null else ''} and is now {new_type}"
                    f"{' NOT NULL' if new_not_null else ''}; incr cannot retype a source column "
                    f"in place. Keep the declaration, convert in the views (CAST({name} AS "
                    f"{new_type})), or add the new form as a new nullable column", decl.location)
        for key, (name, _, not_null) in has.items():
            if key not in had and not_null:
                raise CompileError(
                    f"column {name} added to {where} is NOT NULL, but the files already "
                    f"registered have no value for it; declare it without NOT NULL (they read "
                    f"as NULL)", decl.location)

    def _write(self, entries: list[Declared]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps([{"first": e.first, "columns": [list(c) for c in e.columns]}
                                   for e in entries], indent=1))
        os.replace(tmp, self.path)  # atomic: a killed run leaves the old log or the new one
        self._entries = entries

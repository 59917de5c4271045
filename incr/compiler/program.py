"""Program files: ``CREATE TABLE`` declares a streaming source, ``CREATE VIEW`` a query to maintain.

A program is one ``.sql`` file.  Its name (the file stem) names its ledger and DAG.
Header comments of the form ``-- incr: key = value`` carry options; they must come
before the first statement::

    -- incr: dialect = duckdb
    -- incr: append_only = clicks, impressions
    -- incr: buckets = 16
    -- incr: schedule = @hourly
    -- incr: on_failure = alerts.incr:page_oncall

``schedule`` and ``on_failure`` are read by the Airflow DAG factory: the schedule is a
backstop beside the landed-file watcher, and ``on_failure`` names a function called with
Airflow's task context when a task of the program fails for good.

Everything here is parsing and checking; nothing is compiled yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as SqlglotParseError
from sqlglot.tokens import Token, TokenType

from incr.compiler.types import SqlType, sql_type_of
from incr.errors import CompileError, Location, ParseError


def _duckdb() -> str:
    """DuckDB's dialect at the version installed, the oracle's.

    sqlglot reads DuckDB's ``~`` as a full match before DuckDB 2.0 and as a partial one
    from it on, as DuckDB itself does: a program means what its oracle computes.
    """
    try:
        return f"duckdb, version={metadata.version('duckdb')}"
    except metadata.PackageNotFoundError:
        return "duckdb"


#: The dialect a program's SQL is read in when its header names ``duckdb`` (the default).
DUCKDB = _duckdb()

#: Options a program header may set, with their defaults.
DEFAULT_OPTIONS: dict[str, str] = {
    "dialect": "duckdb",
    "append_only": "",
    "buckets": "8",
    "schedule": "",
    "on_failure": "",
    "share": "on",
}

_HOOK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

_OPTION_LINE = re.compile(r"^\s*--\s*incr\s*:\s*(?P<key>[A-Za-z_]+)\s*=\s*(?P<value>.*?)\s*$")


@dataclass(frozen=True)
class Column:
    """A declared source column."""

    name: str
    type: SqlType
    not_null: bool = False


@dataclass(frozen=True)
class TableDecl:
    """A streaming source: files land in ``LANDING/<name>/`` (and ``_deletes/``)."""

    name: str
    columns: tuple[Column, ...]
    location: Location
    append_only: bool = False

    def column(self, name: str) -> Column | None:
        """Returns the column called ``name`` (case-insensitive), or None."""
        for col in self.columns:
            if col.name.lower() == name.lower():
                return col
        return None


@dataclass(frozen=True)
class IterateDecl:
    """The parts of an iterative view: ``X ← initial; repeat iterations times: X ← step(X)``.

    Written as::

        CREATE VIEW x (k BIGINT, v DOUBLE) AS ITERATE
          INITIAL (SELECT ...)          -- X0, over declared tables or constants
          STEP (SELECT ... FROM s ... x ...)   -- reads the previous iterate by the view's name
          ITERATIONS n [TOLERANCE t];

    The column list types the iterate; its first column is the iterate's key.
    """

    columns: tuple[Column, ...]
    initial: str
    iterations: int
    tolerance: float = 0.0
    initial_line: int = 1
    initial_offset: int = 0


@dataclass(frozen=True)
class ViewDecl:
    """A maintained query; its name is the answer table's name."""

    name: str
    select: str  # the SELECT, as written, in the program dialect (an iteration's STEP)
    location: Location
    select_line: int = 1  # line of the SELECT's first character in the program file
    select_offset: int = 0  # character offset of the SELECT in the program file
    iterate: IterateDecl | None = None  # set for an iterative view
    step: bool = False  # an iterative view's STEP, compiled as a view of its own


@dataclass(frozen=True)
class Options:
    """Program-level options from the header."""

    dialect: str = DUCKDB
    append_only: frozenset[str] = frozenset()
    buckets: int = 8
    schedule: str | None = None
    on_failure: str | None = None  # package.module:function, called when a DAG task fails
    share: bool = True  # views over the same source keep one state where they can (share pass)
    #: ``share = rollup``: a view grouped by some of another's keys is also computed from
    #: that view's state, regrouped (BRR and CMORR, see :mod:`~incr.compiler.passes.share`).
    rollup: bool = False


@dataclass(frozen=True)
class Program:
    """A parsed program file."""

    name: str
    path: str
    text: str
    options: Options
    tables: tuple[TableDecl, ...]
    views: tuple[ViewDecl, ...] = field(default_factory=tuple)

    def table(self, name: str) -> TableDecl | None:
        """Returns the declared table called ``name`` (case-insensitive), or None."""
        for table in self.tables:
            if table.name.lower() == name.lower():
                return table
        return None

    def declared(self, name: str) -> TableDecl:
        """Returns the declared table called ``name`` (case-insensitive); KeyError if none is."""
        table = self.table(name)
        if table is None:
            raise KeyError(name)
        return table

    def view(self, name: str) -> ViewDecl | None:
        """Returns the view called ``name`` (case-insensitive), or None."""
        for view in self.views:
            if view.name.lower() == name.lower():
                return view
        return None


def load_program(path: str | Path) -> Program:
    """Reads and parses a program file.

    Raises:
        ParseError: the file is missing, is not SQL, or holds statements other than
            ``CREATE TABLE`` / ``CREATE VIEW``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ParseError(f"cannot read program file: {e.strerror}", Location(str(p))) from e
    return parse_program(text, str(p), name=p.stem)


def parse_program(text: str, path: str = "<program>", name: str | None = None) -> Program:
    """Parses program text; see the module docstring for the format."""
    options = _parse_options(text, path)
    chunks = _split_statements(text, path, options.dialect)
    if not chunks:
        raise ParseError("the program has no statements; declare tables with CREATE TABLE "
                         "and queries with CREATE VIEW name AS SELECT ...", Location(path, 1))
    tables: list[TableDecl] = []
    views: list[ViewDecl] = []
    for chunk_text, line, offset in chunks:
        where = Location(path, line)
        if _ITERATIVE.match(chunk_text):
            views.append(_iterative_view(chunk_text, path, where, offset, options))
            continue
        statement = _parse_statement(chunk_text, path, line, offset, options.dialect)
        if isinstance(statement, exp.Create) and statement.kind == "TABLE":
            tables.append(_table_decl(statement, where, options))
        elif isinstance(statement, exp.Create) and statement.kind == "VIEW":
            views.append(_view_decl(statement, chunk_text, where, offset))
        else:
            raise ParseError(
                f"a program may only hold CREATE TABLE (sources) and CREATE VIEW (queries); "
                f"found {statement.key.upper()}", where)
    _check_names(tables, views, path)
    unknown = options.append_only - {t.name.lower() for t in tables}
    if unknown:
        raise ParseError(f"header option append_only names undeclared table(s): "
                         f"{', '.join(sorted(unknown))}", Location(path, 1))
    if not views:
        raise ParseError("the program declares no views; add CREATE VIEW name AS SELECT ...",
                         Location(path, 1))
    return Program(name=name or Path(path).stem, path=path, text=text, options=options,
                   tables=tuple(tables), views=tuple(views))


def _parse_options(text: str, path: str) -> Options:
    values = dict(DEFAULT_OPTIONS)
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            break  # options live in the header only
        m = _OPTION_LINE.match(line)
        if not m:
            continue
        key = m.group("key").lower()
        if key not in DEFAULT_OPTIONS:
            raise ParseError(f"unknown header option {key!r}; known options: "
                             f"{', '.join(sorted(DEFAULT_OPTIONS))}", Location(path, number))
        values[key] = m.group("value")
    dialect = values["dialect"].strip().lower()
    dialect = DUCKDB if dialect == "duckdb" else dialect
    try:
        sqlglot.Dialect.get_or_raise(dialect)
    except ValueError as e:
        raise ParseError(f"unknown SQL dialect {dialect!r} in header", Location(path, 1)) from e
    try:
        buckets = int(values["buckets"])
        if not 1 <= buckets <= 4096:
            raise ValueError
    except ValueError as e:
        raise ParseError(f"header option buckets must be an integer in 1..4096, "
                         f"got {values['buckets']!r}", Location(path, 1)) from e
    append_only = frozenset(t.strip().lower() for t in values["append_only"].split(",") if t.strip())
    hook = values["on_failure"].strip() or None
    if hook is not None and not _HOOK.match(hook):
        raise ParseError(f"header option on_failure must name a function as package.module:function, "
                         f"got {hook!r}", Location(path, 1))
    share = values["share"].strip().lower()
    if share not in ("on", "off", "rollup"):
        raise ParseError(f"header option share must be on, off or rollup, got "
                         f"{values['share']!r}", Location(path, 1))
    return Options(dialect=dialect, append_only=append_only, buckets=buckets,
                   schedule=values["schedule"].strip() or None, on_failure=hook,
                   share=share != "off", rollup=share == "rollup")


def _split_statements(text: str, path: str, dialect: str) -> list[tuple[str, int, int]]:
    """Splits program text at semicolons; returns (text, first line, char offset) per statement."""
    try:
        tokens = sqlglot.Dialect.get_or_raise(dialect).tokenize(text)
    except Exception as e:  # sqlglot raises TokenError with line info in the message
        raise ParseError(f"cannot tokenize the program: {e}", Location(path)) from e
    chunks: list[tuple[str, int, int]] = []
    start_tok = None
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if start_tok is not None:
                chunks.append((text[start_tok.start:tok.start], start_tok.line, start_tok.start))
            start_tok = None
        elif start_tok is None:
            start_tok = tok
    if start_tok is not None:
        chunks.append((text[start_tok.start:], start_tok.line, start_tok.start))
    return chunks


def _parse_statement(chunk: str, path: str, line: int, offset: int, dialect: str) -> exp.Expr:
    try:
        statement = sqlglot.parse_one(chunk, read=dialect)
    except SqlglotParseError as e:
        err = e.errors[0] if e.errors else {}
        rel_line = err.get("line") or 1
        desc = err.get("description") or str(e)
        raise ParseError(f"SQL syntax error: {desc}", Location(path, line + rel_line - 1,
                                                               err.get("col"))) from e
    shift_lines(statement, line - 1, offset)
    return statement


def shift_lines(tree: exp.Expr, lines: int, chars: int, cols: int = 0) -> None:
    """Makes node positions absolute in the file (sqlglot counts from the statement).

    ``cols`` is how many characters precede the statement on its first line
    (``CREATE VIEW v AS SELECT ...`` on one line): columns on that line move by it.
    """
    for node in tree.walk():
        meta = node.meta if node._meta else None  # node._meta: .meta would create empty dicts
        if meta and "line" in meta:
            if meta["line"] == 1 and "col" in meta:
                meta["col"] += cols
            meta["line"] += lines
            if "start" in meta:
                meta["start"] += chars
                meta["end"] += chars


def _table_decl(statement: exp.Create, where: Location, options: Options) -> TableDecl:
    schema = statement.this
    if statement.expression is not None:
        raise ParseError("CREATE TABLE ... AS SELECT is not a source declaration; declare the "
                         "columns, e.g. CREATE TABLE t (a BIGINT, b VARCHAR)", where)
    if not isinstance(schema, exp.Schema):
        raise ParseError("CREATE TABLE needs a column list, e.g. CREATE TABLE t (a BIGINT)", where)
    name = schema.this.name
    columns: list[Column] = []
    seen: set[str] = set()
    for coldef in schema.expressions:
        if not isinstance(coldef, exp.ColumnDef):
            raise ParseError(f"table {name}: only column definitions are supported in a source "
                             f"declaration, found {coldef.sql()}", where)
        col_where = _loc(coldef.this, where)
        cname = coldef.this.name
        if cname.lower() in seen:
            raise ParseError(f"table {name}: column {cname} is declared twice", col_where)
        if cname.startswith("_"):
            raise ParseError(f"table {name}: column names starting with '_' are reserved for "
                             f"incr's bookkeeping; rename {cname}", col_where)
        seen.add(cname.lower())
        kind = coldef.args.get("kind")
        if kind is None:
            raise ParseError(f"table {name}: column {cname} needs a type", col_where)
        try:
            sql_type = sql_type_of(kind)
        except ValueError as e:
            raise CompileError(f"table {name}: column {cname}: {e}", col_where) from e
        not_null = False
        for constraint in coldef.args.get("constraints") or []:
            ckind = constraint.kind
            if isinstance(ckind, exp.NotNullColumnConstraint) and not ckind.args.get("allow_null"):
                not_null = True
            else:
                raise ParseError(f"table {name}: column constraint {constraint.sql()} is not "
                                 f"supported (only NOT NULL is)", col_where)
        columns.append(Column(cname, sql_type, not_null))
    if not columns:
        raise ParseError(f"table {name} declares no columns", where)
    return TableDecl(name=name, columns=tuple(columns), location=where,
                     append_only=name.lower() in options.append_only)


def _view_decl(statement: exp.Create, chunk: str, where: Location, offset: int) -> ViewDecl:
    name = statement.this.name if isinstance(statement.this, exp.Table) else statement.this.sql()
    query = statement.expression
    if query is None:
        raise ParseError(f"view {name} has no query; write CREATE VIEW {name} AS SELECT ...", where)
    # Keep the SELECT exactly as written: the oracle and the error messages quote it.
    m = re.search(r"\bAS\s+", chunk, flags=re.IGNORECASE)
    start = m.end() if m else 0
    select_text = chunk[start:].rstrip()
    line = (where.line or 1) + chunk[:start].count("\n")
    return ViewDecl(name=name, select=select_text, location=where, select_line=line,
                    select_offset=offset + start)


_ITERATIVE = re.compile(r"\s*CREATE\s+VIEW\s+[^;]*?\bAS\s+ITERATE\b", re.IGNORECASE | re.DOTALL)
_ITERATE_SYNTAX = ("CREATE VIEW name (key TYPE, col TYPE, ...) AS ITERATE INITIAL (SELECT ...) "
                   "STEP (SELECT ... FROM ... name ...) ITERATIONS n [TOLERANCE t]")


def _iterative_view(chunk: str, path: str, where: Location, offset: int,
                    options: Options) -> ViewDecl:
    """Parses ``CREATE VIEW x (cols) AS ITERATE INITIAL (...) STEP (...) ITERATIONS n``."""
    tokens = sqlglot.Dialect.get_or_raise(options.dialect).tokenize(chunk)
    pos = 0

    def fail(message: str, tok: Token | None = None) -> ParseError:
        line = (where.line or 1) + (tok.line - 1 if tok is not None else 0)
        return ParseError(f"{message}; an iterative view is written {_ITERATE_SYNTAX}",
                          Location(path, line, tok.col if tok is not None else None))

    def word() -> str:
        return tokens[pos].text.upper() if pos < len(tokens) else ""

    def expect(*words: str) -> None:
        nonlocal pos
        for w in words:
            if word() != w:
                raise fail(f"expected {w}", tokens[pos] if pos < len(tokens) else tokens[-1])
            pos += 1

    def parenthesised() -> tuple[str, int]:
        """The text inside balanced parentheses starting at ``pos``, and its start offset."""
        nonlocal pos
        if pos >= len(tokens) or tokens[pos].token_type != TokenType.L_PAREN:
            raise fail("expected (", tokens[min(pos, len(tokens) - 1)])
        depth, start = 0, tokens[pos].end + 1
        while pos < len(tokens):
            kind = tokens[pos].token_type
            depth += kind == TokenType.L_PAREN
            depth -= kind == TokenType.R_PAREN
            if depth == 0:
                text = chunk[start:tokens[pos].start]
                pos += 1
                return text, start
            pos += 1
        raise fail("unbalanced parentheses", tokens[-1])

    expect("CREATE", "VIEW")
    name = tokens[pos].text
    pos += 1
    columns_text, _ = parenthesised() if pos < len(tokens) and \
        tokens[pos].token_type == TokenType.L_PAREN else ("", 0)
    if not columns_text.strip():
        raise fail(f"iterative view {name} needs its columns and types, e.g. "
                   f"CREATE VIEW {name} (k BIGINT, v DOUBLE)", tokens[min(pos, len(tokens) - 1)])
    create = _parse_statement(f"CREATE TABLE {name} ({columns_text})", path, where.line or 1, offset,
                              options.dialect)
    if not isinstance(create, exp.Create):
        raise fail(f"iterative view {name}: its column list is not a list of columns and types")
    decl = _table_decl(create, where, options)
    expect("AS", "ITERATE", "INITIAL")
    initial, initial_at = parenthesised()
    expect("STEP")
    step, step_at = parenthesised()
    expect("ITERATIONS")
    try:
        iterations = int(tokens[pos].text)
        pos += 1
    except (IndexError, ValueError):
        raise fail("ITERATIONS takes a whole number", tokens[min(pos, len(tokens) - 1)]) from None
    tolerance = 0.0
    if word() == "TOLERANCE":
        pos += 1
        sign = ""
        if pos < len(tokens) and tokens[pos].token_type == TokenType.DASH:
            sign, pos = "-", pos + 1
        try:
            tolerance = float(sign + tokens[pos].text)
            pos += 1
        except (IndexError, ValueError):
            raise fail("TOLERANCE takes a number", tokens[min(pos, len(tokens) - 1)]) from None
    if pos < len(tokens):
        raise fail(f"unexpected {tokens[pos].text}", tokens[pos])
    if not 1 <= iterations <= 999:
        raise fail(f"ITERATIONS must be between 1 and 999, not {iterations}")
    if tolerance < 0:
        raise fail("TOLERANCE must not be negative")
    for text, at in ((initial, initial_at), (step, step_at)):
        _parse_statement(text, path, (where.line or 1) + chunk[:at].count("\n"), offset + at,
                         options.dialect)  # syntax errors point into the file
    return ViewDecl(name=name, select=step.strip(), location=where,
                    select_line=(where.line or 1) + chunk[:step_at].count("\n"),
                    select_offset=offset + step_at,
                    iterate=IterateDecl(columns=decl.columns, initial=initial.strip(),
                                        iterations=iterations, tolerance=tolerance,
                                        initial_line=(where.line or 1) + chunk[:initial_at].count("\n"),
                                        initial_offset=offset + initial_at))


def _check_names(tables: list[TableDecl], views: list[ViewDecl], path: str) -> None:
    seen: dict[str, Location] = {}
    items: list[TableDecl | ViewDecl] = [*tables, *views]
    for item in items:
        key = item.name.lower()
        if key in seen:
            raise ParseError(f"{item.name} is declared twice (first at line {seen[key].line})",
                             item.location)
        seen[key] = item.location
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", item.name):
            raise ParseError(f"name {item.name!r} must start with a letter and hold only letters, "
                             f"digits and underscores (it names directories and DAG tasks)",
                             item.location)


def _loc(node: exp.Expr | None, fallback: Location) -> Location:
    """The position of ``node`` in the program file, or ``fallback``."""
    meta = node.meta if node is not None and node._meta else None
    if meta and "line" in meta:
        return Location(fallback.path, meta["line"], meta.get("col"))
    return fallback


def location_of(node: exp.Expr, fallback: Location) -> Location:
    """Best-known position of ``node``: its own, else its first positioned descendant's."""
    for candidate in node.walk():
        loc = _loc(candidate, fallback)
        if loc is not fallback:
            return loc
    return fallback

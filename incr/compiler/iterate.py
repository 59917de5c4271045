"""Iterative views: the step of ``X ← initial; repeat n: X ← step(X, S)`` compiled as a view.

The seed paper's Algorithm 1 (§2, §8.2) splits the step into a homomorphism h and an answer
a and folds each new batch in with the diffusion ⊗̂ inside the loop.  Here the step is
compiled like any view, with the previous iterate X as one more input (a pseudo-source named
after the view, typed by the view's column list), so h, ⊗, ⊗̃, ⊗̂ and a come from the same
passes as every other view.  The runtime (``incr.runtime.iterate``) then runs the loop: a
change of X between two iterations is applied to the step's state like a batch of that
pseudo-source, so only the part of the state whose lineage meets the changed rows of X moves
(the right-outer-join diffusion: state rows that do not join ΔX are not touched).

X reaches the step in one of two ways:

* **joined** (``FROM edges e JOIN ranks r ON e.src = r.node``): the step keeps a side table
  of X like any join input; when X changes, the old rows that join the changed keys are
  re-evaluated through that side table, so the state stays exactly h(X, S).
* **looked up**: a scalar subquery that reads only X and picks one row by an order
  correlated with the outer row, ``(SELECT c.cid FROM centroids c ORDER BY dist(c, p) LIMIT 1)``
  (the paper's k-means "group by nearest centroid").  Every row depends on all of X, so
  re-evaluating old rows would cost a full pass per iteration; as in Algorithm 1 the old
  rows keep the value they were assigned when they arrived, and only the batch's rows are
  re-evaluated in each iteration.  Such rows can then not be deleted exactly, so a looked-up
  source must be declared ``append_only``.

The lookup becomes a column ``_lk<i>`` of the outer source (computed by Spark with an
array sort over X's rows); the step is rewritten to read that column.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sqlglot
from sqlglot import exp

from incr.compiler.dialect import SPARK, WEIGHT, q, render_expression
from incr.compiler.program import Column, Program, TableDecl, ViewDecl
from incr.compiler.types import FLOAT_TYPES, spark_type_name
from incr.errors import CompileError, Location, NotIncrementalizableError

#: Placeholder in a lookup's Spark expression for the array of X's rows (structs).
ITERATE_ARRAY = "{iterate}"
#: Column types whose values TOLERANCE applies to (integers always compare exactly).
TOLERANT_TYPES = FLOAT_TYPES | {"DECIMAL"}
#: Prefix of the temp views INITIAL reads its sources from.
INITIAL_SOURCE = "incr_initial_"


@dataclass(frozen=True)
class Lookup:
    """A scalar subquery over X, computed per row of ``table`` as column ``column``."""

    table: str
    column: str
    spark: str  # Spark SQL over the row's columns, with ITERATE_ARRAY for X's rows


@dataclass(frozen=True)
class Iteration:
    """What the runtime needs to run the loop of an iterative view."""

    name: str
    columns: tuple[Column, ...]
    initial: str  # INITIAL as Spark SQL, reading INITIAL_SOURCE + table name
    initial_written: str  # INITIAL as written (the oracle runs it)
    initial_tables: tuple[str, ...]
    iterations: int
    tolerance: float
    lookups: tuple[Lookup, ...]
    joined: bool  # whether some stage reads X as a join input

    @property
    def key(self) -> str:
        """The iterate's key column: the first of the view's column list."""
        return self.columns[0].name


def same_row_sql(iteration: Iteration, a: str, b: str) -> str:
    """Spark SQL: row ``a`` of the iterate stands for row ``b`` (ΔX leaves the pair alone).

    Same key, and every other column equal, except that with a TOLERANCE τ a floating or
    decimal value may differ by up to τ · max(|a|, |b|, 1).  The test is symmetric in ``a``
    and ``b``: ΔX is built from two anti-joins (new rows no old row stands for, old rows no
    new row stands for), and an asymmetric test could add a key's new row without removing
    its old one, or the reverse, leaving X with a key twice or not at all.  Integer columns
    (counts such as PageRank's out-degree) always compare exactly.
    """
    def col(alias: str, name: str) -> str:
        return f"{alias}.{q(name)}"

    key = iteration.key
    parts = [f"{col(a, key)} <=> {col(b, key)}"]
    for c in iteration.columns[1:]:
        x, y = col(a, c.name), col(b, c.name)
        if iteration.tolerance > 0 and c.type.name in TOLERANT_TYPES:
            parts.append(f"({x} <=> {y} OR abs({x} - {y}) <= {iteration.tolerance!r} * "
                         f"greatest(abs({x}), abs({y}), 1.0))")
        else:
            parts.append(f"{x} <=> {y}")
    return " AND ".join(parts)


def typed_sql(iteration: Iteration, sql: str) -> str:
    """``sql``'s rows cast to X's declared columns (the iterate's stored types)."""
    cols = ", ".join(f"CAST({q(c.name)} AS {spark_type_name(c.type)}) AS {q(c.name)}"
                     for c in iteration.columns)
    return f"SELECT {cols} FROM ({sql}) AS _t"


def initial_dx_sql(iteration: Iteration) -> str:
    """The first ΔX: INITIAL's rows, each inserted once (its sources are ``INITIAL_SOURCE*``)."""
    typed = typed_sql(iteration, iteration.initial)
    return f"SELECT *, CAST(1 AS BIGINT) AS {q(WEIGHT)} FROM ({typed}) AS _x0"


def dx_sql(iteration: Iteration, new: str, old: str) -> str:
    """ΔX = ``new`` ⊖ ``old``, the diffusion's frontier.

    Rows of the next iterate no old row stands for (+1) and the old rows they replace (-1),
    where "stands for" is :func:`same_row_sql` (TOLERANCE).  Each side is an anti-join
    against the rows that *are* stood for, found by an inner join on the key: the tolerance
    test is then a filter after a hash join, where as the anti-join's own condition it
    would make engines compare every pair of rows (DuckDB plans a nested-loop join).
    """
    same = same_row_sql(iteration, "n", "o")
    cols = [q(c.name) for c in iteration.columns]

    def side(keep: str, other: str, sign: int) -> str:
        first, second = (new, old) if keep == "n" else (old, new)
        stood = (f"SELECT DISTINCT {keep}.* FROM {first} {keep} JOIN {second} {other} "
                 f"ON {same}")
        whole = " AND ".join(f"{keep}.{c} <=> s.{c}" for c in cols)
        return (f"SELECT {keep}.*, CAST({sign} AS BIGINT) AS {q(WEIGHT)} FROM {first} {keep} "
                f"LEFT ANTI JOIN ({stood}) s ON {whole}")

    return f"{side('n', 'o', 1)}\nUNION ALL\n{side('o', 'n', -1)}"


def frontier_rows_sql(iteration: Iteration, x: str, touched: str,
                      keys: tuple[tuple[str, str], ...]) -> str:
    """The rows of iterate ``x`` that belong to the step's groups in ``touched``.

    ``keys`` pairs each answer column showing θ with its θ column (the step's per-group
    answer, :class:`~incr.compiler.publish.Publish`); X has the answer's columns.  With the
    step's answer over the same groups, this is the part of ``a(T) ⊖ X`` those groups can
    change: :func:`dx_sql` over the two is ΔX restricted to the frontier.
    """
    names = {c.name.lower(): c.name for c in iteration.columns}
    on = " AND ".join(f"x.{q(names[col.lower()])} <=> k.{q(theta)}" for col, theta in keys)
    return f"SELECT x.* FROM {x} AS x LEFT SEMI JOIN {touched} AS k ON {on}"


def apply_dx_sql(iteration: Iteration, x: str, dx: str) -> str:
    """X ⊕ ΔX: the rows of ``x`` whose key ΔX removes go, ΔX's new rows come."""
    key = q(iteration.key)
    cols = ", ".join(q(c.name) for c in iteration.columns)
    return (f"SELECT x.* FROM {x} x LEFT ANTI JOIN (SELECT * FROM {dx} WHERE "
            f"{q(WEIGHT)} < 0) d ON x.{key} <=> d.{key}\nUNION ALL\n"
            f"SELECT {cols} FROM {dx} WHERE {q(WEIGHT)} > 0")


def _lookup_join(iteration: Iteration, lookups: tuple[Lookup, ...], x: str,
                 alias: str) -> tuple[str, list[str]]:
    """The cross join giving each row X's rows as an array, and each lookup's expression."""
    fields = ", ".join(f"'{c.name}', {q(c.name)}" for c in iteration.columns)
    join = (f"CROSS JOIN (SELECT collect_list(named_struct({fields})) AS _xs FROM {x}) "
            f"AS {alias}")
    return join, [lk.spark.replace(ITERATE_ARRAY, f"{alias}._xs") for lk in lookups]


def extend_sql(iteration: Iteration, lookups: tuple[Lookup, ...], batch: str, x: str) -> str:
    """The batch with each lookup's column computed against iterate ``x``."""
    join, exprs = _lookup_join(iteration, lookups, x, "_ix")
    cols = ", ".join(f"{e} AS {q(lk.column)}" for lk, e in zip(lookups, exprs))
    return f"SELECT b.*, {cols} FROM {batch} b {join}"


def lookup_pairs_sql(iteration: Iteration, lookups: tuple[Lookup, ...], batch: str, x_old: str,
                     x_new: str) -> str:
    """The batch with each lookup against ``x_old`` (``_old<i>``) and ``x_new`` (``_new<i>``)."""
    join_old, old = _lookup_join(iteration, lookups, x_old, "_io")
    join_new, new = _lookup_join(iteration, lookups, x_new, "_in")
    pairs = ", ".join(f"{o} AS `_old{i}`, {n} AS `_new{i}`" for i, (o, n) in enumerate(zip(old, new)))
    return f"SELECT b.*, {pairs} FROM {batch} b {join_old} {join_new}"


def reassigned_sql(lookups: tuple[Lookup, ...], pairs: str, columns: list[str]) -> str:
    """The rows of ``pairs`` (:func:`lookup_pairs_sql`) whose lookups moved.

    Out (-1) with the old values, in (+1) with the new; ``columns`` are the batch's own.
    """
    base = ", ".join(q(c) for c in columns)
    changed = " OR ".join(f"NOT (`_old{i}` <=> `_new{i}`)" for i in range(len(lookups)))
    out = ", ".join(f"`_old{i}` AS {q(lk.column)}" for i, lk in enumerate(lookups))
    into = ", ".join(f"`_new{i}` AS {q(lk.column)}" for i, lk in enumerate(lookups))
    return (f"SELECT {base}, {out}, CAST(-1 AS BIGINT) AS {q(WEIGHT)} FROM {pairs} WHERE {changed}"
            f"\nUNION ALL\n"
            f"SELECT {base}, {into}, CAST(1 AS BIGINT) AS {q(WEIGHT)} FROM {pairs} WHERE {changed}")


def prepare(view: ViewDecl, program: Program) -> tuple[ViewDecl, Program, Iteration]:
    """Rewrites an iterative view's step into an ordinary view over sources and X.

    Returns the step as a view, the program it compiles against (X declared as a source,
    looked-up sources with their lookup columns) and the loop's description.
    """
    it = view.iterate
    assert it is not None
    where = Location(program.path, view.select_line)
    dialect = program.options.dialect
    name = view.name
    if program.table(name) is not None:
        raise CompileError(f"iterative view {name} has the name of a declared table", where)
    step = sqlglot.parse_one(view.select, read=dialect)
    for node in (step, *step.find_all(exp.Select)):
        if node is step and (node.args.get("order") or node.args.get("limit")):
            raise NotIncrementalizableError(
                f"iterative view {name}: ORDER BY / LIMIT on the STEP is not supported: the "
                f"step computes the next iterate, a set of rows keyed by {it.columns[0].name}",
                where)
    lookups: list[Lookup] = []
    extra: dict[str, list[Column]] = {}
    looked_up: dict[str, TableDecl] = {}
    for sub in list(step.find_all(exp.Subquery)):
        inner = sub.this
        if not _reads_only(inner, name):
            continue
        table, column, spark = _lookup(inner, sub, step, program, name, it.columns, where)
        col = f"_lk{len(lookups)}"
        lookups.append(Lookup(table.name, col, spark))
        looked = next(c for c in it.columns if c.name.lower() == column.lower())
        extra.setdefault(table.name.lower(), []).append(Column(col, looked.type))
        looked_up[table.name.lower()] = table
        alias = _outer_alias(sub, table.name)
        sub.replace(exp.column(col, table=alias))
    for decl in looked_up.values():
        if not decl.append_only:
            raise NotIncrementalizableError(
                f"iterative view {name}: rows of {decl.name} look up the iterate (a subquery over "
                f"{name} with ORDER BY ... LIMIT 1); as in the paper's Algorithm 1 they keep the "
                f"row they were assigned when they arrived, so they cannot be deleted exactly. "
                f"Declare the source insert-only: -- incr: append_only = {decl.name}", where)
    tables = []
    for t in program.tables:
        cols = tuple(extra.get(t.name.lower(), ()))
        # A looked-up source takes deletes internally (re-evaluation), so it is not append-only.
        tables.append(replace(t, columns=t.columns + cols, append_only=False) if cols else t)
    tables.append(TableDecl(name=name, columns=it.columns, location=view.location))
    step_program = replace(program, tables=tuple(tables))
    step_view = replace(view, select=step.sql(dialect=dialect), iterate=None, step=True)
    initial, initial_tables = _initial(it.initial, program, dialect, name,
                                       Location(program.path, it.initial_line))
    joined = any(t.name.lower() == name.lower() for t in step.find_all(exp.Table))
    return step_view, step_program, Iteration(
        name=name, columns=it.columns, initial=initial, initial_written=it.initial,
        initial_tables=initial_tables,
        iterations=it.iterations, tolerance=it.tolerance, lookups=tuple(lookups), joined=joined)


def check_output(iteration: Iteration, output: tuple[str, ...], where: Location) -> None:
    """The step must produce the iterate's columns, in order."""
    declared = tuple(c.name.lower() for c in iteration.columns)
    if tuple(o.lower() for o in output) != declared:
        raise CompileError(f"iterative view {iteration.name}: the STEP outputs "
                           f"({', '.join(output)}) but the view declares "
                           f"({', '.join(c.name for c in iteration.columns)}); name the step's "
                           f"columns like the view's, in the same order", where)


def _reads_only(query: exp.Expr, name: str) -> bool:
    tables = list(query.find_all(exp.Table))
    return bool(tables) and all(t.name.lower() == name.lower() for t in tables)


def _outer_alias(sub: exp.Subquery, table: str) -> str | None:
    select = sub.find_ancestor(exp.Select)
    for t in select.find_all(exp.Table) if select is not None else ():
        if t.name.lower() == table.lower() and t.find_ancestor(exp.Select) is select:
            return t.alias_or_name
    return None


def _lookup(inner: exp.Expr, sub: exp.Subquery, step: exp.Expr, program: Program,
            name: str, columns: tuple[Column, ...], where: Location
            ) -> tuple[TableDecl, str, str]:
    """Checks a subquery over X is a lookup and renders it for Spark; see the module doc."""
    def refuse(why: str) -> NotIncrementalizableError:
        return NotIncrementalizableError(
            f"iterative view {name}: subquery {sub.sql()[:80]} over the iterate: {why}; a "
            f"subquery over {name} must pick one row: (SELECT c.col FROM {name} c ORDER BY "
            f"<expression of c and the outer row> LIMIT 1)", where)

    if not isinstance(inner, exp.Select) or inner.args.get("joins") or inner.args.get("group") \
            or len(inner.expressions) != 1:
        raise refuse("it is not a single-column SELECT from the iterate alone")
    limit = inner.args.get("limit")
    if limit is None or limit.expression.sql() != "1" or not inner.args.get("order"):
        raise refuse("it has no ORDER BY ... LIMIT 1")
    x = inner.args["from_"].this
    x_alias = x.alias_or_name.lower()
    x_cols = {c.name.lower() for c in columns}
    picked = inner.expressions[0].unalias()
    if not (isinstance(picked, exp.Column) and picked.name.lower() in x_cols):
        raise refuse("it does not select a column of the iterate")
    outer = sub.find_ancestor(exp.Select)
    if outer is None:
        raise refuse("it is not inside a SELECT")
    outer_tables = [t for t in outer.find_all(exp.Table) if t.find_ancestor(exp.Select) is outer
                    and t.name.lower() != name.lower()]
    owners: dict[str, TableDecl] = {}

    def rewrite(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Column):
            return node
        q = node.table.lower() if node.table else None
        if q == x_alias or (q is None and node.name.lower() in x_cols and not any(
                (d := program.table(t.name)) is not None and d.column(node.name)
                for t in outer_tables)):
            return exp.Dot(this=exp.to_identifier("_c"), expression=exp.to_identifier(node.name))
        for t in outer_tables:
            decl = program.table(t.name)
            if decl is not None and (q in (t.alias_or_name.lower(), t.name.lower()) or q is None) \
                    and (column := decl.column(node.name)) is not None:
                owners[decl.name] = decl
                return exp.column(column.name)
        raise refuse(f"column {node.sql()} is neither the iterate's nor a declared source's")

    keys = []
    for i, ordered in enumerate(inner.args["order"].expressions):
        e = ordered.this.copy().transform(rewrite)
        if ordered.args.get("desc"):
            e = exp.Neg(this=exp.Paren(this=e))
        keys.append(f"'_o{i}', {render_expression(e, SPARK)}")
    where_ = inner.args.get("where")
    if where_ is not None:
        raise refuse("WHERE in the lookup is not supported; filter in the outer query")
    if len(owners) != 1:
        raise refuse("its ORDER BY must read the iterate and exactly one outer source")
    table = next(iter(owners.values()))
    spark = (f"try_element_at(array_sort(transform({ITERATE_ARRAY}, _c -> named_struct("
             f"{', '.join(keys)}, '_v', _c.{picked.name}))), 1)._v")
    return table, picked.name, spark


def _initial(text: str, program: Program, dialect: str, name: str,
             where: Location) -> tuple[str, tuple[str, ...]]:
    """INITIAL as Spark SQL reading each declared table from a temp view of the runtime's."""
    tree = sqlglot.parse_one(text, read=dialect)
    read: list[str] = []
    for t in tree.find_all(exp.Table):
        if t.name.lower() == name.lower():
            raise CompileError(f"iterative view {name}: INITIAL cannot read the iterate itself",
                               where)
        decl = program.table(t.name)
        if decl is None:
            if any(c.alias_or_name.lower() == t.name.lower()
                   for c in tree.find_all(exp.CTE)):
                continue
            raise CompileError(f"iterative view {name}: INITIAL reads unknown table {t.name}",
                               where)
        if decl.name not in read:
            read.append(decl.name)
        t.set("this", exp.to_identifier(INITIAL_SOURCE + decl.name.lower()))
        if not t.alias:
            t.set("alias", exp.TableAlias(this=exp.to_identifier(decl.name)))
    return render_expression(tree, SPARK), tuple(read)

"""Name resolution: every name in a block means one thing before the IR is built.

* Table names resolve to a declared source or an earlier stage (:func:`resolve_table`);
  for a nested query, sqlglot's ``qualify`` resolves every column to its table first
  (:func:`qualify_names`, run by ``decorrelate``, whose rules need qualified names).
* Columns of a one-input block lose their table qualifier and are spelled as declared
  (:func:`resolve_names`, the block step).  A join's columns are resolved by
  ``split_joins`` instead, to the joined relation's ``<alias>__<column>`` names.
* SELECT aliases and positions in GROUP BY, HAVING and ORDER BY stand for SELECT items
  (:func:`group_by_key`, :func:`inline_aliases`, :func:`order_by_target`).  These are
  applied by ``lower_block`` clause by clause, so that errors come in clause order.
* Output columns get DuckDB's names: the alias, the column's name, or a readable name made
  from the expression (:func:`select_items`, :func:`output_names`).

GROUP BY and ORDER BY read aliases differently, as DuckDB does: in GROUP BY a source column
wins over a SELECT alias of the same name, in ORDER BY the alias wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlglot import exp

from incr.compiler.frontend.query import Block, Scope, StageTranslation
from incr.compiler.frontend.trees import is_star
from incr.compiler.ir import Limit, Project, Rel
from incr.compiler.program import TableDecl
from incr.compiler.scalar import CANONICAL_DIALECT


def resolve_names(b: Block) -> Block:
    """Resolves the columns of a one-input block (or a UNION's SELECT) against its input.

    A join's columns were already resolved to flat names by ``split_joins``.

    Raises:
        CompileError: for an unknown qualifier or column.
    """
    if b.alias is not None:
        resolve_columns(b.scope, b.tree, b.alias, b.table)
    return b


# -- tables ---------------------------------------------------------------------------------
def check_tables(scope: Scope, tree: exp.Expr) -> None:
    """Every table a nested query reads is declared or one of its CTEs."""
    program = scope.program
    for table in tree.find_all(exp.Table):
        if table.name and not table.args.get("db") and program.table(table.name) is None \
                and not _is_cte_name(tree, table.name):
            declared = ", ".join(t.name for t in program.tables) or "none"
            raise scope.error(f"unknown table {table.name}; declared tables: {declared}", table)


def qualify_names(scope: Scope, tree: exp.Expr) -> exp.Expr:
    """Sqlglot's ``qualify`` over the declared tables: every column names its table.

    Raises:
        OptimizeError: when a name resolves nowhere (the caller words the message).
    """
    from sqlglot.optimizer.qualify import qualify

    return qualify(tree, schema=sqlglot_schema(scope), dialect=scope.program.options.dialect)


def sqlglot_schema(scope: Scope) -> dict[str, Any]:
    """The declared tables as sqlglot's schema mapping (table -> column -> type)."""
    return {t.name: {c.name: str(c.type) for c in t.columns} for t in scope.program.tables}


def resolve_table(scope: Scope, table_node: exp.Table,
                  derived: Mapping[str, StageTranslation]) -> TableDecl:
    """The declaration a FROM/JOIN table stands for: an earlier stage or a declared source.

    Raises:
        CompileError: for a qualified or unknown table name.
    """
    if table_node.meta.get("incr_stage"):
        stage = derived[table_node.meta["incr_stage"]]
        return TableDecl(stage.name, stage.output, scope.location)
    if table_node.args.get("db") or table_node.args.get("catalog"):
        raise scope.error(f"qualified table names are not supported: {table_node.sql()}",
                          table_node)
    table = scope.program.table(table_node.name)
    if table is None:
        declared = ", ".join(t.name for t in scope.program.tables) or "none"
        raise scope.error(f"unknown table {table_node.name}; declared tables: {declared}",
                          table_node)
    return table


def _is_cte_name(tree: exp.Expr, name: str) -> bool:
    return any(cte.alias_or_name.lower() == name.lower() for cte in tree.find_all(exp.CTE))


# -- columns --------------------------------------------------------------------------------
def resolve_columns(scope: Scope, tree: exp.Select, alias: str, table: TableDecl) -> None:
    """Strips table qualifiers and spells every source column as declared.

    Names that are not source columns are left alone here: in GROUP BY, HAVING and
    ORDER BY they may be SELECT aliases, resolved later.
    """
    aliases = {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}
    for col in list(tree.find_all(exp.Column)):
        qualifier = col.table
        if qualifier and qualifier.lower() not in {alias.lower(), table.name.lower()}:
            raise scope.error(f"unknown table or alias {qualifier} in {col.sql()}", col)
        declared = table.column(col.name)
        if declared is not None:
            resolved = exp.column(declared.name)
            resolved.this.meta.update(col.this.meta)  # keep the position for error messages
            col.replace(resolved)
        elif col.name in aliases and not qualifier:
            continue
        else:
            names = ", ".join(c.name for c in table.columns)
            raise scope.error(f"unknown column {col.name} in table {table.name} "
                              f"(columns: {names})", col)


def check_no_alias_refs(scope: Scope, node: exp.Expr, clause: str, table: TableDecl) -> None:
    """``clause`` may only read source columns, not SELECT aliases (WHERE, GROUP BY, ...)."""
    for col in node.find_all(exp.Column):
        if table.column(col.name) is None:
            raise scope.error(f"{clause} cannot refer to the SELECT alias {col.name} here", col)


# -- SELECT aliases and positions -----------------------------------------------------------
Items = list[tuple[str, exp.Expr]]


def select_items(tree: exp.Select, source: TableDecl) -> Items:
    """The SELECT list as (output name, expression), ``*`` expanded, names made unique."""
    items: Items = []
    used: set[str] = set()
    for node in tree.expressions:
        if is_star(node):
            for col in source.columns:
                items.append((unique(col.name, used), exp.column(col.name)))
            continue
        if isinstance(node, exp.Alias):
            name, inner = node.alias, node.this
        else:
            name, inner = default_name(node, len(items)), node
        items.append((unique(name, used), inner))
    return items


def _position(scope: Scope, node: exp.Expr, items: int, clause: str) -> int | None:
    """The 0-based SELECT item a position (``GROUP BY 2``) names; None when ``node`` is not one.

    Raises:
        CompileError: for a position outside the SELECT list.
    """
    if not (isinstance(node, exp.Literal) and node.is_int):
        return None
    pos = int(node.this)
    if not 1 <= pos <= items:
        raise scope.error(f"{clause} position {pos} is out of range "
                          f"(the SELECT list has {items} items)", node)
    return pos - 1


def group_by_key(scope: Scope, node: exp.Expr, items: Items, table: TableDecl) -> exp.Expr:
    """What a GROUP BY item stands for: a position or a SELECT alias is the SELECT item.

    A name that is a source column is that column, even when a SELECT alias has the same
    name.

    Raises:
        CompileError: for a position outside the SELECT list.
    """
    pos = _position(scope, node, len(items), "GROUP BY")
    if pos is not None:
        return items[pos][1]
    if isinstance(node, exp.Column) and table.column(node.name) is None:
        return dict(items)[node.name]
    return node


def inline_aliases(node: exp.Expr, items: Items, table: TableDecl) -> exp.Expr:
    """Replaces SELECT-alias references (DuckDB allows them in HAVING) by their expressions."""
    originals = dict(items)

    def swap(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and table.column(n.name) is None and n.name in originals:
            return originals[n.name].copy()
        return n

    return node.copy().transform(swap)


def order_by_target(scope: Scope, node: exp.Expr, outputs: Sequence[str]) -> int | exp.Expr:
    """What an ORDER BY item stands for: the index of a SELECT item, or ``node`` itself.

    A position or an unqualified output name (case-insensitive) is the SELECT item; an
    output name wins over a source column of the same name.

    Raises:
        CompileError: for a position outside the SELECT list.
    """
    pos = _position(scope, node, len(outputs), "ORDER BY")
    if pos is not None:
        return pos
    by_alias = {name.lower(): i for i, name in enumerate(outputs)}
    if isinstance(node, exp.Column) and node.name.lower() in by_alias and not node.table:
        return by_alias[node.name.lower()]
    return node


# -- output names ---------------------------------------------------------------------------
def output_names(tree: exp.Expr) -> tuple[str, ...]:
    """The view's column names as DuckDB would give them, read before a rewrite renames."""
    node = tree
    while isinstance(node, exp.SetOperation):
        node = node.this
    if isinstance(node, exp.Subquery):
        node = node.this
    if not isinstance(node, exp.Select):
        return ()
    names: list[str] = []
    used: set[str] = set()
    for i, item in enumerate(node.expressions):
        if is_star(item):
            return ()
        name = item.alias if isinstance(item, exp.Alias) else default_name(item, i)
        names.append(unique(name, used))
    return tuple(names)


def rename_outputs(stage: StageTranslation, names: Sequence[str]) -> StageTranslation:
    """The top stage with the view's own output names on its Project."""
    def rename(rel: Rel) -> Rel:
        if isinstance(rel, Project):
            return replace(rel, exprs=tuple(replace(e, name=n) for e, n in zip(rel.exprs, names)))
        if isinstance(rel, Limit):
            return replace(rel, child=rename(rel.child))
        return rel

    output = tuple(replace(c, name=n) for c, n in zip(stage.output, names))
    return replace(stage, rel=rename(stage.rel), output=output)


def default_name(node: exp.Expr, index: int) -> str:
    """A readable, Delta-safe column name for an unaliased SELECT item."""
    if isinstance(node, exp.Column):
        return str(node.name)
    text = re.sub(r"[^A-Za-z0-9]+", "_", node.sql(CANONICAL_DIALECT).lower()).strip("_")
    if not text or len(text) > 48 or text[0].isdigit():
        return f"col{index}"
    return text


def unique(name: str, used: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``, ... : the first not in ``used`` (case-insensitive).

    The suffixes are DuckDB's, as its CREATE TABLE AS gives a repeated column name.
    """
    candidate, n = name, 1
    while candidate.lower() in used:
        candidate = f"{name}_{n}"
        n += 1
    used.add(candidate.lower())
    return candidate

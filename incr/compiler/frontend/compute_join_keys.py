"""Join keys that are expressions: ``a.w = b.w - 53`` is an equi-join on a computed column.

``split_joins`` pairs columns: an equality between *expressions* of two inputs would leave
them unpaired, so they would be crossed (every change reading the other side whole).  Here
the expression becomes a column of its input: the table is read through a plain FROM
subquery that adds it, and the condition compares columns::

    FROM a JOIN b ON a.w = b.w - 53
    FROM a JOIN (SELECT k, w, y, w - 53 AS _jk0 FROM b) AS b ON a.w = b._jk0

A plain projection of one table is a stage that stores nothing (its change is computed from
the batch itself), so the join keeps its side tables bucketed by the key.  Only inner joins
(ON of an inner join, or WHERE) over declared tables, with every column qualified by its
table's alias, are rewritten; a SELECT with ``*`` is left alone (the added column would show).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

from sqlglot import exp

from incr.compiler.frontend.query import Query
from incr.compiler.frontend.trees import conjuncts, contains_aggregate, is_star, unqualified

#: Prefix of the columns holding computed join keys.
KEY = "_jk"


def compute_join_keys(q: Query) -> Query:
    """Rewrites equalities between expressions of two tables into equalities of columns."""
    numbers = count()
    for select in list(q.tree.find_all(exp.Select)):
        _rewrite(q, select, numbers)
    return q


def _rewrite(q: Query, select: exp.Select, numbers: Iterator[int]) -> None:
    items = [select.args["from_"].this] if select.args.get("from_") else []
    joins = select.args.get("joins") or []
    items += [j.this for j in joins]
    if len(items) < 2 or any(is_star(e) for e in select.expressions):
        return
    tables: dict[str, exp.Table] = {}
    for item in items:
        if isinstance(item, exp.Table) and not item.args.get("db") and \
                q.program.table(item.name) is not None:
            tables[item.alias_or_name.lower()] = item
    conds = conjuncts(select.args["where"].this) if select.args.get("where") else []
    for j in joins:
        if not j.args.get("side") and j.args.get("on") is not None:
            conds += conjuncts(j.args["on"])
    added: dict[str, list[tuple[str, exp.Expr]]] = {}
    for cond in conds:
        if not isinstance(cond, exp.EQ):
            continue
        sides = [_owner(side, tables) for side in (cond.this, cond.expression)]
        if None in sides or sides[0] == sides[1] or (
                isinstance(cond.this, exp.Column) and isinstance(cond.expression, exp.Column)):
            continue
        for side, alias in zip((cond.this, cond.expression), sides):
            if isinstance(side, exp.Column) or alias is None:
                continue
            name = f"{KEY}{next(numbers)}"
            added.setdefault(alias, []).append((name, unqualified(side)))
            side.replace(exp.column(name, table=alias))
    for alias, keys in added.items():
        table = tables[alias]
        decl = q.program.table(table.name)
        assert decl is not None
        columns = [exp.column(c.name, quoted=True) for c in decl.columns]
        inner = exp.select(*columns, *[exp.alias_(e, n) for n, e in keys]).from_(
            exp.Table(this=table.this.copy()))
        table.replace(exp.Subquery(this=inner, alias=exp.TableAlias(
            this=exp.to_identifier(alias))))


def _owner(side: exp.Expr, tables: dict[str, exp.Table]) -> str | None:
    """The one table alias every column of ``side`` names, or None."""
    if contains_aggregate(side) or side.find(exp.Select) is not None:
        return None
    owners = {c.table.lower() for c in side.find_all(exp.Column)}
    if len(owners) != 1 or "" in owners:
        return None
    owner = owners.pop()
    return owner if owner in tables else None

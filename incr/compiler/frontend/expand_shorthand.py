"""DuckDB's shorthand for aggregates and orders, written out in the forms the later steps maintain.

The shorthands a warehouse team writes every day have exact long forms made of
aggregates incr already keeps (counts, sums, MIN/MAX bags), so they are rewritten rather
than given state of their own:

- ``agg(x) FILTER (WHERE c)`` is ``agg(CASE WHEN c THEN x END)``: every supported aggregate
  skips NULLs, and a row the filter leaves out (``c`` false or NULL) is a NULL to it.  An
  aggregate of no rows and one of NULLs only agree (COUNT 0, the others NULL), so no group
  tells the two apart.  ``COUNT(*) FILTER (WHERE c)`` counts ``CASE WHEN c THEN 1 END``;
  ``COUNT(DISTINCT x) FILTER (...)`` counts the distinct ``CASE WHEN c THEN x END``.
- ``bool_or(x)`` and ``bool_and(x)`` are decided by two counts: NULL when no row has a
  non-NULL ``x`` (``COUNT(x) = 0``), else whether some row is true (``bool_or``) or no row
  is false (``bool_and``).  Counts have an inverse, so deletes cost what inserts do.  As a
  window function each count takes the window.
- ``count_if(x)`` (``countif``) is ``SUM(CASE WHEN x THEN 1 WHEN NOT x THEN 0 END)``: DuckDB
  sums the booleans as integers, so it is NULL where no ``x`` is non-NULL.  ``mean(x)`` is
  ``AVG(x)``.
- ``GROUP BY ALL`` groups by every SELECT item that reads a column and holds neither an
  aggregate nor a window function, as DuckDB reads it (an item mixing a column with an
  aggregate is then an ungrouped column, an error there and here; a constant is no key);
  with no such item it is a global aggregate, one row even over no rows.  Written as the
  items' positions, which the later steps resolve as any ``GROUP BY 1, 2``.
- ``ORDER BY ALL`` orders by every output column, left to right, each with the direction
  and NULLS placement written (``ORDER BY 1 DESC, 2 DESC``).

The output names are settled before (``name_outputs``), so a view's columns keep DuckDB's
names (``count_star() FILTER (WHERE ok)``, ``bool_or(ok)``).
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from incr.compiler.duckdb_calls import filled
from incr.compiler.frontend.query import Query, Scope
from incr.compiler.frontend.trees import func_name, is_star, window_function


def expand_shorthand(q: Query) -> Query:
    """Rewrites the view's shorthand in place (see the module's docstring).

    ``mean`` is AVG before filters are moved (a filtered ``mean`` is a filtered aggregate),
    and filters go before the counts, so that ``bool_or(x) FILTER (WHERE c)`` is a
    ``bool_or`` of the filtered values when its counts are written.

    Raises:
        CompileError: for ``GROUP BY ALL`` or ``ORDER BY ALL`` over ``SELECT *`` (its
            columns are not listed).
    """
    tree = q.tree
    for mean in list(tree.find_all(exp.Anonymous)):
        if func_name(mean) == "mean" and len(mean.expressions) == 1:
            mean.replace(exp.Avg(this=mean.expressions[0].copy()))
    for filtered in list(tree.find_all(exp.Filter)):
        if isinstance(filtered.this, exp.AggFunc):
            filtered.replace(_filtered(filtered.this, filtered.expression.this))
    for counted in list(tree.find_all(exp.LogicalOr, exp.LogicalAnd, exp.CountIf)):
        _replace_by_counts(counted)
    for select in tree.find_all(exp.Select):
        _group_by_all(q.scope, select)
    for query in tree.find_all(exp.Select, exp.SetOperation):
        _order_by_all(q.scope, query)
    return replace(q, tree=tree)


def _when(condition: exp.Expr, value: exp.Expr) -> exp.Case:
    return exp.Case(ifs=[exp.If(this=exp.paren(condition.copy(), copy=False), true=value)])


def _filtered(agg: exp.AggFunc, condition: exp.Expr) -> exp.AggFunc:
    """``agg`` over ``CASE WHEN condition THEN <its argument> END``."""
    agg = agg.copy()
    arg = agg.this
    if isinstance(agg, exp.Count) and (arg is None or isinstance(arg, exp.Star)):
        agg.set("this", _when(condition, exp.Literal.number(1)))
    elif isinstance(arg, exp.Distinct):
        arg.set("expressions", [_when(condition, e) for e in arg.expressions])
    elif arg is not None:
        agg.set("this", _when(condition, arg))
    return agg


#: The counts that decide each aggregate of booleans (``:x`` its argument).
_BY_COUNTS = {
    exp.LogicalOr: "CASE WHEN COUNT(:x) > 0 THEN COUNT(CASE WHEN (:x) THEN 1 END) > 0 END",
    exp.LogicalAnd: "CASE WHEN COUNT(:x) > 0 THEN COUNT(CASE WHEN (NOT (:x)) THEN 1 END) = 0 END",
    exp.CountIf: "SUM(CASE WHEN (:x) THEN 1 WHEN NOT (:x) THEN 0 END)",
}


def _replace_by_counts(node: exp.AggFunc) -> None:
    """Replaces ``node`` (or its window) by the counts that decide it (:data:`_BY_COUNTS`).

    As a window function, each count takes the window.
    """
    value = filled(_BY_COUNTS[type(node)], x=node.this)
    window = node.parent if isinstance(node.parent, exp.Window) and node.arg_key == "this" \
        else None
    if window is None:
        node.replace(value)
        return
    for count in list(value.find_all(exp.Count, exp.Sum)):
        over = window.copy()
        over.set("this", count.copy())
        if count is value:
            value = over
        else:
            count.replace(over)
    window.replace(value)


def _group_by_all(scope: Scope, select: exp.Select) -> None:
    group = select.args.get("group")
    if group is None or group.args.get("all") is not True:
        return
    if any(is_star(item) for item in select.expressions):
        raise scope.error("GROUP BY ALL over SELECT * groups by columns the view does not "
                          "list: list them in the SELECT", group)
    keys = [exp.Literal.number(i) for i, item in enumerate(select.expressions, 1)
            if _a_key(select, item)]
    select.set("group", exp.Group(expressions=keys) if keys else None)


def _order_by_all(scope: Scope, query: exp.Query) -> None:
    """``ORDER BY ALL [DESC] [NULLS ...]`` as every output column's position, left to right.

    Each takes the direction and NULLS placement written.
    """
    order = query.args.get("order")
    if order is None or len(order.expressions) != 1:
        return
    by = order.expressions[0]
    if not (isinstance(by.this, exp.Var) and by.this.name.upper() == "ALL"):
        return
    items = query.selects
    if any(is_star(item) for item in items):
        raise scope.error("ORDER BY ALL over SELECT * orders by columns the view does not "
                          "list: list them in the SELECT", order)
    keys = []
    for i in range(1, len(items) + 1):
        key = by.copy()
        key.set("this", exp.Literal.number(i))
        keys.append(key)
    order.set("expressions", keys)


def _a_key(select: exp.Select, item: exp.Expr) -> bool:
    """Whether GROUP BY ALL groups by ``item``, as DuckDB decides it.

    It does when the item reads a column of ``select``'s own FROM and holds no aggregate or
    window of ``select``'s own.  A constant such as ``'total' AS label`` is no key, so over
    no rows the view still answers a row.
    """
    own = [n for n in item.walk() if n.find_ancestor(exp.Select) is select]
    return any(isinstance(n, exp.Column) for n in own) and not any(
        isinstance(n, exp.Window) or (isinstance(n, exp.AggFunc) and not window_function(n))
        for n in own)

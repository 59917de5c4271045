"""Window functions: a SELECT with ``OVER (...)`` becomes a window stage over a plain query.

SQL evaluates window functions after FROM, WHERE, GROUP BY and HAVING, over the rows those
leave.  This step makes that order two query blocks::

    SELECT k, x, x / SUM(x) OVER (PARTITION BY k) AS share FROM t WHERE x > 0 ORDER BY k

becomes::

    SELECT k, x, x / SUM(x) OVER (PARTITION BY k) AS share
    FROM (SELECT k, x FROM t WHERE x > 0) AS _win ORDER BY k

The inner block is the query without its windows (its FROM, joins, WHERE, GROUP BY and
HAVING as written); it selects every item that holds no window under its own name, and
every value a window reads (a function's arguments, PARTITION BY and ORDER BY expressions,
an aggregate beside a window) as a column ``_win<i>``.  The outer block reads only
columns of the inner one; ``split_stages`` makes the inner block a stage of its own (one
that stores nothing when it is a plain filter of one table) and the outer block a *window
stage* (see :mod:`~incr.compiler.frontend.lower_block`): its rows are kept per window
partition, and a batch recomputes the windows of the partitions it touches only.

Ordering constraint: after ``decorrelate`` (whose subquery merging would fold the inner
block back into the outer one) and ``compute_join_keys``, before ``split_stages``.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from incr.compiler.frontend.query import Query, Scope
from incr.compiler.frontend.resolve_names import default_name, unique
from incr.compiler.frontend.trees import is_star

#: The alias of the inner block in the rewritten FROM.
INNER = "_win"
#: The prefix of the inner block's columns that only the windows read.
PUSHED = "_win"

#: Nodes that never become an inner column of their own (they are not values over rows).
_NOT_VALUES = (exp.DataType, exp.Identifier, exp.Var, exp.Literal, exp.Null, exp.Boolean,
               exp.Star, exp.Interval, exp.WindowSpec)


def split_windows(q: Query) -> Query:
    """Rewrites every SELECT whose items hold a window function (innermost first).

    Each becomes a window block over an inner block.

    Raises:
        NotIncrementalizableError: for windows with DISTINCT, ``*`` over a join, or a
            DISTINCT aggregate as a window function.
        CompileError: for a window inside an aggregate or another window.
    """
    tree = q.tree
    selects = [s for s in tree.find_all(exp.Select)
               if any(item.find(exp.Window) for item in s.expressions)]
    for select in reversed(selects):  # inner queries first
        outer = _split(q.scope, select)
        if select is tree:
            tree = outer
        else:
            select.replace(outer)
    return replace(q, tree=tree) if selects else q


def _split(scope: Scope, select: exp.Select) -> exp.Select:
    _check(scope, select)
    inner = select.copy()
    for arg in ("order", "limit", "offset", "with_"):
        inner.set(arg, None)
    pushed = _Pushed()
    star = any(is_star(item) for item in select.expressions)
    inner_items: list[exp.Expr] = []
    outer_items: list[exp.Expr] = []
    used: set[str] = set()
    names = []
    for i, item in enumerate(select.expressions):
        if is_star(item):
            names.append("*")
            continue
        body = item.this if isinstance(item, exp.Alias) else item
        names.append(unique(item.alias if isinstance(item, exp.Alias) else default_name(body, i),
                            used))
    pushed.used.update(used)
    # Window-free items first, under their own names: a window reading the same value reads them.
    for item, name in zip(select.expressions, names):
        if is_star(item):
            inner_items.append(item.copy())
            continue
        body = item.this if isinstance(item, exp.Alias) else item
        if not body.find(exp.Window):
            inner_items.append(exp.alias_(body.copy(), name, quoted=True))
            pushed.by_sql.setdefault(_key(body), name)
    for item, name in zip(select.expressions, names):
        if is_star(item):
            outer_items.append(exp.Star())
            continue
        body = item.this if isinstance(item, exp.Alias) else item
        if body.find(exp.Window):
            outer_items.append(exp.alias_(pushed.rewrite(body, star, scope), name, quoted=True))
        else:
            outer_items.append(exp.column(name, quoted=True))
    order = select.args.get("order")
    outer_order = None
    if order is not None:
        outer_order = order.copy()
        for ordered in outer_order.expressions:
            target = ordered.this
            if (isinstance(target, exp.Column) and not target.table
                    and target.name.lower() in {n.lower() for n in names}) or (
                    isinstance(target, exp.Literal) and target.is_int):
                continue  # an output name or position: the outer block binds it
            ordered.set("this", pushed.rewrite(target, star, scope))
    inner_items += [exp.alias_(node, name, quoted=True) for name, node in pushed.extra]
    if not inner_items:  # the windows read no value (COUNT(*) OVER ()): the rows still count
        inner_items.append(exp.alias_(exp.Literal.number(1), PUSHED, quoted=True))
    inner.set("expressions", inner_items)
    outer = exp.select(*outer_items).from_(exp.Subquery(
        this=inner, alias=exp.TableAlias(this=exp.to_identifier(INNER))))
    for arg in ("order", "limit", "offset", "with_"):
        value = outer_order if arg == "order" else select.args.get(arg)
        if value is not None:
            outer.set(arg, value if arg == "order" else value.copy())
    return outer


def _check(scope: Scope, select: exp.Select) -> None:
    if select.args.get("distinct") is not None:
        raise scope.refuse("SELECT DISTINCT with window functions", "DISTINCT applies to the "
                           "windows' results; select the window query in FROM and apply "
                           "DISTINCT (or GROUP BY) to it", select.args["distinct"])
    for item in select.expressions:
        for window in item.find_all(exp.Window):
            if any(w is not window for w in window.find_all(exp.Window)):
                raise scope.error("a window function cannot hold another window function", window)
            parent = window.parent
            while parent is not None and parent is not item:
                if isinstance(parent, exp.AggFunc):
                    raise scope.error("an aggregate cannot hold a window function; compute "
                                      "the window in a subquery", window)
                parent = parent.parent
            if isinstance(window.this, exp.AggFunc) and window.this.find(exp.Distinct):
                raise scope.refuse("a DISTINCT aggregate as a window function", "Spark does "
                                   "not compute it; count the distinct values per partition "
                                   "in a grouped subquery and join it", window)
    if any(is_star(item) for item in select.expressions) and select.args.get("joins"):
        raise scope.refuse("SELECT * beside a window function over a join", "list the "
                           "columns the view shows", select)


def _key(node: exp.Expr) -> str:
    return node.sql(dialect="duckdb")


class _Pushed:
    """The values the windows read, each an inner column (named once per distinct value)."""

    def __init__(self) -> None:
        self.by_sql: dict[str, str] = {}
        self.extra: list[tuple[str, exp.Expr]] = []
        self.used: set[str] = set()

    def column(self, node: exp.Expr, star: bool, scope: Scope) -> exp.Expr:
        """The inner column holding ``node``'s value (made on first use)."""
        key = _key(node)
        if key not in self.by_sql:
            if star:  # the inner block's * already selects every column by its name
                if not isinstance(node, exp.Column):
                    raise scope.refuse("an expression read by a window function beside SELECT *",
                                       "list the columns the view shows, or select the "
                                       "expression in a subquery", node)
                return exp.column(node.name, quoted=True)
            name = unique(f"{PUSHED}{len(self.extra)}", self.used)
            self.by_sql[key] = name
            self.extra.append((name, node.copy()))
        return exp.column(self.by_sql[key], quoted=True)

    def rewrite(self, node: exp.Expr, star: bool, scope: Scope) -> exp.Expr:
        """``node`` over inner columns.

        Every value it reads outside or inside a window becomes one; the window structure
        (function, partition, order, frame) stays.
        """
        tree = node.copy()
        if isinstance(tree, exp.Window):
            return self._window(tree, star, scope)
        if not tree.find(exp.Window):
            if isinstance(tree, _NOT_VALUES) or not tree.find(exp.Column, exp.AggFunc):
                return tree
            return self.column(tree, star, scope)
        self._arguments(tree, star, scope)
        return tree

    def _arguments(self, node: exp.Expr, star: bool, scope: Scope) -> None:
        """Rewrites every argument of ``node`` in place (see :meth:`rewrite`)."""
        for key, value in list(node.args.items()):
            if isinstance(value, exp.Expr):
                node.set(key, self.rewrite(value, star, scope))
            elif isinstance(value, list):
                node.set(key, [self.rewrite(v, star, scope) if isinstance(v, exp.Expr) else v
                               for v in value])

    def _window(self, window: exp.Window, star: bool, scope: Scope) -> exp.Expr:
        func = window.this
        while isinstance(func, (exp.IgnoreNulls, exp.RespectNulls)):
            func = func.this
        self._arguments(func, star, scope)
        window.set("partition_by", [self.rewrite(p, star, scope)
                                    for p in window.args.get("partition_by") or []])
        order = window.args.get("order")
        if order is not None:
            for ordered in order.expressions:
                ordered.set("this", self.rewrite(ordered.this, star, scope))
        return window

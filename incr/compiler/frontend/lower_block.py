"""One resolved query block to the relational IR of its stage.

Shape of the IR, for an aggregate query::

    Limit(Project(Sort(Filter[HAVING](Aggregate(Filter[WHERE](Source))))))

and for a plain SELECT (no aggregates)::

    Limit(Project(Sort(Filter[WHERE](Source))))

Absent clauses are simply absent.  Aggregate outputs are named ``_k<i>`` (keys) and
``_a<j>`` (aggregates); source columns never start with ``_``, so these cannot clash; the
Project gives the user's column names.  ``SELECT DISTINCT e1, e2`` is ``GROUP BY e1, e2``
with no aggregate.

The clauses are translated in the order WHERE, SELECT list, GROUP BY, SELECT items, HAVING,
ORDER BY, LIMIT, and so are their errors reported: a query with two mistakes gets the
message for the first one in that order.  SELECT aliases and positions are resolved here,
clause by clause, with the rules of :mod:`~incr.compiler.frontend.resolve_names`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sqlglot import exp

from incr.compiler.frontend.query import Block, Scope, StageTranslation
from incr.compiler.frontend.refuse_unsupported import agg_call
from incr.compiler.frontend.resolve_names import (
    Items,
    check_no_alias_refs,
    group_by_key,
    inline_aliases,
    order_by_target,
    select_items,
)
from incr.compiler.frontend.split_joins import as_written
from incr.compiler.frontend.trees import contains_aggregate, is_star
from incr.compiler.ir import (
    Aggregate,
    Filter,
    Limit,
    Named,
    NamedAgg,
    Project,
    Rel,
    Sort,
    SortKey,
    Source,
    Window,
)
from incr.compiler.program import Column, TableDecl
from incr.compiler.scalar import Scalar
from incr.compiler.types import SqlType, infer_type


def lower_block(b: Block) -> Block:
    """Builds the block's IR and sets ``b.stage``.

    Raises:
        NotIncrementalizableError: for DISTINCT with aggregates, or LIMIT/OFFSET in a
            nested query (which rows it keeps changes with every batch).
        CompileError: for misplaced aggregates, columns outside GROUP BY, bad positions
            and LIMIT values, ...
    """
    scope, tree, source = b.scope, b.tree, b.table
    aggregated = bool(tree.args.get("group")) or any(
        contains_aggregate(e) for e in tree.expressions) or tree.args.get("having") is not None
    if tree.args.get("distinct") is not None:
        aggregated = _distinct_as_group_by(scope, tree, aggregated)
    if b.name and (tree.args.get("limit") is not None or tree.args.get("offset") is not None):
        raise scope.refuse("LIMIT/OFFSET in a nested query", "which rows it keeps changes "
                           "with every batch; apply LIMIT to the view itself",
                           tree.args.get("limit") or tree.args.get("offset"))
    if b.name:
        tree.set("order", None)  # order inside a nested query means nothing
    flat_of = {i.flat(c): (i.alias, c) for branch in b.branches
               for i in branch.join.all_inputs for c in i.columns}
    lowering = _Lowering(scope, source, flat_of)
    if any(item.find(exp.Window) for item in tree.expressions):
        assert not aggregated, "split_windows moves GROUP BY and HAVING below the windows"
        rel = lowering.window_query(tree)
    else:
        rel = lowering.aggregate_query(tree) if aggregated else lowering.plain_query(tree)
    single_row = aggregated and not tree.args.get("group")
    stage = StageTranslation(b.name, rel, source, b.branches, aggregated, single_row,
                             lowering.output)
    return replace(b, stage=stage)


def _partition(exprs: tuple[Named, ...]) -> tuple[str, ...]:
    """The columns every window of ``exprs`` partitions by (in the first one's order)."""
    common: list[str] | None = None
    for e in exprs:
        for window in e.expr.tree().find_all(exp.Window):
            cols = [p.name for p in window.args.get("partition_by") or []
                    if isinstance(p, exp.Column)]
            common = cols if common is None else [c for c in common if c in cols]
    return tuple(common or ())


def type_of(expr: Scalar, source: TableDecl) -> SqlType:
    """The type of an output column, as far as sqlglot can tell (shown by explain)."""
    return infer_type(expr, source.name, source.columns)


def _distinct_as_group_by(scope: Scope, tree: exp.Select, aggregated: bool) -> bool:
    """SELECT DISTINCT e1, e2 is GROUP BY e1, e2 with no aggregate: a set kept as counts."""
    if aggregated:
        raise scope.refuse("SELECT DISTINCT with aggregates or GROUP BY", "drop DISTINCT "
                           "(select the GROUP BY keys to make rows distinct)",
                           tree.args["distinct"])
    if any(is_star(e) for e in tree.expressions):
        raise scope.error("SELECT DISTINCT * is not supported; list the columns",
                          tree.args["distinct"])
    keys = [(e.this if isinstance(e, exp.Alias) else e).copy() for e in tree.expressions]
    tree.set("distinct", None)
    tree.set("group", exp.Group(expressions=keys))
    return True


class _Lowering:
    """The translation of one block: the aggregates met so far and the output columns."""

    def __init__(self, scope: Scope, source: TableDecl,
                 flat_of: dict[str, tuple[str, str]] | None = None):
        """Starts the translation of one block.

        ``flat_of``: for a join, each joined-relation column ``<alias>__<column>`` as
        (alias, column), so messages name columns as the user wrote them.
        """
        self.scope = scope
        self.source = source
        self.flat_of = flat_of or {}
        self.aggs: dict[str, NamedAgg] = {}
        self.output: tuple[Column, ...] = ()

    # -- plain SELECT --------------------------------------------------------------------
    def plain_query(self, tree: exp.Select) -> Rel:
        rel: Rel = self._where(tree)
        items = select_items(tree, self.source)
        exprs = tuple(Named(name, Scalar.of(node)) for name, node in items)
        for _, node in items:
            check_no_alias_refs(self.scope, node, "SELECT", self.source)
        self.output = tuple(Column(n.name, type_of(n.expr, self.source)) for n in exprs)
        sort_keys = self._order_keys(tree, exprs, Scalar.of)
        if sort_keys:
            rel = Sort(rel, sort_keys)
        rel = Project(rel, exprs)
        return self._limit(tree, rel)

    # -- window SELECT (over the block split_windows split off) -------------------------
    def window_query(self, tree: exp.Select) -> Rel:
        """``Window`` over the source: its partition is what every window partitions by."""
        items = select_items(tree, self.source)
        exprs = tuple(Named(name, Scalar.of(node)) for name, node in items)
        self.output = tuple(Column(n.name, type_of(n.expr, self.source)) for n in exprs)
        sort_keys = self._order_keys(tree, exprs, Scalar.of)
        rel: Rel = Window(self._where(tree), _partition(exprs))
        if sort_keys:
            rel = Sort(rel, sort_keys)
        return self._limit(tree, Project(rel, exprs))

    # -- aggregate SELECT ----------------------------------------------------------------
    def aggregate_query(self, tree: exp.Select) -> Rel:
        rel: Rel = self._where(tree)
        if any(isinstance(e, exp.Star) for e in tree.expressions):
            raise self.scope.error("SELECT * cannot be combined with GROUP BY or aggregates",
                                   tree.expressions[0])
        items = select_items(tree, self.source)
        self.output = tuple(Column(name, type_of(Scalar.of(node), self.source))
                            for name, node in items)
        keys = self._group_keys(tree, items)
        key_names = {k.expr.sql: k.name for k in keys}

        def over_aggregate(node: exp.Expr, clause: str) -> Scalar:
            return self._over_aggregate(node, key_names, clause)

        exprs = tuple(Named(name, over_aggregate(node, "SELECT")) for name, node in items)
        having = tree.args.get("having")
        having_scalar = None
        if having is not None:
            having_scalar = over_aggregate(inline_aliases(having.this, items, self.source),
                                           "HAVING")
        sort_keys = self._order_keys(tree, exprs, lambda node: over_aggregate(node, "ORDER BY"))
        rel = Aggregate(rel, keys, tuple(self.aggs.values()))
        if having_scalar is not None:
            rel = Filter(rel, having_scalar)
        if sort_keys:
            rel = Sort(rel, sort_keys)
        rel = Project(rel, exprs)
        return self._limit(tree, rel)

    def _group_keys(self, tree: exp.Select, items: Items) -> tuple[Named, ...]:
        group = tree.args.get("group")
        if group is None:
            return ()
        keys: list[Named] = []
        seen: set[str] = set()
        for written in group.expressions:
            node = group_by_key(self.scope, written, items, self.source)
            if contains_aggregate(node):
                raise self.scope.error(f"GROUP BY cannot contain an aggregate: "
                                       f"{as_written(node, self.flat_of)}", node)
            check_no_alias_refs(self.scope, node, "GROUP BY", self.source)
            scalar = Scalar.of(node)
            if scalar.sql in seen:
                continue
            seen.add(scalar.sql)
            keys.append(Named(f"_k{len(keys)}", scalar))
        return tuple(keys)

    def _over_aggregate(self, node: exp.Expr, key_names: dict[str, str], clause: str) -> Scalar:
        """Rewrites an expression to read only group keys (_k<i>) and aggregates (_a<j>)."""
        tree = node.copy()

        def swap(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.AggFunc):
                call, arg = agg_call(self.scope, n)
                if arg is not None:
                    check_no_alias_refs(self.scope, arg, "an aggregate argument", self.source)
                for named in self.aggs.values():
                    if named.call == call:
                        return exp.column(named.name)
                name = f"_a{len(self.aggs)}"
                self.aggs[name] = NamedAgg(name, call)
                return exp.column(name)
            if not isinstance(n, (exp.Literal, exp.Identifier, exp.DataType, exp.Star)):
                key = key_names.get(Scalar.of(n).sql)
                if key is not None:
                    return exp.column(key)
            return n

        rewritten = tree.transform(swap)
        for col in rewritten.find_all(exp.Column):
            if not (col.name in self.aggs or col.name in key_names.values()):
                original = next((c for c in node.find_all(exp.Column) if c.name == col.name), node)
                raise self.scope.error(f"column {as_written(col, self.flat_of)} in {clause} "
                                       f"must appear in GROUP BY or be used inside an "
                                       f"aggregate", original)
        return Scalar.of(rewritten)

    # -- clauses shared by both shapes ---------------------------------------------------
    def _where(self, tree: exp.Select) -> Rel:
        rel: Rel = Source(self.source.name, tuple(c.name for c in self.source.columns))
        where = tree.args.get("where")
        if where is not None:
            if contains_aggregate(where.this):
                raise self.scope.error("aggregates are not allowed in WHERE; use HAVING", where)
            check_no_alias_refs(self.scope, where.this, "WHERE", self.source)
            rel = Filter(rel, Scalar.of(where.this))
        return rel

    def _order_keys(self, tree: exp.Select, exprs: tuple[Named, ...],
                    translate: Callable[[exp.Expr], Scalar]) -> tuple[SortKey, ...]:
        order = tree.args.get("order")
        if order is None:
            return ()
        keys: list[SortKey] = []
        outputs = [n.name for n in exprs]
        for ordered in order.expressions:
            target = order_by_target(self.scope, ordered.this, outputs)
            scalar = exprs[target].expr if isinstance(target, int) else translate(target)
            if not scalar.columns():  # a constant orders nothing (and Spark would read an
                continue              # integer as a position)
            descending = bool(ordered.args.get("desc"))
            nulls_first = ordered.args.get("nulls_first")
            keys.append(SortKey(scalar, descending, bool(nulls_first)))
        return tuple(keys)

    def _limit(self, tree: exp.Select, rel: Rel) -> Rel:
        limit = tree.args.get("limit")
        offset = tree.args.get("offset")
        if limit is None and offset is None:
            return rel
        count = self._int_clause(limit.expression if limit is not None else None, "LIMIT")
        skip = self._int_clause(offset.expression if offset is not None else None, "OFFSET")
        return Limit(rel, count, skip or 0)

    def _int_clause(self, node: exp.Expr | None, clause: str) -> int | None:
        if node is None:
            return None
        if isinstance(node, exp.Literal) and node.is_int and int(node.this) >= 0:
            return int(node.this)
        raise self.scope.error(f"{clause} must be a non-negative integer literal", node)

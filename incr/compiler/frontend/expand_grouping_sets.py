"""ROLLUP, CUBE and GROUPING SETS as a UNION ALL of one GROUP BY per grouping set.

``GROUP BY ROLLUP (a, b)`` groups the rows three ways: by ``(a, b)``, by ``(a)`` and by
``()``.  Each grouping set becomes one SELECT of a ``UNION ALL``: the same items, grouped by
that set, with every grouping expression outside the set replaced by a typed NULL and each
``GROUPING(...)`` by its bit mask (1 for an argument rolled up, first argument highest).
The grand total (the empty set) is a global aggregate, so like SQL it answers one row even
over no rows.  Elements combine as SQL says: ``GROUP BY c, ROLLUP (a, b)`` is the cross
product of ``{(c)}`` with ROLLUP's sets.

The union's branches go finest first, so that its column types come from a branch with no
NULL in place of a key.  The query's ORDER BY / LIMIT / OFFSET (and its WITH) move onto the
union; an ORDER BY must then name output columns (or repeat an item's expression).

When every aggregate combines from partial results (COUNT, SUM, MIN, MAX, AVG, VAR and
STDDEV, and COUNT(DISTINCT x) once x is a key of the finest grouping), the sets
are derived from one grouping by every key (seed 003's BRR rule, :func:`_derived`): a CTE
``_incr_fine`` is the only query over the source rows, a set holding every key reads its
rows as they are, and a coarser set re-aggregates them, so it keeps a row per group of the
finest grouping it covers instead of reading the source again.  Otherwise (another
DISTINCT aggregate, or a SUM/AVG/VAR/STDDEV of a floating-point value over a source with
deletions, whose partial sums would each be kept exactly by band) every branch is an
aggregation over the source of its own.  Either way each
branch is an ordinary stage, exact under deletes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import combinations, product

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError

from incr.compiler.dialect import CANONICAL_DIALECT
from incr.compiler.frontend.query import Query, Scope
from incr.compiler.frontend.resolve_names import (
    default_name,
    order_by_target,
    qualify_names,
    sqlglot_schema,
    unique,
)
from incr.compiler.frontend.trees import unqualified

#: The CTE of the finest grouping the sets are derived from (see :func:`_derived`).
FINE = "_incr_fine"
#: More grouping sets than this (a CUBE of seven columns) is refused: each is a stage.
MAX_SETS = 64

_KINDS = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}
#: The nodes a grouping expression can be (a column or an expression over columns).
_KEYED = (exp.Column, exp.Func, exp.Binary, exp.Paren, exp.Cast, exp.Case)


def expand_grouping_sets(q: Query) -> Query:
    """Rewrites every SELECT grouped by ROLLUP / CUBE / GROUPING SETS into a UNION ALL.

    Raises:
        NotIncrementalizableError: for more than :data:`MAX_SETS` sets, DISTINCT or an
            ORDER BY that names no output column.
    """
    tree = q.tree
    grouped = [s for s in tree.find_all(exp.Select) if _has_sets(s)]
    for select in reversed(grouped):  # inner queries first
        union = _expand(q.scope, select)
        if select is tree:
            tree = union
        else:
            select.replace(union)
    return replace(q, tree=tree) if grouped else q


def _has_sets(select: exp.Select) -> bool:
    group = select.args.get("group")
    return group is not None and any(isinstance(e, tuple(_KINDS)) for e in group.expressions)


def _expand(scope: Scope, select: exp.Select) -> exp.Expr:
    group = select.args["group"]
    sets = grouping_sets(scope, group)
    if len(sets) > MAX_SETS:
        raise scope.refuse(f"GROUP BY with {len(sets)} grouping sets",
                           f"each set is maintained as a query of its own; at most {MAX_SETS}",
                           group)
    if select.args.get("distinct") is not None:
        raise scope.refuse("SELECT DISTINCT with ROLLUP, CUBE or GROUPING SETS",
                           "group by the distinct columns instead", select)
    keys: dict[str, exp.Expr] = {}
    for s in sets:
        for e in s:
            keys.setdefault(_key(e), e)
    types = _key_types(scope, select, list(keys))
    names: list[str] = []
    used: set[str] = set()
    for i, item in enumerate(select.expressions):
        names.append(unique(item.alias if isinstance(item, exp.Alias) else default_name(item, i),
                            used))
    ordered = sorted(sets, key=len, reverse=True)
    derived = (_derived(select, ordered, keys, types, names)
               if len(sets) > 1 and not _floats_under_deletes(scope, select) else None)
    if derived is not None:
        branches, fine = derived
    else:
        branches, fine = [_branch(select, s, keys, types, names) for s in ordered], None
    union: exp.Expr = branches[0]
    for branch in branches[1:]:
        union = exp.Union(this=union, expression=branch, distinct=False)
    if len(branches) == 1:  # one set: an ordinary GROUP BY, its tail stays where it is
        for key in ("order", "limit", "offset", "with_"):
            if select.args.get(key) is not None:
                union.set(key, select.args[key])
        return union
    for key in ("limit", "offset", "with_"):
        if select.args.get(key) is not None:
            union.set(key, select.args[key])
    if fine is not None:  # the finest grouping, after the view's own CTEs it may read
        with_ = union.args.get("with_") or exp.With(expressions=[])
        with_.set("expressions", [*with_.expressions, exp.CTE(
            this=fine, alias=exp.TableAlias(this=exp.to_identifier(FINE)))])
        union.set("with_", with_)
    if select.args.get("order") is not None:
        union.set("order", _order_by_names(scope, select, names))
    return union


def grouping_sets(scope: Scope, group: exp.Group) -> list[list[exp.Expr]]:
    """The grouping sets of a GROUP BY, in SQL's order (a cross product of its elements)."""
    options: list[list[list[exp.Expr]]] = []
    for element in group.expressions:
        if isinstance(element, exp.Rollup):
            es = list(element.expressions)
            options.append([es[:i] for i in range(len(es), -1, -1)])
        elif isinstance(element, exp.Cube):
            es = list(element.expressions)
            options.append([list(c) for r in range(len(es), -1, -1)
                            for c in combinations(es, r)])
        elif isinstance(element, exp.GroupingSets):
            listed = []
            for item in element.expressions:
                if isinstance(item, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                    raise scope.refuse(f"{_KINDS[type(item)]} inside GROUPING SETS",
                                       "list the grouping sets it stands for", item)
                listed.append(list(item.expressions) if isinstance(item, exp.Tuple)
                              else [item.this] if isinstance(item, exp.Paren) else [item])
            options.append(listed)
        else:
            options.append([[element]])
    return [[e for part in combo for e in part] for combo in product(*options)]


def _key(node: exp.Expr) -> str:
    """How a grouping expression is recognised in the SELECT list.

    Its SQL with columns by bare name: ``t.a``, ``"a"`` and ``a`` are one key.
    """
    if isinstance(node, exp.Column):
        return node.name.lower()
    return unqualified(node, keep_quotes=False).sql().lower()


def _key_types(scope: Scope, select: exp.Select, keys: list[str]) -> dict[str, str]:
    """The SQL type of each grouping expression, where sqlglot can tell (for typed NULLs)."""
    from sqlglot.optimizer.annotate_types import annotate_types

    try:
        typed = annotate_types(qualify_names(scope, select.copy()), schema=sqlglot_schema(scope),
                               dialect=scope.program.options.dialect)
    except (OptimizeError, ValueError, KeyError):
        return {}
    group = typed.args.get("group")
    found: dict[str, str] = {}
    for node in group.find_all(*_KEYED) if group is not None else []:
        if node.type is not None and not node.type.is_type(exp.DataType.Type.UNKNOWN,
                                                           exp.DataType.Type.NULL):
            found.setdefault(_key(node), node.type.sql(scope.program.options.dialect))
    return {k: found[k] for k in keys if k in found}


def _floats_under_deletes(scope: Scope, select: exp.Select) -> bool:
    """True when floating-point sums would be combined from partials over a source with deletes.

    That is a SUM or AVG of a floating-point value (or of one whose type sqlglot cannot
    tell), or any VAR or STDDEV, over a table that takes deletions.
    Such a sum is kept exactly per binary band, and so would be each coarser set's sum of
    the finest groups' DOUBLE partials (for VAR and STDDEV three of them): their state and
    plans outgrow one aggregation per set over the rows themselves, which is what those
    sets get instead.
    """
    from sqlglot.optimizer.annotate_types import annotate_types

    tables = {t.name.lower() for t in select.find_all(exp.Table)}
    if all((d := scope.program.table(t)) is not None and d.append_only for t in tables):
        return False
    if any(select.find_all(*_SPREAD)):  # their partial sums are DOUBLE whatever x is
        return True
    try:
        typed = annotate_types(qualify_names(scope, select.copy()), schema=sqlglot_schema(scope),
                               dialect=scope.program.options.dialect)
    except (OptimizeError, ValueError, KeyError):
        return True
    floating = (exp.DataType.Type.UNKNOWN, exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE)
    return any(agg.this.type is None or agg.this.type.is_type(*floating)
               for agg in typed.find_all(exp.Sum, exp.Avg) if agg.this is not None)


def _branch(select: exp.Select, chosen: list[exp.Expr], keys: dict[str, exp.Expr],
            types: dict[str, str], names: list[str]) -> exp.Select:
    """The SELECT for one grouping set: keys outside it NULL, GROUPING() a constant."""
    kept = {_key(e) for e in chosen}
    branch = select.copy()
    for key in ("order", "limit", "offset", "with_"):
        branch.set(key, None)
    branch.set("group", exp.Group(expressions=[e.copy() for e in chosen]) if chosen else None)
    inside_aggregates = {id(n) for agg in branch.find_all(exp.AggFunc) for n in agg.walk()
                         if n is not agg}

    def substitute(node: exp.Expr) -> exp.Expr:
        if id(node) in inside_aggregates:
            return node
        if isinstance(node, exp.Grouping):
            bits = [0 if _key(a) in kept else 1 for a in node.expressions]
            return exp.Literal.number(int("".join(map(str, bits)) or "0", 2))
        key = _key(node) if isinstance(node, _KEYED) else None
        if key is not None and key in keys and key not in kept:
            null = exp.Null()
            return exp.Cast(this=null, to=exp.DataType.build(types[key])) if key in types else null
        return node

    items = []
    for item, name in zip(branch.expressions, names):
        body = item.this if isinstance(item, exp.Alias) else item
        items.append(exp.alias_(body.transform(substitute, copy=False), name, quoted=True))
    branch.set("expressions", items)
    having = branch.args.get("having")
    if having is not None:
        having.set("this", having.this.transform(substitute, copy=False))
    return branch


def _derived(select: exp.Select, sets: list[list[exp.Expr]], keys: dict[str, exp.Expr],
             types: dict[str, str], names: list[str]) -> tuple[list[exp.Select], exp.Select] | None:
    """The grouping sets derived from one grouping by every key (seed 003's BRR rule).

    The finest grouping keeps, per group, the partial results each aggregate is combined
    from (COUNT and SUM add up, MIN and MAX take theirs, AVG is a SUM over a COUNT, VAR and
    STDDEV combine counts, sums and squared deviations: :func:`_spread`); it is
    the only query over the source rows.  A set holding every key reads its rows as they
    are; a coarser set re-aggregates them, so its state holds a row per group of the finest
    grouping it covers, not per source row.  A COUNT(DISTINCT x) makes x a key of the
    finest grouping, counted by every set.  Returns (the branches, the finest grouping's
    SELECT), or None when an aggregate does not combine that way (a DISTINCT aggregate
    other than COUNT) or an item reads a column outside its aggregates and keys (the
    per-set branches then say what is wrong).
    """
    key_names = {k: f"_g{i}" for i, k in enumerate(keys)}
    partials: dict[str, str] = {}
    partial_nodes: list[exp.Expr] = []

    def partial(node: exp.Expr) -> exp.Column:
        sql = node.sql()
        if sql not in partials:
            partials[sql] = f"_p{len(partials)}"
            partial_nodes.append(exp.alias_(node.copy(), partials[sql]))
        return exp.column(partials[sql])

    # COUNT(DISTINCT x): the finest grouping is by x too, and a set counts the distinct x
    # of its rows (seed 003's CMORR rule); then no set reads the finest rows as they are.
    having = select.args.get("having")
    counted: dict[str, str] = {}
    for node in [*select.expressions, *([having] if having is not None else [])]:
        for agg in node.find_all(exp.Count):
            arg = agg.this
            if isinstance(arg, exp.Distinct) and len(arg.expressions) == 1:
                counted.setdefault(arg.expressions[0].sql(), f"_d{len(counted)}")

    def distinct(arg: exp.Expr) -> exp.Column | None:
        name = counted.get(arg.sql())
        return exp.column(name) if name is not None else None

    def over(node: exp.Expr, chosen: set[str] | None) -> exp.Expr | None:
        """``node`` over the finest grouping's columns.

        ``chosen``: the set's keys; None: the finest rows as they are.
        """
        failed = False

        def swap(n: exp.Expr) -> exp.Expr:
            nonlocal failed
            if isinstance(n, exp.Grouping):
                kept = set(keys) if chosen is None else chosen
                bits = [0 if _key(a) in kept else 1 for a in n.expressions]
                return exp.Literal.number(int("".join(map(str, bits)) or "0", 2))
            if isinstance(n, exp.AggFunc):
                combined = _combine(n, partial, distinct, chosen is None)
                failed = failed or combined is None
                return combined if combined is not None else n
            key = _key(n) if isinstance(n, _KEYED) else None
            if key is not None and key in keys:
                if chosen is not None and key not in chosen:
                    null = exp.Null()
                    return exp.Cast(this=null, to=exp.DataType.build(types[key])) \
                        if key in types else null
                return exp.column(key_names[key])
            return n

        out = node.copy().transform(swap)
        generated = set(key_names.values()) | set(partials.values()) | set(counted.values())
        if failed or any(c.name not in generated or c.table for c in out.find_all(exp.Column)):
            return None
        return out

    branches: list[exp.Select] = []
    for chosen_set in sets:
        chosen = {_key(e) for e in chosen_set}
        finest = chosen == set(keys) and not counted
        items = []
        for item, name in zip(select.expressions, names):
            body = over(item.this if isinstance(item, exp.Alias) else item,
                        None if finest else chosen)
            if body is None:
                return None
            items.append(exp.alias_(body, name, quoted=True))
        branch = exp.select(*items).from_(FINE)
        if not finest and chosen_set:
            branch = branch.group_by(*(exp.column(key_names[_key(e)]) for e in chosen_set))
        if having is not None:
            condition = over(having.this, None if finest else chosen)
            if condition is None:
                return None
            branch = branch.where(condition) if finest else branch.having(condition)
        branches.append(branch)
    fine = select.copy()
    for key in ("order", "limit", "offset", "with_", "having"):
        fine.set(key, None)
    by_sql: dict[str, exp.Expr] = {}
    for node in select.find_all(exp.Distinct):  # the DISTINCT arguments as written
        for arg in node.expressions:
            by_sql.setdefault(arg.sql(), arg)
    grouped = [*keys.values(), *(by_sql[sql] for sql in counted)]
    fine.set("expressions", [exp.alias_(e.copy(), key_names[k]) for k, e in keys.items()]
             + [exp.alias_(by_sql[sql].copy(), name) for sql, name in counted.items()]
             + partial_nodes)
    fine.set("group", exp.Group(expressions=[e.copy() for e in grouped]) if grouped else None)
    return branches, fine


def _combine(agg: exp.AggFunc, partial: Callable[[exp.Expr], exp.Column],
             distinct: Callable[[exp.Expr], exp.Column | None], finest: bool) -> exp.Expr | None:
    """An aggregate from the finest grouping's partial results (None: it has no such form).

    ``finest``: over one group's row of partials (a set holding every key), else over the
    rows of a coarser group.  ``distinct`` gives the finest grouping's column holding a
    COUNT(DISTINCT)'s argument.
    """
    inner = agg.this
    if isinstance(agg, exp.Count) and isinstance(inner, exp.Distinct) \
            and len(inner.expressions) == 1 and not finest:
        column = distinct(inner.expressions[0])
        return exp.Count(this=exp.Distinct(expressions=[column])) if column is not None else None
    if agg.find(exp.Distinct) or not isinstance(agg, (exp.Count, exp.Sum, exp.Min, exp.Max,
                                                      exp.Avg, *_SPREAD)):
        return None
    if isinstance(agg, _SPREAD) and not finest:
        return _spread(agg, partial)
    if isinstance(agg, exp.Avg):
        total: exp.Expr = partial(exp.Sum(this=agg.this.copy()))
        count: exp.Expr = partial(exp.Count(this=agg.this.copy()))
        if not finest:
            total, count = exp.Sum(this=total), exp.Sum(this=count)
        return exp.Div(this=exp.Cast(this=total, to=exp.DataType.build("DOUBLE")), expression=count)
    column = partial(agg)
    if finest:
        return column
    if isinstance(agg, exp.Count):  # a count over no rows is 0, not NULL
        return exp.func("COALESCE", exp.Sum(this=column), exp.Literal.number(0))
    return type(agg)(this=column)


#: VAR and STDDEV: combined from each finest group's count, sum and squared deviations.
_SPREAD = (exp.Variance, exp.VariancePop, exp.Stddev, exp.StddevSamp, exp.StddevPop)


def _spread(agg: exp.AggFunc, partial: Callable[[exp.Expr], exp.Column]) -> exp.Expr:
    """VAR_SAMP / VAR_POP / STDDEV_* of a coarser group from its finest groups' partials.

    Each finest group i keeps n_i = COUNT(x), s_i = SUM(x) and M2_i = VAR_POP(x) * n_i (its
    sum of squared deviations from its own mean, maintained exactly by the VAR monoid).
    The groups combine as in Chan et al.'s parallel form:
    ``M2 = Σ M2_i + Σ s_i²/n_i - (Σ s_i)²/n`` with ``n = Σ n_i``; then VAR_POP is M2 / n,
    VAR_SAMP M2 / (n - 1) (NULL below two values, as in SQL) and STDDEV its square root.
    """
    x = agg.this
    n = partial(exp.Count(this=x.copy())).sql()
    total = partial(exp.Sum(this=exp.Cast(this=x.copy(), to=exp.DataType.build("DOUBLE")))).sql()
    m2 = partial(exp.Mul(this=exp.VariancePop(this=x.copy()), expression=exp.Count(this=x.copy()))).sql()
    spread = (f"GREATEST(SUM({m2}) + SUM({total} * {total} / NULLIF({n}, 0)) "
              f"- SUM({total}) * SUM({total}) / NULLIF(SUM({n}), 0), CAST(0 AS DOUBLE))")
    sample = not isinstance(agg, (exp.VariancePop, exp.StddevPop))
    value = (f"CASE WHEN SUM({n}) > 1 THEN {spread} / (SUM({n}) - 1) END" if sample
             else f"{spread} / NULLIF(SUM({n}), 0)")
    if isinstance(agg, (exp.Stddev, exp.StddevSamp, exp.StddevPop)):
        value = f"SQRT({value})"
    return sqlglot.parse_one(value, read=CANONICAL_DIALECT)


def _order_by_names(scope: Scope, select: exp.Select, names: list[str]) -> exp.Order:
    """The ORDER BY of a grouping-sets query over the union's output names."""
    order = select.args["order"].copy()
    assert isinstance(order, exp.Order)
    by_expr = {}
    for item, name in zip(select.expressions, names):
        by_expr[_key(item.this if isinstance(item, exp.Alias) else item)] = name
    for ordered in order.expressions:
        term = ordered.this
        target = order_by_target(scope, term, names)  # a position or an output name
        if isinstance(target, int):
            name = names[target]
        elif _key(term) in by_expr:
            name = by_expr[_key(term)]
        else:
            raise scope.refuse("ORDER BY an expression that is not an output column, with "
                               "ROLLUP, CUBE or GROUPING SETS", "order by the output columns "
                               "(add the expression to the SELECT list)", term)
        ordered.set("this", exp.column(name, quoted=True))
    return order

"""Decorrelation: nested queries in WHERE and SELECT become joins with derived tables.

The rewrite is sqlglot's own optimizer rules, in the order sqlglot runs them:
``eliminate_subqueries`` turns FROM subqueries into CTEs, ``unnest_subqueries`` turns
subqueries in WHERE and SELECT into joins with grouped derived tables (a correlated
``x > (SELECT SUM(..) .. WHERE y.b = x.a)`` becomes a LEFT JOIN on a per-key aggregate;
``IN`` / ``EXISTS`` a LEFT JOIN on the distinct keys with ``IS NOT NULL``), and
``merge_subqueries`` folds simple ones back into their parent.  They need every name
qualified, so :func:`~incr.compiler.frontend.resolve_names.qualify_names` runs first.

Around them, this step:

* rewrites an uncorrelated ``x NOT IN (S)`` WHERE conjunct into NOT EXISTS plus two
  one-row counts before qualification (:func:`rewrite_not_in`; sqlglot leaves NOT IN alone,
  and its NULL semantics need the counts);
* rewrites subqueries correlated by comparisons, which sqlglot cannot unnest, into ones
  correlated by equalities only: an ``[NOT] EXISTS`` with one comparison beside its
  equalities reads per-key extremes (:func:`rewrite_compared_exists`), any other AND of
  comparisons the DISTINCT outer values it reads, joined in (:func:`rewrite_compared_correlation`);
* turns an uncorrelated EXISTS that is still standing into ``(SELECT COUNT(*) ...) > 0``, a
  one-row count that is crossed in;
* drops the ``TRUE`` conjuncts unnesting leaves behind;
* refuses what did not unnest: a correlation that is not an AND of comparisons with each
  side reading one query (sqlglot then builds ARRAY_AGG / lambdas), and IN (subquery)
  anywhere but a top-level WHERE conjunct.

A query with nothing nested (no subquery, CTE or set operation) is left as it is.  For a
nested one, the view's output names are recorded first (``Query.output_names``): the rules
rename columns, and ``split_stages`` puts the user's names back on the top stage.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sqlglot import exp
from sqlglot.errors import OptimizeError

from incr.compiler.frontend.query import Query
from incr.compiler.frontend.resolve_names import check_tables, output_names, qualify_names
from incr.compiler.frontend.trees import conjuncts
from incr.compiler.program import Program
from incr.compiler.scalar import CANONICAL_DIALECT


def decorrelate(q: Query) -> Query:
    """Rewrites a nested query's subqueries into joins; records its output names first.

    Raises:
        CompileError: for an unknown table, or a name sqlglot cannot resolve.
        NotIncrementalizableError: for a subquery that does not turn into a join.
    """
    if not nested(q.tree):
        return q
    from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
    from sqlglot.optimizer.merge_subqueries import merge_subqueries
    from sqlglot.optimizer.unnest_subqueries import unnest_subqueries

    scope, tree = q.scope, q.tree
    names = output_names(tree)
    check_tables(scope, tree)
    # Rewritten nodes lose their positions: refusals below point at the original ones.
    subqueries = [n for n in tree.walk() if isinstance(n, (exp.Exists, exp.Subquery))
                  or (isinstance(n, exp.In) and n.args.get("query") is not None)]
    where_in = next((n for n in subqueries if isinstance(n, exp.In)), None)
    where_sub = next((n for n in subqueries if not isinstance(n, exp.In)), None)
    in_anchor = where_in.copy() if where_in is not None else None
    sub_anchor = where_sub.copy() if where_sub is not None else None
    inner = [n for n in subqueries if isinstance(n, exp.Subquery) and isinstance(n.this, exp.Select)
             and not isinstance(n.parent, (exp.From, exp.Join)) and correlated(n.this, q.program)]
    correlated_anchor = inner[0].copy() if inner else sub_anchor
    columns = [c.copy() for c in tree.find_all(exp.Column)]  # where names are written
    remember_join_conditions(tree)
    for negation in list(tree.find_all(exp.Not)):
        rewrite_not_in(negation, q.program)
    try:
        tree = qualify_names(scope, tree)
        rewritten = sum(rewrite_compared_exists(e, i) for i, e in enumerate(list(tree.find_all(exp.Exists))))
        rewritten += sum(rewrite_compared_correlation(s, i) for i, s in enumerate(_compared_subqueries(tree)))
        if rewritten:
            tree = qualify_names(scope, tree)  # the derived tables written are new scopes
        tree = merge_subqueries(unnest_subqueries(eliminate_subqueries(tree)))
        # An EXISTS still standing is uncorrelated: a one-row count, crossed in.
        exists = list(tree.find_all(exp.Exists))
        for standing in exists:
            count = exp.select(exp.Count(this=exp.Star()).as_("_n")).from_(exp.Subquery(
                this=standing.this.copy(), alias=exp.TableAlias(this=exp.to_identifier("_e"))))
            standing.replace(exp.GT(this=exp.Subquery(this=count), expression=exp.Literal.number(0)))
        if exists:
            tree = merge_subqueries(unnest_subqueries(tree))
        for where in list(tree.find_all(exp.Where)):  # unnesting leaves TRUE AND ...
            kept = [c for c in conjuncts(where.this) if not (isinstance(c, exp.Boolean) and c.this)]
            if not kept:
                where.pop()
            elif len(kept) != len(conjuncts(where.this)):
                where.set("this", exp.and_(*kept))
    except OptimizeError as e:
        message = re.sub(r"\. Line: \d+, Col: \d+", "", str(e))
        named = re.search(r"Column '([^']+)'", message)
        anchor = next((c for c in columns if named and c.name == named.group(1)), None)
        raise scope.error(f"{message} (names in a nested query must resolve to a declared "
                          f"table's column or an inner query's output)", anchor) from e
    for node in tree.walk():
        if isinstance(node, (exp.ArrayAgg, exp.Lambda)):
            raise scope.refuse(*_UNSPLIT, sub_anchor)
        if isinstance(node, exp.In) and node.args.get("query") is not None:
            negated = isinstance(node.parent, exp.Not)
            raise scope.refuse(f"{'NOT ' if negated else ''}IN (subquery) in this position",
                               "write it as NOT EXISTS (SELECT ... WHERE inner.k = outer.k), "
                               "which has no NULL surprises" if negated else
                               "IN (subquery) is maintained as a top-level WHERE condition",
                               in_anchor)
    unnested = _standing_correlated(tree)
    if unnested is not None:
        condition = unnested.args.get("where")
        outer_tests = [] if condition is None else \
            [c for c in conjuncts(condition.this) if _reads_outer(c, unnested)]
        if outer_tests and all(isinstance(c, exp.EQ) for c in outer_tests):
            raise scope.refuse("this correlated subquery (in HAVING, or with LIMIT, for instance)",
                               "only subqueries in WHERE or SELECT correlated by equalities "
                               "(inner.k = outer.k) turn into joins; compute the per-key values "
                               "as a grouped subquery in FROM and join it", correlated_anchor)
        raise scope.refuse(*_UNSPLIT, correlated_anchor)
    return replace(q, tree=tree, output_names=names)


#: The refusal of a correlation none of the rewrites takes: what it is, and what is taken.
_UNSPLIT = (
    ("correlated subquery whose correlation is not an AND of comparisons of an inner value "
     "with an outer one"),
    ("correlations like inner.k = outer.k AND inner.x < outer.y (=, <>, <, <=, >, >=; outer "
     "names from the enclosing query's FROM) turn into joins; write a comparison so that each "
     "side reads one query (inner.x - outer.y > 1 as inner.x > outer.y + 1)"))


def remember_join_conditions(tree: exp.Expr) -> None:
    """Keeps each JOIN ... ON conjunct's text and position as written, in its ``meta``.

    ``merge_subqueries`` renames the columns of a merged FROM subquery to its inner table's
    (``s.m`` becomes ``u.m``), and the new columns carry the inner query's positions; a
    refused join condition (``split_joins``) is quoted and located from what is kept here.
    """
    for join in tree.find_all(exp.Join):
        if join.args.get("on") is None:
            continue
        for c in conjuncts(join.args["on"]):
            c.meta["written"] = c.sql(CANONICAL_DIALECT)
            at = next((n.meta for n in c.walk() if n._meta and "line" in n.meta), None)
            if at is not None and "line" not in c.meta:
                c.meta["line"], c.meta["col"] = at["line"], at.get("col")


def _standing_correlated(tree: exp.Expr) -> exp.Select | None:
    """A subquery outside FROM that still reads the outer query's names after unnesting."""
    for sub in tree.find_all(exp.Subquery):
        if not isinstance(sub.parent, (exp.From, exp.Join)) and isinstance(sub.this, exp.Select) \
                and _reads_outer(sub.this, sub.this):
            return sub.this
    return None


def _reads_outer(node: exp.Expr, select: exp.Select) -> bool:
    """Whether ``node`` (inside ``select``, names qualified) reads a table ``select`` does not hold."""
    own = _own_names(select)
    return any(c.table and c.table.lower() not in own for c in node.find_all(exp.Column))


def _own_names(select: exp.Select) -> set[str]:
    """The table and derived-table names a query holds (lower case), nested ones included."""
    own = {t.alias_or_name.lower() for t in select.find_all(exp.Table)}
    return own | {s.alias.lower() for s in select.find_all(exp.Subquery) if s.alias}


def nested(tree: exp.Expr) -> bool:
    """True when the query holds subqueries, CTEs or set operations (the rewrite path)."""
    if not isinstance(tree, exp.Select) or tree.args.get("with_"):
        return True
    return any(isinstance(n, (exp.Select, exp.Subquery, exp.SetOperation)) and n is not tree
               for n in tree.walk())


def rewrite_not_in(node: exp.Not, program: Program) -> None:
    """``x NOT IN (S)`` as a WHERE conjunct, rewritten into shapes that unnest.

    SQL's NOT IN holds when S is empty, or when x is not NULL, S has no NULL and no row
    equal to x.  As conjuncts over a derived table ``_ni`` holding S's one column ``_v``::

        NOT EXISTS (SELECT 1 FROM S _ni WHERE _ni._v = x)
        AND ((SELECT COUNT(*) FROM S _ni) = 0
             OR (x IS NOT NULL AND (SELECT COUNT(*) FROM S _ni WHERE _ni._v IS NULL) = 0))

    The NOT EXISTS becomes an anti-join and the two counts one-row inputs.  Only an
    uncorrelated S (it reads none of the outer query's names) directly under WHERE/AND is
    rewritten; anything else is left for the refusal in :func:`decorrelate`.  It runs
    before qualification: the guess of :func:`correlated` reads the names as written.
    """
    inner = node.this.this if isinstance(node.this, exp.Paren) else node.this
    if not (isinstance(inner, exp.In) and isinstance(inner.args.get("query"), exp.Subquery)):
        return
    parent = node.parent
    while isinstance(parent, (exp.And, exp.Paren)):
        parent = parent.parent
    sub = inner.args["query"].this
    if not isinstance(parent, exp.Where) or not isinstance(sub, exp.Select) \
            or len(sub.expressions) != 1 or correlated(sub, program):
        return
    sub = sub.copy()
    sub.set("expressions", [exp.alias_(sub.expressions[0].unalias(), "_v")])
    x = inner.this

    def derived(where: exp.Expr | None, select: exp.Expr) -> exp.Select:
        q = exp.select(select).from_(exp.Subquery(this=sub.copy(), alias=exp.TableAlias(
            this=exp.to_identifier("_ni"))))
        return q.where(where) if where is not None else q

    v = exp.column("_v", table="_ni")
    count = exp.Count(this=exp.Star())
    match = exp.Not(this=exp.Exists(this=derived(exp.EQ(this=v, expression=x.copy()),
                                                 exp.Literal.number(1))))
    empty = exp.EQ(this=exp.Subquery(this=derived(None, count.copy())),
                   expression=exp.Literal.number(0))
    no_null = exp.EQ(this=exp.Subquery(this=derived(exp.Is(this=v.copy(), expression=exp.Null()),
                                                    count.copy())),
                     expression=exp.Literal.number(0))
    rest = exp.Or(this=empty, expression=exp.Paren(this=exp.and_(
        exp.Not(this=exp.Is(this=x.copy(), expression=exp.Null())), no_null)))
    node.replace(exp.Paren(this=exp.and_(match, exp.Paren(this=rest))))


#: A comparison of an inner value with an outer one, as the extreme of the inner values
#: that decides whether some row passes: ``x > o`` for some x iff ``MAX(x) > o``.
_EXTREME: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.GT: exp.Max, exp.GTE: exp.Max, exp.LT: exp.Min, exp.LTE: exp.Min}
_FLIPPED: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.NEQ: exp.NEQ}


def rewrite_compared_exists(exists: exp.Exists, number: int) -> bool:
    """``[NOT] EXISTS`` correlated by equalities plus one comparison, as a join.

    TPC-H Q21's ``EXISTS (SELECT * FROM l2 WHERE l2.k = l1.k AND l2.s <> l1.s)`` has no
    join form as written: its correlation is not an equality.  Whether some inner row with
    the outer row's keys passes the comparison of its ``x`` with the outer ``o`` is decided
    by the extremes of ``x`` over those rows (NULLs aside), kept per key in a derived table
    ``_cmp<number>`` (the inner rows, their own filters applied, grouped by the equality
    keys) that the outer query LEFT JOINs on the keys:

    * ``x > o`` (``>=``) for some row iff ``MAX(x) > o``; ``<`` and ``<=`` by ``MIN``;
    * ``x <> o`` for some row iff ``MIN(x) <> o OR MAX(x) <> o``.

    The test is NULL when no row has the keys (or ``o`` is NULL), which is read as false,
    so NOT EXISTS holds then, as in SQL.  Runs on qualified names; a subquery of another
    shape is left as it is (and refused by name later).  Returns whether it rewrote.
    """
    sub, outer = exists.this, exists.parent_select
    if not isinstance(sub, exp.Select) or not sub.args.get("from_") or sub.args.get("group") \
            or sub.args.get("having") or sub.args.get("limit") or sub.args.get("where") is None \
            or not isinstance(outer, exp.Select) or not outer.args.get("from_"):
        return False
    equal: list[tuple[exp.Expr, exp.Expr]] = []
    compared, rest = [], []
    for c in conjuncts(sub.args["where"].this):
        sides = _split_sides(c, sub) if _reads_outer(c, sub) else None
        if not _reads_outer(c, sub):
            rest.append(c)
        elif isinstance(c, exp.EQ) and sides is not None:
            equal.append((sides[0], sides[1]))
        else:
            compared.append(c)
    if len(compared) != 1 or not equal or type(compared[0]) not in _FLIPPED:
        return False
    sides = _split_sides(compared[0], sub)
    if sides is None:
        return False
    x, o, op = sides
    alias = f"_cmp{number}"
    extremes = [exp.Min, exp.Max] if op is exp.NEQ else [_EXTREME[op]]
    derived = sub.copy()
    derived.set("expressions", [exp.alias_(inner.copy(), f"_k{i}") for i, (inner, _) in enumerate(equal)]
                + [exp.alias_(f(this=x.copy()), f"_{f.__name__.lower()}") for f in extremes])
    derived.set("where", exp.Where(this=exp.and_(*(c.copy() for c in rest))) if rest else None)
    derived.set("group", exp.Group(expressions=[inner.copy() for inner, _ in equal]))
    on = exp.and_(*(exp.EQ(this=exp.column(f"_k{i}", table=alias), expression=o_key.copy())
                    for i, (_, o_key) in enumerate(equal)))
    outer.join(exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias))),
               on=on, join_type="left", copy=False)
    tests = [(exp.NEQ if op is exp.NEQ else op)(
        this=exp.column(f"_{f.__name__.lower()}", table=alias), expression=o.copy()) for f in extremes]
    decided = tests[0] if len(tests) == 1 else exp.or_(*tests)
    exists.replace(exp.Paren(this=exp.func("COALESCE", exp.Paren(this=decided), exp.false())))
    return True


def _compared_subqueries(tree: exp.Expr) -> list[exp.Exists | exp.Subquery]:
    """The EXISTS and scalar subqueries (not FROM/JOIN sources), innermost first."""
    found = [n for n in tree.walk() if isinstance(n, exp.Exists) or (
        isinstance(n, exp.Subquery) and not isinstance(n.parent, (exp.From, exp.Join, exp.In)))]
    return [n for n in reversed(found) if isinstance(n.this, exp.Select)]


def rewrite_compared_correlation(node: exp.Exists | exp.Subquery, number: int) -> bool:
    """A subquery correlated by comparisons, rewritten to one correlated by equalities only.

    ``EXISTS (SELECT * FROM u WHERE u.k = t.k AND u.w > t.v AND u.w < t.g)`` or
    ``(SELECT SUM(u.w) FROM u WHERE u.k = t.k AND u.d < t.d)`` read outer values in
    comparisons, which have no join form.  But the subquery's answer depends only on the
    outer values it reads, so it is computed once per distinct tuple of them: a derived table
    ``_co<number>`` (``SELECT DISTINCT`` of those values over the outer input they come from,
    or over the outer FROM clause with its joins when they come from several) is joined into
    the subquery on its equalities, the comparisons read ``_co``'s columns,
    and the correlation becomes ``_co._c<i> = <outer value i>`` for every value, which
    unnests into a join as any equality correlation does.

    A NULL outer value fails every comparison it is in, so no ``_co`` row holding it passes,
    and its equality fails too: both forms find no inner rows then, as SQL does.  Only plain
    comparisons (``= <> < <= > >=``) whose sides read one query each, AND-ed, with every
    outer name from the enclosing query's FROM clause, are rewritten; anything else is left as it is and
    refused by name later.  Returns whether it rewrote.
    """
    sub, outer = node.this, node.parent_select
    where = sub.args.get("where")
    if where is None or not sub.args.get("from_") or not isinstance(outer, exp.Select) \
            or not outer.args.get("from_"):
        return False
    equal: list[tuple[exp.Expr, exp.Expr]] = []
    compared: list[tuple[exp.Expr, exp.Expr, type[exp.Expr]]] = []
    rest = []
    for c in conjuncts(where.this):
        if not _reads_outer(c, sub):
            rest.append(c)
            continue
        sides = _split_sides(c, sub)
        if sides is None:
            return False
        if sides[2] is exp.EQ:
            equal.append((sides[0], sides[1]))
        else:
            compared.append(sides)
    values = _distinct_values([o for _, o in equal] + [o for _, o, _ in compared])
    read = _outer_rows(values, outer, f"_ot{number}")
    if not compared or read is None:
        return False
    alias, renamed = f"_co{number}", read[1]
    items = [exp.alias_(_renamed(v, renamed), f"_c{i}") for i, v in enumerate(values)]
    distinct = exp.select(*items).from_(read[0][0]).distinct()
    for join in read[0][1:]:
        distinct.append("joins", join)
    slot = {v.sql(): exp.column(f"_c{i}", table=alias) for i, v in enumerate(values)}
    on = [exp.EQ(this=inner.copy(), expression=slot[o.sql()].copy()) for inner, o in equal]
    sub.join(exp.Subquery(this=distinct, alias=exp.TableAlias(this=exp.to_identifier(alias))),
             on=exp.and_(*on) if on else None, join_type=None if on else "cross", copy=False)
    tests = [op(this=x.copy(), expression=slot[o.sql()].copy()) for x, o, op in compared]
    links = [exp.EQ(this=slot[v.sql()].copy(), expression=v.copy()) for v in values]
    sub.set("where", exp.Where(this=exp.and_(*(c.copy() for c in rest), *tests, *links)))
    return True


def _distinct_values(values: list[exp.Expr]) -> list[exp.Expr]:
    """Outer values, each once (by their SQL text), in the order first read."""
    seen: dict[str, exp.Expr] = {}
    for v in values:
        seen.setdefault(v.sql(), v)
    return list(seen.values())


def _outer_rows(values: list[exp.Expr], outer: exp.Select,
                prefix: str) -> tuple[list[exp.Expr], dict[str, str]] | None:
    """The inputs of ``outer`` that ``values`` read, under fresh aliases.

    That is the one input they all read, or else the whole FROM clause with its joins (the
    FROM source first, then ``exp.Join`` nodes).  Returns them with the old-to-new alias map,
    or None when a value reads a name ``outer`` does not hold (an outer query further out).
    """
    tables = {c.table.lower() for v in values for c in v.find_all(exp.Column)}
    joins = list(outer.args.get("joins") or [])
    sources = [outer.args["from_"].this] + [j.this for j in joins]
    if any(not isinstance(s, (exp.Table, exp.Subquery)) for s in sources) \
            or any(j.args.get("using") for j in joins):
        return None
    held = [s.alias_or_name.lower() for s in sources]
    if not tables or not tables <= set(held):
        return None
    if len(tables) == 1:
        position = held.index(next(iter(tables)))
        kept: list[exp.Expr] = [sources[position].copy()]
        renamed = {held[position]: f"{prefix}_0"}
    else:
        kept = [sources[0].copy()] + [j.copy() for j in joins]
        renamed = {name: f"{prefix}_{i}" for i, name in enumerate(held)}
    for node in kept:
        source = node.this if isinstance(node, exp.Join) else node
        source.set("alias", exp.TableAlias(this=exp.to_identifier(renamed[source.alias_or_name.lower()])))
        if isinstance(node, exp.Join) and node.args.get("on") is not None:
            node.set("on", _renamed(node.args["on"], renamed))
    return kept, renamed


def _renamed(node: exp.Expr, renamed: dict[str, str]) -> exp.Expr:
    """A copy of ``node`` whose columns read the tables of ``renamed`` under their new names."""
    copy = node.copy()
    for col in copy.find_all(exp.Column):
        if col.table.lower() in renamed:
            col.set("table", exp.to_identifier(renamed[col.table.lower()]))
    return copy


def _split_sides(c: exp.Expr, sub: exp.Select) -> tuple[exp.Expr, exp.Expr, type[exp.Expr]] | None:
    """A comparison as (inner side, outer side, operator read inner-first).

    None when a side mixes inner and outer names or the comparison is of another kind.
    """
    if type(c) not in _FLIPPED and not isinstance(c, exp.EQ):
        return None
    left, right = c.this, c.expression
    outer_left, outer_right = _reads_outer(left, sub), _reads_outer(right, sub)
    inner_left = any(col.table and not _reads_outer(col, sub) for col in left.find_all(exp.Column))
    inner_right = any(col.table and not _reads_outer(col, sub) for col in right.find_all(exp.Column))
    op: type[exp.Expr] = type(c)
    if inner_left and not outer_left and outer_right and not inner_right:
        return left, right, op
    if inner_right and not outer_right and outer_left and not inner_left:
        return right, left, _FLIPPED.get(op, op)
    return None


def correlated(sub: exp.Select, program: Program) -> bool:
    """Whether a subquery reads a name from outside it (a guess made before qualification)."""
    own = _own_names(sub)
    columns = {c.name.lower() for t in sub.find_all(exp.Table)
               for decl in [program.table(t.name)] if decl is not None for c in decl.columns}
    for col in sub.find_all(exp.Column):
        if col.table and col.table.lower() not in own:
            return True
        if not col.table and col.name.lower() not in columns:
            return True
    return False

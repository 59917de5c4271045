"""Refuses, before anything is rewritten, the constructs that have no incremental form.

Every refusal is a :class:`~incr.errors.NotIncrementalizableError` that names the construct
and says why (and often what to write instead), located at the construct as the user wrote
it.  The checks run on the parsed tree, before decorrelation rewrites it, for two reasons:
the positions are still the user's, and the message can name the construct as written
(``ROLLUP``, ``OVER``, ``random()``) rather than whatever a rewrite turned it into.

Refusals that depend on where a construct sits once the query is split into stages (a
LIMIT inside a nested query, an outer join's condition, a correlation that is not an
equality) are made by the step that finds out: ``lower_block``, ``split_joins`` and
``decorrelate``.
"""

from __future__ import annotations

from sqlglot import exp

from incr.compiler.duckdb_calls import check as check_call
from incr.compiler.duckdb_scalars import refusal
from incr.compiler.frontend.query import Query, Scope
from incr.compiler.frontend.trees import contains_aggregate, func_name, window_function
from incr.compiler.ir import AggCall
from incr.compiler.scalar import CANONICAL_DIALECT, Scalar
from incr.errors import CompileError

#: Function names whose value changes from one evaluation to the next.
NON_DETERMINISTIC = frozenset({
    "random", "rand", "randn", "uuid", "gen_random_uuid", "now", "current_timestamp",
    "current_date", "current_time", "localtimestamp", "localtime", "get_current_time",
    "get_current_timestamp", "today", "transaction_timestamp", "nextval", "setseed",
    "current_timezone", "unix_timestamp", "monotonically_increasing_id", "spark_partition_id",
    "input_file_name", "shuffle",
})
_NON_DETERMINISTIC_NODES = (exp.Rand, exp.Randn, exp.Uuid, exp.CurrentTimestamp,
                            exp.CurrentDate, exp.CurrentTime, exp.CurrentDatetime)

SUPPORTED_AGGREGATES = ("COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM, AVG (MEAN), MIN, MAX, "
                        "STDDEV_SAMP, STDDEV_POP, VAR_SAMP, VAR_POP, BOOL_OR, BOOL_AND, COUNT_IF")
#: DuckDB's aggregates that sqlglot reads as calls of unknown functions: refused by name
#: (otherwise their argument would be taken for a column outside GROUP BY).  ``mean`` is
#: AVG (expand_shorthand).
UNSUPPORTED_BY_NAME = frozenset({
    "arbitrary", "arg_max_null", "arg_max_nulls_last", "arg_min_null", "arg_min_nulls_last",
    "bitstring_agg", "count_star", "entropy", "favg", "fsum", "histogram", "histogram_exact",
    "kahan_sum", "kurtosis_pop", "mad", "product", "reservoir_quantile", "sem",
    "sum_no_overflow", "sumkahan",
})


def refuse_unsupported(q: Query) -> Query:
    """Raises for the first unsupported construct of the view; returns ``q`` unchanged.

    In order: a statement that is not a query, functions and aggregates anywhere in the
    tree (:func:`check_nodes`), then each SELECT's clauses (:func:`check_shape`).

    Raises:
        NotIncrementalizableError: for a construct outside the maintained class.
        CompileError: when the view is not a SELECT at all.
    """
    tree = q.tree
    if not isinstance(tree, (exp.Select, exp.SetOperation)):
        raise q.scope.error(f"a view must be a SELECT, found {str(tree.key).upper()}", tree)
    check_nodes(q.scope, tree)
    for select in tree.find_all(exp.Select):
        check_shape(q.scope, select)
    return q


def check_nodes(scope: Scope, tree: exp.Expr) -> None:
    """Functions and aggregates with no incremental form, anywhere in the query."""
    for node in tree.walk():
        if node is tree:
            continue
        if isinstance(node, exp.Window):
            _check_window_place(scope, node)
        if isinstance(node, _NON_DETERMINISTIC_NODES) or (
                isinstance(node, exp.Func) and func_name(node) in NON_DETERMINISTIC):
            raise scope.refuse(f"non-deterministic function {func_name(node).upper()}()",
                               "its value changes between batches, so no maintained "
                               "answer could equal a recompute", node)
        if isinstance(node, exp.Trunc) and isinstance(node.args.get("decimals"), exp.Literal) \
                and node.args["decimals"].is_string:
            raise scope.error(f"{node.sql(dialect=CANONICAL_DIALECT)} truncates a number to "
                              f"decimals, not a date to a unit: write date_trunc('unit', x)", node)
        try:
            check_call(node)
        except CompileError as e:
            raise scope.error(e.message, node) from e
        refused = refusal(node)
        if refused is not None:
            raise scope.error(refused, node)
        if isinstance(node, (exp.LogicalOr, exp.LogicalAnd, exp.CountIf)):
            _check_boolean_aggregate(scope, node)  # expand_shorthand writes it as counts
        elif isinstance(node, exp.Anonymous) and func_name(node) in UNSUPPORTED_BY_NAME:
            raise scope.refuse(f"aggregate {func_name(node).upper()}",
                               f"supported aggregates are {SUPPORTED_AGGREGATES}", node)
        elif isinstance(node, exp.AggFunc) and not isinstance(node, exp.Grouping) \
                and not window_function(node):
            agg_call(scope, node)  # raises for unsupported aggregates


def _check_boolean_aggregate(scope: Scope, node: exp.AggFunc) -> None:
    """``bool_or``/``bool_and``/``count_if`` take one argument, no aggregate inside it."""
    name = {exp.LogicalOr: "BOOL_OR", exp.LogicalAnd: "BOOL_AND"}.get(type(node), "COUNT_IF")
    arg = node.this
    if arg is not None and arg.find(exp.Distinct):
        if isinstance(node, exp.CountIf):  # at most 1: the distinct values' trues
            raise scope.refuse(f"{name}(DISTINCT ...)", "only COUNT takes DISTINCT", node)
        raise scope.error(f"{name}(DISTINCT ...): drop the DISTINCT, which does not change "
                          "the answer", node)
    if arg is None or any(v for k, v in node.args.items() if k != "this"):
        raise scope.error(f"{name} takes one argument", node)
    if contains_aggregate(arg):
        raise scope.error(f"aggregates cannot be nested: {name}({arg.sql(CANONICAL_DIALECT)})",
                          node)


def _check_window_place(scope: Scope, window: exp.Window) -> None:
    """A window function belongs in a SELECT item, where ``split_windows`` maintains it.

    As SQL says: it is computed after WHERE, GROUP BY and HAVING.
    """
    node: exp.Expr = window
    while node.parent is not None and not isinstance(node.parent, exp.Select):
        node = node.parent
    if node.parent is None or node.arg_key != "expressions":
        raise scope.error("a window function (OVER ...) can only be a SELECT item or part "
                          "of one: windows are computed after WHERE, GROUP BY and HAVING "
                          "(ORDER BY may name the item's alias)", window)


def check_shape(scope: Scope, tree: exp.Select) -> None:
    """Clauses of one SELECT that have no incremental form."""
    distinct = tree.args.get("distinct")
    if distinct is not None and distinct.args.get("on"):
        raise scope.refuse("SELECT DISTINCT ON", "it keeps an arbitrary row per key; use "
                           "GROUP BY with MIN/MAX instead", distinct)
    for key in ("qualify", "windows", "laterals", "pivots", "connect", "prewhere", "sample"):
        if tree.args.get(key):
            raise scope.refuse(key.upper(), "it has no incremental form here", tree.args[key])
    from_ = tree.args.get("from_")
    if from_ is None:
        raise scope.refuse("SELECT without FROM", "a view must read a declared source", tree)
    for key, construct in (("pivots", "PIVOT"), ("sample", "TABLESAMPLE")):
        if from_.this.args.get(key):
            raise scope.refuse(construct, "it has no incremental form here", from_.this)
    if isinstance(from_.this, (exp.Unnest, exp.Values)) or (
            isinstance(from_.this, exp.Table) and isinstance(from_.this.this, exp.Func)):
        raise scope.refuse(f"{from_.this.key.upper()} in FROM", "a view must read declared "
                           "sources", from_.this)
    group = tree.args.get("group")
    if group is not None:
        # ROLLUP (k), CUBE and GROUPING SETS among the keys are expand_grouping_sets's and
        # GROUP BY ALL expand_shorthand's; MySQL's trailing WITH ROLLUP is neither.
        for key in ("rollup", "cube", "grouping_sets"):
            if group.args.get(key):
                raise scope.refuse(f"GROUP BY {key.upper().replace('_', ' ')}",
                                   "list the grouping expressions explicitly, or write "
                                   "ROLLUP (...) among them", group)
    sets = group is not None and any(isinstance(e, (exp.Rollup, exp.Cube, exp.GroupingSets))
                                     for e in group.expressions)
    grouping = next((g for item in tree.expressions for g in item.find_all(exp.Grouping)), None)
    if grouping is not None and not sets:
        raise scope.error("GROUPING() needs GROUP BY ROLLUP, CUBE or GROUPING SETS", grouping)


def agg_call(scope: Scope, node: exp.AggFunc) -> tuple[AggCall, exp.Expr | None]:
    """Maps a sqlglot aggregate to an AggCall, refusing the unsupported ones.

    Returns the call and its argument as written (None for ``COUNT(*)``), so that the
    caller can check the argument's names with their positions.  ``refuse_unsupported``
    calls this on every aggregate of the parsed tree, so that an unsupported aggregate is
    refused by name before anything else is reported.

    Raises:
        NotIncrementalizableError: for an aggregate (or a form of one) with no monoid here.
        CompileError: for a missing argument or a nested aggregate.
    """
    arg = node.this
    distinct = isinstance(arg, exp.Distinct)
    if distinct:
        if len(arg.expressions) != 1:
            raise scope.refuse(f"{node.sql(CANONICAL_DIALECT)}", "DISTINCT over several "
                               "columns; count a single expression", node)
        arg = arg.expressions[0]
    if isinstance(node, exp.Count):
        if isinstance(arg, exp.Star) or arg is None:
            return AggCall("count_star"), None
        func = "count_distinct" if distinct else "count"
    elif distinct:
        raise scope.refuse(f"{type(node).__name__.upper()}(DISTINCT ...)",
                           "only COUNT takes DISTINCT", node)
    elif isinstance(node, exp.Sum):
        func = "sum"
    elif isinstance(node, exp.Avg):
        func = "avg"
    elif isinstance(node, exp.Min):
        func = "min"
    elif isinstance(node, exp.Max):
        func = "max"
    elif isinstance(node, (exp.Stddev, exp.StddevSamp)):
        func = "stddev_samp"
    elif isinstance(node, exp.StddevPop):
        func = "stddev_pop"
    elif isinstance(node, exp.Variance):
        func = "var_samp"
    elif isinstance(node, exp.VariancePop):
        func = "var_pop"
    else:
        raise scope.refuse(f"aggregate {func_name(node).upper()}",
                           f"supported aggregates are {SUPPORTED_AGGREGATES}", node)
    extra = [k for k, v in node.args.items() if k != "this" and v]
    if extra and not isinstance(node, exp.Count):
        raise scope.refuse(f"{node.sql(CANONICAL_DIALECT)}", "only single-argument "
                           "aggregates are supported", node)
    if arg is None:
        raise scope.error(f"{func_name(node).upper()} needs an argument", node)
    if contains_aggregate(arg):
        raise scope.error(f"aggregates cannot be nested: {node.sql(CANONICAL_DIALECT)}", node)
    return AggCall(func, Scalar.of(arg)), arg

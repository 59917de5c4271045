"""From a parsed SELECT to the relational IR, refusing what incr cannot maintain.

This is the compiler's front door: every construct outside the supported class stops here
with a :class:`~incr.errors.NotIncrementalizableError` that names the construct, the file
and line, and why.  Names are resolved here too (table aliases stripped, SELECT aliases and
positions in GROUP BY / ORDER BY replaced by what they stand for), so the passes see one
canonical form.

Shape of the result for an aggregate query::

    Limit(Project(Sort(Filter[HAVING](Aggregate(Filter[WHERE](Source))))))

and for a plain SELECT (no aggregates)::

    Limit(Project(Sort(Filter[WHERE](Source))))

Absent clauses are simply absent.  Aggregate outputs are named ``_k<i>`` (keys) and
``_a<j>`` (aggregates); source columns never start with ``_``, so these cannot clash; the Project gives the user's column names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as SqlglotParseError

from incr.compiler.ir import (AggCall, Aggregate, Filter, Limit, Named, NamedAgg, Project, Rel,
                              Sort, SortKey, Source)
from incr.compiler.program import Program, TableDecl, ViewDecl, location_of, shift_lines
from incr.compiler.scalar import CANONICAL_DIALECT, Scalar
from incr.errors import CompileError, Location, NotIncrementalizableError, ParseError

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

_SUPPORTED_AGGREGATES = ("COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM, AVG, MIN, MAX, "
                         "STDDEV_SAMP, STDDEV_POP, VAR_SAMP, VAR_POP")


@dataclass(frozen=True)
class Translation:
    """The IR of one view plus what later stages need to know about its source."""

    rel: Rel
    source: TableDecl
    aggregated: bool


def translate(view: ViewDecl, program: Program) -> Translation:
    """Translates one view's SELECT into IR, or raises a located compile error."""
    return _Translator(view, program).run()


class _Translator:
    def __init__(self, view: ViewDecl, program: Program):
        self.view = view
        self.program = program
        self.where = view.location
        self.path = program.path

    # -- helpers -----------------------------------------------------------------------
    def _loc(self, node: exp.Expression | None) -> Location:
        return location_of(node, self.where) if node is not None else self.where

    def _refuse(self, construct: str, why: str, node: exp.Expression | None) -> NotIncrementalizableError:
        return NotIncrementalizableError(
            f"view {self.view.name}: {construct} is not supported: {why}", self._loc(node))

    def _error(self, message: str, node: exp.Expression | None) -> CompileError:
        return CompileError(f"view {self.view.name}: {message}", self._loc(node))

    # -- entry ---------------------------------------------------------------------------
    def run(self) -> Translation:
        tree = self._parse()
        self._check_shape(tree)
        source = self._source(tree)
        self.table = source
        self.alias = tree.args["from_"].this.alias_or_name
        self._check_nodes(tree)
        self._resolve_columns(tree)
        aggregated = bool(tree.args.get("group")) or any(
            _contains_aggregate(e) for e in tree.expressions) or tree.args.get("having") is not None
        if aggregated:
            rel = self._aggregate_query(tree, source)
        else:
            rel = self._plain_query(tree, source)
        return Translation(rel=rel, source=source, aggregated=aggregated)

    def _parse(self) -> exp.Select:
        try:
            tree = sqlglot.parse_one(self.view.select, read=self.program.options.dialect)
        except SqlglotParseError as e:
            err = e.errors[0] if e.errors else {}
            line = self.view.select_line + (err.get("line") or 1) - 1
            raise ParseError(f"view {self.view.name}: SQL syntax error: "
                             f"{err.get('description') or e}", Location(self.path, line)) from e
        shift_lines(tree, self.view.select_line - 1, self.view.select_offset)
        if isinstance(tree, exp.SetOperation):
            kind = type(tree).__name__.upper()
            raise self._refuse(kind, "set operations over several queries are not "
                               "incrementalized yet; maintain each query as its own view", tree)
        if not isinstance(tree, exp.Select):
            raise self._error(f"a view must be a SELECT, found {tree.key.upper()}", tree)
        return tree

    # -- the supported class -------------------------------------------------------------
    def _check_shape(self, tree: exp.Select) -> None:
        if tree.args.get("with_"):
            raise self._refuse("WITH (common table expressions)", "only a single SELECT over one "
                               "source is maintained; inline the CTE", tree.args["with_"])
        if tree.args.get("joins"):
            raise self._refuse("JOIN", "this release maintains single-source views; joins "
                               "are planned (state per join key)", tree.args["joins"][0])
        if tree.args.get("distinct"):
            raise self._refuse("SELECT DISTINCT", "use GROUP BY over the selected columns "
                               "instead", tree.args["distinct"])
        for key in ("qualify", "windows", "laterals", "pivots", "connect", "prewhere", "sample"):
            if tree.args.get(key):
                raise self._refuse(key.upper(), "it has no incremental form here", tree.args[key])
        from_ = tree.args.get("from_")
        if from_ is None:
            raise self._refuse("SELECT without FROM", "a view must read a declared source", tree)
        if not isinstance(from_.this, exp.Table):
            raise self._refuse("subquery in FROM", "nested queries are not incrementalized "
                               "yet; read the source table directly", from_.this)
        for key, construct in (("pivots", "PIVOT"), ("sample", "TABLESAMPLE")):
            if from_.this.args.get(key):
                raise self._refuse(construct, "it has no incremental form here", from_.this)
        group = tree.args.get("group")
        if group is not None:
            for key in ("rollup", "cube", "grouping_sets", "all"):
                if group.args.get(key):
                    raise self._refuse(f"GROUP BY {key.upper().replace('_', ' ')}",
                                       "list the grouping expressions explicitly", group)
            for node in group.expressions:  # sqlglot keeps ROLLUP (k) etc. among the keys
                if isinstance(node, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                    kind = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE",
                            exp.GroupingSets: "GROUPING SETS"}[type(node)]
                    raise self._refuse(f"GROUP BY {kind}",
                                       "list the grouping expressions explicitly", node)

    def _check_nodes(self, tree: exp.Select) -> None:
        for node in tree.walk():
            if node is tree:
                continue
            if isinstance(node, (exp.Select, exp.Subquery)):
                raise self._refuse("subquery", "nested queries are not incrementalized yet",
                                   node)
            if isinstance(node, exp.Window):
                raise self._refuse("window function (OVER ...)", "its value for a row depends "
                                   "on other rows' positions, which every batch can shift", node)
            if isinstance(node, _NON_DETERMINISTIC_NODES) or (
                    isinstance(node, exp.Func) and _func_name(node) in NON_DETERMINISTIC):
                raise self._refuse(f"non-deterministic function {_func_name(node).upper()}()",
                                   "its value changes between batches, so no maintained "
                                   "answer could equal a recompute", node)
            if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
                raise self._refuse("aggregate FILTER (WHERE ...)", "move the condition into a "
                                   "CASE inside the aggregate or into WHERE", node)
            if isinstance(node, exp.AggFunc):
                self._agg_call(node, resolved=False)  # raises for unsupported aggregates

    def _source(self, tree: exp.Select) -> TableDecl:
        table_node = tree.args["from_"].this
        if table_node.args.get("db") or table_node.args.get("catalog"):
            raise self._error(f"qualified table names are not supported: {table_node.sql()}",
                              table_node)
        table = self.program.table(table_node.name)
        if table is None:
            declared = ", ".join(t.name for t in self.program.tables) or "none"
            raise self._error(f"unknown table {table_node.name}; declared tables: {declared}",
                              table_node)
        return table

    # -- names ---------------------------------------------------------------------------
    def _resolve_columns(self, tree: exp.Select) -> None:
        """Strips table qualifiers and spells every source column as declared.

        Names that are not source columns are left alone here: in GROUP BY, HAVING and
        ORDER BY they may be SELECT aliases, resolved later.
        """
        aliases = {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}
        for col in list(tree.find_all(exp.Column)):
            qualifier = col.table
            if qualifier and qualifier.lower() not in {self.alias.lower(), self.table.name.lower()}:
                raise self._error(f"unknown table or alias {qualifier} in {col.sql()}", col)
            declared = self.table.column(col.name)
            if declared is not None:
                resolved = exp.column(declared.name)
                resolved.this.meta.update(col.this.meta)  # keep the position for error messages
                col.replace(resolved)
            elif col.name in aliases and not qualifier:
                continue
            else:
                names = ", ".join(c.name for c in self.table.columns)
                raise self._error(f"unknown column {col.name} in table {self.table.name} "
                                  f"(columns: {names})", col)

    def _check_no_alias_refs(self, node: exp.Expression, clause: str) -> None:
        for col in node.find_all(exp.Column):
            if self.table.column(col.name) is None:
                raise self._error(f"{clause} cannot refer to the SELECT alias {col.name} here",
                                  col)

    # -- plain SELECT --------------------------------------------------------------------
    def _plain_query(self, tree: exp.Select, source: TableDecl) -> Rel:
        rel: Rel = Source(source.name, tuple(c.name for c in source.columns))
        where = tree.args.get("where")
        if where is not None:
            if _contains_aggregate(where.this):
                raise self._error("aggregates are not allowed in WHERE; use HAVING", where)
            self._check_no_alias_refs(where.this, "WHERE")
            rel = Filter(rel, Scalar.of(where.this))
        items = self._select_items(tree, source)
        exprs = tuple(Named(name, Scalar.of(node)) for name, node in items)
        for named, (_, node) in zip(exprs, items):
            self._check_no_alias_refs(node, "SELECT")
        by_alias = {n.name.lower(): n.expr for n in exprs}
        sort_keys = self._order_keys(tree, exprs, by_alias, lambda node: Scalar.of(node))
        if sort_keys:
            rel = Sort(rel, sort_keys)
        rel = Project(rel, exprs)
        return self._limit(tree, rel)

    # -- aggregate SELECT ----------------------------------------------------------------
    def _aggregate_query(self, tree: exp.Select, source: TableDecl) -> Rel:
        rel: Rel = Source(source.name, tuple(c.name for c in source.columns))
        where = tree.args.get("where")
        if where is not None:
            if _contains_aggregate(where.this):
                raise self._error("aggregates are not allowed in WHERE; use HAVING", where)
            self._check_no_alias_refs(where.this, "WHERE")
            rel = Filter(rel, Scalar.of(where.this))
        if any(isinstance(e, exp.Star) for e in tree.expressions):
            raise self._error("SELECT * cannot be combined with GROUP BY or aggregates",
                              tree.expressions[0])
        items = self._select_items(tree, source)
        keys = self._group_keys(tree, items)
        self.aggs: dict[str, NamedAgg] = {}
        key_names = {k.expr.sql: k.name for k in keys}

        def over_aggregate(node: exp.Expression, clause: str) -> Scalar:
            return self._over_aggregate(node, key_names, clause)

        exprs = tuple(Named(name, over_aggregate(node, "SELECT")) for name, node in items)
        having = tree.args.get("having")
        having_scalar = None
        if having is not None:
            by_alias = {n.name: n.expr for n in exprs}
            having_scalar = over_aggregate(self._inline_aliases(having.this, by_alias, items),
                                           "HAVING")
        by_alias = {n.name.lower(): n.expr for n in exprs}
        sort_keys = self._order_keys(tree, exprs, by_alias,
                                     lambda node: over_aggregate(node, "ORDER BY"))
        rel = Aggregate(rel, keys, tuple(self.aggs.values()))
        if having_scalar is not None:
            rel = Filter(rel, having_scalar)
        if sort_keys:
            rel = Sort(rel, sort_keys)
        rel = Project(rel, exprs)
        return self._limit(tree, rel)

    def _inline_aliases(self, node: exp.Expression, by_alias: dict[str, Scalar],
                        items: list[tuple[str, exp.Expression]]) -> exp.Expression:
        """Replaces SELECT-alias references (DuckDB allows them in HAVING) by their expressions."""
        originals = {name: expr for name, expr in items}

        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and self.table.column(n.name) is None and n.name in originals:
                return originals[n.name].copy()
            return n

        return node.copy().transform(swap)

    def _group_keys(self, tree: exp.Select, items: list[tuple[str, exp.Expression]]) -> tuple[Named, ...]:
        group = tree.args.get("group")
        if group is None:
            return ()
        by_alias = {name: node for name, node in items}
        keys: list[Named] = []
        seen: set[str] = set()
        for node in group.expressions:
            if isinstance(node, exp.Literal) and node.is_int:
                pos = int(node.this)
                if not 1 <= pos <= len(items):
                    raise self._error(f"GROUP BY position {pos} is out of range "
                                      f"(the SELECT list has {len(items)} items)", node)
                node = items[pos - 1][1]
            elif isinstance(node, exp.Column) and self.table.column(node.name) is None:
                node = by_alias[node.name]
            if _contains_aggregate(node):
                raise self._error(f"GROUP BY cannot contain an aggregate: {node.sql()}", node)
            self._check_no_alias_refs(node, "GROUP BY")
            scalar = Scalar.of(node)
            if scalar.sql in seen:
                continue
            seen.add(scalar.sql)
            keys.append(Named(f"_k{len(keys)}", scalar))
        return tuple(keys)

    def _over_aggregate(self, node: exp.Expression, key_names: dict[str, str], clause: str) -> Scalar:
        """Rewrites an expression to read only group keys (k<i>) and aggregates (a<j>)."""
        tree = node.copy()

        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.AggFunc):
                call = self._agg_call(n)
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
                raise self._error(f"column {col.name} in {clause} must appear in GROUP BY or "
                                  f"be used inside an aggregate", original)
        return Scalar.of(rewritten)

    def _agg_call(self, node: exp.AggFunc, resolved: bool = True) -> AggCall:
        """Maps a sqlglot aggregate to an AggCall, refusing the unsupported ones."""
        arg = node.this
        distinct = isinstance(arg, exp.Distinct)
        if distinct:
            if len(arg.expressions) != 1:
                raise self._refuse(f"{node.sql(CANONICAL_DIALECT)}", "DISTINCT over several "
                                   "columns; count a single expression", node)
            arg = arg.expressions[0]
        if isinstance(node, exp.Count):
            if isinstance(arg, exp.Star) or arg is None:
                return AggCall("count_star")
            func = "count_distinct" if distinct else "count"
        elif distinct:
            raise self._refuse(f"{type(node).__name__.upper()}(DISTINCT ...)",
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
            raise self._refuse(f"aggregate {_func_name(node).upper()}",
                               f"supported aggregates are {_SUPPORTED_AGGREGATES}", node)
        extra = [k for k, v in node.args.items() if k != "this" and v]
        if extra and not isinstance(node, exp.Count):
            raise self._refuse(f"{node.sql(CANONICAL_DIALECT)}", "only single-argument "
                               "aggregates are supported", node)
        if arg is None:
            raise self._error(f"{_func_name(node).upper()} needs an argument", node)
        if _contains_aggregate(arg):
            raise self._error(f"aggregates cannot be nested: {node.sql(CANONICAL_DIALECT)}", node)
        if resolved:
            self._check_no_alias_refs(arg, "an aggregate argument")
        return AggCall(func, Scalar.of(arg))

    # -- clauses shared by both shapes ---------------------------------------------------
    def _select_items(self, tree: exp.Select, source: TableDecl) -> list[tuple[str, exp.Expression]]:
        items: list[tuple[str, exp.Expression]] = []
        used: set[str] = set()
        for node in tree.expressions:
            if isinstance(node, exp.Star):
                for col in source.columns:
                    items.append((_unique(col.name, used), exp.column(col.name)))
                continue
            if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
                for col in source.columns:
                    items.append((_unique(col.name, used), exp.column(col.name)))
                continue
            if isinstance(node, exp.Alias):
                name, inner = node.alias, node.this
            else:
                name, inner = _default_name(node, len(items)), node
            items.append((_unique(name, used), inner))
        return items

    def _order_keys(self, tree: exp.Select, exprs: tuple[Named, ...], by_alias: dict[str, Scalar],
                    translate_expr) -> tuple[SortKey, ...]:
        order = tree.args.get("order")
        if order is None:
            return ()
        keys: list[SortKey] = []
        for ordered in order.expressions:
            node = ordered.this
            if isinstance(node, exp.Literal) and node.is_int:
                pos = int(node.this)
                if not 1 <= pos <= len(exprs):
                    raise self._error(f"ORDER BY position {pos} is out of range "
                                      f"(the SELECT list has {len(exprs)} items)", node)
                scalar = exprs[pos - 1].expr
            elif isinstance(node, exp.Column) and node.name.lower() in by_alias and not node.table:
                scalar = by_alias[node.name.lower()]
            else:
                scalar = translate_expr(node)
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

    def _int_clause(self, node: exp.Expression | None, clause: str) -> int | None:
        if node is None:
            return None
        if isinstance(node, exp.Literal) and node.is_int and int(node.this) >= 0:
            return int(node.this)
        raise self._error(f"{clause} must be a non-negative integer literal", node)


def _func_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return node.key.lower()


def _contains_aggregate(node: exp.Expression) -> bool:
    return any(isinstance(n, exp.AggFunc) for n in node.walk())


def _default_name(node: exp.Expression, index: int) -> str:
    """A readable, Delta-safe column name for an unaliased SELECT item."""
    if isinstance(node, exp.Column):
        return node.name
    text = re.sub(r"[^A-Za-z0-9]+", "_", node.sql(CANONICAL_DIALECT).lower()).strip("_")
    if not text or len(text) > 48 or text[0].isdigit():
        return f"col{index}"
    return text


def _unique(name: str, used: set[str]) -> str:
    candidate, n = name, 2
    while candidate.lower() in used:
        candidate = f"{name}_{n}"
        n += 1
    used.add(candidate.lower())
    return candidate

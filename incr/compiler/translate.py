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

from incr.compiler.ir import (AggCall, Aggregate, EquiJoin, Filter, JoinInput, Limit, Named,
                              NamedAgg, Project, Rel, Sort, SortKey, Source)
from incr.compiler.program import (Column, Program, TableDecl, ViewDecl, location_of,
                                   shift_lines)
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
    join: EquiJoin | None = None


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
        self.inputs = self._inputs(tree)
        self._check_nodes(tree)
        join = None
        if len(self.inputs) == 1:
            self.alias, source = self.inputs[0]
            self.table = source
            self._resolve_columns(tree)
        else:
            join, source = self._join(tree)
            self.table = source
        aggregated = bool(tree.args.get("group")) or any(
            _contains_aggregate(e) for e in tree.expressions) or tree.args.get("having") is not None
        if tree.args.get("distinct") is not None:
            aggregated = self._distinct_as_group_by(tree, aggregated)
        if aggregated:
            rel = self._aggregate_query(tree, source)
        else:
            rel = self._plain_query(tree, source)
        return Translation(rel=rel, source=source, aggregated=aggregated, join=join)

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
        distinct = tree.args.get("distinct")
        if distinct is not None and distinct.args.get("on"):
            raise self._refuse("SELECT DISTINCT ON", "it keeps an arbitrary row per key; use "
                               "GROUP BY with MIN/MAX instead", distinct)
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

    def _declared(self, table_node: exp.Table) -> TableDecl:
        if table_node.args.get("db") or table_node.args.get("catalog"):
            raise self._error(f"qualified table names are not supported: {table_node.sql()}",
                              table_node)
        table = self.program.table(table_node.name)
        if table is None:
            declared = ", ".join(t.name for t in self.program.tables) or "none"
            raise self._error(f"unknown table {table_node.name}; declared tables: {declared}",
                              table_node)
        return table

    def _inputs(self, tree: exp.Select) -> list[tuple[str, TableDecl]]:
        """(alias, table) of every source in FROM and JOIN, refusing joins incr cannot keep."""
        first = tree.args["from_"].this
        inputs = [(first.alias_or_name, self._declared(first))]
        nodes: list[exp.Expression] = [first]
        for j in tree.args.get("joins") or []:
            side, kind = (j.args.get("side") or "").upper(), (j.args.get("kind") or "").upper()
            if not isinstance(j.this, exp.Table):
                raise self._refuse("subquery in JOIN", "nested queries are not incrementalized "
                                   "yet; join declared sources directly", j.this)
            if side:
                raise self._refuse(f"{side} OUTER JOIN", "only inner equi-joins are maintained "
                                   "in this release; outer joins are planned", j)
            if j.args.get("using"):
                raise self._refuse("JOIN ... USING", "write the condition as ON a.k = b.k", j)
            if kind not in ("", "INNER", "CROSS"):
                raise self._refuse(f"{kind} JOIN", "only inner equi-joins are maintained", j)
            for key in ("pivots", "sample"):
                if j.this.args.get(key):
                    raise self._refuse(key.upper(), "it has no incremental form here", j.this)
            inputs.append((j.this.alias_or_name, self._declared(j.this)))
            nodes.append(j)
        seen_alias: set[str] = set()
        seen_table: dict[str, str] = {}
        for (alias, table), node in zip(inputs, nodes):
            if alias.lower() in seen_alias:
                raise self._error(f"alias {alias} is used twice in FROM", node)
            seen_alias.add(alias.lower())
            if table.name.lower() in seen_table:
                raise self._refuse(f"JOIN of {table.name} with itself (self-join)", "a source "
                                   "joined with itself is not maintained yet", node)
            seen_table[table.name.lower()] = alias
        return inputs

    def _join(self, tree: exp.Select) -> tuple[EquiJoin, TableDecl]:
        """Resolves columns over several inputs and splits ON into equalities and filters.

        Every column becomes ``<alias>__<column>``; cross-input equalities in ON become the
        join's key pairs, every other ON conjunct joins WHERE (the same thing for an inner
        join).  The result is one virtual source holding the columns the view reads.
        """
        if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in tree.expressions):
            raise self._error("SELECT * over a join is not supported; list the columns",
                              tree.expressions[0])
        for e in list(tree.expressions):  # keep DuckDB's output names for bare columns
            if isinstance(e, exp.Column):
                e.replace(exp.alias_(e.copy(), e.name))
        aliases = {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}
        by_alias = {alias.lower(): table for alias, table in self.inputs}
        by_table = {table.name.lower(): alias for alias, table in self.inputs}
        flat_of: dict[str, tuple[str, str]] = {}  # flat name -> (alias, declared column)
        for col in list(tree.find_all(exp.Column)):
            qualifier = col.table.lower() if col.table else None
            if qualifier is not None:
                alias = qualifier if qualifier in by_alias else by_table.get(qualifier)
                if alias is None:
                    raise self._error(f"unknown table or alias {col.table} in {col.sql()}", col)
                alias = next(a for a, _ in self.inputs if a.lower() == alias.lower())
                candidates = [(alias, by_alias[alias.lower()])]
            else:
                candidates = [(a, t) for a, t in self.inputs if t.column(col.name) is not None]
                if not candidates and col.name in aliases:
                    continue
                if len(candidates) > 1:
                    raise self._error(f"column {col.name} is ambiguous: it is in "
                                      f"{', '.join(a for a, _ in candidates)}; qualify it", col)
            alias, table = candidates[0] if candidates else (None, None)
            declared = table.column(col.name) if table is not None else None
            if declared is None:
                where = f"table {table.name}" if table is not None else "any joined table"
                raise self._error(f"unknown column {col.name} in {where}", col)
            flat = f"{alias.lower()}__{declared.name}"
            flat_of[flat] = (alias, declared.name)
            resolved = exp.column(flat)
            resolved.this.meta.update(col.this.meta)
            col.replace(resolved)

        pairs: list[tuple[str, str]] = []
        filters: list[exp.Expression] = []

        def equality(conjunct: exp.Expression) -> tuple[str, str] | None:
            if (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                    and isinstance(conjunct.expression, exp.Column)
                    and conjunct.this.name in flat_of and conjunct.expression.name in flat_of
                    and flat_of[conjunct.this.name][0] != flat_of[conjunct.expression.name][0]):
                return conjunct.this.name, conjunct.expression.name
            return None

        for j in tree.args.get("joins") or []:
            for conjunct in _conjuncts(j.args["on"]) if j.args.get("on") is not None else ():
                if _contains_aggregate(conjunct):
                    raise self._error("aggregates are not allowed in ON", conjunct)
                pair = equality(conjunct)
                if pair:
                    pairs.append(pair)
                else:
                    filters.append(conjunct.copy())
            j.set("on", None)
        where = tree.args.get("where")
        # FROM a, b WHERE a.k = b.k: top-level equalities of WHERE join the inputs too (they
        # stay in WHERE as well, where they hold for every joined row).
        for conjunct in _conjuncts(where.this) if where is not None else ():
            pair = equality(conjunct)
            if pair and pair not in pairs:
                pairs.append(pair)
        inputs = tuple(JoinInput(alias.lower(), table.name, tuple(
            c.name for c in table.columns if f"{alias.lower()}__{c.name}" in flat_of))
            for alias, table in self.inputs)
        self._check_connected(inputs, pairs, tree)
        if filters:
            tree.where(exp.and_(*filters), copy=False)
        columns = tuple(Column(flat, self.program.table(table).column(col).type,
                               self.program.table(table).column(col).not_null)
                        for inp in inputs for col in inp.columns
                        for flat, table in [(inp.flat(col), inp.table)])
        source = TableDecl(name="joined", columns=columns, location=self.where,
                           append_only=all(t.append_only for _, t in self.inputs))
        return EquiJoin(inputs, tuple(pairs)), source

    def _check_connected(self, inputs: tuple[JoinInput, ...], pairs: list[tuple[str, str]],
                         tree: exp.Select) -> None:
        reached = {inputs[0].alias}
        changed = True
        while changed:
            changed = False
            for a, b in pairs:
                sides = {next(i.alias for i in inputs if c in i.flat_columns) for c in (a, b)}
                if sides & reached and not sides <= reached:
                    reached |= sides
                    changed = True
        missing = [i for i in inputs if i.alias not in reached]
        if missing:
            raise self._refuse(f"join of {missing[0].table} without an equality to the other "
                               f"tables (a cross or non-equi join)", "only equi-joins (a.k = b.k "
                               "in ON or WHERE) are maintained: any other condition would keep "
                               "every pair of rows", tree.args["joins"][0])

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

    def _distinct_as_group_by(self, tree: exp.Select, aggregated: bool) -> bool:
        """SELECT DISTINCT e1, e2 is GROUP BY e1, e2 with no aggregate: a set kept as counts."""
        if aggregated:
            raise self._refuse("SELECT DISTINCT with aggregates or GROUP BY", "drop DISTINCT "
                               "(select the GROUP BY keys to make rows distinct)",
                               tree.args["distinct"])
        if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in tree.expressions):
            raise self._error("SELECT DISTINCT * is not supported; list the columns",
                              tree.args["distinct"])
        keys = [(e.this if isinstance(e, exp.Alias) else e).copy() for e in tree.expressions]
        tree.set("distinct", None)
        tree.set("group", exp.Group(expressions=keys))
        return True

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


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The AND-ed parts of a condition."""
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


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

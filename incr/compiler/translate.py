"""From a parsed SELECT to the relational IR, refusing what incr cannot maintain.

This is the compiler's front door: every construct outside the supported class stops here
with a :class:`~incr.errors.NotIncrementalizableError` that names the construct, the file
and line, and why.  Names are resolved here too (table aliases stripped, SELECT aliases and
positions in GROUP BY / ORDER BY replaced by what they stand for), so the passes see one
canonical form.

A view becomes one or more **stages** (:class:`StageTranslation`), producers first.  A
query block (one SELECT) over declared sources is one stage.  Nested queries are first
rewritten by sqlglot's own optimizer rules: ``qualify`` resolves every name,
``eliminate_subqueries`` turns FROM subqueries into CTEs, ``unnest_subqueries``
decorrelates subqueries in WHERE and SELECT into joins with grouped derived tables (a
correlated ``x > (SELECT SUM(..) .. WHERE y.b = x.a)`` becomes a LEFT JOIN on a per-key
aggregate; ``IN`` / ``EXISTS`` a LEFT JOIN on the distinct keys with ``IS NOT NULL``), and
``merge_subqueries`` folds simple ones back into their parent.  Every CTE or derived table
still standing is a stage of its own, read by the stage above it as a *derived* input.
A UNION ALL is one stage whose input is the bag union of its branches.

An outer join is kept as branches of the stage's input: the matched rows (an inner join)
and, per preserved side, the unmatched rows (an anti-join, the other side padded with
NULLs).  A WHERE that rejects NULLs of the padded side drops the unmatched branch (a LEFT
JOIN whose right side must be present is an inner join: how ``IN`` and scalar subqueries
arrive); ``key IS NULL`` on the optional side drops the matched one (NOT EXISTS).

Shape of the IR of a stage, for an aggregate query::

    Limit(Project(Sort(Filter[HAVING](Aggregate(Filter[WHERE](Source))))))

and for a plain SELECT (no aggregates)::

    Limit(Project(Sort(Filter[WHERE](Source))))

Absent clauses are simply absent.  Aggregate outputs are named ``_k<i>`` (keys) and
``_a<j>`` (aggregates); source columns never start with ``_``, so these cannot clash; the
Project gives the user's column names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.errors import ParseError as SqlglotParseError

from incr.compiler.ir import (
    AggCall,
    Aggregate,
    AntiJoin,
    Branch,
    EquiJoin,
    Filter,
    JoinInput,
    Limit,
    Named,
    NamedAgg,
    Project,
    Rel,
    Sort,
    SortKey,
    Source,
)
from incr.compiler.program import Column, Program, TableDecl, ViewDecl, location_of, shift_lines
from incr.compiler.scalar import CANONICAL_DIALECT, Scalar
from incr.compiler.types import SqlType, infer_type
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

#: The name a UNION stage's input relation goes by.
UNION = "unioned"

_SUPPORTED_AGGREGATES = ("COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM, AVG, MIN, MAX, "
                         "STDDEV_SAMP, STDDEV_POP, VAR_SAMP, VAR_POP")


@dataclass(frozen=True)
class StageTranslation:
    """The IR of one stage plus what later stages need to know about its input.

    ``source`` is the stage's input relation as a table: the declared source of a direct
    stage, or the joined (or unioned) columns otherwise.  ``single_row`` marks a global
    aggregate, which other stages may cross-join (it always holds at most one row).
    """

    name: str
    rel: Rel
    source: TableDecl
    branches: tuple[Branch, ...]
    aggregated: bool
    single_row: bool = False
    output: tuple[Column, ...] = ()


@dataclass(frozen=True)
class Translation:
    """Every stage of a view, producers first; the last is the view's own."""

    stages: tuple[StageTranslation, ...]

    @property
    def top(self) -> StageTranslation:
        return self.stages[-1]

    @property
    def rel(self) -> Rel:
        return self.top.rel

    @property
    def source(self) -> TableDecl:
        return self.top.source


def translate(view: ViewDecl, program: Program) -> Translation:
    """Translates one view's SELECT into IR, or raises a located compile error."""
    return _ViewTranslator(view, program).run()


class _Base:
    """Error helpers shared by the view and block translators."""

    view: ViewDecl
    where: Location

    def _loc(self, node: exp.Expression | None) -> Location:
        return location_of(node, self.where) if node is not None else self.where

    def _refuse(self, construct: str, why: str, node: exp.Expression | None) -> NotIncrementalizableError:
        return NotIncrementalizableError(
            f"view {self.view.name}: {construct} is not supported: {why}", self._loc(node))

    def _error(self, message: str, node: exp.Expression | None) -> CompileError:
        return CompileError(f"view {self.view.name}: {message}", self._loc(node))

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
            self._check_no_alias_refs(arg, "an aggregate argument")  # type: ignore[attr-defined]
        return AggCall(func, Scalar.of(arg))


class _ViewTranslator(_Base):
    """Splits a view into stages: decorrelates nested queries, then translates each block."""

    def __init__(self, view: ViewDecl, program: Program):
        self.view = view
        self.program = program
        self.where = view.location
        self.path = program.path
        self.stages: list[StageTranslation] = []
        self._names = 0

    def run(self) -> Translation:
        tree = self._parse()
        _check_nodes(self, tree)
        for select in tree.find_all(exp.Select):
            _check_shape(self, select)
        if not _nested(tree):
            return Translation((_Block(self, tree, "", {}).run(),))
        names = _output_names(tree)
        tree = self._decorrelate(tree)
        top = self._query(tree, "", {})
        if names and len(names) == len(top.output):
            top = _rename_outputs(top, names)
        return Translation((*self.stages, top))

    def _parse(self) -> exp.Expression:
        try:
            tree = sqlglot.parse_one(self.view.select, read=self.program.options.dialect)
        except SqlglotParseError as e:
            err = e.errors[0] if e.errors else {}
            line = self.view.select_line + (err.get("line") or 1) - 1
            raise ParseError(f"view {self.view.name}: SQL syntax error: "
                             f"{err.get('description') or e}", Location(self.path, line)) from e
        shift_lines(tree, self.view.select_line - 1, self.view.select_offset)
        for node in tree.walk():
            if isinstance(node, (exp.Intersect, exp.Except)):
                kind = type(node).__name__.upper()
                raise self._refuse(kind, "only UNION and UNION ALL combine queries here; "
                                   "write INTERSECT as a join (or IN) and EXCEPT as NOT EXISTS", node)
        if not isinstance(tree, (exp.Select, exp.Union)):
            raise self._error(f"a view must be a SELECT, found {tree.key.upper()}", tree)
        return tree

    # -- nested queries --------------------------------------------------------------------
    def _decorrelate(self, tree: exp.Expression) -> exp.Expression:
        """sqlglot's optimizer rules: resolve names, turn subqueries into joins with derived tables."""
        from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
        from sqlglot.optimizer.merge_subqueries import merge_subqueries
        from sqlglot.optimizer.qualify import qualify
        from sqlglot.optimizer.unnest_subqueries import unnest_subqueries

        schema = {t.name: {c.name: str(c.type) for c in t.columns} for t in self.program.tables}
        for table in tree.find_all(exp.Table):
            if table.name and not table.args.get("db") and self.program.table(table.name) is None \
                    and not _is_cte_name(tree, table.name):
                declared = ", ".join(t.name for t in self.program.tables) or "none"
                raise self._error(f"unknown table {table.name}; declared tables: {declared}", table)
        dialect = self.program.options.dialect
        # Rewritten nodes lose their positions: refusals below point at the original ones.
        subqueries = [n for n in tree.walk() if isinstance(n, (exp.Exists, exp.Subquery))
                      or (isinstance(n, exp.In) and n.args.get("query") is not None)]
        where_in = next((n for n in subqueries if isinstance(n, exp.In)), None)
        where_sub = next((n for n in subqueries if not isinstance(n, exp.In)), None)
        subqueries = [n.copy() if n is not None else None for n in (where_in, where_sub)]
        for node in list(tree.find_all(exp.Not)):
            _rewrite_not_in(node, self.program)
        try:
            tree = qualify(tree, schema=schema, dialect=dialect)
            tree = merge_subqueries(unnest_subqueries(eliminate_subqueries(tree)))
            # An EXISTS still standing is uncorrelated: a one-row count, crossed in.
            exists = list(tree.find_all(exp.Exists))
            for node in exists:
                count = exp.select(exp.Count(this=exp.Star()).as_("_n")).from_(exp.Subquery(
                    this=node.this.copy(), alias=exp.TableAlias(this=exp.to_identifier("_e"))))
                node.replace(exp.GT(this=exp.Subquery(this=count), expression=exp.Literal.number(0)))
            if exists:
                tree = merge_subqueries(unnest_subqueries(tree))
            for where in list(tree.find_all(exp.Where)):  # unnesting leaves TRUE AND ...
                kept = [c for c in _conjuncts(where.this) if not (isinstance(c, exp.Boolean) and c.this)]
                if not kept:
                    where.pop()
                elif len(kept) != len(_conjuncts(where.this)):
                    where.set("this", exp.and_(*kept))
        except OptimizeError as e:
            message = re.sub(r"\. Line: \d+, Col: \d+", "", str(e))
            raise self._error(f"{message} (names in a nested query must resolve to a declared "
                              f"table's column or an inner query's output)", None) from e
        for node in tree.walk():
            if isinstance(node, (exp.ArrayAgg, exp.Lambda)):
                raise self._refuse("correlated subquery whose correlation is not an equality "
                                   "(e.g. inner.x <> outer.y)", "only equality correlations "
                                   "(inner.k = outer.k) turn into joins", subqueries[1])
            if isinstance(node, exp.In) and node.args.get("query") is not None:
                negated = isinstance(node.parent, exp.Not)
                raise self._refuse(f"{'NOT ' if negated else ''}IN (subquery) in this position",
                                   "write it as NOT EXISTS (SELECT ... WHERE inner.k = outer.k), "
                                   "which has no NULL surprises" if negated else
                                   "IN (subquery) is maintained as a top-level WHERE condition",
                                   subqueries[0])
        return tree

    def _query(self, node: exp.Expression, name: str, ctes: dict[str, StageTranslation]) -> StageTranslation:
        """Translates a SELECT or UNION (with its CTEs and FROM subqueries) into stage ``name``."""
        if isinstance(node, exp.Subquery):
            node = node.this
        ctes = dict(ctes)
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise self._refuse("WITH RECURSIVE", "recursive queries have no incremental "
                                   "form here", with_)
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = self._stage(cte.this, ctes)
            node.set("with_", None)
        if isinstance(node, exp.Union):
            return self._union(node, name, ctes)
        if not isinstance(node, exp.Select):
            raise self._error(f"expected a SELECT, found {node.key.upper()}", node)
        derived: dict[str, StageTranslation] = {}
        items = [node.args["from_"]] if node.args.get("from_") else []
        items += node.args.get("joins") or []
        for holder in items:
            item = holder.this
            stage = None
            if isinstance(item, exp.Subquery):
                stage = self._stage(item.this, ctes)
            elif isinstance(item, exp.Table) and not item.args.get("db") and item.name.lower() in ctes:
                stage = ctes[item.name.lower()]
            if stage is not None:
                alias = item.alias_or_name
                ref = exp.Table(this=exp.to_identifier(stage.name), alias=exp.TableAlias(
                    this=exp.to_identifier(alias)))
                ref.meta["incr_stage"] = stage.name
                item.replace(ref)
                derived[stage.name] = stage
        return _Block(self, node, name, derived).run()

    def _stage(self, node: exp.Expression, ctes: dict[str, StageTranslation]) -> StageTranslation:
        self._names += 1
        stage = self._query(node, f"s{self._names}", ctes)
        self.stages.append(stage)
        return stage

    def _union(self, node: exp.Union, name: str, ctes: dict[str, StageTranslation]) -> StageTranslation:
        """A UNION [ALL] stage: one branch per SELECT, each projected onto the union's columns.

        A branch that is a plain SELECT over one input reads that input directly; any other
        (aggregates, DISTINCT, joins) is a stage of its own that the branch reads.
        """
        parts: list[exp.Expression] = []
        distinct = bool(node.args.get("distinct"))

        def flatten(n: exp.Expression) -> None:
            if isinstance(n, exp.Subquery) and isinstance(n.this, exp.Union) and not _has_tail(n.this):
                n = n.this
            if isinstance(n, exp.Union) and (n is node or not _has_tail(n)):
                if bool(n.args.get("distinct")) != distinct:
                    raise self._refuse("UNION mixed with UNION ALL", "write the query with one "
                                       "kind of UNION, or nest one in a FROM subquery", n)
                flatten(n.this)
                flatten(n.expression)
                return
            parts.append(n)

        flatten(node)
        branches: list[Branch] = []
        columns: list[Column] = []
        for i, part in enumerate(parts):
            inner = part.this if isinstance(part, exp.Subquery) else part
            branch, outputs = self._union_branch(inner, i, ctes)
            if not columns:
                used: set[str] = set()
                columns = [replace(c, name=_unique(c.name, used), not_null=False) for c in outputs]
            elif len(outputs) != len(columns):
                raise self._error(f"each SELECT of a UNION must have the same number of "
                                  f"columns: {len(columns)} and {len(outputs)}", part)
            branches.append(replace(branch, project=tuple(
                Named(col.name, expr.expr) for col, expr in zip(columns, branch.project))))
        source = TableDecl(UNION, tuple(columns), self.where)
        select = exp.select(*[exp.column(c.name) for c in columns]).from_(UNION)
        if distinct:
            select.set("distinct", exp.Distinct())
        for key in ("order", "limit", "offset"):
            if node.args.get(key) is not None:
                select.set(key, node.args[key])
        return _Block(self, select, name, {}, union=(source, tuple(branches))).run()

    def _union_branch(self, part: exp.Expression, index: int,
                      ctes: dict[str, StageTranslation]) -> tuple[Branch, tuple[Column, ...]]:
        """One SELECT of a UNION as a branch: inline when plain over one input, else a stage."""
        if isinstance(part, exp.Select) and _plain_single(part):
            stage = _Block(self, part, f"union{index}", {})
            table_node = part.args["from_"].this
            if isinstance(table_node, exp.Table) and (table_node.name.lower() in ctes or
                                                      self.program.table(table_node.name)):
                return stage.inline_branch(f"u{index}", ctes)
        st = self._stage(part, ctes)
        alias = f"u{index}"
        inp = JoinInput(alias, st.name, tuple(c.name for c in st.output), derived=True)
        project = tuple(Named(c.name, Scalar.column(inp.flat(c.name))) for c in st.output)
        return Branch(EquiJoin((inp,), ()), project=project), st.output


class _Block(_Base):
    """One SELECT block: its inputs, joins and clauses, as one stage."""

    def __init__(self, owner: _ViewTranslator, tree: exp.Select, name: str,
                 derived: dict[str, StageTranslation],
                 union: tuple[TableDecl, tuple[Branch, ...]] | None = None):
        self.owner = owner
        self.view = owner.view
        self.program = owner.program
        self.where = owner.where
        self.path = owner.path
        self.tree = tree
        self.name = name
        self.derived = derived
        self.union = union
        self.output: tuple[Column, ...] = ()

    def run(self) -> StageTranslation:
        tree = self.tree
        if self.union is not None:
            source, branches = self.union
            self.inputs = [_Input(UNION, source, False, None)]
            self.alias, self.table = UNION, source
            self._resolve_columns(tree)
        else:
            self.inputs = self._inputs(tree)
            if len(self.inputs) == 1:
                inp = self.inputs[0]
                self.alias, source = inp.alias, inp.decl
                self.table = source
                self._resolve_columns(tree)
                branches = (Branch(EquiJoin((JoinInput(inp.alias.lower(), source.name, tuple(
                    c.name for c in source.columns), inp.derived),), ())),)
            else:
                branches, source = self._join(tree)
                self.table = source
        aggregated = bool(tree.args.get("group")) or any(
            _contains_aggregate(e) for e in tree.expressions) or tree.args.get("having") is not None
        if tree.args.get("distinct") is not None:
            aggregated = self._distinct_as_group_by(tree, aggregated)
        if self.name and (tree.args.get("limit") is not None or tree.args.get("offset") is not None):
            raise self._refuse("LIMIT/OFFSET in a nested query", "which rows it keeps changes "
                               "with every batch; apply LIMIT to the view itself",
                               tree.args.get("limit") or tree.args.get("offset"))
        if self.name:
            tree.set("order", None)  # order inside a nested query means nothing
        if aggregated:
            rel = self._aggregate_query(tree, source)
        else:
            rel = self._plain_query(tree, source)
        single_row = aggregated and not tree.args.get("group")
        return StageTranslation(self.name, rel, source, tuple(branches), aggregated, single_row,
                                self.output)

    def inline_branch(self, alias: str, ctes: dict[str, StageTranslation]) -> tuple[Branch, tuple[Column, ...]]:
        """This plain one-input SELECT as a union branch reading its input as ``alias``."""
        tree = self.tree
        table_node = tree.args["from_"].this
        stage = ctes.get(table_node.name.lower()) if not self.program.table(table_node.name) else None
        decl = TableDecl(stage.name, stage.output, self.where) if stage else self._declared(table_node)
        self.alias, self.table = table_node.alias_or_name, decl
        self._resolve_columns(tree)
        if tree.args.get("where") is not None and _contains_aggregate(tree.args["where"].this):
            raise self._error("aggregates are not allowed in WHERE; use HAVING", tree.args["where"])
        items = self._select_items(tree, decl)
        used = sorted({c.name for _, node in items for c in node.find_all(exp.Column)} |
                      {c.name for c in (tree.args["where"].this.find_all(exp.Column)
                                        if tree.args.get("where") is not None else [])},
                      key=lambda n: [c.name for c in decl.columns].index(n))
        inp = JoinInput(alias, decl.name, tuple(used), derived=stage is not None)
        flat = {c: Scalar.column(inp.flat(c)) for c in used}
        where = Scalar.of(tree.args["where"].this).substitute(flat) \
            if tree.args.get("where") is not None else None
        project = tuple(Named(name, Scalar.of(node).substitute(flat)) for name, node in items)
        outputs = tuple(Column(name, _type_of(Scalar.of(node), decl)) for name, node in items)
        return Branch(EquiJoin((inp,), ()), where=where, project=project), outputs

    # -- inputs ------------------------------------------------------------------------------
    def _declared(self, table_node: exp.Table) -> TableDecl:
        if table_node.meta.get("incr_stage"):
            stage = self.derived[table_node.meta["incr_stage"]]
            return TableDecl(stage.name, stage.output, self.where)
        if table_node.args.get("db") or table_node.args.get("catalog"):
            raise self._error(f"qualified table names are not supported: {table_node.sql()}",
                              table_node)
        table = self.program.table(table_node.name)
        if table is None:
            declared = ", ".join(t.name for t in self.program.tables) or "none"
            raise self._error(f"unknown table {table_node.name}; declared tables: {declared}",
                              table_node)
        return table

    def _inputs(self, tree: exp.Select) -> list[_Input]:
        """Every source in FROM and JOIN with how it is joined, refusing joins incr cannot keep."""
        first = tree.args["from_"].this
        if not isinstance(first, exp.Table):
            raise self._refuse("subquery in FROM", "only tables and inner queries named in "
                               "FROM are read", first)
        inputs = [_Input(first.alias_or_name, self._declared(first),
                         bool(first.meta.get("incr_stage")), None)]
        for j in tree.args.get("joins") or []:
            kind = (j.args.get("kind") or "").upper()
            if not isinstance(j.this, exp.Table):
                raise self._refuse("subquery in JOIN", "only tables and inner queries named in "
                                   "JOIN are read", j.this)
            if j.args.get("using"):
                raise self._refuse("JOIN ... USING", "write the condition as ON a.k = b.k", j)
            if (j.args.get("method") or "").upper() == "NATURAL":
                raise self._refuse("NATURAL JOIN", "write the condition as ON a.k = b.k", j)
            if kind not in ("", "INNER", "CROSS", "OUTER"):
                raise self._refuse(f"{kind} JOIN", "inner, LEFT, RIGHT and FULL equi-joins are "
                                   "maintained; write a semi-join as EXISTS", j)
            for key in ("pivots", "sample"):
                if j.this.args.get(key):
                    raise self._refuse(key.upper(), "it has no incremental form here", j.this)
            inputs.append(_Input(j.this.alias_or_name, self._declared(j.this),
                                 bool(j.this.meta.get("incr_stage")), j))
        seen_alias: set[str] = set()
        for inp in inputs:
            if inp.alias.lower() in seen_alias:
                raise self._error(f"alias {inp.alias} is used twice in FROM", inp.node or first)
            seen_alias.add(inp.alias.lower())
        return inputs

    def _join(self, tree: exp.Select) -> tuple[tuple[Branch, ...], TableDecl]:
        """Resolves columns over several inputs and splits the joins into branches.

        Every column becomes ``<alias>__<column>``.  Inner joins: cross-input equalities in ON
        become key pairs, every other ON conjunct joins WHERE.  Outer joins split the input
        into a matched branch and unmatched branches (see the module docstring); a WHERE
        that rejects the padded NULLs drops the unmatched branch.
        """
        if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in tree.expressions):
            raise self._error("SELECT * over a join is not supported; list the columns",
                              tree.expressions[0])
        for e in list(tree.expressions):  # keep DuckDB's output names for bare columns
            if isinstance(e, exp.Column):
                e.replace(exp.alias_(e.copy(), e.name))
        aliases = {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}
        by_alias = {inp.alias.lower(): inp for inp in self.inputs}
        by_table = {inp.decl.name.lower(): inp.alias for inp in self.inputs}
        flat_of: dict[str, tuple[str, str]] = {}  # flat name -> (alias, declared column)
        for col in list(tree.find_all(exp.Column)):
            qualifier = col.table.lower() if col.table else None
            if qualifier is not None:
                alias = qualifier if qualifier in by_alias else by_table.get(qualifier)
                if alias is None:
                    raise self._error(f"unknown table or alias {col.table} in {col.sql()}", col)
                candidates = [by_alias[alias.lower()]]
            else:
                candidates = [i for i in self.inputs if i.decl.column(col.name) is not None]
                if not candidates and col.name in aliases:
                    continue
                if len(candidates) > 1:
                    raise self._error(f"column {col.name} is ambiguous: it is in "
                                      f"{', '.join(i.alias for i in candidates)}; qualify it", col)
            inp = candidates[0] if candidates else None
            declared = inp.decl.column(col.name) if inp is not None else None
            if declared is None:
                where = f"table {inp.decl.name}" if inp is not None else "any joined table"
                raise self._error(f"unknown column {col.name} in {where}", col)
            flat = f"{inp.alias.lower()}__{declared.name}"
            flat_of[flat] = (inp.alias.lower(), declared.name)
            resolved = exp.column(flat)
            resolved.this.meta.update(col.this.meta)
            col.replace(resolved)

        def owners(node: exp.Expression) -> set[str]:
            return {flat_of[c.name][0] for c in node.find_all(exp.Column) if c.name in flat_of}

        def equality(conjunct: exp.Expression) -> tuple[str, str] | None:
            if (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                    and isinstance(conjunct.expression, exp.Column)
                    and conjunct.this.name in flat_of and conjunct.expression.name in flat_of
                    and flat_of[conjunct.this.name][0] != flat_of[conjunct.expression.name][0]):
                return conjunct.this.name, conjunct.expression.name
            return None

        first = self.inputs[0].alias.lower()
        terms = [_Term([first])]
        joined = [first]
        for inp in self.inputs[1:]:
            j = inp.node
            alias, side = inp.alias.lower(), (j.args.get("side") or "").upper()
            conjuncts = _conjuncts(j.args["on"]) if j.args.get("on") is not None else []
            j.set("on", None)
            pairs, this_only, earlier_only, mixed = [], [], [], []
            for conjunct in conjuncts:
                if _contains_aggregate(conjunct):
                    raise self._error("aggregates are not allowed in ON", conjunct)
                pair = equality(conjunct)
                who = owners(conjunct)
                if pair and alias in who and who <= {alias, *joined}:
                    other, this = (pair[0], pair[1]) if flat_of[pair[1]][0] == alias else (pair[1], pair[0])
                    pairs.append((other, this))
                elif who <= {alias}:
                    this_only.append(conjunct.copy())
                elif alias not in who:
                    earlier_only.append(conjunct.copy())
                else:
                    mixed.append(conjunct.copy())
            if not side:
                terms = [t for term in terms
                         for t in term.inner(alias, pairs, this_only + earlier_only + mixed)]
            elif side == "LEFT":
                bad = mixed[:1]
                if bad:
                    raise self._refuse(f"LEFT JOIN condition {bad[0].sql(CANONICAL_DIALECT)}",
                                       "an outer join's ON may hold equalities between the two "
                                       "tables and conditions on either table alone", j)
                if not pairs:
                    raise self._refuse(f"LEFT JOIN of {inp.decl.name} without an equality",
                                       "outer joins are maintained on equalities (a.k = b.k)", j)
                terms = [t for term in terms
                         for t in term.left(alias, pairs, this_only, earlier_only)]
            else:  # RIGHT, FULL: the left side must be a single input
                if len(joined) > 1:
                    raise self._refuse(f"{side} JOIN after other joins", "write it as a LEFT "
                                       "JOIN, or make it the first join of the FROM clause", j)
                flipped = [(b, a) for a, b in pairs]
                if mixed or not pairs:
                    cond = mixed[0].sql(CANONICAL_DIALECT) if mixed else "(no equality)"
                    raise self._refuse(f"{side} JOIN condition {cond}", "an outer join's ON may "
                                       "hold equalities between the two tables and conditions "
                                       "on either table alone", j)
                if side == "RIGHT":
                    terms = _Term([alias]).left(first, flipped, earlier_only, this_only)
                else:
                    terms = (_Term([first]).left(alias, pairs, this_only, earlier_only)
                             + _Term([alias]).left(first, flipped, earlier_only, this_only)[1:])
            joined.append(alias)

        where = tree.args.get("where")
        where_conjuncts = [c for c in (_conjuncts(where.this) if where is not None else [])
                           if not (isinstance(c, exp.Boolean) and c.this)]
        for t in terms:
            for conjunct in where_conjuncts:
                pair = equality(conjunct)
                if pair and all(flat_of[c][0] in t.inputs for c in pair) and pair not in t.pairs:
                    t.pairs.append(pair)
        kept = [t for t in terms if not any(t.rejected_by(c, flat_of) for c in where_conjuncts)]
        if not kept:  # every branch is provably empty: keep reading every input, keep nothing
            empty = next((t for t in terms if not t.padded and not t.anti), None)
            if empty is None:
                empty = _Term([inp.alias.lower() for inp in self.inputs], filters=[exp.false()])
            else:
                empty.filters.append(exp.false())
            kept = [empty]
        terms = kept
        inputs = {inp.alias.lower(): JoinInput(inp.alias.lower(), inp.decl.name, tuple(
            c.name for c in inp.decl.columns if f"{inp.alias.lower()}__{c.name}" in flat_of),
            inp.derived) for inp in self.inputs}
        single_row = {a for a, inp in ((i.alias.lower(), i) for i in self.inputs)
                      if inp.derived and self.derived[inp.decl.name].single_row}
        for t in terms:
            self._check_connected([inputs[a] for a in t.inputs], t.pairs, single_row, tree)
        padded_anywhere = {a for t in terms for a in t.padded}
        columns = tuple(Column(flat, col.type, col.not_null and inp.alias.lower() not in padded_anywhere)
                        for inp in self.inputs for col in inp.decl.columns
                        for flat in [f"{inp.alias.lower()}__{col.name}"] if flat in flat_of)
        outer = len(terms) > 1 or terms[0].anti or terms[0].padded
        branches = []
        for t in terms:
            join = EquiJoin(tuple(inputs[a] for a in t.inputs), tuple(t.pairs),
                            tuple(AntiJoin(inputs[a], tuple(p), _and_scalar(f))
                                  for a, p, f in t.anti))
            if outer:
                conds = [*t.filters, *(c.copy() for c in where_conjuncts)]
                branches.append(Branch(join, _and_scalar(conds), padded=tuple(
                    inputs[a] for a in t.padded)))
            else:
                branches.append(Branch(join))
        if outer:
            tree.set("where", None)
        elif terms[0].filters:
            tree.where(exp.and_(*terms[0].filters), copy=False)
        append_only = not outer and all(not i.derived and i.decl.append_only for i in self.inputs)
        source = TableDecl(name="joined", columns=columns, location=self.where,
                           append_only=append_only)
        return tuple(branches), source

    def _check_connected(self, inputs: list[JoinInput], pairs: list[tuple[str, str]],
                         crossed: set[str], tree: exp.Select) -> None:
        """Every input must meet the others through equalities, except single-row ones."""
        regular = [i for i in inputs if i.alias not in crossed]
        if not regular:
            return
        reached = {regular[0].alias} | crossed
        changed = True
        while changed:
            changed = False
            for a, b in pairs:
                sides = {next(i.alias for i in inputs if c in i.flat_columns) for c in (a, b)}
                if sides & reached and not sides <= reached:
                    reached |= sides
                    changed = True
        missing = [i for i in regular if i.alias not in reached]
        if missing:
            raise self._refuse(f"join of {missing[0].table} without an equality to the other "
                               f"tables (a cross or non-equi join)", "only equi-joins (a.k = b.k "
                               "in ON or WHERE) are maintained: any other condition would keep "
                               "every pair of rows", (tree.args.get("joins") or [tree])[0])

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
        self.output = tuple(Column(n.name, _type_of(n.expr, source)) for n in exprs)
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
        self.output = tuple(Column(name, _type_of(Scalar.of(node), source)) for name, node in items)
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


# -- checks on the whole parsed tree ---------------------------------------------------------
def _check_shape(base: _Base, tree: exp.Select) -> None:
    """Clauses of one SELECT that have no incremental form."""
    distinct = tree.args.get("distinct")
    if distinct is not None and distinct.args.get("on"):
        raise base._refuse("SELECT DISTINCT ON", "it keeps an arbitrary row per key; use "
                           "GROUP BY with MIN/MAX instead", distinct)
    for key in ("qualify", "windows", "laterals", "pivots", "connect", "prewhere", "sample"):
        if tree.args.get(key):
            raise base._refuse(key.upper(), "it has no incremental form here", tree.args[key])
    from_ = tree.args.get("from_")
    if from_ is None:
        raise base._refuse("SELECT without FROM", "a view must read a declared source", tree)
    for key, construct in (("pivots", "PIVOT"), ("sample", "TABLESAMPLE")):
        if from_.this.args.get(key):
            raise base._refuse(construct, "it has no incremental form here", from_.this)
    if isinstance(from_.this, (exp.Unnest, exp.Values)) or (
            isinstance(from_.this, exp.Table) and isinstance(from_.this.this, exp.Func)):
        raise base._refuse(f"{from_.this.key.upper()} in FROM", "a view must read declared "
                           "sources", from_.this)
    group = tree.args.get("group")
    if group is not None:
        for key in ("rollup", "cube", "grouping_sets", "all"):
            if group.args.get(key):
                raise base._refuse(f"GROUP BY {key.upper().replace('_', ' ')}",
                                   "list the grouping expressions explicitly", group)
        for node in group.expressions:  # sqlglot keeps ROLLUP (k) etc. among the keys
            if isinstance(node, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                kind = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE",
                        exp.GroupingSets: "GROUPING SETS"}[type(node)]
                raise base._refuse(f"GROUP BY {kind}",
                                   "list the grouping expressions explicitly", node)


def _check_nodes(base: _Base, tree: exp.Expression) -> None:
    """Functions and aggregates with no incremental form, anywhere in the query."""
    for node in tree.walk():
        if node is tree:
            continue
        if isinstance(node, exp.Window):
            raise base._refuse("window function (OVER ...)", "its value for a row depends "
                               "on other rows' positions, which every batch can shift", node)
        if isinstance(node, _NON_DETERMINISTIC_NODES) or (
                isinstance(node, exp.Func) and _func_name(node) in NON_DETERMINISTIC):
            raise base._refuse(f"non-deterministic function {_func_name(node).upper()}()",
                               "its value changes between batches, so no maintained "
                               "answer could equal a recompute", node)
        if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):
            raise base._refuse("aggregate FILTER (WHERE ...)", "move the condition into a "
                               "CASE inside the aggregate or into WHERE", node)
        if isinstance(node, exp.AggFunc):
            base._agg_call(node, resolved=False)  # raises for unsupported aggregates


def _rewrite_not_in(node: exp.Not, program: Program) -> None:
    """``x NOT IN (S)`` as a WHERE conjunct, rewritten into shapes that unnest.

    SQL's NOT IN holds when S is empty, or when x is not NULL, S has no NULL and no row
    equal to x.  As conjuncts over a derived table ``_ni`` holding S's one column ``_v``::

        NOT EXISTS (SELECT 1 FROM S _ni WHERE _ni._v = x)
        AND ((SELECT COUNT(*) FROM S _ni) = 0
             OR (x IS NOT NULL AND (SELECT COUNT(*) FROM S _ni WHERE _ni._v IS NULL) = 0))

    The NOT EXISTS becomes an anti-join and the two counts one-row inputs.  Only an
    uncorrelated S (it reads none of the outer query's names) directly under WHERE/AND is
    rewritten; anything else is left for the refusal below.
    """
    inner = node.this.this if isinstance(node.this, exp.Paren) else node.this
    if not (isinstance(inner, exp.In) and isinstance(inner.args.get("query"), exp.Subquery)):
        return
    parent = node.parent
    while isinstance(parent, (exp.And, exp.Paren)):
        parent = parent.parent
    sub = inner.args["query"].this
    if not isinstance(parent, exp.Where) or not isinstance(sub, exp.Select) \
            or len(sub.expressions) != 1 or _correlated(sub, program):
        return
    sub = sub.copy()
    sub.set("expressions", [exp.alias_(sub.expressions[0].unalias(), "_v")])
    x = inner.this

    def derived(where: exp.Expression | None, select: exp.Expression) -> exp.Select:
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


def _correlated(sub: exp.Select, program: Program) -> bool:
    """Whether a subquery reads a name from outside it (a guess made before qualification)."""
    own = {t.alias_or_name.lower() for t in sub.find_all(exp.Table)}
    own |= {s.alias.lower() for s in sub.find_all(exp.Subquery) if s.alias}
    columns = {c.name.lower() for t in sub.find_all(exp.Table)
               for decl in [program.table(t.name)] if decl is not None for c in decl.columns}
    for col in sub.find_all(exp.Column):
        if col.table and col.table.lower() not in own:
            return True
        if not col.table and col.name.lower() not in columns:
            return True
    return False


def _nested(tree: exp.Expression) -> bool:
    """True when the query holds subqueries, CTEs or set operations (the rewrite path)."""
    if not isinstance(tree, exp.Select) or tree.args.get("with_"):
        return True
    return any(isinstance(n, (exp.Select, exp.Subquery, exp.SetOperation)) and n is not tree
               for n in tree.walk())


def _is_cte_name(tree: exp.Expression, name: str) -> bool:
    return any(cte.alias_or_name.lower() == name.lower() for cte in tree.find_all(exp.CTE))


def _has_tail(node: exp.Expression) -> bool:
    """True when a set operation carries its own ORDER BY / LIMIT / OFFSET."""
    return any(node.args.get(k) is not None for k in ("order", "limit", "offset"))


def _plain_single(select: exp.Select) -> bool:
    """A SELECT with one input, no join, no aggregate, DISTINCT, GROUP BY, ORDER or LIMIT."""
    return (not select.args.get("joins") and not select.args.get("group")
            and select.args.get("having") is None and select.args.get("distinct") is None
            and not _has_tail(select) and not select.args.get("with_")
            and not any(_contains_aggregate(e) for e in select.expressions)
            and not any(isinstance(e, exp.Star) or (isinstance(e, exp.Column)
                                                   and isinstance(e.this, exp.Star))
                        for e in select.expressions))


def _output_names(tree: exp.Expression) -> list[str]:
    """The view's column names as DuckDB would give them, read before the rewrite renames."""
    node = tree
    while isinstance(node, exp.SetOperation):
        node = node.this
    if isinstance(node, exp.Subquery):
        node = node.this
    if not isinstance(node, exp.Select):
        return []
    names: list[str] = []
    used: set[str] = set()
    for i, item in enumerate(node.expressions):
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            return []
        name = item.alias if isinstance(item, exp.Alias) else _default_name(item, i)
        names.append(_unique(name, used))
    return names


def _rename_outputs(stage: StageTranslation, names: list[str]) -> StageTranslation:
    """The top stage with the view's own output names on its Project."""
    def rename(rel: Rel) -> Rel:
        if isinstance(rel, Project):
            return replace(rel, exprs=tuple(replace(e, name=n) for e, n in zip(rel.exprs, names)))
        if isinstance(rel, Limit):
            return replace(rel, child=rename(rel.child))
        return rel

    output = tuple(replace(c, name=n) for c, n in zip(stage.output, names))
    return replace(stage, rel=rename(stage.rel), output=output)


def _type_of(expr: Scalar, source: TableDecl) -> SqlType:
    """The type of an output column, as far as sqlglot can tell (shown by explain)."""
    return infer_type(expr, source.name, source.columns)


def _and_scalar(conds: list[exp.Expression]) -> Scalar | None:
    return Scalar.of(exp.and_(*[c.copy() for c in conds])) if conds else None


@dataclass
class _Input:
    """A FROM or JOIN item while a block is translated."""

    alias: str
    decl: TableDecl
    derived: bool
    node: exp.Join | None


@dataclass
class _Term:
    """One conjunctive part of a join with outer joins: inputs joined, anti-joined, padded."""

    inputs: list[str]
    pairs: list[tuple[str, str]] = field(default_factory=list)
    anti: list[tuple[str, list[tuple[str, str]], list[exp.Expression]]] = field(default_factory=list)
    padded: list[str] = field(default_factory=list)
    filters: list[exp.Expression] = field(default_factory=list)

    def _copy(self) -> _Term:
        return _Term(list(self.inputs), list(self.pairs), list(self.anti), list(self.padded),
                     list(self.filters))

    def _touches_padded(self, pairs: list[tuple[str, str]]) -> bool:
        return any(c.split("__", 1)[0] in self.padded for pair in pairs for c in pair)

    def inner(self, alias: str, pairs: list[tuple[str, str]], filters: list[exp.Expression]) -> list[_Term]:
        """Joins ``alias``; an equality with a padded (NULL) column empties the term."""
        if self._touches_padded(pairs):
            return []
        t = self._copy()
        t.inputs.append(alias)
        t.pairs += pairs
        t.filters += filters
        return [t]

    def left(self, alias: str, pairs: list[tuple[str, str]], filters: list[exp.Expression],
             pre: list[exp.Expression] | None = None) -> list[_Term]:
        """LEFT JOIN ``alias``: the matched term, and the unmatched ones (``alias`` padded).

        ``filters`` are ON conditions on ``alias`` alone, ``pre`` those on the preserved side
        alone: a preserved row failing ``pre`` matches nothing, so it is padded outright.
        """
        pre = pre or []
        if self._touches_padded(pairs):  # nothing can match a NULL key: always padded
            t = self._copy()
            t.padded.append(alias)
            return [t]
        matched = self._copy()
        matched.inputs.append(alias)
        matched.pairs += pairs
        matched.filters += filters + pre
        unmatched = self._copy()
        unmatched.anti.append((alias, list(pairs), list(filters)))
        unmatched.padded.append(alias)
        unmatched.filters += pre
        if not pre:
            return [matched, unmatched]
        excluded = self._copy()
        excluded.padded.append(alias)
        excluded.filters.append(exp.not_(exp.func("COALESCE", exp.paren(exp.and_(
            *(p.copy() for p in pre))), exp.false())))
        return [matched, unmatched, excluded]

    def rejected_by(self, conjunct: exp.Expression, flat_of: dict[str, tuple[str, str]]) -> bool:
        """True when WHERE ``conjunct`` can never hold on this term's rows."""
        while isinstance(conjunct, exp.Not) and isinstance(conjunct.this, exp.Not):
            conjunct = conjunct.this.this
        if isinstance(conjunct, exp.Paren):
            return self.rejected_by(conjunct.this, flat_of)
        if isinstance(conjunct, exp.Is) and isinstance(conjunct.expression, exp.Null) \
                and isinstance(conjunct.this, exp.Column):
            keys = {c for p in self.pairs for c in p}
            return conjunct.this.name in keys  # an equi-join key is never NULL
        padded = {c.name for c in conjunct.find_all(exp.Column)
                  if c.name in flat_of and flat_of[c.name][0] in self.padded}
        return bool(padded) and _null_rejecting(conjunct, padded)


_STRICT = (exp.Column, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Paren, exp.Neg,
           exp.Cast, exp.Literal)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike)


def _strict(node: exp.Expression, columns: set[str]) -> bool:
    """True when ``node`` is NULL whenever one of ``columns`` is (plain arithmetic over them)."""
    if isinstance(node, exp.Column):
        return node.name in columns
    if not isinstance(node, _STRICT):
        return False
    return any(_strict(child, columns) for child in node.iter_expressions())


def _null_rejecting(conjunct: exp.Expression, columns: set[str]) -> bool:
    """True when ``conjunct`` is not true if any of ``columns`` is NULL (conservative)."""
    if isinstance(conjunct, exp.Not) and isinstance(conjunct.this, exp.Is) \
            and isinstance(conjunct.this.expression, exp.Null):
        return _strict(conjunct.this.this, columns)
    if isinstance(conjunct, _COMPARISONS):
        return _strict(conjunct.this, columns) or _strict(conjunct.expression, columns)
    if isinstance(conjunct, exp.Between):
        return _strict(conjunct.this, columns)
    if isinstance(conjunct, exp.In) and not conjunct.args.get("query"):
        return _strict(conjunct.this, columns)
    return False


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

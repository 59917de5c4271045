"""Stage splitting: a (decorrelated) view becomes stages, producers first.

A query block (one SELECT) over declared sources is one stage.  Every CTE and every
derived table (FROM subquery) still standing after ``decorrelate`` is a stage of its own,
translated before the block that reads it; the reader sees it as a *derived* input, a table
named after the stage (``s1``, ``s2``, ... in the order they are translated) whose columns
are the stage's output.  The view's own stage is named ``""`` and comes last.

A UNION [ALL] is one stage whose input is the bag union of its branches, one per SELECT,
each projected onto the union's columns (named after the first SELECT's).  A branch that is
a plain SELECT over one input reads that input directly; any other (aggregates, DISTINCT,
joins) is a stage of its own that the branch reads.

Each block is translated as soon as it is split off (:func:`~incr.compiler.frontend.block.translate_block`):
a reader needs its producers' output columns, and errors are reported in the order the
query is read.  Finally the view's own output names (recorded by ``decorrelate``) go back
on the top stage.
"""

from __future__ import annotations

from dataclasses import replace

import sqlglot
from sqlglot import exp

from incr.compiler.frontend.block import translate_block
from incr.compiler.frontend.lower_block import type_of
from incr.compiler.frontend.query import UNION, Query, Scope, StageTranslation, UnionInput
from incr.compiler.frontend.resolve_names import (
    rename_outputs,
    resolve_columns,
    resolve_table,
    select_items,
    unique,
)
from incr.compiler.frontend.trees import contains_aggregate, is_star
from incr.compiler.ir import Aggregate, Branch, EquiJoin, Explode, JoinInput, Named, Project, Rel
from incr.compiler.program import Column, TableDecl
from incr.compiler.scalar import Scalar
from incr.compiler.types import SqlType

Ctes = dict[str, StageTranslation]

#: The column of an INTERSECT / EXCEPT union saying which side a row came from (0 or 1).
SIDE = "_incr_side"
#: The output column of an ALL set operation's SELECT that becomes its copies per row.
COPIES = "_incr_copies"


def split_stages(q: Query) -> Query:
    """Translates the view into stages, producers first; sets ``q.stages``.

    Raises:
        NotIncrementalizableError: for WITH RECURSIVE, UNION mixed with UNION ALL, or
            anything a block refuses.
        CompileError: for UNIONs of SELECTs with different column counts, or any error of
            a block.
    """
    splitter = _Splitter(q.scope)
    top = splitter.query(q.tree, "", {})
    if q.output_names and len(q.output_names) == len(top.output):
        top = rename_outputs(top, q.output_names)
    return replace(q, stages=(*splitter.stages, top))


class _Splitter:
    """The stages split off so far, and the counter that names them."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.stages: list[StageTranslation] = []
        self._names = 0

    def query(self, node: exp.Expr, name: str, ctes: Ctes) -> StageTranslation:
        """Translates a SELECT or UNION (with its CTEs and FROM subqueries) into stage ``name``."""
        if isinstance(node, exp.Subquery):
            node = node.this
        ctes = dict(ctes)
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise self.scope.refuse("WITH RECURSIVE", "recursive queries have no "
                                        "incremental form here", with_)
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = self.stage(cte.this, ctes)
            node.set("with_", None)
        if isinstance(node, exp.Union):
            return self.union(node, name, ctes)
        if isinstance(node, (exp.Intersect, exp.Except)):
            return self.set_operation(node, name, ctes)
        if not isinstance(node, exp.Select):
            raise self.scope.error(f"expected a SELECT, found {node.key.upper()}", node)
        derived: Ctes = {}
        items = [node.args["from_"]] if node.args.get("from_") else []
        items += node.args.get("joins") or []
        for holder in items:
            item = holder.this
            stage = None
            if isinstance(item, exp.Subquery):
                stage = self.stage(item.this, ctes)
            elif isinstance(item, exp.Table) and not item.args.get("db") and item.name.lower() in ctes:
                stage = ctes[item.name.lower()]
            if stage is not None:
                alias = item.alias_or_name
                ref = exp.Table(this=exp.to_identifier(stage.name), alias=exp.TableAlias(
                    this=exp.to_identifier(alias)))
                ref.meta["incr_stage"] = stage.name
                item.replace(ref)
                derived[stage.name] = stage
        return translate_block(self.scope, node, name, derived)

    def stage(self, node: exp.Expr, ctes: Ctes) -> StageTranslation:
        """Splits ``node`` off as the next stage ``s<n>`` (after the stages it reads)."""
        self._names += 1
        stage = self.query(node, f"s{self._names}", ctes)
        self.stages.append(stage)
        return stage

    def union(self, node: exp.Union, name: str, ctes: Ctes) -> StageTranslation:
        """A UNION [ALL] stage: one branch per SELECT, each projected onto the union's columns."""
        parts: list[exp.Expr] = []
        distinct = bool(node.args.get("distinct"))

        def flatten(n: exp.Expr) -> None:
            if isinstance(n, exp.Subquery) and isinstance(n.this, exp.Union) and not _has_tail(n.this):
                n = n.this
            if isinstance(n, exp.Union) and (n is node or not _has_tail(n)):
                if bool(n.args.get("distinct")) != distinct:
                    raise self.scope.refuse("UNION mixed with UNION ALL", "write the query with "
                                            "one kind of UNION, or nest one in a FROM subquery", n)
                flatten(n.this)
                flatten(n.expression)
                return
            parts.append(n)

        flatten(node)
        branches, columns = self.branches(parts, "UNION", ctes)
        source = TableDecl(UNION, columns, self.scope.location)
        select = exp.select(*[exp.column(c.name) for c in columns]).from_(UNION)
        if distinct:
            select.set("distinct", exp.Distinct())
        _keep_tail(node, select)
        return translate_block(self.scope, select, name, {}, UnionInput(source, branches))

    def set_operation(self, node: exp.Intersect | exp.Except, name: str,
                      ctes: Ctes) -> StageTranslation:
        """An INTERSECT or EXCEPT [ALL] stage: counts per row of each side, kept like a UNION.

        The two SELECTs are the branches of a bag union whose rows carry the side they came
        from (:data:`SIDE`); the stage groups that union by every column and counts each
        side's copies, ``l`` and ``r``.  A row is in ``INTERSECT`` when both are positive, in
        ``EXCEPT`` when ``l`` is and ``r`` is 0; ``INTERSECT ALL`` repeats it ``least(l, r)``
        times and ``EXCEPT ALL`` ``l - r`` times when that is positive (SQL's bag rules, NULLs
        equal to each other as in GROUP BY).  The counts are sums, so deletes are exact.
        """
        kind = "INTERSECT" if isinstance(node, exp.Intersect) else "EXCEPT"
        branches, columns = self.branches([node.this, node.expression], kind, ctes)
        branches = tuple(replace(b, project=(*(b.project or ()), Named(SIDE, Scalar.of(
            exp.Literal.number(i))))) for i, b in enumerate(branches))
        source = TableDecl(UNION, (*columns, Column(SIDE, SqlType("INTEGER"))),
                           self.scope.location)
        names = ", ".join(exp.column(c.name, quoted=True).sql() for c in columns)
        left, right = (f"COUNT(CASE WHEN {SIDE} = {i} THEN 1 END)" for i in (0, 1))
        if node.args.get("distinct"):
            keep = f"{left} > 0 AND {right} {'> 0' if kind == 'INTERSECT' else '= 0'}"
            select = sqlglot.parse_one(f"SELECT {names} FROM {UNION} GROUP BY {names} "
                                       f"HAVING {keep}", read="duckdb")
        else:
            times = f"least({left}, {right})" if kind == "INTERSECT" else f"{left} - {right}"
            select = sqlglot.parse_one(f"SELECT {names}, {times} AS {COPIES} FROM {UNION} "
                                       f"GROUP BY {names} HAVING {times} > 0", read="duckdb")
        assert isinstance(select, exp.Select)
        _keep_tail(node, select)
        stage = translate_block(self.scope, select, name, {}, UnionInput(source, branches))
        return stage if node.args.get("distinct") else _explode_copies(stage)

    def branches(self, parts: list[exp.Expr], kind: str,
                 ctes: Ctes) -> tuple[tuple[Branch, ...], tuple[Column, ...]]:
        """The SELECTs of a set operation as branches projected onto the first one's columns."""
        branches: list[Branch] = []
        columns: list[Column] = []
        for i, part in enumerate(parts):
            inner = part.this if isinstance(part, exp.Subquery) else part
            branch, outputs = self.union_branch(inner, i, ctes)
            if not columns:
                used: set[str] = {SIDE, COPIES}
                columns = [replace(c, name=unique(c.name, used), not_null=False) for c in outputs]
            elif len(outputs) != len(columns):
                raise self.scope.error(f"each SELECT of a {kind} must have the same number of "
                                       f"columns: {len(columns)} and {len(outputs)}", part)
            assert branch.project is not None
            branches.append(replace(branch, project=tuple(
                Named(col.name, expr.expr) for col, expr in zip(columns, branch.project))))
        return tuple(branches), tuple(columns)

    def union_branch(self, part: exp.Expr, index: int,
                     ctes: Ctes) -> tuple[Branch, tuple[Column, ...]]:
        """One SELECT of a UNION as a branch: inline when plain over one input, else a stage."""
        if isinstance(part, exp.Select) and _plain_single(part):
            table_node = part.args["from_"].this
            if isinstance(table_node, exp.Table) and (table_node.name.lower() in ctes or
                                                      self.scope.program.table(table_node.name)):
                return self.inline_branch(part, f"u{index}", ctes)
        st = self.stage(part, ctes)
        alias = f"u{index}"
        inp = JoinInput(alias, st.name, tuple(c.name for c in st.output), derived=True)
        project = tuple(Named(c.name, Scalar.column(inp.flat(c.name))) for c in st.output)
        return Branch(EquiJoin((inp,), ()), project=project), st.output

    def inline_branch(self, tree: exp.Select, alias: str,
                      ctes: Ctes) -> tuple[Branch, tuple[Column, ...]]:
        """A plain one-input SELECT as a union branch reading its input as ``alias``."""
        scope = self.scope
        table_node = tree.args["from_"].this
        stage = ctes.get(table_node.name.lower()) if not scope.program.table(table_node.name) else None
        decl = TableDecl(stage.name, stage.output, scope.location) if stage \
            else resolve_table(scope, table_node, {})
        resolve_columns(scope, tree, table_node.alias_or_name, decl)
        if tree.args.get("where") is not None and contains_aggregate(tree.args["where"].this):
            raise scope.error("aggregates are not allowed in WHERE; use HAVING", tree.args["where"])
        items = select_items(tree, decl)
        used = sorted({c.name for _, node in items for c in node.find_all(exp.Column)} |
                      {c.name for c in (tree.args["where"].this.find_all(exp.Column)
                                        if tree.args.get("where") is not None else [])},
                      key=[c.name for c in decl.columns].index)
        inp = JoinInput(alias, decl.name, tuple(used), derived=stage is not None)
        flat = {c: Scalar.column(inp.flat(c)) for c in used}
        where = Scalar.of(tree.args["where"].this).substitute(flat) \
            if tree.args.get("where") is not None else None
        project = tuple(Named(name, Scalar.of(node).substitute(flat)) for name, node in items)
        outputs = tuple(Column(name, type_of(Scalar.of(node), decl)) for name, node in items)
        return Branch(EquiJoin((inp,), ()), where=where, project=project), outputs


def _keep_tail(node: exp.Expr, select: exp.Select) -> None:
    """The set operation's own ORDER BY / LIMIT / OFFSET, moved onto the SELECT over it."""
    for key in ("order", "limit", "offset"):
        if node.args.get(key) is not None:
            select.set(key, node.args[key])


def _explode_copies(stage: StageTranslation) -> StageTranslation:
    """An ALL set operation's stage: each row repeated by its :data:`COPIES` output.

    The SELECT over the union computed the copies as an output column (so that they are
    maintained like any aggregate); here that column becomes the stage's Explode and leaves
    the output.
    """
    def rewrite(rel: Rel) -> Rel:
        if isinstance(rel, Project):
            copies = next(n.expr for n in rel.exprs if n.name == COPIES)
            kept = tuple(n for n in rel.exprs if n.name != COPIES)
            return replace(rel, child=insert(rel.child, copies), exprs=kept)
        return rel.with_child(rewrite(rel.children()[0]))

    def insert(rel: Rel, copies: Scalar) -> Rel:
        if isinstance(rel, Aggregate):
            return Explode(rel, COPIES, copies)
        return rel.with_child(insert(rel.children()[0], copies))

    return replace(stage, rel=rewrite(stage.rel),
                   output=tuple(c for c in stage.output if c.name != COPIES))


def _has_tail(node: exp.Expr) -> bool:
    """True when a set operation carries its own ORDER BY / LIMIT / OFFSET."""
    return any(node.args.get(k) is not None for k in ("order", "limit", "offset"))


def _plain_single(select: exp.Select) -> bool:
    """A SELECT with one input, no join, no aggregate, DISTINCT, GROUP BY, ORDER or LIMIT."""
    return (not select.args.get("joins") and not select.args.get("group")
            and select.args.get("having") is None and select.args.get("distinct") is None
            and not _has_tail(select) and not select.args.get("with_")
            and not any(contains_aggregate(e) for e in select.expressions)
            and not any(is_star(e) for e in select.expressions))

"""Joins: a block's FROM and JOIN items become branches of inner equi-joins.

A block reads one input (a declared source or an earlier stage) or joins several.  For a
join, every column is resolved to the joined relation's name ``<alias>__<column>`` (so the
passes see one source with unique column names), and the join is split:

* **Equi-join keys** come from ON and from WHERE: an equality between columns of two
  inputs is a key pair; every other condition filters the joined rows.  An input that meets
  no other through a key pair (a CROSS JOIN, a band join ``b.lo <= a.x AND a.x < b.hi``, a
  global aggregate) is crossed: a change of another input reads all of its side table, so
  this pays when that side is small (a dimension, a one-row input).  Outer joins need key
  pairs (their unmatched rows are found by key).
* **Outer joins** are kept as branches of the stage's input: the matched rows (an inner
  join) and, per preserved side, the unmatched rows (an anti-join, the other side padded
  with NULLs).  A condition on the preserved side alone in a LEFT JOIN's ON pads the rows
  failing it outright (a third branch).
* **Null-rejecting WHERE**: a WHERE conjunct that can never hold on a branch's rows drops
  that branch.  A conjunct that rejects NULLs of the padded side drops the unmatched branch
  (a LEFT JOIN whose right side must be present is an inner join: how ``IN`` and scalar
  subqueries arrive from ``decorrelate``); ``key IS NULL`` on the optional side drops the
  matched one (NOT EXISTS).

An inner join's conditions other than key pairs stay in the block's WHERE; with outer
joins each branch carries its own filter and the block's WHERE is emptied.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sqlglot import exp

from incr.compiler.frontend.query import UNION, Block, Scope
from incr.compiler.frontend.resolve_names import resolve_table
from incr.compiler.frontend.trees import conjuncts, contains_aggregate, is_star
from incr.compiler.ir import AntiJoin, Branch, EquiJoin, JoinInput
from incr.compiler.program import Column, TableDecl
from incr.compiler.scalar import CANONICAL_DIALECT, Scalar


def split_joins(b: Block) -> Block:
    """Reads the block's inputs and sets its source relation and branches.

    A UNION's SELECT keeps the union's relation and branches; a single input is read as it
    is (``alias`` set, its columns resolved later by ``resolve_names``); a join is resolved
    and split as the module docstring says.

    Raises:
        NotIncrementalizableError: for a join incr cannot maintain (NATURAL, SEMI,
            cross or non-equi joins, outer joins with other conditions, ...).
        CompileError: for unknown, ambiguous or duplicated names.
    """
    if b.union is not None:
        return replace(b, alias=UNION, source=b.union.source, branches=b.union.branches)
    inputs = read_inputs(b)
    if len(inputs) == 1:
        inp = inputs[0]
        join = EquiJoin((JoinInput(inp.alias.lower(), inp.decl.name, tuple(
            c.name for c in inp.decl.columns), inp.derived),), ())
        return replace(b, alias=inp.alias, source=inp.decl, branches=(Branch(join),))
    branches, source = _join(b, inputs)
    return replace(b, source=source, branches=branches)


@dataclass(frozen=True)
class Input:
    """A FROM or JOIN item: its alias, what it reads, and its JOIN clause (None for FROM)."""

    alias: str
    decl: TableDecl
    derived: bool
    node: exp.Join | None


def read_inputs(b: Block) -> list[Input]:
    """Every source in FROM and JOIN with how it is joined, refusing joins incr cannot keep."""
    scope, tree = b.scope, b.tree
    first = tree.args["from_"].this
    if not isinstance(first, exp.Table):
        raise scope.refuse("subquery in FROM", "only tables and inner queries named in "
                           "FROM are read", first)
    inputs = [Input(first.alias_or_name, resolve_table(scope, first, b.derived),
                    bool(first.meta.get("incr_stage")), None)]
    for j in tree.args.get("joins") or []:
        kind = (j.args.get("kind") or "").upper()
        if not isinstance(j.this, exp.Table):
            raise scope.refuse("subquery in JOIN", "only tables and inner queries named in "
                               "JOIN are read", j.this)
        if (j.args.get("method") or "").upper() == "NATURAL":
            raise scope.refuse("NATURAL JOIN", "write the condition as ON a.k = b.k", j)
        if kind not in ("", "INNER", "CROSS", "OUTER"):
            raise scope.refuse(f"{kind} JOIN", "inner, LEFT, RIGHT and FULL equi-joins are "
                               "maintained; write a semi-join as EXISTS", j)
        for key in ("pivots", "sample"):
            if j.this.args.get(key):
                raise scope.refuse(key.upper(), "it has no incremental form here", j.this)
        inputs.append(Input(j.this.alias_or_name, resolve_table(scope, j.this, b.derived),
                            bool(j.this.meta.get("incr_stage")), j))
        if j.args.get("using"):
            _using_as_on(scope, tree, j, inputs)
    seen_alias: set[str] = set()
    for inp in inputs:
        if inp.alias.lower() in seen_alias:
            raise scope.error(f"alias {inp.alias} is used twice in FROM", inp.node or first)
        seen_alias.add(inp.alias.lower())
    return inputs


def _using_as_on(scope: Scope, tree: exp.Select, j: exp.Join, inputs: list[Input]) -> None:
    """``JOIN r USING (c)`` as ``ON l.c = r.c``.

    ``l`` is the first input before ``r`` with a column ``c``; the unqualified ``c`` then
    names ``l.c`` (``r.c`` for a RIGHT join, their COALESCE for a FULL one), as in DuckDB
    (see :func:`_flatten_columns`).
    """
    right = inputs[-1]
    names = tree.meta.setdefault("incr_using", {})
    conditions = []
    for ident in j.args["using"]:
        name = ident.name
        left = next((i for i in inputs[:-1] if i.decl.column(name) is not None), None)
        if left is None or right.decl.column(name) is None:
            raise scope.error(f"USING column {name} is not in both sides of the join", j)
        conditions.append(exp.EQ(this=exp.column(name, table=left.alias),
                                 expression=exp.column(name, table=right.alias)))
        names[name.lower()] = ((j.args.get("side") or "").upper(), left.alias, right.alias)
    j.set("using", None)
    j.set("on", exp.and_(*conditions))


def _join(b: Block, inputs: list[Input]) -> tuple[tuple[Branch, ...], TableDecl]:
    """Resolves columns over several inputs and splits the joins into branches.

    Every column becomes ``<alias>__<column>``.  Inner joins: cross-input equalities in ON
    become key pairs, every other ON conjunct joins WHERE.  Outer joins split the input
    into a matched branch and unmatched branches (see the module docstring); a WHERE
    that rejects the padded NULLs drops the unmatched branch.
    """
    scope, tree = b.scope, b.tree
    if any(is_star(e) for e in tree.expressions):
        raise scope.error("SELECT * over a join is not supported; list the columns",
                          tree.expressions[0])
    for e in list(tree.expressions):  # keep DuckDB's output names for bare columns
        if isinstance(e, exp.Column):
            e.replace(exp.alias_(e.copy(), e.name))
    flat_of = _flatten_columns(scope, tree, inputs)

    def owners(node: exp.Expr) -> set[str]:
        return {flat_of[c.name][0] for c in node.find_all(exp.Column) if c.name in flat_of}

    def equality(conjunct: exp.Expr) -> tuple[str, str] | None:
        if (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                and isinstance(conjunct.expression, exp.Column)
                and conjunct.this.name in flat_of and conjunct.expression.name in flat_of
                and flat_of[conjunct.this.name][0] != flat_of[conjunct.expression.name][0]):
            return conjunct.this.name, conjunct.expression.name
        return None

    first = inputs[0].alias.lower()
    terms = [_Term([first])]
    joined = [first]
    for inp in inputs[1:]:
        j = inp.node
        assert j is not None
        alias, side = inp.alias.lower(), (j.args.get("side") or "").upper()
        on = conjuncts(j.args["on"]) if j.args.get("on") is not None else []
        j.set("on", None)
        pairs: list[tuple[str, str]] = []
        this_only: list[exp.Expr] = []
        earlier_only: list[exp.Expr] = []
        mixed: list[exp.Expr] = []
        for conjunct in on:
            if contains_aggregate(conjunct):
                raise scope.error("aggregates are not allowed in ON", conjunct)
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
                raise scope.refuse(f"LEFT JOIN condition {as_written(bad[0], flat_of)}",
                                   "an outer join's ON may hold equalities between the two "
                                   "tables and conditions on either table alone", bad[0])
            if not pairs:
                raise scope.refuse(f"LEFT JOIN of {inp.alias} without an equality",
                                   "outer joins are maintained on equalities (a.k = b.k)", j)
            terms = [t for term in terms
                     for t in term.left(alias, pairs, this_only, earlier_only)]
        else:  # RIGHT, FULL: the left side must be a single input
            if len(joined) > 1:
                raise scope.refuse(f"{side} JOIN after other joins", "write it as a LEFT "
                                   "JOIN, or make it the first join of the FROM clause", j)
            flipped = [(y, x) for x, y in pairs]
            if mixed or not pairs:
                cond = as_written(mixed[0], flat_of) if mixed else "(no equality)"
                raise scope.refuse(f"{side} JOIN condition {cond}", "an outer join's ON may "
                                   "hold equalities between the two tables and conditions "
                                   "on either table alone", mixed[0] if mixed else j)
            if side == "RIGHT":
                terms = _Term([alias]).left(first, flipped, earlier_only, this_only)
            else:
                terms = (_Term([first]).left(alias, pairs, this_only, earlier_only)
                         + _Term([alias]).left(first, flipped, earlier_only, this_only)[1:])
        joined.append(alias)

    where = tree.args.get("where")
    where_conjuncts = [c for c in (conjuncts(where.this) if where is not None else [])
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
            empty = _Term([inp.alias.lower() for inp in inputs], filters=[exp.false()])
        else:
            empty.filters.append(exp.false())
        kept = [empty]
    terms = kept
    by_alias = {inp.alias.lower(): JoinInput(inp.alias.lower(), inp.decl.name, tuple(
        c.name for c in inp.decl.columns if f"{inp.alias.lower()}__{c.name}" in flat_of),
        inp.derived) for inp in inputs}
    single_row = {a for a, inp in ((i.alias.lower(), i) for i in inputs)
                  if inp.derived and b.derived[inp.decl.name].single_row}
    outer = len(terms) > 1 or bool(terms[0].anti) or bool(terms[0].padded)
    if outer:
        for t in terms:
            _check_connected(scope, [by_alias[a] for a in t.inputs], t.pairs, single_row, tree)
    padded_anywhere = {a for t in terms for a in t.padded}
    columns = tuple(Column(flat, col.type, col.not_null and inp.alias.lower() not in padded_anywhere)
                    for inp in inputs for col in inp.decl.columns
                    for flat in [f"{inp.alias.lower()}__{col.name}"] if flat in flat_of)
    branches = []
    for t in terms:
        join = EquiJoin(tuple(by_alias[a] for a in t.inputs), tuple(t.pairs),
                        tuple(AntiJoin(by_alias[a], tuple(p), _and_scalar(f))
                              for a, p, f in t.anti))
        if outer:
            conds = [*t.filters, *(c.copy() for c in where_conjuncts)]
            branches.append(Branch(join, _and_scalar(conds), padded=tuple(
                by_alias[a] for a in t.padded)))
        else:
            branches.append(Branch(join))
    if outer:
        tree.set("where", None)
    elif terms[0].filters:
        tree.where(exp.and_(*terms[0].filters), copy=False)
    append_only = not outer and all(not i.derived and i.decl.append_only for i in inputs)
    source = TableDecl(name="joined", columns=columns, location=scope.location,
                       append_only=append_only)
    return tuple(branches), source


def _flatten_columns(scope: Scope, tree: exp.Select, inputs: list[Input]) -> dict[str, tuple[str, str]]:
    """Spells every column ``<alias>__<column>``; returns flat name -> (alias, declared column).

    A name found in no input is left alone when it is a SELECT alias (GROUP BY, HAVING and
    ORDER BY may use it); in ORDER BY an unqualified SELECT alias wins over an input column
    of the same name, as in DuckDB (``SELECT upper(o.item) AS item ... ORDER BY item``).
    """
    aliases = {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}
    order = tree.args.get("order")
    in_order = {id(c) for c in order.find_all(exp.Column)} if order is not None else set()
    by_alias = {inp.alias.lower(): inp for inp in inputs}
    by_table = {inp.decl.name.lower(): inp.alias for inp in inputs}
    flat_of: dict[str, tuple[str, str]] = {}
    for col in list(tree.find_all(exp.Column)):
        qualifier = col.table.lower() if col.table else None
        if qualifier is not None:
            alias = qualifier if qualifier in by_alias else by_table.get(qualifier)
            if alias is None:
                raise scope.error(f"unknown table or alias {col.table} in {col.sql()}", col)
            candidates = [by_alias[alias.lower()]]
        else:
            if id(col) in in_order and col.name in aliases:
                continue
            candidates = [i for i in inputs if i.decl.column(col.name) is not None]
            if not candidates and col.name in aliases:
                continue
            using = tree.meta.get("incr_using", {}).get(col.name.lower())
            if using is not None and len(candidates) > 1:  # a USING column: one name
                side, left, right = using
                if side == "FULL":
                    merged = exp.func("COALESCE", *(exp.column(col.name, table=a)
                                                     for a in (left, right)))
                    col.replace(merged)
                    for part in list(merged.find_all(exp.Column)):
                        _flatten_one(part, by_alias[part.table.lower()], flat_of)
                    continue
                candidates = [by_alias[(right if side == "RIGHT" else left).lower()]]
            if len(candidates) > 1:
                raise scope.error(f"column {col.name} is ambiguous: it is in "
                                  f"{', '.join(i.alias for i in candidates)}; qualify it", col)
        inp = candidates[0] if candidates else None
        if inp is None or inp.decl.column(col.name) is None:
            where = f"table {inp.alias}" if inp is not None else "any joined table"
            raise scope.error(f"unknown column {col.name} in {where}", col)
        _flatten_one(col, inp, flat_of)
    return flat_of


def _flatten_one(col: exp.Column, inp: Input, flat_of: dict[str, tuple[str, str]]) -> None:
    """Replaces ``col`` (a column of ``inp``) by its joined-relation name."""
    declared = inp.decl.column(col.name)
    assert declared is not None
    flat = f"{inp.alias.lower()}__{declared.name}"
    flat_of[flat] = (inp.alias.lower(), declared.name)
    resolved = exp.column(flat)
    resolved.this.meta.update(col.this.meta)
    col.replace(resolved)


def as_written(node: exp.Expr, flat_of: dict[str, tuple[str, str]]) -> str:
    """A condition for a message, its columns named ``alias.column`` as the user wrote them.

    The text kept before a subquery merge renamed its columns is preferred
    (:func:`~incr.compiler.frontend.decorrelate.remember_join_conditions`).
    """
    if "written" in node.meta:
        return str(node.meta["written"])
    def named(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and n.name in flat_of:
            alias, name = flat_of[n.name]
            return exp.column(name, table=alias)
        return n

    return str(node.transform(named).sql(CANONICAL_DIALECT))


def _check_connected(scope: Scope, inputs: list[JoinInput], pairs: list[tuple[str, str]],
                     crossed: set[str], tree: exp.Select) -> None:
    """With an outer join, every input meets the others through equalities.

    Single-row inputs excepted: an unmatched row is found by its key.
    """
    regular = [i for i in inputs if i.alias not in crossed]
    if not regular:
        return
    reached = {regular[0].alias} | crossed
    changed = True
    while changed:
        changed = False
        for a, c in pairs:
            sides = {next(i.alias for i in inputs if col in i.flat_columns) for col in (a, c)}
            if sides & reached and not sides <= reached:
                reached |= sides
                changed = True
    missing = [i for i in regular if i.alias not in reached]
    if missing:
        raise scope.refuse(f"outer join of {missing[0].alias} without an equality to the "
                           f"other tables (a non-equi outer join)", "an outer join is "
                           "maintained through its equality keys (a.k = b.k in ON); inner "
                           "cross and non-equi joins are maintained",
                           (tree.args.get("joins") or [tree])[0])


def _and_scalar(conds: list[exp.Expr]) -> Scalar | None:
    return Scalar.of(exp.and_(*[c.copy() for c in conds])) if conds else None


Pairs = list[tuple[str, str]]


@dataclass
class _Term:
    """One conjunctive part of a join with outer joins: inputs joined, anti-joined, padded.

    A working value while one block's joins are split (terms are copied, never shared);
    each surviving term becomes a :class:`~incr.compiler.ir.Branch`.
    """

    inputs: list[str]
    pairs: Pairs = field(default_factory=list)
    anti: list[tuple[str, Pairs, list[exp.Expr]]] = field(default_factory=list)
    padded: list[str] = field(default_factory=list)
    filters: list[exp.Expr] = field(default_factory=list)

    def _copy(self) -> _Term:
        return _Term(list(self.inputs), list(self.pairs), list(self.anti), list(self.padded),
                     list(self.filters))

    def _touches_padded(self, pairs: Pairs) -> bool:
        return any(c.split("__", 1)[0] in self.padded for pair in pairs for c in pair)

    def inner(self, alias: str, pairs: Pairs, filters: list[exp.Expr]) -> list[_Term]:
        """Joins ``alias``; an equality with a padded (NULL) column empties the term."""
        if self._touches_padded(pairs):
            return []
        t = self._copy()
        t.inputs.append(alias)
        t.pairs += pairs
        t.filters += filters
        return [t]

    def left(self, alias: str, pairs: Pairs, filters: list[exp.Expr],
             pre: list[exp.Expr] | None = None) -> list[_Term]:
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

    def rejected_by(self, conjunct: exp.Expr, flat_of: dict[str, tuple[str, str]]) -> bool:
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
        return bool(padded) and null_rejecting(conjunct, padded)


_STRICT = (exp.Column, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Paren, exp.Neg,
           exp.Cast, exp.Literal)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike)


def strict(node: exp.Expr, columns: set[str]) -> bool:
    """True when ``node`` is NULL whenever one of ``columns`` is (plain arithmetic over them)."""
    if isinstance(node, exp.Column):
        return node.name in columns
    if not isinstance(node, _STRICT):
        return False
    return any(strict(child, columns) for child in node.iter_expressions())


def null_rejecting(conjunct: exp.Expr, columns: set[str]) -> bool:
    """True when ``conjunct`` is not true if any of ``columns`` is NULL (conservative)."""
    if isinstance(conjunct, exp.Not) and isinstance(conjunct.this, exp.Is) \
            and isinstance(conjunct.this.expression, exp.Null):
        return strict(conjunct.this.this, columns)
    if isinstance(conjunct, _COMPARISONS):
        return strict(conjunct.this, columns) or strict(conjunct.expression, columns)
    if isinstance(conjunct, exp.Between):
        return strict(conjunct.this, columns)
    if isinstance(conjunct, exp.In) and not conjunct.args.get("query"):
        return strict(conjunct.this, columns)
    return False

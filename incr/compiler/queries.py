"""The queries a plan hands the runtime, as Spark SQL: h, a and Δ.

* h (:func:`render_h`): one state table's fold of a batch registered as a view;
* a (:func:`render_answer`): the answer over the state tables registered as views, and
  (:func:`render_answer_change`) the answer rows of the groups a batch touched;
* Δ (:func:`render_stage_delta`, :func:`render_anti_delta`, :func:`delta_sign`): the signed
  change of a stage's joined input when some of its inputs change.

:class:`~incr.compiler.plan.IncrementalPlan` renders its own h, a and Δ through these
(``h_sql``, ``answer_sql``, ``join_delta_sql``), so this module sits below the plan and
knows the plan's classes by type only; the rest of the SQL the runtime runs (MERGE text,
⊗̂, combining and exploding change sets) is :mod:`incr.compiler.sqlgen`'s.  Identifiers are
back-quoted and NULL ordering is always spelled out.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from typing import TYPE_CHECKING

from incr.compiler.dialect import BUCKET, ROW_COUNT, SPARK, WEIGHT, Bucket, q
from incr.compiler.dialect import live as plan_live
from incr.compiler.ir import AntiJoin, Branch, EquiJoin, JoinInput, Named, SortKey
from incr.compiler.program import Column
from incr.compiler.publish import GONE
from incr.compiler.scalar import Scalar
from incr.compiler.types import spark_type_name

if TYPE_CHECKING:  # the plan imports this module: its classes are annotations here only
    from incr.compiler.plan import Answer, HQuery, Rollup, StagePlan
    from incr.compiler.publish import Publish


def bucket_expression(columns: tuple[str, ...], buckets: int) -> str:
    """Spark SQL for the hash bucket of θ (0 when θ is empty)."""
    if not columns or buckets == 1:
        return "CAST(0 AS INT)"
    return f"CAST(pmod(xxhash64({', '.join(q(c) for c in columns)}), {buckets}) AS INT)"


def h_bucket(hq: HQuery) -> Bucket | None:
    """The bucket ``render_h`` computes by hashing (None: the constant 0 of one bucket)."""
    columns = hq.table.bucket_columns
    if not columns or hq.buckets == 1:
        return None
    return Bucket(BUCKET, columns, hq.buckets)


def render_h(hq: HQuery, batch_view: str, bucketed: bool = True) -> str:
    """The fold h of one state table over the batch registered as ``batch_view``.

    ``bucketed=False`` leaves ``_bucket`` NULL: for h of a table that is never stored (a
    streaming stage's rows, handed on as its output change), where no one reads the bucket
    and hashing it would only cost (and keep the driver-side engine from running it).
    """
    table = hq.table
    inner: list[str] = [f"{k.expr.render(SPARK)} AS {q(k.name)}" for k in table.keys]
    if table.value_key is not None:
        inner.append(f"{table.value_key.expr.render(SPARK)} AS {q(table.value_key.name)}")
    inner += [f"{k.expr.render(SPARK)} AS {q(k.name)}" for k in table.row_keys]
    args: dict[str, str] = {}
    if hq.weighted:
        inner.append(q(WEIGHT))
    for v in table.values:
        if v.arg is not None and v.arg.sql not in args:
            args[v.arg.sql] = f"_x{len(args)}"
            inner.append(f"{v.arg.render(SPARK)} AS {q(args[v.arg.sql])}")
    if not inner:
        inner.append("1 AS `_one`")
    where = f" WHERE {hq.where.render(SPARK)}" if hq.where is not None else ""
    key_cols = table.key_columns
    bucket = bucket_expression(table.bucket_columns, hq.buckets) if bucketed else "CAST(NULL AS INT)"
    outer = [f"{bucket} AS {q(BUCKET)}"]
    outer += [q(c) for c in key_cols]
    for v in table.values:
        arg = q(args[v.arg.sql]) if v.arg is not None else None
        if hq.weighted:  # side tables: a signed count per row (see HQuery)
            assert v.arg is None and len(v.columns) == 1, "only counts are kept weighted"
            outer.append(f"CAST(coalesce(sum({q(WEIGHT)}), 0) AS BIGINT) AS {q(v.columns[0])}")
            continue
        outer += [f"{sql} AS {q(col)}" for col, sql in zip(v.columns, v.monoid.spark_fold(arg))]
    sql = (f"SELECT {', '.join(outer)}\nFROM (SELECT {', '.join(inner)} "
           f"FROM {batch_view}{where}) AS h")
    if table.value_key is not None:
        sql += f"\nWHERE {q(table.value_key.name)} IS NOT NULL"
    if key_cols:
        sql += f"\nGROUP BY {', '.join(q(c) for c in key_cols)}"
    return sql


def render_stage_delta(stage: StagePlan, changed: dict[str, tuple[str, int]],
                       sides: dict[str, str], anti_deltas: dict[str, str] | None = None) -> str | None:
    """Δ of a stage's input relation, as signed rows (its columns plus ``_w``).

    ``changed`` maps each input alias whose rows changed in this batch to the registered
    view of its changes (the input's own column names plus ``_w``) and their sign (+1, -1,
    or 0 for mixed).  ``sides`` maps every alias to its side table's view (the rows before
    this batch), and ``anti_deltas`` each changed anti input to its ΔZ view
    (:func:`render_anti_delta`).

    For a branch joining inputs X1..Xn of which C1..Ck changed (in the branch's order),
    Δ(X1 ⋈ .. ⋈ Xn) is the sum over i of ΔCi joined with C1..C(i-1) at their new rows
    (side table plus change) and every other input at its old rows, weighted by the product
    of the weights: k terms, exact for inserts and deletes on any inputs at once, self-joins
    included (each alias of a table is an input of its own).  A view that reads one source
    k times (a CTE read six times, a row of scalar subqueries over one fact table) thus
    costs k joins per batch of that source, not 2^k - 1.  When an anti input changed too,
    the terms are one per non-empty subset of the changed inputs (ΔXi for i in the subset,
    old rows for the rest), as an anti input's change is a change of "no match" status,
    not of rows.  Returns None when no branch reads a changed input.
    """
    terms: list[str] = []
    for branch in stage.branches:
        for subset, newer in _terms(branch, changed):
            terms.append(_branch_term(branch, subset, changed, sides, anti_deltas or {},
                                      stage.source_columns, newer))
    if not terms:
        return None
    return "\nUNION ALL\n".join(terms)


def _terms(branch: Branch, changed: dict[str, tuple[str, int]]) -> list[tuple[set[str], set[str]]]:
    """Δ's terms for one branch: the inputs read as changes and those read at their new rows."""
    moved = [i.alias for i in branch.join.all_inputs if i.alias in changed]
    if not {a.input.alias for a in branch.join.anti} & set(moved):
        return [({alias}, set(moved[:n])) for n, alias in enumerate(moved)]
    return [(set(subset), set()) for size in range(1, len(moved) + 1)
            for subset in combinations(moved, size)]


def delta_sign(stage: StagePlan, changed: dict[str, tuple[str, int]]) -> int:
    """The sign every row of the stage's Δ has (+1 or -1), or 0 when it may have both.

    An input read at its new rows counts every row it holds after the batch: positive.
    """
    signs: set[int] = set()
    for branch in stage.branches:
        anti = {a.input.alias for a in branch.join.anti}
        for subset, _ in _terms(branch, changed):
            sign = 1
            for alias in subset:
                sign *= 0 if alias in anti else changed[alias][1]
            signs.add(sign)
    return signs.pop() if len(signs) == 1 else 0


def _renamed(inp: JoinInput, view: str, columns: tuple[str, ...] | None = None) -> str:
    """An input's change set with its columns spelled as in the joined relation."""
    cols = ", ".join(f"{q(c)} AS {q(inp.flat(c))}" for c in (columns or inp.columns))
    return f"(SELECT {cols + ', ' if cols else ''}{q(WEIGHT)} FROM {view})"


def _branch_term(branch: Branch, subset: set[str], changed: dict[str, tuple[str, int]],
                 sides: dict[str, str], anti_deltas: dict[str, str],
                 columns: tuple[Column, ...], newer: set[str]) -> str:
    order = tuple(c.name for c in columns)
    types = {c.name: spark_type_name(c.type) for c in columns}
    join = branch.join
    regular = list(join.inputs)
    # Start from a changed input (the small side), then join what connects.
    start = next((i for i in regular if i.alias in subset), regular[0])
    weights: list[str] = []

    def source(inp: JoinInput) -> str:
        if inp.alias in subset:
            weights.append(f"{q(inp.alias)}.{q(WEIGHT)}")
            return f"{_renamed(inp, changed[inp.alias][0])} AS {q(inp.alias)}"
        weights.append(f"{q(inp.alias)}.{q(ROW_COUNT)}")
        if inp.alias in newer:
            return f"{_new_rows(inp, sides[inp.alias], changed[inp.alias][0])} AS {q(inp.alias)}"
        return f"(SELECT * FROM {sides[inp.alias]}) AS {q(inp.alias)}"

    sql = f"FROM {source(start)}"
    joined = {start.alias}
    pending = [i for i in regular if i is not start]
    while pending:
        for inp in pending:
            conds = _conditions(join.pairs, join, inp.alias, joined)
            if conds:
                sql += f"\nJOIN {source(inp)} ON {' AND '.join(conds)}"
                break
        else:  # the rest meet no equality: single-row inputs, crossed
            inp = pending[0]
            sql += f"\nCROSS JOIN {source(inp)}"
        joined.add(inp.alias)
        pending.remove(inp)
    for anti in join.anti:
        alias = anti.input.alias
        if alias in subset:  # Z changed: rows gain (+1) or lose (-1) their "no match" status
            on = " AND ".join(f"{_col(join, a)} = {q('_dz_' + alias)}.{q(b)}" for a, b in anti.pairs)
            sql += f"\nJOIN {anti_deltas[alias]} AS {q('_dz_' + alias)} ON {on}"
            weights.append(f"{q('_dz_' + alias)}.{q(WEIGHT)}")
        else:
            on = " AND ".join(f"{_col(join, a)} = {q('_anti_' + alias)}.{q(b)}" for a, b in anti.pairs)
            where = f" WHERE {anti.filter.render(SPARK)}" if anti.filter is not None else ""
            sql += (f"\nLEFT ANTI JOIN (SELECT * FROM {sides[alias]}{where}) AS "
                    f"{q('_anti_' + alias)} ON {on}")
    exprs = {c: f"{q(i.alias)}.{q(c)}" for i in regular for c in i.flat_columns}
    for inp in branch.padded:  # the unmatched side: typed NULLs
        exprs.update({c: f"CAST(NULL AS {types[c]})" for c in inp.flat_columns if c in types})
    # The stage's column order, so that the branches of a UNION ALL line up.
    names = [c for c in order if c in exprs] if branch.project is None else list(exprs)
    selected = [f"{exprs[c]} AS {q(c)}" for c in names]
    weight = " * ".join(weights)
    inner = f"SELECT {', '.join(selected + [f'CAST({weight} AS BIGINT) AS {q(WEIGHT)}'])}\n{sql}"
    if branch.project is None and branch.where is None:
        return inner
    if branch.project is not None:
        outer = ", ".join(f"{n.expr.render(SPARK)} AS {q(n.name)}" for n in branch.project)
    else:
        outer = ", ".join(q(c) for c in names)
    where = f"\nWHERE {branch.where.render(SPARK)}" if branch.where is not None else ""
    return f"SELECT {outer}, {q(WEIGHT)} FROM (\n{inner}\n) AS `_term`{where}"


def _new_rows(inp: JoinInput, side: str, change: str) -> str:
    """An input's rows after this batch: its side table plus its change, summed per row.

    Summed, so that a row the change replaces (a derived input's old output row, -1) is
    gone rather than carried beside its replacement into every later term's join.
    """
    cols = ", ".join(q(c) for c in inp.flat_columns)
    both = (f"SELECT {cols + ', ' if cols else ''}{q(ROW_COUNT)} FROM {side}\nUNION ALL\n"
            f"SELECT {cols + ', ' if cols else ''}{q(WEIGHT)} AS {q(ROW_COUNT)} FROM "
            f"{_renamed(inp, change)} AS `_change`")
    group = f" GROUP BY {cols}" if cols else ""
    return (f"(SELECT {cols + ', ' if cols else ''}CAST(sum({q(ROW_COUNT)}) AS BIGINT) AS "
            f"{q(ROW_COUNT)} FROM (\n{both}\n) AS `_both`{group} HAVING sum({q(ROW_COUNT)}) <> 0)")


def _col(join: EquiJoin, flat: str) -> str:
    return f"{q(join.input_of(flat).alias)}.{q(flat)}"


def _conditions(pairs: tuple[tuple[str, str], ...], join: EquiJoin, alias: str,
                joined: set[str]) -> list[str]:
    out = []
    for a, b in pairs:
        sides = {join.input_of(a).alias, join.input_of(b).alias}
        if alias in sides and sides - {alias} <= joined and len(sides) == 2:
            out.append(f"{_col(join, a)} = {_col(join, b)}")
    return out


def render_anti_delta(anti: AntiJoin, changes: str, side: str) -> str:
    """ΔZ of an anti input: which join keys start (-1) or stop (+1) having a match.

    ``changes`` holds the input's signed changes (its own column names plus ``_w``) and
    ``side`` its rows before them.  A key whose count of matching rows goes from 0 to
    more blocks the rows waiting on it (-1); from more to 0 releases them (+1).  NULL keys
    never match, so they never move.
    """
    inp = anti.input
    keys = [b for _, b in anti.pairs]
    cols = ", ".join(q(k) for k in keys)
    where = [f"{q(k)} IS NOT NULL" for k in keys]
    if anti.filter is not None:
        where.append(anti.filter.render(SPARK))
    cond = " AND ".join(where)
    on = " AND ".join(f"d.{q(k)} = o.{q(k)}" for k in keys)
    semi = " AND ".join(f"s.{q(k)} = d2.{q(k)}" for k in keys)
    needed = tuple(dict.fromkeys(inp.columns))
    return (f"(SELECT {', '.join('d.' + q(k) for k in keys)}, CAST(CASE "
            f"WHEN coalesce(o.`_c`, 0) = 0 AND d.`_dw` > 0 THEN -1 "
            f"WHEN coalesce(o.`_c`, 0) > 0 AND coalesce(o.`_c`, 0) + d.`_dw` = 0 THEN 1 "
            f"ELSE 0 END AS BIGINT) AS {q(WEIGHT)}\n"
            f"FROM (SELECT {cols}, sum({q(WEIGHT)}) AS `_dw` FROM {_renamed(inp, changes, needed)} "
            f"AS c WHERE {cond} GROUP BY {cols}) AS d\n"
            f"LEFT JOIN (SELECT {', '.join('s.' + q(k) for k in keys)}, sum(s.{q(ROW_COUNT)}) AS `_c` "
            f"FROM (SELECT * FROM {side} WHERE {cond}) AS s LEFT SEMI JOIN (SELECT DISTINCT {cols} "
            f"FROM {_renamed(inp, changes, needed)} AS c) AS d2 ON {semi} "
            f"GROUP BY {', '.join('s.' + q(k) for k in keys)}) AS o ON {on})")


def render_answer(answer: Answer, views: dict[str, str]) -> str:
    """a(state) over state tables registered as temporary views (``views[table]``)."""
    if answer.rows is not None and answer.order:
        return _ordered_windows(answer, views)
    select = ", ".join(f"{e.expr.render(SPARK)} AS {q(e.name)}" for e in answer.exprs)
    live = f" WHERE {plan_live(q(ROW_COUNT))}" if answer.grouped else ""
    groups = {b.alias: _group_values(answer, b.value_of, views[answer.main])
              for b in answer.bags if b.value_of is not None}
    if answer.rollup is not None:  # a finer grouping's state, regrouped by the view's keys
        as_they_are = {b.table for b in answer.bags if b.value_of is None and not b.centered
                       and all(a.idempotent for a in b.aggregates)}
        views = {**views, **{t.table: _regrouped(answer.rollup, t.table, views[t.table],
                                                 live if t.table == answer.main else "",
                                                 combined=t.table not in as_they_are)
                             for t in answer.rollup.tables}}
        live = ""
    sql = f"SELECT {select}\nFROM (SELECT * FROM {views[answer.main]}{live}) AS m"
    for bag in answer.bags:
        aggs = ", ".join(f"{a.sql} AS {q(a.name)}" for a in bag.aggregates)
        keys = ", ".join(q(k) for k in answer.keys)
        rows = groups.get(bag.alias, views[bag.table])
        rows = _centered(rows, answer.keys) if bag.centered else rows
        if answer.keys:
            on = " AND ".join(f"m.{q(k)} <=> {bag.alias}.{q(k)}" for k in answer.keys)
            sql += (f"\nLEFT JOIN (SELECT {keys}, {aggs} FROM {rows} GROUP BY {keys})"
                    f" AS {bag.alias} ON {on}")
        else:
            sql += f"\nCROSS JOIN (SELECT {aggs} FROM {rows}) AS {bag.alias}"
    if answer.rows is not None:  # a window stage: each partition's rows (see Answer)
        on = " AND ".join(f"m.{q(k)} <=> r.{q(k)}" for k in answer.keys) or "true"
        sql += f"\nJOIN (SELECT * FROM {views[answer.rows]}) AS r ON {on}"
    if answer.explode is not None:
        sql += (f"\nLATERAL VIEW explode(sequence(CAST(1 AS BIGINT), "
                f"{answer.explode.render(SPARK)})) AS `_copy`")
    if answer.having is not None:
        sql += f"\nWHERE {answer.having.render(SPARK)}"
    return sql + _ordered(answer.order, answer)


def _group_values(answer: Answer, column: str, main: str) -> str:
    """The bag of θ's ``column``, read from the live groups of ``main`` (registered as such).

    A subquery without an alias, in a bag's columns: the answer's keys, ``value`` and
    ``_n``.  Each group holds one value, copied by every row of the group; a view that
    regroups the state regroups these rows as it regroups a bag table (:func:`_regroup`).
    """
    where = f" WHERE {plan_live(q(ROW_COUNT))} AND {q(column)} IS NOT NULL"
    value = f"{q(column)} AS `value`"
    if answer.rollup is None:
        keys = ", ".join(q(k) for k in answer.keys)
        return f"(SELECT {keys}, {value}, {q(ROW_COUNT)} FROM {main}{where})"
    return _regroup(answer.rollup, ("value",), ((ROW_COUNT, "sum"),),
                    f"(SELECT *, {value} FROM {main}{where})", "")


def _regrouped(rollup: Rollup, table: str, view: str, where: str, combined: bool = True) -> str:
    """State table ``table`` (registered as ``view``) regrouped by the rollup's keys.

    A subquery without an alias, read where the table's name would be: each coarse group's
    rows (of the live rows, for the main table: ``where``) combined into one by each value's
    monoid, under the view's names for the keys.  Without ``combined``, a bag's rows as
    they are, under those names: what only MIN or MAX read (:attr:`BagAggregate.idempotent`).
    """
    t = rollup.table(table)
    return _regroup(rollup, t.by, t.combined if combined else None, view, where)


def render_coarse_groups(rollup: Rollup, touched: str) -> str:
    """The coarse groups of ``rollup`` that the finer groups of ``touched`` fall in.

    ``touched`` holds θ under the state's names; each coarse group comes out once, under
    the view's names for its keys.
    """
    keys = ", ".join(f"{key} AS {q(own)}" for key, own in _rollup_keys(rollup))
    return f"SELECT DISTINCT {keys} FROM {touched}"


def _rollup_keys(rollup: Rollup) -> list[tuple[str, str]]:
    """Each key of a regrouped view as SQL over the state's columns, with the view's name."""
    return [*((q(state), own) for state, own in rollup.keys),
            *((expr.render(SPARK), own) for expr, own in rollup.derived)]


def _regroup(rollup: Rollup, by: tuple[str, ...],
             combined: tuple[tuple[str, str], ...] | None, view: str, where: str) -> str:
    """``view``'s rows regrouped by the rollup's keys and ``by``.

    Each key is a state column or an expression over the state's columns, under the
    view's name for it.

    Each column of ``combined`` is aggregated by its function; with None, the rows are kept
    as they are.  The one regrouping rule of a state table and of a bag of θ's column.
    ``where`` (empty, or a WHERE clause with its leading space) keeps some rows of
    ``view``, and so does the view's own WHERE over θ (:attr:`Rollup.where`).
    """
    if rollup.where is not None:
        kept = f"({rollup.where.render(SPARK)})"
        where = f"{where} AND {kept}" if where else f" WHERE {kept}"
    keys = _rollup_keys(rollup)
    named = [f"{key} AS {q(own)}" for key, own in keys] + [q(c) for c in by]
    if combined is None:
        return f"(SELECT {', '.join(named)} FROM {view}{where})"
    values = [f"{fn}({q(c)}) AS {q(c)}" for c, fn in combined]
    group = ", ".join([key for key, _ in keys] + [q(c) for c in by])
    return (f"(SELECT {', '.join(named + values)} FROM {view}{where}"
            f"{f' GROUP BY {group}' if group else ''})")


def _ordered(order: tuple[SortKey, ...], answer: Answer) -> str:
    """The ORDER BY ``order``, LIMIT and OFFSET of ``answer``, as a query's tail."""
    sql = "\nORDER BY " + ", ".join(_sort_key(k) for k in order) if order else ""
    if answer.limit is not None:
        sql += f"\nLIMIT {answer.limit}"
    if answer.offset:
        sql += f"\nOFFSET {answer.offset}"
    return sql


def _ordered_windows(answer: Answer, views: dict[str, str]) -> str:
    """A window stage's answer with ORDER BY.

    Spark sorts by a window's value only through a column, so the windows are computed in a
    subquery, with each sort key as a column.
    """
    keys = tuple(Named(f"_o{i}", k.expr) for i, k in enumerate(answer.order))
    inner = replace(answer, exprs=answer.exprs + keys, order=(), limit=None, offset=0)
    order = tuple(replace(k, expr=Scalar.column(f"_o{i}")) for i, k in enumerate(answer.order))
    return (f"SELECT {', '.join(q(e.name) for e in answer.exprs)} FROM (\n"
            f"{render_answer(inner, views)}\n) AS `_windows`" + _ordered(order, answer))


def render_answer_change(answer: Answer, publish: Publish, views: dict[str, str],
                         touched: str) -> str:
    """The rows an answer MERGE applies for the groups in ``touched`` (see :mod:`publish`).

    ``views`` hold the touched groups' state rows only; ``touched`` holds θ of each touched
    group.  Every touched group gets one tombstone row (its key columns, :data:`GONE`
    true) that deletes its current answer rows, and its new answer rows (:data:`GONE`
    false) are inserted.
    """
    assert publish.by_change, "a rewritten answer has no change query"
    theta = dict(publish.keys)
    names = [e.name for e in answer.exprs]
    cols = ", ".join(q(n) for n in names)
    tomb = ", ".join(f"k.{q(theta[n])} AS {q(n)}" if n in theta else f"NULL AS {q(n)}"
                     for n in names)
    distinct = ", ".join(f"{q(k)}" for _, k in publish.keys)
    return (f"SELECT {cols}, false AS {q(GONE)} FROM (\n{render_answer(answer, views)}\n) AS a\n"
            f"UNION ALL\nSELECT {tomb}, true AS {q(GONE)} FROM (SELECT DISTINCT {distinct} "
            f"FROM {touched}) AS k")


def render_top_check(publish: Publish, candidates: str, old: str) -> str:
    """How many new top rows rank at or above the old top's last row (one row: ``n``).

    ``candidates`` holds the new top rows computed from the old top rows' groups and the
    touched groups, ``old`` the answer's rows before the batch.  Every untouched group
    outside the old top ranks below its last row, so the candidates are the exact answer
    when the old top was not full, or when ``n`` reaches k (see :mod:`publish`).  A row
    ranks at or above the last old row when some old row does not rank strictly before it.
    """
    assert publish.top, "only a top-k answer has this check"
    return (f"SELECT count(*) AS `n` FROM {candidates} AS r LEFT SEMI JOIN {old} AS o ON "
            f"NOT ({_before(publish.order, 'o', 'r')})")


def _before(order: tuple[SortKey, ...], x: str, y: str) -> str:
    """SQL: row ``x`` sorts strictly before row ``y`` under ``order`` (columns by name)."""
    if not order:
        return "false"
    key, rest = order[0], order[1:]
    a, b = f"{x}.{q(key.expr.sql)}", f"{y}.{q(key.expr.sql)}"
    nulls = (f"({a} IS NULL AND {b} IS NOT NULL)" if key.nulls_first
             else f"({a} IS NOT NULL AND {b} IS NULL)")
    first = f"({nulls} OR coalesce({a} {'>' if key.descending else '<'} {b}, false))"
    if not rest:
        return first
    return f"({first} OR ({a} <=> {b} AND {_before(rest, x, y)}))"


def _centered(bag: str, keys: tuple[str, ...]) -> str:
    """A value-count bag's rows, each with ``_mean``: the mean of its θ's live values."""
    mean = (f"sum({q(ROW_COUNT)} * CAST(`value` AS DOUBLE)) / CAST(sum({q(ROW_COUNT)}) AS DOUBLE) "
            f"AS `_mean`")
    if not keys:
        return f"(SELECT v.*, u.`_mean` FROM {bag} AS v CROSS JOIN (SELECT {mean} FROM {bag}) AS u) AS `_c`"
    listed = ", ".join(q(k) for k in keys)
    on = " AND ".join(f"v.{q(k)} <=> u.{q(k)}" for k in keys)
    return (f"(SELECT v.*, u.`_mean` FROM {bag} AS v JOIN (SELECT {listed}, {mean} FROM {bag} "
            f"GROUP BY {listed}) AS u ON {on}) AS `_c`")


def _sort_key(key: SortKey) -> str:
    return (f"{key.expr.render(SPARK)} {'DESC' if key.descending else 'ASC'} "
            f"NULLS {'FIRST' if key.nulls_first else 'LAST'}")

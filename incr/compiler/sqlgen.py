"""Rendering plans as SQL text: Spark SQL for h and a, MERGE text for ⊗ / ⊗̃.

The runtime executes exactly these strings, and ``incr explain`` prints them, so what a
user reads is what runs.

Spark differences handled here: division is ``try_divide`` over DOUBLEs (DuckDB's ``/``
is floating-point division even for integers and decimals; NULL on a zero divisor, where
Spark's ANSI mode would fail the batch), identifiers are back-quoted, and NULL ordering is
always spelled out.
"""

from __future__ import annotations

from sqlglot import exp

from incr.compiler.ir import EquiJoin, JoinInput, SortKey
from incr.compiler.plan import (BUCKET, ROW_COUNT, Answer, DiffusionSpec, HQuery, MergeSpec,
                                StateTable)
from incr.compiler.scalar import Scalar

SPARK = "spark"


def render_expression(tree: exp.Expression, dialect: str) -> str:
    """SQL text of a scalar expression in ``dialect``."""
    if dialect == SPARK:
        def safe_div(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Div):  # DuckDB's `/` is floating-point division
                return exp.Anonymous(this="try_divide", expressions=[
                    exp.cast(node.this, "DOUBLE"), exp.cast(node.expression, "DOUBLE")])
            return node

        tree = tree.transform(safe_div)
    return tree.sql(dialect=dialect)


def q(name: str) -> str:
    """A back-quoted Spark identifier."""
    return "`" + name.replace("`", "``") + "`"


def bucket_expression(columns: tuple[str, ...], buckets: int) -> str:
    """Spark SQL for the hash bucket of θ (0 when θ is empty)."""
    if not columns or buckets == 1:
        return "CAST(0 AS INT)"
    return f"CAST(pmod(xxhash64({', '.join(q(c) for c in columns)}), {buckets}) AS INT)"


def render_h(hq: HQuery, batch_view: str) -> str:
    """h for one state table over the batch registered as ``batch_view``."""
    table = hq.table
    inner: list[str] = [f"{k.expr.render(SPARK)} AS {q(k.name)}" for k in table.keys]
    if table.value_key is not None:
        inner.append(f"{table.value_key.expr.render(SPARK)} AS {q(table.value_key.name)}")
    args: dict[str, str] = {}
    for v in table.values:
        if v.arg is not None and v.arg.sql not in args:
            args[v.arg.sql] = f"_x{len(args)}"
            inner.append(f"{v.arg.render(SPARK)} AS {q(args[v.arg.sql])}")
    if not inner:
        inner.append("1 AS `_one`")
    where = f" WHERE {hq.where.render(SPARK)}" if hq.where is not None else ""
    key_cols = table.key_columns
    outer = [f"{bucket_expression(table.bucket_columns, hq.buckets)} AS {q(BUCKET)}"]
    outer += [q(c) for c in key_cols]
    for v in table.values:
        arg = q(args[v.arg.sql]) if v.arg is not None else None
        outer += [f"{sql} AS {q(col)}" for col, sql in zip(v.columns, v.monoid.spark_fold(arg))]
    sql = (f"SELECT {', '.join(outer)}\nFROM (SELECT {', '.join(inner)} "
           f"FROM {batch_view}{where}) AS h")
    if table.value_key is not None:
        sql += f"\nWHERE {q(table.value_key.name)} IS NOT NULL"
    if key_cols:
        sql += f"\nGROUP BY {', '.join(q(c) for c in key_cols)}"
    return sql


def render_join_delta(join: EquiJoin, changed: JoinInput, batch_view: str,
                      side_views: dict[str, str]) -> str:
    """Δ of an inner equi-join when a batch of one input lands: ΔX ⋈ (the other inputs' state).

    Each other input is read from its side table (its live rows as (row, count) pairs), so a
    new row meets the rows that arrived on the other sides in earlier batches; the product of
    their counts is the multiplicity of each joined row, restored by ``explode``.  Inputs are
    joined in an order that keeps every step connected by an equality (no cross products).
    """
    cols = ", ".join(f"{q(c)} AS {q(changed.flat(c))}" for c in changed.columns) or "1 AS `_one`"
    sql = f"FROM (SELECT {cols} FROM {batch_view}) AS {q(changed.alias)}"
    joined = {changed.alias}
    weights: list[str] = []
    pending = [i for i in join.inputs if i.alias != changed.alias]
    while pending:
        for inp in pending:
            conds = [(a, b) for a, b in join.pairs
                     if {join.input_of(a).alias, join.input_of(b).alias} & {inp.alias}
                     and {join.input_of(a).alias, join.input_of(b).alias} - {inp.alias} <= joined]
            if conds:
                break
        else:  # pragma: no cover - translate checks the join is connected
            raise AssertionError("join graph is not connected")
        on = " AND ".join(f"{q(join.input_of(a).alias)}.{q(a)} = {q(join.input_of(b).alias)}.{q(b)}"
                          for a, b in conds)
        sql += (f"\nJOIN (SELECT * FROM {side_views[inp.alias]} WHERE {q(ROW_COUNT)} > 0) AS "
                f"{q(inp.alias)} ON {on}")
        weights.append(f"{q(inp.alias)}.{q(ROW_COUNT)}")
        joined.add(inp.alias)
        pending.remove(inp)
    select = ", ".join(f"{q(i.alias)}.{q(c)}" for i in join.inputs for c in i.flat_columns)
    sql = f"SELECT {select}\n{sql}"
    if weights:
        sql += (f"\nLATERAL VIEW explode(sequence(CAST(1 AS BIGINT), {' * '.join(weights)})) "
                f"AS `_copy`")
    return sql


def render_answer(answer: Answer, views: dict[str, str]) -> str:
    """a(state) over state tables registered as temporary views (``views[table]``)."""
    select = ", ".join(f"{e.expr.render(SPARK)} AS {q(e.name)}" for e in answer.exprs)
    live = f" WHERE {q(ROW_COUNT)} > 0" if answer.grouped else ""
    sql = f"SELECT {select}\nFROM (SELECT * FROM {views[answer.main]}{live}) AS m"
    for bag in answer.bags:
        aggs = ", ".join(f"{a.func}({q('value')}) AS {q(a.name)}" for a in bag.aggregates)
        keys = ", ".join(q(k) for k in answer.keys)
        if answer.keys:
            on = " AND ".join(f"m.{q(k)} <=> {bag.alias}.{q(k)}" for k in answer.keys)
            sql += (f"\nLEFT JOIN (SELECT {keys}, {aggs} FROM {views[bag.table]} GROUP BY {keys})"
                    f" AS {bag.alias} ON {on}")
        else:
            sql += f"\nCROSS JOIN (SELECT {aggs} FROM {views[bag.table]}) AS {bag.alias}"
    if answer.explode is not None:
        sql += (f"\nLATERAL VIEW explode(sequence(CAST(1 AS BIGINT), "
                f"{answer.explode.render(SPARK)})) AS `_copy`")
    if answer.having is not None:
        sql += f"\nWHERE {answer.having.render(SPARK)}"
    if answer.order:
        sql += "\nORDER BY " + ", ".join(_sort_key(k) for k in answer.order)
    if answer.limit is not None:
        sql += f"\nLIMIT {answer.limit}"
    if answer.offset:
        sql += f"\nOFFSET {answer.offset}"
    return sql


def _sort_key(key: SortKey) -> str:
    return (f"{key.expr.render(SPARK)} {'DESC' if key.descending else 'ASC'} "
            f"NULLS {'FIRST' if key.nulls_first else 'LAST'}")


def merge_condition(keys: tuple[str, ...], target: str = "t", source: str = "s") -> str:
    """The join condition of ⊗ / ⊗̃: same bucket and null-safe equal key columns.

    Each comparison is parenthesised: DataFusion's parser binds ``IS NOT DISTINCT FROM``
    looser than ``AND``.
    """
    parts = [f"{target}.{BUCKET} = {source}.{BUCKET}"]
    parts += [f"({target}.{_dq(k)} IS NOT DISTINCT FROM {source}.{_dq(k)})" for k in keys]
    return " AND ".join(parts)


def _dq(name: str) -> str:
    """A double-quoted identifier for the merge SQL (DataFusion folds unquoted names)."""
    return '"' + name.replace('"', '""') + '"'


def render_merge(spec: MergeSpec, table: StateTable) -> str:
    """The MERGE statement text of a spec, as ``incr explain`` prints it."""
    lines = [f"MERGE INTO {table.name} AS t USING h(ΔS) AS s",
             f"  ON {merge_condition(spec.keys)}"]
    if spec.delete_when:
        lines.append(f"WHEN MATCHED AND {spec.delete_when} THEN DELETE")
    sets = ",\n".join(f"    {col} = {sql}" for col, sql in spec.updates)
    lines.append(f"WHEN MATCHED THEN UPDATE SET\n{sets}")
    if spec.insert_unmatched:
        lines.append("WHEN NOT MATCHED THEN INSERT *")
    else:
        lines.append("-- every row of h(ΔS') matches: the batch was validated against the "
                     "source's live rows")
    return "\n".join(lines)


def render_diffusion(spec: DiffusionSpec) -> str:
    """⊗̂ as a query: ΔT's rows, combined with T's where the key matches."""
    keys = ", ".join(f"s.{k}" for k in spec.keys)
    cols = ",\n".join(f"    {sql} AS {col}" for col, sql in spec.exprs)
    on = merge_condition(spec.keys)
    return (f"SELECT s._bucket{', ' + keys if keys else ''},\n{cols}\n"
            f"FROM h(ΔX) AS s LEFT JOIN {spec.table} AS t ON {on}")


def scalar_sql(s: Scalar) -> str:
    """Spark text of a Scalar (shorthand used by explain)."""
    return s.render(SPARK)

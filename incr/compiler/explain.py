"""``incr explain``: a plan as a readable tree, without running anything.

For each view: the query, its normalized IR, the lineage key θ, every state table with
column types and monoids, h (Spark SQL), ⊗ and ⊗̃ (MERGE), ⊗̂ (diffusion) and a (Spark
SQL).  Column types come from sqlglot's type annotation over the declared source schema;
Spark's own result types decide the stored schema, and agree for the declared types.
"""

from __future__ import annotations

from functools import lru_cache

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types

from incr.algebra.monoids import Count, Max, Min, Moments, Sum
from incr.compiler import CompiledProgram
from incr.compiler.plan import BUCKET, IncrementalPlan, StateTable, StateValue
from incr.compiler.program import Column
from incr.compiler.scalar import CANONICAL_DIALECT, Scalar
from incr.compiler.sqlgen import render_diffusion, render_merge


def explain_program(compiled: CompiledProgram) -> str:
    """The explanation of every view of a program."""
    prog = compiled.program
    header = [f"program {prog.name} ({prog.path})",
              f"  dialect {prog.options.dialect}; {prog.options.buckets} hash buckets per state table"]
    for t in prog.tables:
        cols = ", ".join(f"{c.name} {c.type}{' NOT NULL' if c.not_null else ''}" for c in t.columns)
        mode = "append-only" if t.append_only else "inserts and deletes"
        header.append(f"  source {t.name}({cols}) -- {mode}")
    return "\n".join(header) + "\n\n" + "\n\n".join(explain_plan(p) for p in compiled.plans) + "\n"


def explain_plan(plan: IncrementalPlan) -> str:
    """The explanation of one view."""
    out: list[str] = [f"view {plan.view}  (state {plan.state_fingerprint}, "
                      f"answer {plan.answer_fingerprint})"]
    out.append(_section("query", plan.select.strip()))
    out.append(_section("normalized IR", plan.logical.pretty()))
    theta = ", ".join(f"{k.name} = {k.expr}" for k in plan.lineage) or "() -- global aggregate: one state row"
    out.append(_section("lineage key θ", theta))
    for table in plan.tables:
        out.append(_section(f"state table {table.name}", _schema(table, plan)))
    if plan.join is not None:
        out.append(_section("join (inner, equi)", str(plan.join)))
        for source in plan.sources:
            sides = {i.alias: f"state.side_{i.alias}" for i in plan.join.inputs}
            out.append(_section(f"Δjoined when a batch of {source} lands",
                                plan.join_delta_sql(source, f"Δ{source}", sides)))
    for hq in plan.h:
        out.append(_section(f"h  (batch → {hq.table.name})", plan.h_sql(hq.table.name, f"Δ{hq.source}")))
    for spec in plan.merge:
        out.append(_section(f"⊗  (merge inserts into {spec.table})", render_merge(spec, plan.table(spec.table))))
    if plan.diminish:
        for spec in plan.diminish:
            out.append(_section(f"⊗̃  (diminish deletes from {spec.table})",
                                render_merge(spec, plan.table(spec.table))))
    else:
        out.append(_section("⊗̃", f"none: {plan.source} is append-only, so MIN/MAX keep the plain "
                                 "monoid (no inverse) and delete batches are refused"))
    for d in plan.diffuse:
        out.append(_section(f"⊗̂  (diffusion over {d.table})", render_diffusion(d)))
    views = {t.name: f"state.{t.name}" for t in plan.tables}
    out.append(_section("a  (answer)", plan.answer_sql(views)))
    return "\n".join(out)


def _section(title: str, body: str) -> str:
    lines = body.splitlines() or [""]
    return f"  {title}:\n" + "\n".join(f"    {line}" for line in lines)


def _schema(table: StateTable, plan: IncrementalPlan) -> str:
    hashed = ", ".join(table.bucket_columns) if table.side_of else "θ"
    rows = [f"{BUCKET:<14} INT        partition: pmod(xxhash64({hashed}), "
            f"{plan.buckets if table.keys else 1})"]
    for k in table.keys:
        expr = Scalar.column(k.name) if table.side_of else k.expr  # side keys: joined names
        rows.append(f"{k.name:<14} {infer_type(expr, plan.source, plan.source_columns):<10} key: {k.expr}")
    if table.value_key is not None:
        vk = table.value_key
        rows.append(f"{vk.name:<14} {infer_type(vk.expr, plan.source, plan.source_columns):<10} "
                    f"key: value of {vk.expr} (bag of live values)")
    for v in table.values:
        for col, typ in zip(v.columns, _value_types(v, plan)):
            rows.append(f"{col:<14} {typ:<10} {v.describe()}")
    vanish = "rows whose _n reaches 0 are deleted" if table.vanishes else \
        "the single global row stays (an empty input still answers one row)"
    rows.append(f"-- sorted by θ within buckets; {vanish}")
    return "\n".join(rows)


def _value_types(v: StateValue, plan: IncrementalPlan) -> tuple[str, ...]:
    if isinstance(v.monoid, Count):
        return ("BIGINT",)
    if isinstance(v.monoid, Moments):
        return ("BIGINT", "DOUBLE", "DOUBLE")
    arg_type = infer_type(v.arg, plan.source, plan.source_columns) if v.arg else "UNKNOWN"
    if isinstance(v.monoid, Sum) and arg_type in ("INT", "SMALLINT", "TINYINT", "BIGINT"):
        return ("BIGINT",)
    if isinstance(v.monoid, (Sum, Min, Max)):
        return (arg_type,)
    return ("UNKNOWN",)


def infer_type(expr: Scalar, table: str, columns: tuple[Column, ...]) -> str:
    """sqlglot's type for ``expr`` over the declared source columns."""
    return _infer(expr.sql, table, tuple((c.name, str(c.type)) for c in columns))


@lru_cache(maxsize=1024)
def _infer(sql: str, table: str, columns: tuple[tuple[str, str], ...]) -> str:
    schema = {table: dict(columns)}
    try:
        select = sqlglot.parse_one(f"SELECT {sql} AS x FROM {table}", read=CANONICAL_DIALECT)
        from sqlglot.optimizer.qualify import qualify

        select = qualify(select, schema=schema, dialect=CANONICAL_DIALECT)
        typed = annotate_types(select, schema=schema, dialect=CANONICAL_DIALECT)
        t = typed.expressions[0].type
        if not t or t.this == exp.DataType.Type.UNKNOWN:
            return "UNKNOWN"
        return t.sql(CANONICAL_DIALECT).upper().replace("TEXT", "VARCHAR")
    except Exception:  # type inference is a courtesy for the reader; never fail explain on it
        return "UNKNOWN"

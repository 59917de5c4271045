"""``incr explain``: a plan as a readable tree, without running anything.

For each view: the query, its normalized IR, the lineage key θ, every state table with
column types and monoids, h (Spark SQL), ⊗ and ⊗̃ (MERGE), ⊗̂ (diffusion), every
query the runtime runs to fold a batch (the signed batch, touched keys, old, new, changed
and live rows, ⊗= and the output change handed on), and a (Spark SQL); for an iterative
view also ΔX and X ⊕ ΔX.  Nothing runs that is not printed here.  Column types come from
sqlglot's type annotation over the declared source schema; Spark's own result types decide
the stored schema, and agree for the declared types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from incr.algebra.exact import BandSum
from incr.algebra.monoids import Count, Max, Min, Moments, Sum, WideSum
from incr.compiler import CompiledProgram
from incr.compiler.dialect import SPARK
from incr.compiler.iterate import (
    apply_dx_sql,
    dx_sql,
    frontier_rows_sql,
    initial_dx_sql,
    lookup_pairs_sql,
    reassigned_sql,
    typed_sql,
)
from incr.compiler.plan import BUCKET, IncrementalPlan, StagePlan, StateTable, StateValue
from incr.compiler.program import Column
from incr.compiler.publish import GONE
from incr.compiler.queries import render_stage_delta
from incr.compiler.recursion import DELETIONS, Recursion, fill
from incr.compiler.scalar import Scalar
from incr.compiler.sqlgen import (
    render_all,
    render_changed_rows,
    render_combined,
    render_diffusion,
    render_explode,
    render_kept_change,
    render_live_rows,
    render_merge,
    render_old_rows,
    render_output_change,
    render_rows,
    render_signed,
    render_touched_keys,
)
from incr.compiler.types import infer_type_name

#: Column types of the state tables as stored: table name -> column -> SQL type (see
#: :func:`~incr.runtime.report.stored_types`); absent tables are shown with inferred types.
Stored = Mapping[str, Mapping[str, str]]


def explain_program(compiled: CompiledProgram, stored: Mapping[str, Stored] | None = None) -> str:
    """The explanation of every view of a program.

    ``stored``: per view, its state tables' types as a run stored them.
    """
    prog = compiled.program
    header = [f"program {prog.name} ({prog.path})",
              f"  dialect {prog.options.dialect}; {prog.options.buckets} hash buckets per state table"]
    for t in prog.tables:
        cols = ", ".join(f"{c.name} {c.type}{' NOT NULL' if c.not_null else ''}" for c in t.columns)
        mode = "append-only" if t.append_only else "inserts and deletes"
        header.append(f"  source {t.name}({cols}) -- {mode}")
    header += _explain_sharing(compiled)
    first: dict[str, str] = {}  # per shared state, the view its fold is shown under
    views = []
    for p in compiled.plans:
        shown = first.setdefault(p.shares, p.view) if p.shares is not None else p.view
        views.append(explain_plan(p, (stored or {}).get(p.view),
                                  fold_shown_under=None if shown == p.view else shown))
    return "\n".join(header) + "\n\n" + "\n\n".join(views) + "\n"


def _explain_sharing(compiled: CompiledProgram) -> list[str]:
    """Which views keep one state, by which rule (seed 003 §3.2), and why the others don't."""
    if len(compiled.plans) < 2 and not compiled.shares:
        return []
    lines = ["  state sharing (one fold and one MERGE per batch for each shared state):"]
    lines += [f"    {s.describe()}" for s in compiled.shares]
    lines += [f"    {view} keeps its own state: {why}" for view, why in compiled.alone]
    return lines


def explain_plan(plan: IncrementalPlan, stored: Stored | None = None,
                 fold_shown_under: str | None = None) -> str:
    """The explanation of one view: each stage, producers first, then the answer.

    A state table in ``stored`` shows the column types a run stored (Spark's: a SUM of a
    DECIMAL(15,2) is a DECIMAL(25,2)), marked so; the others show sqlglot's inference.

    ``fold_shown_under``: a view sharing this view's state whose explanation shows that
    state's tables, h, ⊗ and fold queries; they are not repeated here (a program of 50
    dashboards over one state would print them 50 times), only what is this view's own.
    """
    out: list[str] = [f"view {plan.view}  (state {plan.state_fingerprint}, answer {plan.answer_fingerprint})"]
    out.append(_section("query", plan.select.strip()))
    if plan.shares is not None and fold_shown_under is not None:
        out.append(_section("state: shared", f"{plan.shares}'s, kept once for every view sharing "
                            f"it: its state tables, h, ⊗ and the queries of its fold are shown "
                            f"under view {fold_shown_under}; a reads this view's aggregates from "
                            f"them"))
    elif plan.shares is not None:
        out.append(_section("state: shared", f"the state tables below are {plan.shares}'s, "
                            f"kept once for every view sharing it; a reads this view's "
                            f"aggregates from them"))
    if len(plan.stages) > 1:
        flow = " → ".join(s.name or plan.view for s in plan.stages)
        out.append(_section("stages (producers first)", f"{flow}\n"
                            "each inner stage hands its output changes (rows lost, rows gained) "
                            "to the stages that read it"))
    if any(not s.direct for s in plan.stages):
        out.append(_section("signed batch (stages that join or read another stage take Δ as "
                            "signed rows)", render_signed("batch", 1) + "\n-- -1 for a delete batch"))
    for stage in plan.stages:
        out += _explain_stage(plan, stage, stored or {}, brief=fold_shown_under is not None)
    views = {t.name: f"state.{t.name}" for t in plan.main_tables}
    out.append(_section("a  (answer)", plan.answer_sql(views)))
    publish = plan.publish
    if publish.by_change:
        touched = {t.name: f"touched.{t.name}" for t in plan.main_tables}
        out.append(_section(
            "publish: by change",
            f"{publish.reason}\n-- state rows of the touched groups only (touched.*: the "
            f"state tables' rows of θ in `touched`, read from the buckets they hash to)\n"
            + plan.answer_change_sql(touched, "touched")
            + f"\n-- MERGE ON {' AND '.join(f'{c} <=> s.{c}' for c in publish.columns)} AND "
              f"s.{GONE}: matched → DELETE; not matched AND NOT s.{GONE} → INSERT\n"
              f"-- the deleted rows are marked in their files' deletion vectors and the inserted "
              f"ones written to one new file: no file is rewritten\n-- (INCR_ANSWER_DELETION_VECTORS=0: "
              f"the touched files are copied, or the answer rewritten when they hold most of it)"
              f"\n-- while the state tables a reads hold at most INCR_ANSWER_REWRITE_ROWS rows "
              f"together, a is rewritten instead: cheaper there"))
    elif publish.top:
        groups = {t.name: f"groups.{t.name}" for t in plan.main_tables}
        out.append(_section(
            "publish: top-k by change",
            f"{publish.reason}\n-- candidates: a over the state rows of `groups` (the touched "
            f"groups and those of the old top rows)\n" + plan.answer_sql(groups)
            + "\n-- exact when the old top had fewer rows than the LIMIT, or when this counts "
              "at least LIMIT rows\n" + plan.top_check_sql("candidates", "old_top")))
    else:
        out.append(_section("publish: rewritten", publish.reason))
    if plan.iteration is not None:
        it = plan.iteration
        out.append(_section("ΔX  (a(T) ⊖ X: the diffusion's frontier, beyond TOLERANCE)",
                            "-- next = " + typed_sql(it, "a") + "\n" + dx_sql(it, "next", "X")))
        if publish.by_change:
            out.append(_section(
                "ΔX compared over the touched groups only",
                "-- the step's answer is per group, so a and X are compared only for the "
                "groups folds touched since\n-- their last comparison (a over their state "
                "rows; X's rows of them); the first batch compares all\n"
                + frontier_rows_sql(it, "X", "touched", publish.keys)))
        if it.initial:
            out.append(_section("first ΔX  (INITIAL)", initial_dx_sql(it)))
        out.append(_section("X ⊕ ΔX  (the next iterate)", apply_dx_sql(it, "X", "ΔX")))
        if it.lookups:
            out.append(_section("rows re-assigned by a move (looked-up X)", reassigned_sql(
                it.lookups, lookup_pairs_sql(it, it.lookups, "batch", "X", "X ⊕ ΔX"),
                ["<batch columns>"])))
    if plan.recursion is not None:
        out.extend(_explain_recursion(plan.recursion))
    return "\n".join(out)


def _explain_recursion(rec: Recursion) -> list[str]:
    """How the fixpoint R of a recursive CTE is kept, with the SQL of one round."""
    cols = ", ".join(f"{c.name} {c.type}" for c in rec.columns)
    tables = {t.lower(): t for t in rec.sources} | {rec.name.lower(): rec.name}
    shown = {t.lower(): t for t in rec.sources} | {rec.name.lower(): "Δr"}
    out = [_section(
        f"recursive {rec.name}({cols}): the fixpoint R, kept in `_fixpoint`",
        f"-- linear, monotone, set semantics; reads {', '.join(rec.sources)}\n"
        f"-- inserts: semi-naive evaluation from the rows a batch adds (each round reads the "
        f"last round's new tuples only)\n-- deletes: {DELETIONS}\n"
        f"-- {_selection(rec)}\n"
        f"-- {rec.reading()}\n"
        f"-- ΔR is folded into the view's query (above) as a batch of {rec.name}")]
    for i, b in enumerate(rec.base):
        out.append(_section(f"{rec.name}: branch {i + 1} (starts the recursion)",
                            fill(b, {}, tables)))
    for i, b in enumerate(rec.step):
        out.append(_section(f"{rec.name}: step {i + 1} (one round, over the last round's Δr)",
                            fill(b, {}, shown)))
    return out


def _selection(rec: Recursion) -> str:
    if rec.selection is not None:
        return f"pruning: {rec.selection}"
    return f"pruning: none, R keeps every tuple derived (no aggregate selection: {rec.unselected})"


def _explain_stage(plan: IncrementalPlan, stage: StagePlan, types: Stored,
                   brief: bool = False) -> list[str]:
    """The stage's IR, θ, state tables and every query of its fold.

    ``brief``: its IR, θ and what its answer reads beside the tables (the fold is shown
    under another view sharing the state).
    """
    def title(text: str) -> str:
        return f"[{stage.name}] {text}" if stage.name else text

    out = [_section(title("normalized IR"), stage.logical.pretty())]
    theta = ", ".join(f"{k.name} = {k.expr}" for k in stage.lineage) or \
        "() -- global aggregate: one state row"
    out.append(_section(title("lineage key θ"), theta))
    for table in () if brief else stage.tables:
        if table not in plan.stored(stage):
            out.append(_section(title(f"{table.name}: not stored"),
                                "the stage's output is a bag of per-row projections of its "
                                "input and only another stage reads it,\nso each batch hands on "
                                "h(Δ) as its output change and no state of these rows is kept"))
            continue
        out.append(_section(title(f"state table {table.name}"),
                            _schema(table, stage, types.get(table.name))))
    columns = [b for b in stage.answer.bags if b.value_of is not None]
    if columns:
        out.append(_section(title("bags of θ's own columns (no table)"), "\n".join(
            f"{b.alias}: the live values of {b.value_of} are {b.table}'s live groups, each with "
            f"its _n: a group holds one value" for b in columns)))
    if brief:
        return out
    if stage.kept is not None and plan.consumers(stage.name):
        out.append(_section(title(f"kept output rows {stage.kept.name}"),
                            _kept_schema(stage, types.get(stage.kept.name))))
    if not stage.direct:
        kinds = "branches (bag union)" if len(stage.branches) > 1 else "join"
        out.append(_section(title(kinds), "\n".join(str(b) for b in stage.branches)))
        sides = {t.side_of: f"state.{t.name}" for t in stage.tables if t.side_of}
        for inp in stage.inputs:
            what = f"output changes of {inp.table}" if inp.derived else f"a batch of {inp.table}"
            changed = {i.alias: (f"Δ{i.table}", 0) for i in stage.inputs if i.table == inp.table
                       and i.derived == inp.derived}
            if inp.alias not in changed or min(changed) != inp.alias:
                continue
            anti = {a: f"ΔZ_{a}" for a in changed
                    if any(x.input.alias == a for b in stage.branches for x in b.join.anti)}
            sql = render_stage_delta(stage, changed, sides, anti)
            if sql:
                out.append(_section(title(f"Δ when {what} lands"), sql))
    stored = plan.stored(stage)
    for hq in stage.h:
        source = hq.source if hq.table.side_of or stage.direct else f"{stage.source}"
        # rows never stored are handed on without a bucket (see render_h)
        sql = plan.h_query(hq.table.name, f"Δ{source}", bucketed=hq.table in stored).sql
        if hq.table.exact_of is not None and hq.table.value_key is not None:
            sql = sql.replace(hq.table.value_key.expr.render(SPARK), f"band({hq.table.exact_of})")
            sql += ("\n-- band(x): x's binary band, CASE comparisons of |x| with 2^(32b) "
                    "(NaN 64, +Inf 65, -Inf 66)")
        out.append(_section(title(f"h  (Δ → {hq.table.name})"), sql))
    for spec in stage.merge:
        if plan.table(spec.table).side_of is None and plan.table(spec.table) in stored:
            out.append(_section(title(f"⊗  (merge inserts into {spec.table})"),
                                render_merge(spec, plan.table(spec.table))))
    for spec in stage.diminish:
        if plan.table(spec.table).side_of is None and plan.table(spec.table) in stored:
            out.append(_section(title(f"⊗̃  (diminish deletes from {spec.table})"),
                                render_merge(spec, plan.table(spec.table))))
    if not stage.diminish and not plan.streams(stage):
        out.append(_section(title("⊗̃"), f"none: {stage.source} is append-only, so MIN/MAX keep "
                            "the plain monoid (no inverse) and delete batches are refused"))
    for spec in stage.signed:
        side = plan.table(spec.table)
        if side.side_of is not None:
            note = ("" if stage.anti(side.side_of) else
                    "\n-- once larger than INCR_STATE_VECTOR_ROWS: an all-insert batch is "
                    "appended as rows of\n-- their own (no old row read), so a θ's count may "
                    "span rows; they are summed\n-- when a change of that θ reads them, and "
                    "replaced by the sum")
            out.append(_section(title(f"⊗±  (signed merge into {spec.table})"),
                                render_merge(spec, side) + note))
    for d in stage.diffuse:
        if plan.table(d.table).side_of is None and plan.table(d.table) in stored:
            out.append(_section(title(f"⊗̂  (diffusion over {d.table})"), render_diffusion(d)))
    if not plan.streams(stage) and stage.main_tables[0] in stored:
        out += _combine_steps(plan, stage, title)
    if plan.streams(stage):
        main = stage.main_tables[0].name
        where = ("computed on the fly by the stages reading it, no outbox"
                 if plan.virtual(stage) else f"into {stage.outbox}")
        out.append(_section(title(f"output changes ({where}, _w = ±copies)"),
                            render_rows(stage.answer, {main: "h(Δ⁺)"}) + "\n-- minus the same "
                            "over h(Δ⁻)"))
    elif stage.name:
        views = {t.name: f"state.{t.name}" for t in stage.main_tables}
        out.append(_section(title(f"output rows (into {stage.outbox} as changes, _w = ±copies)"),
                            render_rows(stage.answer, views)))
    return out


def _combine_steps(plan: IncrementalPlan, stage: StagePlan,
                   title: Callable[[str], str]) -> list[str]:
    """The queries of the combine strategy.

    A stage that hands on its changes, or whose Δ has both signs, computes its touched rows
    as a query and replaces them (⊗=).
    """
    out = [_section(title("Δ⁺ / Δ⁻ rows (one row per copy)"),
                    render_explode("Δ", True) + "\n-- Δ⁻: the same with _w < 0")]
    diffusions = {s.table: s for s in stage.diffuse}
    diminishes = {s.table: s for s in stage.diminish}
    replaces = {s.table: s for s in stage.replace}
    main = stage.main_tables[0]
    out.append(_section(title("touched keys"), render_touched_keys(main, "h(Δ⁺)", "h(Δ⁻)")))
    for table in stage.main_tables:
        name = table.name
        new = render_combined(table, diffusions[name], diminishes.get(name), f"old.{name}",
                              "h(Δ⁺)", "h(Δ⁻)" if name in diminishes else None)
        out.append(_section(title(f"old / new / changed / live rows of {name}"), "\n".join([
            "-- old:", render_old_rows(table, f"state.{name}", "touched"),
            *(["-- (on the driver, whose read of the state finds the touched keys' rows only: "
               + render_old_rows(table, f"state.{name}", "touched", exact=True) + ")"]
              if len(table.keys) == 1 else []),
            "-- new = old ⊗ h(Δ⁺) ⊗̃ h(Δ⁻) (⊗ as ⊗̂ of h(Δ⁺) plus the old rows it misses):", new,
            *(["-- (for an all-insert Δ, without h(Δ⁻): old ⊗ h(Δ⁺))"] if name in diminishes else []),
            "-- changed (what ⊗= writes):", render_changed_rows(table, f"new.{name}", "h(Δ⁺)", "h(Δ⁻)",
                                                       own_keys=table is main),
            "-- live:", render_live_rows(table, f"new.{name}")])))
        out.append(_section(title(f"⊗=  (replace the touched rows of {name})"),
                            render_merge(replaces[name], table).replace("h(ΔS)", "changed", 1)))
    if stage.name and stage.kept is not None:
        lives = {t.name: f"live.{t.name}" for t in stage.main_tables}
        out.append(_section(title(f"output change (into {stage.outbox}, with θ)"),
                            render_kept_change(stage, f"kept.{stage.kept.name}", lives)
                            + f"\n-- kept: the rows of {stage.kept.name} of the touched groups"))
        assert stage.keep is not None
        out.append(_section(title(f"⊗±  (the output change into {stage.kept.name})"),
                            render_merge(stage.keep, stage.kept).replace(
                                "h(ΔS)", stage.outbox, 1)))
    elif stage.name:
        olds = {t.name: f"old.{t.name}" for t in stage.main_tables}
        lives = {t.name: f"live.{t.name}" for t in stage.main_tables}
        out.append(_section(title(f"output change (into {stage.outbox})"),
                            render_output_change(stage, olds, lives)))
    else:
        out.append(_section(title("rows written"), render_all("changed")))
    return out


def _section(title: str, body: str) -> str:
    lines = body.splitlines() or [""]
    return f"  {title}:\n" + "\n".join(f"    {line}" for line in lines)


def _schema(table: StateTable, stage: StagePlan, stored: Mapping[str, str] | None) -> str:
    def typed(column: str, inferred: str) -> str:
        return f"{column:<14} {(stored or {}).get(column, inferred):<10}"

    hashed = ", ".join(table.bucket_columns) if table.side_of else "θ"
    buckets = stage.buckets_of(table.name)
    rows = [f"{typed(BUCKET, 'INT')} partition: pmod(xxhash64({hashed}), {buckets})"]
    for k in table.keys:
        expr = Scalar.column(k.name) if table.side_of else k.expr  # side keys: joined names
        rows.append(f"{typed(k.name, infer_type(expr, stage.source, stage.source_columns))} "
                    f"key: {k.expr}")
    if table.exact_of is not None and table.value_key is not None:
        rows.append(f"{typed(table.value_key.name, 'INT')} key: band of {table.exact_of} "
                    f"(|x| in [2^(32b), 2^(32b+32)); NaN 64, +Inf 65, -Inf 66)")
    elif table.value_key is not None:
        vk = table.value_key
        rows.append(f"{typed(vk.name, infer_type(vk.expr, stage.source, stage.source_columns))} "
                    f"key: value of {vk.expr} (bag of live values)")
    for k in table.row_keys:
        rows.append(f"{typed(k.name, infer_type(k.expr, stage.source, stage.source_columns))} "
                    f"key: {k.expr} (a row of the window partition θ)")
    for v in table.values:
        for col, typ in zip(v.columns, _value_types(v, stage)):
            rows.append(f"{typed(col, typ)} {v.describe()}")
    vanish = "rows whose _n reaches 0 are deleted" if table.vanishes else \
        "the single global row stays (an empty input still answers one row)"
    order = "θ" if table.side_of is None else ", ".join(table.sort_columns)
    rows.append(f"-- sorted by {order} within buckets; {vanish}")
    rows.append("-- types as stored by the last run" if stored else
                "-- types inferred (`incr explain --warehouse W` shows those a run stored)")
    return "\n".join(rows)


def _kept_schema(stage: StagePlan, stored: Mapping[str, str] | None) -> str:
    """The kept table's columns, and why the stage keeps them."""
    assert stage.kept is not None
    rows = [f"{BUCKET:<14} {(stored or {}).get(BUCKET, 'INT'):<10} partition: θ's bucket"]
    rows += [f"{kept:<14} {(stored or {}).get(kept, '')  :<10} key: θ column {col}"
             for col, kept in stage.kept_keys]
    rows += [f"{name:<14} {(stored or {}).get(name, '')  :<10} key: output column"
             for name in stage.output]
    rows.append(f"{'_n':<14} {'BIGINT':<10} copies handed on")
    rows.append("-- an output column comes from a DOUBLE sum over exact bands or moments over a "
                "bag, summed in no\n-- fixed order, so recomputing an old row may not give "
                "the bits the readers took: what\n-- leaves the output is read from here, and "
                "each output change is folded in (⊗±)")
    return "\n".join(rows)


def _value_types(v: StateValue, stage: StagePlan) -> tuple[str, ...]:
    if isinstance(v.monoid, Count):
        return ("BIGINT",)
    if isinstance(v.monoid, Moments):
        return ("BIGINT", "DOUBLE", "DOUBLE")
    if isinstance(v.monoid, (BandSum, WideSum)):
        return ("DECIMAL(38,0)",)
    arg_type = infer_type(v.arg, stage.source, stage.source_columns) if v.arg else "UNKNOWN"
    if isinstance(v.monoid, Sum) and arg_type in ("INT", "SMALLINT", "TINYINT", "BIGINT"):
        return ("BIGINT",)
    if isinstance(v.monoid, (Sum, Min, Max)):
        return (arg_type,)
    return ("UNKNOWN",)


def infer_type(expr: Scalar, table: str, columns: tuple[Column, ...]) -> str:
    """The type sqlglot infers for ``expr`` over the declared source columns."""
    return infer_type_name(expr.sql, table, tuple((c.name, str(c.type)) for c in columns))

"""Split into h and a: what runs on each batch, and what runs on the state.

h is everything up to and including the Aggregate, with each aggregate replaced by the
monoid elements monoid inference chose: it folds a batch into state rows keyed by θ, and
``h(S ⊎ ΔS) = h(S) ⊗ h(ΔS)`` holds by construction.  It is laid out as state tables:

* ``main``: θ, the row count ``_n`` and every main-table element;
* ``bag<i>``: one per value-count bag, keyed by (θ, value) with ``_n``; none for a bag of
  one of θ's own columns, whose values are ``main``'s groups (:attr:`BagJoin.value_of`);
* ``exact<i>``: one per DOUBLE summed under deletions, keyed by (θ, band) with ``_n`` and
  the band's exact ``_total`` (:mod:`incr.algebra.exact`);
* ``rows``: for a window stage, the bag of its rows: keyed by (θ, the other columns the
  windows read) with ``_n``, bucketed by θ, so the rows of a window partition are found
  by θ like a group's;
* ``side_<alias>``: for a joined stage, one per input: the input's live rows (the columns
  the stage reads) with their counts, bucketed by its join key.  A batch on one input is
  joined with the other inputs' side tables (seed §8.1 leaves this case out: both inputs
  streaming), then folded by h like a batch of a single source.

* ``kept``: for a stage another stage reads whose output is not a function of its state
  rows' stored values alone (a DOUBLE sum from its exact bands, moments from a bag: sums in
  no fixed order, whose last bit may differ from one computation to the next or between
  engines), the output rows it handed on, keyed by (θ, the output columns) with ``_n``.
  The readers match what left the output by value, so what a batch takes back must be
  what an earlier one handed on, bit for bit: it is read from here, not recomputed.

Tables of a stage other than the view's own are prefixed with the stage's name
(``s1_main``, ``s1_side_x``).

a is everything above the Aggregate (HAVING, the SELECT expressions, ORDER BY, LIMIT,
Explode) rewritten to read the state: group keys become ``m.<θ column>`` and each aggregate
becomes its finalization.  It is cheap, runs on the state only, and is recomputed after
every batch (seed §9: the non-homomorphic parts pulled out of the query).
"""

from __future__ import annotations

from dataclasses import replace

from incr.algebra.exact import BandSum, band_sql
from incr.compiler.compilation import EXACT, AggState, BagRead, Compilation
from incr.compiler.ir import (
    Aggregate,
    Explode,
    Filter,
    JoinInput,
    Limit,
    Named,
    Project,
    Rel,
    Sort,
    SortKey,
    Window,
)
from incr.compiler.passes.infer_monoids import MAIN, bag_alias
from incr.compiler.plan import (
    ROW_COUNT,
    ROW_COUNT_VALUE,
    Answer,
    BagAggregate,
    BagJoin,
    HQuery,
    StateTable,
    StateValue,
)
from incr.compiler.scalar import Scalar

MAIN_TABLE = "main"
ROWS_TABLE = "rows"
KEPT_TABLE = "kept"
#: Prefix of θ's columns in a ``kept`` table, where they sit beside the output columns.
KEPT_KEY = "_theta_"
#: The alias of a window stage's rows in its answer query.
ROWS = "r"
BAG_VALUE = "value"
EXACT_TOTAL = "_total"


def split_answer(c: Compilation) -> Compilation:
    """Fills ``tables``, ``h`` and ``answer``."""
    assert c.lineage is not None and c.aggregates is not None and c.key_columns is not None
    agg = next(node for node in c.rel.walk() if isinstance(node, Aggregate))
    where = agg.child.predicate if isinstance(agg.child, Filter) else None
    grouped = bool(c.lineage)

    values: list[StateValue] = [ROW_COUNT_VALUE]
    for state in c.aggregates:
        for v in state.values:
            if v not in values:
                values.append(v)
    tables = [StateTable(c.table_name(MAIN_TABLE), c.lineage, tuple(values), vanishes=grouped)]
    bags: list[BagJoin] = []
    theta_of = {k.expr.sql: k.name for k in c.lineage}
    for i, (kind, arg, reads) in enumerate(_bag_reads(c.aggregates)):
        aggregates = tuple(BagAggregate(r.name, r.sql, r.idempotent) for r in reads)
        centered = any(r.centered for r in reads)
        if kind != EXACT and arg.sql in theta_of:  # a θ column: main's groups are its bag
            bags.append(BagJoin(tables[0].name, bag_alias(i), aggregates, centered,
                                value_of=theta_of[arg.sql]))
            continue
        if kind == EXACT:
            x = Scalar(f"CAST(({arg.sql}) AS DOUBLE)")
            tables.append(StateTable(
                c.table_name(f"exact{i}"), c.lineage,
                (ROW_COUNT_VALUE, StateValue((EXACT_TOTAL,), BandSum(), x)),
                value_key=Named(BAG_VALUE, Scalar(band_sql(x.sql))), vanishes=True,
                exact_of=arg))
        else:
            tables.append(StateTable(c.table_name(f"bag{i}"), c.lineage, (ROW_COUNT_VALUE,),
                                     value_key=Named(BAG_VALUE, arg), vanishes=True))
        bags.append(BagJoin(tables[-1].name, bag_alias(i), aggregates, centered))

    window = next((node for node in c.rel.walk() if isinstance(node, Window)), None)
    rows: StateTable | None = None
    if window is not None:
        theta = {k.name for k in c.lineage}
        names = dict(c.key_columns)
        rows = StateTable(c.table_name(ROWS_TABLE), c.lineage, (ROW_COUNT_VALUE,), vanishes=True,
                          row_keys=tuple(Named(names[k.name], k.expr) for k in agg.keys
                                         if names[k.name] not in theta))
        tables.append(rows)
    buckets = c.program.options.buckets if grouped else 1
    h = [HQuery(t, c.source.name, where, buckets) for t in tables]
    if not c.direct:
        for inp in _inputs(c):
            side = StateTable(c.table_name(f"side_{inp.alias}"),
                              tuple(Named(inp.flat(col), Scalar.column(col)) for col in inp.columns),
                              (ROW_COUNT_VALUE,), vanishes=True, side_of=inp.alias,
                              bucket_keys=_join_keys(c, inp.alias))
            tables.append(side)
            h.append(HQuery(side, inp.table, None, c.program.options.buckets, weighted=True))
    answer = answer_over_state(c, c.rel, c.aggregates, tuple(bags), tables[0].name, rows)
    return replace(c, tables=tuple(tables), h=tuple(h), answer=answer,
                   kept=_kept(c, answer, tables))


def _kept(c: Compilation, answer: Answer, tables: list[StateTable]) -> StateTable | None:
    """The ``kept`` table of a nested stage whose output drifts.

    None when the stage has no reader, or its output is recomputed from the stored values
    bit for bit (a DOUBLE kept as a DOUBLE, a MIN of a bag, an integer or DECIMAL sum).
    """
    assert c.lineage is not None
    exact = {t.name for t in tables if t.exact_of is not None}
    if not c.stage or not any(b.centered or b.table in exact for b in answer.bags):
        return None
    taken = {e.name.lower() for e in answer.exprs}
    keys = []
    for k in c.lineage:
        name = KEPT_KEY + k.name
        while name.lower() in taken:
            name = "_" + name
        taken.add(name.lower())
        keys.append(Named(name, k.expr))
    return StateTable(c.table_name(KEPT_TABLE), tuple(keys), (ROW_COUNT_VALUE,), vanishes=True,
                      row_keys=answer.exprs)


def _bag_reads(aggregates: tuple[AggState, ...]) -> list[tuple[str, Scalar, list[BagRead]]]:
    """The bags in the order monoid inference numbered them, each with its distinct reads."""
    found: dict[tuple[str, str], tuple[str, Scalar, list[BagRead]]] = {}
    for state in aggregates:
        for read in state.bags:
            _, _, reads = found.setdefault((read.kind, read.arg.sql), (read.kind, read.arg, []))
            if all(r.name != read.name for r in reads):
                reads.append(read)
    return list(found.values())


def _inputs(c: Compilation) -> tuple[JoinInput, ...]:
    """Inputs that meet others in a join (once per alias): they need a side table.

    An input alone in its branch (a SELECT of a UNION ALL) needs none: its changes are
    the branch's changes.
    """
    seen: dict[str, JoinInput] = {}
    for b in c.branches:
        if len(b.join.all_inputs) > 1:
            for i in b.join.all_inputs:
                seen.setdefault(i.alias, i)
    return tuple(seen.values())


def _join_keys(c: Compilation, alias: str) -> tuple[str, ...]:
    """Columns of input ``alias`` that any branch joins on (its side table's bucket key)."""
    out: list[str] = []
    for b in c.branches:
        if any(i.alias == alias for i in b.join.all_inputs):
            out += [k for k in b.join.keys_of(alias) if k not in out]
    return tuple(out)


def answer_over_state(c: Compilation, rel: Rel, aggregates: tuple[AggState, ...],
                      bags: tuple[BagJoin, ...], main: str, rows: StateTable | None) -> Answer:
    """a: what ``rel`` computes above its Aggregate, read from the state.

    It reads state table ``main`` (alias m), the ``bags`` and, for a window stage, ``rows``.

    ``aggregates`` say how each aggregate of ``rel`` is read from the state; the share
    pass passes a state laid out for several views, each view's aggregates read from it.
    """
    assert c.lineage is not None and c.key_columns is not None
    key_columns = dict(c.key_columns)
    grouped = bool(c.lineage)
    keys = tuple(k.name for k in c.lineage)
    mapping: dict[str, Scalar] = {ir: Scalar(f"{MAIN}.{col}") for ir, col in key_columns.items()}
    if rows is not None:  # a window stage: the columns beside θ come from its rows
        beside = {k.name for k in rows.row_keys}
        mapping.update({ir: Scalar(f"{ROWS}.{col}") for ir, col in key_columns.items()
                        if col in beside})
    mapping.update({a.name: a.finalize for a in aggregates})

    def over_state(s: Scalar) -> Scalar:
        return s.substitute(mapping)

    limit = offset = None
    exprs: tuple[Named, ...] = ()
    order: tuple[SortKey, ...] = ()
    having = explode = None
    node: Rel = rel
    while not isinstance(node, Aggregate):
        if isinstance(node, Limit):
            limit, offset = node.count, node.offset
        elif isinstance(node, Project):
            exprs = tuple(Named(n.name, over_state(n.expr)) for n in node.exprs)
        elif isinstance(node, Sort):
            order = tuple(replace(k, expr=over_state(k.expr)) for k in node.keys)
        elif isinstance(node, Filter):
            having = over_state(node.predicate)
        elif isinstance(node, Explode):
            explode = (Scalar(f"{MAIN}.{ROW_COUNT}") if node.times is None
                       else over_state(node.times))
            if rows is not None:
                explode = Scalar(f"{ROWS}.{ROW_COUNT}")
        node = node.children()[0]
    return Answer(main=main, keys=keys, grouped=grouped, bags=bags, exprs=exprs,
                  having=having, order=order, limit=limit, offset=offset or 0, explode=explode,
                  rows=rows.name if rows is not None else None)

"""The compiler's output: an :class:`IncrementalPlan` per view.

A plan says, for one view ``q = a ∘ h``:

* the lineage key θ and the **state tables** it owns (keyed by θ; a value-count bag per
  MIN/MAX/COUNT DISTINCT argument when the source takes deletions), each column with its
  monoid;
* **h**: per state table, a Spark SQL aggregation over a batch of the source;
* **⊗ / ⊗̃**: per state table, a :class:`MergeSpec` that the storage adapter turns into a
  Delta MERGE (combine for inserts, diminish for deletes); **⊗̂** (diffusion, the
  right-outer variant used inside iterations) as a query;
* **a**: the answer query over the state tables, in Spark SQL.

Everything is frozen; :attr:`IncrementalPlan.state_fingerprint` hashes what determines the
state's contents, so a changed view rebuilds its state instead of merging into a stale one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from incr.algebra.monoids import Count, Monoid

# The reserved column names (state rows' count, partition bucket, change weight) are defined
# with the dialect and re-exported here, where the runtime and the passes read them from.
from incr.compiler.dialect import BUCKET as BUCKET
from incr.compiler.dialect import ROW_COUNT as ROW_COUNT
from incr.compiler.dialect import WEIGHT as WEIGHT
from incr.compiler.dialect import Bucket as Bucket
from incr.compiler.dialect import Query as Query
from incr.compiler.dialect import live as live
from incr.compiler.dialect import vanished as vanished
from incr.compiler.ir import Branch, EquiJoin, JoinInput, Named, Rel, SortKey, reads_directly
from incr.compiler.program import Column, TableDecl
from incr.compiler.publish import Publish, publish_mode
from incr.compiler.queries import (
    h_bucket,
    render_answer,
    render_answer_change,
    render_coarse_groups,
    render_h,
    render_stage_delta,
    render_top_check,
)
from incr.compiler.scalar import Scalar

if TYPE_CHECKING:
    from incr.compiler.iterate import Iteration
    from incr.compiler.recursion import Recursion


@dataclass(frozen=True)
class StateValue:
    """One monoid element stored in ``columns`` (several for multi-part monoids).

    ``arg`` is the expression over the source the element folds (None for COUNT(*)).
    """

    columns: tuple[str, ...]
    monoid: Monoid
    arg: Scalar | None

    def describe(self) -> str:
        """One line for ``incr explain``: columns, monoid and what it folds."""
        what = "rows" if self.arg is None else str(self.arg)
        return f"{', '.join(self.columns)}: {self.monoid.name} of {what}"


ROW_COUNT_VALUE = StateValue((ROW_COUNT,), Count(), None)


@dataclass(frozen=True)
class StateTable:
    """A Delta table keyed by θ (plus ``value_key`` for a value-count bag)."""

    name: str
    keys: tuple[Named, ...]
    values: tuple[StateValue, ...]
    value_key: Named | None = None
    vanishes: bool = True  # rows whose count reaches 0 are deleted (not the global row)
    side_of: str | None = None  # join input alias whose rows this table keeps (a side table)
    bucket_keys: tuple[str, ...] | None = None  # columns hashed into _bucket (default: keys)
    exact_of: Scalar | None = None  # the DOUBLE whose exact sum this table keeps by band
    row_keys: tuple[Named, ...] = ()  # a window stage's rows: the columns beside θ (see Answer)

    @property
    def bucket_columns(self) -> tuple[str, ...]:
        """Columns whose hash is the partition bucket."""
        return self.bucket_keys if self.bucket_keys is not None else tuple(k.name for k in self.keys)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Columns that identify a state row."""
        extra = (self.value_key.name,) if self.value_key is not None else ()
        return tuple(k.name for k in self.keys) + extra + tuple(k.name for k in self.row_keys)

    @property
    def sort_columns(self) -> tuple[str, ...]:
        """The key columns in the order a file of the table is sorted by.

        The bucket's columns first (a side table's join key, by which a change looks its
        rows up), then the others (for a main table, θ's order either way).
        """
        keys = self.key_columns
        first = tuple(c for c in self.bucket_columns if c in keys)
        return first + tuple(c for c in keys if c not in first)

    @property
    def value_columns(self) -> tuple[str, ...]:
        """Columns holding monoid elements, in table order."""
        return tuple(c for v in self.values for c in v.columns)

    @property
    def invertible(self) -> bool:
        """True when every value has an inverse, i.e. ⊗̃ exists."""
        return all(v.monoid.has_inverse for v in self.values)


@dataclass(frozen=True)
class SideMatch:
    """A side table's rows that may meet a change.

    Those whose ``side_column`` (its name in the side table: the joined relation's
    ``<alias>__<column>``) equals some value of ``column`` in the change of input
    ``changed`` (``column`` as that input names it).
    """

    input_column: str
    side_column: str
    changed: str
    column: str


@dataclass(frozen=True)
class HQuery:
    """h for one state table: fold a batch of ``source`` rows that pass ``where`` by θ.

    For a joined stage, the main tables' source is Δ of the joined branches (``joined``) and
    each side table's source is its input (a declared table or a producer stage).  A
    ``weighted`` h reads signed changes (column ``_w``: +n inserts, -n deletes) and folds
    them into one signed count per row; side tables are kept this way, since a count is a
    group and a batch may both add and remove rows of a derived input.
    """

    table: StateTable
    source: str
    where: Scalar | None
    buckets: int
    weighted: bool = False


@dataclass(frozen=True)
class MergeSpec:
    """A MERGE of h(ΔS) (alias ``s``) into a state table (alias ``t``) on its key columns.

    ``operator`` is ⊗ (inserts: combine matched rows, insert the rest) or ⊗̃ (deletes:
    diminish matched rows, drop those whose count reaches zero; every source row must
    match, which batch validation guarantees).
    """

    operator: str
    table: str
    keys: tuple[str, ...]
    updates: tuple[tuple[str, str], ...]
    delete_when: str | None
    insert_unmatched: bool
    insert_when: str | None = None  # inserted unmatched rows must satisfy this (None: all)


@dataclass(frozen=True)
class DiffusionSpec:
    """⊗̂ for one state table: the right-outer variant of ⊗, as a query over T (t) and ΔT (s).

    Only rows of ΔT come out (combined with T's row where one matches), so an iteration
    step touches just the part of the state the new data reaches.
    """

    table: str
    keys: tuple[str, ...]
    exprs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class BagAggregate:
    """An aggregate over a bag's live rows, as Spark SQL over its columns, named ``name``.

    ``idempotent`` (MIN, MAX): its value is the same whether or not the rows of one value
    are first summed into one, so a coarser grouping reads the bag's rows as they are
    rather than regrouped by value (a GROUP BY over the whole bag, two thirds of such a
    read's time).
    """

    name: str
    sql: str
    idempotent: bool = False


@dataclass(frozen=True)
class BagJoin:
    """A per-θ table (value-count bag, exact band sums) joined into the answer by θ.

    It is pre-aggregated per θ; when ``centered``, each row first gets ``_mean``, the mean
    of its θ's values, so moments are taken in two passes (stable, and exact of history).

    ``value_of``: the bag's values are θ's column of that name, one per group, so the bag
    is no table of its own but ``main``'s live groups (``table``), each with its count: a
    value is live exactly while its group is.  That is a finer state shared by a coarser
    view (``COUNT(DISTINCT product)`` by region, answered from a state by region and
    product), or a view that aggregates one of its own group keys.
    """

    table: str
    alias: str
    aggregates: tuple[BagAggregate, ...]
    centered: bool = False
    value_of: str | None = None


@dataclass(frozen=True)
class Regrouped:
    """One state table read by a coarser grouping: its rows of each coarse group combined.

    ``by`` are the key columns beside θ it stays keyed by (a bag's ``value``);
    ``combined`` pairs each value column with the SQL aggregate that is its monoid's ⊗
    over many rows (:attr:`~incr.algebra.monoids.Monoid.sql_regroup`).
    """

    table: str
    by: tuple[str, ...]
    combined: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Rollup:
    """A view answered from the state of a finer grouping (seed 003's BRR and CMORR).

    The state is keyed by a θ that holds the view's group keys and more: each state table
    the answer reads is first regrouped by the view's keys (``keys`` pairs each state θ
    column with the view's name for it), its monoid elements combined by ⊗ (``tables``),
    so a is computed as over a state of the view's own grouping.  Bags regroup by (keys,
    value) with their counts summed, so MIN, MAX and COUNT(DISTINCT) stay exact under
    deletions.  ``of`` describes the state's grouping, for ``incr explain``.

    ``derived``: the view's keys that are a function of the state's θ columns rather than
    one of them (``GROUP BY year(day), month(day)`` from a state by ``day``), each an
    expression over the state's column names with the view's name for it.  A finer group
    falls in the one coarse group its θ values compute, so the regrouping is exact.

    ``where``: the view's WHERE, when it reads only the state's θ columns (an expression
    over their names): it keeps every row of a finer group or none, so the state's rows it
    holds are those regrouped (``WHERE product = 'tea'`` of a view by region, from a state
    by region and product), and the view adds nothing to the state.
    """

    keys: tuple[tuple[str, str], ...]
    tables: tuple[Regrouped, ...]
    of: tuple[str, ...] = ()
    derived: tuple[tuple[Scalar, str], ...] = ()
    where: Scalar | None = None

    def table(self, name: str) -> Regrouped:
        """How state table ``name`` is regrouped."""
        return next(t for t in self.tables if t.table == name)

    def __repr__(self) -> str:
        # An answer's fingerprint hashes its repr: without derived keys it reads as before
        # they existed, so views regrouped by the state's own columns keep their answers.
        extra = f", derived={self.derived!r}" if self.derived else ""
        extra += f", where={self.where!r}" if self.where is not None else ""
        return f"Rollup(keys={self.keys!r}, tables={self.tables!r}, of={self.of!r}{extra})"


@dataclass(frozen=True)
class Answer:
    """a(state): reads ``main`` (alias m) and the bags, then HAVING, ORDER BY, LIMIT.

    A window stage's answer also reads ``rows`` (alias r): the bag of its rows per θ (the
    window partition), joined to ``main`` by θ and exploded by ``explode`` (their counts)
    before the window functions in ``exprs`` are computed over them.

    With ``rollup`` set, the state it reads is a finer grouping's, regrouped by the view's
    keys first (:class:`Rollup`).
    """

    main: str
    keys: tuple[str, ...]
    grouped: bool
    bags: tuple[BagJoin, ...]
    exprs: tuple[Named, ...]
    having: Scalar | None = None
    order: tuple[SortKey, ...] = ()
    limit: int | None = None
    offset: int = 0
    explode: Scalar | None = None
    rows: str | None = None
    rollup: Rollup | None = None


@dataclass(frozen=True)
class StagePlan:
    """One aggregation (or bag of rows) of a view, over the union of its branches.

    A view is one stage, or several when it nests queries: a FROM subquery, a CTE or a
    decorrelated subquery is a stage of its own whose output rows are an input (``derived``)
    of the stage that reads it.  ``name`` is "" for the stage whose answer is the view's
    answer; other stages are ``s1``, ``s2``, ... and prefix their state tables' names.

    A stage is *direct* when it reads one input with no join: h runs on that input's batch
    (or on its producer's output changes).  Otherwise each input keeps a side table of its
    live rows and h runs on Δ of the joined branches.
    """

    name: str
    branches: tuple[Branch, ...]
    source: str
    source_columns: tuple[Column, ...]
    append_only: bool
    logical: Rel
    lineage: tuple[Named, ...]
    tables: tuple[StateTable, ...]
    h: tuple[HQuery, ...]
    merge: tuple[MergeSpec, ...]
    diminish: tuple[MergeSpec, ...]
    signed: tuple[MergeSpec, ...]
    diffuse: tuple[DiffusionSpec, ...]
    answer: Answer
    buckets: int
    output: tuple[str, ...] = field(default=())
    replace: tuple[MergeSpec, ...] = field(default=())  # ⊗= per main table (see derive_merge)
    #: The output rows this stage handed on, when recomputing them is not bit-for-bit stable
    #: (see split_answer), and their ⊗±.
    kept: StateTable | None = None
    keep: MergeSpec | None = None

    def buckets_of(self, table: str) -> int:
        """The hash buckets (Delta partitions) of state table ``table``.

        The program's count, or 1 for a global aggregate's main tables (one row, no θ).
        The ``kept`` rows are bucketed by θ like the main table.
        """
        if self.kept is not None and table == self.kept.name:
            table = self.main_tables[0].name
        return next(h.buckets for h in self.h if h.table.name == table)

    def bucketed_by(self, table: StateTable) -> tuple[str, int] | None:
        """(column, bucket count) when ``table``'s ``_bucket`` hashes one column; else None.

        A key's bucket then follows from its value alone (a search by that column need
        look in each bucket's files for that bucket's keys only).
        """
        if len(table.bucket_columns) != 1:
            return None
        return table.bucket_columns[0], self.buckets_of(table.name)

    @property
    def direct(self) -> bool:
        """True when h reads the single input's changes directly (no join, no side tables)."""
        return reads_directly(self.branches)

    @property
    def linear(self) -> bool:
        """True when the output is a bag of per-row projections of the input.

        That is: no aggregate, DISTINCT, HAVING, ORDER BY or LIMIT.  The output is then a
        homomorphism of the input bag: a batch's output change is h of Δ itself (rows gained
        minus rows lost), whatever the stage held before.
        """
        a = self.answer
        mains = self.main_tables
        return (len(mains) == 1 and a.explode is not None and a.explode.sql == f"m.{ROW_COUNT}"
                and not a.bags and a.having is None and not a.order and a.limit is None
                and not a.offset and mains[0].values == (ROW_COUNT_VALUE,))

    @property
    def inputs(self) -> tuple[JoinInput, ...]:
        """Every input of every branch, once per alias (anti inputs included)."""
        seen: dict[str, JoinInput] = {}
        for b in self.branches:
            for i in b.join.all_inputs:
                seen.setdefault(i.alias, i)
        return tuple(seen.values())

    @property
    def main_tables(self) -> tuple[StateTable, ...]:
        """The aggregate state and its bags (what a reads)."""
        return tuple(t for t in self.tables if t.side_of is None)

    @property
    def outbox(self) -> str:
        """The table holding this stage's output changes of the last batch (for its readers)."""
        return f"{self.name}_out"

    @property
    def kept_keys(self) -> tuple[tuple[str, str], ...]:
        """θ's columns in the main table paired with their names in the ``kept`` table."""
        assert self.kept is not None
        return tuple(zip(self.answer.keys, (k.name for k in self.kept.keys)))

    def anti(self, alias: str) -> bool:
        """Whether some branch reads input ``alias`` as an anti input.

        It is then read for "no match", not only as counts joined, so its side table must
        keep one row per θ (no appended inserts beside older rows).
        """
        return any(a.input.alias == alias for b in self.branches for a in b.join.anti)

    def side_table(self, alias: str) -> StateTable:
        """The side table mirroring input ``alias``."""
        return next(t for t in self.tables if t.side_of == alias)

    def side_matches(self, alias: str, changed: Iterable[str]) -> tuple[SideMatch, ...] | None:
        """Which rows of input ``alias``'s side table Δ can meet when inputs ``changed`` moved.

        Δ is a sum of terms, each joining the change of one changed input (of a subset,
        beside a changed anti input) with the other inputs' side tables, those of changed
        inputs plus their change (see ``render_stage_delta``).  When, in every branch
        that reads ``alias`` and a changed input, ``alias`` is joined by equality directly
        to *each* changed input of that branch, a side row can only meet Δ if one of those
        columns holds a value the change has: the rows returned are a superset of what Δ
        reads, so a reader may keep just them.  ``()``: Δ reads none of its rows (no term
        joins it: it changed alone, or shares no branch with a change).  An input that
        changed beside others (a self-join, or batches of two tables folded as one step) is
        bounded the same way by the others' changes: its side is read only in their terms.
        None when no such bound exists: it is an anti input (its side also answers "no
        match"), or a branch reaches it only through an unchanged input.
        """
        if self.anti(alias):
            return None
        moved = set(changed)
        found: list[SideMatch] = []
        for branch in self.branches:
            join = branch.join
            inputs = {i.alias: i for i in join.inputs}
            here = [a for a in inputs if a in moved and a != alias] + [
                a.input.alias for a in join.anti if a.input.alias in moved]
            if alias not in inputs or not here:
                continue
            mine = inputs[alias]
            for other in here:
                pair = next(((b, a) for a, b in (*join.pairs, *((y, x) for x, y in join.pairs))
                             if b in mine.flat_columns and other in inputs
                             and a in inputs[other].flat_columns), None)
                if pair is None:
                    return None
                side_col, change_col = pair
                match = SideMatch(mine.columns[mine.flat_columns.index(side_col)], side_col,
                                  other, inputs[other].columns[
                                      inputs[other].flat_columns.index(change_col)])
                if match not in found:
                    found.append(match)
        return tuple(found)

    def reads(self, table: str, derived: bool) -> tuple[JoinInput, ...]:
        """The inputs reading declared table (or stage) ``table``."""
        return tuple(i for i in self.inputs
                     if i.derived == derived and i.table.lower() == table.lower())


@dataclass(frozen=True)
class IncrementalPlan:
    """Everything the runtime needs to maintain one view: its stages, producers first.

    The last stage is the view's own; its answer is the view's answer table.  Properties
    below without a stage in their name describe that stage, or (``tables``, ``h``) all of
    them.
    """

    program: str
    view: str
    select: str
    stages: tuple[StagePlan, ...]
    sources: tuple[str, ...]
    source_tables: tuple[TableDecl, ...] = ()
    iteration: Iteration | None = None  # set for an iterative view (the plan is its STEP's)
    recursion: Recursion | None = None  # set for a recursive view (the plan is its outer query's)
    shares: str | None = None  # the shared state this view's answer reads (the share pass)

    @property
    def state_owner(self) -> str:
        """The name the view's state directory and lock go by.

        The shared state's, when the view shares one with other views of its program, else
        the view's own.
        """
        return self.shares or self.view

    @property
    def top(self) -> StagePlan:
        """The view's own stage (the last one); the properties below without a stage in their name are its."""
        return self.stages[-1]

    @property
    def ordered(self) -> bool:
        """True when the answer has an ORDER BY (row order is then part of the answer)."""
        return bool(self.top.answer.order)

    @property
    def tables(self) -> tuple[StateTable, ...]:
        """Every state table of every stage, producers first."""
        return tuple(t for s in self.stages for t in s.tables)

    @property
    def h(self) -> tuple[HQuery, ...]:
        """The h queries of every state table of every stage."""
        return tuple(q for s in self.stages for q in s.h)

    @property
    def merge(self) -> tuple[MergeSpec, ...]:
        """⊗ of every state table of every stage."""
        return tuple(m for s in self.stages for m in s.merge)

    @property
    def diminish(self) -> tuple[MergeSpec, ...]:
        """⊗̃ of every state table (of every stage) that has one."""
        return tuple(m for s in self.stages for m in s.diminish)

    @property
    def diffuse(self) -> tuple[DiffusionSpec, ...]:
        """⊗̂ of every state table of every stage."""
        return tuple(m for s in self.stages for m in s.diffuse)

    @property
    def answer(self) -> Answer:
        """a: the answer query over the top stage's state."""
        return self.top.answer

    @property
    def lineage(self) -> tuple[Named, ...]:
        """The top stage's lineage key θ (empty for a global aggregate)."""
        return self.top.lineage

    @property
    def output(self) -> tuple[str, ...]:
        """The view's column names, in order."""
        return self.top.output

    @property
    def buckets(self) -> int:
        """Hash buckets per state table of the top stage."""
        return self.top.buckets

    @property
    def source(self) -> str:
        """The top stage's source: a declared table, or the joined relation's name."""
        return self.top.source

    @property
    def source_columns(self) -> tuple[Column, ...]:
        """The columns of the top stage's source."""
        return self.top.source_columns

    @property
    def append_only(self) -> bool:
        """True when the top stage's source takes inserts only."""
        return self.top.append_only

    @property
    def logical(self) -> Rel:
        """The top stage's normalized IR."""
        return self.top.logical

    @property
    def join(self) -> EquiJoin | None:
        """The top stage's join (None for a direct stage or a union)."""
        top = self.top
        return None if top.direct or len(top.branches) != 1 else top.branches[0].join

    @property
    def main_tables(self) -> tuple[StateTable, ...]:
        """The tables a and the view's progress read: the top stage's aggregate state and bags."""
        return self.top.main_tables

    @property
    def answer_tables(self) -> tuple[StateTable, ...]:
        """The main tables a reads.

        All of them, but for a view sharing its state: those of its own aggregates (the
        other views' bags are none of its business).
        """
        a = self.answer
        read = {a.main, *(b.table for b in a.bags), *((a.rows,) if a.rows else ())}
        return tuple(t for t in self.main_tables if t.name in read)

    def stage(self, name: str) -> StagePlan:
        """The stage called ``name`` ("" for the top stage)."""
        return next(s for s in self.stages if s.name == name)

    def stage_of(self, table: str) -> StagePlan:
        """The stage owning state table ``table`` (its kept rows included)."""
        return next(s for s in self.stages if any(t.name == table for t in s.tables)
                    or (s.kept is not None and s.kept.name == table))

    def streams(self, stage: StagePlan) -> bool:
        """True when ``stage`` stores no main table, only hands on its output changes.

        That is a linear stage another stage reads: nothing reads its rows as a whole, and its
        output change is h(Δ), so keeping the bag of its rows would be work without a reader.
        Its side tables (for a join) are kept.
        """
        return stage.linear and bool(self.consumers(stage.name))

    def virtual(self, stage: StagePlan) -> bool:
        """True when ``stage``'s output changes are not written to an outbox either.

        A streaming stage without side tables (no join: one input, or a UNION ALL of single
        inputs) computes its change from its inputs' changes alone.  Those (the batch, or
        the producers' outboxes) stay as they are until the batch is through, so the stages
        reading it compute it on the fly, in the same Spark job, after a crash as before.
        """
        return self.streams(stage) and all(t.side_of is None for t in stage.tables)

    def outboxes(self) -> tuple[str, ...]:
        """The outbox tables kept in Delta: of every stage read by another, but virtual ones."""
        return tuple(s.outbox for s in self.stages
                     if self.consumers(s.name) and not self.virtual(s))

    def kept(self) -> tuple[StateTable, ...]:
        """The ``kept`` output rows of every stage that keeps them (see split_answer)."""
        return tuple(s.kept for s in self.stages if s.kept is not None and self.consumers(s.name))

    def stored(self, stage: StagePlan) -> tuple[StateTable, ...]:
        """The state tables of ``stage`` kept in Delta (see :meth:`streams`)."""
        streams = self.streams(stage)
        return tuple(t for t in stage.tables if t.side_of is not None or not streams)

    def consumers(self, stage: str) -> tuple[StagePlan, ...]:
        """Stages reading the output of ``stage``."""
        return tuple(s for s in self.stages if s.reads(stage, derived=True))

    def depends_on(self, stage: StagePlan, table: str) -> bool:
        """True when a batch of declared ``table`` reaches ``stage`` (directly or via producers)."""
        for inp in stage.inputs:
            if inp.derived:
                if self.depends_on(self.stage(inp.table), table):
                    return True
            elif inp.table.lower() == table.lower():
                return True
        return False

    def side_tables(self, source: str) -> tuple[StateTable, ...]:
        """Top-stage side tables mirroring declared table ``source``."""
        top = self.top
        if top.direct:
            return ()
        return tuple(top.side_table(i.alias) for i in top.reads(source, derived=False))

    def join_delta_sql(self, source: str, batch_view: str, side_views: dict[str, str]) -> str | None:
        """Spark SQL for Δ of the top stage's input when a batch of ``source`` lands.

        None when no branch of the top stage reads ``source``.
        """
        top = self.top
        changed = {i.alias: (batch_view, 0) for i in top.reads(source, derived=False)}
        return render_stage_delta(top, changed, side_views)

    def table(self, name: str) -> StateTable:
        """The state table called ``name``."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def h_sql(self, table: str, batch_view: str) -> str:
        """Spark SQL computing h for ``table`` over the rows registered as ``batch_view``."""
        return self.h_query(table, batch_view).sql

    def h_query(self, table: str, batch_view: str, bucketed: bool = True) -> Query:
        """H for ``table`` over ``batch_view``, with the bucket it computes (:class:`Query`).

        ``bucketed=False`` for rows never stored (their ``_bucket`` is NULL, see render_h).
        """
        hq = next(q for q in self.h if q.table.name == table)
        if not bucketed:
            return Query(render_h(hq, batch_view, bucketed=False))
        return Query(render_h(hq, batch_view), h_bucket(hq))

    def answer_sql(self, state_views: dict[str, str]) -> str:
        """Spark SQL computing a(state) from state tables registered under ``state_views``."""
        return render_answer(self.answer, state_views)

    @cached_property
    def publish(self) -> Publish:
        """Whether the answer table is maintained by change or rewritten, and why."""
        return publish_mode(self.answer)

    def answer_change_sql(self, state_views: dict[str, str], touched: str) -> str:
        """Spark SQL for the answer rows of the groups in ``touched``, with their tombstones.

        ``touched`` holds θ and ``_bucket`` of each group; ``state_views`` hold those
        groups' state rows (see :mod:`~incr.compiler.publish`).
        """
        return render_answer_change(self.answer, self.publish, state_views, touched)

    def coarse_groups_sql(self, touched: str) -> str:
        """Spark SQL for the coarse groups of a regrouped answer (:class:`Rollup`) touched.

        Those the finer groups in ``touched`` (θ under the state's names) fall in, once each.
        """
        assert self.answer.rollup is not None, f"view {self.view} is not regrouped"
        return render_coarse_groups(self.answer.rollup, touched)

    def top_check_sql(self, candidates: str, old: str) -> str:
        """Spark SQL: new top rows ranking at or above the old top's last row.

        See :func:`~incr.compiler.queries.render_top_check`.
        """
        return render_top_check(self.publish, candidates, old)

    @cached_property
    def state_fingerprint(self) -> str:
        """Hash of what the state's contents depend on: sources, stages, θ, h, monoids."""
        seeded: set[str] = set()  # stages whose output over no rows may have rows
        for s in self.stages:
            if not s.lineage or any(i.derived and i.table in seeded for i in s.inputs):
                seeded.add(s.name)
        parts: list[dict[str, object]] = [{
            "stage": s.name,
            "branches": [str(b) for b in s.branches],
            "source": s.source,
            "append_only": s.append_only,
            "buckets": s.buckets,
            "tables": [
                [t.name, [str(k) for k in t.keys], str(t.value_key), t.vanishes, t.side_of,
                 t.bucket_keys,
                 [[v.columns, v.monoid.name, str(v.arg)] for v in t.values]]
                + ([[str(k) for k in t.row_keys]] if t.row_keys else [])
                for t in s.tables
            ],
            "where": [str(q.where) for q in s.h],
            "kept": [s.kept.name, s.kept.key_columns] if s.kept is not None else None,
            "rows": repr(s.answer) if s.name else None,
        } for s in self.stages]
        # The source columns a stage reads (named anywhere in it), not all its table declares:
        # a column added to a source leaves the state of a view that does not read it as it is.
        for part, s in zip(parts, self.stages):
            part["source"] = [s.source, [(c.name, str(c.type)) for c in s.source_columns
                                         if c.name.lower() in _words(part)]]
        # A stage's state over no rows holds its derived inputs' rows over no rows (a global
        # aggregate's one row) since issue 20's fix: state built without them is rebuilt.
        for part, s in zip(parts, self.stages):
            if aliases := [i.alias for i in s.inputs if i.derived and i.table in seeded]:
                part["seeded"] = aliases
        if self.iteration is not None:  # the state holds rows evaluated against past iterates
            parts.append({"iteration": repr(self.iteration)})
        if self.recursion is not None:  # the state holds the fixpoint of this recursion
            parts.append({"recursion": repr(self.recursion)})
        return _digest(parts)

    @cached_property
    def answer_fingerprint(self) -> str:
        """Hash of the answer query (together with the state it reads)."""
        return _digest([self.state_fingerprint, repr(self.answer), self.output])


def _words(obj: object) -> set[str]:
    """Every identifier-like word in ``obj``'s JSON, in lower case.

    A joined relation's ``<alias>__<column>`` is also split into its parts.
    """
    words = set(re.findall(r"\w+", json.dumps(obj, default=str).lower()))
    return words | {piece for w in words if "__" in w for piece in w.split("__")}


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]

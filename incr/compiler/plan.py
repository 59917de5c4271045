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
from dataclasses import dataclass, field
from functools import cached_property

from incr.algebra.monoids import Count, Monoid
from incr.compiler.ir import EquiJoin, Named, Rel, SortKey
from incr.compiler.program import Column
from incr.compiler.scalar import Scalar

#: Column holding each state row's multiplicity (rows of θ folded into it).
ROW_COUNT = "_n"
#: Partition column of every state table: a hash bucket of θ.
BUCKET = "_bucket"


@dataclass(frozen=True)
class StateValue:
    """One monoid element stored in ``columns`` (several for multi-part monoids).

    ``arg`` is the expression over the source the element folds (None for COUNT(*)).
    """

    columns: tuple[str, ...]
    monoid: Monoid
    arg: Scalar | None

    def describe(self) -> str:
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

    @property
    def bucket_columns(self) -> tuple[str, ...]:
        """Columns whose hash is the partition bucket."""
        return self.bucket_keys if self.bucket_keys is not None else tuple(k.name for k in self.keys)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Columns that identify a state row."""
        extra = (self.value_key.name,) if self.value_key is not None else ()
        return tuple(k.name for k in self.keys) + extra

    @property
    def value_columns(self) -> tuple[str, ...]:
        """Columns holding monoid elements, in table order."""
        return tuple(c for v in self.values for c in v.columns)

    @property
    def invertible(self) -> bool:
        """True when every value has an inverse, i.e. ⊗̃ exists."""
        return all(v.monoid.has_inverse for v in self.values)


@dataclass(frozen=True)
class HQuery:
    """h for one state table: fold a batch of ``source`` rows that pass ``where`` by θ.

    For a join view, the main tables' source is the joined delta (``joined``) and each side
    table's source is its declared table.
    """

    table: StateTable
    source: str
    where: Scalar | None
    buckets: int


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
    """An aggregate over a bag's live values: ``func`` is min, max or count."""

    name: str
    func: str


@dataclass(frozen=True)
class BagJoin:
    """A value-count bag joined into the answer by θ, pre-aggregated per θ."""

    table: str
    alias: str
    aggregates: tuple[BagAggregate, ...]


@dataclass(frozen=True)
class Answer:
    """a(state): reads ``main`` (alias m) and the bags, then HAVING, ORDER BY, LIMIT."""

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


@dataclass(frozen=True)
class IncrementalPlan:
    """Everything the runtime needs to maintain one view."""

    program: str
    view: str
    select: str
    source: str
    sources: tuple[str, ...]
    join: EquiJoin | None
    source_columns: tuple[Column, ...]
    append_only: bool
    logical: Rel
    lineage: tuple[Named, ...]
    tables: tuple[StateTable, ...]
    h: tuple[HQuery, ...]
    merge: tuple[MergeSpec, ...]
    diminish: tuple[MergeSpec, ...]
    diffuse: tuple[DiffusionSpec, ...]
    answer: Answer
    buckets: int
    output: tuple[str, ...] = field(default=())

    @property
    def ordered(self) -> bool:
        """True when the answer has an ORDER BY (row order is then part of the answer)."""
        return bool(self.answer.order)

    @property
    def main_tables(self) -> tuple[StateTable, ...]:
        """The tables a and the view's progress read: the aggregate state and its bags."""
        return tuple(t for t in self.tables if t.side_of is None)

    def side_tables(self, source: str) -> tuple[StateTable, ...]:
        """Side tables mirroring declared table ``source`` (empty for single-source views)."""
        inp = self.join.for_table(source) if self.join else None
        return tuple(t for t in self.tables if inp is not None and t.side_of == inp.alias)

    def join_delta_sql(self, source: str, batch_view: str, side_views: dict[str, str]) -> str:
        """Spark SQL for Δ(joined) when a batch of ``source`` lands (see sqlgen.render_join_delta)."""
        from incr.compiler.sqlgen import render_join_delta

        assert self.join is not None
        return render_join_delta(self.join, self.join.for_table(source), batch_view, side_views)

    def table(self, name: str) -> StateTable:
        """The state table called ``name``."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def h_sql(self, table: str, batch_view: str) -> str:
        """Spark SQL computing h for ``table`` over the batch registered as ``batch_view``."""
        from incr.compiler.sqlgen import render_h

        hq = next(q for q in self.h if q.table.name == table)
        return render_h(hq, batch_view)

    def answer_sql(self, state_views: dict[str, str]) -> str:
        """Spark SQL computing a(state) from state tables registered under ``state_views``."""
        from incr.compiler.sqlgen import render_answer

        return render_answer(self.answer, state_views)

    @cached_property
    def state_fingerprint(self) -> str:
        """Hash of what the state's contents depend on: source schema, θ, h, monoids."""
        parts = {
            "source": [self.source, [(c.name, str(c.type)) for c in self.source_columns]],
            "join": str(self.join),
            "append_only": self.append_only,
            "buckets": self.buckets,
            "tables": [
                [t.name, [str(k) for k in t.keys], str(t.value_key), t.vanishes, t.side_of,
                 t.bucket_keys,
                 [[v.columns, v.monoid.name, str(v.arg)] for v in t.values]]
                for t in self.tables
            ],
            "where": [str(q.where) for q in self.h],
        }
        return _digest(parts)

    @cached_property
    def answer_fingerprint(self) -> str:
        """Hash of the answer query (together with the state it reads)."""
        return _digest([self.state_fingerprint, repr(self.answer), self.output])


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]

"""The value the passes hand along: one view, growing from IR to a full plan.

Each pass takes a :class:`Compilation` and returns a new one with its own fields filled in
(``dataclasses.replace``); fields a pass has not reached yet are None.
"""

from __future__ import annotations

from dataclasses import dataclass

from incr.compiler.ir import Branch, Named, Rel, reads_directly
from incr.compiler.plan import (
    Answer,
    DiffusionSpec,
    HQuery,
    MergeSpec,
    StagePlan,
    StateTable,
    StateValue,
)
from incr.compiler.program import Program, TableDecl, ViewDecl
from incr.compiler.scalar import Scalar

#: A value-count bag: (θ, value) -> number of live copies (MIN/MAX under deletions, COUNT
#: DISTINCT, VAR/STDDEV under deletions).
VALUES = "values"
#: Exact band sums of a floating-point argument: (θ, band) -> exact total (SUM/AVG of a
#: DOUBLE under deletions; see :mod:`incr.algebra.exact`).
EXACT = "exact"


@dataclass(frozen=True)
class BagRead:
    """What an aggregate reads from a per-θ table beside the main state.

    The table is the bag of ``kind`` over ``arg``; ``sql`` is a Spark aggregate over its
    rows (columns ``value``, ``_n``, ``_total``, and ``_mean`` when ``centered``: the mean
    of the θ's values, for two-pass moments), pre-computed per θ as column ``name``.
    """

    kind: str
    arg: Scalar
    name: str
    sql: str
    centered: bool = False
    #: MIN or MAX: the same over the bag's rows whether or not rows of equal values are
    #: first summed into one (see :attr:`~incr.compiler.plan.BagAggregate.idempotent`).
    idempotent: bool = False


@dataclass(frozen=True)
class AggState:
    """How one aggregate is kept (monoid inference's answer for it).

    ``values`` are monoid elements in the main state table; ``bags`` what it reads from
    per-θ tables beside it (a value-count bag, exact band sums).  ``finalize`` computes the
    SQL result from state columns (``m.<col>`` for the main table, ``b<i>.<name>`` for a
    bag), and is the aggregate's share of the answer function a.
    """

    name: str
    values: tuple[StateValue, ...]
    bags: tuple[BagRead, ...]
    finalize: Scalar


@dataclass(frozen=True)
class Compilation:
    """A view on its way through the passes."""

    program: Program
    view: ViewDecl
    source: TableDecl
    rel: Rel
    branches: tuple[Branch, ...] = ()
    stage: str = ""  # "" for the view's own stage; s1, s2, ... for the stages it reads
    lineage: tuple[Named, ...] | None = None
    key_columns: tuple[tuple[str, str], ...] | None = None  # IR key name (_k<i>) -> state column
    aggregates: tuple[AggState, ...] | None = None
    tables: tuple[StateTable, ...] | None = None
    h: tuple[HQuery, ...] | None = None
    answer: Answer | None = None
    merge: tuple[MergeSpec, ...] | None = None
    diminish: tuple[MergeSpec, ...] | None = None
    diffuse: tuple[DiffusionSpec, ...] | None = None
    signed: tuple[MergeSpec, ...] | None = None
    replace: tuple[MergeSpec, ...] | None = None
    kept: StateTable | None = None  # the output rows a nested stage handed on (split_answer)
    keep: MergeSpec | None = None  # ⊗± of those rows (derive_merge)

    def table_name(self, name: str) -> str:
        """A state table's name, prefixed by the stage so names are unique in the view."""
        return f"{self.stage}_{name}" if self.stage else name

    @property
    def direct(self) -> bool:
        """True when the stage reads one input with no join (h runs on its batches)."""
        return reads_directly(self.branches)


def build_stage(c: Compilation) -> StagePlan:
    """Assembles one stage's plan from a compilation that went through every pass."""
    assert c.answer is not None and c.tables is not None and c.h is not None
    assert c.merge is not None and c.diminish is not None and c.diffuse is not None
    assert c.signed is not None
    return StagePlan(
        name=c.stage, branches=c.branches, source=c.source.name,
        source_columns=c.source.columns, append_only=c.source.append_only, logical=c.rel,
        lineage=c.lineage or (), tables=c.tables, h=c.h, merge=c.merge, diminish=c.diminish,
        signed=c.signed, diffuse=c.diffuse, answer=c.answer, buckets=c.h[0].buckets,
        output=tuple(e.name for e in c.answer.exprs), replace=c.replace or (), kept=c.kept,
        keep=c.keep)

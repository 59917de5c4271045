"""Monoid inference: how each aggregate is kept so that merging states is exact.

Every aggregate becomes one or more monoid elements per θ, plus a finalization that the
answer function applies (seed §7 for the monoids, §9 for pulling the non-homomorphic rest
out; HIFUN §4.1 for the per-aggregate merge rules):

==================  ===========================================  ===============================
aggregate           state (monoid)                               finalize (part of a)
==================  ===========================================  ===============================
COUNT(*)            ``_n`` (count)                               ``_n``
COUNT(x)            ``cnt_x`` (count)                            ``cnt_x``
SUM(x)              ``sum_x`` (sum), ``cnt_x`` (count)           NULL when ``cnt_x = 0``
AVG(x)              ``sum_x``, ``cnt_x``                         ``sum_x / cnt_x``
SUM/AVG(DOUBLE x)   append-only source: as above                 as above
                    otherwise: bands (θ, band) → exact total     exact sum (/ ``cnt_x``)
MIN/MAX(x)          append-only source: ``min_x`` (min/max)      ``min_x``
                    otherwise: bag (θ, x) → count                min/max of live values
COUNT(DISTINCT x)   bag (θ, x) → count                           number of live values
VAR_*/STDDEV_*(x)   append-only source: ``n_x, mean_x, m2_x``    ``m2/(n-1)``, ``sqrt``, ...
                    (moments); otherwise: bag (θ, x) → count     two passes over live values
==================  ===========================================  ===============================

MIN and MAX have no inverse, so when the source takes deletions they are answered from a
value-count bag, which is exact: a value leaves the bag only when its last copy is deleted.
Floating-point sums and moments have an inverse only on paper: ``(1e16 + 1) - 1e16`` is 0,
so a DOUBLE state diminished by a deletion keeps the rounding of what left it.  Under
deletions a SUM/AVG of a DOUBLE is kept as exact integers per binary band
(:mod:`incr.algebra.exact`; small: a row or two per θ), and VAR/STDDEV are computed from
the live values in the bag (its size is the number of distinct values per θ).  A stage
feeding another keeps, beside them, the rows it handed on (see :func:`infer_monoids`); an
iterative view's step keeps the DOUBLE monoids.
Identical elements are shared (AVG(x) and SUM(x) keep one ``sum_x``).
"""

from __future__ import annotations

import re
from dataclasses import replace

from incr.algebra.exact import value_sql
from incr.algebra.monoids import Count, Max, Min, Moments, Monoid, Sum, WideSum
from incr.compiler.compilation import EXACT, VALUES, AggState, BagRead, Compilation
from incr.compiler.dialect import MAIN as MAIN
from incr.compiler.ir import AggCall, Aggregate
from incr.compiler.plan import ROW_COUNT, StateValue
from incr.compiler.scalar import Scalar
from incr.compiler.types import FLOAT_TYPES, INTEGER_TYPES, infer_type


def infer_monoids(c: Compilation) -> Compilation:
    """Fills ``aggregates``: one :class:`AggState` per aggregate of the view."""
    agg = next(node for node in c.rel.walk() if isinstance(node, Aggregate))
    namer = _Namer()
    namer.used.update(k.name.lower() for k in c.lineage or ())  # θ columns share the table
    bags = _Bags()
    # A stage that feeds another (a subquery, a grouping set) hands on rows the next stage
    # matches by value, and a sum over bands or bag rows in no fixed order may differ in
    # its last bit from one computation to the next: such a stage keeps the rows it handed
    # on (split_answer's ``kept``) and takes back those.  An iterative view's step keeps
    # DOUBLE monoids: its loop compares answers within TOLERANCE.
    exact = not c.source.append_only and not c.view.step
    states: list[AggState] = []
    for named in agg.aggs:
        arg = named.call.arg
        arg_type = infer_type(arg, c.source.name, c.source.columns).name if arg is not None else None
        states.append(_state_for(named.name, named.call, c.source.append_only, exact,
                                 arg_type, namer, bags))
    return replace(c, aggregates=tuple(states))


def bag_alias(index: int) -> str:
    """Alias of the ``index``-th per-θ table (bag) in the answer query."""
    return f"b{index}"


class _Bags:
    """Numbers the bags a view reads: one per (kind, argument), shared by its aggregates."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str], int] = {}

    def read(self, kind: str, arg: Scalar, name: str, sql: str,
             centered: bool = False, idempotent: bool = False) -> tuple[BagRead, str]:
        """The read, and the column reference its finalization uses (``b<i>.<name>``)."""
        i = self.index.setdefault((kind, arg.sql), len(self.index))
        return BagRead(kind, arg, name, sql, centered, idempotent), f"{bag_alias(i)}.{name}"


def _state_for(name: str, call: AggCall, append_only: bool, exact: bool, arg_type: str | None,
               namer: _Namer, bags: _Bags) -> AggState:
    """``exact``: keep floating-point sums and moments free of the rounding of deletions.

    Sums of integers are kept wide (:class:`WideSum`) and cast back to BIGINT by the answer
    (AVG divides them as DOUBLE), so the answer's types are those of a plain SUM.
    """
    func, arg = call.func, call.arg
    floating, integral = arg_type in FLOAT_TYPES, arg_type in INTEGER_TYPES | {"INT"}

    def value(prefix: str, monoid: Monoid) -> StateValue:
        return namer.value(prefix, monoid, arg)

    def col(v: StateValue, part: int = 0) -> str:
        return f"{MAIN}.{v.columns[part]}"

    if func == "count_star":
        return AggState(name, (), (), Scalar(f"{MAIN}.{ROW_COUNT}"))
    if func == "count":
        cnt = value("cnt", Count())
        return AggState(name, (cnt,), (), Scalar(col(cnt)))
    if func in ("sum", "avg") and floating and exact:
        assert arg is not None
        cnt = value("cnt", Count())
        read, ref = bags.read(EXACT, arg, "sum_value", value_sql("`value`", "`_total`"))
        summed = f"coalesce({ref}, CAST(0 AS DOUBLE))"
        result = summed if func == "sum" else f"{summed} / {col(cnt)}"
        return AggState(name, (cnt,), (read,), Scalar(f"CASE WHEN {col(cnt)} > 0 THEN {result} END"))
    if func in ("sum", "avg"):
        total, cnt = value("sum", WideSum() if integral else Sum()), value("cnt", Count())
        summed = col(total)
        if integral:
            summed = f"CAST({summed} AS {'BIGINT' if func == 'sum' else 'DOUBLE'})"
        result = summed if func == "sum" else f"{summed} / {col(cnt)}"
        return AggState(name, (total, cnt), (),
                        Scalar(f"CASE WHEN {col(cnt)} > 0 THEN {result} END"))
    if func in ("min", "max") and append_only:
        ext = value(func, Min() if func == "min" else Max())
        return AggState(name, (ext,), (), Scalar(col(ext)))
    if func in ("min", "max", "count_distinct"):
        assert arg is not None
        bag_func = {"min": "min", "max": "max", "count_distinct": "count"}[func]
        read, ref = bags.read(VALUES, arg, f"{bag_func}_value", f"{bag_func}(`value`)",
                              idempotent=func in ("min", "max"))
        finalize = f"coalesce({ref}, 0)" if func == "count_distinct" else ref
        return AggState(name, (), (read,), Scalar(finalize))
    if func in ("var_samp", "var_pop", "stddev_samp", "stddev_pop"):
        sample = func.endswith("samp")
        if not exact:
            mom = value("", Moments())
            n, m2 = col(mom, 0), col(mom, 2)
            var = f"greatest({m2}, CAST(0 AS DOUBLE)) / {f'({n} - 1)' if sample else n}"
            reads: tuple[BagRead, ...] = ()
            values: tuple[StateValue, ...] = (mom,)
        else:
            # Under deletions the moments are taken from the live values themselves (two
            # passes over the bag): a diminished mean keeps the rounding of what left it.
            assert arg is not None
            x = "CAST(`value` AS DOUBLE)"
            n_read, n = bags.read(VALUES, arg, "n_value", "sum(`_n`)", centered=True)
            m2_read, m2 = bags.read(VALUES, arg, "m2_value",
                                    f"sum(`_n` * ({x} - `_mean`) * ({x} - `_mean`))",
                                    centered=True)
            var = f"{m2} / {f'({n} - 1)' if sample else n}"
            reads, values = (n_read, m2_read), ()
        if func.startswith("stddev"):
            var = f"sqrt({var})"
        return AggState(name, values, reads,
                        Scalar(f"CASE WHEN {n} > {1 if sample else 0} THEN {var} END"))
    raise AssertionError(f"translate let through an unknown aggregate {func}")


class _Namer:
    """Readable, unique state column names (``sum_amount``), shared for equal elements."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], StateValue] = {}
        self.bases: dict[str, str] = {}
        self.used: set[str] = {ROW_COUNT}

    def value(self, prefix: str, monoid: Monoid, arg: Scalar | None) -> StateValue:
        key = (monoid.name, arg.sql if arg is not None else "*")
        if key in self.values:
            return self.values[key]
        base = self._base(arg)
        cols = tuple(self._unique(f"{part or prefix}_{base}") for part in monoid.parts)
        sv = StateValue(cols, monoid, arg)
        self.values[key] = sv
        return sv

    def _base(self, arg: Scalar | None) -> str:
        text = arg.sql if arg is not None else "rows"
        if text not in self.bases:
            base = re.sub(r"[^A-Za-z0-9]+", "_", text.lower()).strip("_")
            if not base or len(base) > 40:
                base = f"x{len(self.bases)}"
            if base in self.bases.values():
                base = f"{base}_{len(self.bases)}"
            self.bases[text] = base
        return self.bases[text]

    def _unique(self, name: str) -> str:
        candidate, n = name, 2
        while candidate.lower() in self.used:
            candidate = f"{name}_{n}"
            n += 1
        self.used.add(candidate.lower())
        return candidate

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
MIN/MAX(x)          append-only source: ``min_x`` (min/max)      ``min_x``
                    otherwise: bag (θ, x) → count                min/max of live values
COUNT(DISTINCT x)   bag (θ, x) → count                           number of live values
VAR_*/STDDEV_*(x)   ``n_x, mean_x, m2_x`` (moments)              ``m2/(n-1)``, ``sqrt``, ...
==================  ===========================================  ===============================

MIN and MAX have no inverse, so when the source takes deletions they are answered from a
value-count bag, which is exact: a value leaves the bag only when its last copy is deleted.
Identical elements are shared (AVG(x) and SUM(x) keep one ``sum_x``).
"""

from __future__ import annotations

import re
from dataclasses import replace

from incr.algebra.monoids import Count, Max, Min, Moments, Monoid, Sum
from incr.compiler.compilation import AggState, Compilation
from incr.compiler.dialect import MAIN as MAIN
from incr.compiler.ir import AggCall, Aggregate
from incr.compiler.plan import ROW_COUNT, StateValue
from incr.compiler.scalar import Scalar


def infer_monoids(c: Compilation) -> Compilation:
    """Fills ``aggregates``: one :class:`AggState` per aggregate of the view."""
    agg = next(node for node in c.rel.walk() if isinstance(node, Aggregate))
    namer = _Namer()
    namer.used.update(k.name.lower() for k in c.lineage or ())  # θ columns share the table
    bags: dict[str, int] = {}
    states: list[AggState] = []
    for named in agg.aggs:
        states.append(_state_for(named.name, named.call, c.source.append_only, namer, bags))
    return replace(c, aggregates=tuple(states))


def bag_alias(index: int) -> str:
    """Alias of the ``index``-th value-count bag in the answer query."""
    return f"b{index}"


def _state_for(name: str, call: AggCall, append_only: bool, namer: _Namer,
               bags: dict[str, int]) -> AggState:
    func, arg = call.func, call.arg

    def value(prefix: str, monoid: Monoid) -> StateValue:
        return namer.value(prefix, monoid, arg)

    def col(v: StateValue, part: int = 0) -> str:
        return f"{MAIN}.{v.columns[part]}"

    if func == "count_star":
        return AggState(name, (), None, None, Scalar(f"{MAIN}.{ROW_COUNT}"))
    if func == "count":
        cnt = value("cnt", Count())
        return AggState(name, (cnt,), None, None, Scalar(col(cnt)))
    if func in ("sum", "avg"):
        total, cnt = value("sum", Sum()), value("cnt", Count())
        result = col(total) if func == "sum" else f"{col(total)} / {col(cnt)}"
        return AggState(name, (total, cnt), None, None,
                        Scalar(f"CASE WHEN {col(cnt)} > 0 THEN {result} END"))
    if func in ("min", "max") and append_only:
        ext = value(func, Min() if func == "min" else Max())
        return AggState(name, (ext,), None, None, Scalar(col(ext)))
    if func in ("min", "max", "count_distinct"):
        assert arg is not None
        index = bags.setdefault(arg.sql, len(bags))
        bag_func = {"min": "min", "max": "max", "count_distinct": "count"}[func]
        ref = f"{bag_alias(index)}.{bag_func}_value"
        finalize = f"coalesce({ref}, 0)" if func == "count_distinct" else ref
        return AggState(name, (), arg, bag_func, Scalar(finalize))
    if func in ("var_samp", "var_pop", "stddev_samp", "stddev_pop"):
        mom = value("", Moments())
        n, m2 = col(mom, 0), col(mom, 2)
        sample = func.endswith("samp")
        divisor = f"({n} - 1)" if sample else n
        var = f"greatest({m2}, CAST(0 AS DOUBLE)) / {divisor}"
        if func.startswith("stddev"):
            var = f"sqrt({var})"
        return AggState(name, (mom,), None, None,
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

"""The monoids state columns are merged with, written down once.

Each monoid is an object with

* its algebra in plain Python: :meth:`~Monoid.identity`, :meth:`~Monoid.combine` and, when
  it has one, the inverse :meth:`~Monoid.diminish` (``diminish(combine(x, y), y) == x``);
  :meth:`~Monoid.lift` maps one input value to an element, so a bag folds to
  ``combine(lift(v1), combine(lift(v2), ...))``.  These are the specification the law tests
  (hypothesis) check, and what the SQL forms are tested against.
* its Spark form, :meth:`~Monoid.spark_fold`: the aggregate expressions that compute the
  fold of ``lift`` over a group in one pass (the homomorphism h on a batch).
* its merge form, :meth:`~Monoid.sql_combine` / :meth:`~Monoid.sql_diminish`: SQL over the
  target (``t``) and source (``s``) columns, used in the Delta MERGE for ⊗ and ⊗̃.
* its regrouping form, :attr:`~Monoid.sql_regroup`: the SQL aggregate that is ⊗ over many
  state rows, so a state kept by a finer grouping answers a coarser one (seed 003's BRR:
  ``SUM`` of sums, ``MIN`` of minima); None when ⊗ is no plain aggregate (moments).

An element may span several state columns (``parts``): the moments monoid behind VAR/STDDEV
is the triple (n, mean, M2), merged with Chan et al.'s parallel formulas, which stay accurate
where sum-of-squares cancels catastrophically.

All monoids here are commutative, so batches may be folded in any grouping.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from typing_extensions import override

Element = tuple[Any, ...]


class NoInverse(ArithmeticError):
    """Raised by :meth:`Monoid.diminish` for monoids without an inverse (MIN, MAX)."""


class Monoid(ABC):
    """A commutative monoid over tuples of state-column values."""

    #: Short name shown by ``incr explain``.
    name: ClassVar[str]
    #: Suffixes of the state columns an element occupies (one column: ``("",)``).
    parts: ClassVar[tuple[str, ...]] = ("",)
    #: Whether :meth:`diminish` exists, i.e. deletions can be merged with ⊗̃.
    has_inverse: ClassVar[bool] = True
    #: The SQL aggregate computing ⊗ of a column's elements over many rows (a one-column
    #: element), or None: how a finer grouping's state rows combine into a coarser group's.
    sql_regroup: ClassVar[str | None] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    # -- algebra -------------------------------------------------------------------------
    @abstractmethod
    def identity(self) -> Element:
        """The neutral element: ``combine(identity(), x) == x``."""

    @abstractmethod
    def combine(self, x: Element, y: Element) -> Element:
        """The monoid operation (⊕)."""

    def diminish(self, x: Element, y: Element) -> Element:
        """The inverse operation: removes ``y`` from ``x`` (requires y ⊑ x)."""
        raise NoInverse(f"{self.name} has no inverse")

    @abstractmethod
    def lift(self, value: Any) -> Element:
        """The element for one input value (None is SQL NULL)."""

    def fold(self, values: Sequence[Any]) -> Element:
        """Reference fold of ``lift`` over a bag of values."""
        acc = self.identity()
        for v in values:
            acc = self.combine(acc, self.lift(v))
        return acc

    # -- Spark form (h) --------------------------------------------------------------------
    @abstractmethod
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        """Spark SQL aggregate expressions computing ``fold(lift(arg))`` over a group, per part."""

    # -- merge form (⊗ and ⊗̃) -------------------------------------------------------------
    @abstractmethod
    def sql_combine(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        """SQL for ``combine(t, s)`` per part, given the target and source column references."""

    def sql_diminish(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        """SQL for ``diminish(t, s)`` per part."""
        raise NoInverse(f"{self.name} has no inverse")


class Count(Monoid):
    """Counts non-NULL values (``COUNT(x)``) or rows (``COUNT(*)``, arg None); inverse: subtraction."""

    name = "count(+)"
    sql_regroup = "sum"

    @override
    def identity(self) -> Element:
        return (0,)

    @override
    def combine(self, x: Element, y: Element) -> Element:
        return (x[0] + y[0],)

    @override
    def diminish(self, x: Element, y: Element) -> Element:
        return (x[0] - y[0],)

    @override
    def lift(self, value: Any) -> Element:
        return (0 if value is None else 1,)

    @override
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        return (f"count({arg if arg is not None else '*'})",)

    @override
    def sql_combine(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        return (f"{t[0]} + {s[0]}",)

    @override
    def sql_diminish(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        return (f"{t[0]} - {s[0]}",)


class Sum(Monoid):
    """Sums non-NULL values, NULL counting as the identity 0; inverse: subtraction.

    The state keeps the plain sum; whether the SQL answer is NULL (no non-NULL value) is
    decided from a companion :class:`Count`, so the element itself never holds NULL.
    """

    name = "sum(+)"
    sql_regroup = "sum"

    @override
    def identity(self) -> Element:
        return (0,)

    @override
    def combine(self, x: Element, y: Element) -> Element:
        return (x[0] + y[0],)

    @override
    def diminish(self, x: Element, y: Element) -> Element:
        return (x[0] - y[0],)

    @override
    def lift(self, value: Any) -> Element:
        return (0 if value is None else value,)

    @override
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        return (f"coalesce(sum({arg}), 0)",)

    @override
    def sql_combine(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        return (f"{t[0]} + {s[0]}",)

    @override
    def sql_diminish(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        return (f"{t[0]} - {s[0]}",)


class WideSum(Sum):
    """A sum of integers, kept as DECIMAL(38,0) rather than in the argument's type.

    A BIGINT state would wrap silently past ±9.2e18 when two MERGEs add up (delta-rs's MERGE
    does not check), and deletions may take a sum through such values on the way to an
    answer that fits.  DECIMAL(38,0) is exact to ±10^38, where DuckDB's HUGEINT sum agrees;
    the answer casts back to BIGINT, so only an answer that does not fit BIGINT is refused.
    """

    name = "wide-sum(+)"

    @override
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        return (f"CAST(coalesce(sum(CAST({arg} AS DECIMAL(38,0))), 0) AS DECIMAL(38,0))",)


class _Extremum(Monoid):
    """MIN or MAX with NULL as the identity; no inverse (deletions need a value-count bag)."""

    has_inverse = False
    _better: ClassVar[str]

    @override
    def identity(self) -> Element:
        return (None,)

    @override
    def combine(self, x: Element, y: Element) -> Element:
        a, b = x[0], y[0]
        if a is None:
            return (b,)
        if b is None:
            return (a,)
        return (self._pick(a, b),)

    @abstractmethod
    def _pick(self, a: Any, b: Any) -> Any: ...

    @override
    def lift(self, value: Any) -> Element:
        return (value,)

    @override
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        return (f"{self.name}({arg})",)

    @override
    def sql_combine(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        return ((f"CASE WHEN {t[0]} IS NULL THEN {s[0]} WHEN {s[0]} IS NULL THEN {t[0]} "
                 f"WHEN {s[0]} {self._better} {t[0]} THEN {s[0]} ELSE {t[0]} END"),)


class Min(_Extremum):
    """MIN over values, NULL-ignoring."""

    name = "min"
    _better = "<"
    sql_regroup = "min"

    def _pick(self, a: Any, b: Any) -> Any:
        return min(a, b)


class Max(_Extremum):
    """MAX over values, NULL-ignoring."""

    name = "max"
    _better = ">"
    sql_regroup = "max"

    def _pick(self, a: Any, b: Any) -> Any:
        return max(a, b)


class Moments(Monoid):
    """(n, mean, M2) of the non-NULL values: the basis of VAR_* and STDDEV_*.

    ``combine`` is Chan, Golub & LeVeque's pairwise update; ``diminish`` solves it for the
    left operand.  M2 is the sum of squared deviations from the mean, so the answer is
    ``M2 / (n - 1)`` (sample) or ``M2 / n`` (population).
    """

    name = "moments(n,mean,m2)"
    parts = ("n", "mean", "m2")

    @override
    def identity(self) -> Element:
        return (0, 0.0, 0.0)

    @override
    def combine(self, x: Element, y: Element) -> Element:
        na, ma, qa = x
        nb, mb, qb = y
        n = na + nb
        if n == 0:
            return (0, 0.0, 0.0)
        delta = mb - ma
        return (n, ma + delta * nb / n, qa + qb + delta * delta * na * nb / n)

    @override
    def diminish(self, x: Element, y: Element) -> Element:
        n, m, q = x
        nb, mb, qb = y
        na = n - nb
        if na == 0:
            return (0, 0.0, 0.0)
        delta = mb - m
        return (na, m - delta * nb / na, q - qb - delta * delta * n * nb / na)

    @override
    def lift(self, value: Any) -> Element:
        return (0, 0.0, 0.0) if value is None else (1, float(value), 0.0)

    @override
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        x = f"CAST({arg} AS DOUBLE)"
        return (f"count({arg})", f"coalesce(avg({x}), CAST(0 AS DOUBLE))",
                f"coalesce(var_pop({x}) * count({arg}), CAST(0 AS DOUBLE))")

    @override
    def sql_combine(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        (tn, tm, tq), (sn, sm, sq) = t, s
        n = f"({tn} + {sn})"
        delta = f"({sm} - {tm})"
        return (
            f"{tn} + {sn}",
            (f"CASE WHEN {n} = 0 THEN CAST(0 AS DOUBLE) "
             f"ELSE {tm} + {delta} * CAST({sn} AS DOUBLE) / CAST({n} AS DOUBLE) END"),
            (f"CASE WHEN {n} = 0 THEN CAST(0 AS DOUBLE) ELSE {tq} + {sq} + {delta} * {delta} "
             f"* CAST({tn} AS DOUBLE) * CAST({sn} AS DOUBLE) / CAST({n} AS DOUBLE) END"),
        )

    @override
    def sql_diminish(self, t: Sequence[str], s: Sequence[str]) -> tuple[str, ...]:
        (tn, tm, tq), (sn, sm, sq) = t, s
        na = f"({tn} - {sn})"
        delta = f"({sm} - {tm})"
        return (
            f"{tn} - {sn}",
            (f"CASE WHEN {na} = 0 THEN CAST(0 AS DOUBLE) "
             f"ELSE {tm} - {delta} * CAST({sn} AS DOUBLE) / CAST({na} AS DOUBLE) END"),
            (f"CASE WHEN {na} = 0 THEN CAST(0 AS DOUBLE) ELSE {tq} - {sq} - {delta} * {delta} "
             f"* CAST({tn} AS DOUBLE) * CAST({sn} AS DOUBLE) / CAST({na} AS DOUBLE) END"),
        )


#: Every monoid, for law tests and lookups by name.
ALL: tuple[Monoid, ...] = (Count(), Sum(), Min(), Max(), Moments())


def close(a: Element, b: Element, rel: float = 1e-9, abs_: float = 1e-9) -> bool:
    """Element equality with float tolerance (exact for ints and None)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, float) or isinstance(y, float):
            if x is None or y is None or not math.isclose(x, y, rel_tol=rel, abs_tol=abs_):
                return False
        elif x != y:
            return False
    return True

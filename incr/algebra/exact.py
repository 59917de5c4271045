"""Sums of DOUBLEs kept exactly, so that deleting a value takes back exactly what it added.

A DOUBLE sum kept as a DOUBLE cannot be diminished: ``(1e16 + 1) - 1e16`` is 0, not 1, and
the lost bits stay in the state for good (the residue a storage reviewer finds first).  So
under deletions a SUM or AVG of a floating-point argument is kept in an exact abelian group
instead, the way Materialize keeps float sums as 128-bit fixed point, but over the whole
DOUBLE range and without rounding:

* a finite ``x != 0`` lies in exactly one **band** ``b``, the 32 binades with
  ``2^(32b) <= |x| < 2^(32b+32)`` (``b`` from -34, the subnormals, to 31);
* within its band, ``x`` is the integer ``y = x * 2^(52-32b)`` (|y| < 2^84) scaled down:
  every DOUBLE of the band is a multiple of ``2^(32b-52)``, so ``y`` is exact;
* a state row per (θ, band) keeps the sum of the ``y`` as DECIMAL(38,0): exact addition and
  subtraction, room for 2^42 values per band;
* NaN, +Inf and -Inf have bands of their own (:data:`NAN_BAND`, ...), counted by the row's
  ``_n``, so a deleted NaN leaves no NaN behind; the answer follows IEEE as DuckDB does
  (NaN if any NaN or both infinities are live, else the infinity, else the finite sum).

The answer is a deterministic function of the live values alone (the bands' exact totals
converted and added), never of the order in which batches came, which is what "no residue"
means.  It is the exactly rounded band totals added in DOUBLE: within a couple of ulps of
the true sum, and closer to it than a DOUBLE accumulator over the same values.

Both engines compute the same bands and totals bit for bit: the SQL below uses only
comparisons with exact power-of-two literals, products with powers of two (exact), a
truncating cast of an integral DOUBLE below 2^63, and DECIMAL arithmetic.  The Python
functions are the specification the SQL forms are tested against.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, ClassVar

from typing_extensions import override

from incr.algebra.monoids import Element, Sum

#: Binades per band.
WIDTH = 32
#: Lowest and highest band of a finite non-zero DOUBLE (2^-1074 and 2^1023 lie in them).
LOWEST, HIGHEST = -34, 31
#: Bands of the values that are not finite; a row's ``_n`` counts them.
NAN_BAND, POS_INF_BAND, NEG_INF_BAND = 64, 65, 66
#: The largest finite DOUBLE, as a literal both engines read exactly.
MAX_DOUBLE = "1.7976931348623157e308"
#: 2^32, splitting |y| < 2^84 into two parts that each fit a BIGINT.
_SPLIT = 2**32

Bands = dict[int, int]


def band(x: float | None) -> int | None:
    """The band of ``x``: None for NULL and zero (they add nothing)."""
    if x is None or x == 0:
        return None
    if math.isnan(x):
        return NAN_BAND
    if math.isinf(x):
        return POS_INF_BAND if x > 0 else NEG_INF_BAND
    b = HIGHEST
    while b > LOWEST and abs(x) < 2.0 ** (WIDTH * b):
        b -= 1
    return b


def scaled(x: float) -> int:
    """``x`` as the exact integer its band keeps (0 for NaN and the infinities)."""
    b = band(x)
    if b is None or b > HIGHEST:
        return 0
    y = Fraction(x) * Fraction(2) ** (52 - WIDTH * b)
    assert y.denominator == 1 and abs(y) < 2**84, (x, y)
    return int(y)


def lift(x: float | None) -> Bands:
    """The element of one value: its band's integer (a non-finite value: a count of 1)."""
    b = band(x)
    if b is None:
        return {}
    assert x is not None
    return {b: scaled(x) if b <= HIGHEST else 1}


def combine(p: Mapping[int, int], q: Mapping[int, int]) -> Bands:
    """Pointwise sum (bands whose total reaches 0 are dropped: a zero adds nothing)."""
    out = dict(p)
    for b, v in q.items():
        out[b] = out.get(b, 0) + v
    return {b: v for b, v in out.items() if v != 0}


def negate(p: Mapping[int, int]) -> Bands:
    """The inverse element: what deleting the values of ``p`` adds."""
    return {b: -v for b, v in p.items()}


def fold(values: Iterable[float | None]) -> Bands:
    """The element of a bag of values."""
    acc: Bands = {}
    for v in values:
        acc = combine(acc, lift(v))
    return acc


def exact(p: Mapping[int, int]) -> Fraction:
    """The exact sum of the finite values behind ``p``."""
    return sum((Fraction(v) * Fraction(2) ** (WIDTH * b - 52)
                for b, v in p.items() if b <= HIGHEST), Fraction(0))


def value(p: Mapping[int, int]) -> float | None:
    """The answer: the SQL aggregate :func:`value_sql` computes (None: no band at all)."""
    if not p:
        return None
    nan, pos, neg = (p.get(b, 0) > 0 for b in (NAN_BAND, POS_INF_BAND, NEG_INF_BAND))
    if nan or (pos and neg):
        return math.nan
    if pos or neg:
        return math.inf if pos else -math.inf
    terms = [_band_double(b, v) for b, v in sorted(p.items()) if b <= HIGHEST]
    try:
        return math.fsum(terms)
    except OverflowError:  # the sum leaves the DOUBLE range: an infinity, as SQL's sum gives
        return sum(terms)


def _band_double(b: int, total: int) -> float:
    half = 2.0 ** (16 * b - 26)  # 2^(32b-52) as two factors: each stays a normal DOUBLE
    try:
        return float(total) * half * half
    except OverflowError:
        return math.copysign(math.inf, total)


# -- SQL forms -------------------------------------------------------------------------------

def _literal(k: int) -> str:
    """2^k as a DOUBLE literal both engines parse exactly (17 digits round-trip)."""
    return f"{2.0 ** k:.17e}"


def band_sql(x: str) -> str:
    """SQL (DuckDB and Spark alike) for :func:`band` of the DOUBLE expression ``x``.

    The finite bands are found by comparing ``|x|`` with the bands' lower bounds, halving
    the range each time (seven comparisons), so no logarithm (whose last bit differs
    between engines) decides a band.
    """
    a = f"abs({x})"

    def search(lo: int, hi: int) -> str:
        if lo == hi:
            return str(lo)
        mid = (lo + hi + 1) // 2
        return (f"CASE WHEN {a} >= {_literal(WIDTH * mid)} THEN {search(mid, hi)} "
                f"ELSE {search(lo, mid - 1)} END")

    return (f"CASE WHEN {x} IS NULL OR {x} = 0 THEN NULL WHEN isnan({x}) THEN {NAN_BAND} "
            f"WHEN {x} > {MAX_DOUBLE} THEN {POS_INF_BAND} WHEN {x} < -{MAX_DOUBLE} "
            f"THEN {NEG_INF_BAND} ELSE {search(LOWEST, HIGHEST)} END")


def _power(exponent: str) -> str:
    """2^exponent for an integer exponent: exact in both engines."""
    return f"power(2, CAST({exponent} AS INT))"


def scaled_sql(x: str, b: str) -> str:
    """SQL for :func:`scaled` of DOUBLE ``x`` given its band ``b`` (a column), as DECIMAL(38,0).

    ``y`` is split at 2^32 into two integral DOUBLEs below 2^53 (the cast truncates, so
    both parts carry y's sign), each converted exactly through BIGINT.
    """
    half = _power(f"26 - 16 * {b}")
    y = f"({x} * {half} * {half})"
    hi = f"CAST({y} / {float(_SPLIT)!r} AS BIGINT)"
    lo = f"CAST({y} - CAST({hi} AS DOUBLE) * {float(_SPLIT)!r} AS BIGINT)"
    total = (f"CAST({hi} AS DECIMAL(20,0)) * CAST({_SPLIT} AS DECIMAL(11,0)) "
             f"+ CAST({lo} AS DECIMAL(20,0))")
    return (f"CASE WHEN {b} <= {HIGHEST} THEN CAST({total} AS DECIMAL(38,0)) "
            f"ELSE CAST(0 AS DECIMAL(38,0)) END")


def value_sql(b: str, total: str) -> str:
    """The aggregate over a θ's band rows (``b``, ``total``) giving :func:`value` (Spark SQL)."""
    def present(which: int) -> str:
        return f"max(CASE WHEN {b} = {which} THEN 1 ELSE 0 END) = 1"

    half = _power(f"16 * {b} - 26")
    finite = (f"coalesce(sum(CASE WHEN {b} <= {HIGHEST} THEN CAST({total} AS DOUBLE) "
              f"* {half} * {half} END), CAST(0 AS DOUBLE))")
    return (f"CASE WHEN {present(NAN_BAND)} OR ({present(POS_INF_BAND)} AND "
            f"{present(NEG_INF_BAND)}) THEN CAST('NaN' AS DOUBLE) "
            f"WHEN {present(POS_INF_BAND)} THEN CAST('Infinity' AS DOUBLE) "
            f"WHEN {present(NEG_INF_BAND)} THEN CAST('-Infinity' AS DOUBLE) ELSE {finite} END")


class BandSum(Sum):
    """One band's total (:func:`scaled` summed): integer addition, inverse subtraction.

    The state column of an exact-sum table, keyed by (θ, band): the band is the row's
    ``value`` key (:data:`BAND_COLUMN`), which h computes next to the argument, so the fold
    reads both by their column names.  Merging is :class:`~incr.algebra.monoids.Sum`'s, on
    DECIMAL(38,0) integers, where it is exact.
    """

    name = "exact-sum(+)"
    #: The key column the table keeps the band in.
    BAND_COLUMN: ClassVar[str] = "value"

    @override
    def lift(self, value: Any) -> Element:
        return (0 if value is None or band(value) is None else scaled(value),)

    @override
    def spark_fold(self, arg: str | None) -> tuple[str, ...]:
        assert arg is not None, "an exact sum folds a value"
        return (f"CAST(coalesce(sum({scaled_sql(arg, self.BAND_COLUMN)}), 0) AS DECIMAL(38,0))",)

"""Exact DOUBLE sums (:mod:`incr.algebra.exact`): the algebra, and its SQL as DuckDB runs it.

* every finite DOUBLE lifts exactly (its band's integer times the band's unit is the value);
* lift is a homomorphism into a group: folding A and B then taking B back out gives A's
  element exactly, whatever the values (the law a DOUBLE accumulator breaks);
* the answer is within two ulps of the correctly rounded sum, NaN and the infinities as IEEE;
* ``band_sql`` / ``scaled_sql`` / ``value_sql`` run by DuckDB give the reference bit for bit
  (the Spark side is checked in ``tests/runtime/test_exact_sums.py``).
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from fractions import Fraction

import duckdb
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from incr.algebra import exact

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(allow_nan=False, allow_infinity=False)
#: Doubles near band edges, subnormals and the range ends, as well as anything.
EDGES = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
         -1.7976931348623157e308, 1.0, -1.0, 1e16, 1e-16, 2.0 ** 32, 2.0 ** 32 - 2.0 ** -20,
         2.0 ** -32, math.nextafter(2.0 ** 64, 0), 2.0 ** 992, 2.0 ** -1056, 0.1, -2.675]
anything = st.one_of(finite, st.sampled_from(EDGES), st.sampled_from([math.nan, math.inf, -math.inf]))


def test_bands_cover_the_double_range_and_specials_apart():
    assert exact.band(5e-324) == exact.LOWEST
    assert exact.band(1.7976931348623157e308) == exact.HIGHEST
    assert exact.band(1.0) == 0 and exact.band(2.0 ** 32) == 1 and exact.band(0.5) == -1
    assert exact.band(0.0) is None and exact.band(-0.0) is None and exact.band(None) is None
    assert (exact.band(math.nan), exact.band(math.inf), exact.band(-math.inf)) == (
        exact.NAN_BAND, exact.POS_INF_BAND, exact.NEG_INF_BAND)


@EXAMPLES
@given(st.one_of(finite, st.sampled_from(EDGES)))
def test_lift_is_exact(x):
    element = exact.lift(x)
    assert exact.exact(element) == Fraction(x)
    for total in element.values():
        assert abs(total) < 2 ** 84


@EXAMPLES
@given(st.lists(anything, max_size=12), st.lists(anything, max_size=12))
def test_taking_back_what_was_added_is_exact(kept, removed):
    both = exact.combine(exact.fold(kept), exact.fold(removed))
    assert exact.combine(both, exact.negate(exact.fold(removed))) == exact.fold(kept)


@EXAMPLES
@given(st.lists(st.one_of(finite, st.sampled_from(EDGES)), max_size=12))
def test_answer_is_the_sum_within_two_ulps(values):
    got = exact.value(exact.fold(values))
    if all(v == 0 for v in values):
        assert got is None
        return
    true = sum((Fraction(v) for v in values), Fraction(0))
    if true == 0:  # values that cancel (x and -x): their bands may cancel to none, which the
        assert got is None or got == 0  # answer's coalesce(sum, 0) reads as 0
        return
    try:
        rounded = float(true)
    except OverflowError:
        assert got is not None and math.isinf(got)
        return
    assert got is not None
    if math.isinf(got):
        assert abs(rounded) >= 2.0 ** 1023
        return
    assert abs(Fraction(got) - true) <= 2 * Fraction(math.ulp(rounded)), (values, got, rounded)


def test_non_finite_values_follow_ieee_and_leave_when_deleted():
    assert math.isnan(exact.value(exact.fold([1.0, math.nan])))
    assert math.isnan(exact.value(exact.fold([math.inf, -math.inf])))
    assert exact.value(exact.fold([math.inf, 1.0])) == math.inf
    assert exact.value(exact.fold([-math.inf, 1.0])) == -math.inf
    gone = exact.combine(exact.fold([1.0, math.nan, math.inf]),
                         exact.negate(exact.fold([math.nan, math.inf])))
    assert exact.value(gone) == 1.0


def test_the_issues_example_leaves_no_residue():
    state = exact.combine(exact.fold([1e16, 1.0]), exact.negate(exact.lift(1e16)))
    assert exact.value(state) == 1.0
    assert (1e16 + 1.0) - 1e16 == 0.0  # what a DOUBLE accumulator answers


def _duck_rows(values: list[float]) -> list[tuple]:
    """band and scaled total per value, computed by DuckDB from the Spark SQL the way the
    driver-side engine runs it (prepared: transpiled and checked against its safe set)."""
    from incr.runtime.local import prepare

    sql = (f"SELECT v, {exact.band_sql('v')} AS value FROM vals")
    outer = f"SELECT value, {exact.scaled_sql('v', 'value')} AS total FROM ({sql}) AS s"
    prepared = prepare(outer)
    assert prepared is not None, "the exact-sum SQL must stay inside the driver-side set"
    con = duckdb.connect()
    con.register("vals", pa.table({"v": pa.array(values, pa.float64())}))
    return con.execute(prepared.sql).fetchall()


@settings(max_examples=30, deadline=None)
@given(st.lists(anything, min_size=1, max_size=40))
def test_duckdb_computes_the_reference_bands_and_totals(values):
    for x, (b, total) in zip(values, _duck_rows(values)):
        assert b == exact.band(x), (x, b)
        if b is not None:
            assert int(total) == (exact.scaled(x) if b <= exact.HIGHEST else 0), (x, total)


def test_every_band_edge_on_duckdb():
    edges = []
    for b in range(exact.LOWEST + 1, exact.HIGHEST + 1):
        lower = 2.0 ** (exact.WIDTH * b)
        edges += [lower, math.nextafter(lower, 0), -lower, math.nextafter(lower, math.inf)]
    edges += [struct.unpack("<d", struct.pack("<Q", bits))[0] for bits in (1, 2, 0x000FFFFFFFFFFFFF)]
    test_duckdb_computes_the_reference_bands_and_totals.hypothesis.inner_test(edges)


@settings(max_examples=30, deadline=None)
@given(st.lists(anything, max_size=20))
def test_duckdb_answers_the_reference_value(values):
    bands = exact.fold(values)
    con = duckdb.connect()
    con.register("b", pa.table({"value": pa.array(list(bands), pa.int32()),
                                "_total": pa.array([Decimal(v) for v in bands.values()],
                                                   pa.decimal128(38, 0))}))
    got = con.execute(f"SELECT {exact.value_sql('value', '_total')} FROM b").fetchone()[0]
    want = exact.value(bands)
    if want is None:
        assert got == 0.0  # no band: the finite sum of nothing (the answer checks the count)
    elif math.isnan(want):
        assert math.isnan(got)
    else:
        assert math.isclose(got, want, rel_tol=4e-16, abs_tol=0.0) or got == want, (values, got, want)

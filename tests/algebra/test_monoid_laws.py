"""The monoid laws, and the SQL forms of each monoid checked against its Python algebra.

For every monoid in :data:`incr.algebra.monoids.ALL`, with elements built by ``fold`` over
small bags of ints, floats (integers / 100 in [-1e6, 1e6]) and NULLs:

* identity: ``combine(identity, x) == x == combine(x, identity)``;
* associativity and commutativity of ``combine``;
* the inverse law ``diminish(combine(x, y), y) == x`` where the monoid has one, and
  :class:`~incr.algebra.monoids.NoInverse` where it has not (MIN, MAX);
* ``sql_combine`` / ``sql_diminish`` evaluated by DuckDB over a one-row target ``t`` and a
  one-row source ``s`` give ``combine`` / ``diminish`` (these strings are what the Delta
  MERGE runs, so this is what makes ⊗ and ⊗̃ equal their specification);
* ``spark_fold`` (h's aggregate expressions, which DuckDB understands too) over a bag equals
  ``fold`` of the bag.

Floats are compared with :func:`~incr.algebra.monoids.close`, with an absolute tolerance
scaled to the magnitudes involved (so that cancellation near zero is not mistaken for a
broken law).
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from incr.algebra.monoids import (
    ALL,
    Count,
    Element,
    Max,
    Min,
    Moments,
    Monoid,
    NoInverse,
    Sum,
    WideSum,
    close,
)

EXAMPLES = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
SQL_EXAMPLES = settings(max_examples=60, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])

REL = 1e-9

ints = st.integers(min_value=-1_000_000, max_value=1_000_000)
floats = st.integers(min_value=-100_000_000, max_value=100_000_000).map(lambda i: i / 100)
values = st.one_of(st.none(), ints, floats)
bags = st.lists(values, max_size=8)

MONOIDS = pytest.mark.parametrize("monoid", ALL, ids=lambda m: m.name)
INVERTIBLE = [m for m in ALL if m.has_inverse]


def elements(monoid: Monoid, n: int):
    """n elements of ``monoid``, each the fold of a random bag."""
    return st.tuples(*[bags.map(monoid.fold) for _ in range(n)])


def _magnitude(part: object) -> float:
    return abs(part) if isinstance(part, (int, float)) and part is not None else 0.0


def assert_close(actual: Element, expected: Element, *related: Element) -> None:
    """``close`` per part, the absolute tolerance scaled to the largest related magnitude."""
    assert len(actual) == len(expected), (actual, expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        scale = max([1.0, _magnitude(a), _magnitude(e)] + [_magnitude(r[i]) for r in related])
        assert close((a,), (e,), rel=REL, abs_=REL * scale), (
            f"part {i}: {actual} != {expected}")


# -- the laws -----------------------------------------------------------------------------


def test_all_lists_every_monoid():
    assert {type(m) for m in ALL} == {Count, Sum, Min, Max, Moments}
    assert [m.has_inverse for m in ALL] == [True, True, False, False, True]


@MONOIDS
def test_laws(monoid: Monoid):
    """Identity on both sides, associativity, commutativity, and fold(a ⊎ b) = fold(a) ⊕ fold(b)."""

    @EXAMPLES
    @given(bags, bags, bags)
    def check(a, b, c):
        x, y, z = monoid.fold(a), monoid.fold(b), monoid.fold(c)
        e = monoid.identity()
        assert_close(monoid.combine(e, x), x)
        assert_close(monoid.combine(x, e), x)
        assert_close(monoid.combine(monoid.combine(x, y), z),
                     monoid.combine(x, monoid.combine(y, z)), x, y, z)
        assert_close(monoid.combine(x, y), monoid.combine(y, x), x, y)
        # the homomorphism h relies on: a batch folds to the same element in any split
        assert_close(monoid.fold(a + b), monoid.combine(x, y), x, y)

    check()
    assert monoid.fold([]) == monoid.identity()


@pytest.mark.parametrize("monoid", INVERTIBLE, ids=lambda m: m.name)
def test_inverse(monoid: Monoid):
    @EXAMPLES
    @given(elements(monoid, 2))
    def check(xy):
        x, y = xy
        xy_ = monoid.combine(x, y)
        assert_close(monoid.diminish(xy_, y), x, y, xy_)
        assert_close(monoid.diminish(xy_, x), y, x, xy_)
        assert_close(monoid.diminish(x, x), monoid.identity(), x)

    check()


@pytest.mark.parametrize("monoid", [Min(), Max()], ids=lambda m: m.name)
def test_extrema_have_no_inverse(monoid: Monoid):
    assert not monoid.has_inverse
    with pytest.raises(NoInverse):
        monoid.diminish((3,), (1,))
    with pytest.raises(NoInverse):
        monoid.sql_diminish(["t.x"], ["s.x"])


def test_lift_and_null_handling():
    assert Count().fold([1, None, 2.5, None]) == (2,)
    assert Sum().fold([1, None, 2]) == (3,)
    assert Sum().fold([None, None]) == (0,)  # NULL-ness is decided from the companion count
    assert Min().fold([None, 3, -1.5, None]) == (-1.5,)
    assert Max().fold([None, 3, -1.5]) == (3,)
    assert Min().fold([None]) == (None,)
    assert Moments().fold([None]) == (0, 0.0, 0.0)
    n, mean, m2 = Moments().fold([1, 2, 3, 4, None])
    assert n == 4 and mean == pytest.approx(2.5) and m2 == pytest.approx(5.0)


def test_moments_stay_accurate_where_sum_of_squares_cancels():
    big = 1e9
    values = [big + 4, big + 7, big + 13, big + 16]
    n, _mean, m2 = Moments().fold(values)
    assert n == 4
    assert m2 / (n - 1) == pytest.approx(30.0, rel=1e-9)


# -- the SQL forms, run by DuckDB ---------------------------------------------------------

#: DuckDB type of each part's column.
PART_TYPES: dict[type, tuple[str, ...]] = {
    Count: ("BIGINT",),
    Sum: ("DOUBLE",),
    Min: ("DOUBLE",),
    Max: ("DOUBLE",),
    Moments: ("BIGINT", "DOUBLE", "DOUBLE"),
}


@pytest.fixture(scope="module")
def con():
    connection = duckdb.connect(":memory:")
    yield connection
    connection.close()


def _columns(monoid: Monoid) -> list[str]:
    return [f"c_{part}" if part else "c" for part in monoid.parts]


def _as_param(value: object, sql_type: str) -> object:
    if value is None:
        return None
    return float(value) if sql_type == "DOUBLE" else int(value)


def run_sql(con, monoid: Monoid, exprs: tuple[str, ...], t: Element, s: Element) -> Element:
    """Evaluates per-part SQL over one-row tables ``t`` and ``s`` holding the two elements."""
    cols, types = _columns(monoid), PART_TYPES[type(monoid)]
    assert len(exprs) == len(cols)

    def row(alias: str) -> str:
        return "(SELECT " + ", ".join(f"CAST(? AS {ty}) AS {c}" for c, ty in zip(cols, types)) \
            + f") AS {alias}"

    params = [_as_param(v, ty) for v, ty in zip(t, types)] + \
             [_as_param(v, ty) for v, ty in zip(s, types)]
    query = f"SELECT {', '.join(exprs)} FROM {row('t')} CROSS JOIN {row('s')}"
    result = con.execute(query, params).fetchone()
    assert result is not None
    return tuple(result)


def _refs(monoid: Monoid, alias: str) -> list[str]:
    return [f"{alias}.{c}" for c in _columns(monoid)]


@MONOIDS
def test_sql_combine_matches_combine(con, monoid: Monoid):
    exprs = monoid.sql_combine(_refs(monoid, "t"), _refs(monoid, "s"))

    @SQL_EXAMPLES
    @given(elements(monoid, 2))
    def check(xy):
        x, y = xy
        expected = monoid.combine(x, y)
        assert_close(run_sql(con, monoid, exprs, x, y), expected, x, y)

    check()


@pytest.mark.parametrize("monoid", INVERTIBLE, ids=lambda m: m.name)
def test_sql_diminish_matches_diminish(con, monoid: Monoid):
    exprs = monoid.sql_diminish(_refs(monoid, "t"), _refs(monoid, "s"))

    @SQL_EXAMPLES
    @given(elements(monoid, 2))
    def check(xy):
        x, y = xy
        target = monoid.combine(x, y)  # a delete only removes what is there: y ⊑ target
        expected = monoid.diminish(target, y)
        assert_close(run_sql(con, monoid, exprs, target, y), expected, x, y, target)
        assert_close(expected, x, y, target)

    check()


@pytest.mark.parametrize("monoid", INVERTIBLE, ids=lambda m: m.name)
def test_sql_diminish_of_small_known_values(con, monoid: Monoid):
    """A hand-checked case, so a wrong formula fails with a readable diff."""
    x, y = monoid.fold([1, 2, None]), monoid.fold([3])
    target = monoid.combine(x, y)
    got = run_sql(con, monoid, monoid.sql_diminish(_refs(monoid, "t"), _refs(monoid, "s")),
                  target, y)
    assert_close(got, x, target)


@MONOIDS
def test_spark_fold_matches_fold(con, monoid: Monoid):
    """h's aggregate expressions over a bag equal ``fold`` (DuckDB speaks the same SQL here)."""
    exprs = monoid.spark_fold("x")

    @SQL_EXAMPLES
    @given(bags)
    def check(bag):
        params = [None if v is None else float(v) for v in bag]
        got = con.execute(f"SELECT {', '.join(exprs)} FROM (SELECT UNNEST(CAST(? AS DOUBLE[])) AS x)",
                          [params]).fetchone()
        assert_close(tuple(got), monoid.fold(bag), monoid.fold(bag))

    check()


@pytest.mark.parametrize("monoid", [m for m in ALL if m.sql_regroup], ids=lambda m: m.name)
def test_sql_regroup_is_combine_over_rows(con, monoid: Monoid):
    """``sql_regroup`` over the rows of several elements is their ⊗ (a finer grouping's state
    rows rolled up into a coarser group's, as the share pass's BRR reads them)."""
    (column,) = _columns(monoid)
    (sql_type,) = PART_TYPES[type(monoid)]

    @SQL_EXAMPLES
    @given(st.integers(1, 4).flatmap(lambda n: elements(monoid, n)))
    def check(parts):
        expected = monoid.identity()
        for p in parts:
            expected = monoid.combine(expected, p)
        params = [_as_param(p[0], sql_type) for p in parts]
        got = con.execute(f"SELECT {monoid.sql_regroup}({column}) FROM (SELECT UNNEST("
                          f"CAST(? AS {sql_type}[])) AS {column})", [params]).fetchone()
        if got[0] is None and expected[0] is not None:  # SUM of no row: the identity
            got = monoid.identity()
        assert_close(tuple(got), expected, parts)

    check()


def test_moments_do_not_regroup_by_one_aggregate():
    """Moments combine by Chan's formulas, not by one SQL aggregate: a view needing them is
    not rolled up from a finer state."""
    assert Moments().sql_regroup is None


def test_wide_sum_folds_integers_past_bigint_exactly(con):
    """A BIGINT state would wrap past ±9.2e18; WideSum's fold and merges stay exact."""
    big = 2 ** 62
    wide = WideSum()
    (fold,) = wide.spark_fold("v")
    rows = f"(VALUES ({big}), ({big}), ({big}), (NULL)) AS t(v)"
    total = con.execute(f"SELECT {fold} FROM {rows}").fetchone()[0]
    assert total == 3 * big == wide.fold([big, big, big, None])[0]
    (combined,) = wide.sql_combine(("t.c",), ("s.c",))
    (diminished,) = wide.sql_diminish(("t.c",), ("s.c",))
    row = con.execute(f"SELECT {combined}, {diminished} "
                      f"FROM (SELECT CAST({3 * big} AS DECIMAL(38,0)) AS c) t, "
                      f"(SELECT CAST({2 * big} AS DECIMAL(38,0)) AS c) s").fetchone()
    assert row == (5 * big, big)

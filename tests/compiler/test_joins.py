"""Equi-joins in the compiler: the joined source, side tables, and the joins it refuses."""

from __future__ import annotations

import pytest

from incr.compiler import compile_text
from incr.errors import CompileError, NotIncrementalizableError

TABLES = """CREATE TABLE orders (okey BIGINT, cust VARCHAR);
CREATE TABLE items (okey BIGINT, price DOUBLE, qty BIGINT);
CREATE TABLE custs (cust VARCHAR, nation VARCHAR);
"""


def plan_of(select: str):
    return compile_text(TABLES + f"CREATE VIEW v AS\n{select};\n", path="j.sql").plans[0]


def test_join_view_keeps_a_side_table_per_input_bucketed_by_its_join_key():
    plan = plan_of("SELECT o.cust, SUM(i.price) AS s FROM orders o JOIN items i ON o.okey = i.okey "
                   "AND i.qty > 0 GROUP BY o.cust")
    assert plan.sources == ("orders", "items")
    assert [t.name for t in plan.tables] == ["main", "side_o", "side_i"]
    side_o, side_i = plan.table("side_o"), plan.table("side_i")
    assert side_o.key_columns == ("o__okey", "o__cust")  # only the columns the view reads
    assert side_i.key_columns == ("i__okey", "i__price", "i__qty")
    assert side_o.bucket_columns == ("o__okey",) and side_i.bucket_columns == ("i__okey",)
    assert [t.name for t in plan.main_tables] == ["main"]
    assert [t.name for t in plan.side_tables("items")] == ["side_i"]
    sql = plan.join_delta_sql("orders", "delta", {"i": "side_i_view"})
    assert "FROM (SELECT `okey` AS `o__okey`, `cust` AS `o__cust` FROM delta) AS `o`" in sql
    assert "JOIN (SELECT * FROM side_i_view WHERE `_n` > 0) AS `i`" in sql
    assert "explode(sequence(CAST(1 AS BIGINT), `i`.`_n`))" in sql
    # The ON filter on one input is a filter of the joined rows (an inner join).
    assert "i__qty > 0" in str(plan.h[0].where)


def test_three_way_join_joins_every_input_through_an_equality():
    plan = plan_of("SELECT c.nation, COUNT(*) AS n FROM items i JOIN orders o ON i.okey = o.okey "
                   "JOIN custs c ON o.cust = c.cust GROUP BY c.nation")
    sql = plan.join_delta_sql("custs", "delta", {"o": "so", "i": "si"})
    # custs joins orders first (the only input it shares a key with), then items.
    assert sql.index("AS `o` ON") < sql.index("AS `i` ON")
    assert "`o`.`_n` * `i`.`_n`" in sql


def test_plain_join_view_is_a_bag_of_joined_rows():
    plan = plan_of("SELECT o.cust, i.price FROM orders o JOIN items i ON o.okey = i.okey")
    assert plan.answer.explode is not None
    assert plan.output == ("cust", "price")


@pytest.mark.parametrize("select, fragment", [
    ("SELECT o.cust FROM orders o JOIN items i ON o.okey < i.okey", "non-equi join"),
    ("SELECT o.cust FROM orders o LEFT JOIN items i ON o.okey = i.okey", "LEFT OUTER JOIN"),
    ("SELECT o.cust FROM orders o CROSS JOIN items i", "cross or non-equi join"),
    ("SELECT o.cust FROM orders o JOIN items i USING (okey)", "USING"),
    ("SELECT o.cust FROM orders o JOIN orders p ON o.okey = p.okey", "self-join"),
    ("SELECT o.cust FROM orders o JOIN (SELECT * FROM items) i ON o.okey = i.okey", "subquery"),
])
def test_refused_joins_name_the_construct(select, fragment):
    with pytest.raises(NotIncrementalizableError) as info:
        plan_of(select)
    assert fragment in info.value.message
    assert info.value.location.line >= 4


@pytest.mark.parametrize("select, fragment", [
    ("SELECT okey FROM orders o JOIN items i ON o.okey = i.okey", "ambiguous"),
    ("SELECT * FROM orders o JOIN items i ON o.okey = i.okey", "SELECT *"),
    ("SELECT o.nope FROM orders o JOIN items i ON o.okey = i.okey", "unknown column nope"),
    ("SELECT z.cust FROM orders o JOIN items i ON o.okey = i.okey", "unknown table or alias z"),
])
def test_join_name_errors(select, fragment):
    with pytest.raises(CompileError) as info:
        plan_of(select)
    assert fragment in info.value.message

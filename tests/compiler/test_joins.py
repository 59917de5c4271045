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
    assert [t.name for t in plan.tables] == ["main", "exact0", "side_o", "side_i"]  # price: DOUBLE
    side_o, side_i = plan.table("side_o"), plan.table("side_i")
    assert side_o.key_columns == ("o__okey", "o__cust")  # only the columns the view reads
    assert side_i.key_columns == ("i__okey", "i__price", "i__qty")
    assert side_o.bucket_columns == ("o__okey",) and side_i.bucket_columns == ("i__okey",)
    assert [t.name for t in plan.main_tables] == ["main", "exact0"]
    assert [t.name for t in plan.side_tables("items")] == ["side_i"]
    sql = plan.join_delta_sql("orders", "delta", {"i": "side_i_view"})
    assert "FROM (SELECT `okey` AS `o__okey`, `cust` AS `o__cust`, `_w` FROM delta) AS `o`" in sql
    assert "JOIN (SELECT * FROM side_i_view) AS `i` ON `o`.`o__okey` = `i`.`i__okey`" in sql
    # Each joined row carries the product of the multiplicities: the batch's sign times the count.
    assert "CAST(`o`.`_w` * `i`.`_n` AS BIGINT) AS `_w`" in sql
    # The ON filter on one input is a filter of the joined rows (an inner join).
    assert "i__qty > 0" in str(plan.h[0].where)


def test_three_way_join_joins_every_input_through_an_equality():
    plan = plan_of("SELECT c.nation, COUNT(*) AS n FROM items i JOIN orders o ON i.okey = o.okey "
                   "JOIN custs c ON o.cust = c.cust GROUP BY c.nation")
    sql = plan.join_delta_sql("custs", "delta", {"o": "so", "i": "si"})
    # custs joins orders first (the only input it shares a key with), then items.
    assert sql.index("AS `o` ON") < sql.index("AS `i` ON")
    assert "`c`.`_w` * `o`.`_n` * `i`.`_n`" in sql


def test_plain_join_view_is_a_bag_of_joined_rows():
    plan = plan_of("SELECT o.cust, i.price FROM orders o JOIN items i ON o.okey = i.okey")
    assert plan.answer.explode is not None
    assert plan.output == ("cust", "price")


def test_cross_and_band_joins_cross_the_side_without_a_key():
    """No equality between the inputs: Δ of one crosses the other's whole side table and the
    band condition filters the joined rows before h."""
    plan = plan_of("SELECT o.cust, COUNT(*) AS n FROM orders o JOIN items i "
                   "ON i.price >= o.okey AND i.price < o.okey + 10 GROUP BY o.cust")
    assert plan.top.branches[0].join.pairs == ()
    assert plan.table("side_i").bucket_columns == ()
    sql = plan.join_delta_sql("orders", "delta", {"o": "so", "i": "si"})
    assert "CROSS JOIN (SELECT * FROM si) AS `i`" in sql
    assert "i__price >= o__okey" in plan.h_sql("main", "joined")
    crossed = plan_of("SELECT o.cust, i.qty FROM orders o CROSS JOIN items i")
    assert crossed.sources == ("orders", "items")


@pytest.mark.parametrize("select, fragment", [
    ("SELECT o.cust FROM orders o LEFT JOIN items i ON o.okey < i.okey",
     "LEFT JOIN condition o.okey < i.okey"),
    ("SELECT o.cust FROM orders o LEFT JOIN items i ON o.okey = i.okey AND o.cust > i.okey",
     "LEFT JOIN condition"),
    ("SELECT o.cust FROM orders o NATURAL JOIN items i", "NATURAL JOIN"),
    (("SELECT o.cust FROM orders o JOIN custs c ON o.cust = c.cust FULL JOIN items i "
      "ON o.okey = i.okey"), "FULL JOIN after other joins"),
    (("SELECT o.cust FROM orders o WHERE o.okey NOT IN (SELECT i.okey FROM items i "
      "WHERE i.qty > o.okey)"), "NOT IN (subquery)"),
    ("SELECT o.cust FROM orders o JOIN (SELECT okey FROM items LIMIT 3) i ON o.okey = i.okey",
     "LIMIT/OFFSET in a nested query"),
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


def test_self_join_keeps_a_side_table_per_alias():
    plan = plan_of("SELECT o.cust, COUNT(*) AS n FROM orders o JOIN orders p ON o.okey = p.okey "
                   "GROUP BY o.cust")
    assert plan.sources == ("orders",)
    assert [t.name for t in plan.tables] == ["main", "side_o", "side_p"]
    # A batch of orders changes both aliases: ΔO ⋈ P, then O' ⋈ ΔP with O' = O + ΔO.
    sql = plan.join_delta_sql("orders", "delta", {"o": "so", "p": "sp"})
    assert _terms(sql) == 2
    assert sql.count("FROM delta") == 3  # ΔO, ΔP, and ΔO again inside O'
    assert "FROM so\nUNION ALL\n" in sql and "FROM sp\nUNION ALL\n" not in sql
    # O' is summed per row, so a replaced row does not travel beside its replacement.
    assert "GROUP BY `o__okey`, `o__cust` HAVING sum(`_n`) <> 0" in sql


def _terms(delta_sql: str) -> int:
    """The joins Δ's SQL is the sum of (each computes its weight once)."""
    return delta_sql.count("AS BIGINT) AS `_w`\nFROM")


@pytest.mark.parametrize("k", [2, 5, 15])
def test_a_source_read_k_times_changes_the_join_by_k_terms_not_two_to_the_k(k):
    """A cross product of k global aggregates over one fact table (TPC-DS Q88's row of counts):
    a batch of the table changes all k inputs of the top stage at once."""
    from incr.compiler.queries import delta_sign, render_stage_delta

    parts = ", ".join(f"(SELECT SUM(price) AS s{i} FROM items WHERE qty > {i}) p{i}"
                      for i in range(k))
    top = plan_of(f"SELECT * FROM {parts}").top
    assert [i.derived for i in top.inputs] == [True] * k
    changed = {i.alias: (f"d_{i.alias}", 1) for i in top.inputs}
    sql = render_stage_delta(top, changed, {i.alias: f"side_{i.alias}" for i in top.inputs})
    assert _terms(sql) == k
    assert delta_sign(top, changed) == 1
    changed = {a: (v, -1) for a, (v, _) in changed.items()}
    assert delta_sign(top, changed) == -1  # later terms read p0's new rows: still counts
    changed["p0"] = ("d_p0", 1)
    assert delta_sign(top, changed) == 0


def test_an_anti_input_changing_with_others_keeps_one_term_per_subset():
    plan = plan_of("SELECT o.cust FROM orders o WHERE NOT EXISTS "
                   "(SELECT 1 FROM orders p WHERE p.okey = o.okey AND p.cust <> 'x')")
    from incr.compiler.queries import render_stage_delta

    top = plan.top
    anti = next(a.input.alias for b in top.branches for a in b.join.anti)
    changed = {i.alias: ("delta", 0) for i in top.inputs}
    sql = render_stage_delta(top, changed, {i.alias: f"side_{i.alias}" for i in top.inputs},
                             {anti: "dz"})
    assert _terms(sql) == 3  # ΔO ⋈̸ Z, O ⋈ ΔZ, ΔO ⋈ ΔZ
    assert "FROM side_o\nUNION ALL" not in sql  # no input read at its new rows


def test_left_join_is_a_matched_and_an_unmatched_branch():
    plan = plan_of("SELECT o.cust, COUNT(i.price) AS n FROM orders o LEFT JOIN items i "
                   "ON o.okey = i.okey AND i.qty > 0 GROUP BY o.cust")
    matched, unmatched = plan.top.branches
    assert [i.alias for i in matched.join.inputs] == ["o", "i"]
    assert [i.alias for i in unmatched.join.inputs] == ["o"]
    anti, = unmatched.join.anti
    assert anti.input.alias == "i" and anti.pairs == (("o__okey", "i__okey"),)
    assert str(anti.filter) == "i__qty > 0"
    assert [i.alias for i in unmatched.padded] == ["i"]
    assert not plan.append_only  # a match arriving retracts a padded row


def test_where_that_rejects_nulls_turns_a_left_join_inner():
    plan = plan_of("SELECT o.cust FROM orders o LEFT JOIN items i ON o.okey = i.okey "
                   "WHERE i.price > 2")
    assert len(plan.top.branches) == 1 and not plan.top.branches[0].join.anti


def test_not_exists_keeps_only_the_unmatched_branch():
    plan = plan_of("SELECT o.cust FROM orders o WHERE NOT EXISTS "
                   "(SELECT * FROM items i WHERE i.okey = o.okey)")
    inner, top = plan.stages
    assert inner.name == "s1" and inner.output == ("okey",)
    branch, = top.branches
    assert not any(i.derived for i in branch.join.inputs)
    assert branch.join.anti[0].input.derived


def test_left_join_condition_on_the_preserved_side_pads_the_rows_failing_it():
    plan = plan_of("SELECT o.cust, i.qty FROM orders o LEFT JOIN items i "
                   "ON o.okey = i.okey AND o.cust = 'x'")
    matched, unmatched, excluded = plan.top.branches
    assert "'x'" in matched.where.sql and not matched.padded
    assert unmatched.join.anti and unmatched.padded
    assert not excluded.join.anti and excluded.padded
    assert "COALESCE" in excluded.where.sql.upper() and "NOT" in excluded.where.sql.upper()


def test_not_in_is_an_anti_join_guarded_by_the_null_and_empty_counts():
    """x NOT IN (S): no match, and S empty or (x not NULL and no NULL in S)."""
    plan = plan_of("SELECT o.cust FROM orders o WHERE o.okey NOT IN (SELECT okey FROM items)")
    top = plan.stages[-1]
    branch, = top.branches
    assert len(branch.join.anti) == 1 and branch.join.anti[0].input.derived
    crossed = [i for i in branch.join.inputs if i.derived]
    assert len(crossed) == 2  # the one-row counts: all rows of S, and its NULLs
    where = branch.where.sql if branch.where is not None else ""
    assert "IS NULL" in where.upper() and " OR " in where.upper()


def test_correlated_subquery_is_a_stage_joined_on_the_correlation():
    plan = plan_of("SELECT o.cust FROM orders o WHERE o.okey > "
                   "(SELECT SUM(i.qty) FROM items i WHERE i.okey = o.okey)")
    inner, top = plan.stages
    assert [t.name for t in inner.tables] == ["s1_main"]
    assert plan.consumers("s1") == (top,)
    branch, = top.branches
    assert [i.derived for i in branch.join.inputs] == [False, True]
    assert len(branch.join.pairs) == 1

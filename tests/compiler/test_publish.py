"""Which answers the compiler lets follow by change, and the reason it gives for the rest."""

from __future__ import annotations

import pytest

from incr.compiler import compile_text
from incr.compiler.explain import explain_plan

TABLE = "CREATE TABLE t (k VARCHAR, g BIGINT, v BIGINT);\n"

CASES = [
    ("SELECT k, SUM(v) AS s FROM t GROUP BY k", ("k",), None),
    ("SELECT g AS gg, k, COUNT(*) AS n FROM t GROUP BY k, g HAVING SUM(v) > 1", ("k", "gg"), None),
    ("SELECT DISTINCT k, g FROM t", ("k", "g"), None),
    ("SELECT k, v FROM t WHERE v > 2", ("k", "v"), None),
    ("SELECT k, MIN(v) AS lo, COUNT(DISTINCT g) AS dg FROM t GROUP BY k", ("k",), None),
    ("SELECT SUM(v) AS s FROM t GROUP BY k", None, "group key k is not an output column"),
    ("SELECT upper(k) AS u, SUM(v) AS s FROM t GROUP BY k", None, "not an output column"),
    ("SELECT COUNT(*) AS n FROM t", None, "global aggregate"),
    ("SELECT k, v FROM t ORDER BY v LIMIT 3", None, "bag of rows"),
    ("SELECT k, SUM(v) AS s FROM t GROUP BY k ORDER BY s DESC LIMIT 3 OFFSET 1", None, "OFFSET"),
    ("SELECT k, SUM(v) AS s FROM t GROUP BY k ORDER BY SUM(g) LIMIT 3", None, "not an output"),
    ("SELECT k, SUM(v) AS s FROM t GROUP BY k ORDER BY k", None, "ORDER BY"),
]


@pytest.mark.parametrize(("select", "columns", "why"), CASES, ids=[c[0] for c in CASES])
def test_publish_mode(select, columns, why):
    plan = compile_text(f"{TABLE}CREATE VIEW w AS {select};", path="w.sql", name="w").plans[0]
    text = explain_plan(plan)
    if columns is None:
        assert not plan.publish.by_change and why in plan.publish.reason
        assert "publish: rewritten" in text and why in text
    else:
        assert plan.publish.by_change and plan.publish.columns == columns
        assert "publish: by change" in text and "_incr_gone" in text


def test_keys_are_found_by_expression_group_keys_too():
    plan = compile_text(f"{TABLE}CREATE VIEW w AS SELECT g % 2 AS parity, COUNT(*) AS n FROM t "
                        f"GROUP BY g % 2;", path="w.sql", name="w").plans[0]
    assert plan.publish.by_change and plan.publish.columns == ("parity",)


def test_a_top_k_keeps_its_order_over_answer_columns():
    plan = compile_text(f"{TABLE}CREATE VIEW w AS SELECT k, SUM(v) AS s FROM t GROUP BY k "
                        f"ORDER BY s DESC, k LIMIT 3;", path="w.sql", name="w").plans[0]
    publish = plan.publish
    assert publish.top and not publish.by_change and publish.columns == ("k",)
    assert [(o.expr.sql, o.descending) for o in publish.order] == [("s", True), ("k", False)]
    check = plan.top_check_sql("new", "old")
    assert "LEFT SEMI JOIN old AS o" in check and "coalesce(o.`s` > r.`s`, false)" in check
    assert "publish: top-k by change" in explain_plan(plan)

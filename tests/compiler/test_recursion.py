"""Compiling WITH RECURSIVE views: what is accepted, what is refused and why, and explain."""

from __future__ import annotations

import pytest

from incr.compiler import compile_text
from incr.compiler.explain import explain_program
from incr.errors import NotIncrementalizableError

TABLES = "CREATE TABLE links (src BIGINT, dst BIGINT, cost DECIMAL(10,2));\n"


def _view(cte: str, query: str = "SELECT * FROM r") -> str:
    return TABLES + f"CREATE VIEW v AS WITH RECURSIVE r (src, dst) AS ({cte}) {query};\n"


STEP = "SELECT r.src, l.dst FROM r JOIN links l ON r.dst = l.src"


def test_the_cte_becomes_a_source_of_the_query_and_its_branches_read_slots():
    plan = compile_text(_view(f"SELECT src, dst FROM links UNION {STEP}",
                              "SELECT src, COUNT(*) AS n FROM r GROUP BY src")).plans[0]
    rec = plan.recursion
    assert rec is not None and rec.name == "r" and rec.sources == ("links",)
    assert [c.name for c in rec.columns] == ["src", "dst"]
    assert [str(c.type) for c in rec.columns] == ["BIGINT", "BIGINT"]
    assert [b.reads for b in rec.base] == [("links",)]
    assert [b.reads for b in rec.step] == [("r", "links")]
    assert plan.sources == ("links",)  # the view's batches are the links', not r's


def test_column_types_come_from_the_first_branch():
    text = TABLES + ("CREATE VIEW v AS WITH RECURSIVE p AS (SELECT src, dst, cost, 1 AS hops "
                     "FROM links UNION SELECT p.src, l.dst, p.cost + l.cost, p.hops + 1 FROM p "
                     "JOIN links l ON p.dst = l.src WHERE p.hops < 3) SELECT * FROM p;\n")
    rec = compile_text(text).plans[0].recursion
    assert [(c.name, str(c.type)) for c in rec.columns] == [
        ("src", "BIGINT"), ("dst", "BIGINT"), ("cost", "DECIMAL(10,2)"), ("hops", "INTEGER")]


def test_a_with_recursive_that_reads_no_cte_recursively_is_an_ordinary_query():
    text = TABLES + "CREATE VIEW v AS WITH RECURSIVE c AS (SELECT src FROM links) SELECT src FROM c;"
    assert compile_text(text).plans[0].recursion is None


@pytest.mark.parametrize("cte, query, says", [
    (f"SELECT src, dst FROM links UNION ALL {STEP}", "SELECT * FROM r", "write UNION"),
    (("SELECT src, dst FROM links UNION SELECT a.src, b.dst FROM r a JOIN r b ON a.dst = b.src"),
     "SELECT * FROM r", "only linear recursion"),
    (STEP, "SELECT * FROM r", "starts the recursion"),
    (("SELECT src, dst FROM links UNION SELECT r.src, MAX(l.dst) FROM r JOIN links l "
      "ON r.dst = l.src GROUP BY r.src"), "SELECT * FROM r", "GROUP inside a branch"),
    (("SELECT src, dst FROM links UNION SELECT r.src, l.dst FROM r LEFT JOIN links l "
      "ON r.dst = l.src"), "SELECT * FROM r", "only inner joins are monotone"),
    (("SELECT src, dst FROM links UNION SELECT r.src, r.dst FROM r WHERE NOT EXISTS "
      "(SELECT * FROM links l WHERE l.src = r.dst)"), "SELECT * FROM r", "not monotone"),
    (f"SELECT src, dst FROM links UNION {STEP}", "SELECT * FROM r, x", None),
])
def test_what_dred_cannot_keep_exact_is_refused_with_the_reason(cte, query, says):
    text = _view(cte, query)
    if says is None:  # a second, non-recursive CTE
        text = TABLES + (f"CREATE VIEW v AS WITH RECURSIVE r (src, dst) AS ({cte}), x AS "
                         f"(SELECT 1 AS one) SELECT * FROM r, x;\n")
        says = "exactly one CTE"
    with pytest.raises(NotIncrementalizableError, match=says) as e:
        compile_text(text, path="rec.sql")
    assert "rec.sql:2" in str(e.value) and "view v: WITH RECURSIVE" in str(e.value)


def test_explain_names_the_method_and_shows_a_round():
    text = explain_program(compile_text(_view(f"SELECT src, dst FROM links UNION {STEP}")))
    assert "recursive r(src BIGINT, dst BIGINT)" in text
    assert "semi-naive" in text and "delete and rederive (DRed) with rank support" in text
    assert "FROM Δr AS r JOIN links AS l" in text


def test_a_branch_carries_its_rank_and_can_derive_given_tuples_only():
    """The step's rank is r's + 1, the base's 0; targeted at a table of tuples, each branch
    joins it on the columns it copies (r.src to src, l.dst to dst; a bare column of a
    one-table branch is qualified first, so the target's columns cannot make it ambiguous)."""
    from incr.compiler.recursion import fill

    rec = compile_text(_view(f"SELECT src, dst FROM links UNION {STEP}")).plan("v").recursion
    base, step = rec.base[0], rec.step[0]
    assert "CAST(0 AS BIGINT) AS _rank" in base.sql and "CAST(r._rank + 1 AS BIGINT)" in step.sql
    assert step.copies == ((0, "src", "src"), (1, "dst", "dst"))
    tables = {"links": "L", "r": "R"}
    assert fill(step, {}, tables, target="T").endswith(
        "JOIN T AS incr_k ON r.src IS NOT DISTINCT FROM incr_k.src AND l.dst IS NOT DISTINCT FROM incr_k.dst")
    assert "FROM L AS links JOIN T AS incr_k ON links.src IS NOT DISTINCT FROM incr_k.src" in \
        fill(base, {}, tables, target="T")
    assert fill(step, {}, tables) == fill(step, {}, tables, target=None)
    bare = compile_text(_view(f"SELECT src, dst FROM links UNION {STEP} WHERE cost > 0")
                        ).plan("v").recursion.step[0]
    assert bare.targeted is None  # a bare column among two tables: derived in full instead


def _paths(step_where: str, query: str, step_cost: str = "p.cost + l.cost") -> str:
    return TABLES + (f"CREATE VIEW v AS WITH RECURSIVE p (src, dst, cost, hops) AS ("
                     f"SELECT src, dst, cost, 1 FROM links UNION SELECT p.src, l.dst, "
                     f"{step_cost}, p.hops + 1 FROM p JOIN links l ON p.dst = l.src "
                     f"{step_where}) {query};\n")


@pytest.mark.parametrize("where, query, group, order", [
    ("WHERE p.hops < 5", "SELECT src, dst, MIN(cost), MIN(hops) FROM p GROUP BY src, dst",
     ("src", "dst"), (("cost", True), ("hops", True))),
    # hops only bounds and groups: the cheapest path of each length is kept
    ("WHERE p.hops <= 4", "SELECT src, MIN(cost) AS c FROM p WHERE src <> dst GROUP BY src",
     ("src", "dst", "hops"), (("cost", True),)),
    ("WHERE 5 > p.hops AND l.cost > 0", "SELECT src, dst, MAX(cost) FROM p GROUP BY src, dst",
     ("src", "dst", "hops"), (("cost", False),)),
])
def test_aggregate_selection_is_found_with_its_groups_and_order(where, query, group, order):
    rec = compile_text(_paths(where, query)).plans[0].recursion
    assert rec.selection is not None, rec.unselected
    assert (rec.selection.group, rec.selection.order) == (group, order)
    # a rederivation reads the groups it lost only: joined on the group columns it copies
    assert "incr_k.src" in rec.step[0].grouped and "incr_k.dst" in rec.step[0].grouped
    assert "incr_k.cost" not in rec.step[0].grouped


@pytest.mark.parametrize("where, query, cost, says", [
    ("WHERE p.hops < 5", "SELECT src, dst, MIN(cost), COUNT(*) FROM p GROUP BY src, dst",
     "p.cost + l.cost", "COUNT(*)"),
    ("WHERE p.hops > 2 AND p.hops < 5", "SELECT src, dst, MIN(hops) FROM p GROUP BY src, dst",
     "p.cost + l.cost", "p.hops > 2"),
    ("WHERE p.hops < 5", "SELECT src, dst, MIN(cost) FROM p GROUP BY src, dst",
     "l.cost - p.cost", "a better tuple"),
    ("WHERE p.hops < 5", "SELECT src, dst, MIN(cost), MAX(cost) FROM p GROUP BY src, dst",
     "p.cost + l.cost", "both MIN and MAX of cost"),
    ("WHERE p.hops < 5", "SELECT src, MIN(cost) FROM p WHERE cost > 1 GROUP BY src",
     "p.cost + l.cost", "cost is read outside MIN/MAX"),
    ("WHERE p.hops < 5 AND p.cost <> 3", "SELECT src, dst, MIN(cost) FROM p GROUP BY src, dst",
     "p.cost + l.cost", "p.cost <> 3"),
])
def test_no_aggregate_selection_where_a_beaten_tuple_could_matter(where, query, cost, says):
    rec = compile_text(_paths(where, query, cost)).plans[0].recursion
    assert rec.selection is None and says in rec.unselected, rec.unselected
    assert "no aggregate selection" in explain_program(compile_text(_paths(where, query, cost)))


@pytest.mark.parametrize("step, partition, keys", [
    (STEP, "src", ((1, "src", "dst"),)),  # r.src carried; r.dst = l.src finds what a link joins
    ("SELECT l.src, r.dst FROM links l JOIN r ON l.dst = r.src", "dst", ((0, "dst", "src"),)),
    ("SELECT r.src, l.dst FROM r, links l WHERE (l.src = r.dst) AND l.cost > 0", "src",
     ((1, "src", "dst"),)),
])
def test_r_falls_apart_by_a_column_every_step_carries(step, partition, keys):
    """The partition column, and the equalities by which a changed link finds the r tuples
    a step joins it with: a batch of links reads the parts of R those reach."""
    from incr.compiler.recursion import reach_keys

    rec = compile_text(_view(f"SELECT src, dst FROM links UNION {step}")).plans[0].recursion
    assert rec.partition == partition, rec.unpartitioned
    assert rec.step[0].keys == keys
    assert reach_keys(rec, "links") == tuple((c, o) for _, c, o in keys)
    assert f"R falls apart by {partition}" in explain_program(
        compile_text(_view(f"SELECT src, dst FROM links UNION {step}")))


@pytest.mark.parametrize("text, says", [
    (_view("SELECT src, dst FROM links UNION SELECT r.dst, l.dst FROM r JOIN links l "
           "ON r.src = l.src"), "no column of r is copied unchanged"),
    (_paths("WHERE p.hops < 5", "SELECT dst, MIN(src) AS s FROM p GROUP BY dst"),
     "compares tuples across values of src"),
])
def test_r_is_read_whole_where_a_change_can_reach_any_part(text, says):
    rec = compile_text(text).plans[0].recursion
    assert rec.partition is None and says in rec.unpartitioned
    assert f"the whole of R ({rec.unpartitioned})" in explain_program(compile_text(text))


def test_a_source_a_step_joins_to_no_column_of_r_reads_r_whole():
    """links read twice in the step: its second occurrence joins the first, not r, so a
    changed link may extend any path; active is joined to r, so it narrows."""
    from incr.compiler.recursion import reach_keys

    text = TABLES + ("CREATE TABLE active (node BIGINT);\nCREATE VIEW v AS WITH RECURSIVE r "
                     "(src, dst) AS (SELECT src, dst FROM links UNION SELECT r.src, m.dst FROM "
                     "r JOIN active a ON a.node = r.dst JOIN links l ON r.dst = l.src "
                     "JOIN links m ON l.dst = m.src) SELECT * FROM r;\n")
    rec = compile_text(text).plans[0].recursion
    assert rec.partition == "src"
    assert reach_keys(rec, "links") is None and reach_keys(rec, "active") == (("node", "dst"),)
    assert "a batch of links reads the whole of R" in explain_program(compile_text(text))

"""Which side-table rows a change can meet (StagePlan.side_matches): a superset, or None."""

from __future__ import annotations

import pytest

from incr.compiler import compile_text

TABLES = ("CREATE TABLE a (k BIGINT, x BIGINT);\nCREATE TABLE b (k BIGINT, y BIGINT);\n"
          "CREATE TABLE c (y BIGINT, z BIGINT);\n")


def _stage(select: str):
    plan = compile_text(f"{TABLES}CREATE VIEW w AS {select};", path="w.sql", name="w").plans[0]
    return plan.top


def _matches(select: str, alias: str, changed: tuple[str, ...]):
    found = _stage(select).side_matches(alias, changed)
    return None if found is None else {(m.side_column, m.changed, m.column) for m in found}


TWO = "SELECT a.k, SUM(b.y) AS s FROM a JOIN b ON a.k = b.k GROUP BY a.k"
CHAIN = ("SELECT a.k, SUM(c.z) AS s FROM a JOIN b ON a.k = b.k JOIN c ON b.y = c.y "
         "GROUP BY a.k")
SELF = "SELECT p.k, COUNT(*) AS n FROM a p JOIN a q ON p.x = q.k GROUP BY p.k"
ANTI = ("SELECT a.k, COUNT(*) AS n FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k) "
        "GROUP BY a.k")


@pytest.mark.parametrize(("select", "alias", "changed", "expected"), [
    # b's rows meet a change of a only where b.k is one of the change's a.k
    (TWO, "b", ("a",), {("b__k", "a", "k")}),
    (TWO, "a", ("b",), {("a__k", "b", "k")}),
    # a changed alone: no term reads its own side table
    (TWO, "a", ("a",), set()),
    # both changed (a step of batches of both): b's side is read only in the term of Δa
    # (Δa joined with old b), so it is bounded by Δa's keys all the same
    (TWO, "b", ("a", "b"), {("b__k", "a", "k")}),
    (TWO, "a", ("a", "b"), {("a__k", "b", "k")}),
    # c is joined to b, not to the changed a: a change of a reaches c only through b's rows
    (CHAIN, "c", ("a",), None),
    (CHAIN, "b", ("a",), {("b__k", "a", "k")}),
    (CHAIN, "b", ("c",), {("b__y", "c", "y")}),
    (CHAIN, "b", ("a", "c"), {("b__k", "a", "k"), ("b__y", "c", "y")}),
    # a changed beside c: the term of Δc reads a's side through b's rows, unbounded
    (CHAIN, "a", ("a", "c"), None),
    # a self-join: both aliases read the same source, so a batch changes both; q's side is
    # read in the term of Δp (p.x = q.k), p's in the term of Δq
    (SELF, "q", ("p", "q"), {("q__k", "p", "x")}),
    (SELF, "p", ("p", "q"), {("p__x", "q", "k")}),
    # an anti input's side answers "no match": never cut (NOT EXISTS reads b's keys
    # through a stage of its own, the anti input _u_0 of the top stage)
    (ANTI, "_u_0", ("a",), None),
    (ANTI, "a", ("a",), set()),
    (ANTI, "a", ("_u_0",), None),
])
def test_side_matches(select, alias, changed, expected):
    assert _matches(select, alias, changed) == expected

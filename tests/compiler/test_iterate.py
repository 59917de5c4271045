"""Iterative views in the compiler: the syntax, the step compiled as a view, the refusals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from incr.compiler import compile_program, compile_text
from incr.compiler.explain import explain_program
from incr.compiler.iterate import ITERATE_ARRAY, same_row_sql
from incr.errors import CompileError, NotIncrementalizableError, ParseError

REPO = Path(__file__).resolve().parents[2]
POINTS = "-- incr: append_only = points\nCREATE TABLE points (x DOUBLE, y DOUBLE);\n"
EDGES = "CREATE TABLE edges (src BIGINT, dst BIGINT);\n"
NEAREST = ("(SELECT c.cid FROM centroids c ORDER BY (c.x - p.x) * (c.x - p.x) + "
           "(c.y - p.y) * (c.y - p.y), c.cid LIMIT 1)")
KMEANS_STEP = f"SELECT {NEAREST} AS cid, AVG(p.x) AS x, AVG(p.y) AS y FROM points p GROUP BY 1"
INITIAL = "SELECT * FROM (VALUES (1, 0.0, 0.0), (2, 5.0, 5.0)) AS c(cid, x, y)"


def kmeans(step: str = KMEANS_STEP, header: str = POINTS, tail: str = "ITERATIONS 5"):
    return compile_text(header + "CREATE VIEW centroids (cid BIGINT, x DOUBLE, y DOUBLE) AS "
                        f"ITERATE\n  INITIAL ({INITIAL})\n  STEP ({step})\n  {tail};\n",
                        path="k.sql")


def test_examples_compile_into_iterations():
    km = compile_program(REPO / "sql/examples/kmeans.sql").plans[0]
    pr = compile_program(REPO / "sql/examples/pagerank.sql").plans[0]
    assert km.iteration.iterations == 10 and km.iteration.key == "cid"
    assert pr.iteration.tolerance == 1e-6 and pr.iteration.key == "node"
    # The iterate is read by the step but is not a landed source.
    assert km.sources == ("points",) and pr.sources == ("edges",)
    assert "ranks" in [t.name for t in pr.source_tables]


def test_a_lookup_becomes_a_column_of_the_outer_source():
    plan = kmeans().plans[0]
    lookup, = plan.iteration.lookups
    assert (lookup.table, lookup.column) == ("points", "_lk0")
    assert ITERATE_ARRAY in lookup.spark and "array_sort" in lookup.spark
    assert not plan.iteration.joined
    points = next(t for t in plan.source_tables if t.name == "points")
    assert [c.name for c in points.columns] == ["x", "y", "_lk0"]
    assert plan.top.lineage and "_lk0" in str(plan.top.lineage[0])


def test_a_joined_iterate_gets_a_side_table():
    plan = compile_program(REPO / "sql/examples/pagerank.sql").plans[0]
    assert plan.iteration.joined and not plan.iteration.lookups
    assert any(t.side_of == "r" for t in plan.tables)


def test_explain_shows_the_step_and_its_state():
    text = explain_program(compile_program(REPO / "sql/examples/kmeans.sql"))
    assert "view centroids" in text and "sum_x" in text  # a step keeps DOUBLE monoids


def test_the_state_fingerprint_follows_the_iteration():
    a = kmeans(tail="ITERATIONS 5").plans[0].state_fingerprint
    b = kmeans(tail="ITERATIONS 6").plans[0].state_fingerprint
    assert a != b


@pytest.mark.parametrize("tail, fragment", [
    ("", "expected ITERATIONS"),
    ("ITERATIONS many", "whole number"),
    ("ITERATIONS 0", "between 1 and 999"),
    ("ITERATIONS 3 TOLERANCE -1", "must not be negative"),
    ("ITERATIONS 3 SOON", "unexpected SOON"),
])
def test_syntax_errors_say_how_to_write_an_iteration(tail, fragment):
    with pytest.raises(ParseError) as info:
        kmeans(tail=tail)
    assert fragment in info.value.message and "ITERATE INITIAL" in info.value.message


def test_an_iterative_view_needs_typed_columns():
    with pytest.raises(ParseError, match="needs its columns and types"):
        compile_text(POINTS + f"CREATE VIEW centroids AS ITERATE INITIAL ({INITIAL}) "
                     f"STEP ({KMEANS_STEP}) ITERATIONS 2;", path="k.sql")


@pytest.mark.parametrize("step, error, fragment", [
    (KMEANS_STEP.replace("AS y", "AS z"), CompileError, "outputs (cid, x, z)"),
    (KMEANS_STEP + " ORDER BY 1", NotIncrementalizableError, "ORDER BY / LIMIT on the STEP"),
    (KMEANS_STEP.replace("LIMIT 1", ""), NotIncrementalizableError, "ORDER BY ... LIMIT 1"),
    (("SELECT c.cid, AVG(c.x) AS x, AVG(c.y) AS y FROM centroids c LEFT JOIN points p "
      "ON c.x < p.x GROUP BY c.cid"), NotIncrementalizableError, "LEFT JOIN condition c.x < p.x"),
])
def test_step_errors_name_the_problem(step, error, fragment):
    with pytest.raises(error) as info:
        kmeans(step)
    assert fragment in info.value.message


def test_a_looked_up_source_must_be_insert_only():
    with pytest.raises(NotIncrementalizableError) as info:
        kmeans(header="CREATE TABLE points (x DOUBLE, y DOUBLE);\n")
    assert "append_only = points" in info.value.message


def test_initial_cannot_read_the_iterate():
    with pytest.raises(CompileError, match="INITIAL cannot read the iterate"):
        compile_text(EDGES + "CREATE VIEW r (node BIGINT, rank DOUBLE) AS ITERATE "
                     "INITIAL (SELECT node, rank FROM r) STEP (SELECT e.dst AS node, "
                     "SUM(x.rank) AS rank FROM edges e JOIN r x ON e.src = x.node GROUP BY e.dst) "
                     "ITERATIONS 2;", path="p.sql")


def _same(iteration, a: dict, b: dict) -> bool:
    """Evaluates :func:`same_row_sql` for rows ``a`` and ``b`` in DuckDB (via sqlglot)."""
    import duckdb
    import sqlglot

    cond = sqlglot.transpile(same_row_sql(iteration, "n", "o"), read="spark", write="duckdb")[0]
    cols = [c.name for c in iteration.columns]

    def row(values: dict) -> str:
        return "SELECT " + ", ".join(f"{values[c]!r}::{t.type} AS {c}"
                                     for c, t in zip(cols, iteration.columns))
    return duckdb.sql(f"SELECT {cond} FROM ({row(a)}) n, ({row(b)}) o").fetchone()[0]


def test_tolerance_compares_rows_symmetrically():
    it = compile_program(REPO / "sql/examples/pagerank.sql").plan("ranks").iteration
    assert it.tolerance == 1e-6
    loose = replace(it, tolerance=1e-3)
    # |a - b| = 1.0005 lies between τ·|b| = 1.0 and τ·|a| = 1.0010005: a one-sided test
    # would keep one row of the pair and drop the other (a key twice in X, or missing).
    a = {"node": 7, "rank": 1001.0005, "outdeg": 3}
    b = {"node": 7, "rank": 1000.0, "outdeg": 3}
    assert _same(loose, a, b) == _same(loose, b, a)
    assert _same(loose, {**a, "rank": 1000.9}, b) and _same(loose, b, {**a, "rank": 1000.9})
    assert not _same(loose, {**a, "rank": 1001.2}, b)
    assert not _same(loose, {**a, "rank": 1000.5, "node": 8}, b)
    # Below 1, the margin is τ (absolute); integers never use it.
    assert _same(loose, {**b, "rank": 0.2}, {**b, "rank": 0.2009})
    assert not _same(replace(loose, tolerance=0.5), {**b, "outdeg": 4}, b)
    assert not _same(it, {**b, "rank": 1000.01}, b) and _same(it, {**b, "rank": 1000.0009}, b)

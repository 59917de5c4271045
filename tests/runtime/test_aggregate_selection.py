"""Aggregate selection (seed 004 §6): R keeps only the tuples no other tuple of its group beats.

Random weighted graphs (8 nodes: cycles, parallel links, self-loops) take link insertions and
deletions; after every batch each view's answer must equal DuckDB's ``WITH RECURSIVE`` over the
live links, with selection on and off.  A view with no hop bound terminates only with
selection; its oracle is the same query bounded by the number of nodes (a cheapest path with
positive costs never repeats a node).
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from incr.compiler import compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

NODES = 8


def _paths(bound: str, select: str) -> str:
    return (f"WITH RECURSIVE p (src, dst, cost, hops) AS (SELECT src, dst, cost, 1 FROM links "
            f"UNION SELECT p.src, l.dst, p.cost + l.cost, p.hops + 1 FROM p JOIN links AS l "
            f"ON p.dst = l.src {bound}) {select}")


CHEAPEST = "SELECT src, dst, MIN(cost) AS cheapest FROM p WHERE src <> dst GROUP BY src, dst"
VIEWS = {
    # cost and hops both selected: a tuple stays unless another is as cheap and as short
    "both": _paths("WHERE p.hops < 4", "SELECT src, dst, MIN(cost) AS cheapest, MIN(hops) AS "
                   "fewest FROM p WHERE src <> dst GROUP BY src, dst"),
    # hops is part of the group: the cheapest path of each length
    "per_length": _paths("WHERE p.hops <= 3", "SELECT src, hops, MIN(cost) AS cheapest "
                         "FROM p GROUP BY src, hops"),
    # MAX: the dearest path of at most three links
    "dearest": _paths("WHERE 3 > p.hops", "SELECT src, dst, MAX(cost) AS dearest FROM p "
                      "GROUP BY src, dst"),
    # no hop bound (nor hop count): finite only because beaten tuples are not kept
    "unbounded": "WITH RECURSIVE p (src, dst, cost) AS (SELECT src, dst, cost FROM links UNION "
                 "SELECT p.src, l.dst, p.cost + l.cost FROM p JOIN links AS l ON p.dst = l.src) "
                 + CHEAPEST,
}
#: What DuckDB runs for a view (a bound for the unbounded one).
ORACLE = {**VIEWS, "unbounded": _paths(f"WHERE p.hops < {NODES}", CHEAPEST)}
PROGRAM = "CREATE TABLE links (src BIGINT, dst BIGINT, cost BIGINT);\n" + "".join(
    f"CREATE VIEW {name} AS {sql};\n" for name, sql in VIEWS.items())
SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("cost", pa.int64())])


def _land(landing: Path, seq: int, rows: list[tuple], delete: bool) -> None:
    folder = landing / "links" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(",".join(map(str, row)) + "\n" for row in rows)
    (folder / f"{seq:05d}.csv").write_text(f"src,dst,cost\n{body}")


def _pipeline(tmp_path: Path, text: str, spark=None, local_rows: int = 200_000,
              selection: bool = True):
    compiled = compile_text(text, path="paths.sql", name="paths")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    for view in pipeline.views.values():
        view.aggregate_selection = selection
    return compiled, landing, warehouse, pipeline


def _check(compiled, warehouse: Path, live: list[tuple], where: str) -> None:
    links = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in live], schema=SCHEMA)
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        diff = diff_answers(oracle_answer(ORACLE.get(plan.view, plan.select), {"links": links}), answer,
                            ordered=False)
        assert diff is None, f"{where}, view {plan.view}:\n{diff}"


def run_random_graph(tmp_path: Path, seed: int, batches: int, spark=None,
                     local_rows: int = 200_000, selection: bool = True) -> list[dict]:
    text = PROGRAM if selection else PROGRAM.replace(
        f"CREATE VIEW unbounded AS {VIEWS['unbounded']};\n", "")
    compiled, landing, warehouse, pipeline = _pipeline(tmp_path, text, spark, local_rows,
                                                       selection)
    rng = random.Random(seed)
    live: list[tuple] = []
    for seq in range(batches):
        delete = bool(live) and rng.random() < 0.45
        if delete:
            rows = rng.sample(live, min(len(live), rng.randint(1, 3)))
            for row in rows:
                live.remove(row)
        else:
            rows = [(rng.randrange(NODES), rng.randrange(NODES), rng.randint(1, 9))
                    for _ in range(rng.randint(1, 6))]
            live.extend(rows)
        _land(landing, seq, rows, delete)
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        _check(compiled, warehouse, live, f"seed {seed}, after batch {seq} "
                                          f"({'delete' if delete else 'insert'} {rows})")
    return [view.log for view in pipeline.views.values()]


@pytest.mark.parametrize("seed", [1, 2])
def test_selected_views_equal_duckdb_after_every_batch_on_the_driver(tmp_path, seed):
    run_random_graph(tmp_path, seed, 14)


def test_selected_views_equal_duckdb_after_every_batch_in_spark(spark, tmp_path):
    run_random_graph(tmp_path, 4, 3, spark=spark, local_rows=0)


def test_without_selection_the_same_answers_from_more_tuples(tmp_path):
    """Off, every path up to the bound is kept: more tuples derived, none pruned."""
    on = run_random_graph(tmp_path / "on", 5, 6)
    off = run_random_graph(tmp_path / "off", 5, 6, selection=False)
    assert sum(t["pruned"] for log in on for t in log) > 0
    assert sum(t["pruned"] for log in off for t in log) == 0
    assert sum(t["derived"] for log in on[:3] for t in log) < \
        sum(t["derived"] for log in off for t in log)


def _fixpoint(pipeline, view: str) -> list[tuple]:
    rows = pipeline.store.read(pipeline.views[view].fixpoint_path).to_pylist()
    return sorted((r["src"], r["dst"], r["cost"]) for r in rows)


CHEAP = ("CREATE TABLE links (src BIGINT, dst BIGINT, cost BIGINT);\n"
         "CREATE VIEW cheap AS WITH RECURSIVE p (src, dst, cost) AS (SELECT src, dst, cost "
         "FROM links UNION SELECT p.src, l.dst, p.cost + l.cost FROM p JOIN links AS l "
         "ON p.dst = l.src) SELECT src, dst, MIN(cost) AS cheapest FROM p GROUP BY src, dst;")


ORACLE["cheap"] = _paths(f"WHERE p.hops < {NODES}", "SELECT src, dst, MIN(cost) AS cheapest "
                         "FROM p GROUP BY src, dst")


def test_a_better_path_puts_out_the_beaten_tuples_and_what_they_derived(tmp_path):
    """0→2 (5), 2→3 (1): R is (0,2,5), (0,3,6), (2,3,1).  Adding 0→1→2 at cost 2 beats
    (0,2,5) and, through it, (0,3,6): R keeps only the new best tuples."""
    compiled, landing, warehouse, pipeline = _pipeline(tmp_path, CHEAP)
    _land(landing, 0, [(0, 2, 5), (2, 3, 1)], False)
    pipeline.run()
    assert _fixpoint(pipeline, "cheap") == [(0, 2, 5), (0, 3, 6), (2, 3, 1)]
    _land(landing, 1, [(0, 1, 1), (1, 2, 1)], False)
    assert pipeline.run().rejected is None
    assert _fixpoint(pipeline, "cheap") == [(0, 1, 1), (0, 2, 2), (0, 3, 3), (1, 2, 1),
                                            (1, 3, 2), (2, 3, 1)]
    _check(compiled, warehouse, [(0, 2, 5), (2, 3, 1), (0, 1, 1), (1, 2, 1)], "after the insert")


def test_deleting_the_best_path_brings_back_the_next_best(tmp_path):
    """The pruned (0,2,5) is not in R; deleting 1→2 derives it again for the answer."""
    compiled, landing, warehouse, pipeline = _pipeline(tmp_path, CHEAP)
    _land(landing, 0, [(0, 1, 1), (1, 2, 1), (0, 2, 5), (2, 0, 1)], False)
    pipeline.run()
    assert (0, 2, 5) not in _fixpoint(pipeline, "cheap")
    _land(landing, 1, [(1, 2, 1)], True)
    assert pipeline.run().rejected is None
    assert (0, 2, 5) in _fixpoint(pipeline, "cheap")
    _check(compiled, warehouse, [(0, 1, 1), (0, 2, 5), (2, 0, 1)], "after the delete")

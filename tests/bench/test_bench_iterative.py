"""``incr bench kmeans`` / ``incr bench pagerank``: tiny runs end to end, the data, the metrics.

Timings are never asserted (benchmarks are not timed tests).  What is checked: every output
with the documented columns, the recompute agreeing with DuckDB (``check``), the accuracy
metrics being sane, and the exact answers the metrics use agreeing with the programs' own
SQL iterated in DuckDB.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from incr.bench import run_bench
from incr.bench.iterative import (
    COLUMNS,
    SPECS,
    SQUARES,
    _program,
    kmeans_metrics,
    live_after,
    lloyd,
    make_steps,
    match_shift,
    pagerank_exact,
    pagerank_metrics,
    run_iterative,
)
from incr.cli import _parser
from incr.oracle import oracle_iterate

REQUIRED = {"batch", "rows", "incremental_s", "recompute_s", "moves", "dx_rows"}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _outputs(out: Path, label: str) -> tuple[list[dict[str, str]], dict]:
    rows = _rows(out / f"{label}.csv")
    assert list(rows[0]) == COLUMNS and set(rows[0]) >= REQUIRED
    assert (out / f"{label}.png").stat().st_size > 10_000
    assert (out / f"{label}.md").read_text().count("\n| ") >= len(rows)
    meta = json.loads((out / f"{label}.json").read_text())
    assert not (out / f"{label}-work").exists()
    return rows, meta


def test_kmeans_tiny_run(spark, tmp_path: Path) -> None:
    code = run_bench("kmeans", tmp_path, initial=400, sizes=(100,), increments=2, check=True,
                     warm_up=False, spark=spark, log=None)
    assert code == 0
    rows, meta = _outputs(tmp_path, "kmeans")
    assert [int(r["batch"]) for r in rows] == [0, 1, 2]
    assert [int(r["rows"]) for r in rows] == [400, 100, 100]
    assert all(r["check"] == "ok" and r["kind"] == "insert" for r in rows)
    for r in rows:
        assert int(r["moves"]) >= 1 and int(r["dx_rows"]) > 0 and int(r["answer_rows"]) == 4
        assert float(r["incremental_s"]) > 0 and float(r["recompute_s"]) > 0
        assert sum(int(n) for n in r["dx_trace"].split("|")) == int(r["dx_rows"])
        # Well-separated squares: incr and the recompute find batch k-means' optimum.
        for prefix in ("", "recompute_"):
            assert 0.999 <= float(r[prefix + "inertia_ratio"]) < 1.1
            assert float(r[prefix + "centroid_shift"]) < 0.05
        assert r["l1"] == "" and r["top100_overlap"] == ""
    assert meta["benchmark"] == "kmeans" and meta["iterations"] == 10
    assert meta["machine"]["nproc"] and meta["machine"]["spark"] == spark.version
    assert meta["mismatches"] == [] and meta["summary"]["100"]["last_batch"] == 2


def test_pagerank_tiny_run_with_a_delete_batch(spark, tmp_path: Path) -> None:
    # Two iterations instead of the program's ten keep the run under a minute.
    code = run_iterative("pagerank-deletes", tmp_path, initial=200, sizes=(12,), increments=3,
                         nodes=40, new_nodes=4, iterations=2, check=True, warm_up=False,
                         spark=spark, log=None)
    assert code == 0
    rows, meta = _outputs(tmp_path, "pagerank-deletes")
    assert [r["kind"] for r in rows] == ["insert", "insert", "insert", "delete"]
    assert [int(r["rows"]) for r in rows] == [200, 12, 12, 12]
    assert all(r["check"] == "ok" for r in rows)
    assert int(rows[0]["moves"]) == 2 and all(int(r["moves"]) <= 2 for r in rows)
    for r in rows:
        for prefix in ("", "recompute_"):
            overlap = float(r[prefix + "top100_overlap"])
            assert 0.0 <= overlap <= 1.0
            l1, per_node = float(r[prefix + "l1"]), float(r[prefix + "l1_per_node"])
            assert math.isfinite(l1) and l1 >= 0 and per_node <= l1
        assert int(r["exact_iterations"]) > 10 and int(r["answer_rows"]) > 0
        assert r["centroid_shift"] == ""
    assert meta["iterations"] == 2 and meta["iterations_overridden"]
    assert meta["nodes"] == 40 and meta["deletes"]


def test_kmeans_data_and_batch_kmeans() -> None:
    a = make_steps("kmeans", 300, 50, 2)
    b = make_steps("kmeans", 300, 50, 2)
    assert all(x.data.equals(y.data) for x, y in zip(a, b))
    pts = np.column_stack([live_after(a).column(c).to_numpy() for c in ("x", "y")])
    assert len(pts) == 400
    inside = np.zeros(len(pts), dtype=bool)
    for x0, y0 in SQUARES:
        inside |= (pts[:, 0] >= x0) & (pts[:, 0] <= x0 + 2) & (pts[:, 1] >= y0) & \
            (pts[:, 1] <= y0 + 2)
    assert inside.all()
    # Lloyd from the program's INITIAL matches the program iterated by DuckDB.
    plan = _program(SPECS["kmeans"]).plan("centroids")
    kept, centroids, _ = lloyd(pts, np.array([[1.0, 1.0], [1.0, 9.0], [9.0, 1.0], [9.0, 9.0]]))
    assert list(kept) == [0, 1, 2, 3]
    duck = oracle_iterate(plan, {"points": live_after(a)}, iterations=20)
    m = kmeans_metrics(duck.sort_by("cid"), pts, centroids)
    assert m["centroid_shift"] < 1e-9 and abs(m["inertia_ratio"] - 1) < 1e-12


def test_pagerank_data_and_exact_ranks() -> None:
    steps = make_steps("pagerank", 300, 20, 3, deletes=True, nodes=60, new_nodes=5)
    again = make_steps("pagerank", 300, 20, 3, deletes=True, nodes=60, new_nodes=5)
    assert all(x.data.equals(y.data) for x, y in zip(steps, again))
    assert [s.kind for s in steps] == ["insert", "insert", "insert", "delete"]
    first = steps[0].data
    pairs = list(zip(first.column("src").to_pylist(), first.column("dst").to_pylist()))
    assert len(pairs) == len(set(pairs)) == 300 and all(s != d for s, d in pairs)
    assert max(max(p) for p in pairs) < 60
    seen = {v for p in pairs for v in p}
    for step, new_ids in ((steps[1], range(60, 65)), (steps[2], range(65, 70))):
        added = list(zip(step.data.column("src").to_pylist(), step.data.column("dst").to_pylist()))
        for s, d in added:  # each new edge joins a new node to a node the graph already had
            assert (s in new_ids) != (d in new_ids) and ({s, d} - set(new_ids)) <= seen
        assert {v for p in added for v in p} >= set(new_ids)
        seen |= {v for p in added for v in p}
    live = live_after(steps)
    deleted = set(zip(steps[3].data.column("src").to_pylist(),
                      steps[3].data.column("dst").to_pylist()))
    assert len(deleted) == 20 and live.num_rows == 300 + 40 - 20
    assert not deleted & set(zip(live.column("src").to_pylist(), live.column("dst").to_pylist()))
    # The numpy formula is the program's: DuckDB iterating the SQL agrees once both converge.
    plan = _program(SPECS["pagerank"]).plan("ranks")
    nodes, ranks, its = pagerank_exact(live.column("src").to_numpy(), live.column("dst").to_numpy())
    duck = oracle_iterate(plan, {"edges": live}, iterations=its + 50)
    m = pagerank_metrics(duck, nodes, ranks)
    assert m["l1_per_node"] < 1e-8 and m["top100_overlap"] == 1.0


def test_metrics() -> None:
    answer = pa.table({"node": [1, 2, 3], "rank": [1.0, 2.0, 3.0]})
    m = pagerank_metrics(answer, np.array([2, 3, 4]), np.array([2.5, 3.0, 1.0]))
    assert m["l1"] == pytest.approx(1.0 + 0.5 + 0.0 + 1.0)
    assert m["l1_per_node"] == pytest.approx(2.5 / 4) and m["top100_overlap"] == pytest.approx(2 / 3)
    a = np.array([[0.0, 0.0], [10.0, 0.0]])
    assert match_shift(a, a[::-1] + [0.0, 0.5]) == pytest.approx(0.5)
    assert match_shift(a, a[:1]) == math.inf


def test_names_and_command_line(tmp_path: Path) -> None:
    args = _parser().parse_args(["bench", "pagerank", "--sizes", "100,200", "--nodes", "1000",
                                 "--new-nodes", "10", "--iterations", "3", "--no-recompute"])
    assert args.sizes == (100, 200) and args.nodes == 1000 and args.iterations == 3
    assert args.no_recompute and args.new_nodes == 10
    assert run_iterative("kmeans", tmp_path, deletes=True, log=None) == 2
    assert run_iterative("kmeans", tmp_path, nodes=10, log=None) == 2
    assert run_bench("kmeans-deletes", tmp_path, log=None) == 2


def test_iterations_and_tolerance_overrides() -> None:
    shipped = _program(SPECS["pagerank"]).plan("ranks").iteration
    assert (shipped.iterations, shipped.tolerance) == (10, 1e-6)
    looser = _program(SPECS["pagerank"], tolerance=1e-3).plan("ranks").iteration
    assert (looser.iterations, looser.tolerance) == (10, 1e-3)
    both = _program(SPECS["pagerank"], iterations=4, tolerance=0.01).plan("ranks").iteration
    assert (both.iterations, both.tolerance) == (4, 0.01)
    kmeans = _program(SPECS["kmeans"], tolerance=1e-9).plan("centroids").iteration  # none shipped
    assert (kmeans.iterations, kmeans.tolerance) == (10, 1e-9)
    args = _parser().parse_args(["bench", "pagerank", "--tolerance", "1e-3"])
    assert args.tolerance == 1e-3

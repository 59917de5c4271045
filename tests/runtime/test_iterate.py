"""Iterative views at run time: k-means and PageRank against exact recomputes, per batch.

What must hold, and why:

* **The first batch is the iteration itself.**  With an empty state the loop runs INITIAL
  then ITERATIONS steps over the batch, so the answer equals DuckDB running the same (with
  TOLERANCE 0 every change propagates, so equality is to 1e-9).
* **PageRank: the state is always exact for the iterate it was moved to.**  X reaches the
  step through a join, so each move re-evaluates every edge whose source changed (through
  the edges' side table): after every batch, a(T) equals one step of the query applied to
  the stored iterate X over all edges so far, inserts and deletes alike.
* **PageRank: the error is bounded, and does not accumulate.**  The only error left is that
  a batch runs ITERATIONS steps warm-started from the previous answer instead of iterating
  to convergence.  The step contracts L1 distances by the damping 0.85, so (a) the answer,
  one step from X, is within 0.85 / 0.15 x |answer - X| of the exact ranks (the fixpoint on
  all edges so far), and (b) a batch that moves the fixpoint by p_k and then runs `moves`
  steps leaves e_k <= q (e_(k-1) + p_k), q = 0.85^moves, hence e_k <= q / (1 - q) x max p:
  bounded however many batches come.  Both are asserted after every batch.
* **k-means: old points keep their centroid** (Algorithm 1), so the answer is approximate
  in general.  On well-separated clusters (the paper's four squares) no point changes
  cluster after the first batch, so the centroids equal batch k-means' on all points (same
  initial centroids, run to convergence) and the inertia ratio is 1: the bounds asserted
  (shift < 1e-6, ratio < 1.001) leave only float noise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_program, compile_text
from incr.oracle import diff_answers, oracle_iterate
from incr.runtime.faults import CRASH_EXIT
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from incr.runtime.store import DeltaStore

REPO = Path(__file__).resolve().parents[2]
DAMPING = 0.85


def _land(landing: Path, table: str, seq: int, rows: pa.Table, delete: bool = False) -> None:
    folder = landing / table / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, folder / f"{seq:04d}.parquet")


def _pagerank_text(iterations: int = 6) -> str:
    """The example program with TOLERANCE 0 (every change propagates) and fewer steps."""
    text = (REPO / "sql/examples/pagerank.sql").read_text()
    return text.replace("ITERATIONS 10 TOLERANCE 1e-6", f"ITERATIONS {iterations} TOLERANCE 0")


def _graph_batches(rng: np.random.Generator) -> list[tuple[str, pa.Table]]:
    """A 60-node graph, then batches of new edges (some to new nodes), and a delete."""
    def edges(n: int, nodes: int) -> pa.Table:
        return pa.table({"src": rng.integers(0, nodes, n), "dst": rng.integers(0, nodes, n)})

    first = edges(300, 50)
    return [("insert", first), ("insert", edges(10, 54)), ("delete", first.slice(0, 8))]


def _ranks(table: pa.Table) -> dict[int, float]:
    return dict(zip(table["node"].to_pylist(), table["rank"].to_pylist()))


def _l1(a: dict[int, float], b: dict[int, float]) -> float:
    return sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _edges(live: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"src": [s for s, _ in live], "dst": [d for _, d in live]},
                    schema=pa.schema([("src", pa.int64()), ("dst", pa.int64())]))


def _step(plan, edges: pa.Table, x: pa.Table) -> pa.Table:
    """One step of the view's query, run by DuckDB over ``edges`` with ``x`` as the iterate."""
    con = duckdb.connect()
    con.register("e", edges)
    con.register("x", x)
    con.execute("CREATE TABLE edges AS SELECT * FROM e")
    con.execute("CREATE TABLE ranks AS SELECT * FROM x")
    return con.execute(plan.select).to_arrow_table()


def test_pagerank_state_is_exact_for_its_iterate_and_the_error_contracts(spark, tmp_path):
    compiled = compile_text(_pagerank_text(), path="pagerank.sql")
    plan = compiled.plans[0]
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    live: list[tuple[int, int]] = []
    shifts: list[float] = []
    fixpoint: dict[int, float] = {}
    for seq, (kind, rows) in enumerate(_graph_batches(np.random.default_rng(7))):
        _land(landing, "edges", seq, rows, delete=kind == "delete")
        pairs = list(zip(rows["src"].to_pylist(), rows["dst"].to_pylist()))
        if kind == "delete":
            for p in pairs:
                live.remove(p)
        else:
            live += pairs
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        answer, _ = read_answer(warehouse, plan)
        edges = _edges(live)
        if seq == 0:
            diff = diff_answers(oracle_iterate(plan, {"edges": edges}), answer, ordered=False)
            assert diff is None, f"first batch differs from the iteration: {diff}"
        # a(T) is one exact step from the stored iterate X.
        runtime = pipeline.views[plan.view]
        x = DeltaStore().read(runtime.iterate_path)
        diff = diff_answers(_step(plan, edges, x), answer, ordered=False)
        assert diff is None, f"batch {seq} ({kind}): a(T) is not step(X): {diff}"
        # The step contracts by 0.85, so the answer (one step from X) is within
        # 0.85 / 0.15 x |answer - X| of the fixpoint: the error is observable and bounded.
        exact = _ranks(oracle_iterate(plan, {"edges": edges}, iterations=300))
        error = _l1(_ranks(answer), exact)
        step = _l1(_ranks(answer), _ranks(x))
        assert error <= DAMPING / (1 - DAMPING) * step + 1e-9 * len(exact), (seq, error, step)
        # Errors do not accumulate: a batch moves the fixpoint by p and then runs at least
        # `moves` contracting steps, so e_k <= q (e_(k-1) + p_k) with q = 0.85^moves, whose
        # solution stays below q / (1 - q) x max p: bounded however many batches come.
        if fixpoint:
            moves = runtime.log[-1]["moves"]
            q = DAMPING ** moves
            shifts.append(_l1(exact, fixpoint))
            bound = q / (1 - q) * max(shifts) + 1e-9 * len(exact)
            assert error <= bound, (f"batch {seq} ({kind}): L1 {error} to the fixpoint, over "
                                    f"the bound {bound} (fixpoint moves {shifts})")
        fixpoint = exact


def test_pagerank_with_a_tolerance_keeps_one_row_per_node_and_a_bounded_error(spark, tmp_path):
    # Changes below TOLERANCE (here a loose 5%) are not propagated, so X lags a(T) a little;
    # X must still hold exactly one row per node of the live edges, a(T) must still be one
    # exact step from X, and the a-posteriori bound holds as without a tolerance.
    text = _pagerank_text(iterations=4).replace("TOLERANCE 0", "TOLERANCE 0.05")
    compiled = compile_text(text, path="pagerank.sql")
    plan = compiled.plans[0]
    assert plan.iteration.tolerance == 0.05
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    live: list[tuple[int, int]] = []
    for seq, (kind, rows) in enumerate(_graph_batches(np.random.default_rng(5))):
        _land(landing, "edges", seq, rows, delete=kind == "delete")
        pairs = list(zip(rows["src"].to_pylist(), rows["dst"].to_pylist()))
        for p in pairs:
            if kind == "delete":
                live.remove(p)
            else:
                live.append(p)
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        answer, _ = read_answer(warehouse, plan)
        x = DeltaStore().read(pipeline.views[plan.view].iterate_path)
        nodes = {v for pair in live for v in pair}
        keys = x["node"].to_pylist()
        assert len(keys) == len(set(keys)) and set(keys) == nodes == set(answer["node"].to_pylist())
        outdeg = {}
        for s, _ in live:
            outdeg[s] = outdeg.get(s, 0) + 1
        assert dict(zip(answer["node"].to_pylist(), answer["outdeg"].to_pylist())) == \
            {n: outdeg.get(n, 0) for n in nodes}
        edges = _edges(live)
        diff = diff_answers(_step(plan, edges, x), answer, ordered=False)
        assert diff is None, f"batch {seq} ({kind}): a(T) is not step(X): {diff}"
        exact = _ranks(oracle_iterate(plan, {"edges": edges}, iterations=300))
        error, step = _l1(_ranks(answer), exact), _l1(_ranks(answer), _ranks(x))
        assert error <= DAMPING / (1 - DAMPING) * step + 1e-9 * len(exact), (seq, error, step)


def _inertia(points: np.ndarray, centroids: dict) -> float:
    """Sum of squared distances of the points to their nearest centroid."""
    c = np.array(list(centroids.values()))
    return float(((points[:, None, :] - c[None]) ** 2).sum(-1).min(1).sum())


def test_kmeans_matches_batch_kmeans_on_separated_clusters(spark, tmp_path):
    compiled = compile_program(REPO / "sql/examples/kmeans.sql")
    plan = compiled.plans[0]
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    rng = np.random.default_rng(3)
    corners = np.array([[2.0, 2.0], [2.0, 6.0], [6.0, 2.0], [6.0, 6.0]])
    points = np.empty((0, 2))
    for seq, n in enumerate([300, 30, 30]):
        batch = corners[rng.integers(0, 4, n)] + rng.uniform(0, 2, (n, 2))
        points = np.vstack([points, batch])
        _land(landing, "points", seq, pa.table({"x": batch[:, 0], "y": batch[:, 1]}))
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        answer, _ = read_answer(warehouse, plan)
        table = pa.table({"x": points[:, 0], "y": points[:, 1]})
        if seq == 0:
            diff = diff_answers(oracle_iterate(plan, {"points": table}), answer, ordered=False)
            assert diff is None, f"first batch differs from the iteration: {diff}"
        exact = oracle_iterate(plan, {"points": table}, iterations=50)
        mine = {r["cid"]: np.array([r["x"], r["y"]]) for r in answer.to_pylist()}
        best = {r["cid"]: np.array([r["x"], r["y"]]) for r in exact.to_pylist()}
        assert set(mine) == set(best)
        shift = max(np.linalg.norm(mine[c] - best[c]) for c in best)

        ratio = _inertia(points, mine) / _inertia(points, best)
        assert shift < 1e-6 and ratio < 1.001, f"batch {seq}: shift {shift}, inertia x{ratio}"


def test_a_run_killed_inside_the_loop_resumes_to_the_same_answer(spark, tmp_path):
    program = tmp_path / "pagerank.sql"
    program.write_text(_pagerank_text(iterations=3))
    rng = np.random.default_rng(11)
    batches = [("insert", pa.table({"src": rng.integers(0, 30, 150), "dst": rng.integers(0, 30, 150)})),
               ("insert", pa.table({"src": rng.integers(0, 34, 10), "dst": rng.integers(0, 34, 10)}))]
    results = []
    for crash in ("iterate.after_move:1", None):
        landing, warehouse = tmp_path / f"landing{bool(crash)}", tmp_path / f"wh{bool(crash)}"
        for seq, (_, rows) in enumerate(batches):
            _land(landing, "edges", seq, rows)
        env = {k: v for k, v in os.environ.items() if k != "INCR_CRASH_AT"}
        env["INCR_SPARK_CONF"] = "spark.sql.shuffle.partitions=2,spark.driver.memory=1g"
        runs = [crash, None] if crash else [None]
        for at in runs:
            run_env = dict(env, **({"INCR_CRASH_AT": at} if at else {}))
            proc = subprocess.run([sys.executable, "-m", "incr.cli", "run", str(program),
                                   "--landing", str(landing), "--warehouse", str(warehouse)],
                                  env=run_env, capture_output=True, text=True, timeout=600,
                                  check=False)
            assert proc.returncode == (CRASH_EXIT if at else 0), proc.stderr[-2000:]
        plan = compile_program(program).plans[0]
        answer, seen = read_answer(warehouse, plan)
        assert seen == 1
        results.append(answer)
    assert diff_answers(results[1], results[0], ordered=False) is None


def _bigger_graph(rng: np.random.Generator) -> list[tuple[str, pa.Table]]:
    """200 nodes, then small batches (a few new nodes), and deletes of early edges."""
    def edges(n: int, nodes: int) -> pa.Table:
        return pa.table({"src": rng.integers(0, nodes, n), "dst": rng.integers(0, nodes, n)})

    first = edges(800, 200)
    return [("insert", first), ("insert", edges(6, 203)), ("insert", edges(6, 206)),
            ("delete", first.slice(0, 5)), ("insert", edges(6, 210))]


@pytest.mark.parametrize("local_rows", [None, 0], ids=["driver", "spark"])
def test_pagerank_compares_only_the_frontier_and_moves_x_as_a_full_comparison_would(
        spark, tmp_path, local_rows, caplog):
    # ΔX = a(T) ⊖ X is computed over the groups folds touched since they were last compared
    # (kept across batches in _frontier when the moves run out).  That must move X exactly as
    # comparing every group does: same rows of X, same answer, batch after batch.  A loose
    # TOLERANCE and few ITERATIONS make both matter: skipped changes, and a frontier left over.
    text = _pagerank_text(iterations=3).replace("TOLERANCE 0", "TOLERANCE 0.01")
    compiled = compile_text(text, path="pagerank.sql")
    plan = compiled.plans[0]
    runs = {}
    for name, restricted in (("frontier", True), ("every group", False)):
        root = tmp_path / name.replace(" ", "_")
        landing, warehouse = root / "landing", root / "warehouse"
        runs[name] = (Pipeline(compiled, landing, warehouse, spark=spark,
                               local_rows=local_rows if restricted else None), landing, warehouse)
        runtime = runs[name][0].views[plan.view]
        if not restricted:
            runtime._restricts = lambda: False
    compared: list[int | None] = []
    frontier = runs["frontier"][0].views[plan.view]
    diff = frontier._diff
    frontier._diff = lambda pending: (compared.append(None if pending is None else pending.num_rows),
                                      diff(pending))[1]
    caplog.set_level("INFO", logger="incr.runtime")
    for seq, (kind, rows) in enumerate(_bigger_graph(np.random.default_rng(11))):
        answers, iterates = {}, {}
        for name, (pipeline, landing, warehouse) in runs.items():
            _land(landing, "edges", seq, rows, delete=kind == "delete")
            caplog.clear()
            report = pipeline.run()
            assert report.rejected is None, str(report.rejected)
            answers[name] = read_answer(warehouse, plan)[0].sort_by("node")
            iterates[name] = DeltaStore().read(pipeline.views[plan.view].iterate_path).sort_by("node")
            if name == "frontier" and seq > 0 and local_rows is None:
                # a small batch moves X without Spark: every fold and loop step on the driver
                spark_steps = [r.getMessage() for r in caplog.records
                               if ("fold " in r.getMessage() or "loop " in r.getMessage())
                               and "Spark" in r.getMessage()]
                assert not spark_steps, spark_steps
        for what, tables in (("answer", answers), ("iterate X", iterates)):
            a, b = tables["frontier"], tables["every group"]
            assert a["node"].to_pylist() == b["node"].to_pylist(), (seq, what)
            for col in ("rank", "outdeg"):
                assert np.allclose(a[col].to_numpy(), b[col].to_numpy(), rtol=1e-9, atol=1e-12), \
                    (seq, what, col)
    # The first batch compares every group (INITIAL moved X); later moves only the touched
    # ones (here the diffusion reaches most of a 200-node graph, but not all of it).  The
    # last batch's final moves left a frontier.
    assert None in compared[:2], compared
    restricted = [n for n in compared if n is not None]
    assert restricted and min(restricted) < 0.8 * len(answers["frontier"]), compared
    assert frontier._frontier(frontier._state_number()) is not None

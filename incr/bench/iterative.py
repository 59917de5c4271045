"""``incr bench kmeans`` and ``incr bench pagerank``: the seed paper's iterative experiments (§11).

The programs are the shipped examples, ``sql/examples/kmeans.sql`` and
``sql/examples/pagerank.sql`` (iterative views: ``ITERATE INITIAL … STEP … ITERATIONS 10``).
Per increment size, an initial load and N increments land as Parquet in incr's landing layout,
and each batch is measured on one SparkSession:

1. **incremental**: ``Pipeline.run(through=…)`` applying the batch to the warehouse that
   persists across batches (the runtime's Algorithm 1: the batch folded in, then up to
   ITERATIONS moves of the iterate warm-started from the previous answer, each touching only
   what the change ΔX reaches).  ``moves`` and ``dx_rows`` come from ``IterativeRuntime.log``.
2. **recompute**: what a batch job would do, with the same engine: a fresh warehouse and a
   ``Pipeline`` over one landing folder holding all live rows so far as **one** file, run
   from scratch (INITIAL, then the STEP ITERATIONS times, stopping early when ΔX is empty).
   Writing that file is not timed (incr's landing is not timed either).
3. **accuracy** (numpy, untimed) of incr's answer and of the recompute's, against the exact
   answer on all data so far:

   * k-means: batch k-means = Lloyd's algorithm from the same INITIAL centroids, to
     convergence (no assignment changes).  ``centroid_shift`` is the largest distance between
     a centroid of incr and its match in batch k-means (centroids matched by the pairing
     with the least total distance, all k! pairings tried up to k = 8, greedy above);
     ``inertia_ratio`` is the sum of squared distances of all points so far to their nearest
     centroid of incr over the same under batch k-means' centroids (≥ 1 up to rounding when
     both reach the same optimum).
   * PageRank: the exact ranks = the program's formula, ``rank(n) = 0.15 + 0.85 Σ rank(m) /
     outdeg(m)`` over the edges m → n, iterated from 1.0 until no rank moves by more than
     1e-10.  ``l1`` = Σ |incr − exact| over the union of nodes (a node missing on one side
     counts as 0), ``l1_per_node`` = ``l1`` / that many nodes, ``top100_overlap`` =
     |top-100 of incr ∩ top-100 exact| / 100 (ties broken by node id).

   The ``recompute_*`` columns give the same metrics for the from-scratch answer: the error of
   ITERATIONS steps from INITIAL, against which incr's error can be read.
4. with ``check``, the recompute's answer is compared with :func:`incr.oracle.oracle_iterate`
   (DuckDB, the program's own SQL, ITERATIONS steps): values must agree within 1e-9, or
   when the view has a TOLERANCE τ, within 10·τ in relative L1 (see :func:`_check`).

**Data** (numpy, seeded from the benchmark name and the settings: reproducible bit for bit):

* k-means: points uniform in the four squares [2,4]×[2,4], [2,4]×[6,8], [6,8]×[2,4],
  [6,8]×[6,8] (each point picks a square uniformly), as in the paper; insert-only (the
  program declares ``points`` append-only).
* PageRank: an R-MAT graph (a, b, c, d = 0.30, 0.25, 0.25, 0.20; node ids in [0, nodes),
  drawn over the next power of two and redrawn when outside) of ``initial`` **distinct**
  edges without self-loops (both redrawn).  Each increment adds ``new_nodes`` new node ids
  and ``size`` new edges, each joining one new node (every new node gets one before any
  gets two) to a node the graph already has (picked by R-MAT over the ids so far, so hubs
  attract more links), pointing either way with even odds; still no duplicates or loops.
  With ``deletes``, every third increment instead deletes ``size`` live edges picked
  uniformly (a node left with no edge leaves the graph, in incr's answer as in the exact one).

Outputs in ``--out DIR``, for ``LABEL`` = the name (plus ``-deletes``):

* ``LABEL.csv``: one row per batch and size (:data:`COLUMNS`); batch 0 is the initial load;
* ``LABEL.png``: per size, time per batch (incr vs recompute) and the error per batch
  (:func:`incr.bench.plot.plot_iterative`);
* ``LABEL.md``: the per-batch tables;
* ``LABEL.json``: machine, settings, command line, a per-size summary, check mismatches.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shutil
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from incr.bench.machine import machine_info
from incr.bench.results import write_records
from incr.runtime.landing import DELETE, DELETES_DIR, INSERT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.compiler import CompiledProgram

EXAMPLES = Path(__file__).resolve().parents[2] / "sql" / "examples"
DELETE_EVERY = 3
RMAT = (0.30, 0.25, 0.25, 0.20)
SQUARES = ((2.0, 2.0), (2.0, 6.0), (6.0, 2.0), (6.0, 6.0))  # lower-left corners, side 2
SIDE = 2.0
PR_BASE, PR_DAMPING = 0.15, 0.85  # the formula of sql/examples/pagerank.sql
EXACT_TOL = 1e-10
TOP = 100
FLOOR = 1e-16  # errors below this are drawn at this value on log axes


@dataclass(frozen=True)
class Spec:
    """One iterative benchmark: its program, view, source and defaults."""

    name: str
    program: str  # file name under sql/examples
    view: str
    table: str
    columns: tuple[str, ...]
    initial: int
    sizes: tuple[int, ...]
    metrics: tuple[str, ...]  # accuracy columns, each also as recompute_<name>


SPECS: dict[str, Spec] = {
    "kmeans": Spec("kmeans", "kmeans.sql", "centroids", "points", ("x", "y"), 1_000_000,
                   (10_000,), ("centroid_shift", "inertia_ratio")),
    "pagerank": Spec("pagerank", "pagerank.sql", "ranks", "edges", ("src", "dst"), 50_000,
                     (100,), ("l1", "l1_per_node", "top100_overlap")),
}
#: The paper's increment sizes (one run each): points per batch, edges per batch.
PAPER_SIZES = {"kmeans": (10_000, 20_000, 30_000, 40_000), "pagerank": (100, 200, 300, 400)}
DEFAULT_NODES = 5_000
DEFAULT_NEW_NODES = 100
DELETES_SUFFIX = "-deletes"

COLUMNS = ["name", "size", "batch", "kind", "initial_rows", "rows", "incremental_s",
           "recompute_s", "speedup", "moves", "dx_rows", "dx_trace", "recompute_moves",
           "answer_rows", "exact_iterations", "centroid_shift", "inertia_ratio", "l1",
           "l1_per_node", "top100_overlap", "recompute_centroid_shift",
           "recompute_inertia_ratio", "recompute_l1", "recompute_l1_per_node",
           "recompute_top100_overlap", "check", "load1"]


def is_iterative(name: str) -> bool:
    """Whether ``name`` (optionally ``-deletes``) names an iterative benchmark."""
    return name.removesuffix(DELETES_SUFFIX) in SPECS


# -- data ------------------------------------------------------------------------------------
@dataclass
class Step:
    """One batch: the initial load (index 0) or an increment; ``data`` is what it landed."""

    index: int
    kind: str
    data: pa.Table
    file: str = ""  # relative to the landing root

    @property
    def rows(self) -> int:
        return self.data.num_rows


def kmeans_points(rng: np.random.Generator, n: int) -> pa.Table:
    """``n`` points, each uniform in one of the four squares picked uniformly."""
    corners = np.array(SQUARES)[rng.integers(0, len(SQUARES), n)]
    xy = corners + SIDE * rng.random((n, 2))
    return pa.table({"x": xy[:, 0], "y": xy[:, 1]})


def rmat_pairs(rng: np.random.Generator, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``m`` R-MAT draws over the next power of two ≥ ``n``; the pairs inside [0, n) are kept."""
    scale = max(1, int(np.ceil(np.log2(max(n, 2)))))
    cut = np.cumsum(RMAT)[:-1]
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    for _ in range(scale):
        quadrant = np.searchsorted(cut, rng.random(m), side="right")  # 0=a 1=b 2=c 3=d
        src = 2 * src + (quadrant >= 2)
        dst = 2 * dst + (quadrant & 1)
    keep = (src < n) & (dst < n)
    return src[keep], dst[keep]


class Graph:
    """The live edges (distinct, no self-loops) and the R-MAT draws that grow them."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.edges: dict[tuple[int, int], None] = {}  # insertion-ordered set
        self.degree: dict[int, int] = {}

    def _add(self, s: int, d: int) -> None:
        self.edges[(s, d)] = None
        self.degree[s] = self.degree.get(s, 0) + 1
        self.degree[d] = self.degree.get(d, 0) + 1

    def initial(self, nodes: int, edges: int) -> pa.Table:
        """``edges`` distinct R-MAT edges over node ids [0, nodes)."""
        if edges > nodes * (nodes - 1):
            raise ValueError(f"{edges} distinct edges do not fit on {nodes} nodes")
        out: list[tuple[int, int]] = []
        for _ in range(10_000):
            need = edges - len(out)
            if need == 0:
                break
            src, dst = rmat_pairs(self.rng, 2 * need + 64, nodes)
            for s, d in zip(src.tolist(), dst.tolist()):
                if s != d and (s, d) not in self.edges:
                    self._add(s, d)
                    out.append((s, d))
                    if len(out) == edges:
                        break
        else:  # pragma: no cover
            raise ValueError(f"R-MAT could not draw {edges} distinct edges on {nodes} nodes")
        return _edge_table(out)

    def grow(self, first_id: int, new_nodes: int, edges: int) -> pa.Table:
        """``edges`` edges, each between a new node and a node the graph has, either way."""
        present = np.array(sorted(self.degree), dtype=np.int64)
        if present.size == 0:
            raise ValueError("the graph has no node to link new nodes to")
        limit = int(present[-1]) + 1
        is_present = np.zeros(limit, dtype=bool)
        is_present[present] = True
        new = first_id + np.arange(new_nodes, dtype=np.int64)
        out: list[tuple[int, int]] = []
        for _ in range(10_000):
            if len(out) == edges:
                break
            src, dst = rmat_pairs(self.rng, 4 * (edges - len(out)) + 64, limit)
            ends = np.concatenate([src, dst])
            ends = ends[is_present[ends]]
            self.rng.shuffle(ends)
            for v in ends.tolist():
                i = len(out)
                u = int(new[i % new_nodes]) if i < new_nodes else int(self.rng.choice(new))
                s, d = (u, v) if self.rng.random() < 0.5 else (v, u)
                if (s, d) not in self.edges:
                    self._add(s, d)
                    out.append((s, d))
                    if len(out) == edges:
                        break
        else:  # pragma: no cover
            raise ValueError(f"could not draw {edges} new edges")
        return _edge_table(out)

    def delete(self, edges: int) -> pa.Table:
        """``edges`` live edges picked uniformly, removed."""
        live = list(self.edges)
        pick = self.rng.choice(len(live), size=min(edges, len(live)), replace=False)
        out = [live[i] for i in sorted(pick.tolist())]
        for s, d in out:
            del self.edges[(s, d)]
            for v in (s, d):
                self.degree[v] -= 1
                if self.degree[v] == 0:
                    del self.degree[v]
        return _edge_table(out)

    def table(self) -> pa.Table:
        return _edge_table(list(self.edges))


def _edge_table(pairs: list[tuple[int, int]]) -> pa.Table:
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return pa.table({"src": arr[:, 0], "dst": arr[:, 1]})


def _rng(name: str, *settings: int) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(name.encode()), *settings])


def make_steps(name: str, initial: int, size: int, increments: int, deletes: bool = False,
               nodes: int = DEFAULT_NODES, new_nodes: int = DEFAULT_NEW_NODES) -> list[Step]:
    """The batches of one run, in memory (see the module doc for the data)."""
    if name == "kmeans":
        rng = _rng(name, initial, size, increments)
        return [Step(i, INSERT, kmeans_points(rng, initial if i == 0 else size))
                for i in range(increments + 1)]
    rng = _rng(name, initial, size, increments, int(deletes), nodes, new_nodes)
    graph = Graph(rng)
    steps = [Step(0, INSERT, graph.initial(nodes, initial))]
    next_id = nodes
    for i in range(1, increments + 1):
        if deletes and i % DELETE_EVERY == 0:
            steps.append(Step(i, DELETE, graph.delete(size)))
        else:
            steps.append(Step(i, INSERT, graph.grow(next_id, new_nodes, size)))
            next_id += new_nodes
    return steps


def land_steps(steps: list[Step], landing: Path, table: str) -> None:
    """Writes every step as ``LANDING/<table>/NNNN.parquet`` (deletes under ``_deletes/``)."""
    for step in steps:
        folder = landing / table / (DELETES_DIR if step.kind == DELETE else "")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{step.index:04d}.parquet"
        pq.write_table(step.data, path)
        step.file = path.relative_to(landing).as_posix()


def live_after(steps: list[Step]) -> pa.Table:
    """The rows live after ``steps`` (inserts minus deletes; the generators never repeat a row)."""
    inserted = pa.concat_tables([s.data for s in steps if s.kind == INSERT])
    deleted = [s.data for s in steps if s.kind == DELETE]
    if not deleted:
        return inserted
    gone = set(zip(*(pa.concat_tables(deleted).column(c).to_pylist()
                     for c in inserted.column_names)))
    mask = [row not in gone for row in zip(*(inserted.column(c).to_pylist()
                                             for c in inserted.column_names))]
    return inserted.filter(pa.array(mask))


# -- exact answers and the metrics -----------------------------------------------------------
def pagerank_exact(src: np.ndarray, dst: np.ndarray, tol: float = EXACT_TOL,
                   max_iterations: int = 100_000) -> tuple[np.ndarray, np.ndarray, int]:
    """The program's PageRank iterated from 1.0 to convergence: (nodes, ranks, iterations)."""
    nodes, inverse = np.unique(np.concatenate([src, dst]), return_inverse=True)
    s, d = inverse[: len(src)], inverse[len(src):]
    outdeg = np.bincount(s, minlength=len(nodes)).astype(float)
    rank = np.ones(len(nodes))
    for i in range(1, max_iterations + 1):
        new = PR_BASE + PR_DAMPING * np.bincount(d, weights=rank[s] / outdeg[s],
                                                 minlength=len(nodes))
        moved = np.max(np.abs(new - rank)) if len(nodes) else 0.0
        rank = new
        if moved < tol:
            return nodes, rank, i
    return nodes, rank, max_iterations


def pagerank_metrics(answer: pa.Table, exact_nodes: np.ndarray,
                     exact_ranks: np.ndarray) -> dict[str, float]:
    """L1 distance (union of nodes, missing = 0), per node, and the top-100 overlap."""
    nodes = np.asarray(answer.column("node").to_pylist(), dtype=np.int64)
    ranks = np.asarray(answer.column("rank").to_pylist(), dtype=float)
    union = np.union1d(nodes, exact_nodes)
    mine = np.zeros(len(union))
    mine[np.searchsorted(union, nodes)] = ranks
    exact = np.zeros(len(union))
    exact[np.searchsorted(union, exact_nodes)] = exact_ranks
    l1 = float(np.abs(mine - exact).sum())
    k = min(TOP, len(exact_nodes)) or 1
    top_mine = set(nodes[np.lexsort((nodes, -ranks))[:k]].tolist())
    top_exact = set(exact_nodes[np.lexsort((exact_nodes, -exact_ranks))[:k]].tolist())
    return {"l1": l1, "l1_per_node": l1 / max(len(union), 1),
            "top100_overlap": len(top_mine & top_exact) / k}


def lloyd(points: np.ndarray, init: np.ndarray, max_iterations: int = 10_000
          ) -> tuple[np.ndarray, np.ndarray, int]:
    """Batch k-means from ``init`` until no point changes centroid: (kept, centroids, iterations).

    As in the program's STEP, a point goes to the nearest centroid (ties: the first), and a
    centroid that gets no point is dropped (the STEP only outputs groups that have points);
    ``kept`` are the indexes into ``init`` of the centroids that remain.
    """
    kept = np.arange(len(init))
    centroids = np.asarray(init, dtype=float).copy()
    assign = None
    for i in range(1, max_iterations + 1):
        new_assign = _nearest(points, centroids)[0]
        if assign is not None and np.array_equal(new_assign, assign):
            return kept, centroids, i - 1
        assign = new_assign
        counts = np.bincount(assign, minlength=len(centroids))
        sums = np.stack([np.bincount(assign, weights=points[:, j], minlength=len(centroids))
                         for j in range(points.shape[1])], axis=1)
        alive = counts > 0
        centroids = sums[alive] / counts[alive, None]
        kept = kept[alive]
        if not alive.all():
            assign = None
    return kept, centroids, max_iterations


def _nearest(points: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per point, the index of its nearest centroid and the squared distance to it."""
    best = np.full(len(points), np.inf)
    which = np.zeros(len(points), dtype=np.int64)
    for j, c in enumerate(centroids):
        d2 = ((points - c) ** 2).sum(axis=1)
        closer = d2 < best
        best[closer] = d2[closer]
        which[closer] = j
    return which, best


def inertia(points: np.ndarray, centroids: np.ndarray) -> float:
    """Σ over points of the squared distance to the nearest centroid."""
    return float(_nearest(points, centroids)[1].sum())


def match_shift(a: np.ndarray, b: np.ndarray) -> float:
    """The largest distance between matched centroids of ``a`` and ``b``.

    Centroids are matched by the pairing with the least total distance (every pairing up
    to 8 centroids, else greedy); inf when the counts differ.
    """
    if len(a) != len(b):
        return float("inf")
    if len(a) == 0:
        return 0.0
    dist = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2))
    if len(a) <= 8:
        best = min(itertools.permutations(range(len(b))),
                   key=lambda p: sum(dist[i, j] for i, j in enumerate(p)))
        return float(max(dist[i, j] for i, j in enumerate(best)))
    free, worst = set(range(len(b))), 0.0
    for i in np.argsort(dist.min(axis=1)):
        j = min(free, key=lambda j: dist[i, j])
        free.discard(j)
        worst = max(worst, float(dist[i, j]))
    return worst


def kmeans_metrics(answer: pa.Table, points: np.ndarray,
                   batch_centroids: np.ndarray) -> dict[str, float]:
    """``centroid_shift`` and ``inertia_ratio`` of ``answer``'s centroids against batch k-means."""
    mine = np.column_stack([np.asarray(answer.column(c).to_pylist(), dtype=float)
                            for c in ("x", "y")]) if answer.num_rows else np.zeros((0, 2))
    ratio = inertia(points, mine) / inertia(points, batch_centroids) if len(mine) else float("inf")
    return {"centroid_shift": match_shift(mine, batch_centroids), "inertia_ratio": ratio}


class Exact:
    """The exact answer on the data so far, and the metrics of an answer against it."""

    def __init__(self, name: str, compiled: CompiledProgram, view: str):
        self.name = name
        self.plan = compiled.plan(view)
        self.iterations = 0
        self._nodes = self._ranks = self._points = self._centroids = None

    def update(self, live: pa.Table) -> None:
        if self.name == "pagerank":
            src = np.asarray(live.column("src").to_pylist(), dtype=np.int64)
            dst = np.asarray(live.column("dst").to_pylist(), dtype=np.int64)
            self._nodes, self._ranks, self.iterations = pagerank_exact(src, dst)
        else:
            from incr.oracle import oracle_answer

            self._points = np.column_stack([live.column(c).to_numpy() for c in ("x", "y")])
            init = oracle_answer(self.plan.iteration.initial_written, {"points": live})
            init = init.sort_by(self.plan.iteration.key)
            start = np.column_stack([np.asarray(init.column(c).to_pylist(), dtype=float)
                                     for c in ("x", "y")])
            _, self._centroids, self.iterations = lloyd(self._points, start)

    def metrics(self, answer: pa.Table) -> dict[str, float]:
        if self.name == "pagerank":
            return pagerank_metrics(answer, self._nodes, self._ranks)
        return kmeans_metrics(answer, self._points, self._centroids)


# -- one run ---------------------------------------------------------------------------------
@dataclass
class BatchRow:
    """One measured batch of one run."""

    name: str
    size: int
    batch: int
    kind: str
    initial_rows: int
    rows: int
    incremental_s: float
    recompute_s: float | None
    moves: int
    dx_rows: int
    dx_trace: str
    recompute_moves: int | None
    answer_rows: int
    exact_iterations: int
    metrics: dict[str, float] = field(default_factory=dict)
    recompute_metrics: dict[str, float] = field(default_factory=dict)
    check: str = ""
    load1: float = 0.0

    @property
    def speedup(self) -> float:
        return self.recompute_s / self.incremental_s if self.recompute_s and self.incremental_s \
            else float("nan")

    def record(self) -> dict[str, object]:
        d = {k: v for k, v in asdict(self).items() if k not in ("metrics", "recompute_metrics")}
        d["speedup"] = self.speedup
        d.update(self.metrics)
        d.update({f"recompute_{k}": v for k, v in self.recompute_metrics.items()})
        return d


@dataclass
class IterSeries:
    size: int
    rows: list[BatchRow] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def _program(spec: Spec, iterations: int | None = None,
             tolerance: float | None = None) -> CompiledProgram:
    """The example program, with ITERATIONS and TOLERANCE replaced when given."""
    from incr.compiler import compile_program, compile_text

    path = EXAMPLES / spec.program
    if iterations is None and tolerance is None:
        return compile_program(path)
    text = path.read_text()
    n = iterations
    text, found = re.subn(r"\bITERATIONS\s+(\d+)(\s+TOLERANCE\s+[-+0-9.eE]+)?",
                          lambda m: f"ITERATIONS {n if n is not None else m.group(1)}"
                          + (f" TOLERANCE {tolerance!r}" if tolerance is not None
                             else m.group(2) or ""), text)
    assert found == 1, f"{path} has {found} ITERATIONS clauses"
    return compile_text(text, path=str(path), name=path.stem)


def _trace(runtime) -> dict:
    return runtime.log[-1] if runtime.log else {"moves": 0, "dx_rows": []}


def run_iterative_series(spark: SparkSession, spec: Spec, label: str, work: Path, initial: int,
                         size: int, increments: int, deletes: bool = False,
                         nodes: int = DEFAULT_NODES, new_nodes: int = DEFAULT_NEW_NODES,
                         recompute: bool = True, accuracy: bool = True, check: bool = False,
                         keep_work: bool = False, iterations: int | None = None,
                         tolerance: float | None = None,
                         log: TextIO | None = None) -> IterSeries:
    """Lands one run's data in ``work`` and measures every batch (see the module doc)."""
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    shutil.rmtree(work, ignore_errors=True)
    landing, warehouse = work / "landing", work / "warehouse"
    steps = make_steps(spec.name, initial, size, increments, deletes, nodes, new_nodes)
    land_steps(steps, landing, spec.table)
    compiled = _program(spec, iterations, tolerance)
    plan = compiled.plan(spec.view)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    pipeline.register()
    seq = {b.path: b.seq for b in pipeline.ledger.batches()}
    exact = Exact(spec.name, compiled, spec.view)
    series = IterSeries(size)
    if log:
        what = (f"{initial:,} initial points, {increments} batches of {size:,} points"
                if spec.name == "kmeans" else
                f"{initial:,} initial edges on {nodes:,} node ids, {increments} batches of "
                f"{new_nodes} new nodes / {size:,} edges")
        print(f"\n{label}: {what}", file=log)
        print(f"{'bat':>3} {'kind':<6} {'rows':>9} {'incr_s':>7} {'recomp_s':>8} {'rec/inc':>7} "
              f"{'moves':>5} {'ΔX rows':>8}  accuracy (incr | recompute)", file=log, flush=True)
    for step in steps:
        t0 = time.perf_counter()
        report = pipeline.run(through=seq[step.file])
        incremental = time.perf_counter() - t0
        if report.rejected is not None:
            raise report.rejected
        trace = _trace(pipeline.views[spec.view])
        answer, _ = read_answer(warehouse, plan)
        live = live_after(steps[: step.index + 1])
        recompute_s = recompute_moves = recomputed = None
        if recompute:
            recompute_s, recompute_moves, recomputed = _recompute(
                spark, compiled, spec, work / "recompute" / f"{step.index:04d}", live, keep_work)
        row = BatchRow(label, size, step.index, step.kind, initial, step.rows, incremental,
                       recompute_s, trace["moves"], sum(trace["dx_rows"]),
                       "|".join(str(n) for n in trace["dx_rows"]), recompute_moves,
                       answer.num_rows, 0, load1=os.getloadavg()[0])
        if accuracy:
            exact.update(live)
            row.exact_iterations = exact.iterations
            row.metrics = exact.metrics(answer)
            if recomputed is not None:
                row.recompute_metrics = exact.metrics(recomputed)
        if check and recomputed is not None:
            problem = _check(plan, spec, live, recomputed)
            row.check = "ok" if problem is None else "MISMATCH"
            if problem:
                series.mismatches.append(f"size {size}, batch {step.index}: {problem}")
        series.rows.append(row)
        if log:
            _print_row(row, spec, log)
    return series


def _recompute(spark: SparkSession, compiled: CompiledProgram, spec: Spec, folder: Path,
               live: pa.Table, keep_work: bool) -> tuple[float, int, pa.Table]:
    """The view from scratch over ``live`` as one file: (seconds, moves, answer)."""
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    shutil.rmtree(folder, ignore_errors=True)
    (folder / "landing" / spec.table).mkdir(parents=True)
    pq.write_table(live, folder / "landing" / spec.table / "0000.parquet")
    t0 = time.perf_counter()
    pipeline = Pipeline(compiled, folder / "landing", folder / "warehouse", spark=spark)
    report = pipeline.run()
    seconds = time.perf_counter() - t0
    if report.rejected is not None:
        raise report.rejected
    answer, _ = read_answer(folder / "warehouse", compiled.plan(spec.view))
    moves = _trace(pipeline.views[spec.view])["moves"]
    if not keep_work:
        shutil.rmtree(folder, ignore_errors=True)
    return seconds, moves, answer


#: With a TOLERANCE τ, how far (relative, in L1) the answer may be from the plain iteration.
#: Each move leaves at most τ·max(|x|, 1) per value unpropagated; PageRank's step shrinks a
#: difference in L1 by its damping q = 0.85 per move, so the differences add up to at most
#: τ/(1-q) ≈ 6.7·τ of Σ max(|x|, 1).  10·τ leaves room for rounding.
TOLERANCE_FACTOR = 10


def _check(plan, spec: Spec, live: pa.Table, answer: pa.Table) -> str | None:
    """The recompute's answer against DuckDB running the program's SQL (ITERATIONS steps).

    Without a TOLERANCE every value must agree within 1e-9 (relative); with one, the float
    values' L1 distance must stay within :data:`TOLERANCE_FACTOR`·τ of their L1 size, since
    changes below τ are deliberately not propagated.  Keys and other values agree exactly.
    """
    from incr.oracle import oracle_iterate

    expected = oracle_iterate(plan, {spec.table: live})
    key = plan.iteration.key
    if expected.num_rows != answer.num_rows:
        return f"{answer.num_rows} rows, DuckDB has {expected.num_rows}"
    exp_rows = {r[key]: r for r in expected.to_pylist()}
    tolerance = plan.iteration.tolerance
    worst = distance = size = 0.0
    for r in answer.to_pylist():
        e = exp_rows.get(r[key])
        if e is None:
            return f"key {r[key]} is not in DuckDB's answer"
        for c, v in r.items():
            if isinstance(v, float) or isinstance(e[c], float):
                worst = max(worst, abs(v - e[c]) / max(abs(e[c]), 1.0))
                distance += abs(v - e[c])
                size += max(abs(e[c]), 1.0)
            elif v != e[c]:
                return f"key {r[key]}: {c} = {v}, DuckDB has {e[c]}"
    if tolerance > 0:
        allowed = TOLERANCE_FACTOR * tolerance
        relative = distance / size if size else 0.0
        return None if relative <= allowed else (
            f"values differ by {relative:.3g} in L1, relative (allowed {allowed:g}; "
            f"largest single difference {worst:.3g})")
    return None if worst <= 1e-9 else f"values differ by {worst:.3g} relative (allowed 1e-9)"


def _fmt_metrics(spec: Spec, m: dict[str, float]) -> str:
    if not m:
        return "-"
    if spec.name == "kmeans":
        return f"shift {m['centroid_shift']:.2g} inertia× {m['inertia_ratio']:.6f}"
    return f"L1/node {m['l1_per_node']:.2e} top100 {m['top100_overlap']:.2f}"


def _print_row(r: BatchRow, spec: Spec, log: TextIO) -> None:
    rec = f"{r.recompute_s:8.2f}" if r.recompute_s is not None else f"{'-':>8}"
    print(f"{r.batch:>3} {r.kind:<6} {r.rows:>9,} {r.incremental_s:7.2f} {rec} "
          f"{r.speedup:7.2f} {r.moves:>5} {r.dx_rows:>8,}  {_fmt_metrics(spec, r.metrics)} | "
          f"{_fmt_metrics(spec, r.recompute_metrics)} {r.check}", file=log, flush=True)


# -- outputs ---------------------------------------------------------------------------------
def write_csv(path: Path, rows: list[BatchRow]) -> None:
    """One row per batch with :data:`COLUMNS` (metrics that do not apply left empty)."""
    write_records(path, COLUMNS, [r.record() for r in rows], general=True)


def read_csv(path: Path) -> list[dict[str, object]]:
    """The rows of a CSV written by :func:`write_csv`, numbers parsed (empty → None)."""
    out = []
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh):
            row: dict[str, object] = {}
            for k, v in rec.items():
                if k in ("name", "kind", "check", "dx_trace"):
                    row[k] = v
                elif v == "":
                    row[k] = None
                elif k in ("size", "batch", "initial_rows", "rows", "moves", "dx_rows",
                           "recompute_moves", "answer_rows", "exact_iterations"):
                    row[k] = int(v)
                else:
                    row[k] = float(v)
            out.append(row)
    return out


def markdown(rows: list[dict[str, object]], name: str) -> str:
    """Per size, a Markdown table of times, moves and accuracy per batch."""
    parts = []
    unit = "points" if name == "kmeans" else "edges"
    for size in sorted({r["size"] for r in rows}):
        run = [r for r in rows if r["size"] == size]
        parts.append(f"**Batches of {size:,} {unit}** ({run[0]['initial_rows']:,} initial "
                     f"{unit}); seconds:\n")
        if name == "kmeans":
            head = ("| batch | kind | rows | incr | recompute | recompute/incr | moves | ΔX rows | "
                    "centroid shift | inertia ratio | recompute: shift | recompute: inertia ratio "
                    "| load |")
        else:
            head = ("| batch | kind | rows | incr | recompute | recompute/incr | moves | ΔX rows | "
                    "nodes | L1 | L1/node | top-100 overlap | recompute: L1/node | "
                    "recompute: top-100 | load |")
        parts.append(head)
        parts.append("|" + "---:|" * (head.count("|") - 1))
        for r in run:
            rec = "–" if r["recompute_s"] is None else f"{r['recompute_s']:.2f}"
            ratio = "–" if r["speedup"] is None else f"{r['speedup']:.1f}×"
            common = (f"| {r['batch']} | {r['kind']} | {r['rows']:,} | {r['incremental_s']:.2f} | "
                      f"{rec} | {ratio} | {r['moves']} | {r['dx_rows']:,} | ")
            if name == "kmeans":
                parts.append(common + f"{_g(r['centroid_shift'])} | {_r(r['inertia_ratio'])} | "
                             f"{_g(r['recompute_centroid_shift'])} | "
                             f"{_r(r['recompute_inertia_ratio'])} | {r['load1']:.1f} |")
            else:
                parts.append(common + f"{r['answer_rows']:,} | {_g(r['l1'])} | "
                             f"{_g(r['l1_per_node'])} | {_r(r['top100_overlap'], 2)} | "
                             f"{_g(r['recompute_l1_per_node'])} | "
                             f"{_r(r['recompute_top100_overlap'], 2)} | {r['load1']:.1f} |")
        parts.append("")
    return "\n".join(parts)


def _g(v: object) -> str:
    return "–" if v is None else f"{v:.2e}"


def _r(v: object, digits: int = 9) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def summary(rows: list[BatchRow]) -> dict[str, dict]:
    """Per size: median times over the increments, the last batch's ratio and errors."""
    out = {}
    for size in sorted({r.size for r in rows}):
        run = sorted((r for r in rows if r.size == size), key=lambda r: r.batch)
        incs = [r for r in run if r.batch > 0]
        last = run[-1]
        rec = [r.recompute_s for r in incs if r.recompute_s is not None]
        out[str(size)] = {
            "initial_incr_s": round(run[0].incremental_s, 3),
            "initial_recompute_s": None if run[0].recompute_s is None
            else round(run[0].recompute_s, 3),
            "median_incr_s": round(statistics.median(r.incremental_s for r in incs), 3)
            if incs else None,
            "median_recompute_s": round(statistics.median(rec), 3) if rec else None,
            "median_recompute_over_incr": round(statistics.median(r.speedup for r in incs), 2)
            if rec else None,
            "last_batch": last.batch,
            "last_recompute_over_incr": None if last.recompute_s is None
            else round(last.speedup, 2),
            "median_moves": statistics.median(r.moves for r in incs) if incs else None,
            "metrics_by_batch": {m: [r.metrics.get(m) for r in run]
                                 for m in (run[0].metrics or {})},
            "recompute_metrics_by_batch": {m: [r.recompute_metrics.get(m) for r in run]
                                           for m in (run[0].recompute_metrics or {})},
        }
    return out


def run_iterative(name: str, out: Path, initial: int | None = None,
                  sizes: tuple[int, ...] | None = None, *, increments: int = 9,
                  deletes: bool = False, nodes: int | None = None,
                  new_nodes: int | None = None, recompute: bool = True, check: bool = False,
                  keep_work: bool = False, warm_up: bool = True, iterations: int | None = None,
                  tolerance: float | None = None, spark: SparkSession | None = None,
                  log: TextIO | None = sys.stdout,
                  command: str | None = None) -> int:
    """Runs ``kmeans`` or ``pagerank`` (``pagerank-deletes``) for every size; writes the outputs.

    Returns:
        0 on success, 1 when ``check`` found the recompute differing from DuckDB, 2 for an
        unknown name or incompatible options.
    """
    base = name.removesuffix(DELETES_SUFFIX)
    deletes = deletes or name.endswith(DELETES_SUFFIX)
    if base not in SPECS:
        print(f"error: unknown iterative benchmark {name}; known: kmeans, pagerank, "
              f"pagerank-deletes", file=sys.stderr)
        return 2
    if deletes and base == "kmeans":
        print("error: k-means points are insert-only (the program declares points append-only, "
              "as the paper's Algorithm 1 keeps old points' assignments); --deletes is for "
              "pagerank", file=sys.stderr)
        return 2
    if base == "kmeans" and (nodes is not None or new_nodes is not None):
        print("error: --nodes and --new-nodes are PageRank settings", file=sys.stderr)
        return 2
    spec = SPECS[base]
    label = base + (DELETES_SUFFIX if deletes else "")
    initial = spec.initial if initial is None else initial
    sizes = tuple(sizes) if sizes else spec.sizes
    nodes = DEFAULT_NODES if nodes is None else nodes
    new_nodes = DEFAULT_NEW_NODES if new_nodes is None else new_nodes
    if spark is None:
        from incr.runtime.session import spark_session

        spark = spark_session()
    out.mkdir(parents=True, exist_ok=True)
    before = machine_info(spark)
    work_root = out / f"{label}-work"
    t_start = time.perf_counter()
    if warm_up:
        # The first Spark jobs, Delta tables and iterate moves of a fresh JVM carry a one-off
        # cost; a tiny unrecorded run takes it so the initial load is measured like the rest.
        tiny = {"initial": 300, "size": 50} if base == "kmeans" else \
            {"initial": 120, "size": 10, "nodes": 40, "new_nodes": 5}
        run_iterative_series(spark, spec, label, work_root / "warm-up", increments=0,
                             recompute=False, accuracy=False, iterations=iterations,
                             tolerance=tolerance, log=None,
                             **tiny)  # type: ignore[arg-type]
    all_series = []
    for size in sizes:
        work = work_root / f"size-{size}"
        all_series.append(run_iterative_series(
            spark, spec, label, work, initial, size, increments, deletes, nodes, new_nodes,
            recompute=recompute, check=check, keep_work=keep_work, iterations=iterations,
            tolerance=tolerance, log=log))
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    if not keep_work:
        shutil.rmtree(work_root, ignore_errors=True)
    rows = [r for s in all_series for r in s.rows]
    write_csv(out / f"{label}.csv", rows)
    parsed = read_csv(out / f"{label}.csv")
    from incr.bench.plot import plot_iterative

    plan = _program(spec, iterations, tolerance).plan(spec.view)
    plot_iterative(parsed, out / f"{label}.png", iterative_title(
        label, parsed, plan.iteration.iterations, plan.iteration.tolerance))
    (out / f"{label}.md").write_text(markdown(parsed, base))
    meta = {
        "benchmark": label, "command": command, "program": f"sql/examples/{spec.program}",
        "view": spec.view, "iterations": plan.iteration.iterations,
        "iterations_overridden": iterations is not None,
        "tolerance": plan.iteration.tolerance,
        "tolerance_overridden": tolerance is not None,
        "initial_rows": initial, "sizes": list(sizes), "increments": increments,
        "deletes": deletes, "recompute": recompute, "check": check,
        "nodes": nodes if base == "pagerank" else None,
        "new_nodes": new_nodes if base == "pagerank" else None,
        "data": _data_note(base, deletes),
        "exact": ("Lloyd's algorithm on all points so far from the INITIAL centroids, until no "
                  "assignment changes" if base == "kmeans" else
                  f"the program's formula iterated from 1.0 until max change < {EXACT_TOL:g}"),
        "machine": before, "load_after": machine_info(spark)["loadavg"],
        "wall_s": round(time.perf_counter() - t_start, 1),
        "mismatches": [m for s in all_series for m in s.mismatches],
        "summary": summary(rows),
    }
    (out / f"{label}.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    if log:
        print(f"\nwrote {out / (label + '.csv')}, {label}.png, {label}.md, {label}.json "
              f"({meta['wall_s']:.0f} s)", file=log)
        for size, s in meta["summary"].items():
            print(f"size {size}: median incr {s['median_incr_s']} s, median recompute "
                  f"{s['median_recompute_s']} s, recompute/incr median "
                  f"{s['median_recompute_over_incr']}×", file=log)
        if meta["mismatches"]:
            print("MISMATCH: " + "; ".join(meta["mismatches"]), file=log)
    return 1 if meta["mismatches"] else 0


def _data_note(base: str, deletes: bool) -> str:
    if base == "kmeans":
        return "points uniform in [2,4]x[2,4], [2,4]x[6,8], [6,8]x[2,4], [6,8]x[6,8]"
    note = (f"R-MAT a,b,c,d = {RMAT}; distinct edges, no self-loops; each increment links "
            f"its new nodes to existing ones (R-MAT-picked), either direction")
    if deletes:
        note += f"; every {DELETE_EVERY}rd increment deletes that many live edges instead"
    return note


def iterative_title(label: str, rows: list[dict[str, object]], iterations: int,
                    tolerance: float) -> str:
    """The figure's title.

    The program (with the ITERATIONS and TOLERANCE run), the data and how to read it.
    """
    first = rows[0]
    loop = f"ITERATIONS {iterations}" + (f", TOLERANCE {tolerance:g}" if tolerance else "")
    if label.startswith("kmeans"):
        what = (f"{label}: k-means, sql/examples/kmeans.sql (4 centroids, {loop})\n"
                f"{first['initial_rows']:,} initial points in 4 squares; exact = batch k-means "
                f"(Lloyd) on all points so far")
    else:
        what = (f"{label}: PageRank, sql/examples/pagerank.sql ({loop})\n"
                f"R-MAT graph, {first['initial_rows']:,} initial edges"
                + (", every 3rd batch deletes edges" if "-deletes" in label else "")
                + "; exact = ranks iterated to convergence")
    return what + "\ntop: time per batch (lower is better); bottom: error against the exact answer"

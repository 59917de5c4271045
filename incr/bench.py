"""``incr bench NAME``: the seed paper's experiments (§11), incremental against full recompute.

Data is generated deterministically; an initial load then nine equal increments land as
Parquet, and :func:`incr.runtime.replay.replay` applies them one at a time, timing each
against recomputing the view from all data on the same Spark session (and, with
``--check``, comparing every answer with DuckDB).  Results go to ``--out DIR/NAME.csv``.

* ``groupby``: ``SELECT x, AVG(y) FROM S GROUP BY x``, pairs of random integers in [0, 10000];
* ``joingroupby``: the §2 shape over two streams, ``SELECT x.A, SUM(y.B) FROM X x JOIN Y y
  ON x.C = y.C GROUP BY x.A``, increments landing in both.

Still to come (issue: benchmarks): the Structured Streaming peer, plots, deletions.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PROGRAMS = {
    "groupby": """-- incr: buckets = 8
CREATE TABLE s (x BIGINT, y BIGINT);
CREATE VIEW groupby AS SELECT x, AVG(y) AS avg_y FROM s GROUP BY x;
""",
    "joingroupby": """-- incr: buckets = 8
CREATE TABLE xs (a BIGINT, c BIGINT);
CREATE TABLE ys (b BIGINT, c BIGINT);
CREATE VIEW joingroupby AS SELECT xs.a, SUM(ys.b) AS total FROM xs JOIN ys ON xs.c = ys.c GROUP BY xs.a;
""",
}
COLUMNS = {"s": ("x", "y"), "xs": ("a", "c"), "ys": ("b", "c")}


def land(landing: Path, name: str, initial: int, increment: int, increments: int = 9,
         seed: int = 11) -> None:
    """Writes the initial load and the increments of benchmark ``name``."""
    rng = np.random.default_rng(seed)
    tables = ["s"] if name == "groupby" else ["xs", "ys"]
    for step in range(increments + 1):
        rows = initial if step == 0 else increment
        for table in tables:
            folder = landing / table
            folder.mkdir(parents=True, exist_ok=True)
            cols = {c: pa.array(rng.integers(0, 10_001, rows), pa.int64()) for c in COLUMNS[table]}
            pq.write_table(pa.table(cols), folder / f"{step:04d}.parquet")


def run_bench(name: str, out: Path, initial: int, increment: int, check: bool) -> int:
    """Runs benchmark ``name``; writes ``out/NAME.csv``; returns the exit code."""
    from incr.compiler import compile_text
    from incr.runtime.replay import replay
    from incr.runtime.session import spark_session

    if name not in PROGRAMS:
        print(f"error: unknown benchmark {name}; known: {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    work = out / f"{name}-work"
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    land(work / "landing", name, initial, increment)
    compiled = compile_text(PROGRAMS[name], path=f"{name}.sql", name=name)
    rows = replay(compiled, work / "landing", work / "warehouse", spark_session(),
                  out=sys.stdout, check=check)
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{name}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["increment", "batch", "table", "size", "initial_rows", "rows", "incremental_s",
                    "recompute_s"])
        tables_per_step = 1 if name == "groupby" else 2
        for r in rows:
            w.writerow([r.batch // tables_per_step, r.batch, r.path.split("/")[0],
                        increment, initial, r.rows, f"{r.incremental_s:.3f}", f"{r.recompute_s:.3f}"])
    bad = [r for r in rows if r.mismatches]
    print(f"wrote {out / (name + '.csv')}")
    return 1 if bad else 0

"""A finer state and coarser views whose WHERE reads only its keys (share = rollup).

The sales stream of ``incr bench sharing`` (200,000 rows, then 12 increments of 1,000, every
third a delete); prints the oracle's verdict, the state tables and the seconds per run.
Run from the repository: ``PYTHONPATH=. .venv/bin/python docs/bench/issue18/sifted/sift.py OUT``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from incr.bench import sharing
from incr.compiler import compile_text
from incr.runtime.pipeline import Pipeline
from incr.runtime.session import spark_session

P = sharing.PRODUCTS
VIEWS = (
    ("CREATE VIEW fine AS SELECT region, product, SUM(amount) AS revenue, COUNT(*) AS orders "
     "FROM sales GROUP BY region, product;"),
    (f"CREATE VIEW top2 AS SELECT region, SUM(amount) AS revenue, MAX(amount) AS top FROM sales "
     f"WHERE product IN ('{P[0]}', '{P[1]}') GROUP BY region;"),
    (f"CREATE VIEW one AS SELECT region, SUM(amount) AS revenue, COUNT(*) AS orders FROM sales "
     f"WHERE product = '{P[2]}' GROUP BY region;"),
    (f"CREATE VIEW rest AS SELECT region, AVG(amount) AS avg_ticket, MIN(amount) AS low "
     f"FROM sales WHERE product <> '{P[3]}' GROUP BY region;"),
)


def main(out: Path, views: tuple[str, ...] = VIEWS, sources: str = sharing.SOURCES,
         sales: Callable[[pa.Table], pa.Table] | None = None) -> None:
    """Lands the stream under ``out``, applies it run by run, and prints what it measured.

    ``sources``: the program's tables; ``sales``: what each landed sales file becomes (a
    column added), before any run reads it.
    """
    text = "-- incr: buckets = 8\n-- incr: share = rollup\n" + sources + "\n".join(views)
    spark = spark_session()
    shutil.rmtree(out, ignore_errors=True)
    steps = sharing.land(out / "data", 200_000, 1000, 12)
    for step in steps if sales is not None else ():
        path = out / "data" / step.files["sales"]
        pq.write_table(sales(pq.read_table(path)), path)
    compiled = compile_text(text + "\n", path="sift.sql", name="sift")
    shutil.copytree(out / "data", out / "landing")
    pipeline = Pipeline(compiled, out / "landing", out / "warehouse", spark=spark)
    pipeline.register()
    seq = {b.path: b.seq for b in pipeline.ledger.batches()}
    seconds = []
    for step in steps:
        upto = max(seq[p] for p in step.files.values() if p in seq)
        seconds.append(sharing.timed_run(pipeline, upto)[1])
    oracle = sharing.Oracle(sharing.live_tables(out / "data", steps))
    print("differences from the oracle:", oracle.differences(compiled, out / "warehouse"))
    state = out / "warehouse" / "state"
    tables = sorted(p.name for p in state.glob("*/*/*") if p.is_dir() and not p.name.startswith("."))
    print("state tables:", len(tables), tables)
    print(f"median increment {statistics.median(seconds[1:]):.3f} s;",
          " ".join(f"{s:.3f}" for s in seconds))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

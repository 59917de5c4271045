"""A view added to a running program whose views all have a WHERE (share = on).

The sales stream of ``incr bench sharing`` (200,000 rows, then 12 increments of 1,000, every
third a delete), applied by a program of per-region "big ticket" views by region and product,
each ``WHERE region … AND amount > 500``.  After the sixth increment a view for one more
region is added; the run that takes the change (no new batch) is timed, then the six
increments left.  Prints the oracle's verdict, the state tables and the seconds per run.
Run from the repository: ``PYTHONPATH=. .venv/bin/python docs/bench/issue18/added/add.py OUT``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path

from incr.bench import sharing
from incr.compiler import CompiledProgram, compile_text
from incr.runtime.pipeline import Pipeline
from incr.runtime.session import spark_session

BIG = "amount > 500"


def view(name: str, where: str, aggregates: str) -> str:
    """A big-ticket view by region and product, of the rows of ``where`` too."""
    return (f"CREATE VIEW {name} AS SELECT region, product, {aggregates} FROM sales "
            f"WHERE {where} AND {BIG} GROUP BY region, product;")


VIEWS = (
    view("big_north", "region = 'north'", "SUM(amount) AS revenue, COUNT(*) AS orders"),
    view("big_south", "region = 'south'", "SUM(amount) AS revenue, MAX(amount) AS top"),
    view("big_inland", "region NOT IN ('coast', 'islands')", "AVG(amount) AS avg_ticket"),
)
ADDED = view("big_coast", "region IN ('coast', 'islands')",
             "SUM(amount) AS revenue, COUNT(*) AS orders, MAX(amount) AS top")


def program(views: tuple[str, ...]) -> CompiledProgram:
    """The program of ``views`` over the sales stream."""
    text = "-- incr: buckets = 8\n" + sharing.SOURCES + "\n".join(views) + "\n"
    return compile_text(text, path="add.sql", name="add")


def main(out: Path) -> None:
    """Lands the stream under ``out``, applies it, adds a view midway, prints what it measured."""
    spark = spark_session()
    shutil.rmtree(out, ignore_errors=True)
    steps = sharing.land(out / "data", 200_000, 1000, 12)
    shutil.copytree(out / "data", out / "landing")
    before, after = program(VIEWS), program((*VIEWS, ADDED))
    print("state WHERE before / after the view is added:",
          [s.where for s in before.shares], [s.where for s in after.shares])
    pipeline = Pipeline(before, out / "landing", out / "warehouse", spark=spark)
    pipeline.register()
    seq = {b.path: b.seq for b in pipeline.ledger.batches()}
    last = [max(seq[p] for p in step.files.values() if p in seq) for step in steps]
    seconds = [sharing.timed_run(pipeline, upto)[1] for upto in last[:7]]
    pipeline = Pipeline(after, out / "landing", out / "warehouse", spark=spark)
    report, added, _ = sharing.timed_run(pipeline, last[6])
    print(f"the run adding {after.plans[-1].view}: {added:.3f} s, batches applied: "
          f"{[b.seq for b in report.applied]}")
    later = [sharing.timed_run(pipeline, upto)[1] for upto in last[7:]]
    oracle = sharing.Oracle(sharing.live_tables(out / "data", steps))
    print("differences from the oracle:", oracle.differences(after, out / "warehouse"))
    state = out / "warehouse" / "state"
    tables = sorted(p.name for p in state.glob("*/*/*") if p.is_dir() and not p.name.startswith("."))
    print("state tables:", len(tables), tables)
    print(f"initial {seconds[0]:.3f} s; median increment before the view "
          f"{statistics.median(seconds[1:]):.3f} s, after {statistics.median(later):.3f} s")
    print("before:", " ".join(f"{s:.3f}" for s in seconds),
          "| after:", " ".join(f"{s:.3f}" for s in later))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

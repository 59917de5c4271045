"""Time grains over one stream, ``share = rollup`` against ``share = on`` (issue 18).

The eleventh sitting of ``docs/benchmarks.md``: views by day, week, month and year over one
sales stream, with rollup (one state, the coarser views regrouped from the daily one) and
with a state per grouping, and beside them the daily view alone (a program of one view,
the issue's baseline).  The three take each step in turn on one Spark session; each
step's seconds and each view's (fold, answer) seconds are printed, then the medians and
how many answers differ from DuckDB's after the last step::

    .venv/bin/python docs/bench/issue18/grains/grains.py [--no-max] [--trunc] [INITIAL [INCREMENT [N]]]

``--no-max``: the monthly view's MAX is replaced by a COUNT (no bag to regroup).
``--trunc``: the monthly view groups by ``date_trunc('month', day)`` instead of the year and
the month.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from incr.compiler import compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from incr.runtime.session import spark_session

MONTH = "year(day), month(day), region"
VIEWS = f"""CREATE TABLE sales (day DATE, region VARCHAR, amount DOUBLE);
CREATE VIEW daily AS SELECT day, region, SUM(amount) AS revenue, COUNT(*) AS orders,
  MAX(amount) AS top FROM sales GROUP BY day, region;
CREATE VIEW weekly AS SELECT year(day) AS y, weekofyear(day) AS w, SUM(amount) AS revenue
  FROM sales GROUP BY year(day), weekofyear(day);
CREATE VIEW monthly AS SELECT {MONTH}, SUM(amount) AS revenue, MAX(amount) AS top
  FROM sales GROUP BY {MONTH};
CREATE VIEW yearly AS SELECT year(day) AS y, SUM(amount) AS revenue, COUNT(*) AS orders
  FROM sales GROUP BY year(day);
"""
SCHEMA = pa.schema([("day", pa.date32()), ("region", pa.string()), ("amount", pa.float64())])
REGIONS = np.array([f"r{i}" for i in range(8)])
START = np.datetime64("2024-01-01")
DAYS = 1065  # the initial load's days; increments land the last week, moving on


def sales(rng: np.random.Generator, n: int, first: int, last: int) -> pa.Table:
    """``n`` sales on days ``first`` to ``last`` - 1 after START."""
    days = (START + rng.integers(first, last, n).astype("timedelta64[D]")).astype("datetime64[D]")
    return pa.table({"day": pa.array(days).cast(pa.date32()),
                     "region": REGIONS[rng.integers(0, 8, n)],
                     "amount": rng.integers(100, 100_001, n) / 100.0}, schema=SCHEMA)


def steps(initial: int, increment: int, count: int) -> list[tuple[str, pa.Table]]:
    """The load, then ``count`` increments.

    Every third increment deletes a quarter of the rows landed since the last delete.
    """
    rng = np.random.default_rng(7)
    out = [("insert", sales(rng, initial, 0, DAYS))]
    recent: list[pa.Table] = []
    for i in range(1, count + 1):
        if i % 3 == 0:
            pool = pa.concat_tables(recent)
            out.append(("delete", pool.take(rng.choice(pool.num_rows, increment // 4,
                                                       replace=False))))
            recent = []
        else:
            recent.append(sales(rng, increment, DAYS - 7 + i // 2, DAYS + i // 2))
            out.append(("insert", recent[-1]))
    return out


def live_rows(landed: list[tuple[str, pa.Table]]) -> pa.Table:
    """The rows live after every step (bag semantics)."""
    counts: Counter = Counter()
    for kind, rows in landed:
        for row in zip(*(rows.column(n).to_pylist() for n in SCHEMA.names)):
            counts[row] += -1 if kind == "delete" else 1
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r, n in counts.items()
                                 for _ in range(n)], schema=SCHEMA)


def main(argv: list[str]) -> int:
    """Runs both settings step by step and prints what each step took."""
    views = VIEWS
    if "--no-max" in argv:
        views = views.replace("MAX(amount) AS top\n  FROM sales GROUP BY year",
                              "COUNT(*) AS orders\n  FROM sales GROUP BY year")
    if "--trunc" in argv:
        views = views.replace("CREATE VIEW monthly AS SELECT year(day), month(day), region,",
                              "CREATE VIEW monthly AS SELECT date_trunc('month', day) AS m, region,")
        views = views.replace(f"GROUP BY {MONTH}", "GROUP BY date_trunc('month', day), region")
        assert "date_trunc('month', day), region;" in views
    given = [int(a) for a in argv if not a.startswith("--")]
    numbers = given + [1_000_000, 1_000, 9][len(given):]
    landed = steps(*numbers[:3])
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "incr-grains"
    shutil.rmtree(work, ignore_errors=True)
    spark = spark_session()
    runs = {}
    alone = views[:views.index("CREATE VIEW weekly")]
    for share, text in (("rollup", views), ("on", views), ("alone", alone)):
        landing = work / share / "landing"
        for i, (kind, rows) in enumerate(landed):
            folder = landing / "sales" / ("_deletes" if kind == "delete" else "")
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, folder / f"{i:04d}.parquet")
        header = f"-- incr: buckets = 8\n-- incr: share = {'on' if share == 'alone' else share}\n"
        compiled = compile_text(header + text, name="grains")
        pipeline = Pipeline(compiled, landing, work / share / "warehouse", spark=spark)
        pipeline.register()
        runs[share] = (compiled, pipeline, [])
    for i, (kind, _) in enumerate(landed):
        order = list(runs)[i % 3:] + list(runs)[:i % 3]  # who goes first rotates
        for share in order:
            compiled, pipeline, seconds = runs[share]
            start = time.perf_counter()
            report = pipeline.run(through=i)
            seconds.append(time.perf_counter() - start)
            per_view = {m.view: (m.answer_mode, round(m.h_s + m.merge_s, 3), round(m.answer_s, 3))
                        for b in report.applied for m in b.views}
            print(share, i, kind, f"{seconds[-1]:.3f}", per_view, flush=True)
    live = live_rows(landed)
    for share, (compiled, _, seconds) in runs.items():
        differ = [p.view for p in compiled.plans if diff_answers(
            oracle_answer(p.select, {"sales": live}),
            read_answer(work / share / "warehouse", p)[0], ordered=p.ordered) is not None]
        print(f"{share}: load {seconds[0]:.1f} s, median per increment "
              f"{statistics.median(seconds[1:]):.3f} s, answers differing from DuckDB: {differ}")
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

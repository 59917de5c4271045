"""``incr bench regroup``: views regrouped from a finer state when a batch touches few groups.

Under ``-- incr: share = rollup`` a view grouped by some of another view's keys is answered
from that view's state (seed 003's BRR and CMORR, issue 18).  This bench measures what that
costs once the state is large and each batch touches few of the coarse view's groups: the
case a regrouped answer follows by change, recomputing only the touched groups from their
rows of the finer state (:mod:`incr.runtime.answer`), where it used to be rewritten from
the whole state after every batch.

One program of four views over a sales stream of ``(customer, product, amount)``:

* ``by_customer_product``: the finer grouping, whose state the others read;
* ``by_customer``: SUM and COUNT per customer, and ``by_customer_top``: MAX per customer
  (a bag of values, kept exact under deletes), regrouped: a batch of a few hundred rows
  touches a few hundred of ``--groups`` customers;
* ``by_product``: SUM per product, regrouped: every batch touches most of its 20 groups,
  so it is rewritten in every setting.

It runs in three settings, each on its own landing and warehouse, taking each step in turn
on the same Spark session (:data:`SETTINGS`):

* ``change``: ``share = rollup`` with the defaults (a regrouped answer follows by change
  while a batch touches at most ``INCR_ANSWER_MERGE_REACH`` of its groups);
* ``rewrite``: ``share = rollup`` with ``INCR_ANSWER_MERGE_REACH`` 0, so every regrouped
  answer is rewritten from the whole state after every batch (what rollup did before);
* ``on``: ``share = on``, no regrouping: each grouping keeps a state of its own.

Every third increment deletes rows drawn from the live ones.  After the last step every
view of every setting is compared with DuckDB over the live rows; a difference makes the
run exit 1, after its outputs are written (``regroup.csv``, ``regroup.md``, ``regroup.json``
in ``--out``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from incr.bench.machine import machine_info
from incr.bench.sharing import Oracle, Row, begin, state_tables, take_steps, timed_run, write_csv
from incr.bench.workloads import Increment, draw_deletes, is_delete_step
from incr.config import settings
from incr.runtime.landing import DELETE, DELETES_DIR, INSERT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "regroup"
DEFAULT_GROUPS = 50_000
DEFAULT_INITIAL = 1_000_000
DEFAULT_INCREMENT = 200
DEFAULT_INCREMENTS = 6
PRODUCTS = 20
SCHEMA = pa.schema([("customer", pa.int64()), ("product", pa.int64()), ("amount", pa.float64())])
VIEWS = (
    ("CREATE VIEW by_customer_product AS SELECT customer, product, SUM(amount) AS revenue "
     "FROM sales GROUP BY customer, product;\n"),
    ("CREATE VIEW by_customer AS SELECT customer, SUM(amount) AS revenue, COUNT(*) AS orders "
     "FROM sales GROUP BY customer;\n"),
    ("CREATE VIEW by_customer_top AS SELECT customer, MAX(amount) AS top FROM sales "
     "GROUP BY customer;\n"),
    ("CREATE VIEW by_product AS SELECT product, SUM(amount) AS revenue FROM sales "
     "GROUP BY product;\n"),
)
#: Each setting: its share header and the ``INCR_ANSWER_MERGE_REACH`` its runs take (None:
#: the environment's, by default 0.5).
SETTINGS: dict[str, tuple[str, float | None]] = {
    "change": ("rollup", None),
    "rewrite": ("rollup", 0.0),
    "on": ("on", None),
}


def program_text(share: str) -> str:
    """The bench's program with ``-- incr: share = <share>``."""
    return (f"-- incr: buckets = 8\n-- incr: share = {share}\n"
            "CREATE TABLE sales (customer BIGINT, product BIGINT, amount DOUBLE);\n"
            + "".join(VIEWS))


def land(landing: Path, groups: int, initial: int, increment: int,
         increments: int) -> tuple[list[Increment], pa.Table]:
    """Writes the initial sales and the increments; returns the steps and the live rows."""
    rng = np.random.default_rng([zlib.crc32(NAME.encode()), groups, initial, increment])
    live: list[np.ndarray] = []
    steps = []
    for index in range(increments + 1):
        rows = initial if index == 0 else increment
        kind = DELETE if is_delete_step(index, True) else INSERT
        if kind == DELETE:
            codes = draw_deletes(rng, live, rows)
        else:  # customer, product, amount in cents
            codes = np.column_stack([rng.integers(0, groups, rows), rng.integers(0, PRODUCTS, rows),
                                     rng.integers(100, 100_001, rows)]).astype(np.int64)
            live.append(codes)
        step = Increment(index, kind, len(codes))
        folder = landing / "sales" / (DELETES_DIR if kind == DELETE else "")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(codes), folder / step.stem)
        step.files["sales"] = (folder / step.stem).relative_to(landing).as_posix()
        steps.append(step)
    return steps, _table(np.concatenate(live))


def _table(codes: np.ndarray) -> pa.Table:
    return pa.table({"customer": codes[:, 0], "product": codes[:, 1],
                     "amount": codes[:, 2] / 100.0}, schema=SCHEMA)


class Configuration:
    """The program in one of :data:`SETTINGS`, on its own landing and warehouse."""

    def __init__(self, spark: SparkSession, setting: str, work: Path, data: Path):
        from incr.compiler import compile_text
        from incr.runtime.pipeline import Pipeline

        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(data, work / "landing", copy_function=os.link)
        share, reach = SETTINGS[setting]
        config = settings()
        if reach is not None:
            config = replace(config, answer_merge_reach=reach)
        self.setting, self.work, self.warehouse = setting, work, work / "warehouse"
        self.compiled = compile_text(program_text(share), path=f"{NAME}.sql", name=NAME)
        self.pipeline = Pipeline(self.compiled, work / "landing", self.warehouse, spark=spark,
                                 config=config)
        self.pipeline.register()  # every step's file is landed: each run applies through one
        self.seq = {b.path: b.seq for b in self.pipeline.ledger.batches()}
        self.rows: list[Row] = []
        #: How each view's answer was written, counted over the increments.
        self.modes: dict[str, Counter[str]] = {}

    def apply(self, step: Increment, initial: int, log: TextIO | None) -> None:
        """Applies ``step`` in one run, timed end to end, and records its row."""
        report, seconds, parts = timed_run(self.pipeline, self.seq[step.files["sales"]])
        if step.index:
            for batch in report.applied:
                for v in batch.views:
                    self.modes.setdefault(v.view, Counter())[v.answer_mode or "none"] += 1
        self.rows.append(Row(NAME, len(VIEWS), self.setting, step.index, step.kind, initial,
                             step.rows, seconds, parts, state_tables(self.warehouse),
                             load1=os.getloadavg()[0]))
        if log:
            print(f"  {self.setting:<7}: batch {step.index} ({step.kind}, {step.rows:,} rows): "
                  f"{seconds:.2f} s", file=log, flush=True)

    def check(self, oracle: Oracle) -> list[str]:
        """Every view's answer against the oracle; marks the last row ``ok`` or ``MISMATCH``."""
        problems = oracle.differences(self.compiled, self.warehouse)
        self.rows[-1].check = "MISMATCH" if problems else "ok"
        return [f"{self.setting}: {p}" for p in problems]


def summary(configs: list[Configuration]) -> dict:
    """Per setting, what its increments took and how its answers were written.

    The medians per increment (the load left out) and their ratio to ``change``'s, the
    state tables, and the count of each way each view's answer was written.
    """
    out: dict[str, dict] = {}
    for c in configs:
        steps = [r for r in c.rows if r.batch > 0]
        out[c.setting] = {
            "median_s": round(statistics.median(r.seconds for r in steps), 4),
            "answer_s": round(statistics.median(r.parts["answer_s"] for r in steps), 4),
            "merge_s": round(statistics.median(r.parts["merge_s"] for r in steps), 4),
            "load_s": round(c.rows[0].seconds, 2),
            "state_tables": c.rows[-1].state_tables,
            "modes": {view: dict(modes) for view, modes in c.modes.items()},
        }
    base = out["change"]["median_s"]
    for entry in out.values():
        entry["over_change"] = round(entry["median_s"] / base, 2) if base else None
    return out


def markdown(summ: dict, meta: dict) -> str:
    """The summary table and how each view's answer was written, per setting."""
    lines = [f"# {NAME}: views regrouped from a finer state, few groups touched per batch",
             "",
             (f"{meta['initial_rows']:,} initial rows over {meta['groups']:,} customers × "
             f"{PRODUCTS} products; {meta['increments']} increments of {meta['increment']:,} rows "
             f"(every 3rd deletes). Medians per increment, seconds."), "",
             "| setting | increment | answers | MERGE | ÷ change | load | state tables |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for setting, s in summ.items():
        lines.append(f"| {setting} | {s['median_s']:.3f} | {s['answer_s']:.3f} | "
                     f"{s['merge_s']:.3f} | {s['over_change']:.2f}× | {s['load_s']:.1f} | "
                     f"{s['state_tables']} |")
    lines += ["", "How each view's answer was written over the increments:", ""]
    for setting, s in summ.items():
        modes = "; ".join(f"{v} " + ", ".join(f"{m} {n}" for m, n in sorted(c.items()))
                          for v, c in s["modes"].items())
        lines.append(f"- {setting}: {modes}")
    return "\n".join(lines) + "\n"


def run_regroup(out: Path, groups: int = DEFAULT_GROUPS, initial: int = DEFAULT_INITIAL,
                increment: int = DEFAULT_INCREMENT, increments: int = DEFAULT_INCREMENTS, *,
                keep_work: bool = False, spark: SparkSession | None = None,
                log: TextIO | None = sys.stdout, command: str | None = None) -> int:
    """Runs every setting over the same steps; writes the outputs.

    Returns:
        0 when every answer equals the oracle's, 1 when one differs.
    """
    spark, work, before, t_start = begin(out, NAME, spark)
    steps, live = land(work / "data", groups, initial, increment, increments)
    configs = [Configuration(spark, s, work / s, work / "data") for s in SETTINGS]
    rows, mismatches = take_steps(configs, steps, Oracle({"sales": live}), log, keep_work)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    summ = summary(configs)
    write_csv(out / f"{NAME}.csv", rows)
    meta = {"benchmark": NAME, "command": command, "groups": groups, "products": PRODUCTS,
            "initial_rows": initial, "increment": increment, "increments": increments,
            "views": [v.split(" AS ", 1)[0].split()[-1] for v in VIEWS],
            "machine": before, "load_after": machine_info(spark)["loadavg"],
            "wall_s": round(time.perf_counter() - t_start, 1),
            "oracle": {"checked_views": len(SETTINGS) * len(VIEWS), "mismatches": mismatches},
            "summary": summ,
            "settings": {s: {"share": share, "answer_merge_reach":
                             settings().answer_merge_reach if reach is None else reach}
                         for s, (share, reach) in SETTINGS.items()}}
    (out / f"{NAME}.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    (out / f"{NAME}.md").write_text(markdown(summ, meta))
    if log:
        for setting, s in summ.items():
            print(f"{setting:<7}: {s['median_s']:.3f} s per increment (answers {s['answer_s']:.3f} s), "
                  f"{s['over_change']:.2f}× change", file=log)
        print(f"oracle: {meta['oracle']['checked_views']} views checked, "
              f"{len(mismatches)} differ", file=log)
    if mismatches:
        print("MISMATCH against the DuckDB oracle: " + "; ".join(mismatches), file=sys.stderr)
    return 1 if mismatches else 0


def main_args(out: Path, groups: int | None, initial: int | None, increment: int | None,
              increments: int | None, keep_work: bool = False) -> int:
    """The CLI's entry: each setting left out takes this module's default."""
    return run_regroup(out, groups or DEFAULT_GROUPS, initial or DEFAULT_INITIAL,
                       increment or DEFAULT_INCREMENT,
                       DEFAULT_INCREMENTS if increments is None else increments,
                       keep_work=keep_work, command="incr " + " ".join(sys.argv[1:]))

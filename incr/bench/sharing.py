"""``incr bench sharing``: many views over one stream, with the share pass on, off and rolling up (issue 18).

Issue 18 ("many views, one pass"): views of one program that read the same source with the
same GROUP BY keep **one** state (one fold and one MERGE per batch), and each view's answer
is computed from it (a view with a WHERE of its own reads its aggregates of the rows the
WHERE keeps).  The header line ``-- incr: share = on`` (the
default) or ``share = off`` switches it, and ``share = rollup`` also answers views grouped by
some of another view's keys from that view's state, regrouped (BRR, CMORR).  This benchmark
measures what each saves: the time of an increment as the number of views grows, with
sharing on, off and rolling up, in one run on one SparkSession, so the ratios compare like
with like.

**The program** declares a fact stream ``sales(region, product, customer, amount, qty)`` and
a small dimension ``customers(customer, segment)``; its views are the first N of
:data:`CATALOGUE`, a fixed list of 20 ordered so every prefix is a mix of the shapes of the
HIFUN rewriting rules (seed 003, §3.2): the same grouping and measure under other aggregates
(CGMRR), the same grouping over other measures (CGRR), the same measure and aggregate under
another grouping (CMORR), a finer grouping (BRR), plus a view with another WHERE (the
grouping's state restricted to its rows) and three views over one join
``sales JOIN customers USING (customer)``.

**The data** (numpy, seeded by the sizes: the same files for every configuration) is an
initial load of ``initial`` sales rows (and the 2,000 customers, landed once), then
``increments`` increments of ``increment`` rows; every third increment deletes that many
rows drawn from the live ones (landed under ``sales/_deletes/``).

**Per N**, three programs (:data:`SETTINGS`: sharing on, off and rollup), each on a fresh
landing (hard links to the generated files) and warehouse; ``Pipeline.run(through=…)``
applies one step at a time, timed end to end (wall clock), with incr's own breakdown from
its batch reports.  They take each step in turn, the first of them rotating, so load from
elsewhere on the machine falls on all alike.  After the last increment every view's answer
is compared with the DuckDB oracle (:mod:`incr.oracle`) over the live rows; any difference
makes the run exit 1, after its outputs are written.

**Each view alone** then: the first N of the largest N, each as a program of its own
(:data:`ALONE`), taking the steps in turn as above.  A program of N views does at least the
work of each of them, so the costliest of them alone is a floor no sharing goes below; the
summary gives it as a ratio to the first view alone (the same program as one view with
sharing on, measured beside the others), says whether the target is within reach of it,
and what N programs of one view each take.

A tiny unrecorded run of the largest N, in every setting, first warms the JVM and the
driver's SQL translations, so the first configuration does not carry one-off costs the
others are spared.

Outputs in ``--out DIR``:

* ``sharing.csv``: one row per configuration and step (:data:`COLUMNS`);
* ``sharing.png``: median time per increment against N, one line per setting and the
  floor (:func:`incr.bench.plot.plot_sharing`);
* ``sharing.md``: the summary table, the catalogue, each view alone and every step;
* ``sharing.json``: machine, settings, command line, the summary (per N: the medians, their
  ratios to the smallest N, and whether sharing keeps N views within :data:`TARGET` of
  one view, judged only when the smallest N is one) and the oracle's verdicts.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from incr.bench.machine import machine_info
from incr.bench.results import write_records
from incr.bench.runner import breakdown
from incr.bench.workloads import DELETE_EVERY, Increment, draw_deletes, is_delete_step
from incr.runtime.landing import DELETE, DELETES_DIR, INSERT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.compiler import CompiledProgram
    from incr.runtime.pipeline import Pipeline, RunReport

NAME = "sharing"
DEFAULT_VIEWS = (1, 2, 5, 10, 20)
DEFAULT_INITIAL = 200_000
DEFAULT_INCREMENT = 1_000
DEFAULT_INCREMENTS = 5
#: Issue 18's target: N views within this factor of one view's time per increment, sharing on.
TARGET = 1.5
REGIONS = ("north", "south", "east", "west", "central", "coast", "mountain", "islands")
PRODUCTS = tuple(f"p{i:02d}" for i in range(50))
SEGMENTS = ("consumer", "corporate", "home office", "small business")
CUSTOMERS = 2_000
SOURCES = """CREATE TABLE sales (region VARCHAR, product VARCHAR, customer BIGINT, amount DOUBLE,
                    qty BIGINT);
CREATE TABLE customers (customer BIGINT, segment VARCHAR);
"""
SALES_SCHEMA = pa.schema([("region", pa.string()), ("product", pa.string()),
                          ("customer", pa.int64()), ("amount", pa.float64()),
                          ("qty", pa.int64())])


@dataclass(frozen=True)
class SharedView:
    """A view of the catalogue: its name, the rule shape it adds, and its SELECT."""

    name: str
    shape: str
    select: str


_JOIN = "FROM sales JOIN customers USING (customer)"
#: The views, in the order N takes them: view 1 alone, then each prefix a mix of shapes.
CATALOGUE: tuple[SharedView, ...] = (
    SharedView("region_revenue", "base",
               "SELECT region, SUM(amount) AS revenue FROM sales GROUP BY region"),
    SharedView("region_orders", "CGMRR",
               "SELECT region, COUNT(*) AS orders FROM sales GROUP BY region"),
    SharedView("region_avg_ticket", "CGMRR",
               "SELECT region, AVG(amount) AS avg_ticket FROM sales GROUP BY region"),
    SharedView("product_revenue", "CMORR",
               "SELECT product, SUM(amount) AS revenue FROM sales GROUP BY product"),
    SharedView("segment_revenue", "join",
               f"SELECT segment, SUM(amount) AS revenue {_JOIN} GROUP BY segment"),
    SharedView("region_units", "CGRR",
               "SELECT region, SUM(qty) AS units FROM sales GROUP BY region"),
    SharedView("region_max_ticket", "CGMRR",
               "SELECT region, MAX(amount) AS max_ticket FROM sales GROUP BY region"),
    SharedView("region_product_revenue", "BRR",
               "SELECT region, product, SUM(amount) AS revenue FROM sales "
               "GROUP BY region, product"),
    SharedView("region_big_tickets", "filter",
               "SELECT region, COUNT(*) AS orders, SUM(amount) AS revenue FROM sales "
               "WHERE amount > 500 GROUP BY region"),
    SharedView("segment_customers", "join",
               f"SELECT segment, COUNT(DISTINCT customer) AS customers {_JOIN} GROUP BY segment"),
    SharedView("region_min_ticket", "CGMRR",
               "SELECT region, MIN(amount) AS min_ticket FROM sales GROUP BY region"),
    SharedView("region_value", "CGRR",
               "SELECT region, SUM(amount * qty) AS value FROM sales GROUP BY region"),
    SharedView("region_customers", "CGRR",
               "SELECT region, COUNT(DISTINCT customer) AS customers FROM sales GROUP BY region"),
    SharedView("product_units", "CMORR",
               "SELECT product, SUM(qty) AS units FROM sales GROUP BY product"),
    SharedView("region_avg_units", "CGMRR",
               "SELECT region, AVG(qty) AS avg_units FROM sales GROUP BY region"),
    SharedView("segment_avg_ticket", "join",
               f"SELECT segment, AVG(amount) AS avg_ticket {_JOIN} GROUP BY segment"),
    SharedView("region_products", "CGRR",
               "SELECT region, COUNT(DISTINCT product) AS products FROM sales GROUP BY region"),
    SharedView("product_avg_ticket", "CMORR",
               "SELECT product, AVG(amount) AS avg_ticket FROM sales GROUP BY product"),
    SharedView("region_product_units", "BRR",
               "SELECT region, product, SUM(qty) AS units FROM sales GROUP BY region, product"),
    SharedView("region_max_value", "CGRR",
               "SELECT region, MAX(amount * qty) AS max_value FROM sales GROUP BY region"),
)
#: What each shape shares with the views before it (the HIFUN rewriting rules, seed 003 §3.2).
SHAPES = {
    "base": "the first view",
    "CGMRR": "same grouping and measure, another aggregate",
    "CGRR": "same grouping, another measure",
    "CMORR": "same measure and aggregate, another grouping",
    "BRR": "a finer grouping (region, product)",
    "filter": "another WHERE: the same grouping's state, restricted to its rows",
    "join": "another aggregate over the same join",
}


#: The share settings measured, in the order they take a step (rotated from step to step).
SETTINGS = ("on", "off", "rollup")
#: The ``share`` of the rows measuring one view of the catalogue alone (a program of that
#: view only, sharing on); their ``views`` is its position in :data:`CATALOGUE` (from 1).
#: No sharing takes N views below the costliest of them alone: that is the target's floor.
ALONE = "alone"


def program_text(views: int, share: str) -> str:
    """The program of the first ``views`` views of :data:`CATALOGUE`.

    Its header sets ``share`` (one of :data:`SETTINGS`); with ``share`` :data:`ALONE`, the
    program of the ``views``-th view only, sharing on.
    """
    chosen = CATALOGUE[views - 1:views] if share == ALONE else CATALOGUE[:views]
    header = f"-- incr: buckets = 8\n-- incr: share = {'on' if share == ALONE else share}\n"
    body = "".join(f"CREATE VIEW {v.name} AS\n{v.select};\n" for v in chosen)
    return header + SOURCES + body


def compile_views(views: int, share: str) -> CompiledProgram:
    """:func:`program_text`, compiled."""
    from incr.compiler import compile_text

    return compile_text(program_text(views, share), path=f"{NAME}.sql", name=NAME)


# -- data ------------------------------------------------------------------------------------
def _sales_codes(rng: np.random.Generator, rows: int) -> np.ndarray:
    """``rows`` sales as integer codes: region, product, customer, amount in cents, qty."""
    return np.column_stack([rng.integers(0, len(REGIONS), rows),
                            rng.integers(0, len(PRODUCTS), rows),
                            rng.integers(0, CUSTOMERS, rows),
                            rng.integers(100, 100_001, rows),
                            rng.integers(1, 21, rows)]).astype(np.int64)


def sales_table(codes: np.ndarray) -> pa.Table:
    """The sales rows of ``codes`` (an amount is its cents / 100: the same double every time)."""
    return pa.table({"region": np.array(REGIONS)[codes[:, 0]],
                     "product": np.array(PRODUCTS)[codes[:, 1]],
                     "customer": codes[:, 2], "amount": codes[:, 3] / 100.0,
                     "qty": codes[:, 4]}, schema=SALES_SCHEMA)


def customers_table() -> pa.Table:
    """Every customer id with its segment (customer i in segment i mod 4)."""
    ids = np.arange(CUSTOMERS, dtype=np.int64)
    return pa.table({"customer": ids,
                     "segment": np.array(SEGMENTS)[ids % len(SEGMENTS)]})


def _write(landing: Path, table: str, kind: str, step: Increment, data: pa.Table) -> None:
    """Lands ``data`` as ``table``'s file of ``step`` and records its path in the step."""
    folder = landing / table / (DELETES_DIR if kind == DELETE else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, folder / step.stem)
    step.files[table] = (folder / step.stem).relative_to(landing).as_posix()


def land(landing: Path, initial: int, increment: int, increments: int) -> list[Increment]:
    """Writes the customers, the initial sales and the increments; returns the steps.

    Every third increment deletes ``increment`` rows drawn from the live ones.
    """
    rng = np.random.default_rng([zlib.crc32(NAME.encode()), initial, increment, increments])
    live: list[np.ndarray] = []
    steps: list[Increment] = []
    for index in range(increments + 1):
        kind = DELETE if is_delete_step(index, True) else INSERT
        if kind == DELETE:
            codes = draw_deletes(rng, live, increment)
        else:
            codes = _sales_codes(rng, initial if index == 0 else increment)
            live.append(codes)
        step = Increment(index, kind, len(codes))  # rows of the sales stream
        _write(landing, "sales", kind, step, sales_table(codes))
        if index == 0:
            _write(landing, "customers", INSERT, step, customers_table())
        steps.append(step)
    return steps


def live_tables(landing: Path, steps: list[Increment]) -> dict[str, pa.Table]:
    """Every source's live rows after ``steps``, read back from the landed files."""
    from incr.oracle import live_rows

    def live(table: str) -> pa.Table:
        landed = {kind: [pq.read_table(landing / s.files[table]) for s in steps
                         if table in s.files and s.kind == kind] for kind in (INSERT, DELETE)}
        return live_rows(landed[INSERT], landed[DELETE], landed[INSERT][0].schema)

    return {table: live(table) for table in ("sales", "customers")}


# -- one configuration -----------------------------------------------------------------------
#: incr's own breakdown of a step's seconds (:func:`incr.bench.runner.breakdown`, and the rest).
BREAKDOWN = ("read_s", "index_s", "h_s", "merge_s", "answer_s", "other_s")


@dataclass
class Row:
    """One measured step of one configuration (N views, one of :data:`SETTINGS`)."""

    name: str
    views: int
    share: str
    batch: int
    kind: str
    initial_rows: int
    rows: int
    seconds: float
    #: Seconds by :data:`BREAKDOWN` name.
    parts: dict[str, float] = field(default_factory=dict)
    #: Delta tables the warehouse keeps besides answers and incr's own (the states).
    state_tables: int = 0
    #: After the last step: ``ok`` when every view equals the DuckDB oracle, else ``MISMATCH``.
    check: str = ""
    load1: float = 0.0

    def record(self) -> dict[str, object]:
        """The row as one CSV record, its breakdown in columns of their own."""
        return {k: v for k, v in asdict(self).items() if k != "parts"} | self.parts


COLUMNS = ["name", "views", "share", "batch", "kind", "initial_rows", "rows", "seconds",
           *BREAKDOWN, "state_tables", "check", "load1"]


def state_tables(warehouse: Path) -> int:
    """Delta tables under ``warehouse`` other than answers and incr's ledger and indexes."""
    return sum(1 for log in warehouse.rglob("_delta_log")
               if log.relative_to(warehouse).parts[0] not in ("answers", "_incr"))


class Oracle:
    """DuckDB's answer per view over the run's live rows, computed once for every configuration."""

    def __init__(self, live: dict[str, pa.Table]):
        self.live = live
        self._answers: dict[str, pa.Table] = {}

    def differences(self, compiled: CompiledProgram, warehouse: Path) -> list[str]:
        """Each view whose answer in ``warehouse`` differs from DuckDB's, and how."""
        from incr.oracle import diff_answers, oracle_answer
        from incr.runtime.report import read_answer

        problems = []
        for plan in compiled.plans:
            if plan.view not in self._answers:
                self._answers[plan.view] = oracle_answer(plan.select, self.live)
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(self._answers[plan.view], answer, ordered=plan.ordered)
            if diff:
                problems.append(f"{plan.view}: {diff}")
        return problems


class Configuration:
    """One program on its own landing and warehouse.

    The program is the first N views in one share setting, or the N-th view :data:`ALONE`.
    """

    def __init__(self, spark: SparkSession, views: int, share: str, work: Path, data: Path):
        from incr.runtime.pipeline import Pipeline

        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(data, work / "landing", copy_function=os.link)
        self.views, self.setting, self.work = views, share, work
        self.warehouse = work / "warehouse"
        self.compiled = compile_views(views, share)
        self.pipeline = Pipeline(self.compiled, work / "landing", self.warehouse, spark=spark)
        self.pipeline.register()
        self.seq = {b.path: b.seq for b in self.pipeline.ledger.batches()}
        self.rows: list[Row] = []

    def apply(self, step: Increment, initial: int, log: TextIO | None) -> None:
        """Applies ``step`` in one run, timed end to end, and records its row."""
        # customers' file is registered only when a view reads it (a join view)
        upto = max(self.seq[p] for p in step.files.values() if p in self.seq)
        _, seconds, parts = timed_run(self.pipeline, upto)
        self.rows.append(Row(NAME, self.views, self.setting, step.index, step.kind, initial,
                             step.rows, seconds, parts, state_tables(self.warehouse),
                             load1=os.getloadavg()[0]))
        if log:
            print(f"  {self.label}: batch {step.index} ({step.kind}, {step.rows:,} rows): "
                  f"{seconds:.2f} s", file=log, flush=True)

    @property
    def label(self) -> str:
        """How the log and the oracle's verdicts name the configuration."""
        if self.setting == ALONE:
            return f"view {self.views:>2} alone ({CATALOGUE[self.views - 1].name})"
        return f"{self.views:>2} views, share {self.setting:<6}"

    def check(self, oracle: Oracle) -> list[str]:
        """Every view's answer against the oracle; marks the last row ``ok`` or ``MISMATCH``."""
        problems = oracle.differences(self.compiled, self.warehouse)
        self.rows[-1].check = "MISMATCH" if problems else "ok"
        return [f"{' '.join(self.label.split())}: {p}" for p in problems]


class Measured(Protocol):
    """A program a bench measures on its own landing and warehouse (``work``).

    It records one row per step it takes (:func:`take_steps`).
    """

    work: Path
    rows: list[Row]

    def apply(self, step: Increment, initial: int, log: TextIO | None) -> None: ...

    def check(self, oracle: Oracle) -> list[str]: ...


def timed_run(pipeline: Pipeline, through: int) -> tuple[RunReport, float, dict[str, float]]:
    """Runs ``pipeline`` through batch ``through``, timed end to end.

    Returns:
        The run's report, its seconds, and incr's breakdown of them with the rest as
        ``other_s``.

    Raises:
        InputError: the run rejected a batch.
    """
    t0 = time.perf_counter()
    report = pipeline.run(through=through)
    seconds = time.perf_counter() - t0
    if report.rejected is not None:
        raise report.rejected
    parts = breakdown(report)
    parts.pop("answer_rows")
    parts["other_s"] = seconds - sum(parts.values())
    return report, seconds, parts


def begin(out: Path, name: str,
          spark: SparkSession | None) -> tuple[SparkSession, Path, dict, float]:
    """A bench run's start.

    Returns:
        The session (started when not given), the work folder ``out/<name>-work`` (emptied),
        the machine as found, and the clock.
    """
    if spark is None:
        from incr.runtime.session import spark_session

        spark = spark_session()
    out.mkdir(parents=True, exist_ok=True)
    work = out / f"{name}-work"
    shutil.rmtree(work, ignore_errors=True)
    return spark, work, machine_info(spark), time.perf_counter()


def run_views(spark: SparkSession, views: int, work: Path, data: Path, steps: list[Increment],
              oracle: Oracle | None, log: TextIO | None,
              keep_work: bool = False) -> tuple[list[Row], list[str]]:
    """Applies ``steps`` to the first ``views`` views in each of :data:`SETTINGS`.

    Returns:
        The rows and, when ``oracle`` is given, each view that differs from it after the
        last step.
    """
    return take_steps([Configuration(spark, views, share, work / f"views-{views}-{share}", data)
                 for share in SETTINGS], steps, oracle, log, keep_work)


def run_alone(spark: SparkSession, views: int, work: Path, data: Path, steps: list[Increment],
              oracle: Oracle | None, log: TextIO | None,
              keep_work: bool = False) -> tuple[list[Row], list[str]]:
    """Applies ``steps`` to each of the first ``views`` views of the catalogue :data:`ALONE`.

    The costliest of them alone is the floor no sharing goes below.

    Returns:
        The rows and, when ``oracle`` is given, each view that differs from it after the
        last step.
    """
    return take_steps([Configuration(spark, position, ALONE, work / f"alone-{position}", data)
                 for position in range(1, views + 1)], steps, oracle, log, keep_work)


def take_steps(configs: Sequence[Measured], steps: list[Increment], oracle: Oracle | None,
               log: TextIO | None, keep_work: bool) -> tuple[list[Row], list[str]]:
    """Applies ``steps`` to ``configs``, then the oracle checks every view.

    The configurations take each step in turn (which goes first rotates), so load from
    elsewhere on the machine falls on all alike.  Their work folders go unless ``keep_work``.
    """
    for step in steps:
        turn = step.index % len(configs)
        for config in configs[turn:] + configs[:turn]:
            config.apply(step, steps[0].rows, log)
    problems = [p for c in configs for p in c.check(oracle)] if oracle is not None else []
    if not keep_work:
        for config in configs:
            shutil.rmtree(config.work, ignore_errors=True)
    return [r for c in configs for r in c.rows], problems


# -- the summary -----------------------------------------------------------------------------
def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def summary(rows: list[Row], target: float = TARGET) -> dict:
    """Per N: median time per increment in each setting, its ratio to the smallest N, the target.

    ``within_target`` says whether sharing (on, or rolling up) keeps N views within
    ``target`` of one view with sharing on; the last N's verdict is the issue's target.  A
    run whose smallest N is not one view (``--views 20``, say) has no verdict (None): its
    ratios are to that N, and 20 views are always within 1.5× of themselves.

    With the views measured :data:`ALONE`, per N also the floor: the costliest of the first N
    alone (``floor_s``, ``floor_view``), which no sharing goes below, since a program of those
    views does at least that one's work, and its ratio to the first view alone (the same
    program as one view with sharing on, measured beside the others); and ``separate_s``,
    what N programs of one view each take in all.  The target is ``reachable`` only when the
    floor is within it.
    """
    def median(n: int, share: str, batch: int | None = None) -> float | None:
        return _median([r.seconds for r in rows if r.views == n and r.share == share
                        and (r.batch > 0 if batch is None else r.batch == batch)])

    def tables(n: int, share: str) -> int | None:
        return max((r.state_tables for r in rows if r.views == n and r.share == share),
                   default=None)

    counts = sorted({r.views for r in rows if r.share in SETTINGS})
    base = {s: median(counts[0], s) for s in SETTINGS}
    judged = counts[0] == 1  # the target is against one view
    alone = {r.views: median(r.views, ALONE) for r in rows if r.share == ALONE}
    per_n = {}
    for n in counts:
        at = {s: median(n, s) for s in SETTINGS}
        solo = [alone.get(i) for i in range(1, n + 1)]
        known = [t for t in solo if t is not None]
        floor = max(known) if len(known) == n else None
        per_n[str(n)] = {
            "floor_s": floor, "floor_over_base": _ratio(floor, alone.get(1) or base["on"]),
            "floor_view": None if floor is None else CATALOGUE[solo.index(floor)].name,
            "separate_s": round(sum(known), 4) if floor is not None else None}
        per_n[str(n)] |= {f"median_{s}_s": at[s] for s in SETTINGS}
        per_n[str(n)] |= {f"{s}_over_base": _ratio(at[s], base[s]) for s in SETTINGS}
        per_n[str(n)] |= {"off_over_on": _ratio(at["off"], at["on"]),
                          "off_over_rollup": _ratio(at["off"], at["rollup"]),
                          "separate_over_on": _ratio(per_n[str(n)]["separate_s"], at["on"])}
        per_n[str(n)] |= {f"initial_{s}_s": median(n, s, 0) for s in SETTINGS}
        per_n[str(n)] |= {f"state_tables_{s}": tables(n, s) for s in SETTINGS}
        # both sharing settings against one view with sharing on
        shared = [_ratio(at[s], base["on"]) for s in ("on", "rollup")]
        per_n[str(n)]["within_target"] = (any(r is not None and r <= target for r in shared)
                                          if judged else None)
    last = per_n[str(counts[-1])]
    return {"baseline_views": counts[0], "target_factor": target,
            "target": {"views": counts[-1], "on_over_base": last["on_over_base"],
                       "rollup_over_base": _ratio(last["median_rollup_s"], base["on"]),
                       "off_over_base": last["off_over_base"],
                       "met": last["within_target"] if len(counts) > 1 else None,
                       "floor_over_base": last["floor_over_base"], "floor_view": last["floor_view"],
                       "reachable": (None if last["floor_over_base"] is None
                                     else last["floor_over_base"] <= target)},
            "by_views": per_n}


def _verdict(within: bool | None) -> str:
    """A target column's cell: yes, no, or a dash when the run cannot judge it."""
    return "—" if within is None else "yes" if within else "no"


def _cell(value: object) -> str:
    return "–" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


#: The per-N table of :func:`markdown`.
SUMMARY_HEAD = ("| views | on | off | rollup | on ÷ base | off ÷ base | rollup ÷ base | off ÷ on "
                "| floor ÷ view 1 alone | N programs ÷ on | state tables on / off / rollup "
                "| initial on / off / rollup | within target |\n|" + "---:|" * 13)
#: The table of the views measured alone in :func:`markdown`.
ALONE_HEAD = "| # | view | shape | alone | ÷ view 1 alone |\n|---:|---|---|---:|---:|"
#: The per-step table of :func:`markdown`.
STEPS_HEAD = ("| views | share | batch | kind | rows | seconds | h | MERGE | answer | other | "
              "state tables | check |\n|" + "---:|" * 12)


def markdown(rows: list[Row], summ: dict) -> str:
    """The summary per N, the catalogue of views, then every step of every configuration."""
    increment = max((r.rows for r in rows if r.batch > 0), default=0)
    intro = (f"Median seconds per increment ({rows[0].initial_rows:,} initial sales rows, "
             f"increments of {increment:,} rows, every third a delete); ratios are to "
             f"{summ['baseline_views']} view(s); target: within {summ['target_factor']}× with "
             f"sharing on (or rollup).\n")
    out = [f"# incr bench {NAME}\n", intro, SUMMARY_HEAD]
    out += [f"| {n} | " + "".join(f"{_cell(s[f'median_{k}_s'])} | " for k in SETTINGS)
            + "".join(f"{_cell(s[f'{k}_over_base'])}× | " for k in SETTINGS)
            + f"{_cell(s['off_over_on'])}× | {_cell(s['floor_over_base'])}× | "
            + f"{_cell(s['separate_over_on'])}× | "
            + " / ".join(str(s[f"state_tables_{k}"]) for k in SETTINGS) + " | "
            + " / ".join(_cell(s[f"initial_{k}_s"]) for k in SETTINGS) + " | "
            + f"{_verdict(s['within_target'])} |" for n, s in summ["by_views"].items()]
    out += ["", "The views (N views = the first N):\n", "| # | view | shape | SELECT |",
            "|---:|---|---|---|"]
    out += [f"| {i} | {v.name} | {v.shape}: {SHAPES[v.shape]} | `{v.select}` |"
            for i, v in enumerate(CATALOGUE, 1)]
    alone = {r.views for r in rows if r.share == ALONE}
    base: float | None = None
    if alone:
        out += ["", ("Each view alone (a program of that view only, sharing on): the floor of N "
                     "views is the costliest of the first N, which no sharing goes below; N "
                     "programs is their sum.\n"), ALONE_HEAD]
        for i in sorted(alone):
            seconds = _median([r.seconds for r in rows
                               if r.share == ALONE and r.views == i and r.batch > 0])
            base = base if i > 1 else seconds
            v = CATALOGUE[i - 1]
            out.append(f"| {i} | {v.name} | {v.shape} | {_cell(seconds)} | "
                       f"{_cell(_ratio(seconds, base))}× |")
    out += ["", "Every step (seconds; share alone: views is the view's position):\n", STEPS_HEAD]
    out += [f"| {r.views} | {r.share} | {r.batch} | {r.kind} | {r.rows:,} | {r.seconds:.2f} | "
            + "".join(f"{r.parts[k]:.2f} | " for k in ("h_s", "merge_s", "answer_s", "other_s"))
            + f"{r.state_tables} | {r.check} |" for r in rows]
    return "\n".join(out) + "\n"


def write_csv(path: Path, rows: list[Row]) -> None:
    """One row per configuration and step, with :data:`COLUMNS`."""
    write_records(path, COLUMNS, [r.record() for r in rows])


def read_csv(path: Path) -> list[Row]:
    """The rows of a CSV written by :func:`write_csv`."""
    kinds = {f.name: {"int": int, "float": float}.get(str(f.type), str) for f in fields(Row)}
    with path.open(newline="") as fh:
        return [Row(**{k: kinds[k](v) for k, v in rec.items() if k not in BREAKDOWN},
                    parts={k: float(rec[k]) for k in BREAKDOWN}) for rec in csv.DictReader(fh)]


def title(rows: list[Row]) -> str:
    """The figure's title: what ran, on how much data, and how to read it."""
    increment = max((r.rows for r in rows if r.batch > 0), default=0)
    return (f"{NAME}: the first N of {len(CATALOGUE)} views over one sales stream, share on, "
            f"off and rollup\n{rows[0].initial_rows:,} initial rows, increments of {increment:,} rows "
            f"(every 3rd deletes) — median time per increment, lower is better")


def draw(csv_path: Path) -> None:
    """(Re)draws the figure of a ``sharing.csv`` next to it."""
    from incr.bench.plot import plot_sharing

    rows = read_csv(csv_path)
    plot_sharing(rows, csv_path.with_suffix(".png"), title(rows), TARGET)


# -- the run ---------------------------------------------------------------------------------
def run_sharing(out: Path, views: tuple[int, ...] = DEFAULT_VIEWS,
                initial: int = DEFAULT_INITIAL, increment: int = DEFAULT_INCREMENT,
                increments: int = DEFAULT_INCREMENTS, *, warm_up: bool = True,
                keep_work: bool = False, spark: SparkSession | None = None,
                log: TextIO | None = sys.stdout, command: str | None = None) -> int:
    """Runs every N of ``views`` in each of :data:`SETTINGS`; writes the outputs.

    Returns:
        0 when every answer equals the oracle's, 1 when one differs, 2 for a number of
        views outside 1..20.
    """
    views = tuple(sorted(set(views)))
    if not views or views[0] < 1 or views[-1] > len(CATALOGUE):
        print(f"error: --views takes numbers of views from 1 to {len(CATALOGUE)}, got "
              f"{','.join(map(str, views))}", file=sys.stderr)
        return 2
    spark, work, before, t_start = begin(out, NAME, spark)
    if warm_up:
        # The JVM's first jobs and the driver's first translation of each view's SQL are
        # one-off costs; the largest program, in every setting, takes them before anything counts.
        tiny = land(work / "warm-up" / "data", 2_000, 50, DELETE_EVERY)
        run_views(spark, views[-1], work / "warm-up", work / "warm-up" / "data", tiny, None, None)
    data = work / "data"
    steps = land(data, initial, increment, increments)
    oracle = Oracle(live_tables(data, steps))
    rows: list[Row] = []
    mismatches: list[str] = []
    for n in views:
        done, problems = run_views(spark, n, work, data, steps, oracle, log, keep_work)
        rows += done
        mismatches += problems
    done, problems = run_alone(spark, views[-1], work, data, steps, oracle, log, keep_work)
    rows += done
    mismatches += problems
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    summ = summary(rows)
    write_csv(out / f"{NAME}.csv", rows)
    draw(out / f"{NAME}.csv")
    (out / f"{NAME}.md").write_text(markdown(rows, summ))
    meta = {
        "benchmark": NAME, "command": command, "views": list(views), "initial_rows": initial,
        "increment": increment, "increments": increments,
        "catalogue": [asdict(v) for v in CATALOGUE],
        "machine": before, "load_after": machine_info(spark)["loadavg"],
        "wall_s": round(time.perf_counter() - t_start, 1),
        # every configuration's views, after its last increment
        "oracle": {"checked_views": len(SETTINGS) * sum(views) + views[-1],
                   "mismatches": mismatches},
        "summary": summ,
    }
    (out / f"{NAME}.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    if log:
        _report(out, meta, log)
    if mismatches:
        print("MISMATCH against the DuckDB oracle: " + "; ".join(mismatches), file=sys.stderr)
    return 1 if mismatches else 0


def _report(out: Path, meta: dict, log: TextIO) -> None:
    """The run's headline lines: per N the medians and ratios, then the target's verdict."""
    summ = meta["summary"]
    print(f"\nwrote {out / NAME}.csv, {NAME}.png, {NAME}.md, {NAME}.json "
          f"({meta['wall_s']:.0f} s)", file=log)
    for n, s in summ["by_views"].items():
        print(f"{n:>2} views: median per increment on {s['median_on_s']} s "
              f"({s['on_over_base']}× {summ['baseline_views']} view(s)), off "
              f"{s['median_off_s']} s ({s['off_over_base']}×), rollup {s['median_rollup_s']} s "
              f"({s['rollup_over_base']}×); off/on {s['off_over_on']}×", file=log)
    t = summ["target"]
    verdict = (f"not judged; the run has no program of one view to compare with and more "
               f"(--views 1,{t['views']})" if t["met"] is None else
               f"{'met' if t['met'] else 'NOT met'} ({t['on_over_base']}× on, "
               f"{t['rollup_over_base']}× rollup, {t['off_over_base']}× off)")
    print(f"target ({t['views']} views within {summ['target_factor']}× of one view, "
          f"sharing on): {verdict}", file=log)
    if t["floor_view"] is not None:
        print(f"floor: {t['floor_view']} alone takes {t['floor_over_base']}× the first view "
              f"alone; no sharing takes the {t['views']} views below it, "
              f"so the target is {'within' if t['reachable'] else 'out of'} reach", file=log)


def main_args(out: Path, views: tuple[int, ...] | None, initial: int | None,
              increment: int | None, increments: int | None, keep_work: bool = False) -> int:
    """The CLI's entry: each setting left out takes this module's default."""
    return run_sharing(out, views or DEFAULT_VIEWS, initial or DEFAULT_INITIAL,
                       increment or DEFAULT_INCREMENT,
                       DEFAULT_INCREMENTS if increments is None else increments,
                       keep_work=keep_work, command="incr " + " ".join(sys.argv[1:]))

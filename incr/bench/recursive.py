"""``incr bench reachability`` and ``incr bench shortest-path``: seed 004's network workload (§7.1).

The programs are the shipped examples ``sql/examples/reachability.sql`` (view
``reach_counts``: how many nodes each node reaches) and ``sql/examples/shortest_path.sql``
(view ``shortest_paths``: cheapest cost and fewest hops, paths of up to 6 hops).

**Data**: a transit-stub topology shaped like GT-ITM's default in the seed: per transit
domain, 4 transit nodes linked to each other (latency 50), 3 stubs per transit node, each
stub 8 nodes in a ring with 6 chords (latency 2) and one node linked to its transit node
(latency 10); domains are linked in a ring through their first transit nodes (latency 50),
or, with ``--separate-domains``, not at all: the graph is then that many networks of 100 nodes
(reachability on a connected 10K-node network has a closure of 10^8 pairs, which is the
answer itself; 100 separate domains keep it at 10^6 and still derive, over-delete and
rederive within each).
Every link is bidirectional (two link rows).  One domain is the seed's 100 nodes and 372
link rows (the seed: about 400); ``--nodes`` picks the number of domains (nodes / 100).  Each increment then
either inserts ``size`` new bidirectional links between random nodes of one stub or of two
stubs of a domain, or (every other increment) deletes ``size`` bidirectional links picked
from the live ones, so deletions cut cycles and disconnect stubs as in the seed's churn.

Per batch, on one SparkSession: **incr** (``Pipeline.run`` on the warehouse that persists),
**recompute** (a fresh warehouse and ``Pipeline`` over all live links as one file: the same
engine deriving R from scratch), and **duckdb** (DuckDB's own ``WITH RECURSIVE`` of the view's
SQL over the live links, the oracle; the answers are compared).  ``derived`` is the tuples
incr's rounds produced for the batch (the seed's "tuples propagated"), ``fixpoint`` the
rows of R after it: a recompute derives at least that many.  A batch runs on the driver
(DuckDB) while R holds at most ``INCR_LOCAL_STATE_ROWS`` tuples, in Spark beyond: the
10K-node graph's R of 2M tuples needs that setting raised to stay on the driver.

Outputs in ``--out DIR``: ``NAME.csv`` (one row per batch), ``NAME.md`` and ``NAME.json``.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"reachability": ("reachability.sql", "reach_counts"),
         "shortest-path": ("shortest_path.sql", "shortest_paths")}
NODES_PER_DOMAIN = 100
#: The links of a stub beyond its ring of 8 (the seed's nodes have about four links each).
CHORDS = ((0, 4), (2, 6), (1, 5), (3, 7), (0, 2), (4, 6))
SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("cost", pa.int64())])


def is_recursive_bench(name: str) -> bool:
    return name in NAMES


def transit_stub(domains: int, linked: bool = True) -> dict[tuple[int, int], int]:
    """The topology's bidirectional links, each once as (low, high) → latency.

    ``linked``: the domains in a ring (else separate networks).
    """
    links: dict[tuple[int, int], int] = {}

    def link(a: int, b: int, cost: int) -> None:
        links[(min(a, b), max(a, b))] = cost

    for d in range(domains):
        base = d * NODES_PER_DOMAIN
        transit = [base + i for i in range(4)]
        for i, a in enumerate(transit):
            for b in transit[i + 1:]:
                link(a, b, 50)
        for t, node in enumerate(transit):
            for s in range(3):
                first = base + 4 + (t * 3 + s) * 8
                stub = [first + i for i in range(8)]
                for i in range(8):
                    link(stub[i], stub[(i + 1) % 8], 2)
                for a, b in CHORDS:
                    link(stub[a], stub[b], 2)
                link(stub[0], node, 10)
        if linked and domains > 1:
            link(base, ((d + 1) % domains) * NODES_PER_DOMAIN, 50)
    return links


def _rows(links: dict[tuple[int, int], int]) -> pa.Table:
    src, dst, cost = [], [], []
    for (a, b), c in links.items():
        src += [a, b]
        dst += [b, a]
        cost += [c, c]
    return pa.table({"src": pa.array(src, pa.int64()), "dst": pa.array(dst, pa.int64()),
                     "cost": pa.array(cost, pa.int64())}, schema=SCHEMA)


@dataclass
class Row:
    name: str
    batch: int
    kind: str
    link_rows: int
    live_links: int
    incr_s: float
    recompute_s: float
    duckdb_s: float
    speedup: float
    rounds: int
    derived: int
    over: int
    dr_rows: int
    fixpoint: int
    equal: bool
    pruned: int = 0  # tuples derived that a better one beat (aggregate selection)
    #: values of R's partition column whose tuples the batch read (None: R read whole)
    parts: int | None = None


def run_recursive(name: str, out: Path, domains: int, size: int, increments: int,
                  command: str, no_rank_support: bool = False,
                  no_selection: bool = False, separate: bool = False) -> int:
    """Runs the benchmark and writes its outputs; returns an exit code (1 on a mismatch).

    ``no_rank_support``: a delete over-deletes every tuple it examines (no check for a proof
    left from a lower rank), for the figures without the check.  ``no_selection``: R keeps
    every tuple derived (no aggregate selection), for the figures without it.
    ``separate``: the domains are not linked to each other.
    """
    from incr.bench.machine import machine_info
    from incr.compiler import compile_program
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.recursion import RecursiveRuntime
    from incr.runtime.report import read_answer
    from incr.runtime.session import spark_session

    program, view = NAMES[name]
    compiled = compile_program(ROOT / "sql" / "examples" / program)
    plan = compiled.plan(view)
    work = out / f"{name}-work"
    shutil.rmtree(work, ignore_errors=True)
    landing, warehouse = work / "landing", work / "warehouse"
    (landing / "links" / "_deletes").mkdir(parents=True)
    spark = spark_session()
    def configured(pipeline: Pipeline) -> Pipeline:
        """Every recursive view of the program (the run times all) with the run's methods."""
        for runtime in pipeline.views.values():
            if isinstance(runtime, RecursiveRuntime):
                runtime.rank_support = not no_rank_support
                runtime.aggregate_selection = not no_selection
        return pipeline

    pipeline = configured(Pipeline(compiled, landing, warehouse, spark=spark))
    rng = np.random.default_rng(zlib.crc32(f"{name}:{domains}:{size}".encode()))
    live = transit_stub(domains, linked=not separate)
    nodes = domains * NODES_PER_DOMAIN
    rows: list[Row] = []
    for batch in range(increments + 1):
        kind = "insert" if batch % 2 == 0 else "delete"
        if batch == 0:
            change = dict(live)
        elif kind == "insert":
            change = {}
            while len(change) < size:
                d = int(rng.integers(domains)) * NODES_PER_DOMAIN
                a, b = sorted(int(x) for x in d + rng.integers(4, NODES_PER_DOMAIN, 2))
                if a != b and (a, b) not in live and (a, b) not in change:
                    change[(a, b)] = int(rng.integers(1, 20))
            live.update(change)
        else:
            keys = list(live)
            picked = rng.choice(len(keys), size=min(size, len(keys)), replace=False)
            change = {keys[i]: live[keys[i]] for i in picked}
            for k in change:
                del live[k]
        folder = landing / "links" / ("_deletes" if kind == "delete" else "")
        pq.write_table(_rows(change), folder / f"{batch:05d}.parquet")
        t0 = time.perf_counter()
        report = pipeline.run()
        incr_s = time.perf_counter() - t0
        if report.rejected is not None:
            raise report.rejected
        trace = pipeline.views[view].log[-1]
        fixpoint = pipeline.store.read(pipeline.views[view].fixpoint_path).num_rows
        whole = _rows(live)
        scratch = work / "recompute"
        shutil.rmtree(scratch, ignore_errors=True)
        (scratch / "landing" / "links").mkdir(parents=True)
        pq.write_table(whole, scratch / "landing" / "links" / "00000.parquet")
        t0 = time.perf_counter()
        fresh = configured(Pipeline(compiled, scratch / "landing", scratch / "warehouse",
                                    spark=spark))
        fresh.run()
        recompute_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        expected = oracle_answer(plan.select, {"links": whole})
        duckdb_s = time.perf_counter() - t0
        answer, _ = read_answer(warehouse, plan)
        equal = diff_answers(expected, answer, ordered=plan.ordered) is None
        row = Row(name, batch, kind, 2 * len(change), len(live), round(incr_s, 3),
                  round(recompute_s, 3), round(duckdb_s, 3),
                  round(recompute_s / incr_s, 2) if incr_s else 0.0, trace["rounds"],
                  trace["derived"], trace["over"], trace["dr_rows"], fixpoint, equal,
                  trace["pruned"], trace["parts"])
        rows.append(row)
        print(f"{name} batch {batch} ({kind}, {row.link_rows} link rows): incr {incr_s:.2f} s, "
              f"recompute {recompute_s:.2f} s ({row.speedup}x), duckdb {duckdb_s:.2f} s; "
              f"{row.derived} tuples derived in {row.rounds} rounds ({row.pruned} pruned), "
              f"{row.over} over-deleted, "
              f"|ΔR| {row.dr_rows}, "
              f"parts of R read {'all' if row.parts is None else row.parts}, "
              f"|R| {fixpoint}{'' if equal else '; ANSWER DIFFERS FROM DUCKDB'}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    later = [r for r in rows if r.batch > 0]
    summary = {
        "nodes": nodes, "domains_linked": not separate,
        "link_rows_initial": rows[0].link_rows, "increment_links": size,
        "median_incr_s": _median(r.incr_s for r in later),
        "median_recompute_s": _median(r.recompute_s for r in later),
        "median_speedup": _median(r.speedup for r in later),
        "median_derived": _median(r.derived for r in later),
        "median_over_deleted": _median(r.over for r in later if r.kind == "delete"),
        "rank_support": not no_rank_support,
        # R is read on the driver only while it holds at most this many tuples (else Spark)
        "local_state_rows": pipeline.engines.settings.local_state_rows,
        "aggregate_selection": not no_selection and plan.recursion is not None
        and plan.recursion.selection is not None,
        "all_equal_duckdb": all(r.equal for r in rows),
    }
    (out / f"{name}.json").write_text(json.dumps({
        "command": command, "machine": machine_info(spark), "summary": summary,
        "rows": [asdict(r) for r in rows]}, indent=2, default=str))
    (out / f"{name}.md").write_text(_markdown(name, rows, summary))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["all_equal_duckdb"] else 1


def _median(values) -> float | None:
    """The median, rounded for the report (None: no values)."""
    values = list(values)
    return round(statistics.median(values), 3) if values else None


def _markdown(name: str, rows: list[Row], summary: dict) -> str:
    head = ("| batch | kind | link rows | incr s | recompute s | × | duckdb s | derived | pruned "
            "| rounds | over-deleted | ΔR | R | parts of R read | = DuckDB |\n|" + "---|" * 15
            + "\n")
    body = "".join(f"| {r.batch} | {r.kind} | {r.link_rows} | {r.incr_s} | {r.recompute_s} | "
                   f"{r.speedup} | {r.duckdb_s} | {r.derived} | {r.pruned} | {r.rounds} | "
                   f"{r.over} | "
                   f"{r.dr_rows} | "
                   f"{r.fixpoint} | {'all' if r.parts is None else r.parts} | "
                   f"{'yes' if r.equal else 'NO'} |\n" for r in rows)
    shape = "" if summary["domains_linked"] else \
        f" in {summary['nodes'] // NODES_PER_DOMAIN} separate domains"
    return (f"# incr bench {name}\n\n{summary['nodes']} nodes{shape}, "
            f"{summary['link_rows_initial']} "
            f"link rows at first; medians over the increments: incr {summary['median_incr_s']} s, "
            f"recompute {summary['median_recompute_s']} s ({summary['median_speedup']}×), "
            f"{summary['median_derived']} tuples derived; deletes over-delete "
            f"{summary['median_over_deleted']} tuples "
            f"({'rank support' if summary['rank_support'] else 'no rank support'}; "
            f"{'' if summary['aggregate_selection'] else 'no '}aggregate selection; "
            f"INCR_LOCAL_STATE_ROWS={summary['local_state_rows']}).\n\n"
            + head + body)


def main_args(name: str, out: Path, nodes: int | None, size: int | None,
              increments: int, no_rank_support: bool = False,
              no_selection: bool = False, separate: bool = False) -> int:
    """The CLI's entry: ``nodes`` rounded to whole domains of 100 (default 100)."""
    domains = max(1, round((nodes or NODES_PER_DOMAIN) / NODES_PER_DOMAIN))
    return run_recursive(name, out, domains, size or 4, increments,
                         "incr " + " ".join(sys.argv[1:]), no_rank_support=no_rank_support,
                         no_selection=no_selection, separate=separate)

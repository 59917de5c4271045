"""``incr bench NAME``: the seed paper's experiments (§11) against full recompute and a peer.

Data is generated deterministically (:mod:`~incr.bench.workloads`); per increment size, an
initial load then N equal increments land as Parquet, and each step is timed four ways on
one SparkSession (:mod:`~incr.bench.runner`): incr applying it, Spark recomputing the view
from all data so far, the Spark Structured Streaming peer (:mod:`~incr.bench.peer`), and
the floor, reading the step and computing h on it (:mod:`~incr.bench.floor`).  One extra
increment is profiled (:mod:`~incr.bench.profile`).

Benchmarks: ``groupby`` (``SELECT x, AVG(y) FROM S GROUP BY x``) and ``joingroupby`` (the §2
query over two streams).  ``kmeans`` and ``pagerank`` (the iterative views of
``sql/examples``) have their own harness, :mod:`~incr.bench.iterative` (incr against a
from-scratch run per batch, and the error against the exact answer), and so does
``sharing`` (1 to 20 views over one stream with the share pass on and off, issue 18),
:mod:`~incr.bench.sharing`.  ``--deletes`` (or
the names ``groupby-deletes`` and ``joingroupby-deletes``) makes every third increment a
delete batch; ``--append-only`` declares the streams insert-only (header option
``append_only``: no row index), to measure what that declaration saves.

Outputs in ``--out DIR``, for ``LABEL`` = the name (plus ``-deletes`` / ``-append-only``):

* ``LABEL.csv``: one row per step and size (:mod:`~incr.bench.results` lists the columns);
* ``LABEL.png``: the plot (:mod:`~incr.bench.plot`);
* ``LABEL-profile.csv``: the profiled increment, per size, where the time went;
* ``LABEL.json``: machine, settings, command line, peer verdicts and headline ratios.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from incr.bench.iterative import is_iterative
from incr.bench.machine import machine_info, peak_memory_mb
from incr.bench.plot import plot, title
from incr.bench.results import IncrementRow, markdown, write_csv
from incr.bench.runner import Series, run_series
from incr.bench.workloads import WORKLOADS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_INITIAL = {"groupby": 1_000_000, "joingroupby": 100_000}
DEFAULT_SIZES = (10_000, 20_000, 30_000, 40_000)
DELETES_SUFFIX = "-deletes"
APPEND_ONLY_SUFFIX = "-append-only"


def resolve(name: str, deletes: bool) -> tuple[str, bool]:
    """The workload name and whether deletes are on (``NAME-deletes`` implies them)."""
    if name.endswith(DELETES_SUFFIX):
        return name[: -len(DELETES_SUFFIX)], True
    return name, deletes


def run_bench(name: str, out: Path, initial: int | None = None,
              sizes: tuple[int, ...] = DEFAULT_SIZES, *, increments: int = 9,
              deletes: bool = False, check: bool = False, peer: bool = True,
              profile: bool = True, keep_work: bool = False, append_only: bool = False,
              warm_up: bool = True, spark: SparkSession | None = None,
              log: TextIO | None = sys.stdout, command: str | None = None,
              groups: int | None = None) -> int:
    """Runs benchmark ``name`` for every increment size; writes the outputs; returns the exit code.

    A tiny unrecorded series first warms the JVM up (``warm_up``), so every size starts alike.

    Returns:
        0 when every comparison agreed, 1 when incr's answer differed from DuckDB, the
        recompute or the peer, 2 for an unknown name or incompatible options.
    """
    if is_iterative(name):  # kmeans, pagerank: their own harness (incr.bench.iterative)
        from incr.bench.iterative import run_iterative

        return run_iterative(name, out, initial, None if sizes is DEFAULT_SIZES else sizes,
                             increments=increments, deletes=deletes, check=check,
                             keep_work=keep_work, warm_up=warm_up, spark=spark, log=log,
                             command=command)
    workload_name, deletes = resolve(name, deletes)
    if workload_name not in WORKLOADS:
        known = ", ".join(sorted(WORKLOADS) + [n + DELETES_SUFFIX for n in sorted(WORKLOADS)]
                          + ["kmeans", "pagerank", "pagerank-deletes"])
        print(f"error: unknown benchmark {name}; known: {known}", file=sys.stderr)
        return 2
    if append_only and deletes:
        print("error: --append-only declares the streams insert-only, so it cannot run with "
              "deletes", file=sys.stderr)
        return 2
    if spark is None:
        from incr.runtime.session import spark_session

        spark = spark_session()
    workload = WORKLOADS[workload_name]
    label = workload_name + (DELETES_SUFFIX if deletes else "") + \
        (APPEND_ONLY_SUFFIX if append_only else "")
    initial = DEFAULT_INITIAL[workload_name] if initial is None else initial
    out.mkdir(parents=True, exist_ok=True)
    before = machine_info(spark)
    if warm_up:
        # A fresh JVM compiles and loads classes on first use; without this the first size's
        # initial load (and the peer's) would carry that one-off cost and the others not.
        run_series(spark, workload, label, out / f"{label}-work" / "warm-up", 2_000, 200,
                   increments=3 if deletes else 1, deletes=deletes, check=False, peer=peer,
                   profile=False, log=None, append_only=append_only)
    all_series: list[Series] = []
    for size in sizes:
        work = out / f"{label}-work" / f"size-{size}"
        all_series.append(run_series(spark, workload, label, work, initial, size, increments,
                                     deletes, check, peer, profile, log, append_only, groups))
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    if not keep_work:
        shutil.rmtree(out / f"{label}-work", ignore_errors=True)
    rows = [r for s in all_series for r in s.rows]
    write_csv(out / f"{label}.csv", rows)
    plot(rows, out / f"{label}.png", title(label, initial))
    if profile:
        _write_profile(out / f"{label}-profile.csv", all_series)
    meta = {
        "benchmark": label, "command": command, "initial_rows": initial,
        "sizes": list(sizes), "increments": increments, "deletes": deletes, "check": check,
        "append_only": append_only, "groups": groups,
        "peak_memory_mb": peak_memory_mb(spark),
        "machine": before, "load_after": machine_info(spark)["loadavg"],
        "peer": {str(s.size): {"checked": s.peer_checked, "same_answer": s.peer_diff is None,
                               "diff": s.peer_diff, "last_trigger_ms": s.peer_durations}
                 for s in all_series} if peer else None,
        "mismatches": [m for s in all_series for m in s.mismatches],
        "summary": summary(rows),
        "profile": {str(s.size): _profile_meta(s) for s in all_series if s.profile},
    }
    (out / f"{label}.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    (out / f"{label}.md").write_text(markdown(rows))
    bad = meta["mismatches"] or any(s.peer_diff is not None for s in all_series)
    if log:
        print(f"\nwrote {out / (label + '.csv')}, {label}.png, {label}.json"
              + (f", {label}-profile.csv" if profile else ""), file=log)
        for line in _summary_lines(meta["summary"]):
            print(line, file=log)
        if bad:
            print("MISMATCH: " + "; ".join(meta["mismatches"] + [
                f"peer (size {s.size}): {s.peer_diff}" for s in all_series if s.peer_diff]),
                file=log)
    return 1 if bad else 0


def summary(rows: list[IncrementRow]) -> dict[str, dict]:
    """Headline ratios per size: the last increment against recompute, peer, floor, increment 1."""
    out = {}
    for size in sorted({r.size for r in rows}):
        run = sorted((r for r in rows if r.size == size), key=lambda r: r.increment)
        first, last = run[1] if len(run) > 1 else run[0], run[-1]
        incs = [r for r in run if r.increment > 0]
        peer_wins = [r for r in incs if r.peer_s is not None]
        out[str(size)] = {
            "last_increment": last.increment,
            "recompute_over_incr": round(last.speedup, 2),
            "peer_over_incr": None if last.peer_s is None else round(last.vs_peer, 2),
            "incr_over_floor": round(last.vs_floor, 2),
            "last_over_first": round(last.incremental_s / first.incremental_s, 2),
            "increments_faster_than_peer": (f"{sum(r.incremental_s <= r.peer_s for r in peer_wins)}"
                                            f"/{len(peer_wins)}") if peer_wins else None,
            "median_incr_s": round(sorted(r.incremental_s for r in incs)[len(incs) // 2], 3)
            if incs else None,
        }
    return out


def _summary_lines(summ: dict[str, dict]) -> list[str]:
    lines = []
    for size, s in summ.items():
        peer = (f", peer/incr {s['peer_over_incr']}× (incr faster on "
                f"{s['increments_faster_than_peer']} increments)") if s["peer_over_incr"] else ""
        lines.append(f"size {size}: increment {s['last_increment']}: recompute/incr "
                     f"{s['recompute_over_incr']}×{peer}, incr/floor {s['incr_over_floor']}×, "
                     f"last/first increment {s['last_over_first']}×")
    return lines


def _write_profile(path: Path, all_series: list[Series]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["size", "path", "calls", "seconds", "share"])
        for s in all_series:
            if s.profile is None:
                continue
            for r in s.profile.rows():
                w.writerow([s.size, r["path"], r["calls"], f"{r['seconds']:.4f}",
                            f"{r['share']:.4f}"])


def _profile_meta(s: Series) -> dict:
    p = s.profile
    assert p is not None
    return {"total_s": round(p.total_s, 4), "spark_jobs": p.spark_jobs,
            "empty_job_s": round(p.empty_job_s, 4), "shuffle_job_s": round(p.shuffle_job_s, 4),
            "by_probe_s": {k: round(v, 4) for k, v in p.by_leaf().items()},
            "state_tables": {k: {m: round(v, 4) for m, v in t.items()}
                             for k, t in s.profile_tables.items()}}

"""One benchmark series: an initial load and N increments of one size, each measured four ways.

Per step, on one SparkSession and in this order:

1. **incremental**: ``Pipeline.run(through=…)`` applying the step's batches (for join-groupBy
   the two streams' batches in one run), timed end to end, with incr's own breakdown from
   the batch reports;
2. **recompute**: every view's SQL over all rows live after the step, read in one scan per
   stream (:mod:`incr.bench.recompute`), collected;
3. **floor**: reading the step's files and computing h on them (:mod:`incr.bench.floor`);
4. **peer**: the step's files handed to the Structured Streaming peer and one
   ``availableNow`` trigger (:mod:`incr.bench.peer`);
5. with ``check``, incr's answer compared with DuckDB and with the recompute.

After the last step the peer's answer is compared with incr's (same rows, values within
1e-9), and one extra increment, landed up front but applied only now, is profiled
(:mod:`incr.bench.profile`).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from incr.bench.floor import floor_seconds
from incr.bench.peer import StreamingPeer
from incr.bench.profile import Profile, profile_run
from incr.bench.recompute import recompute, recompute_duckdb
from incr.bench.results import IncrementRow
from incr.bench.workloads import Increment, Workload, land

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from incr.runtime.pipeline import RunReport


@dataclass
class Series:
    """The measured steps of one increment size, the peer's verdict and the profile."""

    size: int
    rows: list[IncrementRow] = field(default_factory=list)
    peer_diff: str | None = None
    peer_checked: bool = False
    mismatches: list[str] = field(default_factory=list)
    profile: Profile | None = None
    profile_tables: dict[str, dict[str, float]] = field(default_factory=dict)
    peer_durations: dict[str, int] = field(default_factory=dict)


def breakdown(report: RunReport) -> dict[str, float]:
    """The timings incr itself reports for a run, summed over its batches and views."""
    out = {"read_s": 0.0, "index_s": 0.0, "h_s": 0.0, "merge_s": 0.0, "answer_s": 0.0}
    answer_rows = 0
    for b in report.applied:
        out["read_s"] += b.read_s
        out["index_s"] += b.index_s
        for v in b.views:
            out["h_s"] += v.h_s
            out["merge_s"] += v.merge_s
            out["answer_s"] += v.answer_s
            answer_rows = max(answer_rows, v.answer_rows)
    out["answer_rows"] = answer_rows
    return out


def _stage_times(report: RunReport) -> str:
    """Seconds per stage of each view with more than one, summed over the run's batches."""
    totals: dict[str, float] = {}
    for b in report.applied:
        for v in b.views:
            if len(v.stages) > 1:
                for stage, seconds in v.stages.items():
                    key = f"{v.view}:{stage}"
                    totals[key] = totals.get(key, 0.0) + seconds
    return " ".join(f"{k}={s:.3f}" for k, s in totals.items())


def run_series(spark: SparkSession, workload: Workload, label: str, work: Path, initial: int,
               size: int, increments: int, deletes: bool, check: bool, peer: bool,
               profile: bool, log: TextIO | None, append_only: bool = False,
               groups: int | None = None) -> Series:
    """Lands the data of one size in ``work`` and measures every step; see the module doc."""
    from incr.compiler import compile_text
    from incr.oracle import diff_answers
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.replay import check_answers
    from incr.runtime.report import read_answer

    shutil.rmtree(work, ignore_errors=True)
    landing, warehouse = work / "landing", work / "warehouse"
    steps = land(workload, landing, initial, size, increments, deletes, extra=1 if profile else 0,
                 groups=groups)
    compiled = compile_text(workload.program_text(append_only), path=f"{workload.name}.sql",
                            name=workload.name)
    plan = compiled.plan(workload.view)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    pipeline.register()
    batches = pipeline.ledger.batches()
    seq = {b.path: b.seq for b in batches}
    streaming = StreamingPeer(spark, workload, work / "peer", deletes) if peer else None
    series = Series(size)
    if log:
        print(f"\n{label}: {initial:,} initial rows, {increments} increments of {size:,} rows",
              file=log)
        print(f"{'inc':>3} {'kind':<6} {'rows':>9} {'incr_s':>7} {'recomp_s':>8} {'peer_s':>7} "
              f"{'floor_s':>7} {'rec/inc':>7} {'peer/inc':>8} {'inc/floor':>9}  check", file=log,
              flush=True)
    for step in steps[: increments + 1]:
        upto = max(seq[p] for p in step.files.values())
        t0 = time.perf_counter()
        report = pipeline.run(through=upto)
        incremental = time.perf_counter() - t0
        if report.rejected is not None:
            raise report.rejected
        done = [b for b in batches if b.seq <= upto]
        t1 = time.perf_counter()
        recomputed = recompute(spark, compiled, workload, landing, steps[: step.index + 1])
        recompute_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        recompute_duckdb(compiled, workload, landing, steps[: step.index + 1])
        duckdb_s = time.perf_counter() - t2
        floor = floor_seconds(spark, plan, workload, landing, step)
        peer_s = None
        if streaming is not None:
            streaming.feed(landing, step)
            peer_s = streaming.trigger()
        verdict = ""
        if check:
            problems = check_answers(compiled, landing, warehouse, spark, done, recomputed)
            series.mismatches += [f"increment {step.index}: {p}" for p in problems]
            verdict = "ok" if not problems else "MISMATCH"
        parts = breakdown(report)
        answer_rows = int(parts.pop("answer_rows"))
        row = IncrementRow(label, size, step.index, step.kind, initial, step.rows, incremental,
                           recompute_s, peer_s, floor, **parts,
                           other_s=incremental - sum(parts.values()), answer_rows=answer_rows,
                           check=verdict, load1=os.getloadavg()[0], duckdb_s=duckdb_s,
                           stages=_stage_times(report))
        series.rows.append(row)
        if log:
            _print_row(row, log)
    if streaming is not None:
        series.peer_durations = streaming.durations()
        ours, _ = read_answer(warehouse, plan)
        series.peer_diff = diff_answers(ours, streaming.answer())
        series.peer_checked = True
        if log:
            verdict = (f"same answer ({ours.num_rows} rows)" if series.peer_diff is None
                       else f"DIFFERENT: {series.peer_diff}")
            print(f"peer vs incr after increment {increments}: {verdict}", file=log, flush=True)
    if profile:
        series.profile, series.profile_tables = _profile_extra(spark, pipeline,
                                                               steps[increments + 1], seq)
        if log:
            p = series.profile
            print(f"profiled extra increment: {p.total_s:.2f} s, {p.spark_jobs} Spark jobs "
                  f"(empty job {p.empty_job_s * 1000:.0f} ms, shuffle job "
                  f"{p.shuffle_job_s * 1000:.0f} ms)", file=log, flush=True)
    return series


def _profile_extra(spark: SparkSession, pipeline, step: Increment,
                   seq: dict[str, int]) -> tuple[Profile, dict[str, dict[str, float]]]:
    """Applies ``step`` under the tracing profile.

    Also returns incr's per-state-table timings of it (h seconds, MERGE seconds, rows of
    h), summed over the step's batches.
    """
    upto = max(seq[p] for p in step.files.values())
    report, profile = profile_run(spark, lambda: pipeline.run(through=upto))
    if report.rejected is not None:
        raise report.rejected
    tables: dict[str, dict[str, float]] = {}
    for batch in report.applied:
        for view in batch.views:
            for name, t in view.tables.items():
                acc = tables.setdefault(name, {"h_s": 0.0, "merge_s": 0.0, "h_rows": 0})
                for key in acc:
                    acc[key] += t.get(key, 0)
    return profile, tables


def _print_row(r: IncrementRow, log: TextIO) -> None:
    peer = f"{r.peer_s:7.2f}" if r.peer_s is not None else f"{'-':>7}"
    vs_peer = f"{r.vs_peer:8.2f}" if r.peer_s is not None else f"{'-':>8}"
    print(f"{r.increment:>3} {r.kind:<6} {r.rows:>9,} {r.incremental_s:7.2f} {r.recompute_s:8.2f} "
          f"{peer} {r.floor_s:7.2f} {r.speedup:7.1f} {vs_peer} {r.vs_floor:9.2f}  {r.check}",
          file=log, flush=True)

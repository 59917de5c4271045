"""Markdown summaries of benchmark CSVs, for docs/benchmarks.md.

``python -m incr.bench.report docs/bench/groupby.csv ...`` prints, per CSV and increment size,
the headline ratios: at the last increment (what the targets name) and as medians over
increments 1..N (steadier on a shared machine), then the per-increment tables.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from incr.bench.results import IncrementRow, markdown, read_csv


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


HEADER = ("| run | initial rows | size | incr s (inc 1 → last) | recompute s (last) | "
          "peer s (last) | floor s (last) | recompute÷incr last / median | peer÷incr last / "
          "median | incr÷floor last / median | last÷first incr | late÷early inserts |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def _drift(incs: list[IncrementRow]) -> float:
    """Median incr time of the later insert increments over the earlier ones.

    A noise-robust flatness: single increments vary by ±30% on a shared machine; deletes
    are left out.
    """
    inserts = [r.incremental_s for r in incs if r.kind == "insert"]
    half = len(inserts) // 2
    if half == 0:
        return float("nan")
    return _median(inserts[-half:]) / _median(inserts[:half])


def headline(rows: list[IncrementRow]) -> str:
    """One table line per size: last-increment and median ratios (recompute, peer, floor)."""
    out = []
    for size in sorted({r.size for r in rows}):
        run = sorted((r for r in rows if r.size == size), key=lambda r: r.increment)
        incs = [r for r in run if r.increment > 0]
        first, last = incs[0], incs[-1]
        peer = [r.vs_peer for r in incs if r.peer_s is not None]
        peer_cell = (f"{last.vs_peer:.2f} / {_median(peer):.2f}" if peer else "–")
        peer_s = f"{last.peer_s:.2f}" if last.peer_s is not None else "–"
        out.append(
            f"| {run[0].name} | {run[0].initial_rows:,} | {size:,} | {first.incremental_s:.2f} → "
            f"{last.incremental_s:.2f} | {last.recompute_s:.2f} | {peer_s} | {last.floor_s:.2f} | "
            f"{last.speedup:.2f} / {_median([r.speedup for r in incs]):.2f} | {peer_cell} | "
            f"{last.vs_floor:.1f} / {_median([r.vs_floor for r in incs]):.1f} | "
            f"{last.incremental_s / first.incremental_s:.2f} | {_drift(incs):.2f} |")
    return "\n".join(out)


STEPS = ("register files", "read batch", "row index", "view: h + MERGE",
         "answer: a(state) + write", "run bookkeeping")
KINDS = {"Spark job → Arrow": "Spark jobs", "Spark SQL parse/analyse": "Spark analysis",
         "Spark file read setup": "Spark read setup",
         "Delta MERGE": "Delta MERGE", "Delta write": "Delta writes",
         "Delta compaction": "Delta writes", "Delta open (log)": "Delta log reads",
         "driver SQL (DuckDB)": "driver SQL", "state read": "state reads"}
COLUMNS = ("Spark jobs", "Spark read setup", "Spark analysis", "driver SQL", "state reads",
           "Delta MERGE", "Delta writes", "Delta log reads", "Python/other")


def _step(path: list[str]) -> str:
    if len(path) < 2:
        return "run bookkeeping"
    if path[1] == "view":
        return "answer: a(state) + write" if "answer publish" in path else "view: h + MERGE"
    return path[1] if path[1] in STEPS else "run bookkeeping"


def profile_table(path: Path, size: int) -> str:
    """The profiled increment of ``size`` from ``NAME-profile.csv`` as a step × kind table (s)."""
    cells: dict[tuple[str, str], float] = {}
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh):
            if int(rec["size"]) != size:
                continue
            parts = rec["path"].split(" > ")
            key = (_step(parts), KINDS.get(parts[-1], "Python/other"))
            cells[key] = cells.get(key, 0.0) + float(rec["seconds"])
    total = sum(cells.values())
    out = ["| step | " + " | ".join(COLUMNS) + " | total | share |",
           "|---|" + "---:|" * (len(COLUMNS) + 2)]
    for step in STEPS:
        row = [cells.get((step, k), 0.0) for k in COLUMNS]
        if sum(row):
            out.append(f"| {step} | " + " | ".join(f"{v:.3f}" if v else "" for v in row)
                       + f" | {sum(row):.3f} | {sum(row) / total:.0%} |")
    sums = [sum(cells.get((s, k), 0.0) for s in STEPS) for k in COLUMNS]
    out.append("| **total** | " + " | ".join(f"**{v:.3f}**" for v in sums)
               + f" | **{total:.3f}** | 100% |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    """Prints the headline table of every CSV, then their per-increment tables.

    ``--profile NAME-profile.csv SIZE`` prints that profile's step × kind table instead.
    """
    if argv[:1] == ["--profile"]:
        print(profile_table(Path(argv[1]), int(argv[2])))
        return 0
    runs = [read_csv(Path(p)) for p in argv]
    print(HEADER)
    print("\n".join(headline(rows) for rows in runs))
    for path, rows in zip(argv, runs):
        print(f"\n### {path}\n")
        print(markdown(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))

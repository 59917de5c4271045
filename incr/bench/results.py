"""Benchmark results: one row per increment, written as CSV and summarized as Markdown.

Columns (times in seconds, wall clock, on one SparkSession):

``name, size, increment, kind, initial_rows, rows``
    which run and step; ``increment`` 0 is the initial load; ``rows`` are the rows the step
    landed (summed over streams: a join-groupBy increment lands ``size`` rows in each of its
    two streams); ``kind`` is ``insert`` or ``delete``.
``incremental_s``
    incr applying the step (``Pipeline.run`` through the step's last batch: for join-groupBy
    one run applying both streams' batches).
``recompute_s``
    every view recomputed by Spark from all rows live after the step (inserts minus deletes).
``duckdb_s``
    the same recompute by DuckDB on the driver (2 threads).
``peer_s``
    the Structured Streaming peer's ``availableNow`` trigger for the step (see ``peer.py``).
``floor_s``
    reading the step's files and computing h on them (see ``floor.py``).
``read_s, index_s, h_s, merge_s, answer_s, other_s``
    incr's own breakdown from its batch reports: strict read, row index, h (Spark jobs,
    collected), Delta MERGE (+ compaction), answer (a(state) and its write), and the rest
    (ledger, locks, progress reads, untimed steps) = ``incremental_s`` minus the others.
``speedup, vs_peer, vs_floor``
    ``recompute_s / incremental_s``, ``peer_s / incremental_s``, ``incremental_s / floor_s``.
``answer_rows, check``
    rows of incr's answer; ``ok``/``MISMATCH`` when ``--check`` compared it with DuckDB and
    the recompute (empty otherwise).
``stages``
    seconds per stage of each view with more than one (``view:stage=s``, summed over the
    step's batches; the view's own stage is under the view's name).
``load1``
    the machine's 1-minute load average after the step: other work on the machine shows
    up there (the machine has ``nproc`` cores; above that, timings are inflated).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class IncrementRow:
    """One measured step of one run."""

    name: str
    size: int
    increment: int
    kind: str
    initial_rows: int
    rows: int
    incremental_s: float
    recompute_s: float
    peer_s: float | None
    floor_s: float
    read_s: float = 0.0
    index_s: float = 0.0
    h_s: float = 0.0
    merge_s: float = 0.0
    answer_s: float = 0.0
    other_s: float = 0.0
    answer_rows: int = 0
    check: str = ""
    load1: float = 0.0
    duckdb_s: float | None = None
    #: Seconds per stage of each view (``view:stage=s``, space-separated; a view with one
    #: stage is left out): where a nested view's time goes.
    stages: str = ""

    @property
    def speedup(self) -> float:
        return _ratio(self.recompute_s, self.incremental_s)

    @property
    def vs_peer(self) -> float:
        return _ratio(self.peer_s, self.incremental_s)

    @property
    def vs_floor(self) -> float:
        return _ratio(self.incremental_s, self.floor_s)


COLUMNS = ["name", "size", "increment", "kind", "initial_rows", "rows", "incremental_s",
           "recompute_s", "peer_s", "floor_s", "read_s", "index_s", "h_s", "merge_s", "answer_s",
           "other_s", "speedup", "vs_peer", "vs_floor", "answer_rows", "check", "load1",
           "duckdb_s", "stages"]


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def cell(value: object, general: bool = False) -> str:
    """A CSV cell: None and NaN empty, floats to 4 decimals.

    With ``general``, floats outside [1e-3, 1e6) are in ``%g`` form, so tiny errors keep
    their digits.
    """
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4f}" if not general or 1e-3 <= abs(value) < 1e6 else f"{value:.6g}"
    return str(value)


def write_records(path: Path, columns: list[str], records: list[dict[str, object]],
                  general: bool = False) -> None:
    """Writes ``records`` as a CSV with ``columns`` (a missing key is an empty cell)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        for d in records:
            w.writerow([cell(d.get(c), general) for c in columns])


def write_csv(path: Path, rows: list[IncrementRow]) -> None:
    """Writes ``rows`` with :data:`COLUMNS` (ratios included)."""
    write_records(path, COLUMNS, [asdict(r) | {"speedup": r.speedup, "vs_peer": r.vs_peer,
                                               "vs_floor": r.vs_floor} for r in rows])


def read_csv(path: Path) -> list[IncrementRow]:
    """Reads a CSV written by :func:`write_csv` back into rows."""
    out = []
    types = {f.name: f.type for f in fields(IncrementRow)}
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh):
            kw = {}
            for name, typ in types.items():
                raw = rec.get(name, "")
                if "int" in str(typ) and "float" not in str(typ):
                    kw[name] = int(raw)
                elif "float" in str(typ):
                    kw[name] = float(raw) if raw != "" else None
                else:
                    kw[name] = raw
            out.append(IncrementRow(**kw))
    return out


def markdown(rows: list[IncrementRow]) -> str:
    """Per increment size, a Markdown table of times and ratios and one of incr's breakdown."""
    parts = []
    for size in sorted({r.size for r in rows}):
        run = [r for r in rows if r.size == size]
        parts.append(f"**Increments of {size:,} rows** ({run[0].initial_rows:,} initial rows per "
                     f"stream); seconds:\n")
        parts.append("| inc | kind | rows | incr | recompute | peer | floor | recompute/incr | "
                     "peer/incr | incr/floor | load |")
        parts.append("|" + "---:|" * 11)
        for r in run:
            peer = f"{r.peer_s:.2f}" if r.peer_s is not None else "–"
            vs_peer = f"{r.vs_peer:.2f}×" if r.peer_s is not None else "–"
            parts.append(
                f"| {r.increment} | {r.kind} | {r.rows:,} | {r.incremental_s:.2f} | "
                f"{r.recompute_s:.2f} | {peer} | {r.floor_s:.2f} | {r.speedup:.1f}× | {vs_peer} | "
                f"{r.vs_floor:.1f}× | {r.load1:.1f} |")
        parts.append("")
        parts.append("incr's breakdown (seconds):\n")
        parts.append("| inc | read | row index | h | MERGE | answer | other |")
        parts.append("|" + "---:|" * 7)
        for r in run:
            parts.append(f"| {r.increment} | {r.read_s:.2f} | {r.index_s:.2f} | {r.h_s:.2f} | "
                         f"{r.merge_s:.2f} | {r.answer_s:.2f} | {r.other_s:.2f} |")
        parts.append("")
    return "\n".join(parts)

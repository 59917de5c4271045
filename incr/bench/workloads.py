"""The benchmark workloads of the seed paper (§11) and their deterministic data.

Each workload is an incr program plus the streams it reads.  :func:`land` writes an initial
load and a number of equal increments as Parquet in incr's landing layout
(``LANDING/<table>/NNNN.parquet``, deletions under ``LANDING/<table>/_deletes/``), so incr,
the recompute and the Structured Streaming peer all read the very same files.

Values are random integers in [0, 10000] as in the paper; the generator is seeded from the
workload, the increment size and the initial size, so a run is reproducible bit for bit.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from incr.runtime.landing import DELETE, DELETES_DIR, INSERT

VALUE_MAX = 10_000
DELETE_EVERY = 3


@dataclass(frozen=True)
class Stream:
    """One source table of a workload and its (BIGINT) columns."""

    table: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Workload:
    """A benchmark query: its incr program, its streams and the answer's key/value columns."""

    name: str
    program: str
    streams: tuple[Stream, ...]
    key: str
    value: str
    #: Columns drawn from ``[0, groups)`` when a run asks for a number of groups (the
    #: answer's key, and the join key): a warehouse keyed by customer, order or item.
    keyed: tuple[str, ...] = ()

    @property
    def view(self) -> str:
        return self.name

    def program_text(self, append_only: bool = False) -> str:
        """The program's text.

        With ``append_only`` its streams are declared insert-only (header option
        ``append_only``): no row index, plain monoids, delete batches refused.
        """
        if not append_only:
            return self.program
        tables = ", ".join(s.table for s in self.streams)
        return f"-- incr: append_only = {tables}\n{self.program}"


WORKLOADS: dict[str, Workload] = {
    "groupby": Workload(
        "groupby",
        """-- incr: buckets = 8
CREATE TABLE s (x BIGINT, y BIGINT);
CREATE VIEW groupby AS SELECT x, AVG(y) AS avg_y FROM s GROUP BY x;
""",
        (Stream("s", ("x", "y")),), key="x", value="avg_y", keyed=("x",)),
    "joingroupby": Workload(
        "joingroupby",
        """-- incr: buckets = 8
CREATE TABLE xs (a BIGINT, c BIGINT);
CREATE TABLE ys (b BIGINT, c BIGINT);
CREATE VIEW joingroupby AS SELECT xs.a, SUM(ys.b) AS total FROM xs JOIN ys ON xs.c = ys.c GROUP BY xs.a;
""",
        (Stream("xs", ("a", "c")), Stream("ys", ("b", "c"))), key="a", value="total",
        keyed=("a", "c")),
}


@dataclass
class Increment:
    """One step of a run: the initial load (index 0) or an increment landing in every stream.

    ``files`` maps each stream's table to its landed file, relative to the landing root.
    """

    index: int
    kind: str
    rows: int
    files: dict[str, str] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        """The file name every stream's file of this step carries (incr applies by name)."""
        return f"{self.index:04d}.parquet"


def is_delete_step(index: int, deletes: bool) -> bool:
    """Whether increment ``index`` is a delete batch: every third one when deletes are on."""
    return deletes and index > 0 and index % DELETE_EVERY == 0


def land(workload: Workload, landing: Path, initial: int, size: int, increments: int,
         deletes: bool = False, extra: int = 0, groups: int | None = None) -> list[Increment]:
    """Writes the initial load, ``increments`` increments and ``extra`` more insert steps.

    With ``deletes``, every third increment deletes ``size`` rows per stream, drawn at
    random from the rows still live (so every deletion is valid bag difference).  The
    ``extra`` steps (not part of the measured series) let the harness profile one more
    increment on the grown state.  ``groups``: the workload's keyed columns take values in
    ``[0, groups)`` instead of ``[0, 10000]`` (state and answer then grow with the data).

    Returns:
        The steps in apply order, including the extra ones.
    """
    seed = [zlib.crc32(workload.name.encode()), initial, size, increments, int(deletes)]
    rng = np.random.default_rng(seed + ([groups] if groups is not None else []))
    live: dict[str, list[np.ndarray]] = {s.table: [] for s in workload.streams}
    steps: list[Increment] = []
    for index in range(increments + 1 + extra):
        kind = DELETE if index <= increments and is_delete_step(index, deletes) else INSERT
        step = Increment(index, kind, 0)
        for stream in workload.streams:
            rows = initial if index == 0 else size
            if kind == DELETE:
                data = draw_deletes(rng, live[stream.table], rows)
                folder = landing / stream.table / DELETES_DIR
            else:
                data = rng.integers(0, VALUE_MAX + 1, (rows, len(stream.columns)), dtype=np.int64)
                for i, column in enumerate(stream.columns):
                    if groups is not None and column in workload.keyed:
                        data[:, i] = rng.integers(0, groups, rows, dtype=np.int64)
                if deletes:
                    live[stream.table].append(data)
                folder = landing / stream.table
            folder.mkdir(parents=True, exist_ok=True)
            table = pa.table({c: data[:, i] for i, c in enumerate(stream.columns)})
            pq.write_table(table, folder / step.stem)
            step.files[stream.table] = (folder / step.stem).relative_to(landing).as_posix()
            step.rows += len(data)
        steps.append(step)
    return steps


def draw_deletes(rng: np.random.Generator, live: list[np.ndarray], rows: int) -> np.ndarray:
    """Removes ``rows`` random live rows from ``live`` (in place) and returns them."""
    pool = np.concatenate(live) if len(live) > 1 else live[0]
    pick = rng.choice(len(pool), size=min(rows, len(pool)), replace=False)
    chosen = pool[pick]
    live[:] = [np.delete(pool, pick, axis=0)]
    return chosen

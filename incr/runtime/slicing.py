"""Large files applied in slices: runs of a Parquet file's row groups, one batch each.

A backfill lands files far larger than the memory given to Spark.  Reading such a file as
one batch makes every step of it (the row index, each view's fold, the state MERGE) as
large as the file, and a run killed near its end starts that file over.  So when a Parquet
insert file is registered, its footer is read and the file is cut, between row groups, into
:class:`Part` s whose uncompressed size is at most the **slice budget**
(:func:`slice_budget`: ``INCR_SLICE_BYTES``, by default a quarter of the memory of Spark's
driver or, on a cluster, of one executor).  Each part is registered as a batch of its own,
so it is read, indexed, folded and committed exactly once like any batch, and a run that
dies resumes at the first part some table has not committed.

Only Parquet insert files are cut: a row group is the one unit a reader can take out of a
file without reading what comes before it.  A CSV or JSON file is parsed whole (on the
driver), and a delete file stays whole so that it is checked against the live rows in one
piece (a delete of rows that are not live rejects the whole file, not its tail).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from incr.config import Settings
from incr.runtime.landing import INSERT, LandedFile, file_format

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
#: Share of Spark's memory one slice's uncompressed bytes may take.
SLICE_SHARE = 4


@dataclass(frozen=True)
class Part:
    """A run of row groups of one Parquet file, applied as one batch."""

    first: int  # first row group (0-based)
    count: int  # row groups in the run
    of: int  # row groups in the whole file
    rows: int  # rows in the run
    bytes: int  # compressed bytes of the run (what is read)

    def groups(self) -> list[int]:
        return list(range(self.first, self.first + self.count))

    def __str__(self) -> str:
        last = self.first + self.count - 1
        span = f"row group {self.first}" if self.count == 1 else \
            f"row groups {self.first}-{last}"
        return f"{span} of {self.of}"


def memory_bytes(text: str) -> int:
    """A JVM memory setting (``1g``, ``512m``, ``4096``) in bytes."""
    m = _MEMORY.match(text)
    if m is None:
        raise ValueError(f"not a memory size: {text!r} (e.g. 1g, 512m)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def slice_budget(config: Settings, spark_conf: dict[str, str]) -> int:
    """Uncompressed bytes one slice may hold: ``INCR_SLICE_BYTES`` when set, else a
    ``1/SLICE_SHARE`` of the memory a Spark task's process has (``spark_conf``: the
    session's settings; the driver's in ``local`` mode, an executor's on a cluster)."""
    if config.slice_bytes > 0:
        return config.slice_bytes
    key = "spark.driver.memory" if config.spark_master.startswith("local") \
        else "spark.executor.memory"
    return memory_bytes(spark_conf.get(key, "1g")) // SLICE_SHARE


def parts(path: Path, landed: LandedFile, budget: int) -> list[Part]:
    """The slices of a landed file, or ``[]`` when it is applied whole (not a Parquet insert
    file, unreadable (the batch's read says why), or within the budget)."""
    if landed.kind != INSERT or file_format(landed.relpath) != "parquet":
        return []
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception:  # noqa: BLE001 - reading the batch reports what is wrong with it
        return []
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    if len(groups) < 2 or sum(g.total_byte_size for g in groups) <= budget:
        return []
    out: list[Part] = []
    first, raw, rows, size = 0, 0, 0, 0
    for i, g in enumerate(groups):
        if i > first and raw + g.total_byte_size > budget:
            out.append(Part(first, i - first, len(groups), rows, size))
            first, raw, rows, size = i, 0, 0, 0
        raw += g.total_byte_size
        rows += g.num_rows
        size += sum(g.column(c).total_compressed_size for c in range(g.num_columns))
    out.append(Part(first, len(groups) - first, len(groups), rows, size))
    return out

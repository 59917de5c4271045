"""The small program the serving tests run, its batches, and the oracle's answer at each batch.

Two sources; each view reads one of them, so a batch of ``returns`` changes only the view
``returned`` (the sales views get no commit for it), and the sales views differ in how
their answer is written (by change; a top-k rewritten).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from incr.compiler import compile_text
from incr.oracle import live_rows, oracle_answer
from incr.serving.snapshots import AnswerVersion

PROGRAM = """
CREATE TABLE sales (region VARCHAR, amount BIGINT);
CREATE TABLE returns (region VARCHAR, amount BIGINT);
CREATE VIEW by_region AS
SELECT region, SUM(amount) AS total, COUNT(*) AS n, AVG(amount) AS mean FROM sales GROUP BY region;
CREATE VIEW top_regions AS
SELECT region, SUM(amount) AS total FROM sales GROUP BY region ORDER BY total DESC, region LIMIT 2;
CREATE VIEW returned AS SELECT COUNT(*) AS n, SUM(amount) AS total FROM returns;
"""
NAME = "shop"
VIEWS = ("by_region", "top_regions", "returned")
APPLIED = 5  # batches 0..4 applied in the shared warehouse (conftest's ``base``)
SCHEMA = pa.schema([("region", pa.string()), ("amount", pa.int64())])

# (table, kind, rows): batch N is the N-th entry (one file landed and applied at a time).
BATCHES: list[tuple[str, str, list[tuple[str, int]]]] = [
    ("sales", "insert", [("n", 5), ("s", 7), ("w", 4)]),
    ("returns", "insert", [("n", 1)]),
    ("sales", "insert", [("e", 3), ("n", 2)]),
    ("returns", "insert", [("s", 2)]),
    ("sales", "delete", [("n", 5)]),
    ("sales", "insert", [("w", 9), ("e", 1)]),
    ("returns", "insert", [("w", 3), ("e", 1)]),
    ("sales", "insert", [("s", 1)]),
    ("sales", "delete", [("w", 9)]),
]


def write_program(folder: Path) -> Path:
    """Writes the program file (its name is the program's) into ``folder``."""
    path = folder / f"{NAME}.sql"
    path.write_text(PROGRAM)
    return path


def applied_warehouse(spark, root: Path, batches: int) -> tuple[Path, Path, Path]:
    """The program written into ``root`` and its first ``batches`` batches applied, one run
    per batch; returns (program file, landing, warehouse)."""
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    program = write_program(root)
    landing, warehouse = root / "landing", root / "warehouse"
    compiled = compile_program(program)
    for batch in range(batches):
        land(landing, batch)
        report = Pipeline(compiled, landing, warehouse, spark=spark).run()
        assert report.rejected is None, report.rejected
    return program, landing, warehouse


def land(landing: Path, batch: int) -> None:
    """Lands the file of ``batch`` (names sort in batch order)."""
    table, kind, rows = BATCHES[batch]
    folder = landing / table / ("_deletes" if kind == "delete" else "")
    folder.mkdir(parents=True, exist_ok=True)
    data = pa.Table.from_pylist([{"region": r, "amount": a} for r, a in rows], schema=SCHEMA)
    pacsv.write_csv(data, folder / f"{batch:04d}.csv")


@cache
def oracle(view: str, batch: int) -> pa.Table:
    """DuckDB's answer of ``view`` over the batches up to ``batch`` (kept: asked often)."""
    plan = compile_text(PROGRAM, name=NAME).plan(view)
    tables = {}
    for table in ("sales", "returns"):
        def rows(kind: str, table: str = table) -> list[pa.Table]:
            return [pa.Table.from_pylist([{"region": r, "amount": a} for r, a in data], schema=SCHEMA)
                    for t, k, data in BATCHES[: batch + 1] if t == table and k == kind]
        tables[table] = live_rows(rows("insert"), rows("delete"), SCHEMA)
    return oracle_answer(plan.select, tables)


def file_rows(answer: AnswerVersion, deletions: bool = True) -> pa.Table:
    """An answer version's rows read from its files alone (pyarrow, not Delta-aware), less
    the rows its deletion vectors delete by position unless ``deletions`` is False."""
    parts = []
    for file in answer.files:
        rows = pq.read_table(file, schema=answer.schema)
        gone = answer.deleted.get(file)
        if deletions and gone is not None:
            keep = np.ones(rows.num_rows, dtype=bool)
            keep[gone] = False
            rows = rows.filter(pa.array(keep))
        parts.append(rows)
    return pa.concat_tables(parts) if parts else answer.schema.empty_table()

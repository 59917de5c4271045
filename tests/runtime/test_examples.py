"""The example programs of ``sql/examples/`` run as written: every view equals DuckDB.

(PageRank and k-means have their own tests in ``test_iterate.py``; the demo runs
``sales.sql``.)  ``retail.sql`` shows ROLLUP, EXCEPT, INTERSECT and window functions: here it gets insert
batches on both tables and a batch of corrections, checked against DuckDB after each.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from incr.compiler import compile_program
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = {
    "sales": pa.schema([("region", pa.string()), ("store", pa.int64()),
                        ("customer", pa.int64()), ("amount", pa.float64())]),
    "returns": pa.schema([("store", pa.int64()), ("customer", pa.int64()),
                          ("refund", pa.float64())]),
}


def _row(rng: random.Random, table: str) -> dict:
    if table == "sales":
        return {"region": rng.choice(["north", "south", None]), "store": rng.randint(1, 4),
                "customer": rng.randint(1, 6), "amount": rng.randint(1, 400) / 4}
    return {"store": rng.randint(1, 4), "customer": rng.randint(1, 6),
            "refund": rng.randint(1, 100) / 4}


@pytest.mark.parametrize("local_rows", [0, 200_000], ids=["spark", "driver"])
def test_retail_example_equals_duckdb_after_every_batch(spark, tmp_path, local_rows):
    compiled = compile_program(REPO / "sql/examples/retail.sql")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    rng = random.Random(7)
    live: dict[str, list[dict]] = {t: [] for t in SCHEMAS}
    steps = [("sales", "insert"), ("returns", "insert"), ("sales", "insert"),
             ("sales", "delete"), ("returns", "delete")]
    for seq, (table, op) in enumerate(steps):
        if op == "insert":
            rows = [_row(rng, table) for _ in range(25)]
            live[table] += rows
        else:
            rows = rng.sample(live[table], 8)
            for r in rows:
                live[table].remove(r)
        folder = landing / table / ("_deletes" if op == "delete" else "")
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMAS[table]),
                        folder / f"{seq:04d}.csv")
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        sources = {t: pa.Table.from_pylist(r, schema=SCHEMAS[t]) for t, r in live.items()}
        landed = {t for t, _ in steps[:seq + 1]}
        for plan in compiled.plans:
            if not landed & set(plan.sources):
                continue  # no batch of its sources yet: no answer either
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(oracle_answer(plan.select, sources), answer, ordered=plan.ordered)
            assert diff is None, f"after batch {seq} ({op} on {table}), view {plan.view}: {diff}"

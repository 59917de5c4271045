"""Crash test: kill ``incr run`` inside a batch at every crash point, re-run, compare with the oracle.

Each run is a real process (``python -m incr.cli run``) that ``INCR_CRASH_AT`` kills with
``os._exit`` at one point of one batch: before anything, after the row index committed,
before a state merge, between the state tables' merge commits (the first view's first one:
a nested stage's), between a nested stage's output change and its kept rows, after all
state but before the answer, after the answer.  The next run must finish the
interrupted batch and go on without applying anything twice or skipping anything.  After
every crash, the answer table BI tools see must be a consistent answer: the oracle's answer
as of the batch it records.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
from deltalake import DeltaTable

from incr.compiler import compile_program
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.faults import CRASH_EXIT
from incr.runtime.report import read_answer

PROGRAM = """-- incr: buckets = 2
CREATE TABLE s (g VARCHAR, v BIGINT);
CREATE VIEW shares AS SELECT COUNT(*) AS n, SUM(share) AS total, MIN(share) AS lo,
MAX(share) AS hi FROM (SELECT g, SUM(CAST(v AS DOUBLE) / 7) AS share FROM s GROUP BY g) AS q;
CREATE VIEW per_group AS
SELECT g, SUM(v) AS total, COUNT(*) AS n, MIN(v) AS lo, COUNT(DISTINCT v) AS dv FROM s GROUP BY g;
CREATE VIEW everything AS SELECT COUNT(*) AS n, SUM(v) AS total, MAX(v) AS hi FROM s;
"""
SCHEMA = pa.schema([("g", pa.string()), ("v", pa.int64())])

# (crash point, batch it fires in); batch 3 is a delete batch.
CRASHES = [("batch.start", 1), ("index.after_commit", 2), ("view.before_merge", 3),
           ("view.after_merge", 4), ("view.before_keep", 5), ("view.after_state", 6),
           ("view.after_answer", 7)]


def _batches() -> list[tuple[str, list[dict]]]:
    out = []
    for b in range(8):
        if b == 3:
            out.append(("delete", [{"g": "a", "v": 1}, {"g": "b", "v": 11}]))
        else:
            out.append(("insert", [{"g": g, "v": b * 10 + i} for i, g in enumerate("abc")]
                        + [{"g": "a", "v": 1}]))
    return out


def _run(program: Path, landing: Path, warehouse: Path, crash: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "INCR_CRASH_AT"}
    if crash:
        env["INCR_CRASH_AT"] = crash
    env["INCR_SPARK_CONF"] = "spark.sql.shuffle.partitions=2,spark.driver.memory=1g"
    proc = subprocess.run([sys.executable, "-m", "incr.cli", "run", str(program), "--landing",
                           str(landing), "--warehouse", str(warehouse)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode not in (0, CRASH_EXIT):
        raise AssertionError(f"incr run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode


def _live(batches: list[tuple[str, list[dict]]], through: int) -> pa.Table:
    rows: list[dict] = []
    for kind, data in batches[: through + 1]:
        if kind == "insert":
            rows += data
        else:
            for r in data:
                rows.remove(r)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_killed_runs_resume_exactly_once(tmp_path: Path):
    program = tmp_path / "crashy.sql"
    program.write_text(PROGRAM)
    compiled = compile_program(program)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    batches = _batches()
    for seq, (kind, rows) in enumerate(batches):
        folder = landing / "s" / ("_deletes" if kind == "delete" else "")
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"{seq:03d}.csv")

    for point, batch in CRASHES:
        assert _run(program, landing, warehouse, f"{point}:{batch}") == CRASH_EXIT, point
        for plan in compiled.plans:
            answer, seen = read_answer(warehouse, plan)
            assert seen is not None and seen <= batch
            diff = diff_answers(oracle_answer(plan.select, {"s": _live(batches, seen)}), answer)
            assert diff is None, f"after a crash at {point}:{batch}, {plan.view} as of batch {seen}: {diff}"

    assert _run(program, landing, warehouse, None) == 0
    last = len(batches) - 1
    for plan in compiled.plans:
        answer, seen = read_answer(warehouse, plan)
        assert seen == last
        diff = diff_answers(oracle_answer(plan.select, {"s": _live(batches, last)}), answer)
        assert diff is None, f"{plan.view} after recovery: {diff}"
        # Every state table is at the last batch (the oracle check above shows that no batch
        # was applied twice: SUM and COUNT would be off).
        root = warehouse / "state" / plan.view / plan.state_fingerprint
        for table in (*plan.tables, *plan.kept()):
            assert DeltaTable(str(root / table.name)).transaction_version("incr") == last

"""The per-view tasks of one program run in parallel, as Airflow runs them, without retries.

Airflow starts ``apply_<view>`` tasks as separate processes at the same time.  Each must
lock only its own view (or the state it shares with other views): a task that found another
view's task running used to fail with "program ... is being updated" and only got through on
a retry.  These tests run the task bodies as real processes (``incr.orchestration.tasks``),
concurrently, and while another view's task is stopped in the middle of its work.  A small
batch never starts Spark there.  ``totals`` and ``spread`` share one state (same source and
grouping): the second of their tasks waits for the first, then publishes from what it folded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from incr.compiler import compile_program
from incr.errors import StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.orchestration.tasks import apply_view, prepare_batches
from incr.runtime import maintain
from incr.runtime.report import read_answer

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
CREATE VIEW best AS SELECT MAX(pts) AS best, MIN(pts) AS worst FROM e;
CREATE VIEW spread AS SELECT who, COUNT(DISTINCT pts) AS kinds FROM e GROUP BY who;
"""
SCHEMA = pa.schema([("who", pa.string()), ("pts", pa.int64())])
# Run by each task process: the task body, then whether Spark was ever imported.
TASK = """
import json, sys
from pathlib import Path
from incr.orchestration.tasks import apply_view
out = apply_view(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
print(json.dumps({"batches": len(out["batches"]), "spark": "pyspark" in sys.modules}))
"""


def _land(landing: Path, name: str, rows: list[dict]) -> None:
    (landing / "e").mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), landing / "e" / name)


def _task(program: Path, landing: Path, warehouse: Path, view: str,
          through: int) -> subprocess.Popen:
    env = dict(os.environ, INCR_LOCK_WAIT_S="0")
    return subprocess.Popen([sys.executable, "-c", TASK, str(program), str(landing), str(warehouse),
                             view, str(through)], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return {**json.loads(out.strip().splitlines()[-1]), "log": out}


def _check(program: Path, warehouse: Path, rows: list[dict], batch: int) -> None:
    live = pa.Table.from_pylist(rows, schema=SCHEMA)
    for plan in compile_program(program).plans:
        answer, at = read_answer(warehouse, plan)
        assert at == batch, plan.view
        assert diff_answers(oracle_answer(plan.select, {"e": live}), answer) is None, plan.view


@pytest.fixture
def started(spark, tmp_path):
    """A program whose first batch is applied (tables created: that needs Spark once)."""
    program = tmp_path / "games.sql"
    program.write_text(PROGRAM)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    rows = [{"who": "ann", "pts": 3}, {"who": "bob", "pts": 5}]
    _land(landing, "001.csv", rows)
    from incr.runtime.pipeline import Pipeline

    Pipeline(compile_program(program), landing, warehouse, spark=spark).run()
    return program, landing, warehouse, rows


def test_view_tasks_run_at_once_without_spark(started):
    program, landing, warehouse, rows = started
    compiled = compile_program(program)
    assert compiled.plan("totals").shares == compiled.plan("spread").shares is not None
    more = [{"who": "ann", "pts": 9}, {"who": "cy", "pts": 1}]
    _land(landing, "002.csv", more)
    prepared = prepare_batches(program, str(landing), str(warehouse))
    assert prepared["ready_through"] == 1 and not prepared["rejected"]
    procs = [_task(program, landing, warehouse, view, 1) for view in prepared["views"]]
    results = [_finish(p) for p in procs]
    assert [r["batches"] for r in results] == [1, 1, 1]
    logs = dict(zip(prepared["views"], (r["log"] for r in results)))
    for log in logs.values():  # the task's log says how far it is
        assert "progress: 1/1 batches · " in log, log
    # The first of the tasks sharing a state folds the batch; the other, if the state is
    # folded by the time it looks, only publishes from it (reading no batch).
    assert "· 2 rows" in logs["best"] and ("· 2 rows" in logs["totals"] or
                                          "· 2 rows" in logs["spread"]), logs
    assert not any(r["spark"] for r in results), "a small batch started Spark"
    _check(program, warehouse, rows + more, 1)


def test_a_view_task_is_not_blocked_by_another_one_in_progress(started, monkeypatch):
    program, landing, warehouse, rows = started
    more = [{"who": "bob", "pts": 2}]
    _land(landing, "002.csv", more)
    through = prepare_batches(program, str(landing), str(warehouse))["ready_through"]

    # The task of view `totals` stops in the middle of its batch (its lock held) ...
    inside, release = threading.Event(), threading.Event()
    original = maintain.ViewRuntime.apply

    def paused(self, *args, **kwargs):
        inside.set()
        assert release.wait(300)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(maintain.ViewRuntime, "apply", paused)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        apply_view(program, str(landing), str(warehouse), "totals", through)))
    worker.start()
    try:
        assert inside.wait(300)
        # ... while the task of a view with a state of its own runs to the end, in its own
        # process, and that of `spread`, which shares the state of `totals`, waits for it.
        sharing = _task(program, landing, warehouse, "spread", through)
        assert _finish(_task(program, landing, warehouse, "best", through))["batches"] == 1
        with pytest.raises(subprocess.TimeoutExpired):
            sharing.communicate(timeout=3)
        # A whole run of the program must wait for `totals`: it says which lock is held.
        from incr.runtime.pipeline import Pipeline

        with pytest.raises(StorageError, match=r"the state views totals, spread share \(program games\) "
                                               r"is being updated by pid"):
            Pipeline(compile_program(program), landing, warehouse).run()
    finally:
        release.set()
        worker.join(300)
    assert len(result["batches"]) == 1
    assert _finish(sharing)["batches"] == 1  # the batch folded by `totals`: a(state) only
    _check(program, warehouse, rows + more, 1)

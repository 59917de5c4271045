"""Batches of several tables pending at once are folded as one step (``Pipeline._group``).

A run that finds a batch of ``xs`` and one of ``ys`` waiting folds them into a view that
joins them at once: one Δ (a term per changed input, as for a self-join), one MERGE per
state table, one answer commit, every table recording the step's last batch.  These tests
check what the equivalence suites (which draw runs after one or several batches) cannot see
from the answers alone: that a step really is one fold, that a rejected or oversized batch
ends it with the batches before it applied, and that a run killed inside a step is finished
by the next exactly as it began, whatever that run's own rules would have grouped.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from incr.compiler import compile_program
from incr.config import Settings
from incr.errors import OutOfRangeError
from incr.runtime.faults import CRASH_EXIT
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from tests.runtime.killing import Stream, check_answers, kill_env, run_argv

PROGRAM = """-- incr: buckets = 2
CREATE TABLE xs (a BIGINT, c BIGINT);
CREATE TABLE ys (b BIGINT, c BIGINT);
CREATE VIEW joined AS
SELECT xs.a, SUM(ys.b) AS total, COUNT(*) AS n FROM xs JOIN ys ON xs.c = ys.c GROUP BY xs.a;
CREATE VIEW spread AS SELECT COUNT(*) AS groups, SUM(t) AS total, MAX(t) AS hi
FROM (SELECT xs.a, SUM(ys.b) AS t FROM xs JOIN ys ON xs.c = ys.c GROUP BY xs.a) AS q;
CREATE VIEW xs_only AS SELECT a, COUNT(*) AS n FROM xs GROUP BY a;
"""
SCHEMAS = {"xs": pa.schema([("a", pa.int64()), ("c", pa.int64())]),
           "ys": pa.schema([("b", pa.int64()), ("c", pa.int64())])}


def _rows(rng: random.Random, table: str, n: int) -> list[dict]:
    first = "a" if table == "xs" else "b"
    return [{first: rng.randint(0, 5), "c": rng.randint(0, 6)} for _ in range(n)]


def _setup(tmp_path: Path):
    program = tmp_path / "grouped.sql"
    program.write_text(PROGRAM)
    compiled = compile_program(program)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    return program, compiled, landing, warehouse, Stream(landing, SCHEMAS), random.Random(7)


def _recorded(warehouse: Path, plan) -> dict[str, int]:
    """The batch every state table of a view records (its last commit's)."""
    root = warehouse / "state" / plan.view / plan.state_fingerprint
    return {t.name: DeltaTable(str(root / t.name)).transaction_version("incr")
            for t in (*plan.tables, *plan.kept()) if (root / t.name).exists()}


def test_batches_of_two_tables_pending_together_are_one_step(spark, tmp_path):
    _, compiled, landing, warehouse, stream, rng = _setup(tmp_path)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    stream.land("xs", "insert", _rows(rng, "xs", 12))
    stream.land("ys", "insert", _rows(rng, "ys", 9))
    report = pipeline.run()
    assert [b.seq for b in report.applied] == [0, 1]
    # joined and spread fold both batches as one step (batch 1); xs_only reads batch 0 alone.
    assert [(m.view, m.rows_in) for m in report.applied[0].views] == [("xs_only", 12)]
    assert sorted((m.view, m.rows_in) for m in report.applied[1].views) == [
        ("joined", 21), ("spread", 21)]
    check_answers(compiled, warehouse, stream, "after the first step")
    joined = next(p for p in compiled.plans if p.view == "joined")
    assert set(_recorded(warehouse, joined).values()) == {1}

    # Deletes of both tables are one step, the insert after them another; a second batch of
    # a table already in the step begins the next one.
    stream.land("xs", "delete", stream.live["xs"][:4])
    stream.land("ys", "delete", stream.live["ys"][2:5])
    stream.land("xs", "insert", _rows(rng, "xs", 3))
    stream.land("ys", "insert", _rows(rng, "ys", 2))
    stream.land("ys", "insert", _rows(rng, "ys", 2))
    report = pipeline.run()
    steps = [(b.seq, sorted(m.view for m in b.views)) for b in report.applied]
    assert steps == [(2, ["xs_only"]), (3, ["joined", "spread"]), (4, ["xs_only"]),
                     (5, ["joined", "spread"]), (6, ["joined", "spread"])]
    check_answers(compiled, warehouse, stream, "after deletes and inserts together")


def test_grouping_off_folds_one_batch_per_step(spark, tmp_path):
    _, compiled, landing, warehouse, stream, rng = _setup(tmp_path)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark,
                        config=Settings(group_batches=False))
    stream.land("xs", "insert", _rows(rng, "xs", 5))
    stream.land("ys", "insert", _rows(rng, "ys", 5))
    report = pipeline.run()
    assert sorted(m.view for m in report.applied[1].views) == ["joined", "spread"]
    assert sorted(m.view for m in report.applied[0].views) == ["joined", "spread", "xs_only"]
    check_answers(compiled, warehouse, stream, "one batch per step")


def test_a_batch_too_large_for_the_driver_beside_the_others_begins_the_next_step(spark, tmp_path):
    _, compiled, landing, warehouse, stream, rng = _setup(tmp_path)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=10)
    stream.land("xs", "insert", _rows(rng, "xs", 6))
    stream.land("ys", "insert", _rows(rng, "ys", 6))  # 12 rows together: over the driver's 10
    report = pipeline.run()
    assert [sorted(m.view for m in b.views) for b in report.applied] == [
        ["joined", "spread", "xs_only"], ["joined", "spread"]]
    assert all(m.engine == "driver" for b in report.applied for m in b.views)
    check_answers(compiled, warehouse, stream, "after a step cut by size")


def test_a_rejected_batch_ends_the_step_and_the_batches_before_it_apply(spark, tmp_path):
    _, compiled, landing, warehouse, stream, rng = _setup(tmp_path)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    stream.land("xs", "insert", _rows(rng, "xs", 8))
    stream.land("ys", "insert", _rows(rng, "ys", 8))
    pipeline.run()
    stream.land("xs", "insert", _rows(rng, "xs", 4))
    bad = landing / "ys" / "00003.csv"
    bad.write_text("b,c\n1,2\nnot a number,3\n")
    report = pipeline.run()
    assert report.rejected is not None and report.rejected_batch.seq == 3
    assert "00003.csv" in str(report.rejected)
    assert [b.seq for b in report.applied] == [2]
    assert sorted(m.view for m in report.applied[0].views) == ["joined", "spread", "xs_only"]
    check_answers(compiled, warehouse, stream, "after the rejected batch")

    bad.unlink()
    stream.land("ys", "insert", _rows(rng, "ys", 3))  # the fixed batch, as a new file
    report = pipeline.run()
    assert report.rejected is None
    check_answers(compiled, warehouse, stream, "after the fix")


def test_a_step_past_a_bigint_is_rejected_at_its_first_batch_and_changes_nothing(spark, tmp_path):
    """Each batch alone fits, the step does not: 2 x 2 join pairs of 2^62 leave BIGINT."""
    _, compiled, landing, warehouse, stream, _ = _setup(tmp_path)
    joined = next(p for p in compiled.plans if p.view == "joined")
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    stream.land("xs", "insert", [{"a": 1, "c": 1}])
    stream.land("ys", "insert", [{"b": 2 ** 62, "c": 1}])
    assert pipeline.run().rejected is None
    before = read_answer(warehouse, joined)
    stream.land("xs", "insert", [{"a": 1, "c": 1}])
    stream.land("ys", "insert", [{"b": 2 ** 62, "c": 1}])
    report = pipeline.run()
    assert isinstance(report.rejected, OutOfRangeError), report.rejected
    assert report.rejected_batch.seq == 2 and report.applied == []
    message = str(report.rejected)
    assert "00002.csv" in message and "00003.csv" in message and "one step" in message, message
    assert read_answer(warehouse, joined) == before

    # The state (whose sums are wider than the answer's column) took the step; the answer,
    # published at its last batch, is refused again, and stays as it was.
    report = pipeline.run()
    assert isinstance(report.rejected, OutOfRangeError), report.rejected
    assert report.rejected_batch.seq == 3 and "00003.csv" in str(report.rejected)
    assert read_answer(warehouse, joined) == before


def _run(program: Path, landing: Path, warehouse: Path, crash: str | None = None,
         grouping: bool = True) -> int:
    env = kill_env(INCR_GROUP_BATCHES="1" if grouping else "0",
                   **({"INCR_CRASH_AT": crash} if crash else {}))
    proc = subprocess.run(run_argv(program, landing, warehouse), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode not in (0, CRASH_EXIT):
        raise AssertionError(f"incr run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode


def test_a_run_killed_inside_a_step_is_finished_exactly_as_it_began(tmp_path):
    program, compiled, landing, warehouse, stream, rng = _setup(tmp_path)
    joined = next(p for p in compiled.plans if p.view == "joined")
    stream.land("xs", "insert", _rows(rng, "xs", 10))
    stream.land("ys", "insert", _rows(rng, "ys", 10))
    assert _run(program, landing, warehouse) == 0
    seq = 2
    # Killed before and between state commits, and after all state before the answer, inside
    # a step of an xs and a ys batch.  The next run has grouping off (its own rules would
    # fold one batch at a time) or on with one more batch landed: either way it must finish
    # the killed step as one, then go on.
    for point, kind, grouping in (("view.after_merge", "insert", False),
                                  ("view.before_merge", "delete", True),
                                  ("view.after_state", "insert", True),
                                  ("view.after_merge", "delete", False)):
        if kind == "insert":
            stream.land("xs", "insert", _rows(rng, "xs", 5))
            stream.land("ys", "insert", _rows(rng, "ys", 4))
        else:
            stream.land("xs", "delete", stream.live["xs"][:3])
            stream.land("ys", "delete", stream.live["ys"][1:3])
        assert _run(program, landing, warehouse, f"{point}:{seq + 1}") == CRASH_EXIT, point
        check_answers(compiled, warehouse, stream, f"after a kill at {point}:{seq + 1}")
        if point == "view.after_merge":  # the step is half folded: a table at its last batch
            at = set(_recorded(warehouse, joined).values())
            assert seq + 1 in at and min(at) < seq, at
        stream.land("xs", "insert", _rows(rng, "xs", 2))
        assert _run(program, landing, warehouse, grouping=grouping) == 0
        check_answers(compiled, warehouse, stream, f"after the run that followed {point}")
        seq += 3
    assert max(_recorded(warehouse, joined).values()) == seq - 1

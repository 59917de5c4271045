"""Housekeeping over many batches: files stay bounded, time travel inside the window stays right.

200 batches of inserts and deletes go through a program with an answer maintained by change,
a global aggregate and a top-k (each publishing differently), with ``incr maintain``'s
``maintain`` every 25 batches keeping the last 10 batches' answer versions.  After every
housekeeping the data files on disk are bounded (they do not grow with the batches), every
answer equals the oracle, every kept batch's answer equals the oracle as of that batch, an
older one is refused with a clear message, and later batches apply without a republish.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from incr.compiler import compile_program
from incr.config import Settings
from incr.errors import StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.housekeeping import delta_tables, due, maintain, versions_of_last_batches
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

PROGRAM = """\
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
CREATE VIEW best AS SELECT MAX(pts) AS best, COUNT(*) AS n FROM e;
CREATE VIEW top AS SELECT who, SUM(pts) AS s FROM e GROUP BY who ORDER BY s DESC, who LIMIT 3;
"""
SCHEMA = pa.schema([("who", pa.string()), ("pts", pa.int64())])
BATCHES, EVERY, KEEP = 200, 25, 10


def _data_files(warehouse: Path) -> int:
    return sum(1 for p in warehouse.rglob("*.parquet") if "_delta_log" not in p.parts)


def _equal(plan, live: list[dict], answer: pa.Table) -> bool:
    return diff_answers(oracle_answer(plan.select, {"e": pa.Table.from_pylist(live, schema=SCHEMA)}),
                        answer) is None


def test_files_stay_bounded_and_time_travel_inside_the_window_is_right(spark, tmp_path):
    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    compiled = compile_program(program)
    config = Settings(keep_batches=KEEP, keep_hours=0.0)
    rng = random.Random(7)
    live: list[dict] = []
    history: list[list[dict]] = []  # live rows after each batch
    counts: list[int] = []
    refused = 0  # reads outside the window that found their files vacuumed
    for seq in range(BATCHES):
        folder = landing / "e"
        if seq % 5 == 4 and live:  # every fifth batch deletes a few live rows
            gone = rng.sample(live, min(len(live), rng.randrange(1, 4)))
            for row in gone:
                live.remove(row)
            rows, folder = gone, folder / "_deletes"
        else:
            rows = [{"who": f"w{rng.randrange(30)}", "pts": rng.randrange(100)} for _ in range(8)]
            live.extend(rows)
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"{seq:04d}.csv")
        pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
        assert pipeline.run().rejected is None
        history.append(list(live))
        if seq % EVERY != EVERY - 1:
            continue

        upkeep = maintain(pipeline, config)
        counts.append(_data_files(warehouse))
        assert {u.kind for u in upkeep} == {"answer", "internal"}
        assert all(u.files_after <= u.files_before for u in upkeep)
        for plan in compiled.plans:
            answer, batch = read_answer(warehouse, plan)
            assert batch == seq and _equal(plan, live, answer), plan.view
            kept = versions_of_last_batches(pipeline.store, pipeline.views[plan.view].answer_path, KEEP)
            assert kept  # the window holds versions
            for back in (0, KEEP // 2, KEEP - 1):  # inside the window: the answer as of then
                old, _ = read_answer(warehouse, plan, seq - back)
                assert _equal(plan, history[seq - back], old), (plan.view, seq - back)
            if seq >= KEEP + EVERY:  # outside: refused, saying why, unless its files are all
                # still there (deletion vectors relabel files instead of replacing them): then
                # it is the answer as of then
                try:
                    old, _ = read_answer(warehouse, plan, seq - KEEP - 3)
                except StorageError as e:
                    assert "housekeeping" in str(e), e
                    refused += 1
                else:
                    assert _equal(plan, history[seq - KEEP - 3], old), (plan.view, "outside")
    assert refused, "no read outside the window found its files vacuumed"
    # Bounded: the files on disk go up and down with compactions but do not grow with the
    # batches (without housekeeping these 200 batches leave over 5,000).
    half = len(counts) // 2
    assert max(counts[half:]) <= 1.5 * max(counts[:half]), counts
    assert max(counts) < BATCHES, counts
    # Nothing is republished after housekeeping: the next batch is an ordinary one.
    assert all(v.answer_through() == BATCHES - 1 for v in pipeline.views.values())


def test_housekeeping_is_due_once_a_period_passed(tmp_path):
    meta = tmp_path / "_incr" / "p"
    assert due(meta, 24.0)
    meta.mkdir(parents=True)
    (meta / "housekeeping.json").write_text(json.dumps({"at": time.time()}))
    assert not due(meta, 24.0)
    assert due(meta, 24.0, now=time.time() + 25 * 3600)
    assert due(meta, 0.0)


def test_delta_tables_are_found_outermost_only(tmp_path):
    for table in ("a", "b/c", "b/d"):
        (tmp_path / table / "_delta_log").mkdir(parents=True)
        (tmp_path / table / "_bucket=0").mkdir()
    assert [p.relative_to(tmp_path).as_posix() for p in delta_tables(tmp_path)] == ["a", "b/c", "b/d"]
    assert list(delta_tables(tmp_path / "missing")) == []

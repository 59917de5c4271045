"""Backfill: a file larger than the slice budget applies in row-group slices, a batch each.

The slices of a file cover its row groups once each, in order; every view equals DuckDB over
the whole file after the last slice (on the driver and in Spark, whose slices are read from
scratch copies that are gone afterwards); a run that dies in the middle of a file resumes at
the slice it was applying; a delete file spanning the slices is checked against the live
rows as one; a file with a NULL in a NOT NULL column is rejected at its first slice, naming
the file's row, before any of it is applied; a sliced file that changed before any table
applied it is sliced again; skipping or archiving a sliced file takes all its slices.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr import cli
from incr.compiler import compile_text
from incr.config import Settings
from incr.errors import StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime import faults
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

PROGRAM = """\
CREATE TABLE e (id BIGINT NOT NULL, who VARCHAR, pts BIGINT, note VARCHAR);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n, MIN(pts) AS low
  FROM e GROUP BY who;
CREATE VIEW overall AS SELECT COUNT(*) AS n, SUM(pts) AS total, MAX(id) AS top FROM e;
"""
SCHEMA = pa.schema([("id", pa.int64()), ("who", pa.string()), ("pts", pa.int64()),
                    ("note", pa.string())])
GROUP_ROWS = 500


def _rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "who": [f"w{i % 37}" for i in ids], "pts": [i % 101 - 50 for i in ids],
                     "note": [f"row {i} " + "x" * (i % 13) for i in ids]}, schema=SCHEMA)


def _land(landing: Path, name: str, data: pa.Table, delete: bool = False) -> Path:
    folder = landing / "e" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, folder / name, row_group_size=GROUP_ROWS)
    return folder / name


def _pipeline(compiled, landing: Path, warehouse: Path, spark, engine: str) -> Pipeline:
    """Slices of about three row groups; ``engine`` driver: each slice read on the driver."""
    config = Settings(slice_bytes=3 * _group_bytes(), local_rows=100_000 if engine == "driver" else 0)
    return Pipeline(compiled, landing, warehouse, spark=spark, config=config)


def _group_bytes() -> int:
    """Uncompressed bytes of one row group of :func:`_rows`, as the footer counts them."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"incr-probe-{os.getpid()}.parquet"
    pq.write_table(_rows(0, GROUP_ROWS), path, row_group_size=GROUP_ROWS)
    try:
        return pq.ParquetFile(path).metadata.row_group(0).total_byte_size + 64
    finally:
        path.unlink()


def _check(compiled, warehouse: Path, live: pa.Table) -> None:
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, {"e": live}), answer) is None, plan.view


@pytest.mark.parametrize("engine", ["driver", "spark"])
def test_a_large_file_applies_in_slices_and_equals_the_oracle(spark, dirs, engine):
    landing, warehouse = dirs
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    big = _rows(0, 20 * GROUP_ROWS)
    _land(landing, "001.parquet", big)
    small = _rows(10**6, 40)
    _land(landing, "002.parquet", small)  # within the budget: whole
    pipeline = _pipeline(compiled, landing, warehouse, spark, engine)
    lines: list[str] = []
    report = pipeline.run(emit=lambda line, last: lines.append(line))
    assert report.rejected is None, report.rejected

    batches = pipeline.ledger.batches()
    slices = [b for b in batches if b.path == "e/001.parquet"]
    assert 7 <= len(slices) <= 10 and batches[-1].part is None  # 20 groups, 2 or 3 a slice
    assert all(b.part.count in (2, 3) for b in slices)
    assert [g for b in slices for g in b.part.groups()] == list(range(20))
    assert sum(b.part.rows for b in slices) == big.num_rows
    assert [r.rows for r in report.applied] == [b.part.rows for b in slices] + [40]
    assert f"{len(batches)}/{len(batches)} batches (slices) of 2/2 files" in lines[-1]
    assert not list(pipeline.scratch.glob("*")) if pipeline.scratch.exists() else True
    live = pa.concat_tables([big, small])
    _check(compiled, warehouse, live)

    # A delete file reaching into several slices' rows is checked against the live rows whole.
    gone = live.take(list(range(0, live.num_rows, 97)))
    _land(landing, "003.parquet", gone, delete=True)
    assert pipeline.run().rejected is None
    remaining = pa.Table.from_pylist([r for i, r in enumerate(live.to_pylist()) if i % 97],
                                     schema=SCHEMA)
    _check(compiled, warehouse, remaining)
    # Deleting them again: not live any more, rejected whole, nothing changes.
    _land(landing, "004.parquet", gone.slice(0, 5), delete=True)
    rejected = pipeline.run().rejected
    assert rejected is not None and "not live" in str(rejected)
    _check(compiled, warehouse, remaining)


class _Killed(Exception):
    pass


def test_a_run_killed_inside_a_file_resumes_at_the_slice_it_was_applying(spark, dirs, monkeypatch):
    landing, warehouse = dirs
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    big = _rows(0, 12 * GROUP_ROWS)
    _land(landing, "001.parquet", big)

    def crash(name: str, batch: int) -> None:  # dies after a view's state, before its answer
        if (name, batch) == ("view.after_state", 2):
            raise _Killed
    monkeypatch.setattr(faults, "crash_point", crash)
    with pytest.raises(_Killed):
        _pipeline(compiled, landing, warehouse, spark, "driver").run()
    monkeypatch.undo()

    pipeline = _pipeline(compiled, landing, warehouse, spark, "driver")
    pipeline.scratch.mkdir(parents=True, exist_ok=True)  # a slice copy a killed process left
    (pipeline.scratch / "slice-999999999-0a1b2c.parquet").write_bytes(b"PAR1")
    mine = pipeline.scratch / f"slice-{os.getpid()}-0a1b2c.parquet"
    mine.write_bytes(b"PAR1")  # a live process's: kept
    slices = len(pipeline.ledger.batches())
    assert slices >= 4
    assert [v.through() for v in pipeline.views.values()] == [1, 1]
    report = pipeline.run()
    assert report.rejected is None
    assert [r.seq for r in report.applied] == list(range(2, slices))  # 0 and 1 not read again
    assert [p.name for p in pipeline.scratch.iterdir()] == [mine.name]
    mine.unlink()
    _check(compiled, warehouse, big)


def test_a_null_in_a_not_null_column_rejects_the_file_at_its_first_slice(spark, dirs):
    landing, warehouse = dirs
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    rows = _rows(0, 9 * GROUP_ROWS).to_pylist()
    rows[7 * GROUP_ROWS + 11]["id"] = None  # in the file's third slice
    _land(landing, "001.parquet", pa.Table.from_pylist(rows, schema=SCHEMA))
    pipeline = _pipeline(compiled, landing, warehouse, spark, "driver")
    report = pipeline.run()
    assert report.rejected is not None and report.rejected_batch.seq == 0
    assert f"row {7 * GROUP_ROWS + 12}, column id: NULL in a NOT NULL column" in str(report.rejected)
    assert not report.applied
    assert all(v.through() < 0 for v in pipeline.views.values())

    # Fixed before anything applied it: its slices are cut again, and it applies.
    rows[7 * GROUP_ROWS + 11]["id"] = 10**9
    fixed = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(fixed, landing / "e" / "001.parquet", row_group_size=2 * GROUP_ROWS)
    again = pipeline.run()
    assert again.rejected is not None and "registered again" in str(again.rejected)
    report = pipeline.run()
    assert report.rejected is None, report.rejected
    assert [b.part.count for b in pipeline.ledger.batches()] == [1] * 5  # 2-group row groups now
    _check(compiled, warehouse, fixed)


def test_skip_and_archive_take_a_sliced_file_whole(spark, dirs, tmp_path):
    landing, warehouse = dirs
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    _land(landing, "001.parquet", _rows(0, 9 * GROUP_ROWS))
    pipeline = _pipeline(compiled, landing, warehouse, spark, "driver")
    pipeline.register()
    first = len(pipeline.ledger.batches())
    assert first >= 3
    pipeline.skip(1)
    assert pipeline.ledger.batches() == []

    big = _rows(10**5, 9 * GROUP_ROWS)
    _land(landing, "002.parquet", big)
    assert pipeline.run(through=first + 1).rejected is None  # two of its slices
    last = pipeline.ledger.batches()[-1].seq
    with pytest.raises(StorageError, match="a slice of the same file"):
        pipeline.skip(last)
    assert pipeline.archive(tmp_path / "archive") == []  # not applied everywhere yet
    assert pipeline.run().rejected is None
    moved = pipeline.archive(tmp_path / "archive")
    assert [b.seq for b in moved] == list(range(first, last + 1))
    assert not (landing / "e" / "002.parquet").exists()
    _check(compiled, warehouse, big)


def test_backfill_from_a_history_folder_and_only_some_views(spark, dirs, tmp_path, capsys,
                                                            monkeypatch):
    landing, warehouse = dirs
    history = tmp_path / "history"
    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    compiled = compile_text(PROGRAM, str(program), name="p")
    old = _rows(0, 6 * GROUP_ROWS)
    _land(history, "2019.parquet", old)
    argv = ["backfill", str(program), "--landing", str(landing), "--warehouse", str(warehouse),
            "--folder", str(history), "--view", "totals", "--progress"]
    monkeypatch.setenv("INCR_SLICE_BYTES", str(3 * _group_bytes()))
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    n = len(pipeline.ledger.batches())
    assert n >= 2 and f"{n}/{n} batches (slices) of 1/1 files" in err
    assert {b.path for b in pipeline.ledger.batches()} == {(history / "e" / "2019.parquet").as_posix()}
    assert pipeline.views["totals"].through() == n - 1 and pipeline.views["overall"].through() < 0
    assert pipeline.archive(tmp_path / "archive") == []  # history stays where it is
    assert pipeline.run().rejected is None  # the other view catches up
    _check(compiled, warehouse, old)
    assert (history / "e" / "2019.parquet").exists()


def test_a_killed_backfill_process_resumes_inside_the_file(tmp_path):
    """``incr backfill`` as a process, killed (``os._exit``) at crash points inside the slices
    of one file, then run to the end: each answer seen after a kill is the oracle's over the
    file's rows through the slice it records, and the last equals the whole file's."""
    import subprocess
    import sys

    from incr.runtime.faults import CRASH_EXIT

    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    compiled = compile_text(PROGRAM, str(program), name="p")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    big = _rows(0, 10 * GROUP_ROWS)
    _land(landing, "001.parquet", big)
    env = {k: v for k, v in os.environ.items() if k != "INCR_CRASH_AT"}
    env.update(INCR_SLICE_BYTES=str(int(1.5 * _group_bytes())),  # a slice per row group
               INCR_SPARK_CONF="spark.sql.shuffle.partitions=2,spark.driver.memory=1g")

    def backfill(crash: str | None) -> int:
        done = subprocess.run([sys.executable, "-m", "incr.cli", "backfill", str(program),
                               "--landing", str(landing), "--warehouse", str(warehouse)],
                              env={**env, **({"INCR_CRASH_AT": crash} if crash else {})},
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode in (0, CRASH_EXIT), done.stderr
        return done.returncode

    for crash in ("view.after_merge:1", "index.after_commit:4", "view.after_state:6"):
        assert backfill(crash) == CRASH_EXIT, crash
        for plan in compiled.plans:
            answer, seen = read_answer(warehouse, plan)
            assert seen is not None
            rows = big.slice(0, (seen + 1) * GROUP_ROWS)
            assert diff_answers(oracle_answer(plan.select, {"e": rows}), answer) is None, \
                (crash, plan.view, seen)
    assert backfill(None) == 0
    assert len(Pipeline(compiled, landing, warehouse).ledger.batches()) == 10
    _check(compiled, warehouse, big)


def test_airflows_prepare_does_not_read_again_what_a_new_view_must_build_from(spark, dirs):
    landing, warehouse = dirs
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    big = _rows(0, 6 * GROUP_ROWS)
    _land(landing, "001.parquet", big)
    assert _pipeline(compiled, landing, warehouse, spark, "driver").run().rejected is None
    grown = compile_text(PROGRAM + "CREATE VIEW lows AS SELECT who, MIN(pts) AS low FROM e "
                                   "GROUP BY who;\n", "p.sql", name="p")
    pipeline = _pipeline(grown, landing, warehouse, spark, "driver")
    prepared = pipeline.prepare()
    assert prepared.rejected is None and prepared.applied == []  # read and indexed before
    last = prepared.ready_through
    assert last == len(pipeline.ledger.batches()) - 1
    assert [m.batch for m in pipeline.apply_view("lows", last)] == list(range(last + 1))
    _check(grown, warehouse, big)


def test_backfill_ranges_never_leave_a_gap(spark, dirs):
    landing, warehouse = dirs
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    for n in range(4):
        _land(landing, f"{n:03d}.parquet", _rows(n * 100, 100))
    pipeline = _pipeline(compiled, landing, warehouse, spark, "driver")
    with pytest.raises(StorageError, match=r"view totals has not applied batch\(es\) 0-2, before "
                                           r"--from 3"):
        pipeline.backfill(views=["TOTALS"], start=3)
    report = pipeline.backfill(views=["totals"], through=1)
    assert [r.seq for r in report.applied] == [0, 1]
    assert pipeline.views["totals"].through() == 1 and pipeline.views["overall"].through() < 0
    assert not (pipeline.meta / "backfill.json").exists()  # marked only while it runs
    assert [r.seq for r in pipeline.backfill(views=["totals"], start=2).applied] == [2, 3]
    with pytest.raises(StorageError, match="with --rebuild"):
        pipeline.backfill(rebuild=True, start=1)
    with pytest.raises(StorageError, match="has no view nope"):
        pipeline.backfill(views=["nope"])
    report = pipeline.backfill(rebuild=True)  # every view, from batch 0, beside the served ones
    assert [r.seq for r in report.applied] == [0, 1, 2, 3]
    _check(compiled, warehouse, _rows(0, 400))

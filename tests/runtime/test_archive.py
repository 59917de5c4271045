"""Archiving applied files: the landing folder keeps only what is to come, rebuilds read the archive.

``incr archive`` moves the files of batches every table has applied out of the landing
folder and records where in the ledger.  A view changed later rebuilds its state from the
ledger, reading those files in the archive; its answer equals the oracle.  Files not yet
applied stay, and so does a new file landed under an archived file's name.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from incr import cli
from incr.compiler import compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

PROGRAM = """\
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
CREATE VIEW best AS SELECT MAX(pts) AS best FROM e;
"""
SCHEMA = pa.schema([("who", pa.string()), ("pts", pa.int64())])


def _land(landing: Path, name: str, rows: list[dict], delete: bool = False) -> Path:
    folder = landing / "e" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), folder / name)
    return folder / name


def _check(compiled, warehouse: Path, live: list[dict]) -> None:
    table = pa.Table.from_pylist(live, schema=SCHEMA)
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, {"e": table}), answer) is None, plan.view


def test_archived_files_leave_the_landing_folder_and_rebuilds_read_them(spark, tmp_path):
    landing, warehouse, archive = tmp_path / "landing", tmp_path / "warehouse", tmp_path / "archive"
    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    compiled = compile_text(PROGRAM, str(program), name="p")
    rows = [{"who": "ann", "pts": 3}, {"who": "bob", "pts": 5}, {"who": "ann", "pts": 4}]
    _land(landing, "001.csv", rows[:2])
    _land(landing, "002.csv", rows[2:])
    _land(landing, "003.csv", [rows[1]], delete=True)
    live = [rows[0], rows[2]]
    assert Pipeline(compiled, landing, warehouse, spark=spark).run().rejected is None
    pending = _land(landing, "004.csv", [{"who": "cy", "pts": 9}])  # landed, not applied yet

    argv = ["archive", str(program), "--landing", str(landing), "--warehouse", str(warehouse),
            "--to", str(archive)]
    assert cli.main(argv) == 0
    assert sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*.csv")) == \
        ["e/001.csv", "e/002.csv", "e/_deletes/003.csv"]
    assert sorted(p.name for p in landing.rglob("*.csv")) == ["004.csv"]  # still to come
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    assert [b.archived is not None for b in pipeline.ledger.batches()] == [True, True, True]

    assert pipeline.run().rejected is None  # the pending file applies as usual
    live.append({"who": "cy", "pts": 9})
    _check(compiled, warehouse, live)
    assert [b.path for b in Pipeline(compiled, landing, warehouse).archive(archive)] == ["e/004.csv"]
    assert not pending.exists()

    # A changed view rebuilds from the ledger: every file it reads is in the archive now.
    changed = compile_text(PROGRAM.replace("MAX(pts) AS best", "MAX(pts) AS best, MIN(pts) AS worst"),
                           str(program), name="p")
    report = Pipeline(changed, landing, warehouse, spark=spark).run()
    assert report.rejected is None, report.rejected
    _check(changed, warehouse, live)

    # A new file landed under an archived file's name is not the archived file: it stays.
    again = _land(landing, "001.csv", [{"who": "zed", "pts": 1}])
    Pipeline(changed, landing, warehouse).archive(archive)
    assert again.exists()

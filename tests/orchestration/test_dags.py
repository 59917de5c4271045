"""The generated DAGs: parsing is light, there is a task per view, and a run maintains the views.

``dag.test()`` runs a DAG in-process against a SQLite metadata DB created in a temporary
Airflow home (set before anything imports Airflow).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from incr.compiler import compile_program
from incr.oracle import diff_answers, oracle_answer
from incr.orchestration.dags import header_option, header_schedule, table_names, view_names
from incr.runtime.report import read_answer

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """-- incr: schedule = @daily
-- A program for the DAG tests; CREATE VIEW in a comment is not a view.
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE VIEW scores AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
/* CREATE VIEW not_a_view AS SELECT 1; */
CREATE VIEW best AS SELECT MAX(pts) AS best FROM e;
"""
SCHEMA = pa.schema([("who", pa.string()), ("pts", pa.int64())])


@pytest.fixture(scope="module")
def airflow_home():
    """The metadata DB in the tests' Airflow home (see conftest), created once."""
    from incr.orchestration.airflow_home import ensure_metadata_db

    ensure_metadata_db()


def test_header_and_views_are_read_without_the_compiler():
    assert header_schedule(PROGRAM) == "@daily"
    assert view_names(PROGRAM) == ["scores", "best"]
    for program in (REPO / "sql").rglob("*.sql"):
        assert view_names(program.read_text()) == [p.view for p in compile_program(program).plans]


def test_header_options_and_tables_are_read_without_the_compiler():
    text = "-- incr: on_failure = alerts.incr:page\n" + PROGRAM
    assert header_option(text, "on_failure") == "alerts.incr:page"
    assert header_option(PROGRAM, "on_failure") is None
    assert table_names(PROGRAM) == ["e"]


def test_a_landed_file_or_the_header_schedule_starts_a_run(tmp_path):
    from airflow.timetables.assets import AssetOrTimeSchedule

    from incr.orchestration.dags import answer_asset, landing_asset, program_dag

    program = tmp_path / "games.sql"
    program.write_text(PROGRAM)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    dag = program_dag(program, str(landing), str(warehouse))
    assert isinstance(dag.timetable, AssetOrTimeSchedule)  # the header's @daily is the backstop
    watched = landing_asset(str(landing), "e")
    assert watched.uri == (landing / "e").resolve().as_uri()
    assert dag.timetable.asset_condition.objects[0].uri == watched.uri
    assert [w.trigger.serialize()[1]["folder"] for w in watched.watchers] == [str((landing / "e").resolve())]
    # Each view's task emits its answer's Asset; a program without a schedule waits for files only.
    assert dag.get_task("apply_scores").outlets == [answer_asset(str(warehouse), "scores")]
    program.write_text(PROGRAM.replace("-- incr: schedule = @daily\n", ""))
    assert not isinstance(program_dag(program, str(landing), str(warehouse)).timetable, AssetOrTimeSchedule)


def test_the_downstream_example_runs_on_an_answer_asset():
    import runpy

    from incr.orchestration.dags import answer_asset, default_paths

    found = runpy.run_path(str(REPO / "dags" / "incr_downstream_example.py"))
    _, warehouse = default_paths(REPO / "sql")
    assert found["REGION_SUMMARY"] == answer_asset(warehouse, "region_summary")
    assert "region_summary" in view_names((REPO / "sql" / "examples" / "sales.sql").read_text())


def test_dag_file_imports_nothing_heavy():
    code = ("import sys, runpy; runpy.run_path('dags/incr_programs.py'); "
            "runpy.run_path('dags/incr_downstream_example.py'); "
            "print(sorted(m for m in ('pyspark', 'deltalake', 'sqlglot', 'duckdb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _land(landing: Path, name: str, rows: list[dict], delete: bool = False) -> None:
    folder = landing / "e" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), folder / name)


def _games(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The test program, its landing and warehouse folders, and its DAG file in the dags
    folder: dag.test() serializes a DAG from there, as a deployment would find it."""
    program = tmp_path / "games.sql"
    program.write_text(PROGRAM)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    (Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "incr_games.py").write_text(
        "# Airflow DAG for the test program (DagBag safe mode wants both words)\n"
        "from pathlib import Path\n"
        "from incr.orchestration.dags import program_dags\n"
        f"globals().update(program_dags(Path({str(tmp_path)!r}), {str(landing)!r}, {str(warehouse)!r}))\n")
    return program, landing, warehouse


@pytest.mark.airflow
def test_dag_run_maintains_views_and_fails_on_a_rejected_batch(airflow_home, spark, tmp_path):
    from incr.orchestration.dags import program_dag

    program, landing, warehouse = _games(tmp_path)
    dag = program_dag(program, str(landing), str(warehouse))
    assert dag.dag_id == "incr_games"
    assert {t.task_id for t in dag.tasks} == {"prepare", "apply_scores", "apply_best", "finish",
                                             "housekeeping"}

    rows = [{"who": "ann", "pts": 3}, {"who": "bob", "pts": 5}, {"who": "ann", "pts": 4}]
    _land(landing, "001.csv", rows)
    _land(landing, "002.csv", [{"who": "bob", "pts": 5}], delete=True)
    run = dag.test()
    assert "success" in str(run.state)
    live = pa.Table.from_pylist([rows[0], rows[2]], schema=SCHEMA)
    for plan in compile_program(program).plans:
        answer, batch = read_answer(warehouse, plan)
        assert batch == 1
        assert diff_answers(oracle_answer(plan.select, {"e": live}), answer) is None

    # A delete of a row that is not there: the run fails, the answers stay as they were.
    _land(landing, "003.csv", [{"who": "zed", "pts": 1}], delete=True)
    run = dag.test()
    assert "failed" in str(run.state)
    for plan in compile_program(program).plans:
        answer, batch = read_answer(warehouse, plan)
        assert batch == 1
        assert diff_answers(oracle_answer(plan.select, {"e": live}), answer) is None


@pytest.mark.airflow
def test_backfill_dag_builds_views_from_a_history_folder_in_slices(airflow_home, spark, tmp_path,
                                                                   monkeypatch, capsys):
    import pyarrow.parquet as pq

    from incr.orchestration.dags import backfill_dag, program_dag
    from incr.runtime.pipeline import Pipeline

    program, landing, warehouse = _games(tmp_path)
    history = tmp_path / "history"
    old = pa.table({"who": [f"p{i % 7}" for i in range(4000)], "pts": list(range(4000))},
                   schema=SCHEMA)
    (history / "e").mkdir(parents=True)
    pq.write_table(old, history / "e" / "2019.parquet", row_group_size=1000)
    monkeypatch.setenv("INCR_SLICE_BYTES", "1")  # a slice per row group
    dag = backfill_dag(program, str(landing), str(warehouse))
    assert dag.dag_id == "incr_games_backfill"
    run = dag.test(run_conf={"folder": str(history), "views": ["scores"]})
    assert "success" in str(run.state)
    assert "progress: 4/4 batches (slices) of 1/1 files" in capsys.readouterr().out
    compiled = compile_program(program)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    assert pipeline.views["scores"].through() == 3 and pipeline.views["best"].through() < 0
    scores = compiled.plan("scores")
    assert diff_answers(oracle_answer(scores.select, {"e": old}), read_answer(warehouse, scores)[0]) is None

    # The scheduled DAG catches the other view up, and its refresh param rebuilds one.
    dag = program_dag(program, str(landing), str(warehouse))
    run = dag.test(run_conf={"refresh": ["scores"]})
    assert "success" in str(run.state)
    for plan in compiled.plans:
        answer, batch = read_answer(warehouse, plan)
        assert batch == 3, plan.view
        assert diff_answers(oracle_answer(plan.select, {"e": old}), answer) is None
    assert Pipeline(compiled, landing, warehouse, spark=spark).views["scores"].state.root.name.endswith(".r1")


@pytest.mark.airflow
def test_a_scheduled_run_gives_way_to_a_running_backfill(airflow_home, spark, tmp_path):
    import json

    from incr.orchestration.dags import program_dag
    from incr.runtime.pipeline import BACKFILL_MARKER, Pipeline

    program, landing, warehouse = _games(tmp_path)
    _land(landing, "001.csv", [{"who": "ann", "pts": 3}])
    pipeline = Pipeline(compile_program(program), landing, warehouse, spark=spark)
    pipeline.meta.mkdir(parents=True)
    marker = pipeline.meta / BACKFILL_MARKER
    marker.write_text(json.dumps({"pid": os.getpid(), "at": 0, "views": ["best", "scores"]}))
    dag = program_dag(program, str(landing), str(warehouse))
    run = dag.test()
    assert "success" in str(run.state)  # skipped, not failed: nothing retried, nothing red
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert "skipped" in states["prepare"] and "skipped" in states["apply_scores"], states
    assert all(v.through() < 0 for v in pipeline.views.values())

    marker.write_text(json.dumps({"pid": 999_999_999, "at": 0, "views": ["best"]}))  # died
    run = dag.test()
    assert "success" in str(run.state)
    assert all(v.through() == 0 for v in pipeline.views.values())

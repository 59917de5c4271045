"""The DAG factory: one Airflow DAG per program file.

Each DAG is ``prepare`` → ``apply_<view>`` (one task per view) → ``finish``:

* ``prepare`` registers newly landed files, reads each pending batch strictly and advances
  the sources' row indexes (deletions checked); it stops at the first rejected batch and
  says up to which batch the views may go;
* ``apply_<view>`` folds those batches into one view's state and publishes its answer;
  views are independent, so they run as parallel tasks, each retried on its own;
* ``finish`` fails the run, with the rejection message, if a batch was rejected.

Every task is idempotent (each Delta commit carries its batch number), so Airflow retries
are safe.  This module imports only Airflow's SDK and the standard library: the DAG
processor parses it often, and Spark, Delta and the compiler load inside the tasks.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from airflow.sdk import DAG, Param, dag, task

from incr.config import settings

_SCHEDULE = re.compile(r"^\s*--\s*incr\s*:\s*schedule\s*=\s*(?P<value>\S.*?)\s*$", re.IGNORECASE)
_VIEW = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                   r"[`\"]?(?P<name>[A-Za-z][A-Za-z0-9_]*)", re.IGNORECASE)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def header_schedule(text: str) -> str | None:
    """The ``-- incr: schedule = ...`` header option, read without parsing the SQL."""
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("--"):
            break
        m = _SCHEDULE.match(line)
        if m:
            return m.group("value")
    return None


def view_names(text: str) -> list[str]:
    """The names of a program's views, read without parsing the SQL (the compiler checks them)."""
    return [m.group("name") for m in _VIEW.finditer(_COMMENTS.sub(" ", text))]


def program_dag(program: Path, landing: str, warehouse: str) -> DAG:
    """The DAG maintaining the views of one program file."""
    name = program.stem
    text = program.read_text(encoding="utf-8")
    schedule = header_schedule(text)
    views = view_names(text)

    @dag(dag_id=f"incr_{name}", schedule=schedule, start_date=dt.datetime(2026, 1, 1),
         catchup=False, max_active_runs=1, tags=["incr"],
         doc_md=f"Maintains the views of `{program.name}` incrementally (incr).",
         params={"landing": Param(landing, type="string"),
                 "warehouse": Param(warehouse, type="string")},
         default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)})
    def maintain():
        @task(multiple_outputs=True)
        def prepare(params: dict | None = None) -> dict:
            from incr.orchestration.tasks import prepare_batches

            return prepare_batches(program, params["landing"], params["warehouse"])

        def apply_task(view: str):
            @task(task_id=f"apply_{view}")
            def apply_view(through: int | None, params: dict | None = None) -> dict:
                from incr.orchestration.tasks import apply_view as run_view

                return run_view(program, params["landing"], params["warehouse"], view, through)

            return apply_view

        @task
        def finish(rejected: str | None, results: list[dict]) -> dict:
            from incr.orchestration.tasks import finish_run

            return finish_run(rejected, results)

        prepared = prepare()
        results = [apply_task(v)(prepared["ready_through"]) for v in views]
        finish(prepared["rejected"], results)

    return maintain()


def program_dags(sql_dir: Path, landing: str | None = None, warehouse: str | None = None) -> dict[str, DAG]:
    """A DAG per ``*.sql`` file under ``sql_dir``, keyed by DAG id.

    Landing and warehouse default to ``$INCR_LANDING`` / ``$INCR_WAREHOUSE``, else ``data/``
    beside ``sql_dir``; both can be overridden per run (DAG params).
    """
    base = sql_dir.resolve().parent / "data"
    config = settings()
    landing = landing or config.landing or str(base / "landing")
    warehouse = warehouse or config.warehouse or str(base / "warehouse")
    out: dict[str, DAG] = {}
    for program in sorted(sql_dir.rglob("*.sql")):
        d = program_dag(program, landing, warehouse)
        out[d.dag_id] = d
    return out

"""The DAG factory: one Airflow DAG per program file.

Each DAG is ``prepare`` → ``apply_<view>`` (one task per view) → ``finish``:

* ``prepare`` registers newly landed files, reads each pending batch strictly and advances
  the sources' row indexes (deletions checked); it stops at the first rejected batch and
  says up to which batch the views may go;
* ``apply_<view>`` folds those batches into one view's state and publishes its answer;
  views are independent, so they run as parallel tasks, each retried on its own.  A view
  with nothing new is skipped; one that published emits an event on its answer table's
  Asset (:func:`answer_asset`), so downstream DAGs run on fresh answers only;
* ``finish`` fails the run, naming the rejected file and why, if a batch was rejected;
* ``housekeeping`` checkpoints and vacuums the program's tables once every
  ``INCR_MAINTAIN_EVERY_H`` hours (skipped otherwise), keeping answers' time travel
  (:mod:`incr.runtime.housekeeping`).

Runs start when a file lands: each source table's landing folder is an Asset
(:func:`landing_asset`) watched by :class:`~incr.orchestration.triggers.LandedFilesTrigger`
in Airflow's triggerer.  The program's ``-- incr: schedule = ...`` header, if any, is a
backstop beside the watcher.  ``-- incr: on_failure = package.module:function`` names a hook
called (with Airflow's task context) when a task of the program fails for good.

A second DAG per program, ``incr_<program>_backfill``, is triggered by hand (its params say
what to do: views, a history folder, a batch range, a full rebuild); its one task runs
``incr backfill`` and prints a progress line per batch, large files going a slice at a time.
While it runs it holds the program's locks: a scheduled run starting then gives way (``prepare``
is skipped, and with it the run's other tasks), and files landed meanwhile wait for the next run.  The
scheduled DAG's ``refresh`` param names views to rebuild from batch 0 (a full refresh,
:meth:`Pipeline.refresh`) at the start of that run.

Every task is idempotent (each Delta commit carries its batch number), so Airflow retries
are safe.  This module imports only Airflow's SDK and the standard library: the DAG
processor parses it often, and Spark, Delta and the compiler load inside the tasks.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, AssetAny, AssetWatcher, Param, TriggerRule, dag, task

from incr.config import settings
from incr.orchestration.callbacks import on_failure
from incr.orchestration.triggers import LandedFilesTrigger

_HEADER = re.compile(r"^\s*--\s*incr\s*:\s*(?P<key>[a-z_]+)\s*=\s*(?P<value>\S.*?)\s*$", re.IGNORECASE)
_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?[`\"]?(?P<name>[A-Za-z_][A-Za-z0-9_]*)",
                    re.IGNORECASE)
#: Seconds between two listings of a landing folder by its watcher.
WATCH_INTERVAL_S = 5.0
_VIEW = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                   r"[`\"]?(?P<name>[A-Za-z][A-Za-z0-9_]*)", re.IGNORECASE)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def header_option(text: str, key: str) -> str | None:
    """A ``-- incr: key = value`` header option, read without parsing the SQL."""
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("--"):
            break
        m = _HEADER.match(line)
        if m and m.group("key").lower() == key:
            return m.group("value")
    return None


def header_schedule(text: str) -> str | None:
    """The ``-- incr: schedule = ...`` header option (a cron expression or preset)."""
    return header_option(text, "schedule")


def table_names(text: str) -> list[str]:
    """The source tables a program declares, read without parsing the SQL."""
    return [m.group("name") for m in _TABLE.finditer(_COMMENTS.sub(" ", text))]


def landing_asset(landing: str, table: str) -> Asset:
    """The Asset of one source table's landing folder, watched for landed files.

    Named by its URI, so every program reading the same folder shares one Asset and one
    watcher, and a file landed there starts a run of each of them.
    """
    from incr.runtime.remote import is_remote

    if is_remote(landing):
        uri = folder = f"{landing.rstrip('/')}/{table}"
    else:
        local = Path(landing, table).resolve()
        uri, folder = local.as_uri(), str(local)
    trigger = LandedFilesTrigger(folder, poke_interval=WATCH_INTERVAL_S)
    return Asset(uri=uri, group="incr-landing",
                 watchers=[AssetWatcher(name=f"incr_landing_{table}", trigger=trigger)])


def answer_asset(warehouse: str, view: str) -> Asset:
    """The Asset of one view's answer table: an event each time a batch is published (its
    URI is the table's: ``file://...`` or, for a warehouse in a bucket, ``s3://...``)."""
    from incr.runtime.remote import is_remote

    uri = (f"{warehouse.rstrip('/')}/answers/{view}" if is_remote(warehouse)
           else Path(warehouse, "answers", view).resolve().as_uri())
    return Asset(uri=uri, group="incr-answers")


def _schedule(text: str, landing: str) -> Any:
    """Landed files (the watched landing Assets), with the header's schedule as a backstop."""
    from airflow.timetables.assets import AssetOrTimeSchedule
    from airflow.timetables.trigger import CronTriggerTimetable

    tables = table_names(text)
    if not tables:
        return header_schedule(text)
    assets = AssetAny(*(landing_asset(landing, t) for t in tables))
    backstop = header_schedule(text)
    if backstop is None or backstop.lower() == "none":
        return assets
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(backstop, timezone="UTC"), assets=assets)


def view_names(text: str) -> list[str]:
    """The names of a program's views, read without parsing the SQL (the compiler checks them)."""
    return [m.group("name") for m in _VIEW.finditer(_COMMENTS.sub(" ", text))]


def program_dag(program: Path, landing: str, warehouse: str) -> DAG:
    """The DAG maintaining the views of one program file."""
    name = program.stem
    text = program.read_text(encoding="utf-8")
    views = view_names(text)
    hook = functools.partial(on_failure, hook=header_option(text, "on_failure"))
    config = settings()

    @dag(dag_id=f"incr_{name}", schedule=_schedule(text, landing), start_date=dt.datetime(2026, 1, 1),
         catchup=False, max_active_runs=1, tags=["incr"],
         doc_md=f"Maintains the views of `{program.name}` incrementally (incr).",
         params={"landing": Param(landing, type="string"),
                 "warehouse": Param(warehouse, type="string"),
                 "refresh": Param([], type="array", items={"type": "string"},
                                  description="views to rebuild from batch 0 in this run "
                                              "(a full refresh; the old answer is served "
                                              "until the new one has caught up)")},
         default_args={"retries": config.retries,
                       "retry_delay": dt.timedelta(seconds=config.retry_delay_s),
                       "on_failure_callback": hook})
    def maintain():
        @task(multiple_outputs=True)
        def prepare(params: dict | None = None) -> dict:
            from incr.orchestration.tasks import prepare_batches

            return prepare_batches(program, params["landing"], params["warehouse"],
                                   refresh=params.get("refresh") or ())

        def apply_task(view: str):
            published = answer_asset(warehouse, view)

            @task(task_id=f"apply_{view}", outlets=[published])
            def apply_view(through: int | None, params: dict | None = None,
                           outlet_events: Any = None) -> dict:
                from airflow.exceptions import AirflowSkipException

                from incr.orchestration.tasks import apply_view as run_view

                out = run_view(program, params["landing"], params["warehouse"], view, through)
                if not out["batches"]:
                    raise AirflowSkipException(f"view {view} has no new batch (through {through})")
                outlet_events[published].extra = {"view": view, "through": out["through"],
                                                  "answer_version": out["answer_version"]}
                return out

            return apply_view

        @task(trigger_rule=TriggerRule.NONE_FAILED)
        def finish(rejected: str | None, results: list[dict | None]) -> dict:
            from incr.orchestration.tasks import finish_run

            return finish_run(rejected, results)

        @task
        def housekeeping(params: dict | None = None) -> dict:
            from airflow.exceptions import AirflowSkipException

            from incr.orchestration.tasks import housekeep

            done = housekeep(program, params["landing"], params["warehouse"])
            if done is None:
                raise AirflowSkipException("housekeeping is not due (INCR_MAINTAIN_EVERY_H)")
            return done

        prepared = prepare()
        results = [apply_task(v)(prepared["ready_through"]) for v in views]
        finish(prepared["rejected"], results) >> housekeeping()

    return maintain()


def backfill_dag(program: Path, landing: str, warehouse: str) -> DAG:
    """The DAG that backfills one program's views, triggered by hand with its params."""
    name = program.stem
    text = program.read_text(encoding="utf-8")
    hook = functools.partial(on_failure, hook=header_option(text, "on_failure"))
    config = settings()

    @dag(dag_id=f"incr_{name}_backfill", schedule=None, start_date=dt.datetime(2026, 1, 1),
         catchup=False, max_active_runs=1, tags=["incr", "backfill"],
         doc_md=f"Backfills the views of `{program.name}` (incr backfill): large Parquet files "
                f"in slices sized to Spark's memory; resumable (a retry goes on from the last "
                f"slice committed).",
         params={"landing": Param(landing, type="string"),
                 "warehouse": Param(warehouse, type="string"),
                 "views": Param([], type="array", items={"type": "string"},
                                description="views to backfill (empty: every view)"),
                 "folder": Param("", type="string",
                                 description="a history folder laid out like the landing one, "
                                             "registered first and read in place"),
                 "from_batch": Param(None, type=["null", "integer"],
                                     description="first batch meant to apply"),
                 "to_batch": Param(None, type=["null", "integer"],
                                   description="last batch to apply"),
                 "rebuild": Param(False, type="boolean",
                                  description="rebuild the views from batch 0 beside the "
                                              "served ones (full refresh)")},
         default_args={"retries": config.retries,
                       "retry_delay": dt.timedelta(seconds=config.retry_delay_s),
                       "on_failure_callback": hook})
    def run_backfill():
        @task
        def backfill(params: dict | None = None) -> dict:
            from incr.orchestration.tasks import backfill as run

            return run(program, params)

        backfill()

    return run_backfill()


def default_paths(sql_dir: Path) -> tuple[str, str]:
    """Landing and warehouse: ``$INCR_LANDING`` / ``$INCR_WAREHOUSE``, else ``data/`` beside ``sql_dir``."""
    base = sql_dir.resolve().parent / "data"
    config = settings()
    return (config.landing or str(base / "landing"), config.warehouse or str(base / "warehouse"))


def program_dags(sql_dir: Path, landing: str | None = None, warehouse: str | None = None) -> dict[str, DAG]:
    """A DAG per ``*.sql`` file under ``sql_dir``, keyed by DAG id.

    Landing and warehouse default to :func:`default_paths`; both can be overridden per run
    (DAG params).
    """
    default_landing, default_warehouse = default_paths(sql_dir)
    landing = landing or default_landing
    warehouse = warehouse or default_warehouse
    out: dict[str, DAG] = {}
    for program in sorted(sql_dir.rglob("*.sql")):
        for d in (program_dag(program, landing, warehouse),
                  backfill_dag(program, landing, warehouse)):
            out[d.dag_id] = d
    return out

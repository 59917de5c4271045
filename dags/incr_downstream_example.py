"""A downstream DAG: runs each time incr publishes a fresh ``region_summary`` answer.

It is scheduled on the answer table's Asset (``incr.orchestration.dags.answer_asset``), which
the ``apply_region_summary`` task of ``incr_sales`` (sql/examples/sales.sql) updates only when
a batch changed the view.  Replace the task body with the real consumer: a BI extract
refresh, a report, a reverse-ETL sync.
"""

import datetime as dt
from pathlib import Path

from airflow.sdk import dag, task

from incr.orchestration.dags import answer_asset, default_paths

_, WAREHOUSE = default_paths(Path(__file__).resolve().parents[1] / "sql")
REGION_SUMMARY = answer_asset(WAREHOUSE, "region_summary")


@dag(dag_id="incr_example_downstream", schedule=[REGION_SUMMARY], start_date=dt.datetime(2026, 1, 1),
     catchup=False, tags=["incr", "example"])
def report_on_fresh_answers():
    @task
    def report(triggering_asset_events=None) -> dict:
        from incr.orchestration.tasks import describe_answer

        events = triggering_asset_events[REGION_SUMMARY] if triggering_asset_events else []
        return describe_answer(REGION_SUMMARY.uri, [e.extra for e in events])

    report()


report_on_fresh_answers()

"""One Airflow DAG per incr program under sql/ (DAG id ``incr_<program>``).

The factory lives in ``incr.orchestration.dags``; this file only points it at the programs.
Landing and warehouse come from $INCR_LANDING / $INCR_WAREHOUSE (default: data/ in the repo)
and can be overridden per run through the DAG params.
"""

from pathlib import Path

from incr.orchestration.dags import program_dags

globals().update(program_dags(Path(__file__).resolve().parents[1] / "sql"))

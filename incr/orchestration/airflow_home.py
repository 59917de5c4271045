"""A self-contained Airflow home for local runs (``make demo``, tests): SQLite metadata DB.

Airflow reads its configuration from the environment when first imported, so
:func:`use_airflow_home` must run before anything imports ``airflow``.
"""

from __future__ import annotations

import os
from pathlib import Path

_READY: set[str] = set()


def use_airflow_home(home: Path, dags_folder: Path | None = None) -> None:
    """Points Airflow at ``home`` (SQLite DB inside it), unless AIRFLOW_HOME is already set."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    base = Path(os.environ["AIRFLOW_HOME"])
    os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{base / 'airflow.db'}")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    if dags_folder is not None:
        os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(dags_folder))


def ensure_metadata_db() -> None:
    """Creates or migrates Airflow's metadata DB once per process (``dag.test()`` needs it)."""
    conn = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    if conn in _READY:
        return
    from airflow.utils.db import initdb

    initdb()
    _READY.add(conn)

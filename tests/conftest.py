"""Shared fixtures: one SparkSession for the whole run (local[2], UI off, 2 shuffle partitions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SALES = REPO / "sql" / "examples" / "sales.sql"


@pytest.fixture(scope="session")
def spark():
    """The test session's SparkSession (created once; Spark starts in ~10 s)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from incr.runtime.session import spark_session

    session = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                         "spark.default.parallelism": "2",
                                         "spark.driver.memory": "2g"})
    yield session
    session.stop()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh (landing, warehouse) pair."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    landing.mkdir()
    return landing, warehouse

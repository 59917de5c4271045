"""Shared fixtures: one SparkSession for the whole run (local[2], UI off, 2 shuffle partitions)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from incr.orchestration.airflow_home import use_airflow_home

# Airflow reads its configuration when first imported (test modules import the DAG factory),
# so the tests' own Airflow home is set before collection.
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="incr-test-airflow-"))
atexit.register(shutil.rmtree, _AIRFLOW_HOME, ignore_errors=True)
use_airflow_home(_AIRFLOW_HOME, dags_folder=_AIRFLOW_HOME / "dags")
(_AIRFLOW_HOME / "dags").mkdir(exist_ok=True)

# The tests' states hold a few rows, and by default a per-group answer over a state that small
# is rewritten rather than MERGEd by change (INCR_ANSWER_REWRITE_ROWS): the MERGE, which most
# answer tests pin down, would go untaken.  Tests of that rule give it in their Settings.
os.environ.setdefault("INCR_ANSWER_REWRITE_ROWS", "0")

REPO = Path(__file__).resolve().parents[1]
SALES = REPO / "sql" / "examples" / "sales.sql"


@pytest.fixture(scope="session")
def spark():
    """The test session's SparkSession (created once; Spark starts in ~10 s).

    Its heap is the product's default (4g, :data:`incr.runtime.session.DEFAULTS`): the
    equivalence suites' views (several joined and nested stages, a plan per Δ term) hold
    1-1.2 GB of live Catalyst plans and broadcast relations at their peak, which a 2g heap
    turned into minutes of back-to-back full collections.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from incr.runtime.session import spark_session

    session = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                         "spark.default.parallelism": "2",
                                         "spark.driver.memory": "4g"})
    yield session
    session.stop()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh (landing, warehouse) pair."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    landing.mkdir()
    return landing, warehouse


@dataclass(frozen=True)
class S3:
    """An S3 endpoint on 127.0.0.1 (moto's server) with one bucket."""

    fs: object  # pyarrow.fs.S3FileSystem onto it, allowed to create and delete buckets
    bucket: str
    env: dict[str, str]  # what a client (incr, Airflow's processes) is configured by


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """A real S3 endpoint for landing areas in a bucket, reached as a user's would be: by
    ``s3://`` URIs and the standard ``AWS_*`` variables (set here for the test process)."""
    import logging

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "incr-test",
           "AWS_SECRET_ACCESS_KEY": "incr-test", "AWS_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            fs = pafs.S3FileSystem(access_key="incr-test", secret_key="incr-test",
                                   region="us-east-1", endpoint_override=f"{host}:{port}",
                                   scheme="http", allow_bucket_creation=True,
                                   allow_bucket_deletion=True)
            fs.create_dir("incr-landing")
            yield S3(fs, "incr-landing", env)
    finally:
        server.stop()

"""Beyond one machine: an equivalence case run on a real Spark standalone cluster.

A Master and a Worker are started on 127.0.0.1 from the pyspark package
(:func:`incr.runtime.cluster.standalone_cluster`), and ``incr run`` runs in a subprocess (a
process holds one SparkContext; the test session's is local) with
``INCR_SPARK_MASTER=spark://...`` and every driver-side limit at 0, so each batch, the delete
checks against the row index and every answer go through Spark jobs whose tasks run in the
Worker's executor.  The initial load's state, side tables and row index are written as Parquet
files by that executor into the warehouse and committed by delta-rs on the driver.

The program joins two sources and groups (a per-group answer, maintained by MERGE, and a
top-k); batches insert into and delete from both sides.  After every batch each answer equals
DuckDB over the rows live then (read back by batch from the answer tables' history).  Two
``incr run`` invocations (the initial load, then the rest) make two applications on the
cluster, the second resuming from the state the first left.

Also here, without a cluster: the driver binds to 127.0.0.1 only for a master on loopback
(:func:`incr.runtime.session.on_loopback`), and a cluster that does not come up fails with
its logs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_program
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.cluster import ClusterError, LocalCluster, standalone_cluster
from incr.runtime.report import read_answer
from incr.runtime.session import on_loopback

PROGRAM = """
CREATE TABLE orders (oid BIGINT, cust BIGINT, amount DOUBLE, item VARCHAR);
CREATE TABLE customers (cust BIGINT, region VARCHAR, tier BIGINT);

CREATE VIEW by_region AS
SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MIN(o.amount) AS smallest,
       COUNT(DISTINCT o.item) AS items
FROM orders o JOIN customers c ON o.cust = c.cust
WHERE o.amount > 1
GROUP BY c.region;

CREATE VIEW top_items AS
SELECT c.tier, upper(o.item) AS item, SUM(o.amount) AS revenue, COUNT(*) AS n
FROM orders o JOIN customers c ON o.cust = c.cust
GROUP BY c.tier, upper(o.item)
ORDER BY revenue DESC, tier, item
LIMIT 5;
"""
SCHEMAS = {
    "orders": pa.schema([("oid", pa.int64()), ("cust", pa.int64()), ("amount", pa.float64()),
                         ("item", pa.string())]),
    "customers": pa.schema([("cust", pa.int64()), ("region", pa.string()), ("tier", pa.int64())]),
}
#: Every batch on Spark, every table read by Spark (no driver-side engine at all), small
#: memory, 2 shuffle partitions (the executor has one core).
ENVIRONMENT = {
    "INCR_LOCAL_ROWS": "0",
    "INCR_LOCAL_STATE_ROWS": "0",
    "INCR_LOCAL_INDEX_ROWS": "0",
    "INCR_SPARK_CONF": "spark.driver.memory=1g,spark.executor.memory=1g,"
                       "spark.sql.shuffle.partitions=2,spark.default.parallelism=2",
}
RUN_TIMEOUT_S = 900


def _order(rng: random.Random, oid: int) -> dict:
    return {"oid": oid, "cust": rng.randint(0, 49), "amount": rng.randint(0, 400) / 4,
            "item": rng.choice("abcdefg")}


def _customer(rng: random.Random, cust: int) -> dict:
    return {"cust": cust, "region": rng.choice(["north", "south", "east", None]),
            "tier": rng.randint(1, 3)}


def _land(landing: Path, name: str, table: str, rows: list[dict], delete: bool) -> None:
    """Lands ``rows`` as one batch file: inserts as Parquet, deletions as CSV."""
    data = pa.Table.from_pylist(rows, schema=SCHEMAS[table])
    folder = landing / table / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    if delete:
        pacsv.write_csv(data, folder / f"{name}.csv")
    else:
        pq.write_table(data, folder / f"{name}.parquet")


def _incr_run(cluster: LocalCluster, program: Path, landing: Path, warehouse: Path) -> dict:
    """``incr -v run --json`` against ``cluster`` in a subprocess; its run report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INCR_")}
    env.update(ENVIRONMENT, INCR_SPARK_MASTER=cluster.master_url)
    command = [sys.executable, "-m", "incr.cli", "-v", "run", str(program), "--landing",
               str(landing), "--warehouse", str(warehouse), "--json"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"incr run on {cluster.master_url} did not finish in {RUN_TIMEOUT_S} s; "
                    f"its stderr ends:\n{_tail(e.stderr)}\n{cluster.logs()}")
    if done.returncode != 0:
        pytest.fail(f"incr run on {cluster.master_url} exited with {done.returncode}; its stderr "
                    f"ends:\n{_tail(done.stderr)}\n{cluster.logs()}")
    assert f"starting Spark (master {cluster.master_url})" in done.stderr, _tail(done.stderr)
    return json.loads(done.stdout)


def _tail(text: str | bytes | None, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])


def test_join_groupby_with_deletes_on_a_standalone_cluster(tmp_path):
    started = time.monotonic()
    program = tmp_path / "shop.sql"
    program.write_text(PROGRAM)
    compiled = compile_program(program)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    rng = random.Random(15)
    live: dict[str, list[dict]] = {"orders": [], "customers": []}
    #: Per landed file: its name and the live rows after it, for the oracle.
    expected: dict[str, dict[str, list[dict]]] = {}

    def land(name: str, table: str, rows: list[dict], delete: bool = False) -> None:
        for row in rows:
            if delete:
                live[table].remove(row)
            else:
                live[table].append(row)
        _land(landing, name, table, rows, delete)
        expected[f"{table}/{'_deletes/' if delete else ''}{name}"] = \
            {t: list(r) for t, r in live.items()}

    with standalone_cluster(tmp_path / "cluster", cores=1, memory="1g") as cluster:
        # Run 1, the initial load: its state is written by the executor.
        land("0001", "customers", [_customer(rng, c) for c in range(40)])
        land("0002", "orders", [_order(rng, i) for i in range(3000)])
        reports = [_incr_run(cluster, program, landing, warehouse)]
        # Run 2: inserts and deletes on both sides (customers that leave and come back with
        # another region, so their orders move between groups).
        land("0003", "orders", [_order(rng, i) for i in range(3000, 3400)])
        land("0004", "orders", rng.sample(live["orders"], 300), delete=True)
        moved = rng.sample(live["customers"], 6)
        land("0005", "customers", moved, delete=True)
        land("0006", "customers", [_customer(rng, r["cust"]) for r in moved]
             + [_customer(rng, c) for c in range(40, 43)])
        reports.append(_incr_run(cluster, program, landing, warehouse))
        state = cluster.state()
        executor_logs = cluster.executor_logs()

    applied = [b for report in reports for b in report["applied"]]
    assert [b["path"].rsplit(".", 1)[0] for b in applied] == list(expected), applied
    for batch in applied:
        engines = {v["view"]: v["engine"] for v in batch["views"]}
        assert engines == {"by_region": "spark", "top_items": "spark"}, batch

    # The work ran on the cluster: two applications, each given the Worker's core, each with
    # an executor that wrote files into the warehouse.
    apps = state["completedapps"] + state["activeapps"]
    assert len(apps) == 2, json.dumps(state, indent=1)
    assert all(app["name"] == "incr" and app["cores"] > 0 for app in apps), apps
    assert len(executor_logs) == 2, executor_logs
    for log in executor_logs:
        text = log.read_text(errors="replace")
        assert "Saved output of task" in text and str(warehouse) in text, \
            f"{log} shows no file written into {warehouse}:\n{_tail(text)}"

    # After every batch, every answer equals DuckDB over the rows live then.
    for batch, (name, rows) in zip(applied, expected.items()):
        sources = {t: pa.Table.from_pylist(r, schema=SCHEMAS[t]) for t, r in rows.items()}
        for plan in compiled.plans:
            answer, _ = read_answer(warehouse, plan, batch["seq"])
            diff = diff_answers(oracle_answer(plan.select, sources), answer, ordered=plan.ordered)
            assert diff is None, f"after batch {batch['seq']} ({name}), view {plan.view}: {diff}"
    print(f"cluster equivalence case: {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize(("master", "loopback"), [
    ("local[2]", True), ("local", True), ("spark://127.0.0.1:7077", True),
    ("spark://localhost:7077", True), ("spark://127.0.0.1:7077,localhost:7078", True),
    ("spark://10.0.0.5:7077", False), ("spark://127.0.0.1:7077,spark-b:7077", False),
    ("yarn", False), ("k8s://https://127.0.0.1:6443", False),
])
def test_the_driver_binds_to_loopback_only_for_a_master_on_loopback(master, loopback):
    # A driver bound to 127.0.0.1 tells the executors to dial "localhost": right on one
    # machine, unreachable from the executors of any other host.
    assert on_loopback(master) is loopback


def test_a_cluster_that_does_not_come_up_says_why_with_its_logs(tmp_path):
    with pytest.raises(ClusterError) as failed, standalone_cluster(tmp_path, timeout=0.1):
        pytest.fail("the cluster cannot be up within 0.1 s")
    assert "did not happen in time" in str(failed.value)
    assert f"master.log ({tmp_path / 'master.log'})" in str(failed.value)

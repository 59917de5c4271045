"""``incr serve`` end to end, read by a real client: Beeline (Hive's JDBC shell, shipped in pyspark).

The server runs as its own process (``incr serve``, one Spark context per process), batches
are applied by another process while Beeline reads, and every read is compared with DuckDB's
answer over the landed files:

* each read of the latest database ``shop`` is a whole version: the oracle's answer at some
  batch;
* each pinned database ``shop_b<N>`` gives, for every view, the oracle's answer at batch N
  exactly (no view from another batch);
* Spark reading the answer's folder as plain Parquet (what a glob does) counts the rows of
  every old version: why only exact file lists are served.

One server start per module.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest

from incr.oracle import diff_answers
from incr.runtime.cluster import free_port
from tests.serving.program import BATCHES, NAME, VIEWS, applied_warehouse, oracle

REPO = Path(__file__).resolve().parents[2]
JARS = Path(pyspark.__file__).parent / "jars"
KEEP = 3
FIRST = 3  # batches 0..2 are applied before the server starts
LAST = len(BATCHES) - 1
# Applies batches FIRST..LAST one at a time, paced, as a separate process (no Spark: small
# batches run on the driver).
BATCHER = """
import sys, time
from pathlib import Path
from incr.compiler import compile_program
from incr.runtime.pipeline import Pipeline
from tests.serving.program import land
program, landing, warehouse = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
compiled = compile_program(program)
for batch in range(int(sys.argv[4]), int(sys.argv[5]) + 1):
    time.sleep(float(sys.argv[6]))
    land(landing, batch)
    report = Pipeline(compiled, landing, warehouse).run()
    assert report.rejected is None, report.rejected
    print(f"applied {batch} at {time.time():.3f}", flush=True)
"""


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if re.search(pattern, text):
            return
        if proc.poll() is not None:
            pytest.fail(f"incr serve exited ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"incr serve did not log {pattern!r} within {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def served(spark, tmp_path_factory):
    """Batches 0..2 applied, then ``incr serve`` started on a free port (stopped at the end)."""
    root = tmp_path_factory.mktemp("serve")
    program, landing, warehouse = applied_warehouse(spark, root, FIRST)
    port = free_port()
    log = root / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "incr.cli", "serve", str(program), "--warehouse", str(warehouse),
             "--port", str(port), "--keep", str(KEEP), "--poll", "0.3"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        _wait_for(log, r"serving shop on jdbc:hive2://127\.0\.0\.1:\d+/", proc, 180)
        yield {"program": program, "landing": landing, "warehouse": warehouse, "port": port,
               "log": log, "proc": proc, "root": root}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert not (warehouse / "_serving" / str(port) / "versions").exists()


def _beeline(port: int, statements: list[str], timeout_s: float = 180, past_errors: bool = False) -> str:
    """Runs ``statements`` in one Beeline session; returns its CSV output.

    ``past_errors``: go on after a failed statement, and return the errors too (Beeline
    prints one ``Error: ...`` line for each).
    """
    script = "\n".join(f"{s};" for s in statements) + "\n"
    result = subprocess.run(
        ["java", "-cp", f"{JARS}/*", "org.apache.hive.beeline.BeeLine",
         "-u", f"jdbc:hive2://127.0.0.1:{port}/", "-n", "bi", "--outputformat=csv2",
         "--silent=true", "--showHeader=true", f"--force={str(past_errors).lower()}", "-f", "/dev/stdin"],
        input=script, capture_output=True, text=True, timeout=timeout_s, check=False)
    if past_errors:
        return result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def _reads(output: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each tagged result of a Beeline run: tag → (columns, rows as strings).

    Every read is preceded by ``SELECT '<tag>' AS tag``, whose result starts the block.
    """
    blocks: dict[str, tuple[list[str], list[list[str]]]] = {}
    tag = None
    lines = [re.sub(r"^\d+: jdbc:hive2://\S+> ", "", line) for line in output.splitlines()]
    lines = [line for line in lines if line.strip()]
    i = 0
    while i < len(lines):
        if lines[i] == "tag" and i + 1 < len(lines):
            tag = lines[i + 1]
            blocks[tag] = ([], [])
            i += 2
            continue
        if tag is not None:
            columns, rows = blocks[tag]
            if not columns:
                columns.extend(lines[i].split(","))
            else:
                rows.append(lines[i].split(","))
        i += 1
    return blocks


def _tagged(tag: str, query: str) -> list[str]:
    return [f"SELECT '{tag}' AS tag", query]


def _typed(view: str, columns: list[str], rows: list[list[str]]) -> pa.Table:
    """Beeline's strings as a table of the oracle's types."""
    schema = oracle(view, 0).schema
    assert [c.lower() for c in columns] == [f.name for f in schema], (view, columns)
    out = {}
    for j, f in enumerate(schema):
        cells = [None if r[j] == "NULL" else r[j] for r in rows]
        if pa.types.is_integer(f.type):
            out[f.name] = pa.array([None if c is None else int(c) for c in cells], f.type)
        elif pa.types.is_floating(f.type) or pa.types.is_decimal(f.type):
            out[f.name] = pa.array([None if c is None else float(c) for c in cells], pa.float64())
        else:
            out[f.name] = pa.array(cells, pa.string())
    return pa.table(out)


def _batches_matching(view: str, table: pa.Table, candidates: range) -> list[int]:
    return [b for b in candidates if diff_answers(oracle(view, b), table) is None]


def test_clients_read_whole_snapshots_while_batches_apply(served):
    port, log = served["port"], served["log"]
    batcher = subprocess.Popen(
        [sys.executable, "-c", BATCHER, str(served["program"]), str(served["landing"]),
         str(served["warehouse"]), str(FIRST), str(LAST), "0.8"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Read the latest database, round after round, while the batches land.
    latest: list[tuple[str, pa.Table]] = []
    rounds = 0
    t0 = time.monotonic()
    while batcher.poll() is None or rounds == 0:
        statements = []
        for i in range(4):
            for view in VIEWS:
                statements += _tagged(f"r{rounds}.{i}.{view}", f"SELECT * FROM shop.{view}")
        for tag, (columns, rows) in _reads(_beeline(port, statements)).items():
            latest.append((tag, _typed(tag.rsplit(".", 1)[1], columns, rows)))
        rounds += 1
        assert time.monotonic() - t0 < 300, "the batches took too long"
    _, err = batcher.communicate(timeout=60)
    assert batcher.returncode == 0, err[-3000:]
    assert len(latest) == rounds * 4 * len(VIEWS)
    versions: dict[str, set[tuple[int, ...]]] = {view: set() for view in VIEWS}
    for tag, table in latest:
        view = tag.rsplit(".", 1)[1]
        matching = _batches_matching(view, table, range(FIRST - 1, LAST + 1))
        assert matching, f"read {tag} is the answer of no batch: {table.to_pylist()}"
        versions[view].add(tuple(matching))
    assert any(len(v) > 1 for v in versions.values()), \
        "every read saw the same answers: no batch landed while the client read"

    # Once the server shows the last batch: every pinned database is one whole batch.
    _wait_for(log, rf"database shop shows batch {LAST} ", served["proc"], 60)
    pinned = list(range(LAST - KEEP + 1, LAST + 1))
    statements = ["SHOW DATABASES"]
    for batch in pinned:
        for view in VIEWS:
            statements += _tagged(f"b{batch}.{view}", f"SELECT * FROM {NAME}_b{batch}.{view}")
    folder = served["warehouse"] / "answers" / "by_region"
    statements += _tagged("glob", f"SELECT count(*) AS n FROM parquet.`{folder}`")
    statements += _tagged("count", "SELECT count(*) AS n FROM shop.by_region")
    output = _beeline(port, statements)
    databases = set(output.split("tag")[0].split())
    assert {NAME, *(f"{NAME}_b{b}" for b in pinned)} <= databases
    assert f"{NAME}_b{LAST - KEEP}" not in databases  # dropped: beyond the last KEEP
    reads = _reads(output)
    for batch in pinned:
        for view in VIEWS:
            columns, rows = reads[f"b{batch}.{view}"]
            got = _typed(view, columns, rows)
            assert diff_answers(oracle(view, batch), got) is None, (batch, view)
    # A plain Parquet read of the answer's folder (any reader that is not Delta-aware, here
    # Spark itself through the same endpoint) counts rows of every version ever written.
    assert int(reads["count"][1][0][0]) == oracle("by_region", LAST).num_rows
    assert int(reads["glob"][1][0][0]) > oracle("by_region", LAST).num_rows


def test_the_endpoint_is_read_only_for_clients(served, tmp_path):
    """A BI user reads, shows and describes; nothing else runs (the check happens after
    analysis, before execution): no DDL, no write anywhere, no program or Java method
    run, no file read outside the served folders."""
    port, log = served["port"], served["log"]
    answers = served["warehouse"] / "answers"
    before = sorted(p.name for p in (answers / "returned").iterdir())
    shown = int(re.findall(r"database shop shows batch (\d+) ", log.read_text())[-1])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for BI\n")
    refused = [
        f"DROP TABLE shop_b{shown}.returned",
        "ALTER VIEW shop.returned AS SELECT 1 AS n, 2 AS total",
        "DROP DATABASE shop CASCADE",
        "CREATE TABLE mine (n INT) USING parquet",
        "CREATE TEMPORARY VIEW mine AS SELECT 1 AS n",
        f"INSERT OVERWRITE DIRECTORY '{tmp_path / 'written'}' USING parquet SELECT * FROM shop.returned",
        f"INSERT INTO shop_b{shown}.returned SELECT * FROM shop.returned",
        "CACHE TABLE shop.returned",
        f"ADD JAR {JARS / 'scala-library-2.13.16.jar'}",
        "CREATE FUNCTION f AS 'org.apache.hadoop.hive.ql.udf.UDFRand'",
        "SELECT reflect('java.lang.System', 'getProperty', 'user.home')",
        "SELECT java_method('java.lang.System', 'exit', 1)",
        f"SELECT TRANSFORM(n) USING 'touch {tmp_path / 'ran'}' AS (x) FROM (SELECT 1 AS n) q",
        f"SELECT * FROM text.`{outside / 'secret.txt'}`",
        f"SELECT * FROM shop.returned WHERE EXISTS (SELECT * FROM text.`{outside}`)",
    ]
    output = _beeline(port, refused, past_errors=True)
    # Beeline prints one "Error: ..." line per failed statement: each must be the guard's.
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == len(refused), "\n".join(errors) or output[-4000:]
    assert all("incr serve is read-only" in e for e in errors), "\n".join(errors)
    why = ["DropTable", "AlterViewAsCommand", "DropNamespace", "CreateDataSourceTableCommand",
           "CreateViewCommand", "InsertIntoDataSourceDirCommand", "InsertIntoHadoopFsRelationCommand",
           "CacheTable", "AddJarsCommand", "CreateFunctionCommand", "reflect", "reflect", "TRANSFORM",
           f"a read of {outside / 'secret.txt'}, outside", f"a read of {outside}, outside"]
    for error, reason in zip(errors, why):  # each refused for what it is, in order
        assert reason in error, (reason, error[:300])
    assert "not for BI" not in output
    assert not (tmp_path / "written").exists() and not (tmp_path / "ran").exists()
    # Reading, showing and describing work, and what is served did not change.
    allowed = _beeline(port, ["SHOW DATABASES", "USE shop", "SHOW TABLES", "DESCRIBE returned",
                              "SET spark.sql.shuffle.partitions=2", "EXPLAIN SELECT * FROM returned"]
                       + _tagged("latest", "SELECT * FROM shop.returned")
                       + _tagged("pinned", f"SELECT * FROM shop_b{shown}.returned"))
    reads = _reads(allowed)
    for tag in ("latest", "pinned"):
        assert diff_answers(oracle("returned", shown), _typed("returned", *reads[tag])) is None
    assert sorted(p.name for p in (answers / "returned").iterdir()) == before
    assert "restored database" not in log.read_text() and "repaired" not in log.read_text()


def test_a_compaction_under_a_served_batch_changes_no_database(served):
    # incr compacts an answer maintained by change once MERGEs left many files: a new version
    # with the same rows, committed under the same batch number.  A pinned database was made
    # whole and stays as it was; the server only notes the new version for later batches.
    import json

    from incr.runtime.store import DeltaStore

    port, log = served["port"], served["log"]
    shown = int(re.findall(r"database shop shows batch (\d+) ", log.read_text())[-1])
    path = served["warehouse"] / "answers" / "by_region"
    store = DeltaStore()
    version = store.table(path).version()
    commit = json.loads((path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()[0])
    metadata = {k: v for k, v in commit["commitInfo"].items() if k.startswith("incr.")}
    assert metadata["incr.batch"] == str(shown)
    lines = len(log.read_text().splitlines())
    assert store.compact(path, ("region",), 0, metadata=metadata, vacuum=False)
    assert store.table(path).version() == version + 1
    time.sleep(2.0)  # several polls
    after = log.read_text().splitlines()[lines:]
    assert not [line for line in after if re.search(r"pinned|repaired|shows batch|dropped", line)], after
    reads = _reads(_beeline(port, _tagged("pinned", f"SELECT * FROM shop_b{shown}.by_region")
                            + _tagged("latest", "SELECT * FROM shop.by_region")))
    for tag in ("pinned", "latest"):
        assert diff_answers(oracle("by_region", shown), _typed("by_region", *reads[tag])) is None

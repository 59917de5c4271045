"""The generated DAGs under a real Airflow: scheduler, dag-processor, triggerer and api-server.

``dag.test()`` runs tasks one after another in the test's process; here Airflow's own
components run as separate processes on 127.0.0.1 with the LocalExecutor, in a temporary
``AIRFLOW_HOME``, as an operator would start them.  Nothing triggers a run but a file landing:
the landing folders' Asset watchers fire in the triggerer, the runs they start are checked
against the DuckDB oracle, the answers' Asset events start a downstream DAG, a rejected
batch fails the run naming its file and calls the program's failure hook, and any task that
needed a retry fails the test.

A second program (the kill tests' four views over two tables) has its task processes
SIGKILLed at random moments while the scheduler runs them: Airflow retries each killed task,
every answer a reader opens meanwhile equals the oracle as of a whole batch, and in the end
every batch is applied exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from incr.compiler import compile_program
from incr.config import Settings
from incr.errors import StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.bucket import working_copy
from incr.runtime.cluster import free_port
from incr.runtime.report import read_answer
from tests.runtime import killing

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROGRAM = """\
-- incr: on_failure = incr_test_hooks:record
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE TABLE f (who VARCHAR);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
CREATE VIEW best AS SELECT MAX(pts) AS best, MIN(pts) AS worst FROM e;
CREATE VIEW fans AS SELECT who, COUNT(*) AS n FROM f GROUP BY who;
"""
SCHEMAS = {"e": pa.schema([("who", pa.string()), ("pts", pa.int64())]),
           "f": pa.schema([("who", pa.string())])}
# The program's failure hook: records what Airflow handed it.
HOOKS = """\
import json, pathlib
def record(context):
    ti = context["ti"]
    out = pathlib.Path({out!r}) / f"{{ti.task_id}}.json"
    out.write_text(json.dumps({{"task": ti.task_id, "exception": str(context.get("exception"))}}))
"""
# A downstream DAG on the `totals` answer, written as a user would (see dags/incr_downstream_example.py).
DOWNSTREAM = """\
# Airflow DAG downstream of incr (DagBag safe mode wants both words)
import datetime as dt, json, pathlib
from airflow.sdk import dag, task
from incr.orchestration.dags import answer_asset
TOTALS = answer_asset({warehouse!r}, "totals")

@dag(dag_id="downstream", schedule=[TOTALS], start_date=dt.datetime(2026, 1, 1), catchup=False)
def downstream():
    @task
    def report(triggering_asset_events=None):
        from incr.orchestration.tasks import describe_answer
        out = describe_answer(TOTALS.uri, [e.extra for e in triggering_asset_events[TOTALS]])
        pathlib.Path({seen!r}, f"v{{out['version']}}.json").write_text(json.dumps(out))
        return out
    report()

downstream()
"""
PROGRAM_DAG = """\
# Airflow DAG for the test program (DagBag safe mode wants both words)
from pathlib import Path
from incr.orchestration.dags import program_dags
globals().update(program_dags(Path({sql!r}), {landing!r}, {warehouse!r}))
"""
# A program whose files land in an S3 bucket (the test's endpoint on 127.0.0.1).
BUCKETED = """\
CREATE TABLE g (who VARCHAR, pts BIGINT);
CREATE VIEW g_totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM g GROUP BY who;
CREATE VIEW g_best AS SELECT MAX(pts) AS best FROM g;
"""
WAIT_S = 300


@dataclass
class Stack:
    """A running Airflow and the folders of the program it maintains."""

    root: Path
    db: Path
    program: Path
    landing: Path
    warehouse: Path
    hooks_out: Path
    seen: Path
    logs: dict[str, Path]
    #: the killed program's file, landing and warehouse (its DAG is ``incr_killed``)
    killed: tuple[Path, Path, Path]
    #: a program landing in an S3 bucket, its warehouse in the bucket too: its file, landing
    #: URI and warehouse URI (``incr_bucketed``)
    bucketed: tuple[Path, str, str]

    def query(self, sql: str, *args: Any) -> list[tuple]:
        """Rows of Airflow's metadata DB (read-only, so the components are never blocked)."""
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)) as c:
            return c.execute(sql, args).fetchall()

    def runs(self, dag_id: str) -> list[tuple[str, str, str]]:
        """(run_id, run_type, state) of a DAG's runs, oldest first."""
        return self.query("SELECT run_id, run_type, state FROM dag_run WHERE dag_id = ? ORDER BY id", dag_id)

    def tail(self) -> str:
        """The last lines of every component's log, for a failure message."""
        parts = []
        for name, path in self.logs.items():
            lines = path.read_text(errors="replace").splitlines()[-15:] if path.exists() else []
            parts.append(f"--- {name}\n" + "\n".join(lines))
        task_logs = sorted((self.root / "home" / "logs").glob("dag_id=*/run_id=*/task_id=*/*.log"))
        for path in task_logs[-4:]:
            parts.append(f"--- {path.relative_to(self.root)}\n" + path.read_text(errors="replace")[-1500:])
        return "\n".join(parts)

    def wait(self, what: str, done: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        """Polls ``done`` until it returns something truthy; fails with the logs otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = done()
            if value:
                return value
            time.sleep(1.0)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{self.tail()}")

    def land(self, table: str, name: str, rows: list[dict], delete: bool = False) -> None:
        """Lands a CSV file atomically (written under a dot name, then renamed)."""
        folder = self.landing / table / ("_deletes" if delete else "")
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMAS[table]), folder / f".{name}.tmp")
        (folder / f".{name}.tmp").rename(folder / name)


def _environment(root: Path, api_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    home = root / "home"
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API_AUTH__JWT_SECRET": "incr-test-only-secret",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join([str(root / "hooks"), str(REPO)]),
        "INCR_LOCK_WAIT_S": "0",  # a task that waited on another view's lock would fail: no retry hides it
        # A killed task is retried a second later; batches of a few hundred rows take Spark.
        "INCR_RETRY_DELAY_S": "1",
        "INCR_LOCAL_ROWS": str(killing.LOCAL_ROWS),
        "INCR_SPARK_CONF": "spark.sql.shuffle.partitions=2,spark.driver.memory=1g",
    })
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory, s3) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("airflow-stack")
    home, sql, sql_killed = root / "home", root / "sql", root / "sql-killed"
    sql_bucketed = root / "sql-bucketed"
    for folder in (home / "dags", sql, sql_killed, sql_bucketed, root / "hooks", root / "hooks_out",
                   root / "seen"):
        folder.mkdir(parents=True)
    s = Stack(root, home / "airflow.db", sql / "games.sql", root / "landing", root / "warehouse",
              root / "hooks_out", root / "seen", {},
              (sql_killed / "killed.sql", root / "landing-killed", root / "warehouse-killed"),
              (sql_bucketed / "bucketed.sql", f"s3://{s3.bucket}/{root.name}",
               f"s3://{s3.bucket}/{root.name}-warehouse"))
    s.program.write_text(PROGRAM)
    s.killed[0].write_text(killing.PROGRAM)
    s.bucketed[0].write_text(BUCKETED)
    (home / "dags" / "incr_killed.py").write_text(PROGRAM_DAG.format(
        sql=str(sql_killed), landing=str(s.killed[1]), warehouse=str(s.killed[2])))
    (home / "dags" / "incr_bucketed.py").write_text(PROGRAM_DAG.format(
        sql=str(sql_bucketed), landing=s.bucketed[1], warehouse=s.bucketed[2]))
    (root / "hooks" / "incr_test_hooks.py").write_text(HOOKS.format(out=str(s.hooks_out)))
    (home / "dags" / "incr_games.py").write_text(PROGRAM_DAG.format(
        sql=str(sql), landing=str(s.landing), warehouse=str(s.warehouse)))
    (home / "dags" / "downstream.py").write_text(DOWNSTREAM.format(warehouse=str(s.warehouse),
                                                                   seen=str(s.seen)))
    env = _environment(root, free_port())
    env.update(s3.env)  # the bucketed program's landing area and warehouse
    env["INCR_WORKING_COPIES"] = str(root / "working-copies")  # the tasks' copy of that warehouse
    migrate = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, cwd=root, check=False,
                             capture_output=True, text=True)
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]
    procs: list[subprocess.Popen] = []
    try:
        for component in (["api-server", "--workers", "1"], ["scheduler"], ["dag-processor"], ["triggerer"]):
            log = root / f"{component[0]}.log"
            s.logs[component[0]] = log
            with log.open("w") as out:
                procs.append(subprocess.Popen([str(BIN / "airflow"), *component], env=env, cwd=root,
                                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        yield s
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _finished(s: Stack, dag_id: str, count: int) -> Callable[[], list | None]:
    """The DAG's runs once ``count`` of them finished; fails at once if one failed unexpectedly."""
    def check() -> list | None:
        runs = s.runs(dag_id)
        done = [r for r in runs if r[2] in ("success", "failed")]
        return runs if len(done) >= count else None
    return check


def _check_answers(s: Stack, live: dict[str, list[dict]], views: tuple[str, ...] = ("totals", "best", "fans")
                   ) -> None:
    tables = {name: pa.Table.from_pylist(rows, schema=SCHEMAS[name]) for name, rows in live.items()}
    for plan in compile_program(s.program).plans:
        if plan.view not in views:
            continue
        answer, _ = read_answer(s.warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, tables), answer) is None, plan.view


def _task_states(s: Stack, run_id: str) -> dict[str, tuple[str, int]]:
    rows = s.query("SELECT task_id, state, try_number FROM task_instance WHERE run_id = ?", run_id)
    return {task: (state, tries) for task, state, tries in rows}


def _started_spark(s: Stack, run_id: str, task: str) -> bool:
    logs = (s.root / "home" / "logs").glob(f"dag_id=incr_games/run_id={run_id}/task_id={task}/*.log")
    return any("starting Spark" in p.read_text(errors="replace") for p in logs)


def test_landed_files_start_runs_that_match_the_oracle_under_a_real_scheduler(stack: Stack):
    s = stack
    s.wait("the DAGs to be parsed and the landing watchers to start",
           lambda: len(s.query("SELECT dag_id FROM dag WHERE dag_id IN ('incr_games', 'downstream')")) == 2
           # e and f of this program, s and t of the killed one, g of the bucketed one
           and len(s.query("SELECT id FROM trigger WHERE classpath LIKE '%LandedFilesTrigger'")) == 5)
    assert s.runs("incr_games") == [], "a run started before any file landed"

    # 1. A landed file starts a run; the views equal the oracle; only e's views publish.
    e = [{"who": "ann", "pts": 3}, {"who": "bob", "pts": 5}, {"who": "ann", "pts": 4}]
    s.land("e", "001.csv", e)
    runs = s.wait("the run started by 001.csv", _finished(s, "incr_games", 1))
    run_id, run_type, state = runs[0]
    assert (run_type, state) == ("asset_triggered", "success"), s.tail()
    tasks = _task_states(s, run_id)
    assert tasks["apply_fans"][0] == "skipped"  # f has no batch: nothing to publish
    assert not (s.warehouse / "answers" / "fans").exists()
    _check_answers(s, {"e": e, "f": []}, ("totals", "best"))

    # 2. Files on both tables (a deletion among them) start the next run.
    s.land("e", "002.csv", [{"who": "cy", "pts": 9}])
    s.land("e", "003.csv", [{"who": "bob", "pts": 5}], delete=True)
    s.land("f", "004.csv", [{"who": "ann"}, {"who": "ann"}, {"who": "cy"}])
    e = [e[0], e[2], {"who": "cy", "pts": 9}]
    f = [{"who": "ann"}, {"who": "ann"}, {"who": "cy"}]

    def applied_through_004() -> bool:
        if not all(r[2] in ("success", "failed") for r in s.runs("incr_games")):
            return False
        try:
            return read_answer(s.warehouse, compile_program(s.program).plans[2])[1] == 3
        except StorageError:
            return False  # fans is published by the run that applies 004.csv
    s.wait("runs applying 002-004.csv", applied_through_004)
    _check_answers(s, {"e": e, "f": f})
    later = s.runs("incr_games")[1:]
    assert all(r[1] == "asset_triggered" and r[2] == "success" for r in later), later
    # No task starts Spark for these small batches, a view's first run included: its state
    # tables and first answer take Spark's types from the driver (incr/runtime/sparktypes.py).
    tasks = ("prepare", "apply_totals", "apply_best", "apply_fans", "finish")
    assert not [(r[0], t) for r in s.runs("incr_games") for t in tasks if _started_spark(s, r[0], t)]

    # 3. The answers' Asset events ran the downstream DAG on the fresh `totals`.
    s.wait("the downstream DAG", lambda: any(r[2] == "success" for r in s.runs("downstream")))
    assert all(r[1] == "asset_triggered" for r in s.runs("downstream"))
    seen = [json.loads(p.read_text()) for p in s.seen.glob("v*.json")]
    assert seen and all(x["answer"].endswith("/answers/totals") for x in seen)
    fans_events = s.query("SELECT COUNT(*) FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                          "WHERE a.uri LIKE '%/answers/fans'")[0][0]
    assert fans_events == 1  # published once: runs without an f batch skip it

    # 4. A deletion of a row that is not live: the run fails naming the file, the hook is
    #    called, the answers stay as they were.
    count = len(s.runs("incr_games"))
    s.land("e", "005.csv", [{"who": "zed", "pts": 1}], delete=True)
    runs = s.wait("the run rejecting 005.csv", _finished(s, "incr_games", count + 1))
    bad_id, _, bad_state = runs[-1]
    assert bad_state == "failed"
    assert _task_states(s, bad_id)["finish"][0] == "failed"
    record = json.loads(s.wait("the failure hook", lambda: next(iter(s.hooks_out.glob("finish.json")), None))
                        .read_text())
    assert "005.csv" in record["exception"], record
    _check_answers(s, {"e": e, "f": f})

    # No task anywhere needed a second try.
    retried = s.query("SELECT dag_id, run_id, task_id, try_number FROM task_instance "
                      "WHERE dag_id = 'incr_games' AND try_number > 1")
    assert retried == [], retried


def test_a_file_landed_in_a_bucket_starts_a_run_under_a_real_scheduler(stack: Stack, s3):
    """The triggerer's watcher lists the bucket; the run copies the object and applies it,
    its two view tasks at once, into a warehouse in the bucket (read here from a copy of
    its own)."""
    s = stack
    program, uri, warehouse = s.bucketed
    s.wait("the bucketed program's DAG and its watcher",
           lambda: s.query("SELECT dag_id FROM dag WHERE dag_id = 'incr_bucketed'")
           and len(s.query("SELECT id FROM trigger WHERE classpath LIKE '%LandedFilesTrigger'")) == 5)
    assert s.runs("incr_bucketed") == [], "a run started before any object landed"
    rows = [{"who": "ann", "pts": 3}, {"who": "bob", "pts": 5}]
    key = f"{uri.removeprefix('s3://')}/g/001.csv"
    with s3.fs.open_output_stream(key) as out:
        out.write(b"who,pts\nann,3\nbob,5\n")
    runs = s.wait("the run started by the object", _finished(s, "incr_bucketed", 1))
    assert [(r[1], r[2]) for r in runs] == [("asset_triggered", "success")], s.tail()
    copy = working_copy(warehouse, replace(Settings.from_env(),
                                           working_copies=str(s.root / "reader-copies")))
    live = pa.Table.from_pylist(rows, schema=SCHEMAS["e"])
    for plan in compile_program(program).plans:
        answer, batch = read_answer(copy, plan)
        assert batch == 0
        assert diff_answers(oracle_answer(plan.select, {"g": live}), answer) is None, plan.view
    retried = s.query("SELECT task_id FROM task_instance WHERE dag_id = 'incr_bucketed' "
                      "AND try_number > 1")
    assert retried == [], retried


def _running_tasks(s: Stack) -> list[tuple[str, str, int, int]]:
    """(run_id, task_id, pid, try_number) of the killed program's running task processes."""
    return s.query("SELECT run_id, task_id, pid, try_number FROM task_instance WHERE dag_id = 'incr_killed' "
                   "AND state = 'running' AND pid IS NOT NULL")


def _kind(task_id: str) -> str:
    return "apply" if task_id.startswith("apply_") else task_id


def _typical_duration(s: Stack, kind: str) -> float:
    """How long the killed program's finished tasks of ``kind`` ran (the median), 3 s at first."""
    rows = s.query("SELECT task_id, duration FROM task_instance WHERE dag_id = 'incr_killed' "
                   "AND state = 'success' AND duration IS NOT NULL")
    # (a task that finished in the instant it started may show a duration just below 0)
    took = sorted(d for task, d in rows if _kind(task) == kind and d > 0)
    return took[len(took) // 2] if took else 3.0  # the median: a Spark-sized batch's task is rare


def _quiet(s: Stack, stream: killing.Stream) -> bool:
    """Every run of the killed program finished, and every landed file is registered."""
    runs = s.runs("incr_killed")
    if not runs or any(r[2] not in ("success", "failed") for r in runs):
        return False
    return len(killing.ledger_batches(s.killed[2], "killed")) == len(stream.files)


def test_task_processes_killed_under_the_scheduler_are_retried_and_apply_each_batch_once(stack: Stack):
    """SIGKILL of a running task's process (prepare or a view's task), at a moment drawn
    uniformly from that kind of task's duration, while Airflow runs the DAG."""
    s = stack
    program, landing, warehouse = s.killed
    compiled = compile_program(program)
    rng = random.Random(int(os.environ.get("INCR_KILL_SEED", "7")) + 3)
    stream = killing.Stream(landing, killing.SCHEMAS)
    wanted = max(2, int(os.environ.get("INCR_KILLS", "4")) // 2)

    stream.land("s", "insert", killing.random_rows(rng, "s", 50))
    stream.land("t", "insert", killing.random_rows(rng, "t", 25))
    s.wait("the first run of the killed program", lambda: _quiet(s, stream))
    killing.check_answers(compiled, warehouse, stream, "after the first run")

    kills: list[tuple[str, str, int]] = []
    rounds = 0
    while len(kills) < wanted and rounds < 5 * wanted:
        killing.land_some(rng, stream, large=rounds % 3 == 1)
        rounds += 1
        # A task of the kind drawn for this round is killed at a random moment of its run
        # (prepare in a third of the rounds, a view's task in the others); one that ends
        # before its moment is let be, and the next one seen running is tried.
        kind = rng.choice(("prepare", "apply", "apply"))
        deadline = time.monotonic() + WAIT_S
        victim = None
        while victim is None and time.monotonic() < deadline and not _quiet(s, stream):
            fresh = [t for t in _running_tasks(s) if _kind(t[1]) == kind and (t[0], t[1], t[3]) not in kills]
            if not fresh:
                time.sleep(0.1)
                continue
            seen = rng.choice(fresh)
            time.sleep(rng.uniform(0.0, _typical_duration(s, kind)))
            if seen in _running_tasks(s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(seen[2], signal.SIGKILL)
                    victim = seen
                    kills.append((seen[0], seen[1], seen[3]))
        if victim is not None:  # else no task of that kind ran long enough this round
            killing.check_answers(compiled, warehouse, stream, f"round {rounds}, {victim[1]} killed")
        s.wait(f"round {rounds}'s runs", lambda: _quiet(s, stream))
        killing.check_answers(compiled, warehouse, stream, f"after round {rounds}")

    # Every killed task was retried, no run failed, every batch applied exactly once.
    s.wait("the last runs", lambda: _quiet(s, stream))
    runs = s.runs("incr_killed")
    assert all(r[2] == "success" for r in runs), (runs, s.tail())
    seen = killing.check_answers(compiled, warehouse, stream, "after the last run")
    batches = killing.ledger_batches(warehouse, "killed")
    last_of = {t: max(seq for rel, seq in batches.items() if stream.files[rel][0] == t)
               for t in killing.SCHEMAS}
    for plan in compiled.plans:
        assert seen[plan.view] == max(last_of[src.lower()] for src in plan.sources), plan.view
    # Every killed task ended well: retried, or (killed in the instant after it had told
    # Airflow its outcome, as a task that found nothing new and skipped) as it had ended.
    retried = 0
    for run_id, task_id, tries in kills:
        after = s.query("SELECT state, try_number FROM task_instance WHERE dag_id = 'incr_killed' "
                        "AND run_id = ? AND task_id = ?", run_id, task_id)
        assert after and after[0][0] in ("success", "skipped"), (task_id, after)
        retried += after[0][1] > tries
    print(f"\nunder the scheduler: {len(kills)} task processes killed in {rounds} rounds "
          f"({sorted(_kind(t) for _, t, _ in kills)}), {retried} retried by Airflow, {len(runs)} runs, "
          f"{len(batches)} batches; 0 inconsistent reads, 0 lost or doubled batches")
    assert len(kills) >= wanted, f"only {len(kills)} of {wanted} task processes were killed"
    assert retried, "no killed task was retried: the kills came too late to test anything"

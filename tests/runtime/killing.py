"""A stream of insert and delete batches, real ``incr`` processes, and SIGKILL at random moments.

Shared by the kill tests (``test_sigkill.py``): :class:`Stream` lands batch files and knows
the live rows after each one; :func:`kill_at_random` starts a process and kills it with
SIGKILL at a moment drawn uniformly from its expected running time; :func:`check_answers`
compares every answer table a reader opens with the DuckDB oracle as of the batch the answer
says it reflects, so an answer of half a batch, or of a batch applied twice, fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from incr.compiler import CompiledProgram
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.housekeeping import versions_of_last_batches
from incr.runtime.ledger import Ledger
from incr.runtime.report import read_answer
from incr.runtime.store import DeltaStore, commit_batches

#: Batches of more rows than this take Spark in the killed processes.
LOCAL_ROWS = 300
#: The program of the kill tests: aggregates kept every way (sums, bags, distinct values,
#: exact float bands, a global aggregate, a join's side table, a top-k).
PROGRAM = """-- incr: buckets = 2
CREATE TABLE s (g VARCHAR, k BIGINT, v BIGINT, x DOUBLE);
CREATE TABLE t (k BIGINT, label VARCHAR);
CREATE VIEW per_group AS
SELECT g, SUM(v) AS total, COUNT(*) AS n, MIN(v) AS lo, MAX(x) AS hi, COUNT(DISTINCT v) AS dv,
       SUM(x) AS sx
FROM s GROUP BY g;
CREATE VIEW overall AS SELECT COUNT(*) AS n, SUM(v) AS total, AVG(x) AS ax, MAX(v) AS hi FROM s;
CREATE VIEW labelled AS
SELECT t.label, COUNT(*) AS n, SUM(s.v) AS total FROM s JOIN t ON s.k = t.k GROUP BY t.label;
CREATE VIEW leaders AS SELECT g, SUM(v) AS total FROM s GROUP BY g ORDER BY total DESC, g LIMIT 3;
CREATE VIEW spread AS SELECT COUNT(*) AS n, MIN(sx) AS lo, MAX(sx) AS hi, SUM(sx) AS total
FROM (SELECT g, SUM(x) AS sx FROM s GROUP BY g) AS q;
"""
SCHEMAS = {"s": pa.schema([("g", pa.string()), ("k", pa.int64()), ("v", pa.int64()), ("x", pa.float64())]),
           "t": pa.schema([("k", pa.int64()), ("label", pa.string())])}


def kill_env(**extra: str) -> dict[str, str]:
    """The environment of the killed processes: small batches local, large ones in Spark."""
    env = {k: v for k, v in os.environ.items() if k not in ("INCR_CRASH_AT", "INCR_PAUSE_AT")}
    env.update(INCR_LOCAL_ROWS=str(LOCAL_ROWS), INCR_LOCK_WAIT_S="0",
               INCR_SPARK_CONF="spark.sql.shuffle.partitions=2,spark.driver.memory=1g", **extra)
    return env


def random_rows(rng: random.Random, table: str, n: int) -> list[dict]:
    """``n`` random rows of ``table`` of :data:`PROGRAM`."""
    if table == "t":
        return [{"k": rng.randrange(25), "label": f"L{rng.randrange(6)}"} for _ in range(n)]
    return [{"g": f"g{rng.randrange(30)}", "k": rng.randrange(25), "v": rng.randrange(-50, 1000),
             "x": rng.randrange(-400, 4000) / 4} for _ in range(n)]


def land_some(rng: random.Random, stream: Stream, large: bool) -> int:
    """Lands one or two batches (inserts, or deletes of live rows), the first of
    ``large`` (Spark) size if asked; returns their rows."""
    landed = 0
    for _ in range(rng.choice((1, 1, 2))):
        table = rng.choice(("s", "s", "t"))
        live = stream.live.get(table, [])
        n = rng.randrange(LOCAL_ROWS + 50, 3 * LOCAL_ROWS) if large else rng.randrange(1, 40)
        if live and rng.random() < 0.3:
            rows = rng.sample(live, min(len(live) // 3 + 1, n))
            stream.land(table, "delete", rows, parquet=large)
        else:
            rows = random_rows(rng, table, n)
            stream.land(table, "insert", rows, parquet=large)
        landed += len(rows)
        large = False  # at most one large batch a round
    return landed


# The DAG's task bodies, run as the processes Airflow starts for them.
_PREPARE = """
import sys
from pathlib import Path
from incr.orchestration.tasks import prepare_batches
out = prepare_batches(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
print(out["ready_through"], " ".join(out["views"]))
"""
_APPLY = """
import sys
from pathlib import Path
from incr.orchestration.tasks import apply_view
apply_view(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
"""


def run_argv(program: Path, landing: Path, warehouse: Path) -> list[str]:
    """``incr run`` of ``program``."""
    return [sys.executable, "-m", "incr.cli", "run", str(program), "--landing", str(landing),
            "--warehouse", str(warehouse)]


def maintain_argv(program: Path, landing: Path, warehouse: Path, keep_batches: int) -> list[str]:
    """``incr maintain`` of ``program`` keeping the last ``keep_batches`` batches' answers only."""
    return [sys.executable, "-m", "incr.cli", "maintain", str(program), "--landing", str(landing),
            "--warehouse", str(warehouse), "--keep-batches", str(keep_batches), "--keep-hours", "0"]


def prepare_argv(program: Path, landing: Path, warehouse: Path) -> list[str]:
    """The DAG's ``prepare`` task; prints the batch views may go to, then the views."""
    return [sys.executable, "-c", _PREPARE, str(program), str(landing), str(warehouse)]


def apply_argv(program: Path, landing: Path, warehouse: Path, view: str, through: int | str) -> list[str]:
    """The DAG's ``apply_<view>`` task."""
    return [sys.executable, "-c", _APPLY, str(program), str(landing), str(warehouse), view, str(through)]


@dataclass
class Stream:
    """Batch files landed one at a time, with the rows each inserts or deletes.

    Files are written under a temporary name and renamed, as an upstream job should land
    them, so a run never sees half a file.
    """

    landing: Path
    schemas: Mapping[str, pa.Schema]
    #: relative path -> (table, kind, rows)
    files: dict[str, tuple[str, str, list[dict]]] = field(default_factory=dict)
    live: dict[str, list[dict]] = field(default_factory=dict)

    def land(self, table: str, kind: str, rows: list[dict], parquet: bool = False) -> str:
        """Lands one batch file; returns its path relative to the landing folder."""
        folder = self.landing / table / ("_deletes" if kind == "delete" else "")
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{len(self.files):05d}.{'parquet' if parquet else 'csv'}"
        data = pa.Table.from_pylist(rows, schema=self.schemas[table])
        tmp = folder / f".{name}.part"
        if parquet:
            pq.write_table(data, tmp)
        else:
            pacsv.write_csv(data, tmp)
        os.replace(tmp, folder / name)
        live = self.live.setdefault(table, [])
        if kind == "insert":
            live.extend(rows)
        else:
            for r in rows:
                live.remove(r)
        rel = str((folder / name).relative_to(self.landing))
        self.files[rel] = (table, kind, rows)
        return rel

    def as_of(self, batches: Mapping[str, int], seq: int) -> dict[str, pa.Table]:
        """Every table's live rows after the batches numbered up to ``seq``.

        Args:
            batches: the ledger's batch number of every registered file (by relative path).
            seq: the batch the answer reflects.
        """
        live: dict[str, list[dict]] = {t: [] for t in self.schemas}
        for rel, (table, kind, rows) in sorted(self.files.items(), key=lambda f: batches.get(f[0], 1 << 60)):
            if batches.get(rel, 1 << 60) > seq:
                continue
            if kind == "insert":
                live[table].extend(rows)
            else:
                for r in rows:
                    live[table].remove(r)
        return {t: pa.Table.from_pylist(rows, schema=self.schemas[t]) for t, rows in live.items()}


def ledger_batches(warehouse: Path, program: str) -> dict[str, int]:
    """The batch number of every registered file, asserting no file was registered twice."""
    store = DeltaStore()
    path = warehouse / "_incr" / program / "ledger"
    if not store.exists(path):
        return {}
    events = store.read(path).to_pylist()
    registered = [e for e in events if e["event"] == "register"]
    paths = [e["path"] for e in registered]
    assert len(paths) == len(set(paths)), f"a file was registered twice: {sorted(paths)}"
    seqs = [e["seq"] for e in registered]
    assert len(seqs) == len(set(seqs)), f"a batch number was given twice: {sorted(seqs)}"
    assert sorted(seqs) == list(range(len(seqs))), f"batch numbers have a gap: {sorted(seqs)}"
    assert {b.path for b in Ledger(store, path).batches()} == set(paths)
    return {e["path"]: e["seq"] for e in registered}


def check_answers(compiled: CompiledProgram, warehouse: Path, stream: Stream,
                  context: str) -> dict[str, int | None]:
    """Every view's answer equals the oracle as of the batch it reflects; returns those batches."""
    batches = ledger_batches(warehouse, compiled.name)
    seen: dict[str, int | None] = {}
    for plan in compiled.plans:
        if not (warehouse / "answers" / plan.view).exists():
            seen[plan.view] = None
            continue
        answer, at = read_answer(warehouse, plan)
        seen[plan.view] = at
        assert at is not None, f"{context}: {plan.view}'s answer names no batch"
        expected = oracle_answer(plan.select, stream.as_of(batches, at))
        diff = diff_answers(expected, answer, ordered=plan.ordered)
        assert diff is None, f"{context}: {plan.view} as of batch {at}: {diff}"
    return seen


def check_window(compiled: CompiledProgram, warehouse: Path, stream: Stream, keep: int,
                 context: str) -> int:
    """Every answer version housekeeping kept for the last ``keep`` batches (time travel)
    equals the oracle as of its batch; returns how many batches' answers were read."""
    store = DeltaStore()
    batches = ledger_batches(warehouse, compiled.name)
    read = 0
    for plan in compiled.plans:
        path = warehouse / "answers" / plan.view
        if not store.exists(path):
            continue
        kept = set(versions_of_last_batches(store, path, keep))
        for b in sorted({b for v, b in commit_batches(path, 0, store.table(path).version()) if v in kept}):
            answer, _ = read_answer(warehouse, plan, b)
            diff = diff_answers(oracle_answer(plan.select, stream.as_of(batches, b)), answer,
                                ordered=plan.ordered)
            assert diff is None, f"{context}: {plan.view}'s kept answer of batch {b}: {diff}"
            read += 1
    return read


@dataclass
class Killer:
    """Starts processes and SIGKILLs them at uniformly random moments of their expected run."""

    rng: random.Random
    expected_s: float = 0.0  # a finished run's duration (a moving average), 0 until one finished
    kills: int = 0
    finished: int = 0
    durations: list[float] = field(default_factory=list)

    def run(self, argv: list[str], env: Mapping[str, str], kill: bool) -> str | None:
        """Runs ``argv``; with ``kill``, SIGKILLs it at a random moment.

        Returns its standard output if it finished (it must exit 0), None if it was killed.
        The whole process group goes: a killed driver's JVM (which exits on its own once its
        parent's pipe closes) must not linger into the next run.
        """
        delay = self.rng.uniform(0.0, self.expected_s) if kill and self.expected_s else None
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=delay if delay is not None else 900)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            _kill_group(proc.pid)
            proc.communicate()
            self.kills += 1
            return None
        _kill_group(proc.pid)
        assert proc.returncode == 0, f"{argv[1:]} exited {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
        took = time.monotonic() - started
        self.durations.append(took)
        self.finished += 1
        self.expected_s = took if not self.expected_s else 0.5 * self.expected_s + 0.5 * took
        return out


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)

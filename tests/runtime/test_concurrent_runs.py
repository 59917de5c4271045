"""Runs of one program started at once: one proceeds, the others exit 4 saying who holds what.

A cron schedule that overlaps a slow run, an operator's ``incr run`` while the DAG is
running, or two DAG runs: every process takes the locks of what it writes (see
:mod:`incr.runtime.lock`), so exactly one writer touches a table at a time and a loser
exits 4 (StorageError) with a message naming the lock and the pid holding it.  Nothing may
be lost or applied twice: afterwards, a plain run or the DAG's tasks finish the work and
the answers equal the oracle.

The overlap is made, not hoped for: ``INCR_PAUSE_AT=locks.held:<file>`` holds whichever
process first takes its locks there until the test creates ``<file>``, so the others are
started (and lose) while it holds them.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

from incr.compiler import compile_program
from tests.runtime.killing import (
    LOCAL_ROWS,
    PROGRAM,
    SCHEMAS,
    Stream,
    apply_argv,
    check_answers,
    kill_env,
    ledger_batches,
    prepare_argv,
    random_rows,
    run_argv,
)

BUSY = "is being updated by pid"


def _start(argv: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(argv, env=kill_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _pause(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment that holds a process once it took its locks, and the release file."""
    release = tmp_path / "release"
    release.unlink(missing_ok=True)
    Path(f"{release}.reached").unlink(missing_ok=True)
    return {"INCR_PAUSE_AT": f"locks.held:{release}"}, release


def _holder(release: Path, procs: list[subprocess.Popen]) -> subprocess.Popen:
    """The process paused holding its locks, once one is."""
    reached = Path(f"{release}.reached")
    deadline = time.monotonic() + 300
    while not (reached.exists() and reached.read_text()):
        assert time.monotonic() < deadline, "no process reached its locks"
        assert any(p.poll() is None for p in procs), "every process ended before taking its locks"
        time.sleep(0.05)
    pid = int(reached.read_text())
    return next(p for p in procs if p.pid == pid)


def _outcome(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        assert BUSY in err, f"exit {proc.returncode} without saying who holds the lock:\n{err[-3000:]}"
    return proc.returncode, out


def _setup(tmp_path: Path, name: str):
    program = tmp_path / f"{name}.sql"
    program.write_text(PROGRAM)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    stream = Stream(landing, SCHEMAS)
    rng = random.Random(5)
    stream.land("s", "insert", random_rows(rng, "s", 40))
    stream.land("t", "insert", random_rows(rng, "t", 20))
    return compile_program(program), program, landing, warehouse, stream, rng


def test_runs_started_at_once_one_applies_the_others_exit_4(tmp_path):
    compiled, program, landing, warehouse, stream, rng = _setup(tmp_path, "overlap")
    stream.land("s", "insert", random_rows(rng, "s", 2 * LOCAL_ROWS), parquet=True)
    pause, release = _pause(tmp_path)
    procs = [_start(run_argv(program, landing, warehouse), **pause) for _ in range(3)]
    winner = _holder(release, procs)
    losers = [_outcome(p)[0] for p in procs if p is not winner]
    release.touch()
    assert losers == [4, 4], f"runs started while another held the locks did not exit 4: {losers}"
    assert _outcome(winner)[0] == 0, "the run holding the locks failed"
    check_answers(compiled, warehouse, stream, "after the overlapping runs")

    # The losers lost nothing: a later run has nothing left to do, and each file is one batch.
    stream.land("s", "delete", stream.live["s"][:5])
    code, _ = _outcome(_start(run_argv(program, landing, warehouse)))
    assert code == 0
    seen = check_answers(compiled, warehouse, stream, "after the next run")
    assert len(ledger_batches(warehouse, compiled.name)) == len(stream.files) == 4
    assert seen["per_group"] == 3


def test_a_cli_run_and_a_dag_run_at_once_lose_and_double_nothing(tmp_path):
    compiled, program, landing, warehouse, stream, rng = _setup(tmp_path, "mixed")
    code, _ = _outcome(_start(run_argv(program, landing, warehouse)))
    assert code == 0  # the tables exist; the batches below are small (no Spark)
    for _ in range(3):
        stream.land("s", "insert", random_rows(rng, "s", 30))
    stream.land("t", "insert", random_rows(rng, "t", 10))
    stream.land("s", "delete", stream.live["s"][10:25])

    # The DAG's prepare task holds its locks while an operator's run starts: the run loses.
    pause, release = _pause(tmp_path)
    prepare = _start(prepare_argv(program, landing, warehouse), **pause)
    _holder(release, [prepare])
    cli_code, _ = _outcome(_start(run_argv(program, landing, warehouse)))
    release.touch()
    prepared_code, prepared = _outcome(prepare)
    assert (prepared_code, cli_code) == (0, 4), "a run started while prepare held the ledger did not lose"
    through, views = prepared.split(None, 1)
    # The view tasks, at once, alongside another operator's run.
    tasks = [_start(apply_argv(program, landing, warehouse, v, through)) for v in views.split()]
    cli = _start(run_argv(program, landing, warehouse))
    codes = [_outcome(p)[0] for p in [*tasks, cli]]
    assert 0 in codes
    check_answers(compiled, warehouse, stream, "after the view tasks and the run at once")

    # Whatever lost its lock is picked up by the next run: all of it, once.
    code, _ = _outcome(_start(run_argv(program, landing, warehouse)))
    assert code == 0
    seen = check_answers(compiled, warehouse, stream, "after the last run")
    batches = ledger_batches(warehouse, compiled.name)
    assert len(batches) == len(stream.files)
    assert seen["per_group"] == max(seq for rel, seq in batches.items() if stream.files[rel][0] == "s")

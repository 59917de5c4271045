"""SIGKILL at random moments: a real ``incr run`` process killed anywhere, then resumed.

``test_crash.py`` stops a run at six named points; production kills it anywhere.  Here a
stream of insert and delete batches over two tables (small batches take the driver-side
engine, large ones Spark: ``INCR_LOCAL_ROWS`` is lowered so that a few hundred rows are
"large") is applied by real ``incr run`` processes, each SIGKILLed (with its JVM) at a
moment drawn uniformly from a run's expected duration, and the next run resumes.  After
every kill, every answer table a reader opens must equal the DuckDB oracle as of the whole
batch it says it reflects; after the last resume, every answer equals the oracle over all
batches and the ledger numbers each file exactly once.  A kill also leaves its lock files
naming the dead process: the next run must take them over, not refuse.  Housekeeping
(``incr maintain`` keeping two batches of time travel, itself killed half the time) runs
between the batches: every answer version it kept must still read as the oracle as of its
batch, and the runs after it resume what the killed ones left.

``INCR_KILLS`` sets the number of kills (``make test`` runs a handful, ``make soak`` 50);
``INCR_KILL_SEED`` the data's seed (the kill moments differ from run to run anyway).  Each
test prints its counts (kills, finished runs, batches) with ``-s``.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from incr.compiler import compile_program
from tests.runtime.killing import (
    PROGRAM,
    SCHEMAS,
    Killer,
    Stream,
    apply_argv,
    check_answers,
    check_window,
    kill_env,
    land_some,
    ledger_batches,
    maintain_argv,
    prepare_argv,
    random_rows,
    run_argv,
)

REPO = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("INCR_KILLS", "4"))
SEED = int(os.environ.get("INCR_KILL_SEED", "7"))


def _lock_holders(warehouse: Path, program: str) -> set[str]:
    """What the program's lock files say about who took them last (``pid N``)."""
    locks = warehouse / "_incr" / program / "locks"
    return {p.read_text().strip() for p in locks.glob("*.lock")} if locks.exists() else set()


def test_random_sigkills_leave_whole_batches_and_resume_exactly_once(tmp_path):
    rng = random.Random(SEED)
    program = tmp_path / "killed.sql"
    program.write_text(PROGRAM)
    compiled = compile_program(program)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    stream = Stream(landing, SCHEMAS)
    argv, env = run_argv(program, landing, warehouse), kill_env()
    killer, upkeep = Killer(rng), Killer(rng)
    housekeeping = maintain_argv(program, landing, warehouse, keep_batches=2)
    kept_reads = 0

    # The first batches of both tables, applied whole: the baseline duration of a run.
    stream.land("s", "insert", random_rows(rng, "s", 60))
    stream.land("t", "insert", random_rows(rng, "t", 30))
    assert killer.run(argv, env, kill=False) is not None
    check_answers(compiled, warehouse, stream, "after the first run")

    rounds = large_batches = stale_locks = 0
    while killer.kills < KILLS and rounds < 3 * KILLS:
        large = rounds % 3 == 0  # the first killed round, and every third, has a Spark-sized batch
        large_batches += large
        land_some(rng, stream, large)
        holders_before = _lock_holders(warehouse, compiled.name)
        # Every fourth run is left to finish: it drains what the killed ones left pending and
        # keeps the expected duration (the range the kill moments are drawn from) current.
        killed = killer.run(argv, env, kill=rounds % 4 != 3) is None
        rounds += 1
        context = f"round {rounds} ({'killed' if killed else 'finished'}, seed {SEED})"
        check_answers(compiled, warehouse, stream, context)
        if killed and _lock_holders(warehouse, compiled.name) - holders_before:
            stale_locks += 1  # the dead run had taken a lock: the next run must take it over
        if rounds % 4 == 2:  # housekeeping between batches, after a killed run as often as not
            upkeep.run(housekeeping, env, kill=rng.random() < 0.5)
            context = f"after housekeeping in round {rounds} (seed {SEED})"
            check_answers(compiled, warehouse, stream, context)
            kept_reads += check_window(compiled, warehouse, stream, 2, context)

    # The last resume, not killed: everything applied exactly once.
    assert killer.run(argv, env, kill=False) is not None
    seen = check_answers(compiled, warehouse, stream, f"after the last resume (seed {SEED})")
    batches = ledger_batches(warehouse, compiled.name)
    assert len(batches) == len(stream.files), "a landed file was not registered"
    last_of = {t: max(seq for rel, seq in batches.items() if stream.files[rel][0] == t) for t in SCHEMAS}
    for plan in compiled.plans:
        assert seen[plan.view] == max(last_of[s.lower()] for s in plan.sources), plan.view
    print(f"\nSIGKILL soak: {killer.kills} kills in {rounds} rounds, {killer.finished} runs finished, "
          f"{len(batches)} batches ({large_batches} rounds with a Spark-sized batch), "
          f"{stale_locks} kills left lock files naming a dead pid; {upkeep.finished + upkeep.kills} "
          f"housekeepings between them ({upkeep.kills} killed), {kept_reads} kept answer versions "
          f"read as of their batch; 0 inconsistent reads, "
          f"0 lost or doubled batches; finished runs took {[round(d, 1) for d in killer.durations]} s")
    assert killer.kills >= KILLS, f"only {killer.kills} of {KILLS} runs were killed in {rounds} rounds"


def test_random_sigkills_inside_the_dags_tasks(tmp_path):
    """The same stream through the DAG's task bodies (``prepare``, then ``apply_<view>``),
    each a process Airflow would start, each killed at a random moment; the next DAG run
    (prepare again, then every view's task) resumes."""
    rng = random.Random(SEED + 1)
    program = tmp_path / "tasks.sql"
    program.write_text(PROGRAM)
    compiled = compile_program(program)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    stream = Stream(landing, SCHEMAS)
    env = kill_env()
    # Prepare and a view's task take different times: each has its own expected duration.
    preparing, applying = Killer(rng), Killer(rng)

    def dag_run(kill: bool) -> None:
        # Prepare is killed in a third of the rounds, so that the view tasks run in the others.
        out = preparing.run(prepare_argv(program, landing, warehouse), env, kill=kill and rng.random() < 0.34)
        if out is None:
            check_answers(compiled, warehouse, stream, "after prepare was killed")
            return
        through, views = out.split(None, 1)
        for view in views.split():
            killed = applying.run(apply_argv(program, landing, warehouse, view, through), env, kill=kill)
            if killed is None:
                check_answers(compiled, warehouse, stream, f"after apply_{view} was killed")

    stream.land("s", "insert", random_rows(rng, "s", 50))
    stream.land("t", "insert", random_rows(rng, "t", 25))
    dag_run(kill=False)
    wanted = max(2, KILLS // 2)
    rounds = 0
    while ((preparing.kills + applying.kills < wanted or not preparing.kills or not applying.kills)
           and rounds < 6 * wanted):
        land_some(rng, stream, large=rounds % 3 == 1)
        dag_run(kill=rounds % 4 != 3)  # every fourth DAG run finishes (see above)
        rounds += 1
    dag_run(kill=False)
    seen = check_answers(compiled, warehouse, stream, "after the last DAG run")
    batches = ledger_batches(warehouse, compiled.name)
    assert len(batches) == len(stream.files)
    last_of = {t: max(seq for rel, seq in batches.items() if stream.files[rel][0] == t) for t in SCHEMAS}
    for plan in compiled.plans:
        assert seen[plan.view] == max(last_of[s.lower()] for s in plan.sources), plan.view
    print(f"\nDAG tasks: {preparing.kills} prepare and {applying.kills} view tasks killed in {rounds} "
          f"rounds, {len(batches)} batches; 0 inconsistent reads, 0 lost or doubled batches")
    assert preparing.kills + applying.kills >= wanted and preparing.kills and applying.kills


def test_random_sigkills_inside_an_iterative_loop(spark, tmp_path):
    """PageRank (TOLERANCE 0, so every run moves the same way) killed anywhere, loops
    included, answers after every kill what an unkilled run answered for the same batch."""
    import pyarrow as pa

    from incr.oracle import diff_answers
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    rng = random.Random(SEED + 2)
    text = (REPO / "sql/examples/pagerank.sql").read_text()
    program = tmp_path / "pagerank.sql"
    program.write_text(text.replace("ITERATIONS 10 TOLERANCE 1e-6", "ITERATIONS 3 TOLERANCE 0"))
    compiled = compile_program(program)
    plan = compiled.plans[0]
    schemas = {"edges": pa.schema([("src", pa.int64()), ("dst", pa.int64())])}
    killed_stream = Stream(tmp_path / "landing", schemas)
    reference = Stream(tmp_path / "landing-ref", schemas)

    def land(kind: str, edges: list[dict]) -> None:
        for stream in (killed_stream, reference):
            stream.land("edges", kind, edges, parquet=True)

    def edges(n: int, nodes: int) -> list[dict]:
        return [{"src": rng.randrange(nodes), "dst": rng.randrange(nodes)} for _ in range(n)]

    warehouse = tmp_path / "warehouse"
    argv, env = run_argv(program, killed_stream.landing, warehouse), kill_env()
    killer = Killer(rng)
    # The first batch, applied whole: the baseline duration of a run's loops.
    land("insert", edges(150, 30))
    assert killer.run(argv, env, kill=False) is not None
    wanted = max(1, KILLS // 4)
    for b in range(2 * wanted + 1):  # small batches: new edges, and deletes of live ones
        if b % 3 == 2:
            land("delete", rng.sample(killed_stream.live["edges"], 4))
        else:
            land("insert", edges(6, 30 + b))
    Pipeline(compiled, reference.landing, tmp_path / "wh-ref", spark=spark).run()
    rounds = 0
    while killer.kills < wanted and rounds < 6 * wanted:
        killed = killer.run(argv, env, kill=True) is None
        rounds += 1
        answer, seen = read_answer(warehouse, plan)
        expected, _ = read_answer(tmp_path / "wh-ref", plan, batch=seen)
        diff = diff_answers(expected, answer)
        assert diff is None, f"round {rounds} ({'killed' if killed else 'finished'}), batch {seen}: {diff}"
    assert killer.run(argv, env, kill=False) is not None
    answer, seen = read_answer(warehouse, plan)
    expected, last = read_answer(tmp_path / "wh-ref", plan)
    assert seen == last == len(killed_stream.files) - 1
    assert diff_answers(expected, answer) is None
    print(f"\nPageRank: {killer.kills} kills in {rounds} rounds; answers equal the unkilled run's")
    assert killer.kills >= wanted


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s"]))

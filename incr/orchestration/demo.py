"""``make demo``: a sample sales stream, maintained through the generated Airflow DAG.

The demo lands an initial load, ten insert batches and two delete batches (returns of rows
sold earlier) for ``sql/examples/sales.sql`` in three waves, runs the program's DAG with
``dag.test()`` after each wave (as the scheduler would after files land), and prints every
view's answer.  Then it times, on the same Spark session, recomputing each view from all
data against the incremental batches, and checks the answers against DuckDB on all data.

Airflow's home (SQLite metadata DB) lives inside ``--out``, so the demo touches nothing
outside it.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from incr.orchestration.airflow_home import use_airflow_home

PROGRAM = Path(__file__).resolve().parents[2] / "sql" / "examples" / "sales.sql"
REGIONS = ["north", "south", "east", "west", "central"]
PRODUCTS = [f"p{i:02d}" for i in range(40)]


def sales_rows(rng: random.Random, n: int) -> list[dict]:
    """``n`` random sales rows (a few with NULL amounts and non-positive quantities)."""
    rows = []
    for _ in range(n):
        amount = None if rng.random() < 0.02 else round(rng.uniform(1, 500), 2)
        rows.append({"region": rng.choice(REGIONS), "product": rng.choice(PRODUCTS),
                     "amount": amount, "qty": rng.randint(-1, 9)})
    return rows


def land_stream(landing: Path, initial_rows: int, seed: int = 7) -> list[list[Path]]:
    """Writes the sample stream; returns the files of each wave, in landing order.

    Batch files are named ``NNNN_*`` so they apply in that order; deletes remove rows that
    earlier batches inserted (returns), so every delete batch is valid.
    """
    rng = random.Random(seed)
    schema = pa.schema([("region", pa.string()), ("product", pa.string()),
                        ("amount", pa.float64()), ("qty", pa.int64())])
    inserts, deletes = landing / "sales", landing / "sales" / "_deletes"
    inserts.mkdir(parents=True, exist_ok=True)
    deletes.mkdir(parents=True, exist_ok=True)
    live: list[dict] = []
    files: list[Path] = []

    def write(path: Path, rows: list[dict]) -> None:
        table = pa.Table.from_pylist(rows, schema=schema)
        tmp = path.with_name("." + path.name + ".tmp")  # land atomically: incr ignores dot files
        if path.suffix == ".parquet":
            pq.write_table(table, tmp)
        elif path.suffix == ".csv":
            pacsv.write_csv(table, tmp)
        else:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(path)
        files.append(path)

    rows = sales_rows(rng, initial_rows)
    live += rows
    write(inserts / "0000_initial.parquet", rows)
    step = max(initial_rows // 10, 10)
    formats = [".parquet", ".csv", ".jsonl"]
    seq = 1
    for i in range(10):
        rows = sales_rows(rng, step)
        live += rows
        write(inserts / f"{seq:04d}_sales{formats[i % 3]}", rows)
        seq += 1
        if i in (4, 8):  # returns: delete some rows sold earlier
            gone = rng.sample(range(len(live)), k=max(step // 4, 1))
            returned = [live[j] for j in sorted(gone)]
            live = [r for j, r in enumerate(live) if j not in set(gone)]
            write(deletes / f"{seq:04d}_returns.csv", returned)
            seq += 1
    return [files[:4], files[4:9], files[9:]]


def run_dag_once(program: Path, landing: Path, warehouse: Path) -> str:
    """Runs the program's generated DAG once in-process; returns the run's state."""
    from incr.orchestration.airflow_home import ensure_metadata_db
    from incr.orchestration.dags import program_dag

    ensure_metadata_db()
    dag = program_dag(program, str(landing), str(warehouse))
    run = dag.test()
    return str(getattr(run, "state", run))


def run_demo(out: Path, initial_rows: int) -> int:
    """The whole demo; returns the process exit code."""
    import shutil

    out = out.resolve()
    # A fresh start, Airflow's metadata DB included: dag.test() runs tasks against the DAG
    # version stored there, which an earlier demo with other tasks would have left.
    for sub in ("landing", "warehouse", "replay-warehouse", "airflow"):
        shutil.rmtree(out / sub, ignore_errors=True)
    landing, warehouse = out / "landing", out / "warehouse"
    use_airflow_home(out / "airflow", PROGRAM.parents[2] / "dags")

    from incr.compiler import compile_program
    from incr.runtime.report import format_table, read_answer

    compiled = compile_program(PROGRAM)
    print(f"incr demo: program {PROGRAM.name}, views {', '.join(p.view for p in compiled.plans)}")
    waves = land_stream(landing, initial_rows)
    t_all = time.perf_counter()
    for i, wave in enumerate(waves, start=1):
        names = ", ".join(p.name for p in wave)
        print(f"\n== wave {i}: landed {len(wave)} file(s): {names}")
        t0 = time.perf_counter()
        state = run_dag_once(PROGRAM, landing, warehouse)
        print(f"   DAG incr_{compiled.name} run: {state} in {time.perf_counter() - t0:.1f}s")
        if "success" not in state:
            print("error: the DAG run did not succeed", file=sys.stderr)
            return 1
    print(f"\nall waves applied in {time.perf_counter() - t_all:.1f}s")
    for plan in compiled.plans:
        table, batch = read_answer(warehouse, plan)
        print(f"\n{plan.view} (as of batch {batch}, {table.num_rows} rows)")
        print(format_table(table.column_names, table.to_pylist()))

    from incr.runtime.replay import replay
    from incr.runtime.session import spark_session

    print("\nreplay, one batch at a time on a fresh warehouse: incremental vs recomputing every "
          "view from all data\n(same Spark session), each answer checked against the Spark "
          "recompute and DuckDB:")
    rows = replay(compiled, landing, out / "replay-warehouse", spark_session(), out=sys.stdout)
    bad = [r for r in rows if r.mismatches]
    if bad:
        print(f"error: {len(bad)} batch(es) disagree with the oracle", file=sys.stderr)
        return 1
    later = rows[1:]
    inc = sum(r.incremental_s for r in later) / len(later)
    rec = sum(r.recompute_s for r in later) / len(later)
    print(f"mean over batches 1..{rows[-1].batch}: incremental {inc:.2f}s, recompute {rec:.2f}s "
          f"(ratio {rec / inc:.2f}); every answer matched the oracle")
    return 0

"""``incr bench backfill``: a backfill several times larger than the memory given to Spark.

Generates ``--gb`` GB of Parquet (one large file and two smaller ones, rows of an event log
with a 200-character payload), then runs ``incr backfill`` over it as a separate process
with ``spark.driver.memory`` set to ``--driver-memory``, the way an operator would:

1. the backfill is killed (SIGKILL, its JVM with it) once ``--kill-after`` slices are
   applied, and started again: it must resume at the slice it was applying;
2. the peak resident memory of the process tree (Python and the JVM) is sampled throughout;
3. DuckDB runs every view's SQL over the same files, in a process of its own (time, peak RSS);
4. every answer table must equal DuckDB's answer, row for row.

Results (JSON and a Markdown table) go to ``--out``: rows/s, MB/s, peak RSS, slices, and
DuckDB's time over the same files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PROGRAM = """\
-- incr bench backfill: an event log, three views of it.
CREATE TABLE events (id BIGINT NOT NULL, customer BIGINT, region VARCHAR, day DATE,
                     cents BIGINT, payload VARCHAR);
CREATE VIEW by_region_day AS
  SELECT region, day, COUNT(*) AS n, SUM(cents) AS revenue FROM events GROUP BY region, day;
CREATE VIEW by_customer AS
  SELECT customer, COUNT(*) AS orders, SUM(cents) AS spent FROM events GROUP BY customer;
CREATE VIEW big_spenders AS
  SELECT customer, SUM(cents) AS spent FROM events GROUP BY customer
  ORDER BY spent DESC, customer LIMIT 20;
"""
PAYLOAD = 200
GROUP_ROWS = 500_000
CUSTOMERS = 2_000_000
REGIONS = [f"region-{i:02d}" for i in range(16)]
_ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                          dtype=np.uint8)


@dataclass
class Sampler:
    """Peak resident memory of a process tree, sampled every ``every`` seconds."""

    pid: int
    every: float = 0.25
    peak_total: int = 0
    peak_by_name: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Sampler:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    name = "jvm" if "java" in p.name() else "python"
                except psutil.NoSuchProcess:
                    continue
                total += rss
                self.peak_by_name[name] = max(self.peak_by_name.get(name, 0), rss)
            self.peak_total = max(self.peak_total, total)
            self._stop.wait(self.every)


def generate(folder: Path, gb: float, seed: int = 7) -> dict:
    """Lands about ``gb`` GB of Parquet under ``folder/events``.

    Two thirds go in one file, the rest in two; returns what was written.
    """
    rng = np.random.default_rng(seed)
    target = gb * 1e9
    shares = [("2024-big.parquet", 2 / 3), ("2025-h1.parquet", 1 / 6), ("2025-h2.parquet", 1 / 6)]
    out = {"files": [], "rows": 0, "bytes": 0}
    next_id = 0
    (folder / "events").mkdir(parents=True, exist_ok=True)
    for name, share in shares:
        path = folder / "events" / name
        rows = 0
        with pq.ParquetWriter(path, _schema()) as writer:
            while True:
                writer.write_table(_chunk(rng, next_id, GROUP_ROWS), row_group_size=GROUP_ROWS)
                next_id += GROUP_ROWS
                rows += GROUP_ROWS
                if path.stat().st_size >= share * target:  # each row group is written out
                    break
        size = path.stat().st_size
        out["files"].append({"name": name, "rows": rows, "bytes": size})
        out["rows"] += rows
        out["bytes"] += size
    return out


def _schema() -> pa.Schema:
    return pa.schema([("id", pa.int64()), ("customer", pa.int64()), ("region", pa.string()),
                      ("day", pa.date32()), ("cents", pa.int64()), ("payload", pa.string())])


def _chunk(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    chars = _ALPHABET[rng.integers(0, 64, size=n * PAYLOAD, dtype=np.uint8)]
    offsets = np.arange(0, (n + 1) * PAYLOAD, PAYLOAD, dtype=np.int32)
    payload = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))
    regions = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, len(REGIONS), size=n, dtype=np.int32)), pa.array(REGIONS))
    days = pa.array(rng.integers(19_000, 19_730, size=n, dtype=np.int32)).cast(pa.date32())
    return pa.table({
        "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "customer": pa.array(rng.zipf(1.3, size=n).astype(np.int64) % CUSTOMERS),
        "region": regions.cast(pa.string()),
        "day": days,
        "cents": pa.array(rng.integers(-5_000, 200_000, size=n, dtype=np.int64)),
        "payload": payload}, schema=_schema())


def _backfill(program: Path, landing: Path, warehouse: Path, env: dict, kill_after: int | None,
              log: Path) -> dict:
    """One ``incr backfill`` process: its time, peak memory, and whether it was killed."""
    cmd = [str(Path(sys.executable).with_name("incr")), "backfill", str(program), "--landing", str(landing),
           "--warehouse", str(warehouse), "--progress", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    sampler = Sampler(proc.pid).start()
    killed_at = None
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("progress:") and kill_after is not None:
            done = int(line.split()[1].split("/")[0])
            if done >= kill_after:
                killed_at = done
                os.killpg(proc.pid, signal.SIGKILL)
                break
    stdout = proc.stdout.read() if proc.stdout and killed_at is None else ""
    proc.wait()
    sampler.stop()
    seconds = time.perf_counter() - t0
    log.write_text("".join(lines) + stdout)
    applied = [b["seq"] for b in json.loads(stdout)["applied"]] if stdout else None
    return {"seconds": round(seconds, 1), "exit": proc.returncode, "killed_after_slices": killed_at,
            "applied_from": min(applied) if applied else None,
            "peak_rss_mib": round(sampler.peak_total / 2**20),
            "peak_rss_by_process_mib": {k: round(v / 2**20) for k, v in sampler.peak_by_name.items()},
            "last_progress": next((x.strip() for x in reversed(lines) if x.startswith("progress")),
                                  None)}


_DUCKDB = """
import duckdb, json, resource, sys, time
files, out, views = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
con = duckdb.connect()
con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{files}')")
t0 = time.perf_counter()
for name, sql in views.items():
    con.execute(f"COPY ({sql}) TO '{out}/{name}.parquet' (FORMAT parquet)")
seconds = time.perf_counter() - t0
t0 = time.perf_counter()  # every column of every row read, as a row index must
con.execute("SELECT COUNT(*), SUM(hash(id, customer, region, day, cents, payload)) FROM events")
print(json.dumps({"seconds": seconds, "whole_rows_seconds": time.perf_counter() - t0,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _duckdb(files: str, out: Path, views: dict[str, str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_DUCKDB), files, str(out),
                           json.dumps(views)], stdout=subprocess.PIPE, text=True, check=True)
    measured = json.loads(done.stdout)
    return {"seconds": round(measured["seconds"], 1),
            "whole_rows_seconds": round(measured["whole_rows_seconds"], 1),
            "peak_rss_mib": round(measured["peak_rss_mib"])}


def run_backfill_bench(out: Path, gb: float = 6.0, driver_memory: str = "1g",
                       kill_after: int | None = 5, keep_work: bool = False,
                       append_only: bool = False) -> int:
    """Generates, backfills (killed once and resumed), checks against DuckDB.

    Writes ``out/backfill.json`` and ``out/backfill.md``; returns 0 when every answer matches.
    """
    from incr.compiler import compile_text
    from incr.oracle import diff_answers
    from incr.runtime.report import read_answer
    from incr.runtime.slicing import SLICE_SHARE, memory_bytes

    work = out / "backfill-work"
    landing, warehouse = work / "landing", work / "warehouse"
    out.mkdir(parents=True, exist_ok=True)
    program = work / "events.sql"
    if not (landing / "events").is_dir():
        print(f"generating {gb} GB of Parquet under {landing} ...", flush=True)
        t0 = time.perf_counter()
        data = generate(landing, gb)
        data["seconds"] = round(time.perf_counter() - t0, 1)
        (work / "data.json").write_text(json.dumps(data, indent=2))
    data = json.loads((work / "data.json").read_text())
    text = ("-- incr: append_only = events\n" if append_only else "") + PROGRAM
    program.write_text(text)
    env = {**os.environ, "INCR_SPARK_CONF": f"spark.driver.memory={driver_memory}"}
    compiled = compile_text(text, str(program), name="events")
    runs = []
    committed = None
    if kill_after is not None:
        print(f"backfill, killed after {kill_after} slices ...", flush=True)
        runs.append(_backfill(program, landing, warehouse, env, kill_after, work / "run1.log"))
        from incr.runtime.pipeline import Pipeline

        # What the killed run committed: the views' batch (read from the Delta logs).
        committed = min(v.state_batch for v in Pipeline(compiled, landing, warehouse).status())
    print("backfill ...", flush=True)
    runs.append(_backfill(program, landing, warehouse, env, None, work / f"run{len(runs) + 1}.log"))

    print("DuckDB over the same files ...", flush=True)
    duck = _duckdb(str(landing / "events" / "*.parquet"), work / "duckdb",
                   {p.view: p.select for p in compiled.plans})
    checks = {}
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        expected = pq.read_table(work / "duckdb" / f"{plan.view}.parquet")
        diff = diff_answers(expected, answer, ordered=plan.ordered)
        checks[plan.view] = {"rows": answer.num_rows, "equal": diff is None, "diff": diff}

    from incr.runtime.ledger import Ledger
    from incr.runtime.store import DeltaStore

    batches = Ledger(DeltaStore(), warehouse / "_incr" / "events" / "ledger").batches()
    total_s = sum(r["seconds"] for r in runs)
    result = {
        "command": "incr " + " ".join(sys.argv[1:]),
        "driver_memory": driver_memory,
        "append_only": append_only,
        "slice_budget_mib": memory_bytes(driver_memory) // SLICE_SHARE // 2**20,
        "data": data, "slices": len(batches),
        "slices_per_file": {f["name"]: sum(1 for b in batches if b.path.endswith(f["name"]))
                            for f in data["files"]},
        "runs": runs,
        # The killed run had committed every table through this batch; the next one started
        # right after it (no slice applied twice, none lost: the answers equal DuckDB's).
        "committed_when_killed": committed,
        "incr_seconds": round(total_s, 1),
        "rows_per_s": round(data["rows"] / total_s),
        "mb_per_s": round(data["bytes"] / 1e6 / total_s, 1),
        "input_over_memory": round(data["bytes"] / memory_bytes(driver_memory), 1),
        "duckdb": duck, "checks": checks, "machine": _machine(),
    }
    (out / "backfill.json").write_text(json.dumps(result, indent=2))
    (out / "backfill.md").write_text(markdown(result))
    print(markdown(result))
    if not keep_work:
        import shutil

        shutil.rmtree(work / "warehouse", ignore_errors=True)
    resumed = committed is None or runs[-1]["applied_from"] == committed + 1
    return 0 if resumed and all(c["equal"] for c in checks.values()) else 1


def _machine() -> dict:
    from incr.bench.machine import _cpu_model, _meminfo_gib

    return {"nproc": os.cpu_count(), "cpu": _cpu_model(), "memory_gib": _meminfo_gib()}


def markdown(r: dict) -> str:
    """The result as a Markdown section."""
    gb = r["data"]["bytes"] / 1e9
    lines = [
        (f"Input: {r['data']['rows']:,} rows in {len(r['data']['files'])} Parquet files, "
         f"{gb:.2f} GB ({r['input_over_memory']}× the {r['driver_memory']} given to Spark); "
         f"{r['slices']} slices of at most {r['slice_budget_mib']} MiB uncompressed "
         f"({', '.join(f'{k}: {v}' for k, v in r['slices_per_file'].items())})."),
        "",
        "| run | seconds | exit | killed after slices | peak RSS MiB (tree) | python | JVM |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, run in enumerate(r["runs"], 1):
        by = run["peak_rss_by_process_mib"]
        lines.append(f"| {i} | {run['seconds']} | {run['exit']} | {run['killed_after_slices'] or ''} "
                     f"| {run['peak_rss_mib']} | {by.get('python', '')} | {by.get('jvm', '')} |")
    if r["committed_when_killed"] is not None:
        lines += ["", (f"When killed, every table had committed through batch "
                       f"{r['committed_when_killed']}; the next run applied from batch "
                       f"{r['runs'][-1]['applied_from']} on.")]
    lines += [
        "",
        (f"incr: {r['incr_seconds']} s in all, {r['rows_per_s']:,} rows/s, {r['mb_per_s']} MB/s. "
         f"DuckDB over the same files: {r['duckdb']['seconds']} s for the three views (it "
         f"reads only the columns they name), {r['duckdb']['whole_rows_seconds']} s to hash "
         f"every row whole (what a row index reads); peak RSS {r['duckdb']['peak_rss_mib']} MiB."
         + (" The source is declared append_only: no row index." if r["append_only"] else "")),
        "",
        "| view | answer rows | equals DuckDB |",
        "|---|---:|---|",
    ]
    lines += [f"| {v} | {c['rows']:,} | {'yes' if c['equal'] else 'NO: ' + str(c['diff'])} |"
              for v, c in r["checks"].items()]
    return "\n".join(lines) + "\n"

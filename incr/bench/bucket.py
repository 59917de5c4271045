"""``incr bench bucket``: what a warehouse in a bucket costs per increment (issue 15).

A warehouse at ``s3://bucket/prefix`` is worked on in a local working copy that pulls when a
command starts and when it takes its locks, and pushes before it lets them go
(:mod:`incr.runtime.bucket`). This benchmark measures what that adds to an increment. It runs
the demo program ``sql/examples/sales.sql`` over one landing folder into two warehouses, a
folder and a bucket. Each step is one whole ``Pipeline.run()`` (a new pipeline per step, as a
command or an Airflow task starts), taken by the two in turn with the first alternating, so
load from elsewhere falls on both alike.

The bucket is ``--uri`` when given (a real one: its credentials from ``AWS_*``). Otherwise it
is moto's S3 server started on 127.0.0.1 in a process of its own, which is slower per request
than S3 is, but local.

**The data** is an initial load of ``initial`` rows, then ``increments`` increments of
``increment`` rows; every third increment deletes that many live rows. After the last one
every view's answer is compared with DuckDB's over the live rows: in the folder and in a fresh
working copy of the bucket (what the bucket holds). A difference makes the run exit 1, after
the outputs are written.

Outputs in ``--out DIR``: ``bucket.csv`` (one row per warehouse and step: :data:`COLUMNS`),
``bucket.md`` (the summary and every step), ``bucket.png`` (time per step, folder and bucket),
``bucket.json`` (machine, settings, the summary and the oracle's verdicts).
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from incr.bench.results import cell, write_records
from incr.runtime.bucket import SyncMetrics
from incr.runtime.cluster import free_port
from incr.runtime.landing import DELETES_DIR

NAME = "bucket"
PROGRAM = Path(__file__).resolve().parents[2] / "sql" / "examples" / "sales.sql"
DEFAULT_INITIAL = 20_000
DEFAULT_INCREMENT = 1_000
DEFAULT_INCREMENTS = 7
#: One row per warehouse and step; the bucket's rows add what its syncs did (SyncMetrics).
COLUMNS = ["warehouse", "step", "kind", "rows", "total_s", *(f.name for f in fields(SyncMetrics))]
SCHEMA = pa.schema([("region", pa.string()), ("product", pa.string()), ("amount", pa.float64()),
                    ("qty", pa.int64())])


@contextmanager
def _bucket(uri: str | None) -> Iterator[str]:
    """The warehouse URI to measure.

    ``uri``, or one in a bucket of moto's S3 server, started on a free port of 127.0.0.1 in a
    process of its own and stopped afterwards.
    """
    if uri is not None:
        yield uri
        return
    server = Path(sys.executable).parent / "moto_server"
    if not server.exists():
        raise SystemExit("error: moto_server is not installed here (it comes with `make install`); "
                         "give --uri s3://bucket/prefix of a bucket to measure against")
    port = free_port()
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("error: moto's S3 server did not start") from None
                time.sleep(0.2)
        import boto3

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "incr-bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "incr-bench")
        os.environ.setdefault("AWS_REGION", "us-east-1")
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
        boto3.client("s3").create_bucket(Bucket="incr-bench")
        yield "s3://incr-bench/warehouse"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _land(landing: Path, step: int, rows: list[dict], delete: bool) -> None:
    folder = landing / "sales" / (DELETES_DIR if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"{step:04}.csv")


def _rows(rng: random.Random, n: int) -> list[dict]:
    return [{"region": rng.choice(("north", "south", "east", "west")),
             "product": f"p{rng.randint(1, 200)}", "amount": round(rng.uniform(1, 500), 2),
             "qty": rng.randint(0, 9)} for _ in range(n)]


def _step(compiled, landing: Path, warehouse: str, config, kind: str, step: int,
          rows: int) -> dict[str, object]:
    from incr.runtime.pipeline import Pipeline

    t0 = time.perf_counter()
    pipeline = Pipeline(compiled, landing, warehouse, config=config)
    report = pipeline.run()
    total = time.perf_counter() - t0
    if report.rejected is not None or not report.applied:
        raise SystemExit(f"error: step {step} into the {kind} applied nothing: {report.rejected}")
    out: dict[str, object] = {"warehouse": kind, "step": step, "rows": rows, "total_s": total}
    if pipeline.bucket is not None:
        out |= asdict(pipeline.bucket.metrics)
    return out


def run(out: Path, uri: str | None, initial: int, increment: int, increments: int,
        keep_work: bool = False) -> int:
    """Runs the benchmark (see the module); returns 0, or 1 when an answer differs from DuckDB's."""
    from incr.compiler import compile_program
    from incr.config import settings
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.bucket import working_copy
    from incr.runtime.report import read_answer

    work = out / f"{NAME}-work"
    shutil.rmtree(work, ignore_errors=True)
    landing = work / "landing"
    config = replace(settings(), working_copies=str(work / "copies"))
    compiled = compile_program(PROGRAM)
    local = uri is None
    with _bucket(uri) as target:
        targets = {"folder": str(work / "warehouse"), "bucket": target}
        rng = random.Random(20261130)
        live: list[dict] = []
        records: list[dict[str, object]] = []
        for step in range(increments + 1):
            delete = step > 0 and step % 3 == 0
            if delete:
                rows = rng.sample(live, k=min(increment, len(live)))
                gone = {id(r) for r in rows}
                live = [r for r in live if id(r) not in gone]
            else:
                rows = _rows(rng, initial if step == 0 else increment)
                live += rows
            _land(landing, step, rows, delete)
            order = ("folder", "bucket") if step % 2 == 0 else ("bucket", "folder")
            for kind in order:
                record = _step(compiled, landing, targets[kind], config, kind, step, len(rows))
                records.append(record | {"kind": "delete" if delete else "insert"})
                print(f"step {step} ({'delete' if delete else 'insert'} {len(rows):,} rows) "
                      f"{kind}: {record['total_s']:.2f} s", flush=True)
        data = {"sales": pa.Table.from_pylist(live, schema=SCHEMA)}
        verdicts = {}
        fresh = replace(config, working_copies=str(work / "fresh"))
        for kind, where in (("folder", Path(targets["folder"])),
                            ("bucket", working_copy(target, fresh))):
            for plan in compiled.plans:
                answer, _ = read_answer(where, plan)
                diff = diff_answers(oracle_answer(plan.select, data), answer)
                verdicts[f"{kind}:{plan.view}"] = "ok" if diff is None else diff
    summary = _summary(records)
    write_records(out / f"{NAME}.csv", COLUMNS, records)
    shown = "moto's S3 server on 127.0.0.1" if local else target
    (out / f"{NAME}.md").write_text(_markdown(summary, records, shown, initial, increment))
    (out / f"{NAME}.json").write_text(json.dumps({
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "os": platform.platform(), "loadavg": list(os.getloadavg())},
        "settings": {"program": str(PROGRAM.name), "initial": initial, "increment": increment,
                     "increments": increments, "bucket": shown},
        "command": sys.argv, "summary": summary, "oracle": verdicts}, indent=2))
    _plot(records, out / f"{NAME}.png")
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    bad = {k: v for k, v in verdicts.items() if v != "ok"}
    for key, diff in bad.items():
        print(f"MISMATCH {key}: {diff}", file=sys.stderr)
    print(f"folder median {summary['folder_median_s']:.2f} s, bucket median "
          f"{summary['bucket_median_s']:.2f} s per increment ({summary['ratio']:.2f}×); "
          f"outputs in {out}")
    return 1 if bad else 0


def _summary(records: list[dict[str, object]]) -> dict[str, float]:
    """Medians over the increments (step 0, the initial load, left out)."""
    def median(kind: str, column: str) -> float:
        return statistics.median(float(r.get(column) or 0.0) for r in records  # type: ignore[arg-type]
                                 if r["warehouse"] == kind and r["step"] != 0)

    folder, bucket = median("folder", "total_s"), median("bucket", "total_s")
    return {"folder_median_s": folder, "bucket_median_s": bucket, "ratio": bucket / folder,
            "push_median_s": median("bucket", "push_s"), "pull_median_s": median("bucket", "pull_s"),
            "lease_median_s": median("bucket", "lease_s"),
            "uploaded_median": median("bucket", "uploaded")}


def _markdown(summary: dict[str, float], records: list[dict[str, object]], uri: str,
              initial: int, increment: int) -> str:
    title = (f"# incr bench bucket: `sales.sql`, {initial:,} rows then increments of "
             f"{increment:,} ({uri})")
    head = ("| per increment (median) | folder | bucket | bucket ÷ folder | push | two pulls "
            "| leases | objects up |")
    figures = (f"| seconds | {summary['folder_median_s']:.2f} | {summary['bucket_median_s']:.2f} | "
               f"{summary['ratio']:.2f}× | {summary['push_median_s']:.2f} | "
               f"{summary['pull_median_s']:.2f} | {summary['lease_median_s']:.2f} | "
               f"{summary['uploaded_median']:.0f} |")
    lines = [title, "", head, "|---|---:|---:|---:|---:|---:|---:|---:|", figures, "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in records]
    return "\n".join(lines) + "\n"


def _plot(records: list[dict[str, object]], path: Path) -> None:
    from incr.bench.plot import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, style in (("folder", {"color": "tab:blue", "marker": "o"}),
                        ("bucket", {"color": "tab:orange", "marker": "s"})):
        steps = [r for r in records if r["warehouse"] == kind and r["step"] != 0]
        ax.plot([r["step"] for r in steps], [r["total_s"] for r in steps], label=kind, **style)
    ax.set_xlabel("increment")
    ax.set_ylabel("seconds (whole run)")
    ax.set_title("sales.sql: an increment into a folder and into a bucket")
    ax.set_ylim(bottom=0)
    ax.legend()
    _save(fig, path)

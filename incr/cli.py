"""The ``incr`` command.

Exit codes: 0 success; 2 the program is not valid or not incrementalizable (nothing ran);
3 a batch was rejected (earlier batches are applied, nothing of the rejected one is);
4 storage problem (lock held, missing table); 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from incr.config import settings
from incr.errors import IncrError, StorageError

if TYPE_CHECKING:
    from incr.runtime.progress import Emit
    from incr.serving.snapshots import ProgramLayout


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``incr`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    _logging(args.verbose)
    try:
        return args.func(args)
    except IncrError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if e.errno is None:
            raise
        # A full disk or a read-only warehouse met outside the storage adapter's own checks:
        # what was committed stays (every commit is whole), and the next run goes on from it.
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}; the run stopped, and the next run resumes from "
              f"what it committed", file=sys.stderr)
        return StorageError.exit_code
    except KeyboardInterrupt:
        return 130


def _logging(verbose: int) -> None:
    """Sends the ``incr`` loggers to stderr: INCR_LOG_LEVEL (WARNING), or INFO/DEBUG with -v/-vv."""
    import logging

    level = {0: settings().log_level.upper(), 1: "INFO"}.get(verbose, "DEBUG")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("incr")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="incr", description="Maintain SQL views incrementally "
                                "on Spark and Delta Lake.")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log what runs: -v per batch and view (engine, rows, state rows touched, "
                        "seconds) and every engine decision; -vv also debug detail")
    sub = p.add_subparsers(dest="command", required=True)

    def program_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("program", help="program file (.sql): CREATE TABLE sources, CREATE VIEW queries")

    def paths(sp: argparse.ArgumentParser, landing: bool = True) -> None:
        if landing:
            sp.add_argument("--landing", default=settings().landing,
                            help="landing folder: LANDING/<table>/ and LANDING/<table>/_deletes/, "
                                 "or an object store URI such as s3://bucket/landing "
                                 "(default $INCR_LANDING)")
        sp.add_argument("--warehouse", default=settings().warehouse,
                        help="warehouse folder for state, answers and the ledger "
                             "(default $INCR_WAREHOUSE)")

    sp = sub.add_parser("explain", help="print h, ⊗, ⊗̃, ⊗̂, a and the state schema of each view")
    program_arg(sp)
    sp.add_argument("--view", help="only this view")
    paths(sp, landing=False)  # where a run stored state: its column types are shown
    sp.set_defaults(func=cmd_explain)

    sp = sub.add_parser("run", help="apply every landed batch not applied yet")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--json", action="store_true", help="print the run report as JSON")
    progress_arg(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("answer", help="print a view's answer table")
    program_arg(sp)
    paths(sp, landing=False)
    sp.add_argument("--view", required=True)
    sp.add_argument("--batch", type=int, help="the answer as of this batch (time travel)")
    sp.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sp.add_argument("--limit", type=int, default=None, help="print at most this many rows")
    sp.set_defaults(func=cmd_answer)

    sp = sub.add_parser("status", help="show registered batches, how far each view is, its "
                                       "state and answer sizes, and the rejected batch if any "
                                       "(from Delta logs: starts no Spark)")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--json", action="store_true", help="print the status as JSON")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("maintain", help="housekeeping: checkpoint and vacuum the program's Delta "
                                         "tables, keeping answers' time travel to a window")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--keep-batches", type=int, default=None,
                    help="keep the answer versions of this many last batches (INCR_KEEP_BATCHES)")
    sp.add_argument("--keep-hours", type=float, default=None,
                    help="... and of this many last hours (INCR_KEEP_HOURS)")
    sp.add_argument("--json", action="store_true", help="print what was done as JSON")
    sp.set_defaults(func=cmd_maintain)

    sp = sub.add_parser("archive", help="move the files of batches every view has applied out of "
                                        "the landing folder (rebuilds read them there)")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--to", type=Path, default=None,
                    help="the archive folder (default: WAREHOUSE/_incr/<program>/archive)")
    sp.set_defaults(func=cmd_archive)

    sp = sub.add_parser("refresh", help="rebuild a view's state from every batch (a full refresh) "
                                        "beside the current one, which is served until the "
                                        "new answer takes over in one commit")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--view", required=True)
    sp.add_argument("--no-run", action="store_true",
                    help="only start the refresh; the next run (or Airflow task) does it")
    sp.add_argument("--json", action="store_true", help="print the run report as JSON")
    progress_arg(sp)
    sp.set_defaults(func=cmd_refresh)

    sp = sub.add_parser("backfill", help="build or rebuild views from the ledger's files (or a "
                                         "history folder): large Parquet files in slices sized to "
                                         "Spark's memory, resumable, with progress")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--view", action="append", default=None,
                    help="only this view (repeatable; default: every view); the others catch "
                         "up in a later run")
    sp.add_argument("--folder", default=None, metavar="H",
                    help="register the files of this folder (or object store URI) first, laid "
                         "out like the landing folder (<table>/..., <table>/_deletes/...), and "
                         "read them there")
    sp.add_argument("--from", dest="start", type=int, default=None, metavar="N",
                    help="the first batch to apply: an error if a view has not applied the "
                         "batches before it")
    sp.add_argument("--to", dest="through", type=int, default=None, metavar="M",
                    help="the last batch to apply (a later backfill or run goes on)")
    sp.add_argument("--rebuild", action="store_true",
                    help="rebuild the views' state from batch 0 beside the current one, which is "
                         "served until the new answer takes over (as `incr refresh`)")
    sp.add_argument("--json", action="store_true", help="print the run report as JSON")
    progress_arg(sp)
    sp.set_defaults(func=cmd_backfill)

    sp = sub.add_parser("skip", help="drop a registered batch that no table applied (e.g. a "
                                     "rejected file that will be re-sent under a new name)")
    program_arg(sp)
    paths(sp)
    sp.add_argument("--batch", type=int, required=True)
    sp.set_defaults(func=cmd_skip)

    sp = sub.add_parser("serve", help="serve the answers over JDBC/ODBC (Spark's Thrift server, "
                                      "HiveServer2 protocol): a database per program with its "
                                      "latest consistent snapshot, and <program>_b<N> per "
                                      "recent batch N to pin; runs until interrupted")
    sp.add_argument("programs", nargs="+", metavar="PROGRAM", help="program files (.sql) to serve")
    paths(sp, landing=False)
    sp.add_argument("--host", default=settings().serve_host,
                    help="address to listen on (default $INCR_SERVE_HOST or 127.0.0.1: this "
                         "machine only)")
    sp.add_argument("--port", type=int, default=settings().serve_port,
                    help="HiveServer2 port (default $INCR_SERVE_PORT or 10000)")
    sp.add_argument("--keep", type=int, default=settings().serve_keep,
                    help="recent snapshots kept pinnable as <program>_b<N> (default "
                         "$INCR_SERVE_KEEP or 5)")
    sp.add_argument("--poll", type=float, default=settings().serve_poll_s,
                    help="seconds between looks at the warehouse (default $INCR_SERVE_POLL_S or 2)")
    sp.add_argument("--work", default=None,
                    help="the server's own folder, on the warehouse's filesystem so answer files "
                         "are hard-linked, not copied (default WAREHOUSE/_serving/PORT)")
    sp.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the server, e.g. "
                         "spark.hadoop.hive.server2.authentication=LDAP (repeatable)")
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("catalog", help="write a DuckDB database file with the answers as views "
                                        "over their exact Parquet files: a schema per program "
                                        "(latest snapshot) and <program>_b<N> per recent batch")
    sp.add_argument("programs", nargs="+", metavar="PROGRAM", help="program files (.sql)")
    paths(sp, landing=False)
    sp.add_argument("--out", required=True, help="the DuckDB file to write (replaced)")
    sp.add_argument("--keep", type=int, default=settings().serve_keep,
                    help="recent snapshots written as <program>_b<N> schemas (default "
                         "$INCR_SERVE_KEEP or 5)")
    sp.set_defaults(func=cmd_catalog)

    sp = sub.add_parser("bench", help="time incremental batches against full recompute, the "
                                      "Structured Streaming peer and the floor (seed paper §11)")
    sp.add_argument("name", help="groupby, joingroupby, groupby-deletes, joingroupby-deletes, "
                                 "kmeans, pagerank, pagerank-deletes, reachability, shortest-path, "
                                 "sharing, regroup, bucket or backfill")
    sp.add_argument("--out", default="bench-out",
                    help="folder for NAME.csv, NAME.png, NAME-profile.csv, NAME.json (and the "
                         "work data while running)")
    sp.add_argument("--initial-rows", type=int, default=None,
                    help="rows of the initial load per stream (default: the paper's, 1M for "
                         "groupby and kmeans (points), 100K for joingroupby, 50K edges for "
                         "pagerank)")
    sp.add_argument("--sizes", type=_sizes, default=None,
                    help="increment sizes, one run each, e.g. 10000,20000,30000,40000 "
                         "(the default; kmeans: 10000, pagerank: 100 edges per batch, the "
                         "paper's are 100,200,300,400)")
    sp.add_argument("--increment", type=int, default=None,
                    help="a single increment size (same as --sizes N)")
    sp.add_argument("--increments", type=int, default=None,
                    help="increments per run (default 9; sharing: 5; regroup: 6)")
    sp.add_argument("--deletes", action="store_true",
                    help="every third increment is a delete batch of rows landed earlier")
    sp.add_argument("--append-only", action="store_true",
                    help="declare the streams insert-only (header option append_only: no row "
                         "index); outputs are named NAME-append-only")
    sp.add_argument("--check", action="store_true",
                    help="compare every answer with DuckDB and with the recompute")
    sp.add_argument("--no-peer", action="store_true", help="skip the Structured Streaming peer")
    sp.add_argument("--no-profile", action="store_true", help="skip the profiled extra increment")
    sp.add_argument("--keep-work", action="store_true",
                    help="keep the landing, warehouse and peer folders under OUT/NAME-work")
    sp.add_argument("--groups", type=int, default=None,
                    help="groupby, joingroupby: draw the group key (and join key) from "
                         "[0, GROUPS) instead of [0, 10000], so state and answer grow with "
                         "the data (e.g. 250000 at 1M rows); regroup: customers (default "
                         "50000)")
    sp.add_argument("--nodes", type=int, default=None,
                    help="pagerank: node ids of the initial graph (default 5000); "
                         "reachability, shortest-path: nodes of the transit-stub topology, "
                         "in domains of 100 (default 100)")
    sp.add_argument("--no-rank-support", action="store_true",
                    help="reachability, shortest-path: a delete over-deletes every tuple it "
                         "examines (no check for a proof left from a lower rank), for the "
                         "figures without the check")
    sp.add_argument("--no-aggregate-selection", action="store_true",
                    help="shortest-path: R keeps every tuple derived, not only those no other "
                         "tuple beats on MIN(cost) and MIN(hops), for the figures without "
                         "aggregate selection")
    sp.add_argument("--separate-domains", action="store_true",
                    help="reachability, shortest-path: the transit-stub domains are not linked "
                         "to each other (separate networks of 100 nodes: the closure of a "
                         "connected 10K-node network is 10^8 pairs)")
    sp.add_argument("--new-nodes", type=int, default=None,
                    help="pagerank: new nodes per increment (default 100)")
    sp.add_argument("--iterations", type=int, default=None,
                    help="kmeans, pagerank: replace the program's ITERATIONS (quick runs; the "
                         "paper's and the default are the program's 10)")
    sp.add_argument("--tolerance", type=float, default=None,
                    help="kmeans, pagerank: replace the program's TOLERANCE (the relative change "
                         "below which a row of the iterate is not propagated)")
    sp.add_argument("--no-recompute", action="store_true",
                    help="kmeans, pagerank: skip the from-scratch run per batch (and its "
                         "accuracy columns)")
    sp.add_argument("--views", type=_view_counts, default=None,
                    help="sharing: numbers of views, one run each with the share pass on, off "
                         "and rollup, the first N of its 20 (default 1,2,5,10,20); each of the "
                         "largest N's views also runs alone, for the floor")
    sp.add_argument("--uri", default=None,
                    help="bucket: the warehouse URI to measure (s3://bucket/prefix; default: "
                         "a bucket of moto's S3 server started on 127.0.0.1)")
    sp.add_argument("--gb", type=float, default=6.0,
                    help="backfill: GB of Parquet to generate and backfill (default 6)")
    sp.add_argument("--driver-memory", default="1g",
                    help="backfill: spark.driver.memory of the backfill (default 1g)")
    sp.add_argument("--kill-after", type=int, default=5,
                    help="backfill: SIGKILL the backfill once this many slices are applied, "
                         "then start it again (0: no kill)")
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("demo", help="generate the sample stream and run it through the Airflow DAG")
    sp.add_argument("--out", default="demo-out", help="folder for landing, warehouse and Airflow home")
    sp.add_argument("--rows", type=int, default=20_000, help="rows in the initial load")
    sp.set_defaults(func=cmd_demo)
    return p


def progress_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--progress", action="store_true",
                    help="a progress line per batch on stderr (batches, rows, rate, ETA) even "
                         "when it is not a terminal (on a terminal: one line, always)")


def _progress(lines: bool) -> Emit | None:
    """Where a run's progress goes: one line rewritten in place on a terminal, a line per
    batch with ``--progress`` elsewhere, nowhere otherwise."""
    from incr.runtime.progress import as_lines, on_terminal

    if sys.stderr.isatty():
        return on_terminal(sys.stderr)
    if lines:
        return as_lines(lambda line: print(line, file=sys.stderr, flush=True))
    return None


def _need(value: str | None, flag: str) -> str:
    """The flag's value, as given: a folder, or for ``--landing`` perhaps a bucket's URI
    (which ``Path`` would mangle)."""
    if not value:
        raise IncrError(f"{flag} is required (or set ${'INCR_' + flag.strip('-').upper()})")
    return value


def cmd_explain(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.compiler.explain import explain_plan, explain_program

    compiled = compile_program(args.program)
    stored = {}
    if args.warehouse:  # the types a run stored, where it has run (reading the Delta logs only)
        from incr.runtime.answer import settle
        from incr.runtime.bucket import working_copy
        from incr.runtime.report import stored_types
        from incr.runtime.store import DeltaStore

        warehouse = working_copy(args.warehouse)
        compiled = settle(compiled, warehouse, DeltaStore())  # sharing as it runs
        stored = {p.view: stored_types(warehouse, p) for p in compiled.plans}
    if args.view:
        print(explain_plan(compiled.plan(args.view), stored.get(args.view)))
    else:
        print(explain_program(compiled, stored), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    compiled = compile_program(args.program)
    pipeline = Pipeline(compiled, _need(args.landing, "--landing"), _need(args.warehouse, "--warehouse"))
    return _reported(args, pipeline.run(emit=_progress(args.progress)))


def cmd_backfill(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    compiled = compile_program(args.program)
    pipeline = Pipeline(compiled, _need(args.landing, "--landing"), _need(args.warehouse, "--warehouse"))
    report = pipeline.backfill(args.view, args.folder, args.start, args.through, args.rebuild,
                               emit=_progress(args.progress))
    return _reported(args, report)


def _reported(args: argparse.Namespace, report) -> int:
    """Prints a run's report (``--json``: as JSON) and returns the exit code."""
    from incr.runtime.report import describe_run

    if args.json:
        from dataclasses import asdict

        print(json.dumps({**asdict(report), "rejected": str(report.rejected) if report.rejected
                          else None}, default=str, indent=2))
    else:
        print(describe_run(report))
    if report.rejected is not None:
        print(f"error: {report.rejected}", file=sys.stderr)
        return report.rejected.exit_code
    return 0


def cmd_answer(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.answer import settle
    from incr.runtime.bucket import working_copy
    from incr.runtime.report import answered_by, format_table, read_answer
    from incr.runtime.store import DeltaStore

    warehouse = working_copy(_need(args.warehouse, "--warehouse"))
    compiled = settle(compile_program(args.program), warehouse, DeltaStore())
    try:
        plan = compiled.plan(args.view)
    except KeyError:
        raise IncrError(f"program {compiled.name} has no view {args.view}; its views: "
                        f"{', '.join(p.view for p in compiled.plans)}") from None
    table, batch = read_answer(warehouse, plan, args.batch)
    if args.batch is None and not answered_by(warehouse, plan):
        print(f"note: view {plan.view} changed and is rebuilding; this is the answer its previous "
              f"definition published, served until the new one has caught up (`incr status`)",
              file=sys.stderr)
    rows = table.to_pylist()[: args.limit] if args.limit else table.to_pylist()
    if args.format == "json":
        for row in rows:
            print(json.dumps(row, default=str))
    elif args.format == "csv":
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(table.column_names)
        for row in rows:
            w.writerow(["" if v is None else v for v in row.values()])
    else:
        print(f"{plan.view} (as of batch {batch}, {table.num_rows} rows)")
        print(format_table(table.column_names, rows))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    compiled = compile_program(args.program)
    pipeline = Pipeline(compiled, _need(args.landing, "--landing"), _need(args.warehouse, "--warehouse"))
    batches = pipeline.ledger.batches()
    views = pipeline.status()
    rejected = pipeline.last_rejection()
    landed = [f.relpath for f in pipeline.unregistered()]
    if args.json:
        print(json.dumps({"program": compiled.name, "batches": len(batches),
                          "last_batch": str(batches[-1]) if batches else None,
                          "views": [asdict(v) for v in views],
                          "rejected": asdict(rejected) if rejected else None,
                          "landed_unregistered": landed}, indent=2))
        return 0
    print(f"program {compiled.name}: {len(batches)} registered batches"
          + (f", last {batches[-1]}" if batches else ""))
    if landed:
        shown = ", ".join(landed[:5]) + (f" (+{len(landed) - 5} more)" if len(landed) > 5 else "")
        print(f"  landed, not registered yet: {len(landed)} file(s): {shown}")
    for v in views:
        state = (f"{v.state_rows:,} rows" if v.state_rows is not None else "rows unknown") + \
            f", {v.state_bytes / 2**20:.1f} MiB"
        answer = (f"version {v.answer_version}, {v.answer_rows} rows"
                  if v.answer_version is not None else "none yet")
        shown = (f"answer at batch {v.answer_batch} ({answer})" if v.serving_old is None else
                 f"rebuilding: serving the previous answer, of batch {v.serving_old} ({answer}), "
                 f"until the new one has caught up")
        print(f"  view {v.view}: state at batch {v.state_batch} ({state}), {shown}, "
              f"{v.pending} batch(es) pending")
    if rejected is not None:
        where = f"batch {rejected.seq} (table {rejected.table}, file {rejected.path})" \
            if rejected.seq is not None else "a landed file"
        print(f"  rejected: {where}: {rejected.message}")
        print("  fix or replace the file and run again, or `incr skip` it")
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from incr.compiler import compile_program
    from incr.config import settings
    from incr.runtime.housekeeping import maintain
    from incr.runtime.pipeline import Pipeline

    config = settings()
    if args.keep_batches is not None:
        config = replace(config, keep_batches=args.keep_batches)
    if args.keep_hours is not None:
        config = replace(config, keep_hours=args.keep_hours)
    compiled = compile_program(args.program)
    warehouse = _need(args.warehouse, "--warehouse")
    done = maintain(Pipeline(compiled, args.landing or warehouse, warehouse), config)
    if args.json:
        print(json.dumps([asdict(u) for u in done], indent=2))
        return 0
    freed = sum(u.bytes_freed for u in done)
    print(f"program {compiled.name}: {len(done)} tables, "
          f"{sum(u.files_before for u in done):,} → {sum(u.files_after for u in done):,} data files, "
          f"{freed / 2**20:.1f} MiB freed (answers keep {config.keep_batches} batches and "
          f"{config.keep_hours:g} hours of time travel)")
    for u in done:
        if u.files_before != u.files_after:
            print(f"  {u.path}: {u.files_before:,} → {u.files_after:,} files")
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    compiled = compile_program(args.program)
    pipeline = Pipeline(compiled, _need(args.landing, "--landing"), _need(args.warehouse, "--warehouse"))
    to = args.to or pipeline.meta / "archive"
    moved = pipeline.archive(to)
    print(f"program {compiled.name}: {len(moved)} applied batch file(s) moved to {to}")
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    compiled = compile_program(args.program)
    pipeline = Pipeline(compiled, _need(args.landing, "--landing"), _need(args.warehouse, "--warehouse"))
    root = pipeline.refresh(args.view)
    print(f"view {args.view}: rebuilding its state in {root}; its current answer is served "
          f"until the new one has caught up")
    if args.no_run:
        return 0
    return cmd_run(args)


def cmd_skip(args: argparse.Namespace) -> int:
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    compiled = compile_program(args.program)
    pipeline = Pipeline(compiled, _need(args.landing, "--landing"), _need(args.warehouse, "--warehouse"))
    batch = pipeline.skip(args.batch)
    print(f"skipped {batch}; it will not be applied")
    return 0


def _layouts(programs: list[str]) -> list[ProgramLayout]:
    from incr.compiler import compile_program
    from incr.serving.snapshots import ProgramLayout

    return [ProgramLayout.of(compile_program(p)) for p in programs]


def cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from incr.runtime.bucket import BucketWarehouse
    from incr.runtime.remote import is_remote
    from incr.serving.thrift import BiServer, ServeOptions, default_work

    given = _need(args.warehouse, "--warehouse")
    bucket = BucketWarehouse(given) if is_remote(given) else None  # served from its working copy
    warehouse = bucket.local if bucket is not None else Path(given)
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise IncrError(f"--conf takes KEY=VALUE, not {item!r}")
        conf[key.strip()] = value.strip()
    if args.keep < 1:
        raise IncrError("--keep must be at least 1 (the latest snapshot is one of them)")
    if args.poll <= 0:
        raise IncrError("--poll must be positive")
    options = ServeOptions(host=args.host, port=args.port, keep=args.keep, poll_s=args.poll,
                           work=Path(args.work) if args.work else default_work(warehouse, args.port),
                           conf=conf)
    served = logging.getLogger("incr.serving")
    if served.getEffectiveLevel() > logging.INFO:  # what each database shows is the point
        served.setLevel(logging.INFO)
    server = BiServer(warehouse, _layouts(args.programs), options, bucket)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        served.info("%s received; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        server.start()
        server.run(stop)
    finally:
        server.close()
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from incr.runtime.bucket import working_copy
    from incr.serving.duckdb_file import write_catalog

    written = write_catalog(Path(args.out), working_copy(_need(args.warehouse, "--warehouse")),
                            _layouts(args.programs), args.keep)
    for schema, snapshot in written:
        print(f"{schema}: {snapshot.describe()}")
    return 0


def _counts(text: str, what: str) -> tuple[int, ...]:
    """A comma-separated list of positive ``what``."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of {what}: {text}") from None
    if not counts or any(n <= 0 for n in counts):
        raise argparse.ArgumentTypeError(f"{what} must be positive: {text}")
    return counts


def _sizes(text: str) -> tuple[int, ...]:
    return _counts(text, "row counts")


def _view_counts(text: str) -> tuple[int, ...]:
    return _counts(text, "numbers of views")


def cmd_bench(args: argparse.Namespace) -> int:
    from incr.bench import DEFAULT_SIZES, run_bench
    from incr.bench.iterative import is_iterative, run_iterative
    from incr.bench.recursive import is_recursive_bench
    from incr.bench.recursive import main_args as recursive_bench

    if args.name == "backfill":
        from incr.bench.backfill import run_backfill_bench

        return run_backfill_bench(Path(args.out), args.gb, args.driver_memory,
                                  args.kill_after or None, keep_work=args.keep_work,
                                  append_only=args.append_only)
    if args.name == "bucket":
        from incr.bench import bucket

        return bucket.run(Path(args.out), args.uri, args.initial_rows or bucket.DEFAULT_INITIAL,
                          args.increment or bucket.DEFAULT_INCREMENT,
                          args.increments or bucket.DEFAULT_INCREMENTS, keep_work=args.keep_work)
    if args.name == "sharing":
        from incr.bench.sharing import main_args as sharing_bench

        return sharing_bench(Path(args.out), args.views, args.initial_rows,
                             args.increment or (args.sizes[0] if args.sizes else None),
                             args.increments, keep_work=args.keep_work)
    if args.name == "regroup":
        from incr.bench.regroup import main_args as regroup_bench

        return regroup_bench(Path(args.out), args.groups, args.initial_rows,
                             args.increment or (args.sizes[0] if args.sizes else None),
                             args.increments, keep_work=args.keep_work)
    if args.views is not None:
        print("error: --views is for sharing", file=sys.stderr)
        return 2
    if args.increments is None:
        args.increments = 9
    if is_recursive_bench(args.name):
        return recursive_bench(args.name, Path(args.out), args.nodes,
                               args.increment or (args.sizes[0] if args.sizes else None),
                               args.increments, no_rank_support=args.no_rank_support,
                               no_selection=args.no_aggregate_selection,
                               separate=args.separate_domains)
    if is_iterative(args.name):
        return run_iterative(args.name, Path(args.out), args.initial_rows,
                             args.sizes or ((args.increment,) if args.increment else None),
                             increments=args.increments, deletes=args.deletes,
                             nodes=args.nodes, new_nodes=args.new_nodes,
                             recompute=not args.no_recompute, check=args.check,
                             iterations=args.iterations, tolerance=args.tolerance,
                             keep_work=args.keep_work, command="incr " + " ".join(sys.argv[1:]))
    if args.nodes is not None or args.new_nodes is not None or args.no_recompute or \
            args.iterations is not None or args.tolerance is not None:
        print("error: --nodes, --new-nodes, --iterations, --tolerance and --no-recompute are for "
              "kmeans and "
              "pagerank", file=sys.stderr)
        return 2
    sizes = args.sizes or ((args.increment,) if args.increment else DEFAULT_SIZES)
    return run_bench(args.name, Path(args.out), args.initial_rows, sizes,
                     increments=args.increments, deletes=args.deletes, check=args.check,
                     peer=not args.no_peer, profile=not args.no_profile,
                     keep_work=args.keep_work, append_only=args.append_only,
                     groups=args.groups, command="incr " + " ".join(sys.argv[1:]))


def cmd_demo(args: argparse.Namespace) -> int:
    from incr.orchestration.demo import run_demo

    return run_demo(Path(args.out), args.rows)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

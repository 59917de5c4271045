"""Task bodies of the generated DAGs: each is one call into the runtime."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path


def _pipeline(program: Path, landing: str, warehouse: str):
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    return Pipeline(compile_program(program), landing, warehouse)


def prepare_batches(program: Path, landing: str, warehouse: str,
                    refresh: tuple[str, ...] | list[str] = ()) -> dict:
    """Starts the full refreshes asked for (``refresh``: views), then registers and
    validates pending batches; returns how far views may go.

    Raises:
        AirflowSkipException: a backfill of the program is running; it holds the program's
            locks, and files landed meanwhile are applied by the next run.
    """
    pipeline = _pipeline(program, landing, warehouse)
    running = pipeline.backfill_running()
    if running is not None:
        from airflow.exceptions import AirflowSkipException

        raise AirflowSkipException(
            f"a backfill of program {pipeline.compiled.name} is running (pid {running['pid']}, "
            f"views {', '.join(running['views'])}); this run gives way, and the next one "
            f"applies what landed meanwhile")
    for view in refresh:
        print(f"view {view}: rebuilding its state in {pipeline.refresh(view)}", flush=True)
    report = pipeline.prepare()
    return {
        "ready_through": report.ready_through,
        "views": [p.view for p in pipeline.compiled.plans],
        "registered": report.registered,
        "validated": [b.seq for b in report.applied],
        "rejected": str(report.rejected) if report.rejected else "",
    }


def apply_view(program: Path, landing: str, warehouse: str, view: str, through: int | None) -> dict:
    """Applies the validated batches to one view and publishes its answer (a progress line
    per batch in the task's log)."""
    from incr.runtime.progress import as_lines

    pipeline = _pipeline(program, landing, warehouse)
    metrics = pipeline.apply_view(view, through, emit=as_lines(lambda line: print(line, flush=True)))
    answer = pipeline.views[view].answer_path
    version = pipeline.store.table(answer).version() if pipeline.store.exists(answer) else None
    return {"view": view, "through": through, "batches": [asdict(m) for m in metrics],
            "answer_version": version}


def backfill(program: Path, params: dict) -> dict:
    """The backfill DAG's task: ``incr backfill`` with the run's params, a progress line
    per batch in the task's log.

    Raises:
        AirflowFailException: a batch was rejected (retrying would not help until the file
            is fixed or skipped).
    """
    from incr.runtime.progress import as_lines

    pipeline = _pipeline(program, params["landing"], params["warehouse"])
    folder = params.get("folder") or None
    report = pipeline.backfill(params.get("views") or None, folder,
                               params.get("from_batch"), params.get("to_batch"),
                               bool(params.get("rebuild")),
                               emit=as_lines(lambda line: print(line, flush=True)))
    if report.rejected is not None:
        from airflow.exceptions import AirflowFailException

        raise AirflowFailException(f"batch rejected, later batches wait: {report.rejected}")
    return {"registered": report.registered, "applied": [b.seq for b in report.applied],
            "rows": sum(b.rows for b in report.applied), "ready_through": report.ready_through}


def finish_run(rejected: str | None, results: list[dict | None]) -> dict:
    """Fails the DAG run when a batch was rejected; otherwise summarises it.

    ``results`` holds None for a view whose task was skipped (it had no new batch).
    """
    summary = {"views": {r["view"]: len(r["batches"]) for r in results if r}, "rejected": rejected}
    if rejected:
        from airflow.exceptions import AirflowFailException

        raise AirflowFailException(f"batch rejected, later batches wait: {rejected}")
    return summary


def housekeep(program: Path, landing: str, warehouse: str) -> dict | None:
    """Checkpoints and vacuums the program's tables when due (``INCR_MAINTAIN_EVERY_H``).

    Returns None when not due; otherwise a summary of what was done.
    """
    from incr.config import settings
    from incr.runtime.housekeeping import due, maintain

    config = settings()
    pipeline = _pipeline(program, landing, warehouse)
    if not due(pipeline.meta, config.maintain_every_h):
        return None
    done = maintain(pipeline, config)
    return {"tables": len(done), "files_before": sum(u.files_before for u in done),
            "files_after": sum(u.files_after for u in done),
            "bytes_freed": sum(u.bytes_freed for u in done)}


def describe_answer(uri: str, events: list[dict]) -> dict:
    """What a downstream task sees of a fresh answer: its batch, Delta version and row count."""
    from urllib.parse import unquote, urlparse

    from incr.runtime.store import DeltaStore

    store = DeltaStore()
    path = unquote(urlparse(uri).path)
    table = store.table(path)
    return {"answer": path, "batch": store.batch_version(path), "version": table.version(),
            "rows": store.totals(path)[0], "events": events}

"""Task bodies of the generated DAGs: each is one call into the runtime."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path


def _pipeline(program: Path, landing: str, warehouse: str):
    from incr.compiler import compile_program
    from incr.runtime.pipeline import Pipeline

    return Pipeline(compile_program(program), landing, warehouse)


def prepare_batches(program: Path, landing: str, warehouse: str) -> dict:
    """Registers and validates pending batches; returns how far views may go."""
    pipeline = _pipeline(program, landing, warehouse)
    report = pipeline.prepare()
    return {
        "ready_through": report.ready_through,
        "views": [p.view for p in pipeline.compiled.plans],
        "registered": report.registered,
        "validated": [b.seq for b in report.applied],
        "rejected": str(report.rejected) if report.rejected else "",
    }


def apply_view(program: Path, landing: str, warehouse: str, view: str, through: int | None) -> dict:
    """Applies the validated batches to one view and publishes its answer."""
    pipeline = _pipeline(program, landing, warehouse)
    metrics = pipeline.apply_view(view, through)
    return {"view": view, "through": through, "batches": [asdict(m) for m in metrics]}


def finish_run(rejected: str | None, results: list[dict]) -> dict:
    """Fails the DAG run when a batch was rejected; otherwise summarises it."""
    summary = {"views": {r["view"]: len(r["batches"]) for r in results}, "rejected": rejected}
    if rejected:
        from airflow.exceptions import AirflowFailException

        raise AirflowFailException(f"batch rejected, later batches wait: {rejected}")
    return summary

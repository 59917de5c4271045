"""Human-readable output: run reports and answer tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake.exceptions import DeltaError

from incr.compiler.plan import IncrementalPlan
from incr.errors import OutOfRangeError, StorageError
from incr.runtime.answer import ANSWER_FP
from incr.runtime.store import APP_ID, DeltaStore, commit_batches, trusted_commits


def describe_run(report) -> str:
    """One line per applied batch, with where its time went."""
    lines = [(f"program {report.program}: {report.registered} new batch(es) registered, "
              f"{len(report.applied)} batch(es) applied")]
    for b in report.applied:
        views = "; ".join(f"{v.view} h {v.h_s:.2f}s merge {v.merge_s:.2f}s answer {v.answer_s:.2f}s"
                          for v in b.views)
        part = f" {b.part}" if b.part else ""
        lines.append(f"  batch {b.seq} {b.kind:<6} {b.path}{part} ({b.rows} rows) in {b.total_s:.2f}s: "
                     f"read {b.read_s:.2f}s, row index {b.index_s:.2f}s"
                     + (f"; {views}" if views else ""))
    if report.rejected is not None:
        where = report.rejected_batch or (report.rejected.location or "a landed file")
        if isinstance(report.rejected, OutOfRangeError):
            lines.append(f"  stopped at {where}: a value out of range; the answers stay as they were")
        else:
            lines.append(f"  stopped at {where}: rejected, nothing of it was applied")
    return "\n".join(lines)


def read_answer(warehouse: Path, plan: IncrementalPlan, batch: int | None = None,
                store: DeltaStore | None = None) -> tuple[pa.Table, int | None]:
    """A view's answer table (as of ``batch`` if given) and the batch it reflects."""
    store = store or DeltaStore()
    path = warehouse / "answers" / plan.view
    if not store.exists(path):
        raise StorageError(f"view {plan.view} has no answer yet at {path}; run `incr run` first")
    if batch is None:
        return store.read(path), store.batch_version(path)
    latest = store.table(path).version()
    # What was published at the time: the first version naming the batch (a compaction
    # names it again with the same rows; a republish after the answer query changed names it
    # again, or names earlier batches, with the new query's numbers).
    for version, committed in trusted_commits(commit_batches(path, 0, latest)):
        if committed == batch:
            try:
                return store.read(path, version), batch
            except (OSError, DeltaError) as e:  # its files are gone
                raise StorageError(
                    f"view {plan.view}'s answer for batch {batch} (Delta version {version}) is "
                    f"older than the time-travel window housekeeping keeps (INCR_KEEP_BATCHES, "
                    f"INCR_KEEP_HOURS): its files were vacuumed") from e
    raise StorageError(f"view {plan.view} has no answer for batch {batch} (batches of other "
                       f"tables, ones folded with later batches as one step, or ones before the "
                       f"view existed, have none)")


def answered_by(warehouse: Path, plan: IncrementalPlan, store: DeltaStore | None = None) -> bool:
    """Whether the view's current answer was published by ``plan``'s answer query (not by a
    previous definition still served while the new one rebuilds)."""
    store = store or DeltaStore()
    commit = store.last_commit(warehouse / "answers" / plan.view)
    return commit.get(ANSWER_FP) == plan.answer_fingerprint


def format_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """A plain-text table."""
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths))
            for row in cells]
    return "\n".join([line, rule, *body])


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e15 else repr(v)
    return str(v)


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


__all__ = ["APP_ID", "describe_run", "format_table", "read_answer"]


def stored_types(warehouse: Path, plan: IncrementalPlan,
                 store: DeltaStore | None = None) -> dict[str, dict[str, str]]:
    """The column types of ``plan``'s state tables as a run stored them (SQL spelling), for
    ``incr explain --warehouse``; tables not created yet (or of another state fingerprint)
    are left out."""
    from incr.runtime.state import ViewState

    store = store or DeltaStore()
    state = ViewState(plan, store, warehouse)
    out: dict[str, dict[str, str]] = {}
    for table in plan.tables:
        path = state.path(table.name)
        if store.exists(path):
            out[table.name] = {f.name: sql_type(f.type) for f in store.schema(path)}
    return out


def sql_type(t: pa.DataType) -> str:
    """An Arrow type in the SQL spelling ``incr explain`` uses."""
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    names = {pa.int64(): "BIGINT", pa.int32(): "INT", pa.int16(): "SMALLINT", pa.int8(): "TINYINT",
             pa.float64(): "DOUBLE", pa.float32(): "FLOAT", pa.bool_(): "BOOLEAN",
             pa.date32(): "DATE", pa.string(): "VARCHAR", pa.large_string(): "VARCHAR",
             pa.string_view(): "VARCHAR", pa.binary(): "BLOB"}
    return names.get(t, str(t).upper())

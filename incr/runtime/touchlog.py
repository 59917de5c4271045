"""The groups each fold of a shared state touched, kept beside the state for the other views.

Views that share a state (:mod:`incr.compiler.passes.share`) fold a batch once: the first
view's task folds it, the others only publish their answers from the state.  A view's answer
follows by change (a MERGE of the touched groups' rows, :mod:`~incr.runtime.answer`) only
when it knows which groups the batch touched.  In one process the fold hands them over in
memory (``ViewState.folded``); Airflow runs each view's task in its own process, where they
were lost and every sibling rewrote its whole answer, a cost that grows with the answer.

So every fold of a shared state also writes its touched groups (θ and ``_bucket``, about the
size of the change) to a small Arrow file named by the batch, with the batch the state was at
before it.  A view whose answer is at batch ``a`` while the state is at ``b`` chains the files
back from ``b`` to ``a`` and publishes the union by change.  A missing link (a crash between
the state's commit and the file, a file pruned, a fold too large to log) only means the
answer is rewritten whole, as before: the log is never needed for exactness.  Files are
written aside and renamed, so a reader sees a whole file or none.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
from pyarrow import ipc

__all__ = ["TouchLog", "union_touched"]

log = logging.getLogger(__name__)

#: The folder under a state generation's directory (dot-named: not a Delta table).
DIRECTORY = ".touched"
#: Schema metadata key of the batch the state was at before the fold.
_BEFORE = b"incr.before"
#: Files kept: a view further behind than this many folds rewrites its answer.
KEEP = 64


def union_touched(*tables: pa.Table | None) -> pa.Table | None:
    """The touched groups of several folds (None: one is not known, so neither is the union)."""
    if not tables or any(t is None for t in tables):
        return None
    known = [t for t in tables if t is not None and t.num_rows] or [tables[0]]
    first = known[0]
    rows = pa.concat_tables([t.select(first.column_names).cast(first.schema) for t in known])
    return rows.group_by(rows.column_names).aggregate([])


class TouchLog:
    """The touched groups of a shared state's folds, one file per fold (see module doc)."""

    def __init__(self, state_root: Path):
        self.folder = state_root / DIRECTORY

    def _path(self, batch: int) -> Path:
        return self.folder / f"{batch:012d}.arrow"

    def record(self, batch: int, before: int, touched: pa.Table) -> None:
        """Keeps the groups the fold of ``batch`` (the state at ``before`` until then)
        touched; prunes files past :data:`KEEP`.  A failure to write is logged, not raised:
        the state is committed already, and without the file an answer is rewritten."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            meta = dict(touched.schema.metadata or {})
            meta[_BEFORE] = str(before).encode()
            table = touched.replace_schema_metadata(meta)
            aside = self.folder / f".incr-{batch}-{os.getpid()}.tmp"
            with pa.OSFile(str(aside), "wb") as sink, ipc.new_file(sink, table.schema) as out:
                out.write_table(table)
            os.replace(aside, self._path(batch))
            self._prune()
        except OSError as e:
            log.warning("state %s: the groups batch %d touched were not kept (%s); the "
                        "views sharing it rewrite their answers for it", self.folder.parent,
                        batch, e)

    def _prune(self) -> None:
        files = sorted(p for p in self.folder.glob("*.arrow") if p.stem.isdigit())
        for old in files[:-KEEP]:
            old.unlink(missing_ok=True)

    def since(self, after: int, through: int) -> pa.Table | None:
        """The groups every fold from batch ``after`` (exclusive) to ``through`` touched,
        None when a link of that chain is missing (or ``after`` is not one the folds
        passed through)."""
        parts: list[pa.Table] = []
        at = through
        while at > after:
            path = self._path(at)
            try:
                with pa.memory_map(str(path)) as source:
                    table = ipc.open_file(source).read_all()
            except (OSError, pa.ArrowInvalid):
                return None
            before = int((table.schema.metadata or {}).get(_BEFORE, b"-2"))
            if before >= at:
                return None
            parts.append(table.replace_schema_metadata(None))
            at = before
        if at != after or not parts:
            return None
        return union_touched(*parts)

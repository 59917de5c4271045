"""Housekeeping: checkpoints and VACUUM of a program's Delta tables, with a time-travel window.

Every batch adds files to every table it touches, and copy-on-write MERGEs leave the files
they replaced behind (a state table had 8 live files and 1,199 on disk after 150 batches; an
answer 150 files for 1 live).  :func:`maintain` deletes what no reader needs any more:

* **answers** keep time travel: the versions of the last ``keep_batches`` batches (those a
  BI user's ``incr answer --batch N`` or a pinned snapshot may ask for) and every version
  of the last ``keep_hours`` hours stay readable; older files go.  ``incr serve`` pins its
  snapshots with hard links, so a served snapshot outlives the VACUUM of its files;
* **state, ledger and row indexes** are read only by incr, at their newest version, under
  the program's locks: everything not in the newest version goes.

From a landing area on an object store, the cached copies of files every view has applied
are dropped too (:meth:`~incr.runtime.pipeline.Pipeline.drop_landed_copies`).

Each table also gets a Delta checkpoint (log replay stays short however many batches it
saw) and its expired log files removed (``delta.logRetentionDuration``, 30 days by default).
A VACUUM does a full listing, so files a killed run left behind that no commit names go too.
All of it runs holding every lock of the program, as a whole ``incr run`` does: no write is
in flight while its files are judged.

The Airflow DAGs run it as their last task when :func:`due` (``INCR_MAINTAIN_EVERY_H``), the
CLI as ``incr maintain``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from incr.config import Settings, settings
from incr.runtime.store import DeltaStore, commit_batches

if TYPE_CHECKING:
    from incr.runtime.pipeline import Pipeline

#: Where the time of the last housekeeping of a program is kept (under ``W/_incr/<program>``).
MARKER = "housekeeping.json"


@dataclass(frozen=True)
class TableUpkeep:
    """What housekeeping did to one table."""

    path: str
    kind: str  # "answer" (time travel kept) or "internal" (newest version only)
    files_before: int
    files_after: int
    bytes_freed: int
    versions_kept: tuple[int, ...]  # answer versions kept for their batch (empty: internal)


def maintain(pipeline: Pipeline, config: Settings | None = None) -> list[TableUpkeep]:
    """Checkpoints and vacuums every Delta table of ``pipeline``'s program.

    Holds every lock of the program meanwhile (a task or run of the same program waits or
    exits 4, as for ``incr run``).  Returns what it did per table, answers first.
    """
    config = config or settings()
    store = pipeline.store
    out: list[TableUpkeep] = []
    with pipeline.hold_everything():
        for view in pipeline.views.values():
            if store.exists(view.answer_path):
                kept = versions_of_last_batches(store, view.answer_path, config.keep_batches)
                out.append(_upkeep(store, view.answer_path, "answer", config.keep_hours, kept))
        roots = dict.fromkeys(v.view_root for v in pipeline.views.values())  # shared ones once
        internal = [p for root in roots for p in delta_tables(root)]
        internal += list(delta_tables(pipeline.meta))
        for path in internal:
            out.append(_upkeep(store, path, "internal", 0.0, ()))
        pipeline.drop_landed_copies()
        _mark(pipeline.meta)
    return out


def versions_of_last_batches(store: DeltaStore, path: str | Path, batches: int) -> tuple[int, ...]:
    """The versions of an answer table that hold its last ``batches`` batches (newest first).

    A batch's version is its commit (marked ``incr.batch``); maintenance commits (VACUUM)
    carry no batch and are not kept for their own sake.
    """
    if batches <= 0:
        return ()
    marked = [(b, v) for v, b in commit_batches(Path(path), 0, store.table(path).version())]
    if not marked:
        return ()
    newest = max(b for b, _ in marked)
    return tuple(sorted({v for b, v in marked if b > newest - batches}, reverse=True))


def delta_tables(root: Path) -> Iterator[Path]:
    """Every Delta table under ``root`` (a folder holding ``_delta_log``), outermost only."""
    if not root.is_dir():
        return
    if (root / "_delta_log").is_dir():
        yield root
        return
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith("."):
            yield from delta_tables(child)


def due(meta: Path, every_hours: float, now: float | None = None) -> bool:
    """Whether housekeeping of the program whose folder is ``meta`` is due."""
    marker = meta / MARKER
    if not marker.exists():
        return True
    try:
        last = float(json.loads(marker.read_text())["at"])
    except (ValueError, KeyError, OSError):
        return True
    return (now if now is not None else time.time()) - last >= every_hours * 3600


def _mark(meta: Path) -> None:
    meta.mkdir(parents=True, exist_ok=True)
    tmp = meta / f".{MARKER}.tmp"
    tmp.write_text(json.dumps({"at": time.time()}))
    tmp.replace(meta / MARKER)


def _upkeep(store: DeltaStore, path: str | Path, kind: str, keep_hours: float,
            keep_versions: tuple[int, ...]) -> TableUpkeep:
    before, size_before = _files_on_disk(Path(path))
    store.housekeep(path, keep_hours=keep_hours, keep_versions=keep_versions)
    after, size_after = _files_on_disk(Path(path))
    return TableUpkeep(str(path), kind, before, after, max(size_before - size_after, 0), keep_versions)


def _files_on_disk(root: Path) -> tuple[int, int]:
    """Data files (not the log) under a table folder, and their bytes."""
    count = size = 0
    for p in root.rglob("*.parquet"):
        if "_delta_log" not in p.parts:
            count += 1
            size += p.stat().st_size
    return count, size

"""Small results kept on disk for the next process: a memo that outlives the interpreter.

Every scheduled task is a new process, and what a process computes once and keeps in memory
(an ``lru_cache``) it computes again on the next batch.  The driver-side engine's translation
of each Spark query to DuckDB (:mod:`~incr.runtime.local`: sqlglot parses, checks and
rewrites it, about 5 ms a query) is such a result: a join view's twenty queries cost 0.1 s,
a sixth of its increment, in every task.  A program's queries are the same texts batch
after batch, so their results are kept here, one small JSON file each, beside the program's
other bookkeeping in the warehouse.

An entry is keyed by its parts (the query text and bucket) within a *generation*: whatever
decides the result besides them (the translator's version and source).  A new generation
never reads an old one's entries, and removes their folders when it first writes.  Each
entry holds its parts as well, so a hash collision or a file from elsewhere is a miss, never
a wrong answer; so is a file that cannot be read.  Writes are atomic (aside, then renamed),
and two processes writing one entry write the same thing.  A generation keeps at most
``limit`` entries: a program whose query texts changed with every batch would otherwise
fill the disk, and once there the rest is computed as if nothing were kept.  Nothing here
is ever needed: a folder that cannot be written (read-only, full) only costs the time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("incr.runtime")

#: Entries one generation keeps at most.
LIMIT = 4096
#: A file being written aside this long ago was left by a killed writer.
_STALE_S = 3600


class DiskCache:
    """JSON values by string parts, in ``folder/<generation>/``."""

    def __init__(self, folder: Path, generation: str, limit: int = LIMIT):
        self.folder = Path(folder)
        self.generation = generation
        self.limit = limit
        self._lock = threading.Lock()
        self._count: int | None = None  # entries of this generation, counted on the first put

    @property
    def _here(self) -> Path:
        return self.folder / self.generation

    def _path(self, parts: tuple[str, ...]) -> Path:
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]
        return self._here / f"{digest}.json"

    def get(self, parts: tuple[str, ...]) -> Any | None:
        """The value kept for ``parts``, or None (none kept, or not readable)."""
        try:
            entry = json.loads(self._path(parts).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("parts") != list(parts):
            return None
        return entry.get("value")

    def put(self, parts: tuple[str, ...], value: Any) -> bool:
        """Keeps ``value`` (JSON) for ``parts``; False when it was not kept (the generation
        is full, or the folder cannot be written)."""
        with self._lock:
            if self._count is None:
                self._count = self._start()
            if self._count >= self.limit:
                return False
            self._count += 1
        path = self._path(parts)
        try:
            fd, temp = tempfile.mkstemp(prefix=".incr-", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"parts": list(parts), "value": value}, f)
                os.replace(temp, path)
            except BaseException:
                Path(temp).unlink(missing_ok=True)
                raise
        except OSError as e:
            log.debug("not kept on disk: %s (%s)", path, e)
            return False
        return True

    def _start(self) -> int:
        """Makes this generation's folder, removes the others' (and what a killed writer
        left aside an hour ago or more), and counts its entries."""
        try:
            self._here.mkdir(parents=True, exist_ok=True)
            for other in self.folder.iterdir():
                if other.is_dir() and other.name != self.generation:
                    shutil.rmtree(other, ignore_errors=True)
            count = 0
            with os.scandir(self._here) as entries:
                for entry in entries:
                    if entry.name.endswith(".json"):
                        count += 1
                    elif entry.name.endswith(".tmp") and \
                            time.time() - entry.stat().st_mtime > _STALE_S:
                        Path(entry.path).unlink(missing_ok=True)
            return count
        except OSError as e:
            log.debug("nothing kept on disk in %s (%s)", self.folder, e)
            return self.limit

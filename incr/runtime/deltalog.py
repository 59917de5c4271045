"""A Delta table's live ``add`` actions, as its log states them, and commits written by hand.

delta-rs lists a table's files and their statistics but not the deletion vector an
``add`` carries, and it has no way to commit one.  A commit that puts a new vector on a
file must remove the file *as the log last added it* (path and vector: the protocol
identifies a file with a vector by both), so that ``add`` is read here, from the last
checkpoint and the commit files after it.  Only :mod:`~incr.runtime.store` uses this, for
the MERGEs it writes with deletion vectors.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


class LogConflict(Exception):
    """Another writer committed the version this commit was to be."""


def _commit_file(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def _checkpoint(root: Path, version: int) -> tuple[int, dict[str, dict[str, Any]]]:
    """The live adds of the newest single-file checkpoint at or below ``version`` (-1: none)."""
    log = root / "_delta_log"
    try:
        last = json.loads((log / "_last_checkpoint").read_text())
    except (OSError, ValueError):
        return -1, {}
    at = int(last.get("version", -1))
    if at > version or last.get("parts"):
        return -1, {}
    table = pq.read_table(log / f"{at:020d}.checkpoint.parquet", columns=["add"])
    adds = {}
    for add in table.column("add").to_pylist():
        if add:
            add["partitionValues"] = dict(add.get("partitionValues") or [])
            if add.get("tags") is not None:
                add["tags"] = dict(add["tags"])
            adds[add["path"]] = {k: v for k, v in add.items() if v is not None}
    return at, adds


def live_adds(root: str | Path, version: int,
              known: tuple[int, dict[str, dict[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """The ``add`` action of every file of ``version`` of the table at ``root``, by path.

    Read from ``known`` (an earlier version's result, not changed) and the commit files
    after it; without one, from the newest checkpoint at or below ``version`` (or from
    version 0) on.

    Raises:
        FileNotFoundError: a commit file between the checkpoint and ``version`` is gone (the
            log was cleaned up past a version without a checkpoint).
    """
    root = Path(root)
    if known is not None and known[0] <= version:
        at, adds = known[0], dict(known[1])
    else:
        at, adds = _checkpoint(root, version)
    for v in range(at + 1, version + 1):
        for line in _commit_file(root, v).read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "remove" in action:
                adds.pop(action["remove"]["path"], None)
            elif "add" in action:
                add = action["add"]
                adds[add["path"]] = {k: v for k, v in add.items() if v is not None}
    return adds


def commit(root: str | Path, version: int, actions: Iterable[Mapping[str, Any]]) -> None:
    """Writes ``actions`` as commit ``version`` of the table at ``root``, atomically.

    The file is written aside and linked into place, which fails if the version exists:
    the same put-if-absent delta-rs relies on for a local table.

    Raises:
        LogConflict: another commit took ``version`` first.
    """
    log = Path(root) / "_delta_log"
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    fd, temp = tempfile.mkstemp(prefix=".incr-commit-", suffix=".tmp", dir=log)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temp, _commit_file(Path(root), version))
        except FileExistsError:
            raise LogConflict(f"version {version} of {root} was committed by another writer") from None
    finally:
        os.unlink(temp)


#: delta-rs's default ``delta.checkpointInterval``: a checkpoint every this many commits.
CHECKPOINT_INTERVAL = 100


def checkpoint_due(version: int, configuration: Mapping[str, str | None]) -> bool:
    """Whether commit ``version`` is one after which Delta writers write a checkpoint.

    delta-rs's own writers do so every ``delta.checkpointInterval`` commits (a post-commit
    hook); a commit written by :func:`commit` must do the same, or a table that incr
    writes by hand (every batch, with vectors) replays a log that grows with every batch
    until the next housekeeping.  The versions are delta-rs's: the ``interval``-th commit
    (version ``interval - 1``) and every ``interval`` after it.
    """
    try:
        interval = int(configuration.get("delta.checkpointInterval") or CHECKPOINT_INTERVAL)
    except ValueError:
        interval = CHECKPOINT_INTERVAL
    return interval > 0 and (version + 1) % interval == 0

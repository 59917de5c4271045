"""Crash and pause points for the tests that run incr as real processes.

``INCR_CRASH_AT=<point>:<batch>`` kills the process there.

The process exits at once with :data:`CRASH_EXIT` (no cleanup, no finally blocks), like a
killed worker.  Points: ``batch.start``, ``index.after_commit``, ``view.before_merge``,
``view.after_merge`` (after a state table's commit), ``view.before_keep`` (a nested
stage's state and output change committed, its kept rows not yet), ``view.after_state``
(all state committed, answer not yet), ``view.after_answer``.

``INCR_PAUSE_AT=<point>:<file>`` makes the process wait at a point until ``file`` exists,
so a test can hold a process at a known place (``locks.held``: right after it took a set
of locks) while it starts others, instead of hoping that two processes overlap in time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from incr.config import setting

CRASH_EXIT = 86
#: A paused process gives up waiting after this long, so a test that fails cannot hang CI.
PAUSE_LIMIT_S = 600.0
_POLL_S = 0.05
_paused: set[str] = set()


def crash_point(name: str, batch: int) -> None:
    """Exits the process if ``INCR_CRASH_AT`` names this point and batch."""
    spec = setting("crash_at")
    if spec and spec == f"{name}:{batch}":
        os._exit(CRASH_EXIT)


def pause_point(name: str) -> None:
    """Waits here, the first time this process reaches ``name``, if ``INCR_PAUSE_AT`` names it.

    On arrival it writes its pid to ``<file>.reached``, so the test knows which process
    waits; the wait ends when ``<file>`` exists (or after :data:`PAUSE_LIMIT_S`).
    """
    spec = setting("pause_at")
    if not spec or name in _paused:
        return
    point, _, release = spec.partition(":")
    if point != name or not release:
        return
    _paused.add(name)
    Path(f"{release}.reached").write_text(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(_POLL_S)

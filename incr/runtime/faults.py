"""Crash points for the crash tests: ``INCR_CRASH_AT=<point>:<batch>`` kills the process there.

The process exits at once with :data:`CRASH_EXIT` (no cleanup, no finally blocks), like a
killed worker.  Points: ``batch.start``, ``index.after_commit``, ``view.before_merge``,
``view.after_merge`` (after a state table's commit), ``view.before_keep`` (a nested
stage's state and output change committed, its kept rows not yet), ``view.after_state``
(all state committed, answer not yet), ``view.after_answer``.
"""

from __future__ import annotations

import os

from incr.config import settings

CRASH_EXIT = 86


def crash_point(name: str, batch: int) -> None:
    """Exits the process if ``INCR_CRASH_AT`` names this point and batch."""
    spec = settings().crash_at
    if spec and spec == f"{name}:{batch}":
        os._exit(CRASH_EXIT)

"""What a program's tasks do when they fail for good: one clear log line, then the user's hook.

A program names its hook in its header, ``-- incr: on_failure = package.module:function``;
the function is called with Airflow's task context, like any Airflow ``on_failure_callback``,
so an existing notifier (Slack, e-mail, PagerDuty) can be used as is.  The hook is imported
when a task fails, not when the DAG is parsed, so a heavy or broken hook module cannot slow
down or break the DAG processor; a hook that cannot be imported or raises is logged, and the
task's own failure (the one the operator needs to see) stands.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("incr.orchestration")


def resolve_hook(spec: str) -> Callable[[Any], object]:
    """The function named by ``package.module:function``.

    Raises:
        ValueError: ``spec`` is not of that form, or names nothing callable.
    """
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"on_failure hook {spec!r} must be written package.module:function")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"on_failure hook {spec!r} is not callable")
    return target


def on_failure(context: Any, hook: str | None = None) -> None:
    """Logs which task of which run failed and why, then calls the program's hook, if any."""
    ti = context.get("ti") or context.get("task_instance")
    where = f"{getattr(ti, 'dag_id', '?')}.{getattr(ti, 'task_id', '?')} (run {context.get('run_id', '?')})"
    log.error("incr: %s failed: %s", where, context.get("exception"))
    if not hook:
        return
    try:
        resolve_hook(hook)(context)
    except Exception:
        log.exception("incr: the on_failure hook %s of %s failed", hook, where)

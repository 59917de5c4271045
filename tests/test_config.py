"""Settings read from the environment: all of them, or one alone."""

from __future__ import annotations

from dataclasses import fields

import pytest

from incr.config import Settings, setting, settings


def test_one_setting_reads_as_all_of_them_do(monkeypatch):
    """:func:`setting` gives the field :func:`settings` gives, set or not, with the same
    parsing and the same error for a bad value."""
    for f in fields(Settings):
        monkeypatch.delenv(f.metadata["env"], raising=False)
    assert all(setting(f.name) == getattr(settings(), f.name) for f in fields(Settings))
    monkeypatch.setenv("INCR_DRIVER_THREADS", "3")
    monkeypatch.setenv("INCR_CRASH_AT", "view.after_merge:2")
    monkeypatch.setenv("INCR_ANSWER_MERGE_REACH", "0.25")
    assert (setting("driver_threads"), setting("crash_at"), setting("answer_merge_reach")) == \
        (3, "view.after_merge:2", 0.25) == \
        (settings().driver_threads, settings().crash_at, settings().answer_merge_reach)
    monkeypatch.setenv("INCR_DRIVER_THREADS", "")  # empty: the default
    assert setting("driver_threads") == Settings().driver_threads
    monkeypatch.setenv("INCR_DRIVER_THREADS", "many")
    with pytest.raises(ValueError, match="INCR_DRIVER_THREADS must be an integer"):
        setting("driver_threads")

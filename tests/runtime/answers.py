"""Answer-publishing settings the equivalence tests draw from (see ``incr.runtime.answer``)."""

from __future__ import annotations

from incr.config import Settings

#: By change whenever possible (MERGE whatever it reaches), when the MERGE pays (the
#: default), and never (every answer rewritten whole).
ANSWER_CONFIGS = (
    Settings(answer_merge_reach=1.0),
    Settings(),
    Settings(answer_by_change=False),
)

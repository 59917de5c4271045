"""Answer-publishing settings the equivalence tests draw from (see ``incr.runtime.answer``)."""

from __future__ import annotations

from incr.config import Settings

#: Answers by change with deletion vectors (the default); by change copying the files it
#: touches, whatever they hold or only while that pays; and never (every answer rewritten
#: whole).  State merges by deletion vectors in the first two, main and join side tables
#: alike (whatever the table's size; by default only above INCR_STATE_VECTOR_ROWS), copying
#: files (delta-rs's MERGE of h(Δ)) in the others.  In the first, every file of a table
#: with vectors is searched by key in its key mirror (by default only files of 65,536 rows).
#: A regrouped answer follows by change while its touched groups are at most the reach's
#: share of its rows: in the first two, as long as they are not more than it has.  In the
#: last, the driver holds at most 4 rows of a state table: an answer of at most 4 rows (a
#: top k, a global or regrouped aggregate, a HAVING) over a larger state is computed from
#: the state's files, past their deletion vectors (``DriverEngine.scan``).  The states
#: here hold a few rows, which by default rewrites every per-group answer
#: (``INCR_ANSWER_REWRITE_ROWS``): the first three take the MERGE by change whatever the
#: state's size, and the last is the defaults.
ANSWER_CONFIGS = (
    Settings(state_vector_rows=0, mirror_rows=1, answer_merge_reach=1.0, answer_rewrite_rows=0),
    Settings(answer_deletion_vectors=False, answer_merge_reach=1.0, state_vector_rows=0,
             answer_rewrite_rows=0),
    Settings(answer_deletion_vectors=False, state_deletion_vectors=False, answer_rewrite_rows=0),
    Settings(answer_by_change=False, state_deletion_vectors=False),
    Settings(answer_by_change=False, state_vector_rows=0, local_state_rows=4),
    Settings(),
)

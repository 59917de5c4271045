"""How a view's answer table follows its state: by change, or rewritten whole.

a(state) is per group when every answer row comes from one group's state rows: no ORDER BY
or LIMIT ranks rows across groups, and θ is not empty (a global aggregate answers one row
from all of them).  Then the groups a batch touched are the only ones whose answer rows can
change, and the answer table is maintained by one MERGE per batch instead of rewritten:

* for every touched group, a *tombstone* (its θ, flagged :data:`GONE`) deletes the group's
  current answer rows;
* every answer row of a touched group, recomputed from that group's state rows only, is
  inserted (HAVING may drop it: the group then just disappears; an exploded bag inserts
  its copies).

A top-k answer (ORDER BY … LIMIT k) is kept the same way in spirit: its new rows are the
top k of the old top rows' groups and the touched groups, recomputed from their state rows
only, and that is the exact answer unless the k-th new row ranks below the old k-th (a
touched row fell out, and an untouched group may now belong in): only then is a(state)
recomputed over the whole state.  Its k rows are rewritten, which costs k rows.

A view regrouped from a finer grouping's state (``share = rollup``,
:class:`~incr.compiler.plan.Rollup`) is per group of its own keys: a batch's touched groups
are those its touched finer groups fall in, and their answer rows are recomputed from all
their rows of the finer state, found in every bucket (the runtime rewrites the answer
instead when they are most of its groups).  Ranked or windowed, it is rewritten.

For the MERGE to find a group's answer rows, every column of θ must be an output column of
the answer as it is (``SELECT region, sum(x) … GROUP BY region``; for windows, θ is the
PARTITION BY, and a touched partition's rows are all recomputed); when one is not
(``SELECT sum(x) … GROUP BY region``) the rows of a group cannot be told apart from
another's, and the answer is rewritten.  :func:`publish_mode` decides, with the reason
``incr explain`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from incr.compiler.dialect import MAIN
from incr.compiler.ir import SortKey
from incr.compiler.scalar import Scalar

if TYPE_CHECKING:
    from incr.compiler.plan import Answer

#: The source column of an answer MERGE that marks a tombstone (a touched group's old rows go).
GONE = "_incr_gone"


@dataclass(frozen=True)
class Publish:
    """How the answer table is written after a batch.

    ``keys`` pairs each answer column showing a θ column with that θ column, in θ's order
    (empty when the answer is rewritten); ``reason`` says why, for ``incr explain``.
    ``top`` marks a top-k answer (ORDER BY … LIMIT k) kept from its old rows and the
    touched groups; ``order`` is then its ORDER BY over answer columns.
    """

    by_change: bool
    keys: tuple[tuple[str, str], ...]
    reason: str
    top: bool = False
    order: tuple[SortKey, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """The answer columns a group's rows are found by."""
        return tuple(column for column, _ in self.keys)


def publish_mode(answer: Answer) -> Publish:
    """Whether ``answer`` can be maintained by change, and why (not)."""
    if answer.rollup is not None and (answer.limit is not None or answer.rows is not None
                                      or answer.order or answer.offset or not answer.grouped):
        return Publish(False, (), f"computed from the state kept by GROUP BY "
                                  f"{', '.join(answer.rollup.of)}, regrouped, and ranked or "
                                  f"windowed across its groups, so the answer is recomputed "
                                  f"and rewritten")
    if not answer.grouped and answer.rows is not None:
        return Publish(False, (), "a window without PARTITION BY reads every row, so any batch "
                                  "may change every answer row; the answer is recomputed and "
                                  "rewritten")
    if not answer.grouped:
        return Publish(False, (), "a global aggregate answers one row from the whole state; "
                                  "that row is rewritten")
    if answer.offset:
        return Publish(False, (), "OFFSET keeps rows ranked across all groups; the answer is "
                                  "recomputed and rewritten")
    if answer.order and answer.limit is None:
        return Publish(False, (), "ORDER BY makes the row order part of the answer, and a "
                                  "MERGE does not keep the order of a table's rows")
    shown: dict[str, str] = {}
    for e in answer.exprs:
        for k in answer.keys:
            if e.expr.sql == f"{MAIN}.{k}":
                shown.setdefault(k, e.name)
    missing = [k for k in answer.keys if k not in shown]
    if missing:
        return Publish(False, (), f"the group key {', '.join(missing)} is not an output column, "
                                  f"so a group's answer rows cannot be found; the answer is "
                                  f"rewritten (select the GROUP BY columns to publish by change)")
    keys = tuple((shown[k], k) for k in answer.keys)
    if answer.limit is not None:
        return _top(answer, keys)
    if answer.rows is not None:
        return Publish(True, keys, "windows are per partition: each batch MERGEs the answer rows "
                                   "of the partitions it touched, their windows recomputed from "
                                   f"their rows, matched on {', '.join(c for c, _ in keys)}")
    if answer.rollup is not None:
        return Publish(True, keys, f"a is per group of the state kept by GROUP BY "
                                   f"{', '.join(answer.rollup.of)}, regrouped: each batch MERGEs "
                                   f"the answer rows of the groups it touched (those its touched "
                                   f"finer groups fall in), recomputed from their rows of that "
                                   f"state (a filtered scan of every bucket: a group's rows are "
                                   f"spread over them), matched on {', '.join(c for c, _ in keys)}; "
                                   f"a batch touching more than INCR_ANSWER_MERGE_REACH of its "
                                   f"groups rewrites it")
    return Publish(True, keys, "a is per group: each batch MERGEs the answer rows of the groups "
                               f"it touched, matched on {', '.join(c for c, _ in keys)}")


def _top(answer: Answer, keys: tuple[tuple[str, str], ...]) -> Publish:
    """A top-k answer: recomputed from its old rows and the touched groups when that is exact."""
    if answer.explode is not None:
        return Publish(False, (), "LIMIT over a bag of rows (copies rank alike); the answer is "
                                  "recomputed and rewritten")
    outputs = {e.expr.sql: e.name for e in answer.exprs}
    order = []
    for k in answer.order:
        if k.expr.sql not in outputs:
            return Publish(False, (), f"ORDER BY {k.expr.sql} is not an output column, so the "
                                      f"old top rows cannot be ranked against new ones; the "
                                      f"answer is recomputed and rewritten")
        order.append(replace(k, expr=Scalar(outputs[k.expr.sql])))
    return Publish(False, keys, f"top {answer.limit}: recomputed from the groups of the old top "
                                f"rows and the groups a batch touched, and recomputed whole only "
                                f"when a touched row falls out of the top {answer.limit}",
                   top=True, order=tuple(order))

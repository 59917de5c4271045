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

For the MERGE to find a group's answer rows, every column of θ must be an output column of
the answer as it is (``SELECT region, sum(x) … GROUP BY region``); when one is not
(``SELECT sum(x) … GROUP BY region``) the rows of a group cannot be told apart from
another's, and the answer is rewritten.  :func:`publish_mode` decides, with the reason
``incr explain`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from incr.compiler.dialect import MAIN

if TYPE_CHECKING:
    from incr.compiler.plan import Answer

#: The source column of an answer MERGE that marks a tombstone (a touched group's old rows go).
GONE = "_incr_gone"


@dataclass(frozen=True)
class Publish:
    """How the answer table is written after a batch.

    ``keys`` pairs each θ column with the answer column showing it, in θ's order (empty
    when the answer is rewritten); ``reason`` says why, for ``incr explain``.
    """

    by_change: bool
    keys: tuple[tuple[str, str], ...]
    reason: str

    @property
    def columns(self) -> tuple[str, ...]:
        """The answer columns a group's rows are found by."""
        return tuple(column for column, _ in self.keys)


def publish_mode(answer: Answer) -> Publish:
    """Whether ``answer`` can be maintained by change, and why (not)."""
    if not answer.grouped:
        return Publish(False, (), "a global aggregate answers one row from the whole state; "
                                  "that row is rewritten")
    if answer.limit is not None or answer.offset:
        return Publish(False, (), "LIMIT/OFFSET keeps rows ranked across all groups; the "
                                  "answer is recomputed and rewritten")
    if answer.order:
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
    return Publish(True, keys, "a is per group: each batch MERGEs the answer rows of the groups "
                               f"it touched, matched on {', '.join(c for c, _ in keys)}")

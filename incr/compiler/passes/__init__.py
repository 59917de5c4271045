"""The compiler passes, one per module, run in the order of :data:`PASSES`.

Ordering constraints:

* ``normalize`` first: every later pass assumes the canonical operator shape
  (plain SELECTs already turned into Aggregate + Explode).
* ``lineage`` before ``infer_monoids``: value-count bags are keyed by θ.
* ``infer_monoids`` before ``split_answer``: a is assembled from each aggregate's
  finalization, h from its monoid elements.
* ``derive_merge`` last: ⊗, ⊗̃ and ⊗̂ are derived from the state tables that
  ``split_answer`` lays out.

:data:`PROGRAM_PASSES` run on a whole program once every view went through
:data:`PASSES`:

* ``share`` needs each view's plan (to tell which views may share a state at all) and
  its compilation after ``lineage`` (input and θ); it runs ``infer_monoids``,
  ``split_answer`` and ``derive_merge`` again on the merged aggregates of a group.
"""

from __future__ import annotations

from collections.abc import Callable

from incr.compiler.compilation import Compilation
from incr.compiler.passes.derive_merge import derive_merge
from incr.compiler.passes.infer_monoids import infer_monoids
from incr.compiler.passes.lineage import lineage
from incr.compiler.passes.normalize import normalize
from incr.compiler.passes.split_answer import split_answer

Pass = Callable[[Compilation], Compilation]

PASSES: tuple[Pass, ...] = (normalize, lineage, infer_monoids, split_answer, derive_merge)

#: The passes over a whole program, in order (see :mod:`incr.compiler.passes.share`).
PROGRAM_PASSES = ("share",)


def run_passes(c: Compilation, until: str | None = None) -> Compilation:
    """Runs the passes in order; with ``until``, stops after the pass of that name."""
    for p in PASSES:
        c = p(c)
        if p.__name__ == until:
            break
    return c

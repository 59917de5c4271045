"""The compiler passes, one per module, run in the order of :data:`PASSES`.

Ordering constraints:

* ``normalize`` first: every later pass assumes the canonical operator shape
  (plain SELECTs already turned into Aggregate + Explode).
* ``lineage`` before ``infer_monoids``: value-count bags are keyed by θ.
* ``infer_monoids`` before ``split_answer``: a is assembled from each aggregate's
  finalization, h from its monoid elements.
* ``derive_merge`` last: ⊗, ⊗̃ and ⊗̂ are derived from the state tables that
  ``split_answer`` lays out.
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


def run_passes(c: Compilation, until: str | None = None) -> Compilation:
    """Runs the passes in order; with ``until``, stops after the pass of that name."""
    for p in PASSES:
        c = p(c)
        if p.__name__ == until:
            break
    return c

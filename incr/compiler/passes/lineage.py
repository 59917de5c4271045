"""Lineage: the key θ that links every state row to the input rows it summarises.

For a single-source view θ is the tuple of GROUP BY keys (empty for a global aggregate):
a batch can only change the state rows whose θ occurs in it, which is what lets ⊗ be a
keyed merge rather than a recompute (seed §8, Algorithm 2: groupBy keys are injected into
the output).  Each key gets a state column name: the source column's own name when the key
is a plain column, ``key<i>`` otherwise.

For a window query θ is the window partition (:class:`~incr.compiler.ir.Window`): the
Aggregate's other keys are the columns of the rows kept per partition, named the same way
but not part of θ.
"""

from __future__ import annotations

from dataclasses import replace

from incr.compiler.compilation import Compilation
from incr.compiler.ir import Aggregate, Named, Window


def lineage(c: Compilation) -> Compilation:
    """Fills ``lineage`` (θ over source columns) and the IR-key → state-column map."""
    agg = next(node for node in c.rel.walk() if isinstance(node, Aggregate))
    window = next((node for node in c.rel.walk() if isinstance(node, Window)), None)
    used: set[str] = {"value"}  # a value-count bag's own key column (split_answer.BAG_VALUE)
    theta: list[Named] = []
    mapping: list[tuple[str, str]] = []
    for i, key in enumerate(agg.keys):
        cols = key.expr.columns()
        plain = len(cols) == 1 and key.expr.sql == next(iter(cols))
        name = key.expr.sql if plain else f"key{i}"
        while name.lower() in used:
            name = f"{name}_{i}"
        used.add(name.lower())
        if window is None or key.name in window.partition:
            theta.append(Named(name, key.expr))
        mapping.append((key.name, name))
    return replace(c, lineage=tuple(theta), key_columns=tuple(mapping))

"""The steps that turn one query block (one SELECT) into one stage, in order.

Ordering constraints of :data:`BLOCK`:

* ``split_joins`` first: it decides the relation the block reads (one input, a UNION's
  branches, or the joined columns of several inputs) that every name is resolved against;
  for a join it spells each column ``<alias>__<column>`` and reads the equi-join keys from
  ON and WHERE before anything else rewrites those clauses.
* ``resolve_names`` before ``lower_block``: the IR's scalars read the source's columns as
  declared, with no table qualifiers.
* ``lower_block`` last: it builds the IR from the resolved tree and fills ``Block.stage``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqlglot import exp

from incr.compiler.frontend.lower_block import lower_block
from incr.compiler.frontend.query import Block, Scope, StageTranslation, UnionInput
from incr.compiler.frontend.resolve_names import resolve_names
from incr.compiler.frontend.split_joins import split_joins

BlockStep = Callable[[Block], Block]

BLOCK: tuple[BlockStep, ...] = (split_joins, resolve_names, lower_block)


def run_block(b: Block, until: str | None = None) -> Block:
    """Runs the block steps in order; with ``until``, stops after the step of that name."""
    for step in BLOCK:
        b = step(b)
        if step.__name__ == until:
            break
    return b


def translate_block(scope: Scope, tree: exp.Select, name: str,
                    derived: Mapping[str, StageTranslation],
                    union: UnionInput | None = None) -> StageTranslation:
    """Translates one SELECT into stage ``name`` (``""`` for the view's own stage).

    ``derived`` are the earlier stages the SELECT's FROM reads (by stage name); ``union``
    is set for the SELECT over a UNION's branches.
    """
    block = Block(scope, tree, name, derived, union)
    stage = run_block(block).stage
    assert stage is not None
    return stage

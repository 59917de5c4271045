"""Normalization: every view gets the same operator shape.

The passes after this one assume::

    [Limit] ( Project ( [Sort] ( [Filter:HAVING] ( [Window] ( [Explode] (
        Aggregate ( [Filter:WHERE] ( Source ))))))))

A plain SELECT (no aggregate) is a bag of rows, and a bag is kept as (row, count) pairs:
it becomes an Aggregate keyed by every expression the SELECT and ORDER BY need, with
``COUNT(*)`` as the multiplicity, followed by an Explode that turns the pairs back into
rows.  That is the paper's cMap(f, S) with the ⊎ monoid (§7), and it makes deletions exact
for plain views too.

A window query (:class:`~incr.compiler.ir.Window` over its source) is a bag of rows too,
keyed by the columns its windows and items read rather than by whole expressions: the
windows are computed over the exploded rows of each partition, above the Explode.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from incr.compiler.compilation import Compilation
from incr.compiler.ir import (
    AggCall,
    Aggregate,
    Explode,
    Filter,
    Limit,
    Named,
    NamedAgg,
    Project,
    Rel,
    Sort,
    Source,
    Window,
)
from incr.compiler.scalar import Scalar

MULTIPLICITY = "_a0"


def normalize(c: Compilation) -> Compilation:
    """Rewrites a plain SELECT into Aggregate + Explode; aggregate queries pass through."""
    if any(isinstance(node, Aggregate) for node in c.rel.walk()):
        return c
    return replace(c, rel=_bag_of_rows(c.rel))


def _bag_of_rows(rel: Rel) -> Rel:
    limit = rel if isinstance(rel, Limit) else None
    project = limit.child if limit else rel
    assert isinstance(project, Project), "translate always emits a Project"
    sort = project.child if isinstance(project.child, Sort) else None
    below = sort.child if sort else project.child
    window = below if isinstance(below, Window) else None
    if window is not None:
        below = window.child
    assert isinstance(below, (Filter, Source)), "plain SELECT reads one source"

    needed: list[Scalar] = [n.expr for n in project.exprs]
    if sort:
        needed += [k.expr for k in sort.keys]
    keys: list[Named] = []
    by_sql: dict[str, Scalar] = {}
    key_of: dict[str, str] = {}
    if window is not None:  # windows read whole partitions: the bag keeps the columns they read
        for col in _columns_read(needed):
            key_of[col] = f"_k{len(keys)}"
            keys.append(Named(key_of[col], Scalar.column(col)))
        to_key = {c: Scalar.column(k) for c, k in key_of.items()}
        by_sql = {e.sql: e.substitute(to_key) for e in needed}
    for expr in needed if window is None else ():
        if expr.sql not in by_sql:
            name = f"_k{len(keys)}"
            keys.append(Named(name, expr))
            by_sql[expr.sql] = Scalar.column(name)

    core: Rel = Aggregate(below, tuple(keys), (NamedAgg(MULTIPLICITY, AggCall("count_star")),))
    core = Explode(core, MULTIPLICITY)
    if window is not None:
        core = Window(core, tuple(key_of[c] for c in window.partition))
    if sort:
        core = Sort(core, tuple(replace(k, expr=by_sql[k.expr.sql]) for k in sort.keys))
    out: Rel = Project(core, tuple(Named(n.name, by_sql[n.expr.sql]) for n in project.exprs))
    return replace(limit, child=out) if limit else out


def _columns_read(exprs: list[Scalar]) -> list[str]:
    """The columns ``exprs`` read, in the order they first appear."""
    out: list[str] = []
    for e in exprs:
        for col in e.tree().find_all(exp.Column):
            if col.name not in out:
                out.append(col.name)
    return out

"""The relational IR: small, frozen operator nodes.

Rewrites build new trees with :func:`dataclasses.replace`; nothing is mutated, so a tree
can be hashed (the plan fingerprint) and shared between passes safely.  ``pretty()`` prints
a tree the way ``incr explain`` shows it.

Operators (children first):

* ``Source(table)``: the rows of a streaming source.
* ``Filter(child, predicate)``: WHERE / HAVING.
* ``Aggregate(child, keys, aggs)``: GROUP BY keys (empty for a global aggregate).
* ``Explode(child, multiplicity)``: repeats each row ``multiplicity`` times; a bag kept as
  (row, count) pairs becomes a bag of rows again.
* ``Window(child, partition)``: the rows below are grouped into window partitions by the
  columns ``partition``; window functions in the Project above are computed per partition.
* ``Project(child, exprs)``: the SELECT list.
* ``Sort(child, keys)`` and ``Limit(child, count, offset)``: ORDER BY / LIMIT.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from typing_extensions import override

from incr.compiler.scalar import Scalar

#: Aggregate functions of the single-source class, by canonical name.
AGGREGATES = ("count_star", "count", "sum", "avg", "min", "max", "count_distinct",
              "var_samp", "var_pop", "stddev_samp", "stddev_pop")


@dataclass(frozen=True, order=True)
class Named:
    """An expression with its output column name."""

    name: str
    expr: Scalar

    def __str__(self) -> str:
        return self.expr.sql if self.expr.sql == self.name else f"{self.expr} AS {self.name}"


@dataclass(frozen=True, order=True)
class AggCall:
    """One aggregate call: ``func`` from :data:`AGGREGATES`, ``arg`` None for COUNT(*)."""

    func: str
    arg: Scalar | None = None

    def __post_init__(self) -> None:
        if self.func not in AGGREGATES:
            raise ValueError(f"unknown aggregate {self.func}")

    def __str__(self) -> str:
        if self.func == "count_star":
            return "COUNT(*)"
        if self.func == "count_distinct":
            return f"COUNT(DISTINCT {self.arg})"
        return f"{self.func.upper()}({self.arg})"


@dataclass(frozen=True, order=True)
class NamedAgg:
    """An aggregate call with the name its result is referred to by."""

    name: str
    call: AggCall

    def __str__(self) -> str:
        return f"{self.call} AS {self.name}"


@dataclass(frozen=True)
class SortKey:
    """One ORDER BY item; NULL placement is explicit (engines disagree on the default)."""

    expr: Scalar
    descending: bool = False
    nulls_first: bool = False

    def __str__(self) -> str:
        return (f"{self.expr} {'DESC' if self.descending else 'ASC'} "
                f"NULLS {'FIRST' if self.nulls_first else 'LAST'}")


class Rel:
    """Base of the operator nodes."""

    def children(self) -> tuple[Rel, ...]:
        """Input operators, in order."""
        child = getattr(self, "child", None)
        return (child,) if child is not None else ()

    def with_child(self, child: Rel) -> Rel:
        """This operator over ``child`` instead (an operator with one input)."""
        node: Any = self
        return replace(node, child=child)  # type: ignore[no-any-return]

    def label(self) -> str:
        """One-line description used by :meth:`pretty`."""
        raise NotImplementedError

    def pretty(self, indent: int = 0) -> str:
        """The tree rooted here, one operator per line."""
        lines = ["  " * indent + self.label()]
        for child in self.children():
            lines.append(child.pretty(indent + 1))
        return "\n".join(lines)

    def walk(self) -> Iterator[Rel]:
        """Yields this node and its descendants, parents first."""
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True)
class Source(Rel):
    """A scan of declared table (or stage) ``table``, reading ``columns``."""

    table: str
    columns: tuple[str, ...]

    @override
    def label(self) -> str:
        return f"Source {self.table}({', '.join(self.columns)})"


@dataclass(frozen=True)
class Filter(Rel):
    """The rows of ``child`` for which ``predicate`` is true."""

    child: Rel
    predicate: Scalar

    @override
    def label(self) -> str:
        return f"Filter {self.predicate}"


@dataclass(frozen=True)
class Aggregate(Rel):
    """GROUP BY ``keys`` (none: one global group) computing ``aggs``."""

    child: Rel
    keys: tuple[Named, ...]
    aggs: tuple[NamedAgg, ...]

    @override
    def label(self) -> str:
        keys = ", ".join(map(str, self.keys)) or "()"
        return f"Aggregate keys=[{keys}] aggs=[{', '.join(map(str, self.aggs))}]"


@dataclass(frozen=True)
class Explode(Rel):
    """Each row of ``child`` repeated by the value of its column ``multiplicity``.

    ``times``, when given, is the repeat count as an expression over ``child``'s columns
    (an ``INTERSECT ALL`` row's ``least(l, r)``); ``multiplicity`` then only names it.
    """

    child: Rel
    multiplicity: str
    times: Scalar | None = None

    @override
    def label(self) -> str:
        return f"Explode ×{self.multiplicity if self.times is None else self.times.sql}"


@dataclass(frozen=True)
class Window(Rel):
    """``child``'s rows, grouped into window partitions by its columns ``partition``.

    The window functions of the Project above read whole partitions, so the partition is
    the lineage key: a batch changes the windows of the partitions it touches only.  Empty
    when some window has no PARTITION BY (one partition: every row).
    """

    child: Rel
    partition: tuple[str, ...]

    @override
    def label(self) -> str:
        return f"Window partition=[{', '.join(self.partition) or '()'}]"


@dataclass(frozen=True)
class Project(Rel):
    """The expressions ``exprs`` of each row of ``child``."""

    child: Rel
    exprs: tuple[Named, ...]

    @override
    def label(self) -> str:
        return f"Project {', '.join(map(str, self.exprs))}"


@dataclass(frozen=True)
class Sort(Rel):
    """``child``'s rows ordered by ``keys``."""

    child: Rel
    keys: tuple[SortKey, ...]

    @override
    def label(self) -> str:
        return f"Sort {', '.join(map(str, self.keys))}"


@dataclass(frozen=True)
class Limit(Rel):
    """At most ``count`` rows of ``child`` (None: all) after skipping ``offset``."""

    child: Rel
    count: int | None
    offset: int = 0

    @override
    def label(self) -> str:
        return f"Limit {self.count if self.count is not None else 'ALL'} OFFSET {self.offset}"


@dataclass(frozen=True)
class JoinInput:
    """One input of a join: its FROM alias, what it reads, and the columns the view reads.

    ``table`` is a declared source, or (``derived``) a stage of the same view whose output
    rows feed this one (a FROM subquery, a CTE, a decorrelated subquery).  In the joined
    relation its columns are spelled ``<alias>__<column>`` (:meth:`flat`), so the passes see
    one source with unique column names.
    """

    alias: str
    table: str
    columns: tuple[str, ...]
    derived: bool = False

    def flat(self, column: str) -> str:
        """The joined relation's name for ``column`` of this input."""
        return f"{self.alias}__{column}"

    @property
    def flat_columns(self) -> tuple[str, ...]:
        """The joined relation's names of the columns the view reads, in order."""
        return tuple(self.flat(c) for c in self.columns)


@dataclass(frozen=True)
class AntiJoin:
    """An input that only removes rows.

    A row of the others passes when no row of ``input`` passing ``filter`` matches it on
    every pair ``(other column, input column)``.

    This is the unmatched part of an outer join (and NOT EXISTS).  It is maintained as a
    join with Z, the set of key values that have no matching row: when a batch makes a key's
    first match arrive (or its last match go), Z loses (or gains) that key.
    """

    input: JoinInput
    pairs: tuple[tuple[str, str], ...]
    filter: Scalar | None = None

    def __str__(self) -> str:
        on = " AND ".join(f"{a} = {b}" for a, b in self.pairs)
        cond = f" AND {self.filter}" if self.filter is not None else ""
        return f"▷ {self.input.table} AS {self.input.alias} ON {on}{cond}"


@dataclass(frozen=True)
class EquiJoin:
    """An inner equi-join of several inputs: ``pairs`` of joined-relation columns must be equal.

    Every input is connected to the others through ``pairs`` (no cross products), except a
    derived input known to hold a single row (a global aggregate), which is crossed.  A
    source may appear under several aliases (a self-join).  ``anti`` inputs keep only rows
    with no match in them (see :class:`AntiJoin`).
    """

    inputs: tuple[JoinInput, ...]
    pairs: tuple[tuple[str, str], ...]
    anti: tuple[AntiJoin, ...] = ()

    @property
    def all_inputs(self) -> tuple[JoinInput, ...]:
        """Inputs whose rows join, then the anti inputs."""
        return self.inputs + tuple(a.input for a in self.anti)

    def input_of(self, flat: str) -> JoinInput:
        """The input a joined-relation column comes from."""
        return next(i for i in self.all_inputs if flat in i.flat_columns)

    def for_table(self, table: str) -> JoinInput | None:
        """The first input reading declared table ``table`` (None: the join does not read it)."""
        return next((i for i in self.inputs if i.table.lower() == table.lower()), None)

    def keys_of(self, alias: str) -> tuple[str, ...]:
        """The joined-relation columns of input ``alias`` that take part in an equality."""
        inp = next(i for i in self.all_inputs if i.alias == alias)
        out: list[str] = []
        for pair in self.pairs + tuple(p for a in self.anti for p in a.pairs):
            out += [c for c in pair if c in inp.flat_columns and c not in out]
        return tuple(out)

    def __str__(self) -> str:
        tables = " ⋈ ".join(f"{i.table} AS {i.alias}" for i in self.inputs)
        on = f" ON {' AND '.join(f'{a} = {b}' for a, b in self.pairs)}" if self.pairs else ""
        anti = "".join(f" {a}" for a in self.anti)
        return f"{tables}{on}{anti}"


@dataclass(frozen=True)
class Branch:
    """One term of a stage's input: a join (or one input), filtered, projected to the stage columns.

    A stage's input relation is the bag union of its branches: one branch for a plain FROM,
    one per SELECT of a UNION ALL, and for an outer join one per matched/unmatched part.
    ``project`` None means the branch's columns are the stage's columns; ``padded`` names
    inputs whose columns are NULL in this branch (the unmatched side of an outer join).
    """

    join: EquiJoin
    where: Scalar | None = None
    project: tuple[Named, ...] | None = None
    padded: tuple[JoinInput, ...] = ()

    def __str__(self) -> str:
        out = str(self.join)
        if self.where is not None:
            out += f" WHERE {self.where}"
        if self.padded:
            out += f" (NULL: {', '.join(i.alias for i in self.padded)})"
        if self.project is not None:
            out += f" → {', '.join(map(str, self.project))}"
        return out


def reads_directly(branches: tuple[Branch, ...]) -> bool:
    """True when a stage's input is one input with no join, anti-join, projection or padding.

    h then runs on that input's batches (or its producer's output changes) as they are.
    """
    if len(branches) != 1:
        return False
    b = branches[0]
    return len(b.join.inputs) == 1 and not b.join.anti and b.project is None and not b.padded

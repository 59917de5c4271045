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
* ``Project(child, exprs)``: the SELECT list.
* ``Sort(child, keys)`` and ``Limit(child, count, offset)``: ORDER BY / LIMIT.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def label(self) -> str:
        """One-line description used by :meth:`pretty`."""
        raise NotImplementedError

    def pretty(self, indent: int = 0) -> str:
        """The tree rooted here, one operator per line."""
        lines = ["  " * indent + self.label()]
        for child in self.children():
            lines.append(child.pretty(indent + 1))
        return "\n".join(lines)

    def walk(self):
        """Yields this node and its descendants, parents first."""
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True)
class Source(Rel):
    table: str
    columns: tuple[str, ...]

    def label(self) -> str:
        return f"Source {self.table}({', '.join(self.columns)})"


@dataclass(frozen=True)
class Filter(Rel):
    child: Rel
    predicate: Scalar

    def label(self) -> str:
        return f"Filter {self.predicate}"


@dataclass(frozen=True)
class Aggregate(Rel):
    child: Rel
    keys: tuple[Named, ...]
    aggs: tuple[NamedAgg, ...]

    def label(self) -> str:
        keys = ", ".join(map(str, self.keys)) or "()"
        return f"Aggregate keys=[{keys}] aggs=[{', '.join(map(str, self.aggs))}]"


@dataclass(frozen=True)
class Explode(Rel):
    child: Rel
    multiplicity: str

    def label(self) -> str:
        return f"Explode ×{self.multiplicity}"


@dataclass(frozen=True)
class Project(Rel):
    child: Rel
    exprs: tuple[Named, ...]

    def label(self) -> str:
        return f"Project {', '.join(map(str, self.exprs))}"


@dataclass(frozen=True)
class Sort(Rel):
    child: Rel
    keys: tuple[SortKey, ...]

    def label(self) -> str:
        return f"Sort {', '.join(map(str, self.keys))}"


@dataclass(frozen=True)
class Limit(Rel):
    child: Rel
    count: int | None
    offset: int = 0

    def label(self) -> str:
        return f"Limit {self.count if self.count is not None else 'ALL'} OFFSET {self.offset}"


@dataclass(frozen=True)
class JoinInput:
    """One source of an equi-join: its FROM alias, declared table and the columns the view reads.

    In the joined relation its columns are spelled ``<alias>__<column>`` (:meth:`flat`), so
    the passes see one source with unique column names.
    """

    alias: str
    table: str
    columns: tuple[str, ...]

    def flat(self, column: str) -> str:
        """The joined relation's name for ``column`` of this input."""
        return f"{self.alias}__{column}"

    @property
    def flat_columns(self) -> tuple[str, ...]:
        return tuple(self.flat(c) for c in self.columns)


@dataclass(frozen=True)
class EquiJoin:
    """An inner equi-join of several sources: ``pairs`` of joined-relation columns must be equal.

    Every input is connected to the others through ``pairs`` (no cross products), and each
    declared table appears once (no self-joins).
    """

    inputs: tuple[JoinInput, ...]
    pairs: tuple[tuple[str, str], ...]

    def input_of(self, flat: str) -> JoinInput:
        """The input a joined-relation column comes from."""
        return next(i for i in self.inputs if flat in i.flat_columns)

    def for_table(self, table: str) -> JoinInput | None:
        """The input reading declared table ``table`` (None: the join does not read it)."""
        return next((i for i in self.inputs if i.table.lower() == table.lower()), None)

    def keys_of(self, alias: str) -> tuple[str, ...]:
        """The joined-relation columns of input ``alias`` that take part in an equality."""
        inp = next(i for i in self.inputs if i.alias == alias)
        out: list[str] = []
        for pair in self.pairs:
            out += [c for c in pair if c in inp.flat_columns and c not in out]
        return tuple(out)

    def __str__(self) -> str:
        tables = " ⋈ ".join(f"{i.table} AS {i.alias}" for i in self.inputs)
        return f"{tables} ON {' AND '.join(f'{a} = {b}' for a, b in self.pairs)}"

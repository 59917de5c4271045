"""The values the front-end steps hand along, and how they report a refused construct.

The front end works on sqlglot trees, which are mutable: like sqlglot's optimizer rules, a
step may rewrite the tree it is given in place and hands it on in a new state value
(``dataclasses.replace``); a state is never used again once a step has taken it.

* :class:`Scope`: the view being translated; makes located errors that name it.
* :class:`Query`: the view's whole SELECT on its way through :data:`~incr.compiler.frontend.FRONTEND`.
* :class:`Block`: one query block (one SELECT) on its way through
  :data:`~incr.compiler.frontend.block.BLOCK`, ending as a :class:`StageTranslation`.
* :class:`StageTranslation` / :class:`Translation`: what the front end produces, the IR of
  each stage, producers first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from incr.compiler.ir import Branch, Rel
from incr.compiler.program import Column, Program, TableDecl, ViewDecl, location_of
from incr.errors import CompileError, Location, NotIncrementalizableError

#: The name a UNION stage's input relation goes by.
UNION = "unioned"


@dataclass(frozen=True)
class Scope:
    """The view under translation: every error names it and points into its program file."""

    view: ViewDecl
    program: Program

    @property
    def location(self) -> Location:
        """The view's own location: for errors with no better position, and derived tables."""
        return self.view.location

    def loc(self, node: exp.Expr | None) -> Location:
        """The position of ``node`` (or its first positioned descendant), else the view's."""
        return location_of(node, self.location) if node is not None else self.location

    def refuse(self, construct: str, why: str, node: exp.Expr | None) -> NotIncrementalizableError:
        """The error for a construct outside the maintained class: names it and says why."""
        return NotIncrementalizableError(
            f"view {self.view.name}: {construct} is not supported: {why}", self.loc(node))

    def error(self, message: str, node: exp.Expr | None) -> CompileError:
        """The error for a query that is wrong whatever the engine (unknown names, ...)."""
        return CompileError(f"view {self.view.name}: {message}", self.loc(node))


@dataclass(frozen=True)
class StageTranslation:
    """The IR of one stage plus what later stages need to know about its input.

    ``source`` is the stage's input relation as a table: the declared source of a direct
    stage, or the joined (or unioned) columns otherwise.  ``single_row`` marks a global
    aggregate, which other stages may cross-join (it always holds at most one row).
    """

    name: str
    rel: Rel
    source: TableDecl
    branches: tuple[Branch, ...]
    aggregated: bool
    single_row: bool = False
    output: tuple[Column, ...] = ()


@dataclass(frozen=True)
class Translation:
    """Every stage of a view, producers first; the last is the view's own."""

    stages: tuple[StageTranslation, ...]

    @property
    def top(self) -> StageTranslation:
        """The view's own stage (the last: producers come first)."""
        return self.stages[-1]

    @property
    def rel(self) -> Rel:
        """The IR of the view's own stage."""
        return self.top.rel

    @property
    def source(self) -> TableDecl:
        """The (pseudo-)source the view's own stage reads."""
        return self.top.source


@dataclass(frozen=True)
class Query:
    """A view's SELECT on its way through the front-end passes.

    ``output_names`` are the view's column names as written, recorded by ``decorrelate``
    before sqlglot's rules rename them (None when the query has nothing nested);
    ``stages`` is filled by ``split_stages``.
    """

    scope: Scope
    tree: exp.Expr
    output_names: tuple[str, ...] | None = None
    stages: tuple[StageTranslation, ...] | None = None

    @property
    def program(self) -> Program:
        """The program the view belongs to."""
        return self.scope.program


@dataclass(frozen=True)
class UnionInput:
    """The input of a UNION's SELECT: the unioned relation and one branch per SELECT."""

    source: TableDecl
    branches: tuple[Branch, ...]


@dataclass(frozen=True)
class Block:
    """One query block (a SELECT over tables and earlier stages) on its way to a stage.

    ``derived`` maps the stage names this block reads (its FROM items that were subqueries
    or CTEs) to their translations.  ``union`` is set for the SELECT over a UNION's branches:
    its input relation and branches are given, not read from FROM.  ``split_joins`` fills
    ``source``, ``branches`` and (one input, no join) ``alias``; ``lower_block`` fills
    ``stage``.
    """

    scope: Scope
    tree: exp.Select
    name: str
    derived: Mapping[str, StageTranslation]
    union: UnionInput | None = None
    alias: str | None = None
    source: TableDecl | None = None
    branches: tuple[Branch, ...] = ()
    stage: StageTranslation | None = None

    @property
    def table(self) -> TableDecl:
        """The relation the block's columns are resolved against (after ``split_joins``)."""
        assert self.source is not None, "split_joins has not run"
        return self.source

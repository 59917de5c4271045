"""Scalar expressions inside the IR: immutable, hashable, printable.

A :class:`Scalar` is canonical SQL text (DuckDB spelling, the project's reading dialect).
Keeping text rather than sqlglot trees makes the IR frozen and its hash stable, which the
plan fingerprint relies on; the parsed tree is cached for the passes that look inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp

from incr.compiler.dialect import CANONICAL_DIALECT, render_expression


@lru_cache(maxsize=4096)
def _parse(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read=CANONICAL_DIALECT)


@lru_cache(maxsize=8192)
def _render(sql: str, dialect: str) -> str:
    # Rendered once per text and dialect: the runtime renders every h and answer of every
    # view for every batch, and a sqlglot copy and generate costs milliseconds each.
    return render_expression(_parse(sql).copy(), dialect)


@dataclass(frozen=True, order=True)
class Scalar:
    """A scalar SQL expression over named columns."""

    sql: str

    @staticmethod
    def of(node: exp.Expr) -> Scalar:
        """Canonical Scalar for a sqlglot expression."""
        return Scalar(node.sql(dialect=CANONICAL_DIALECT))

    @staticmethod
    def column(name: str) -> Scalar:
        """A reference to column ``name``."""
        return Scalar.of(exp.column(name, quoted=not name.isidentifier() or name.lower() != name))

    def tree(self) -> exp.Expr:
        """A fresh sqlglot tree for this expression (safe to mutate)."""
        return _parse(self.sql).copy()

    def columns(self) -> frozenset[str]:
        """Names of the columns the expression reads."""
        return frozenset(c.name for c in _parse(self.sql).find_all(exp.Column))

    def substitute(self, mapping: Mapping[str, Scalar]) -> Scalar:
        """Replaces column references by expressions (names not in ``mapping`` stay)."""

        def swap(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.name in mapping:
                replacement = mapping[node.name].tree()
                if isinstance(replacement, (exp.Column, exp.Literal, exp.Func, exp.Paren)):
                    return replacement
                return exp.paren(replacement, copy=False)
            return node

        return Scalar.of(self.tree().transform(swap, copy=False))

    def qualified(self, alias: str) -> Scalar:
        """The expression with each column it reads taken from the relation ``alias``."""
        return self.substitute({c: Scalar.of(exp.column(c, table=alias, quoted=True))
                                for c in self.columns()})

    def render(self, dialect: str) -> str:
        """The expression as SQL text for ``dialect`` (see :mod:`incr.compiler.dialect`)."""
        return _render(self.sql, dialect)

    def __str__(self) -> str:
        return self.sql

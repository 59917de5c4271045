"""Small questions asked of sqlglot trees by several front-end steps.

They live apart so that each step's module holds only its own concept; none of them
changes a tree.
"""

from __future__ import annotations

from sqlglot import exp


def conjuncts(node: exp.Expr) -> list[exp.Expr]:
    """The AND-ed parts of a condition (parentheses around an AND are looked through)."""
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def contains_aggregate(node: exp.Expr) -> bool:
    """True when an aggregate call appears anywhere in ``node``.

    A window's function (``SUM(x) OVER (...)``) is not one: it aggregates no group.
    """
    return any(isinstance(n, exp.AggFunc) and not window_function(n) for n in node.walk())


def window_function(node: exp.Expr) -> bool:
    """True when ``node`` is the function of a window (``SUM(x)`` in ``SUM(x) OVER (...)``)."""
    child, parent = node, node.parent
    while isinstance(parent, (exp.IgnoreNulls, exp.RespectNulls)):
        child, parent = parent, parent.parent
    return isinstance(parent, exp.Window) and child.arg_key == "this"


def func_name(node: exp.Expr) -> str:
    """A function's name as the user would recognise it, lower case (sqlglot's for known ones)."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return str(node.sql_name()).lower()
    return str(node.key).lower()


def is_star(node: exp.Expr) -> bool:
    """True for ``*`` and ``t.*`` in a SELECT list."""
    return isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star))


def unqualified(node: exp.Expr, keep_quotes: bool = True) -> exp.Expr:
    """A copy of ``node`` with every column by its bare name: ``t.a`` becomes ``a``.

    With ``keep_quotes`` False, ``"a"`` becomes ``a`` too: a form to compare expressions by.
    """
    bare = node.copy()
    for col in list(bare.find_all(exp.Column)):
        col.replace(exp.column(col.name, quoted=keep_quotes and col.this.quoted))
    return bare

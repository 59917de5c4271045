"""Names the view's unaliased output columns as DuckDB names them.

A user porting dashboards from DuckDB reads ``SELECT k, COUNT(*), SUM(x) FROM t GROUP BY k``
back as columns ``k``, ``count_star()`` and ``sum(x)``: DuckDB names an unaliased item by
printing its parsed expression.  This step gives every unaliased, non-column SELECT item
an alias spelled that way, in the view's output SELECT and in every CTE and subquery alike
(DuckDB names them all, and a query may refer to ``"sum(x)"`` of a CTE), so the answer
table, ``explain`` and downstream views all use the names the dashboards already use.
Duplicates get DuckDB's ``_1``, ``_2`` suffixes, as its CREATE TABLE AS gives them.

The spelling follows DuckDB's printer for the constructs a dashboard writes unaliased:
columns, literals, arithmetic and comparison operators, AND/OR/NOT, IS [NOT] NULL, IN,
BETWEEN, LIKE, CAST, CASE and IF, COALESCE, aggregates (with DISTINCT and FILTER), window
functions and function calls, with function names as the user spelled them (lowercased).
Anything else is printed by sqlglot in DuckDB's dialect, which agrees with DuckDB for most
calls.

The answer tables hold these names as they are (Delta accepts any character in a column
name); the SQL the runtime writes back-quotes every identifier.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from incr.compiler.dialect import CANONICAL_DIALECT
from incr.compiler.frontend.query import Query
from incr.compiler.frontend.resolve_names import unique
from incr.compiler.frontend.trees import func_name, is_star

#: DuckDB's reserved and unreserved keywords (``duckdb_keywords()``): it double-quotes a
#: column or function name that is one of them.
_KEYWORD_WORDS = """
abort absolute access action add admin after aggregate all also alter always analyse analyze and
any array as asc assertion assignment asymmetric attach attribute backward before begin both
cache call called cascade cascaded case cast catalog centuries century chain characteristics
check checkpoint class close cluster collate column comment comments commit committed
compression configuration conflict connection constraint constraints content continue conversion
copy cost create csv cube current cursor cycle data database day days deallocate decade decades
declare default defaults deferrable deferred definer delete delimiter delimiters depends desc
describe detach dictionary disable discard distinct do document domain double drop each else
enable encoding encrypted end enum error escape event except exclude excluding exclusive execute
explain export export_state extension extensions external false family fetch filter first
following for force foreign forward from function functions global grant granted group groups
handler having header hold hour hours identity if ignore immediate immutable implicit import in
include including increment index indexes inherit inherits initially inline input insensitive
insert install instead intersect into invoker isolation json key label language large last
lateral leading leakproof level limit listen load local location lock locked logged macro
mapping match matched materialized maxvalue merge method microsecond microseconds millennia
millennium millisecond milliseconds minute minutes minvalue mode month months move name names
new next no not nothing notify nowait null nulls object of off offset oids old on only operator
option options or order ordinality others over overriding owned owner parallel parser partial
partition partitioned passing password percent persistent pivot pivot_longer pivot_wider placing
plans policy pragma preceding prepare prepared preserve primary prior privileges procedural
procedure program publication qualify quarter quarters quote range read reassign recheck
recursive ref references referencing refresh reindex relative release rename repeatable replace
replica reset respect restart restrict returning returns revoke role rollback rollup rows rule
sample savepoint schema schemas scope scroll search second seconds secret security select
sequence sequences serializable server session set sets share show simple skip snapshot some
sorted source sql stable standalone start statement statistics stdin stdout storage stored
strict strip subscription summarize symmetric sysid system table tables tablespace target temp
template temporary text then ties to trailing transaction transform trigger true truncate
trusted type types unbounded uncommitted unencrypted union unique unknown unlisten unlogged
unpivot until update use user using vacuum valid validate validator value variable variadic
varying version view views virtual volatile week weeks when where whitespace window with within
without work wrapper write xml year years yes zone
"""
_KEYWORDS = frozenset(_KEYWORD_WORDS.split())
#: Keywords of the other categories that DuckDB prints quoted as function names.
_QUOTED_FUNCTIONS = frozenset({"nullif", "left", "right", "glob", "map", "ilike", "like"})
#: Functions DuckDB prints qualified by their schema: ``main."substring"(s, 1, 2)``.
_SCHEMA_FUNCTIONS = frozenset({"position", "substring", "trim", "row", "overlay"})

#: Every function name the canonical dialect's parser knows.
_DIALECT = Dialect.get_or_raise(CANONICAL_DIALECT)
_FUNCTIONS = frozenset({*_DIALECT.parser_class.FUNCTIONS, *_DIALECT.parser_class.FUNCTION_PARSERS})
#: Names a sub-expression (the recursion of :func:`_name` with its spelling bound).
Namer = Callable[[exp.Expr], str]
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DISTINCT = re.compile(r"DISTINCT\s+", re.IGNORECASE)
_BINARY: dict[type[exp.Expr], str] = {
    exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%", exp.IntDiv: "//",
    exp.DPipe: "||", exp.BitwiseAnd: "&", exp.BitwiseOr: "|", exp.BitwiseXor: "xor",
    exp.BitwiseLeftShift: "<<", exp.BitwiseRightShift: ">>", exp.Pow: "^", exp.EQ: "=",
    exp.NEQ: "!=", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.Like: "~~",
    exp.ILike: "~~*", exp.NullSafeEQ: "IS NOT DISTINCT FROM", exp.NullSafeNEQ: "IS DISTINCT FROM"}
#: ``NOT (a > b)`` is printed as the opposite comparison.
_OPPOSITE: dict[type[exp.Expr], str] = {
    exp.EQ: "!=", exp.NEQ: "=", exp.GT: "<=", exp.GTE: "<", exp.LT: ">=", exp.LTE: ">",
    exp.Like: "!~~", exp.ILike: "!~~*"}
#: Type names DuckDB prints bare; every other type name is printed double-quoted.
_BARE_TYPES = {"INT": "INTEGER", "INTEGER": "INTEGER", "BIGINT": "BIGINT", "SMALLINT": "SMALLINT",
               "VARCHAR": "VARCHAR", "TEXT": "VARCHAR", "CHAR": "VARCHAR", "DECIMAL": "DECIMAL",
               "TIME": "TIME", "INTERVAL": "INTERVAL", "TIMESTAMP": "TIMESTAMP",
               "BOOLEAN": "BOOLEAN", "FLOAT": "FLOAT", "REAL": "FLOAT"}


def name_outputs(q: Query) -> Query:
    """Aliases every SELECT's unaliased items with their DuckDB names; ``q`` otherwise as is."""
    spelling = Spelling(q.scope.view.select, q.scope.view.select_offset)
    for select in list(q.tree.find_all(exp.Select)):
        _name_items(select, spelling)
    return q


def _name_items(select: exp.Select, spelling: Spelling) -> None:
    used: set[str] = set()
    for item in list(select.expressions):
        if is_star(item):
            continue
        if isinstance(item, (exp.Alias, exp.Column)):
            used.add((item.alias if isinstance(item, exp.Alias) else item.name).lower())
            continue
        item.replace(exp.alias_(item.copy(), unique(duckdb_name(item, spelling), used), quoted=True))


@dataclass(frozen=True)
class Spelling:
    """The text a tree was parsed from: gives back a call's name and arguments as written.

    sqlglot normalizes calls (``var_samp`` is ``Variance``, ``date_trunc``'s arguments are
    reordered); DuckDB prints them as written.  The parser keeps the position of a call's
    name, so the call can be read back from the text: its name, then its arguments split
    at the top-level commas.

    Attributes:
        text: the text parsed.
        offset: the position of the text's first character in the node positions.
    """

    text: str
    offset: int = 0

    def call(self, node: exp.Expr) -> tuple[str, list[str], bool] | None:
        """``(name, argument texts, DISTINCT)`` of a call written ``name(args)``, or None."""
        meta = node.meta if node._meta else None
        if not meta or "start" not in meta:
            return None
        at = meta["start"] - self.offset
        if at < 0 or at >= len(self.text):
            return None
        try:
            tokens = _DIALECT.tokenize(self.text[at:])
        except Exception:  # noqa: BLE001 - an unreadable tail: fall back to the tree
            return None
        if len(tokens) < 3 or tokens[1].token_type != TokenType.L_PAREN:
            return None
        name = self.text[at + tokens[0].start: at + tokens[0].end + 1]
        if not _PLAIN.fullmatch(name) or not self._names(node, name):
            return None
        args: list[str] = []
        depth, first = 0, 2
        for i, token in enumerate(tokens[1:], start=1):
            kind = token.token_type
            if kind in (TokenType.L_PAREN, TokenType.L_BRACKET):
                depth += 1
            elif kind in (TokenType.R_PAREN, TokenType.R_BRACKET):
                depth -= 1
            elif depth == 1 and kind == TokenType.ORDER_BY:
                return None
            if depth == 0 or (depth == 1 and kind == TokenType.COMMA):
                if i > first:
                    args.append(self.text[at + tokens[first].start: at + tokens[i - 1].end + 1])
                first = i + 1
                if depth == 0:
                    break
        distinct = bool(args) and _DISTINCT.match(args[0]) is not None
        if distinct:
            args[0] = _DISTINCT.sub("", args[0], count=1)
        return name, args, distinct

    @staticmethod
    def _names(node: exp.Expr, spelled: str) -> bool:
        """True when ``spelled`` can be the name ``node`` was parsed from."""
        if isinstance(node, exp.Anonymous):
            return spelled.lower() == str(node.this).lower()
        return spelled.upper() in _FUNCTIONS


def duckdb_name(node: exp.Expr, spelling: Spelling | None = None) -> str:
    """The name DuckDB gives an unaliased SELECT item ``node``.

    Args:
        node: the item's expression.
        spelling: the text the item was parsed from, to read calls back as written.
    """
    if isinstance(node, exp.Column):
        return node.name
    return _name(node, spelling)


def _name(node: exp.Expr, spelling: Spelling | None) -> str:
    def name(n: exp.Expr) -> str:
        return _name(n, spelling)

    if isinstance(node, exp.Paren):
        return name(node.this)
    if isinstance(node, exp.Column):
        return ".".join(_ident(p.name) for p in node.parts)
    if isinstance(node, exp.Literal):
        text = str(node.this)
        return "'" + text.replace("'", "''") + "'" if node.is_string else text
    if isinstance(node, exp.Null):
        return "NULL"
    if isinstance(node, exp.Boolean):
        return f"CAST('{'t' if node.this else 'f'}' AS BOOLEAN)"
    if isinstance(node, exp.Neg):
        inner = node.this
        if isinstance(inner, exp.Literal) and not inner.is_string:
            return f"-{inner.this}"
        return f"-({name(inner)})"
    if isinstance(node, (exp.And, exp.Or)):
        word = "AND" if isinstance(node, exp.And) else "OR"
        return "(" + f" {word} ".join(name(p) for p in node.flatten()) + ")"
    if isinstance(node, exp.Not):
        return _negated(node.this, name)
    if isinstance(node, exp.Is):
        return f"({name(node.this)} IS {name(node.expression)})"
    if isinstance(node, exp.In) and node.expressions:
        return _in_list(node, "IN", name)
    if isinstance(node, exp.Between):
        return f"({name(node.this)} BETWEEN {name(node.args['low'])} AND {name(node.args['high'])})"
    if type(node) is exp.Cast and not node.args.get("format"):
        return f"CAST({name(node.this)} AS {_type(node.to)})"
    if isinstance(node, (exp.Case, exp.If)):
        return _case(node, name)
    if isinstance(node, exp.Coalesce):
        return f"COALESCE({', '.join(name(e) for e in [node.this, *node.expressions])})"
    if isinstance(node, exp.Filter):
        return f"{name(node.this)} FILTER (WHERE {name(node.expression.this)})"
    if isinstance(node, exp.Window) and not node.args.get("alias"):
        return _window(node, name)
    if isinstance(node, exp.Count) and (node.this is None or isinstance(node.this, exp.Star)):
        return "count_star()"
    if isinstance(node, exp.Extract):
        return f"main.date_part('{node.this.name.lower()}', {name(node.expression)})"
    if isinstance(node, exp.Grouping):
        return f"GROUPING({', '.join(name(e) for e in node.expressions)})"
    if isinstance(node, exp.IgnoreNulls):
        return name(node.this)
    written = spelling.call(node) if spelling is not None else None
    if written is not None:
        return _written_call(*written)
    if type(node) in _BINARY:
        if node.args.get("negate") and type(node) in _OPPOSITE:
            return f"({name(node.this)} {_OPPOSITE[type(node)]} {name(node.expression)})"
        return f"({name(node.this)} {_BINARY[type(node)]} {name(node.expression)})"
    if isinstance(node, exp.Func):
        return _call(node, name)
    return node.sql("duckdb")


def _negated(inner: exp.Expr, name: Namer) -> str:
    """``NOT x`` as DuckDB prints it: comparisons flipped, IS/IN/LIKE negated in place."""
    if isinstance(inner, exp.Paren):
        inner = inner.this
    if type(inner) in _OPPOSITE and type(inner) not in (exp.Like, exp.ILike):
        return f"({name(inner.this)} {_OPPOSITE[type(inner)]} {name(inner.expression)})"
    if isinstance(inner, exp.Is):
        return f"({name(inner.this)} IS NOT {name(inner.expression)})"
    if isinstance(inner, exp.In) and inner.expressions:
        return _in_list(inner, "NOT IN", name)
    return f"(NOT {name(inner)})"


def _case(node: exp.Expr, name: Namer) -> str:
    """CASE (and IF) as DuckDB prints it: ``CASE  WHEN ((c)) THEN (v) ELSE e END``."""
    if isinstance(node, exp.If):
        whens = [(name(node.this), node.args.get("true"))]
        default = node.args.get("false")
    else:
        subject = node.this
        whens = [(f"({name(subject)} = {name(w.this)})" if subject is not None else name(w.this),
                  w.args.get("true")) for w in node.args.get("ifs") or []]
        default = node.args.get("default")
    parts = "".join(f" WHEN ({cond}) THEN ({name(value) if value is not None else 'NULL'})"
                    for cond, value in whens)
    return f"CASE {parts} ELSE {name(default) if default is not None else 'NULL'} END"


def _window(node: exp.Window, name: Namer) -> str:
    """``f(args) OVER (PARTITION BY .. ORDER BY .. frame)``; ``COUNT(*)`` is ``count()`` there."""
    func = node.this
    head = "count()" if isinstance(func, exp.Count) and isinstance(func.this, exp.Star) else name(func)
    parts = []
    if node.args.get("partition_by"):
        parts.append("PARTITION BY " + ", ".join(name(p) for p in node.args["partition_by"]))
    if node.args.get("order"):
        parts.append("ORDER BY " + ", ".join(_ordered(o, name) for o in node.args["order"].expressions))
    spec = node.args.get("spec")
    if spec is not None and str(spec.args.get("kind", "")).upper() == "ROWS":
        parts.append(spec.sql("duckdb").upper())
    return f"{head} OVER ({' '.join(parts)})"


def _ordered(o: exp.Expr, name: Namer) -> str:
    if not isinstance(o, exp.Ordered):
        return name(o)
    out = name(o.this)
    desc = o.args.get("desc")
    if desc is not None:
        out += " DESC" if desc else " ASC"
    # DuckDB sorts NULLs last in both directions; it prints only an order that differs.
    if o.args.get("nulls_first"):
        out += " NULLS FIRST"
    return out


def _function(spelled: str) -> str:
    """A function name as DuckDB prints it: lowercased, quoted if a keyword."""
    fn = spelled.lower()
    if fn in _SCHEMA_FUNCTIONS:
        return f'main."{fn}"'
    if fn in _KEYWORDS or fn in _QUOTED_FUNCTIONS:
        return f'"{fn}"'
    return fn


def _written_call(spelled: str, args: list[str], distinct: bool) -> str:
    """A call read back from the text: each argument parsed and named on its own."""
    names = []
    for arg in args:
        try:
            tree = sqlglot.parse_one(arg, read=CANONICAL_DIALECT)
        except SqlglotError:
            names.append(arg)
            continue
        names.append(_name(tree, Spelling(arg)))
    return _call_text(spelled, names, distinct)


def _call(node: exp.Func, name: Namer) -> str:
    """A call with no text to read back: the name and arguments as sqlglot holds them."""
    args: list[str] = []
    distinct = False
    values = node.expressions if isinstance(node, exp.Anonymous) else [
        v for key in node.arg_types for v in _as_list(node.args.get(key))]
    for value in values:
        if isinstance(value, exp.Distinct):
            distinct = True
            args.extend(name(e) for e in value.expressions)
        elif isinstance(value, exp.Expr):
            args.append(name(value))
    return _call_text(func_name(node), args, distinct)


def _call_text(spelled: str, args: list[str], distinct: bool) -> str:
    """``name(DISTINCT? a, b)`` with the name as DuckDB prints it."""
    return f"{_function(spelled)}({'DISTINCT ' if distinct else ''}{', '.join(args)})"


def _in_list(node: exp.In, word: str, name: Namer) -> str:
    """``(x IN (a, b))`` (``word`` is IN or NOT IN)."""
    return f"({name(node.this)} {word} ({', '.join(name(e) for e in node.expressions)}))"


def _as_list(value: object) -> list:
    if value is None or isinstance(value, bool):
        return []
    return list(value) if isinstance(value, list) else [value]


def _ident(part: str) -> str:
    """A column name part as DuckDB prints it: bare unless it needs quotes or is a keyword."""
    if _PLAIN.fullmatch(part) and part.lower() not in _KEYWORDS:
        return part
    return '"' + part.replace('"', '""') + '"'


def _type(to: exp.DataType) -> str:
    """A CAST's target type as DuckDB prints it."""
    base = to.this.name if hasattr(to.this, "name") else str(to.this)
    bare = _BARE_TYPES.get(base.upper())
    params = [e.sql("duckdb") for e in to.expressions]
    if bare is None:
        spelled = to.sql("duckdb").upper()
        return spelled if params else f'"{spelled}"'
    return f"{bare}({', '.join(params)})" if params else bare

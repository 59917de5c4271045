"""Calls whose meaning depends on their operand's type, written as DuckDB computes them.

The program's SQL means what DuckDB computes, and for a few calls DuckDB and Spark agree on
some operand types only.  Neither the compiler's Spark text nor the runtime knows the types
when the text is written (:func:`incr.compiler.dialect.render_expression` sees one
expression), so this step types the view once, as sqlglot infers it from the declared
sources, and rewrites each such call into a form that DuckDB computes to the same value
and whose Spark text takes DuckDB's value too:

- ``sign`` of a DOUBLE NaN is 0 in DuckDB (NaN in Spark), and ``round(x, n)`` of a DOUBLE
  with ``n`` below 0 is 0 of NaN and of either infinity (Spark keeps them).
- ``round(x, n)`` of a DOUBLE, ``n`` from 1 to 15: DuckDB multiplies by ``10^n``, rounds
  half away from zero and divides back, in floating point (``round(1.005, 2)`` is 1.0);
  Spark rounds the decimal the DOUBLE prints as (1.01).  Written ``round(x * 10^n) / 10^n``,
  which both compute alike.  The same for a cast of a DOUBLE to a DECIMAL with a scale.
- ``floor``, ``ceil`` and ``trunc`` of a DOUBLE are DOUBLEs in DuckDB and BIGINTs in Spark,
  which saturate beyond 2^63: written as the whole number cast back to DOUBLE below 2^52
  (beyond it, every DOUBLE is whole already).
- ``trunc(x, n)`` cuts to ``n`` decimals in DuckDB, and sqlglot wrote Spark's cast to
  BIGINT, dropping ``n``.  Of a DOUBLE, DuckDB cuts ``x * 10^n`` and divides back in
  floating point (``x / 10^-n`` and multiplies back for a negative ``n``; ``x`` itself
  where that overflows); of a DECIMAL or an integer, written ``x - x % 10^-n``, exact.
- A DOUBLE or FLOAT cast to an integer type rounds half to even in DuckDB and truncates in
  Spark; a DECIMAL rounds half away from zero in DuckDB and truncates in Spark.  The operand
  is rounded first (``round_even(x, 0)``, Spark's ``bround``; ``round(x)``).
- Text cast to an integer type: DuckDB reads a fraction or an exponent, rounding half away
  from zero (``'12.5'`` is 13, ``'3.0'`` 3), where Spark's cast fails (TRY_CAST: NULL);
  text of ASCII is cast through a DECIMAL(38, 0), which both read alike.
- A DATE minus a DATE is a count of days in DuckDB and an INTERVAL in Spark: written
  ``date_diff('day', b, a)``.
- ``a // b`` of a DOUBLE, FLOAT or DECIMAL is a division in DuckDB (``7.5 // 2`` is 3.75),
  Spark's DIV takes integers only: written ``a / b``.
- ``epoch_ms`` of a TIMESTAMP or DATE is its milliseconds since the epoch in DuckDB (of a
  number, the TIMESTAMP that many milliseconds after it, which sqlglot reads it as):
  written ``epoch_us(x) // 1000``, cut toward zero as DuckDB's is.
- A TIMESTAMP minus a TIMESTAMP is an INTERVAL (a duration).  Its seconds (``epoch``,
  ``extract(epoch FROM ...)``, ``date_part('epoch', ...)``), milliseconds (``epoch_ms``)
  or microseconds (``epoch_us``) are the difference of the two times' microseconds, which
  Spark computes too (it cast the interval to a TIMESTAMP, and refused it).

A DOUBLE or FLOAT cast to text or concatenated to text is refused: DuckDB writes 12345678.0
and 1e+16 where Spark writes 1.2345678E7 and 1.0E16, and no Spark function writes DuckDB's.
So is a duration anywhere but compared, or taken apart by one of the calls above or by
``extract``: incr keeps state and answers in Delta tables, which have no interval type.

A view sqlglot cannot type (a name it cannot resolve) is left as written: its calls run as
before, Spark's way.  An operand of another type is left alone too.
"""

from __future__ import annotations

from decimal import Decimal

from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from incr.compiler.dialect import CANONICAL_DIALECT, integer_literal
from incr.compiler.frontend.query import Query, Scope

#: The calls this step may rewrite.
_TYPED = (exp.Round, exp.Sign, exp.Floor, exp.Ceil, exp.Trunc, exp.Cast, exp.TryCast, exp.Sub,
          exp.DPipe, exp.Concat, exp.ConcatWs, exp.IntDiv, exp.UnixToTime, exp.TimeToUnix,
          exp.Extract, exp.Anonymous)
#: Every DOUBLE of at least this magnitude is a whole number (2^52).
_WHOLE = 4_503_599_627_370_496
#: The place of a call in the view's tree, kept in the node's meta across sqlglot's copies.
_MARK = "incr_typed"

_DOUBLE, _FLOAT, _DATE = exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT, exp.DataType.Type.DATE
_INTEGRAL = exp.DataType.INTEGER_TYPES
_TIMES = (_DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ)
#: The calls of a duration that give a number (besides ``extract``), by the name sqlglot
#: keeps for them: ``date_part(part, x)``, ``epoch_us(x)``.
_OF_A_DURATION = ("date_part", "datepart", "epoch_us")


def spell_by_type(q: Query) -> Query:
    """Rewrites, in place, the typed calls of the view (see the module's docstring).

    Raises:
        CompileError: for a DOUBLE written as text, which the engines write otherwise.
    """
    program = q.scope.program
    schema: dict[str, object] = {t.name: {c.name: str(c.type) for c in t.columns}
                                 for t in program.tables}
    twins = _typed_twins(q.tree, schema)
    for node, typed in twins:
        _refuse_text_of_a_double(q.scope, node, typed)
        _refuse_a_kept_duration(q.scope, node, typed)
    for node, typed in reversed(twins):  # inner calls first: an outer one copies them rewritten
        spelled = _spelled(node, typed)
        if spelled is not None:
            node.replace(spelled)
    return q


def _typed_twins(tree: exp.Expr, schema: dict[str, object]) -> list[tuple[exp.Expr, exp.Expr]]:
    """Each typed call of ``tree`` with its twin in a copy sqlglot has typed, outer first.

    sqlglot types a qualified copy of the tree; each call is found again there by a mark
    set on the copy before qualifying it.  A call qualifying copied (an alias expanded)
    is taken once; a view sqlglot cannot qualify has none.
    """
    if tree.find(*_TYPED) is None:  # nothing to type: sqlglot's qualifying costs ~3 ms
        return []
    copy = tree.copy()
    calls: dict[int, exp.Expr] = {}
    for i, (node, twin) in enumerate(zip(tree.walk(bfs=False), copy.walk(bfs=False))):
        if isinstance(node, _TYPED):
            twin.meta[_MARK] = i
            calls[i] = node
    try:
        qualified = qualify(copy, schema=schema, dialect=CANONICAL_DIALECT,
                            validate_qualify_columns=False, quote_identifiers=False)
        annotate_types(qualified, schema=schema, dialect=CANONICAL_DIALECT)
    except Exception:  # noqa: BLE001 - typing is best effort: an untyped view keeps its calls
        return []
    found: dict[int, exp.Expr] = {}
    for twin in qualified.walk():
        mark = twin.meta.get(_MARK)
        if mark is not None and mark not in found:
            found[mark] = twin
    return [(calls[i], twin) for i, twin in sorted(found.items())]


def _type(node: object) -> exp.DataType | None:
    """The type sqlglot gave ``node``, if it is an expression it typed."""
    return node.type if isinstance(node, exp.Expr) and node.type is not None else None


def _refuse_text_of_a_double(scope: Scope, node: exp.Expr, typed: exp.Expr) -> None:
    """Refuses a DOUBLE or FLOAT cast to text or concatenated to text.

    DuckDB writes 12345678.0 and 1e+16 where Spark (Java) writes 1.2345678E7 and 1.0E16.
    """
    if isinstance(typed, (exp.Cast, exp.TryCast)) and typed.to.is_type(*exp.DataType.TEXT_TYPES):
        pairs = [(node.this, typed.this)]
    elif isinstance(typed, exp.DPipe):
        pairs = [(node.this, typed.this), (node.expression, typed.expression)]
    elif isinstance(typed, (exp.Concat, exp.ConcatWs)):
        pairs = list(zip(node.expressions, typed.expressions))
    else:
        return
    for written, operand in pairs:
        t = _type(operand)
        if t is not None and t.is_type(_DOUBLE, _FLOAT):
            x = written.sql(dialect=CANONICAL_DIALECT)
            name = "DOUBLE" if t.is_type(_DOUBLE) else "FLOAT"
            raise scope.error(
                f"{x} is a {name} written as text, which Spark writes otherwise than DuckDB "
                f"(1.2345678E7 for 12345678.0): cast it to a DECIMAL first, e.g. "
                f"CAST(CAST({x} AS DECIMAL(18, 2)) AS VARCHAR)", written)


def _duration(typed: object) -> bool:
    """Whether ``typed`` (a typed twin) is a duration: a TIMESTAMP minus a TIMESTAMP.

    Or minus a DATE: an INTERVAL in DuckDB and Spark alike (sqlglot types it a TIMESTAMP).
    """
    typed = _unwrapped(typed)
    if not isinstance(typed, exp.Sub):
        return False
    types = [_type(typed.this), _type(typed.expression)]
    return all(t is not None and t.is_type(*_TIMES) for t in types) \
        and not all(t is not None and t.is_type(_DATE) for t in types)


def _refuse_a_kept_duration(scope: Scope, node: exp.Expr, typed: exp.Expr) -> None:
    """Refuses a duration a view would keep: anywhere but compared or taken apart."""
    if not _duration(typed):
        return
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    if isinstance(parent, (exp.Predicate, exp.Extract, exp.TimeToUnix, exp.UnixToTime)) or (
            isinstance(parent, exp.Anonymous) and parent.name.lower() in _OF_A_DURATION):
        return
    x = node.sql(dialect=CANONICAL_DIALECT)
    raise scope.error(
        f"{x} is an INTERVAL, which incr cannot keep (its state and answers are Delta tables, "
        f"which have no interval type): write its seconds, epoch({x}), or "
        f"date_diff('second', {node.expression.sql(dialect=CANONICAL_DIALECT)}, "
        f"{node.this.sql(dialect=CANONICAL_DIALECT)})", node)


def _unwrapped(x: object) -> object:
    """``x`` without the parentheses around it."""
    while isinstance(x, exp.Paren):
        x = x.this
    return x


def _micros_between(sub: exp.Expr) -> exp.Expr:
    """The microseconds from ``sub``'s second time to its first, as DuckDB's duration holds."""
    sub = _unwrapped(sub)  # type: ignore[assignment]  # a duration: a Sub in parentheses

    def micros(x: exp.Expr) -> exp.Expr:
        return exp.Anonymous(this="epoch_us", expressions=[x.copy()])
    return exp.Paren(this=exp.Sub(this=micros(sub.this), expression=micros(sub.expression)))


def _of_a_duration(node: exp.Expr, typed: exp.Expr) -> exp.Expr | None:
    """``epoch``, ``epoch_ms`` or ``epoch_us`` of a duration, in DuckDB's units; or None."""
    def seconds(sub: exp.Expr) -> exp.Expr:
        return exp.Paren(this=exp.Div(this=_micros_between(sub),
                                      expression=exp.Literal.number("1000000.0")))
    if isinstance(node, exp.TimeToUnix) and _duration(typed.this):
        return seconds(node.this)
    if isinstance(node, exp.Extract) and node.this.name.upper() == "EPOCH" \
            and _duration(typed.expression):
        return seconds(node.expression)
    if isinstance(node, exp.UnixToTime) and _duration(typed.this) \
            and integer_literal(node.args.get("scale")) == 3:  # epoch_ms
        return exp.Paren(this=exp.IntDiv(this=_micros_between(node.this),
                                         expression=exp.Literal.number(1000)))
    if not isinstance(node, exp.Anonymous) or node.name.lower() not in _OF_A_DURATION:
        return None
    args, typed_args = node.expressions, typed.expressions
    if len(args) == 2 and node.name.lower() != "epoch_us" and args[0].name.lower() == "epoch" \
            and _duration(typed_args[1]):  # date_part('epoch', x)
        return seconds(args[1])
    if len(args) == 1 and node.name.lower() == "epoch_us" and _duration(typed_args[0]):
        return _micros_between(args[0])
    return None


def _spelled(node: exp.Expr, typed: exp.Expr) -> exp.Expr | None:
    """``node`` written so that both engines compute DuckDB's value, or None to keep it."""
    of_a_duration = _of_a_duration(node, typed)
    if of_a_duration is not None:
        return of_a_duration
    this, other = _type(typed.this), _type(typed.args.get("expression"))
    if this is None:
        return None
    x = node.this
    if isinstance(node, exp.Round) and this.is_type(_DOUBLE):
        n = integer_literal(node.args.get("decimals"))
        if n is not None and n < 0:
            return _zero_unless_finite(node, x, also_infinite=True)
        return _scaled_round(x, n) if n is not None and 0 < n <= 15 else None
    if isinstance(node, exp.Sign) and this.is_type(_DOUBLE):
        return _zero_unless_finite(node, x, also_infinite=False)
    if isinstance(node, exp.Trunc) and node.args.get("decimals") is not None:
        return _cut(x, this, integer_literal(node.args["decimals"]))
    if isinstance(node, (exp.Floor, exp.Ceil, exp.Trunc)) and this.is_type(_DOUBLE) \
            and node.args.get("decimals") is None:
        whole = exp.cast(type(node)(this=x.copy()), _DOUBLE)
        small = exp.LT(this=exp.Abs(this=x.copy()), expression=exp.Literal.number(_WHOLE))
        return exp.Case(ifs=[exp.If(this=small, true=whole)], default=x.copy())
    if isinstance(node, (exp.Cast, exp.TryCast)):
        to = node.to
        if to.is_type(*_INTEGRAL) and this.is_type(*exp.DataType.TEXT_TYPES):
            return _text_to_integer(node)
        if to.is_type(*_INTEGRAL) and this.is_type(_DOUBLE, _FLOAT):
            even = exp.Anonymous(this="round_even", expressions=[x.copy(), exp.Literal.number(0)])
            return node.__class__(this=even, to=to.copy())
        if to.is_type(*_INTEGRAL) and this.is_type(exp.DataType.Type.DECIMAL):
            return node.__class__(this=exp.Round(this=x.copy()), to=to.copy())
        if to.is_type(exp.DataType.Type.DECIMAL) and this.is_type(_DOUBLE):
            params = to.expressions
            scale = integer_literal(params[1].this) if len(params) == 2 else None
            if scale is not None and 0 < scale <= 15:
                return node.__class__(this=_scaled_round(x, scale), to=to.copy())
        return None
    if isinstance(node, exp.IntDiv) and other is not None \
            and any(t.is_type(_DOUBLE, _FLOAT, exp.DataType.Type.DECIMAL) for t in (this, other)):
        return exp.Div(this=x.copy(), expression=node.expression.copy())
    if isinstance(node, exp.UnixToTime) and this.is_type(*_TIMES) \
            and integer_literal(node.args.get("scale")) == 3:  # epoch_ms
        micros = exp.Anonymous(this="epoch_us", expressions=[x.copy()])
        return exp.IntDiv(this=micros, expression=exp.Literal.number(1000))
    if isinstance(node, exp.Sub) and this.is_type(_DATE) and other is not None \
            and other.is_type(_DATE):
        return exp.DateDiff(this=x.copy(), expression=node.expression.copy(),
                            unit=exp.var("DAY"))
    return None


def _text_to_integer(node: exp.Cast | exp.TryCast) -> exp.Expr:
    """DuckDB's cast of text to an integer type, in a form Spark computes alike.

    DuckDB reads a decimal fraction or an exponent and rounds half away from zero (``'12.5'``
    is 13, ``'1e3'`` 1000, ``'3.0'`` 3); Spark reads digits only.  Text of ASCII characters
    that a DECIMAL(38, 0) takes (Spark's cast rounds half up, as DuckDB's) is cast through
    it; other text as written, which fails (or is NULL for TRY_CAST) where DuckDB's does.
    Only ASCII: Java reads other digits too (``'١٢'``), DuckDB does not.
    """
    text, to = node.this, node.to
    whole = exp.DataType.build("DECIMAL(38, 0)")
    ascii_ = exp.EQ(this=exp.Anonymous(this="strlen", expressions=[text.copy()]),
                    expression=exp.Length(this=text.copy()))
    through = exp.TryCast(this=exp.TryCast(this=text.copy(), to=whole), to=to.copy())
    if isinstance(node, exp.TryCast):
        read = exp.Case(ifs=[exp.If(this=ascii_, true=through)])
        return exp.Coalesce(this=node.copy(), expressions=[read])
    rounded = exp.Not(this=exp.Is(this=exp.TryCast(this=text.copy(), to=whole.copy()),
                                  expression=exp.Null()))
    exact = exp.Cast(this=exp.Cast(this=text.copy(), to=whole.copy()), to=to.copy())
    return exp.Case(ifs=[exp.If(this=exp.and_(ascii_, rounded), true=exact)], default=node.copy())


def _cut(x: exp.Expr, t: exp.DataType, n: int | None) -> exp.Expr | None:
    """DuckDB's ``trunc(x, n)`` of a DOUBLE, DECIMAL or integer ``x``, ``n`` written out."""
    if n is None or abs(n) > 15:
        return None
    if t.is_type(_DOUBLE):
        scale = exp.Literal.number(f"{10 ** abs(n)}.0")
        scaled = (exp.Mul if n >= 0 else exp.Div)(this=_operand(x), expression=scale)
        back = exp.Mul if n < 0 else exp.Div
        whole = back(this=exp.cast(exp.Trunc(this=scaled.copy()), _DOUBLE), expression=scale.copy())
        small = exp.LT(this=exp.Abs(this=scaled.copy()), expression=exp.Literal.number(_WHOLE))
        finite = exp.Not(this=exp.IsInf(this=scaled.copy()))
        exact = back(this=exp.Paren(this=scaled.copy()), expression=scale.copy())
        return exp.Paren(this=exp.Case(ifs=[exp.If(this=small, true=whole),
                                            exp.If(this=finite, true=exact)], default=x.copy()))
    if t.is_type(exp.DataType.Type.DECIMAL, *_INTEGRAL):
        if n >= 0 and t.is_type(*_INTEGRAL):
            return x.copy()
        unit = exp.Literal.number(f"{Decimal(1).scaleb(-n):f}")
        rest = exp.Paren(this=exp.Mod(this=_operand(x), expression=unit))
        return exp.Paren(this=exp.Sub(this=_operand(x), expression=rest))
    return None


def _operand(x: exp.Expr) -> exp.Expr:
    """A copy of ``x`` to multiply: in parentheses unless it is one term already."""
    one = isinstance(x, (exp.Column, exp.Func, exp.Literal, exp.Paren))
    return x.copy() if one else exp.Paren(this=x.copy())


def _zero_unless_finite(node: exp.Expr, x: exp.Expr, also_infinite: bool) -> exp.Expr:
    """``node`` of a DOUBLE ``x``, 0 where ``x`` is NaN (or, ``also_infinite``, infinite).

    DuckDB's ``sign`` of NaN is 0, and its ``round(x, n)`` of a negative ``n`` is 0 of NaN
    and of either infinity; Spark's are NaN (and the infinity).
    """
    odd: exp.Expr = exp.IsNan(this=x.copy())
    if also_infinite:
        odd = exp.Or(this=odd, expression=exp.IsInf(this=x.copy()))
    zero = exp.cast(exp.Literal.number(0), _DOUBLE)
    return exp.Case(ifs=[exp.If(this=odd, true=zero)], default=node.copy())


def _scaled_round(x: exp.Expr, n: int) -> exp.Expr:
    """DuckDB's ``round(x, n)`` of a DOUBLE: ``round(x * 10^n) / 10^n`` in floating point.

    ``10^n`` is written as a DECIMAL (exact, a DOUBLE in both engines' product); Spark's
    ``round`` of the product rounds the decimal it prints as, which is on the same side of
    a half as the product itself (a half is a DOUBLE of its own).
    """
    scale = exp.Literal.number(f"{10 ** n}.0")
    product = exp.Round(this=exp.Mul(this=_operand(x), expression=scale))
    return exp.Paren(this=exp.Div(this=product, expression=scale.copy()))

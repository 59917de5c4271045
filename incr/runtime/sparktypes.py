"""Spark's result types of the compiled SQL, found on the driver without Spark.

A view's tables take their column types from Spark: the state tables when they are created
(h(∅), :meth:`~incr.runtime.state.ViewState.ensure_tables`) and the answer table at its
first publish.  Every later batch casts to those types, on either engine.  Starting Spark
only to learn them cost a new program's first run on a handful of rows 20-40 s of JVM
start.  :class:`SparkTypes` computes the same types from the query text, with the rules
Spark 4 applies under ANSI mode (``spark.sql.ansi.enabled``, as incr's sessions run):

* literals: an integer is INT, else BIGINT, else DECIMAL of its digits; ``1.50`` is
  DECIMAL(3,2); one with an exponent is DOUBLE;
* arithmetic on DECIMALs follows Spark's ``DecimalPrecision`` (an integer literal beside a
  DECIMAL counts its own digits, an integer column those of its type), with the loss of
  scale Spark allows past 38 digits; ``/`` of two non-DECIMALs is DOUBLE;
* CASE, COALESCE, GREATEST, UNION, INTERSECT and EXCEPT take the wider type of their
  branches;
* SUM is BIGINT, DOUBLE or DECIMAL(p+10, s); AVG DOUBLE or DECIMAL(p+4, s+4); COUNT BIGINT;
  MIN and MAX their input's type.

Only that set is known.  Anything else (most string and date functions, a window, a FLOAT
beside an integer) raises :class:`~incr.runtime.engine.NotLocal` naming it, and the types are
taken from Spark as before: a guess is never written into a table's schema.
``tests/runtime/test_sparktypes.py`` holds the rules against Spark's own answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce

import pyarrow as pa
import sqlglot
from sqlglot import exp

from incr.compiler.dialect import integer_literal
from incr.runtime.engine import DRIVER, NotLocal, per_engine

MAX_PRECISION = 38
#: A DECIMAL's scale kept at least when its precision is cut to 38 (Spark's
#: ``MINIMUM_ADJUSTED_SCALE``).
MIN_ADJUSTED_SCALE = 6

_INTEGERS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
#: The DECIMAL an integer type widens to beside a DECIMAL (Spark's ``DecimalType.forType``).
_AS_DECIMAL = {pa.int8(): (3, 0), pa.int16(): (5, 0), pa.int32(): (10, 0), pa.int64(): (20, 0)}
#: Spark SQL type names (as sqlglot parses them) -> Arrow, as Spark hands rows to Arrow.
_NAMED = {
    exp.DataType.Type.TINYINT: pa.int8(), exp.DataType.Type.SMALLINT: pa.int16(),
    exp.DataType.Type.INT: pa.int32(), exp.DataType.Type.BIGINT: pa.int64(),
    exp.DataType.Type.FLOAT: pa.float32(), exp.DataType.Type.DOUBLE: pa.float64(),
    exp.DataType.Type.BOOLEAN: pa.bool_(), exp.DataType.Type.DATE: pa.date32(),
    exp.DataType.Type.TEXT: pa.string(), exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.TIMESTAMPNTZ: pa.timestamp("us"),
}
_PREDICATES = (exp.Predicate, exp.And, exp.Or, exp.Not, exp.IsNan)  # Predicate: =, IS, IN, ...
_DOUBLES = (exp.Pow, exp.Sqrt, exp.Sign, exp.VariancePop, exp.Variance, exp.Stddev,
            exp.StddevPop, exp.StddevSamp, exp.Ln, exp.Log, exp.Exp)
_SAME = (exp.Min, exp.Max, exp.Abs, exp.First, exp.AnyValue, exp.Neg, exp.Paren)
_UNKNOWN = pa.null()  # the type of NULL: it takes any other branch's
#: Parts of a DATE or TIMESTAMP (an INT in Spark) and DuckDB's function for each: the
#: calendar's fields, ISO 8601 week numbers in both engines, and the clock's (0 of a
#: DATE).  DuckDB takes them of a DATE or TIMESTAMP only (refusing text, which Spark would
#: cast), and of a TIMESTAMP in UTC, the zone of incr's Spark sessions (``SET TimeZone`` in ``LocalSql``).
DATE_PARTS = ((exp.Year, "year"), (exp.Quarter, "quarter"), (exp.Month, "month"),
              (exp.Day, "dayofmonth"), (exp.DayOfMonth, "dayofmonth"),
              (exp.DayOfYear, "dayofyear"), (exp.WeekOfYear, "weekofyear"),
              (exp.Hour, "hour"), (exp.Minute, "minute"), (exp.Second, "second"))
DATE_PART_NODES = tuple(part for part, _ in DATE_PARTS)


def implied_date(node: exp.Expr) -> bool:
    """Whether ``node`` is the date a date part implies of its argument (sqlglot reads
    Spark's ``year(x)`` as the year of ``to_date(x)``): no function of its own."""
    return (isinstance(node, exp.TsOrDsToDate) and not node.args.get("format")
            and isinstance(node.parent, DATE_PART_NODES))


def date_part_of(node: exp.Expr) -> exp.Expr:
    """The value a date part (one of :data:`DATE_PARTS`) takes, without the implied date."""
    return node.this.this if implied_date(node.this) else node.this


@per_engine("result types", DRIVER)
def spark_form(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Spark reads it: every field nullable, text as ``string`` (delta-rs and
    Arrow readers may hand out large or view strings), integers and the rest unchanged."""
    def form(t: pa.DataType) -> pa.DataType:
        return pa.string() if pa.types.is_large_string(t) or pa.types.is_string_view(t) else t
    return pa.schema([pa.field(f.name, form(f.type)) for f in schema])


def bounded(precision: int, scale: int) -> pa.Decimal128Type:
    """Spark's ``DecimalType.bounded``: each part cut to 38."""
    return pa.decimal128(min(precision, MAX_PRECISION), min(scale, MAX_PRECISION))


def adjusted(precision: int, scale: int) -> pa.Decimal128Type:
    """A DECIMAL result of more than 38 digits, as Spark cuts it: integer digits are kept,
    the scale gives way down to 6 (``DecimalType.adjustPrecisionScale``)."""
    if precision <= MAX_PRECISION:
        return pa.decimal128(precision, scale)
    digits = precision - scale
    return pa.decimal128(MAX_PRECISION, max(MAX_PRECISION - digits, min(scale, MIN_ADJUSTED_SCALE)))


class SparkTypes:
    """The schemas of named relations, and of queries over them, as Spark types them."""

    def __init__(self, relations: dict[str, pa.Schema] | None = None):
        self._relations = {k.lower(): v for k, v in (relations or {}).items()}

    def register(self, name: str, schema: pa.Schema) -> None:
        """Makes ``name`` readable by later queries, with the columns of ``schema``."""
        self._relations[name.lower()] = schema

    def registered(self, name: str) -> pa.Schema:
        """The schema ``name`` was registered with."""
        return self._relations[name.lower()]

    @per_engine("result types", DRIVER)
    def schema(self, spark_sql: str) -> pa.Schema:
        """The (all nullable) schema Spark gives the rows of ``spark_sql``; NotLocal: unknown."""
        try:
            tree = sqlglot.parse_one(spark_sql, read="spark")
        except sqlglot.errors.ParseError as e:
            raise NotLocal(f"sqlglot cannot parse the query to type it "
                           f"({str(e).splitlines()[0]})") from e
        return pa.schema([pa.field(n, t) for n, t in self._query(tree, {})])

    # -- relations -------------------------------------------------------------------------
    def _query(self, node: exp.Expr, ctes: dict[str, list[tuple[str, pa.DataType]]]
               ) -> list[tuple[str, pa.DataType]]:
        """The named, typed columns of a SELECT or UNION."""
        with_ = node.args.get("with_")
        if with_ is not None:
            ctes = dict(ctes)
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = self._query(cte.this, ctes)
        if isinstance(node, exp.SetOperation):  # UNION, INTERSECT, EXCEPT
            left, right = self._query(node.this, ctes), self._query(node.expression, ctes)
            what = f"a {node.key.upper()}"
            if len(left) != len(right):
                raise NotLocal(f"{what}'s sides have different numbers of columns")
            return [(n, _wider([t, u], what)) for (n, t), (_, u) in zip(left, right)]
        if isinstance(node, exp.Subquery):
            return self._query(node.this, ctes)
        if not isinstance(node, exp.Select):
            raise NotLocal(f"it types no {type(node).__name__} as a relation")
        scope = self._scope(node, ctes)
        out: list[tuple[str, pa.DataType]] = []
        for projection in node.expressions:
            if isinstance(projection, exp.Star):
                out += [col for _, cols in scope for col in cols]
            elif isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
                out += _relation(scope, projection.table)
            elif isinstance(projection, exp.Alias):
                out.append((projection.alias, self._type(projection.this, scope)))
            elif isinstance(projection, exp.Column):
                out.append((projection.name, self._type(projection, scope)))
            else:
                raise NotLocal(f"a column without a name ({projection.sql('spark')[:60]})")
        return out

    def _scope(self, select: exp.Select, ctes: dict[str, list[tuple[str, pa.DataType]]]
               ) -> list[tuple[str, list[tuple[str, pa.DataType]]]]:
        """The relations a SELECT reads, each under its alias, in order (FROM, the joins,
        LATERAL VIEWs)."""
        from_ = select.args.get("from_")
        sources = ([from_.this] if from_ is not None else []) + \
            [j.this for j in select.args.get("joins") or ()]
        for join in select.args.get("joins") or ():
            if join.args.get("using"):
                raise NotLocal("a JOIN ... USING (its columns merge)")
        scope = []
        for source in sources:
            if isinstance(source, exp.Table):
                name = source.name.lower()
                if name in ctes:
                    cols = ctes[name]
                elif name in self._relations and not source.db:
                    cols = [(f.name, f.type) for f in self._relations[name]]
                else:
                    raise NotLocal(f"it reads {source.sql('spark')}, which is not registered")
            elif isinstance(source, exp.Subquery):
                cols = self._query(source.this, ctes)
            else:
                raise NotLocal(f"it reads from a {type(source).__name__}")
            scope.append((source.alias_or_name.lower(), cols))
        for lateral in select.args.get("laterals") or ():
            scope.append(self._lateral(lateral, scope))
        return scope

    def _lateral(self, lateral: exp.Lateral, scope) -> tuple[str, list[tuple[str, pa.DataType]]]:
        """``LATERAL VIEW explode(sequence(a, b)) AS c``: one column, the integers' type."""
        alias = lateral.args.get("alias")
        func = lateral.this
        if not (isinstance(func, exp.Explode) and isinstance(func.this, exp.GenerateSeries)
                and alias is not None and len(alias.columns) == 1):
            raise NotLocal(f"it uses {lateral.sql('spark')[:60]}")
        series = func.this
        element = _wider([self._type(series.args["start"], scope),
                          self._type(series.args["end"], scope)], "sequence()")
        if element not in _INTEGERS:
            raise NotLocal("sequence() of non-integers")
        return (alias.name.lower(), [(alias.columns[0].name, element)])

    # -- expressions -----------------------------------------------------------------------
    def _type(self, node: exp.Expr, scope) -> pa.DataType:
        """The Spark type of one expression read in ``scope``."""
        if isinstance(node, exp.Column):
            return _column(scope, node)
        if isinstance(node, exp.Literal):
            return _literal(node)
        if isinstance(node, exp.Null):
            return _UNKNOWN
        if isinstance(node, (exp.Boolean, *_PREDICATES)):
            return pa.bool_()
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return _named(node.to)
        if isinstance(node, _SAME):
            return self._type(node.this, scope)
        if isinstance(node, exp.Count):
            return pa.int64()
        if isinstance(node, _DOUBLES):
            return pa.float64()
        if isinstance(node, exp.Sum):
            return _sum(self._type(node.this, scope))
        if isinstance(node, exp.Avg):
            t = _numeric(self._type(node.this, scope), "AVG")
            return bounded(t.precision + 4, t.scale + 4) if pa.types.is_decimal(t) else pa.float64()
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.SafeDivide, exp.Mod)):
            return self._arithmetic(node, scope)
        if isinstance(node, exp.Case):
            branches = [i.args["true"] for i in node.args.get("ifs") or ()]
            branches += [node.args["default"]] if node.args.get("default") is not None else []
            return _wider([self._type(b, scope) for b in branches], "a CASE")
        if isinstance(node, exp.If):
            branches = [node.args["true"]] + ([node.args["false"]] if node.args.get("false") else [])
            return _wider([self._type(b, scope) for b in branches], "an IF")
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            args = [node.this, *node.expressions]
            return _wider([self._type(a, scope) for a in args], node.key.upper())
        if isinstance(node, DATE_PART_NODES):
            self._of_time(date_part_of(node), scope, "a date part", "casts to a date")
            return pa.int32()
        if isinstance(node, (exp.Upper, exp.Lower, exp.Substring, exp.Length)):
            if self._type(node.this, scope) != pa.string():
                raise NotLocal(f"{node.key}() of what Spark casts to text first")
            return pa.int32() if isinstance(node, exp.Length) else pa.string()
        if isinstance(node, exp.TsOrDsToDate) and not node.args.get("format"):  # to_date(x)
            self._of_time(node.this, scope, "to_date()", "parses as a date")
            return pa.date32()
        if isinstance(node, exp.TimestampTrunc):  # date_trunc(unit, x): a TIMESTAMP in UTC
            self._of_time(node.this, scope, "date_trunc()", "casts to a TIMESTAMP")
            return pa.timestamp("us", tz="UTC")  # the zone of incr's sessions
        if isinstance(node, exp.Anonymous):
            return self._function(node, scope)
        raise NotLocal(f"it uses {node.sql('spark')[:60]}, whose Spark type is not known here")

    def _of_time(self, value: exp.Expr, scope, what: str, spark_does: str) -> None:
        """Refuses ``what`` of ``value`` unless it is a DATE or TIMESTAMP: of anything else,
        Spark first does ``spark_does`` by rules of its own."""
        t = self._type(value, scope)
        if not (pa.types.is_date(t) or pa.types.is_timestamp(t)):
            raise NotLocal(f"it takes {what} of {t}, which Spark first {spark_does}")

    def _function(self, node: exp.Anonymous, scope) -> pa.DataType:
        name = node.name.lower()
        if name == "xxhash64":
            return pa.int64()
        if name == "try_mod" and len(node.expressions) == 2:  # the compiler's ``%`` by a column
            return self._arithmetic(exp.Mod(this=node.expressions[0],
                                            expression=node.expressions[1]), scope)
        if name == "pmod" and len(node.expressions) == 2:
            types = [self._type(a, scope) for a in node.expressions]
            if all(t in _INTEGERS for t in types):
                return _wider(types, "pmod()")
        raise NotLocal(f"it uses {node.sql('spark')[:60]}, whose Spark type is not known here")

    def _arithmetic(self, node: exp.Binary, scope) -> pa.DataType:
        """``+ - * / %`` and try_divide, with Spark's rules (ANSI)."""
        left, right = node.this, node.expression
        lt, rt = self._type(left, scope), self._type(right, scope)
        divide = isinstance(node, (exp.Div, exp.SafeDivide))
        for t in (lt, rt):
            if _numeric(t, node.key) == _UNKNOWN:
                raise NotLocal(f"{node.key} of NULL")
        if pa.types.is_floating(lt) or pa.types.is_floating(rt):
            # ANSI widens a FLOAT beside any other type to DOUBLE, and so does ``/``
            return pa.float32() if lt == rt == pa.float32() and not divide else pa.float64()
        if not (pa.types.is_decimal(lt) or pa.types.is_decimal(rt)):
            if divide:
                return pa.float64()
            return _wider([lt, rt], node.key)
        (p1, s1), (p2, s2) = _decimal_of(lt, left), _decimal_of(rt, right)
        if isinstance(node, (exp.Add, exp.Sub)):
            scale = max(s1, s2)
            return adjusted(max(p1 - s1, p2 - s2) + scale + 1, scale)
        if isinstance(node, exp.Mul):
            return adjusted(p1 + p2 + 1, s1 + s2)
        if divide:
            scale = max(MIN_ADJUSTED_SCALE, s1 + p2 + 1)
            return adjusted(p1 - s1 + s2 + scale, scale)
        raise NotLocal("a DECIMAL remainder")


# -- rules ------------------------------------------------------------------------------------
def _column(scope, node: exp.Column) -> pa.DataType:
    name, table = node.name.lower(), node.table.lower()
    found = [t for alias, cols in scope if not table or alias == table
             for n, t in cols if n.lower() == name]
    if len(found) != 1:
        raise NotLocal(f"column {node.sql('spark')} is {'ambiguous' if found else 'not found'}")
    return found[0]


def _relation(scope, alias: str) -> list[tuple[str, pa.DataType]]:
    for name, cols in scope:
        if name == alias.lower():
            return cols
    raise NotLocal(f"{alias}.* reads no relation of the query")


def _literal(node: exp.Literal) -> pa.DataType:
    if node.is_string:
        return pa.string()
    text = node.this.lower()
    if "e" in text:
        return pa.float64()
    if "." not in text:
        value = abs(int(text))
        return pa.int32() if value < 2**31 else pa.int64() if value < 2**63 else \
            adjusted(len(str(value)), 0)
    whole, _, fraction = text.partition(".")
    precision = max(len((whole + fraction).lstrip("0")), len(fraction), 1)
    if precision > MAX_PRECISION:
        raise NotLocal(f"the literal {text} has more digits than a DECIMAL holds")
    return pa.decimal128(precision, len(fraction))


def _decimal_of(t: pa.DataType, node: exp.Expr) -> tuple[int, int]:
    """(precision, scale) of one side of DECIMAL arithmetic: an integer literal counts its
    own digits (Spark's ``literalPickMinimumPrecision``), an integer type those of its range."""
    if pa.types.is_decimal(t):
        return t.precision, t.scale
    literal = integer_literal(node)
    if literal is not None:
        return max(len(str(abs(literal))), 1), 0
    return _AS_DECIMAL[t]


def _named(to: exp.DataType) -> pa.DataType:
    kind = to.this
    if kind == exp.DataType.Type.DECIMAL:
        params = [int(p.this.this) for p in to.expressions]
        precision, scale = (params + [10, 0][len(params):])[:2] if params else (10, 0)
        return pa.decimal128(precision, scale)
    if kind not in _NAMED:
        raise NotLocal(f"it casts to {to.sql('spark')}, whose Arrow form is not known here")
    return _NAMED[kind]


def _numeric(t: pa.DataType, where: str) -> pa.DataType:
    if not (t in _INTEGERS or pa.types.is_floating(t) or pa.types.is_decimal(t) or t == _UNKNOWN):
        raise NotLocal(f"{where} of a {t}")
    return t


def _sum(t: pa.DataType) -> pa.DataType:
    if pa.types.is_decimal(t):
        return bounded(t.precision + 10, t.scale)
    if t in _INTEGERS:
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    raise NotLocal(f"SUM of a {t}")


def _wider(types: Iterable[pa.DataType], where: str) -> pa.DataType:
    """The type branches of ``where`` meet in (Spark's ``findWiderTypeForTwo`` over them)."""
    known = [t for t in types if t != _UNKNOWN]
    return reduce(lambda a, b: _wider_two(a, b, where), known) if known else _UNKNOWN


def _wider_two(a: pa.DataType, b: pa.DataType, where: str) -> pa.DataType:
    if a == b:
        return a
    if a in _INTEGERS and b in _INTEGERS:
        return max(a, b, key=_INTEGERS.index)
    if pa.types.is_decimal(a) or pa.types.is_decimal(b):
        if pa.types.is_floating(a) or pa.types.is_floating(b):
            return pa.float64()
        if not all(pa.types.is_decimal(t) or t in _INTEGERS for t in (a, b)):
            raise NotLocal(f"{where} meets {a} and {b}")
        (p1, s1), (p2, s2) = [(t.precision, t.scale) if pa.types.is_decimal(t) else
                              _AS_DECIMAL[t] for t in (a, b)]
        scale = max(s1, s2)
        precision = max(p1 - s1, p2 - s2) + scale
        # past 38 digits the scale gives way, never an integer digit
        # (``DecimalType.boundedPreferIntegralDigits``)
        return pa.decimal128(min(precision, MAX_PRECISION),
                             max(0, scale - max(0, precision - MAX_PRECISION)))
    if all(t in _INTEGERS or pa.types.is_floating(t) for t in (a, b)):
        return pa.float64()  # a FLOAT beside another number is widened to DOUBLE (ANSI)
    raise NotLocal(f"{where} meets {a} and {b}")

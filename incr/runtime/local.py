"""The driver-side engine: the compiler's Spark SQL run by DuckDB over Arrow, for small inputs.

A 10K-row increment costs Spark several jobs of ~0.1 s each (plan, schedule, collect), far
more than the work; DuckDB computes the same h over the same rows in milliseconds.  So when
the rows involved are few (a batch of at most ``max_rows``, state and side tables of at most
``max_state_rows``), the fold of a batch (Δ of a join against the side tables, h, the side
tables' h) and a(state) run here instead (:class:`DriverEngine`, chosen by
:meth:`~incr.runtime.engine.Engines.choose`), and only where the result is *provably the
same*:

* The SQL is the one the compiler wrote for Spark, transpiled by sqlglot.  Only a small set of
  constructs is accepted (columns, literals, arithmetic, comparisons, CASE, COALESCE, numeric
  casts, SUM/COUNT/MIN/MAX/AVG/VAR_POP, joins, grouping, ordering, a remainder, the parts
  of a date or time and its truncations in UTC, the case, length and substrings of ASCII
  text); anything else (another string function, a cast to text) raises
  :class:`~incr.runtime.engine.NotLocal` naming it, and the step runs in Spark, whose
  semantics the rest of the system is built on.
* ``_bucket`` is Spark's ``pmod(xxhash64(θ), n)``; it is computed by
  :mod:`incr.runtime.sparkhash`, bit for bit, after the query.
* The result is cast to the schema Spark gave the same table (the state table, or the
  answer table already published), so types never drift between the two paths.  A value
  that does not fit (an overflowing sum) also gives way to Spark, which then decides.

Floating-point sums may differ from Spark's in the last bits (a different summation order,
as between two Spark runs with different partitioning).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import sqlglot
from sqlglot import exp

from incr.compiler import patterns
from incr.compiler.dialect import Bucket, Query, integer_literal, nonzero_number
from incr.errors import StorageError
from incr.runtime import sparkhash
from incr.runtime.diskcache import DiskCache
from incr.runtime.engine import DRIVER, Engine, NotLocal, as_query, per_engine
from incr.runtime.sparktypes import (
    DATE_PART_NODES,
    DATE_PARTS,
    SparkTypes,
    date_part_of,
    implied_date,
    spark_form,
)

if TYPE_CHECKING:
    from incr.runtime.store import DeltaStore, Snapshot

#: The string functions the driver computes, of ASCII text only (:func:`_ascii_text`).
_TEXT = (exp.Upper, exp.Lower, exp.Length, exp.Substring)
#: Spark's ``rlike``, ``regexp_extract`` and ``regexp_extract_all`` the driver computes, of
#: a pattern RE2 reads as Java does (:func:`_alike_pattern`).
_PATTERNS = (exp.RegexpLike, exp.RegexpExtract, exp.RegexpExtractAll)
_ALLOWED = (
    exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Join, exp.Subquery, exp.Table, exp.TableAlias, exp.Alias, exp.Column, exp.Identifier,
    exp.Star, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Union, exp.Distinct,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.SafeDivide, exp.Neg, exp.Abs, exp.Greatest,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.And, exp.Or, exp.Not, exp.Is, exp.Case, exp.If, exp.Coalesce,
    exp.In,  # of a list: x = a OR x = b ... in both engines, NULLs alike (not of a subquery)
    exp.Between,  # x >= low AND x <= high in both engines (not SYMMETRIC)
    exp.Like,  # of a pattern of ASCII text, no escape (see _plain_pattern)
    exp.Sum, exp.Count, exp.Min, exp.Max, exp.Avg, exp.VariancePop, exp.Sqrt, exp.IsNan,
    exp.Pow,  # only 2^n for an integer n (see _exact_power), exact in both engines
    exp.Translate,  # of characters written out, each once (see _other_form)
    exp.Cast, exp.TryCast, exp.DataType, exp.DataTypeParam,
    # a signed change set as plain rows: LATERAL VIEW explode(sequence(1, abs(_w)))
    exp.Lateral, exp.Explode, exp.GenerateSeries, exp.Unnest,
    *DATE_PART_NODES,
    exp.Mod,  # by a non-zero number, or written try_mod (see _remainders)
    exp.TimestampTrunc,  # date_trunc to the units both engines truncate to alike
    exp.TsOrDsToDate,  # to_date(x) without a format, of a DATE or TIMESTAMP (see _days)
    *_TEXT,
    *_PATTERNS,  # of a pattern RE2 reads as Java does (see _alike_pattern)
)
#: Spark's units of ``date_trunc`` and DuckDB's name for each; weeks start on Monday in both.
_TRUNCATED = {"YEAR": "year", "YYYY": "year", "YY": "year", "QUARTER": "quarter",
              "MONTH": "month", "MM": "month", "MON": "month", "WEEK": "week", "DAY": "day",
              "DD": "day", "HOUR": "hour", "MINUTE": "minute", "SECOND": "second"}
_INTEGRAL = {exp.DataType.Type.BIGINT, exp.DataType.Type.INT, exp.DataType.Type.SMALLINT,
             exp.DataType.Type.TINYINT}
_NUMERIC = {exp.DataType.Type.BIGINT, exp.DataType.Type.INT, exp.DataType.Type.SMALLINT,
            exp.DataType.Type.TINYINT, exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT,
            exp.DataType.Type.DECIMAL}


@dataclass(frozen=True)
class Prepared:
    """A Spark query as DuckDB runs it, and the bucket to fill in afterwards."""

    sql: str
    bucket: Bucket | None = None


def prepare(query: Query | str) -> Prepared | None:
    """The DuckDB form of a query, or None when it uses anything outside the safe set."""
    query = as_query(query)
    found = _prepare(query.sql, query.bucket)
    return found if isinstance(found, Prepared) else None


@lru_cache(maxsize=1)
def translator() -> str | None:
    """What :func:`_prepare`'s answers depend on besides the query: sqlglot's version and
    the source of this module and of :mod:`~incr.runtime.sparktypes` (its date parts), the
    checks and rewrites, as a short digest; None when a source cannot be read (then nothing
    is kept).  A translation kept on disk (:meth:`LocalSql.keep_translations`) is read only
    by the same translator."""
    from incr.runtime import sparktypes

    digest = hashlib.sha256(sqlglot.__version__.encode())
    try:
        digest.update(Path(__file__).read_bytes())
        digest.update(Path(sparktypes.__file__).read_bytes())
        digest.update(Path(patterns.__file__).read_bytes())
    except OSError:
        return None
    return digest.hexdigest()[:16]


@lru_cache(maxsize=512)
def _kept(spark_sql: str, bucket: Bucket | None, kept: DiskCache) -> Prepared | str:
    """:func:`_prepare`'s answer, read from ``kept`` when a process kept it there before
    (else computed and kept): a new process then translates none of the queries it ran."""
    parts = (spark_sql, repr(bucket))
    found = kept.get(parts)
    if isinstance(found, dict) and isinstance(found.get("sql"), str):
        return Prepared(found["sql"], bucket)
    if isinstance(found, dict) and isinstance(found.get("refused"), str):
        return found["refused"]
    answer = _prepare(spark_sql, bucket)
    kept.put(parts, {"refused": answer} if isinstance(answer, str) else {"sql": answer.sql})
    return answer


def _other_form(node: exp.Expr) -> bool:
    """Whether ``node`` is a form outside the driver-side set of a node within it: an IN of
    a subquery (or an UNNEST), a BETWEEN SYMMETRIC, a LIKE of another pattern than
    :func:`_plain_pattern`'s, a ``date_trunc`` to a unit :func:`_truncation` does not know,
    a ``to_date`` with a format, a regular expression RE2 reads otherwise than Java
    (:func:`_alike_pattern`), a ``translate`` of characters not written out or written
    twice (which of two the engines take is not said; the compiler writes ``upper`` and
    ``lower`` with one, :mod:`incr.compiler.duckdb_scalars`)."""
    if isinstance(node, exp.TimestampTrunc):
        return _truncation(node) is None
    if isinstance(node, exp.In):
        return any(node.args.get(a) for a in ("query", "unnest", "field"))
    if isinstance(node, exp.Like):
        return not _plain_pattern(node.expression)
    if isinstance(node, exp.TsOrDsToDate):
        return node.args.get("format") is not None
    if isinstance(node, _PATTERNS):  # a pattern RE2 reads otherwise than Java
        return _alike_pattern(node) is None
    if isinstance(node, exp.Translate):
        source, target = node.args.get("from_"), node.args.get("to")
        return not (isinstance(source, exp.Literal) and source.is_string
                    and isinstance(target, exp.Literal) and target.is_string
                    and len(set(source.name)) == len(source.name))
    return isinstance(node, exp.Between) and bool(node.args.get("symmetric"))


def _alike_pattern(node: exp.Expr) -> str | None:
    r"""The pattern of Spark's ``rlike`` or ``regexp_extract(_all)`` as RE2 reads it alike.

    None when there is none (then the step is Spark's).

    The compiler writes a program's RE2 pattern as Java reads it
    (:func:`incr.compiler.patterns.java_pattern`); most of that text RE2 reads as Java does
    (:func:`~incr.compiler.patterns.re2_form`: a dashboard's ``'^/checkout'``, ``'[0-9]+'``,
    ``'a.b'`` with its options).  Look-around, ``\p{…}`` and nested classes it does not,
    nor a pattern not written out, options or a group not written as a number.
    """
    pattern = node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        return None
    if any(node.args.get(a) is not None for a in ("flag", "parameters", "position", "occurrence")):
        return None
    group = node.args.get("group")
    if group is not None and integer_literal(group) is None:
        return None
    written = pattern.sql(dialect="duckdb")  # Spark's escapes read: the pattern's own text
    return patterns.re2_form(written[1:-1].replace("''", "'"))


def _patterns(node: exp.Expr) -> exp.Expr:
    """A pattern call with the text RE2 reads as Java reads the compiled one."""
    if isinstance(node, _PATTERNS):
        node = node.copy()
        node.set("expression", exp.Literal.string(_alike_pattern(node) or ""))
    return node


def _plain_pattern(pattern: exp.Expr) -> bool:
    """Whether a LIKE ``pattern`` matches alike in both engines: a literal of ASCII text
    without a backslash, which escapes in Spark and not in DuckDB.  ASCII text is matched
    byte for byte in UTF-8 (no byte of another character is ASCII), ``%`` is any run of
    characters, and ``_`` one code point in both engines (Java's regex ``.`` under DOTALL
    and DuckDB's matcher): a line break or a character beyond the 16-bit plane is one, an
    ``é`` written as ``e`` and a combining accent two, as are a flag and CR LF."""
    text = pattern.name
    return (isinstance(pattern, exp.Literal) and pattern.is_string and text.isascii()
            and "\\" not in text)


#: A DATE or TIMESTAMP literal both engines read alike: ``DATE '2026-12-06'``, ``TIMESTAMP
#: '2026-12-06 08:30:00.25'`` (a day, then a time of day to the microsecond at most).
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_ISO_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}( [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?)?")
#: What each type of literal reads: DATE a day; TIMESTAMP (Spark's, with the session's zone,
#: UTC in incr's sessions and in DuckDB's, ``SET TimeZone`` in ``LocalSql``) and
#: TIMESTAMP_NTZ a day or an instant of it.
_LITERAL_FORMS = {
    exp.DataType.Type.DATE: (_ISO_DATE, dt.date.fromisoformat),
    exp.DataType.Type.TIMESTAMPTZ: (_ISO_TIME, dt.datetime.fromisoformat),
    exp.DataType.Type.TIMESTAMPNTZ: (_ISO_TIME, dt.datetime.fromisoformat),
}


def _time_literal(node: exp.Expr) -> bool:
    """Whether ``node`` is a cast of a string literal to DATE, TIMESTAMP or TIMESTAMP_NTZ in
    the ISO form of a real day or instant (``DATE '2026-12-06'``, ``ts >= TIMESTAMP
    '2026-12-01 00:00:00'``, a dashboard's time window): both engines read it as that day
    or instant, a TIMESTAMP in UTC (the zone of incr's Spark sessions and of the driver's
    DuckDB), and compare it with a column of either kind of timestamp or of DATE alike.
    Any other text (``'2026-1-5'``, ``'2026-02-30'``, a ``T`` between day and time, a zone,
    nanoseconds) the step leaves to Spark, whose rules for it are its own."""
    if not (isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this in _LITERAL_FORMS
            and isinstance(node.this, exp.Literal) and node.this.is_string):
        return False
    form, read = _LITERAL_FORMS[node.to.this]
    if not form.fullmatch(node.this.name):
        return False
    try:
        read(node.this.name)
    except ValueError:
        return False
    return True


@per_engine("compiled SQL", DRIVER)
@lru_cache(maxsize=512)
def _prepare(spark_sql: str, bucket: Bucket | None) -> Prepared | str:
    """:func:`prepare`, or the reason it is refused (for the log).

    The compiler says which output column is a hash bucket (``bucket``); DuckDB computes 0
    there and :mod:`~incr.runtime.sparkhash` the real value after the cast to Spark's types.
    """
    try:
        tree = sqlglot.parse_one(spark_sql, read="spark")
    except sqlglot.errors.ParseError as e:
        return f"sqlglot cannot parse the query ({str(e).splitlines()[0]})"
    if bucket is not None:
        projections = tree.expressions if isinstance(tree, exp.Select) else []
        at = [i for i, p in enumerate(projections)
              if isinstance(p, exp.Alias) and p.alias == bucket.column]
        if len(at) != 1:
            return f"it has no single column {bucket.column} to hash"
        projections[at[0]].set("this", exp.cast(exp.Literal.number(0), "INT"))
    for node in tree.walk():
        if implied_date(node) or _try_mod(node) or (isinstance(node, exp.Var)
                                                    and isinstance(node.parent, exp.TimestampTrunc)):
            continue  # no function of their own: the unit checked below, try_mod's operands
        if isinstance(node, exp.Mod) and not nonzero_number(node.expression):
            return (f"it uses {node.sql(dialect='spark')[:60]}, which Spark fails on a zero "
                    f"divisor (try_mod is NULL there, as DuckDB's %)")
        if isinstance(node, exp.Substring) and not _counted_alike(node):
            return (f"it uses {node.sql(dialect='spark')[:60]}, from a position or of a length "
                    f"Spark counts otherwise")
        if isinstance(node, _TEXT) and isinstance(node.this, exp.Literal) \
                and not node.this.name.isascii():
            return f"it uses {node.sql(dialect='spark')[:60]} of text beyond ASCII"
        if _other_form(node):
            return f"it uses {node.sql(dialect='spark')[:60]}, outside the driver-side set"
        if not isinstance(node, _ALLOWED):
            name = node.sql(dialect="spark")[:60] if isinstance(node, exp.Func) else type(node).__name__
            return f"it uses {name}, outside the driver-side set"
        if isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this not in _NUMERIC \
                and not _time_literal(node) and not _day_of(node):
            return f"it casts to {node.to.sql(dialect='spark')}, outside the driver-side set"
        if isinstance(node, exp.Pow) and not _exact_power(node):
            return f"it uses {node.sql(dialect='spark')[:60]}, outside the driver-side set"
    tree = _fast_decimal_casts(tree.transform(_strict_casts).transform(_truncating_casts)
                               .transform(_date_parts).transform(_remainders)
                               .transform(_truncations).transform(_days)
                               .transform(_ascii_text).transform(_patterns))
    if bucket is not None and not all(c in tree.named_selects for c in bucket.theta):
        return "its bucket hashes an expression, not output columns"
    return Prepared(tree.sql(dialect="duckdb"), bucket)


def _exact_power(node: exp.Pow) -> bool:
    """True for ``power(2, CAST(n AS <integer>))``: a power of two, exact in Java and C alike.

    Any other power may differ in its last bit between the JVM and DuckDB's libm.
    """
    base, exponent = node.this, node.expression
    return (isinstance(base, exp.Literal) and not base.is_string and base.this == "2"
            and isinstance(exponent, (exp.Cast, exp.TryCast)) and exponent.to.this in _INTEGRAL)


def _strict_casts(node: exp.Expr) -> exp.Expr:
    """``CAST`` fails on a value that does not fit, as in Spark with ANSI arithmetic.

    sqlglot reads Spark's ``CAST`` as a TRY_CAST (Spark's non-ANSI rule: NULL when it does
    not fit), so DuckDB would answer NULL where Spark raises; only a written ``try_cast``
    (``safe``) stays one.  DuckDB's error sends the query to Spark, which then raises.
    """
    if isinstance(node, exp.TryCast) and not node.args.get("safe"):
        return exp.Cast(this=node.this, to=node.to)
    return node


def _date_parts(node: exp.Expr) -> exp.Expr:
    """A date part as DuckDB's function of the value as it is.

    sqlglot writes Spark's ``year(x)`` as ``YEAR(CAST(x AS DATE))``, which would parse text
    by DuckDB's rules; without the cast DuckDB refuses text, and the query runs in Spark.
    """
    for part, name in DATE_PARTS:
        if type(node) is part:
            return exp.Anonymous(this=name, expressions=[date_part_of(node)])
    return node


def _try_mod(node: exp.Expr) -> bool:
    """Whether ``node`` is Spark's ``try_mod(x, y)``, the compiler's remainder by a column."""
    return (isinstance(node, exp.Anonymous) and node.name.lower() == "try_mod"
            and len(node.expressions) == 2)


def _remainders(node: exp.Expr) -> exp.Expr:
    """``try_mod(x, y)`` as DuckDB's ``x % y``: both NULL on a zero divisor, and both take
    the dividend's sign (``-7 % 3`` is -1), integers and floating point alike."""
    if _try_mod(node):
        return exp.Paren(this=exp.Mod(this=node.expressions[0], expression=node.expressions[1]))
    return node


def _truncation(node: exp.TimestampTrunc) -> str | None:
    """DuckDB's unit for Spark's ``date_trunc(unit, x)`` (None: a unit it does not take here)."""
    unit = node.args.get("unit")
    return _TRUNCATED.get(unit.name.upper()) if isinstance(unit, (exp.Var, exp.Literal)) else None


def _truncations(node: exp.Expr) -> exp.Expr:
    """``date_trunc(unit, x)`` as DuckDB's, of the value as it is (DuckDB refuses text, which
    Spark would cast).  A DATE truncated is a TIMESTAMP at midnight in both; DuckDB's has no
    zone, read as UTC (the zone of incr's sessions) by the cast to Spark's type."""
    if isinstance(node, exp.TimestampTrunc):
        unit = _truncation(node)
        assert unit is not None, "refused before"
        return exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string(unit), node.this])
    return node


def _day_of(node: exp.Expr) -> bool:
    """Whether ``node`` is the day of a value: a cast to DATE of anything but a literal
    (``CAST(sold_at AS DATE)``, a daily grain), which :func:`_days` takes of a DATE or a
    TIMESTAMP only."""
    return (isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this == exp.DataType.Type.DATE
            and not isinstance(node.this, exp.Literal))


def _days(node: exp.Expr) -> exp.Expr:
    """The day of a DATE or TIMESTAMP (``CAST(x AS DATE)``, ``to_date(x)``) as DuckDB's
    ``CAST(date_trunc('day', x) AS DATE)``: the same day in both engines, a TIMESTAMP's in UTC
    (the zone of incr's sessions and of the driver's DuckDB), one without zone its own.
    ``date_trunc`` refuses text, which Spark would parse by its own rules, and numbers, which
    it refuses too: the query then runs in Spark."""
    if _day_of(node) or (isinstance(node, exp.TsOrDsToDate) and not implied_date(node)):
        day = exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string("day"), node.this])
        return exp.Cast(this=day, to=exp.DataType.build("DATE"))
    return node


def _counted_alike(node: exp.Substring) -> bool:
    """Whether both engines take the same characters for ``substr(s, start[, length])``: a
    ``start`` of 1 or more and a ``length`` of 0 or more, written out.  (Spark reads a start
    of 0 as 1 and a negative length as none; DuckDB counts both otherwise.)"""
    start, length = integer_literal(node.args.get("start")), node.args.get("length")
    counted = None if length is None else integer_literal(length)
    return (start is not None and start >= 1
            and (length is None or (counted is not None and counted >= 0)))


def _ascii_text(node: exp.Expr) -> exp.Expr:
    """``upper``, ``lower``, ``length`` and ``substr`` of text only while it is ASCII.

    There the engines agree character for character; beyond it they may not (the compiler
    writes ``upper`` and ``lower`` so that Spark takes DuckDB's case of ``ß``, ``İ`` and a
    word's last capital sigma, but Java's full case mapping still differs for ligatures
    such as ``ﬁ``, Greek with a iota subscript and characters newer than DuckDB's tables).
    A value beyond ASCII (more bytes than characters) makes DuckDB raise, and the step
    runs in Spark.  Text these functions made of ASCII is ASCII, so only the innermost
    argument is checked; a literal was checked before.
    """
    if isinstance(node, _TEXT) and not isinstance(node.this, (exp.Literal, exp.Upper,
                                                               exp.Lower, exp.Substring)):
        text = node.this
        beyond = exp.NEQ(this=exp.Anonymous(this="strlen", expressions=[text.copy()]),
                         expression=exp.Anonymous(this="length", expressions=[text.copy()]))
        refuse = exp.Anonymous(this="error", expressions=[
            exp.Literal.string("text beyond ASCII: Spark decides its case and characters")])
        node.set("this", exp.Case(ifs=[exp.If(this=beyond, true=refuse)], default=text))
    return node


def _truncating_casts(node: exp.Expr) -> exp.Expr:
    """A cast to an integer type truncates toward zero, as Spark's does.

    DuckDB's rounds to the nearest (``CAST(2.7 AS INT)`` is 3 there, 2 in Spark), so the
    operand is truncated first; ``trunc`` keeps integer and DECIMAL operands exact, and one
    of another type (text) makes DuckDB refuse the query, which then runs in Spark.
    """
    if (isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this in _INTEGRAL
            and not isinstance(node.this, (exp.Literal, exp.Null))):
        node.set("this", exp.Anonymous(this="trunc", expressions=[node.this]))
    return node


#: The largest magnitude a DECIMAL(18, 0) holds: DuckDB keeps it in 64 bits.
_DECIMAL18 = 10**18 - 1


def _fast_decimal_casts(tree: exp.Expr) -> exp.Expr:
    """The truncating integer casts (:func:`_truncating_casts`) with no other one inside
    them in the form :func:`_through_int64_decimal` gives them.  That form names the operand
    four times, so a cast holding another keeps its own form: rewriting both would repeat
    the inner one sixteen times (and so on, a query's text growing with 4^depth); a SUM's
    cast to BIGINT, the case this is for, holds none."""
    def truncating(node: exp.Expr) -> bool:
        return (isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this in _INTEGRAL
                and isinstance(node.this, exp.Anonymous) and str(node.this.this).lower() == "trunc")
    leaves = [node for node in tree.find_all(exp.Cast, exp.TryCast) if truncating(node)
              and not any(truncating(inner) for inner in node.this.find_all(exp.Cast, exp.TryCast))]
    for cast in leaves:
        replacement = _through_int64_decimal(cast.copy())
        if cast is tree:
            return replacement
        cast.replace(replacement)
    return tree


def _through_int64_decimal(cast: exp.Cast | exp.TryCast) -> exp.Expr:
    """``cast`` (of a truncated value) taking DuckDB's fast path where it can.

    DuckDB (1.5) casts a DECIMAL(38, s) to an integer type 15-50 times slower than a
    DECIMAL(18, 0) (0.4 µs a value: 25 ms for an answer of 64K sums, which incr keeps as
    DECIMAL(38, 0)).  A DECIMAL value within DECIMAL(18, 0)'s range is cast through it,
    exactly (it is already truncated, so the cast to DECIMAL(18, 0) drops nothing); any
    other value, or NULL, takes the cast as written, with its errors (a TRY_CAST stays one
    on both paths: a value within the range may not fit an INT).  Only a DECIMAL: DuckDB's
    DOUBLE to DECIMAL cast is not exact for large values (2^33 · 2^20 came out 2^22 short),
    and the type test is DuckDB's ``typeof``, a constant once the query is planned, so an
    operand of another type costs nothing more.
    """
    value = cast.this
    bound = exp.Literal.number(_DECIMAL18)
    decimal = exp.Like(this=exp.Anonymous(this="typeof", expressions=[value.copy()]),
                       expression=exp.Literal.string("DECIMAL%"))  # folded when planned
    within = exp.and_(decimal, exp.Between(this=value.copy(), low=exp.Neg(this=bound.copy()),
                                           high=bound))
    fast = type(cast)(this=exp.Cast(this=value.copy(), to=exp.DataType.build("DECIMAL(18, 0)")),
                      to=cast.to.copy())
    return exp.Case(ifs=[exp.If(this=within, true=fast)], default=cast)


class LocalSql:
    """One DuckDB connection that runs prepared queries over registered Arrow tables."""

    def __init__(self, max_rows: int = 200_000, max_state_rows: int = 1_000_000):
        import duckdb

        self.max_rows = max_rows
        self.max_state_rows = max_state_rows
        self._con = duckdb.connect()
        self._con.execute("SET threads TO 2")
        self._con.execute("SET TimeZone = 'UTC'")  # as Spark's session: date parts of a TIMESTAMP
        self.queries = 0  # how many ran here (tests and benchmarks read it)
        self._kept: DiskCache | None = None

    def keep_translations(self, folder: Path) -> None:
        """Keeps the DuckDB form of each query in ``folder`` (the program's, in the
        warehouse), for the next process to read instead of translating it again
        (:mod:`~incr.runtime.diskcache`)."""
        generation = translator()
        self._kept = DiskCache(folder, generation) if generation is not None else None

    def translate(self, spark_sql: str, bucket: Bucket | None) -> Prepared | str:
        """The query's DuckDB form, or why it has none (:func:`_prepare`), from disk when
        :meth:`keep_translations` was called and a process kept it."""
        return _prepare(spark_sql, bucket) if self._kept is None else \
            _kept(spark_sql, bucket, self._kept)

    def query(self, spark_sql: Query | str, tables: dict[str, pa.Table],
              schema: pa.Schema) -> pa.Table | None:
        """Runs ``spark_sql`` over ``tables`` (name → rows), cast to ``schema``; None: use Spark."""
        engine = DriverEngine(self)
        try:
            for name, data in tables.items():
                engine.table(name, data)
            return engine.collect(spark_sql, schema)
        except NotLocal:
            return None
        finally:
            engine.close()

    def _run(self, query: Query, schema: pa.Schema, most: int | None = None) -> pa.Table:
        """The query's rows cast to ``schema`` with its bucket filled in; NotLocal says why not.

        ``most``: the rows the driver takes from a query over tables it did not hold
        (:meth:`DriverEngine.scan`): the result is fetched in batches and given up past it.
        """
        import duckdb

        prepared = self.translate(query.sql, query.bucket)
        if isinstance(prepared, str):
            raise NotLocal(prepared)
        try:
            if most is None:
                result = self._con.execute(prepared.sql).to_arrow_table()
            else:
                result = _at_most(self._con.execute(prepared.sql).fetch_record_batch(), most)
        except duckdb.Error as e:
            raise NotLocal(f"DuckDB refused it ({str(e).splitlines()[0][:120]})") from e
        if sorted(result.column_names) != sorted(schema.names):
            raise NotLocal(f"its columns {result.column_names} are not the table's {schema.names}")
        try:
            out = pa.table([result[f.name].cast(f.type) for f in schema], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise NotLocal(f"a value does not fit the table's types ({str(e)[:120]})") from e
        _check_precision(out)
        if prepared.bucket is not None:
            # Hashed after the cast: Spark hashes its own types (an INT and a BIGINT of the
            # same value hash differently), and DuckDB may have widened a key expression.
            column, theta, count = prepared.bucket
            try:
                values = sparkhash.buckets([out[c] for c in theta], count)
            except sparkhash.UnsupportedType as e:
                raise NotLocal(f"sparkhash does not reproduce a θ type ({e})") from e
            index = out.schema.get_field_index(column)
            out = out.set_column(index, schema.field(index), values.cast(schema.field(index).type))
        self.queries += 1
        return out


def _at_most(reader: pa.RecordBatchReader, most: int) -> pa.Table:
    """The reader's rows, while they are at most ``most``; NotLocal past that."""
    batches, rows = [], 0
    for batch in reader:
        rows += batch.num_rows
        if rows > most:
            raise NotLocal(f"its result holds more than INCR_LOCAL_STATE_ROWS={most} rows")
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


#: Characters DuckDB's Parquet reader takes for a pattern in a file's name.
_PATTERN = set("*?[]{}")
#: The columns :func:`parquet_scan` asks DuckDB's reader for, besides the table's.
_SCAN_COLUMNS = {"filename", "file_row_number"}
#: DuckDB's names of the types a partition column may have (incr partitions by ``_bucket``).
_PARTITION_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.string(): "VARCHAR"}


@per_engine("Delta read from its files", DRIVER)
def parquet_scan(snapshot: Snapshot, gone: str | None) -> str:
    """DuckDB SQL reading the rows of a table's version from its Parquet files, as Spark's
    :func:`~incr.runtime.session.read_delta` does: the partition values from the files'
    folders, a column some files lack as NULL, and with ``gone`` (a table of ``file``,
    ``row``: the rows the deletion vectors delete, positions from 0) those rows left out.

    Raises:
        NotLocal: a file DuckDB cannot read by its name, or a column it cannot tell apart
            from the reader's own.
    """
    odd = [f for f in snapshot.files if "://" in f or _PATTERN & set(f) or "'" in f]
    if odd:
        raise NotLocal(f"{Path(snapshot.root).name}: DuckDB would not read {odd[0]} by its name")
    if snapshot.partition_by and "=" in snapshot.root:  # DuckDB would take it for a partition
        raise NotLocal(f"{Path(snapshot.root).name}: its folder's path holds a '='")
    if _SCAN_COLUMNS & set(snapshot.schema.names):
        raise NotLocal(f"{Path(snapshot.root).name}: a column is named like one DuckDB's "
                       f"reader adds ({', '.join(sorted(_SCAN_COLUMNS))})")
    options = ["union_by_name = true"]
    if snapshot.partition_by:
        kinds = {c: _PARTITION_TYPES.get(snapshot.schema.field(c).type)
                 for c in snapshot.partition_by}
        if None in kinds.values():
            raise NotLocal(f"{Path(snapshot.root).name}: a partition column of a type the "
                           f"driver does not read from a folder's name")
        options += ["hive_partitioning = true", "hive_types = {" + ", ".join(
            f"'{c}': {kind}" for c, kind in kinds.items()) + "}"]
    else:
        options.append("hive_partitioning = false")
    if gone is not None:
        options += ["filename = true", "file_row_number = true"]
    files = ", ".join(f"'{f}'" for f in snapshot.files)
    columns = ", ".join(f'p."{c}"' for c in snapshot.schema.names)
    sql = f"SELECT {columns} FROM read_parquet([{files}], {', '.join(options)}) AS p"
    if gone is not None:
        sql += f' ANTI JOIN "{gone}" AS g ON p.filename = g.file AND p.file_row_number = g.row'
    return sql


def _check_precision(table: pa.Table) -> None:
    """Raises NotLocal if a DECIMAL value has more digits than its column's precision.

    DuckDB sums DECIMALs in 128 bits without checking the declared precision (a DECIMAL(38,2)
    sum may hold 39 digits), and Arrow's cast to the same type checks nothing; Spark (ANSI)
    refuses such a value, and its refusal is the one incr gives, on either engine.
    """
    import pyarrow.compute as pc

    for field in table.schema:
        if not pa.types.is_decimal(field.type) or table[field.name].null_count == len(table):
            continue
        bounds = pc.min_max(table[field.name])
        limit = Decimal(f"1e{field.type.precision - field.type.scale}")
        if any(v.as_py() is not None and abs(v.as_py()) >= limit for v in bounds.values()):
            raise NotLocal(f"a value of {field.name} has more digits than DECIMAL"
                           f"({field.type.precision},{field.type.scale}) holds")


class DriverEngine(Engine):
    """The driver-side engine (:class:`~incr.runtime.engine.Engine`) on one DuckDB connection.

    Rows and small Delta tables are registered as Arrow, queries become DuckDB views, and
    each collected result is cast to its target table's schema.  Anything outside the
    driver-side set raises :class:`~incr.runtime.engine.NotLocal` with the reason;
    :meth:`close` drops everything either way.
    """

    name = DRIVER
    narrows = True

    def __init__(self, sql: LocalSql, store: DeltaStore | None = None):
        self.sql = sql
        self.store = store
        self._tables: list[str] = []
        self._views: list[str] = []
        self._held: list[str] = []  # DuckDB tables (:meth:`hold`)
        self._scanned = False  # a table registered by scan() is read as a query runs

    def table(self, name: str, data: pa.Table) -> str:
        """Registers ``data`` as ``name``; rows with a NaN are copied into DuckDB instead.

        DuckDB 1.5.6 pushes a query's filters into its scan of an Arrow table, where they
        compare a NaN as IEEE does (``NaN > 0`` false) and not as DuckDB and Spark do (NaN
        above every number; duckdb-python issue 615): ``WHERE x > 0`` lost the NaN rows.
        A table of DuckDB's own compares as DuckDB does; the copy is made only when a NaN
        is there to compare.
        """
        self._forget(name)  # a name is a view of Arrow or a table of DuckDB's, not both
        if not _has_nan(data):
            self.sql._con.register(name, data)
            self._tables.append(name)
            return name
        arrow = f"{name}__arrow"
        self.sql._con.register(arrow, data)
        try:
            self.sql._con.execute(f'CREATE OR REPLACE TEMP TABLE "{name}" AS SELECT * FROM "{arrow}"')
        finally:
            self.sql._con.unregister(arrow)
        self._held.append(name)
        return name

    def _forget(self, name: str) -> None:
        """Drops what :meth:`table` made of ``name`` before, so it can be made again."""
        if name in self._tables:
            self.sql._con.unregister(name)
            self._tables.remove(name)
        if name in self._held:
            self.sql._con.execute(f'DROP TABLE IF EXISTS "{name}"')
            self._held.remove(name)

    def delta(self, name: str, path: Path, buckets: Iterable[int] | None = None,
              matching: Mapping[str, pa.Array] | None = None, every: bool = False,
              bucketed_by: tuple[str, int] | None = None) -> str:
        """Registers a Delta table (its ``buckets``) read by delta-rs, if what is read holds
        at most ``max_state_rows``.

        With ``matching``, only the matching rows are read (a scan that keeps them, so the
        driver holds what a change joins, not the table) and the limit applies to them.
        """
        assert self.store is not None, "this driver engine reads no Delta tables"
        if matching is not None:
            try:
                rows_read = self.store.read_matching(path, matching, buckets, every=every,
                                                     bucketed_by=bucketed_by)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise NotLocal(f"{Path(path).name}: the change's join keys do not fit its "
                               f"column types ({str(e)[:120]})") from e
            if rows_read.num_rows > self.sql.max_state_rows:
                raise NotLocal(f"{Path(path).name}: {rows_read.num_rows} rows meet the change "
                               f"> INCR_LOCAL_STATE_ROWS={self.sql.max_state_rows}")
            return self.table(name, rows_read)
        rows = self.store.row_count(path, buckets)
        what = Path(path).name if buckets is None else f"the touched buckets of {Path(path).name}"
        if rows is None:
            raise NotLocal(f"{what}: its row count is not recorded")
        if rows > self.sql.max_state_rows:
            raise NotLocal(f"{what} has {rows} rows > INCR_LOCAL_STATE_ROWS="
                           f"{self.sql.max_state_rows}")
        return self.table(name, self.store.read(path, buckets=buckets))

    def scan(self, name: str, path: Path) -> str:
        """:meth:`delta` while the table holds at most ``max_state_rows``; a larger one is
        defined as a DuckDB view over its Parquet files (:func:`parquet_scan`), which DuckDB
        reads as the query runs, holding what the query keeps (a few groups' aggregates, the
        first k rows), not the table.  Spark's per-job cost is then left for queries whose
        result is large: a query over such a view gives way to Spark once its result passes
        ``max_state_rows`` (:meth:`collect`).  A table whose files DuckDB cannot name
        (remote, or a path it would read as a pattern) is for Spark."""
        import duckdb

        assert self.store is not None, "this driver engine reads no Delta tables"
        rows = self.store.row_count(path)
        if rows is not None and rows <= self.sql.max_state_rows:
            return self.delta(name, path)
        try:
            snapshot = self.store.snapshot(path)
        except StorageError as e:
            raise NotLocal(f"{Path(path).name}: {e}") from e
        gone = None
        if snapshot.deleted:  # rows of the files' deletion vectors: left out by file and row
            gone = self.table(f"{name}__gone", snapshot.deleted_rows("file", "row"))
        if not snapshot.files:
            return self.table(name, snapshot.schema.empty_table())
        sql = parquet_scan(snapshot, gone)
        try:  # DuckDB reads the files' footers as it defines the view
            self.sql._con.execute(f'CREATE OR REPLACE TEMP VIEW "{name}" AS {sql}')
        except duckdb.Error as e:
            raise NotLocal(f"{Path(path).name}: DuckDB refused its files "
                           f"({str(e).splitlines()[0][:120]})") from e
        self._views.append(name)
        self._scanned = True
        return name

    def view(self, name: str, sql: Query | str, cache: bool = False,
             schema: pa.Schema | None = None) -> str:
        """Defines ``name`` as the query.  A query that hashes a bucket is computed at once
        and registered as rows of ``schema`` (the bucket needs the Spark types of a result);
        without ``schema`` it is left to Spark."""
        query = as_query(sql)
        if query.bucket is not None:
            if schema is None:
                raise NotLocal(f"{name}: it hashes a bucket outside a collected result")
            return self.table(name, self.collect(query, schema))
        self._define("VIEW", name, query.sql)
        self._views.append(name)
        return name

    def hold(self, name: str, sql: str) -> str:
        """A DuckDB table of the query's rows: DuckDB knows its size and keeps statistics,
        so it plans joins with it well (a registered Arrow table is a scan of unknown size)."""
        self._define("TABLE", name, sql)
        self._held.append(name)
        return name

    def _define(self, kind: str, name: str, sql: str) -> None:
        """``CREATE TEMP {kind} name AS`` the query (Spark SQL, written for DuckDB)."""
        import duckdb

        prepared = self.sql.translate(sql, None)
        if isinstance(prepared, str):
            raise NotLocal(f"{name}: {prepared}")
        try:
            self.sql._con.execute(f'CREATE OR REPLACE TEMP {kind} "{name}" AS {prepared.sql}')
        except duckdb.Error as e:
            raise NotLocal(f"{name}: DuckDB refused it ({str(e).splitlines()[0][:120]})") from e

    def collect(self, sql: Query | str, schema: pa.Schema | None = None) -> pa.Table:
        if schema is None:
            raise NotLocal("the result has no target table to take its types from")
        return self.sql._run(as_query(sql), schema,
                             most=self.sql.max_state_rows if self._scanned else None)

    def close(self) -> None:
        for name in reversed(self._views):
            self.sql._con.execute(f'DROP VIEW IF EXISTS "{name}"')
        for name in self._tables:
            self.sql._con.unregister(name)
        for name in self._held:
            self.sql._con.execute(f'DROP TABLE IF EXISTS "{name}"')
        self._tables, self._views, self._held = [], [], []
        self._scanned = False


def _has_nan(data: pa.Table) -> bool:
    """Whether a FLOAT or DOUBLE column of ``data`` holds a NaN."""
    import pyarrow.compute as pc

    return any(pa.types.is_floating(f.type) and pc.any(pc.is_nan(data[f.name])).as_py()
               for f in data.schema)


class TypedDriverEngine(DriverEngine):
    """A driver engine that also knows the Spark types of everything it registers
    (:class:`~incr.runtime.sparktypes.SparkTypes`), so a result with no table to take its
    types from yet (a view's state tables at their creation, its answer at its first
    publish) is cast to the types Spark would have given it, and Spark need not start.

    A query whose Spark types are not known here raises
    :class:`~incr.runtime.engine.NotLocal`, as anything else outside the driver-side set.
    """

    def __init__(self, sql: LocalSql, store: DeltaStore | None = None):
        super().__init__(sql, store)
        self.types = SparkTypes()

    def table(self, name: str, data: pa.Table) -> str:
        self.types.register(name, spark_form(data.schema))
        return super().table(name, data)

    def delta(self, name: str, path: Path, buckets: Iterable[int] | None = None,
              matching: Mapping[str, pa.Array] | None = None, every: bool = False,
              bucketed_by: tuple[str, int] | None = None) -> str:
        super().delta(name, path, buckets, matching, every, bucketed_by)
        assert self.store is not None
        self.types.register(name, spark_form(self.store.schema(path)))  # Spark reads these
        return name

    def view(self, name: str, sql: Query | str, cache: bool = False,
             schema: pa.Schema | None = None) -> str:
        typed = schema if schema is not None else self.types.schema(as_query(sql).sql)
        super().view(name, sql, cache, typed)
        self.types.register(name, typed)
        return name

    def schema_of(self, name: str) -> pa.Schema:
        return self.types.registered(name)

    def collect(self, sql: Query | str, schema: pa.Schema | None = None) -> pa.Table:
        if schema is None:
            schema = self.types.schema(as_query(sql).sql)
        return super().collect(sql, schema)

"""The SQL dialects the compiler reads and writes, and the spelling they share.

A leaf of the compiler: it imports sqlglot, :mod:`incr.compiler.duckdb_calls` and
:mod:`incr.compiler.duckdb_scalars` (leaves too) only, so every other module of
:mod:`incr.compiler` may import it without a cycle.
Programs are read in the project's canonical dialect (DuckDB spelling, see
:mod:`incr.compiler.scalar`) and the SQL the runtime executes is written in Spark's.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlglot import exp

from incr.compiler.duckdb_calls import (
    MATCHES,
    PARTS,
    call,
    concat,
    date_add,
    date_diff,
    filled,
    integer_literal,
    known,
    matches,
    regexp_escape,
    regexp_replace,
    shifted,
    time_format,
    truncated,
)
from incr.compiler.duckdb_scalars import as_spark

#: The dialect a :class:`~incr.compiler.scalar.Scalar`'s text is kept in.
CANONICAL_DIALECT = "duckdb"
#: The dialect of the SQL the runtime executes.
SPARK = "spark"

#: Column holding each state row's multiplicity (rows of θ folded into it).
ROW_COUNT = "_n"
#: Partition column of every state table: a hash bucket of θ.
BUCKET = "_bucket"
#: Column of signed multiplicities in a change set (+n: n copies in, -n: n copies out).
WEIGHT = "_w"
#: Alias of the main state table in the answer query.
MAIN = "m"


class Bucket(NamedTuple):
    """A hash bucket a query computes: ``column = pmod(xxhash64(theta...), buckets)``.

    ``theta`` are the query's own output columns, hashed with Spark's types (the driver-side
    engine computes it after casting its result to them).
    """

    column: str
    theta: tuple[str, ...]
    buckets: int


class Query(NamedTuple):
    """A query as the compiler hands it to the runtime.

    Spark SQL text, and what the compiler knows about it that an engine may need (the hash
    bucket it computes), so no engine parses the text to find it out.
    """

    sql: str
    bucket: Bucket | None = None


def vanished(count: str) -> str:
    """SQL that is true when a state row whose row count is ``count`` is gone.

    The one rule of vanishing: a row of a table that :attr:`StateTable.vanishes` is deleted
    exactly when its row count reaches 0 (its group has no live row left).  Every MERGE
    predicate and query that drops such rows is built from this and :func:`live`.
    """
    return f"{count} = 0"


def live(count: str) -> str:
    """SQL that is true when a state row whose row count is ``count`` is live.

    The complement of :func:`vanished` for stored rows: a stored count is never negative,
    since deletions are validated against the row index.
    """
    return f"{count} > 0"


def q(name: str) -> str:
    """A back-quoted Spark identifier."""
    return "`" + name.replace("`", "``") + "`"


def nonzero_number(node: exp.Expr) -> bool:
    """Whether ``node`` is a number written out other than zero: a divisor no row can make 0.

    ``3``, ``-2.5`` and ``(7)`` are; a column, an expression and ``0`` are not.
    """
    while isinstance(node, (exp.Neg, exp.Paren)):
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return False
    try:
        return float(node.this) != 0
    except ValueError:
        return False


def render_expression(tree: exp.Expr, dialect: str) -> str:
    """SQL text of a scalar expression in ``dialect``.

    For Spark, what DuckDB (the program's dialect) computes otherwise is written as DuckDB
    computes it, leaves first so that nested operators are rewritten too:

    - division is ``try_divide`` over DOUBLEs: DuckDB's ``/`` is floating-point division
      even for integers and decimals, and NULL on a zero divisor (as the oracle's is,
      :func:`incr.oracle.connect`) where Spark's ANSI mode would fail the batch;
    - a remainder by anything but a non-zero number is ``try_mod``, NULL on a zero divisor
      as DuckDB's ``%`` is;
    - a substring that may start at 0 or be of a negative length takes DuckDB's characters
      (:func:`_duckdb_substring`);
    - a day of the week counts as DuckDB's does, and a second is whole, a month's or a day's
      name written out (:func:`_duckdb_date_part`), as are the parts Spark has no function
      or EXTRACT of (the epoch with its fraction, milliseconds, the ISO year, ...);
    - ``date_diff`` counts its part's boundaries, ``date_trunc`` takes DuckDB's units,
      a DATE plus an INTERVAL is a TIMESTAMP,
      ``concat`` takes numbers and ``regexp_replace`` replaces the first match unless told ``g``;
      every pattern is RE2's under DuckDB's options, written as Java's
      (:mod:`incr.compiler.duckdb_calls`);
    - ``left``, ``right``, ``split_part``, ``unicode``, ``levenshtein``, ``isnan``, ``//``,
      ``printf`` and the calls Spark has no function of the name of take DuckDB's values
      (:mod:`incr.compiler.duckdb_scalars`).
    """
    if dialect == SPARK:
        def as_duckdb(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Div):  # DuckDB's `/` is floating-point division
                return exp.Anonymous(this="try_divide", expressions=[
                    exp.cast(node.this, "DOUBLE"), exp.cast(node.expression, "DOUBLE")])
            if isinstance(node, exp.Mod) and not nonzero_number(node.expression):
                return exp.Anonymous(this="try_mod", expressions=[node.this, node.expression])
            if isinstance(node, exp.Substring):
                return _duckdb_substring(node)
            if isinstance(node, exp.RegexpReplace):
                return regexp_replace(node)
            if isinstance(node, MATCHES):
                return matches(node)
            if isinstance(node, exp.Anonymous) and node.name.lower() == "regexp_escape" \
                    and len(node.expressions) == 1:
                return regexp_escape(node)
            if type(node) is exp.Concat and node.args.get("coalesce"):  # not ConcatWs
                return concat(node)
            if isinstance(node, exp.DateDiff):
                return date_diff(node)
            if isinstance(node, (exp.Add, exp.Sub)):
                return shifted(node)
            if isinstance(node, exp.DateAdd):
                return date_add(node)
            if isinstance(node, exp.TimestampTrunc):
                return truncated(node)
            if isinstance(node, exp.TimeToStr):
                return time_format(node)
            spelled = as_spark(node)
            return spelled if spelled is not node else _duckdb_date_part(node)

        tree = exp.replace_tree(tree.copy(), as_duckdb)
    return tree.sql(dialect=dialect)


def _day_of_week(x: exp.Expr) -> exp.Expr:
    """DuckDB's ``dayofweek(x)`` (Sunday 0 to Saturday 6): Spark's counts from Sunday 1."""
    return exp.Paren(this=exp.Sub(this=call("dayofweek", x), expression=exp.Literal.number(1)))


def _iso_day(x: exp.Expr) -> exp.Expr:
    """DuckDB's ``isodow(x)`` (Monday 1 to Sunday 7): Spark's ``weekday`` counts from Monday 0."""
    return exp.Paren(this=exp.Add(this=call("weekday", x), expression=exp.Literal.number(1)))


#: DuckDB's parts of a date or time that Spark's EXTRACT (or ``date_part``) of the same unit
#: computes otherwise, as Spark computes DuckDB's: the day of the week (DuckDB's from Sunday
#: 0, Spark's from Sunday 1), the ISO day (Spark has no ISODOW) and the second (DuckDB's
#: whole, Spark's EXTRACT keeps its fraction).
_PARTS = {"DOW": _day_of_week, "DAYOFWEEK": _day_of_week, "WEEKDAY": _day_of_week,
          "ISODOW": _iso_day, "SECOND": lambda x: call("second", x),
          "SECONDS": lambda x: call("second", x), **PARTS}


#: DuckDB's functions of one date or time named after a part above, which Spark has not or
#: computes otherwise.
_FUNCTIONS = frozenset({"weekday", "millisecond", "microsecond", "nanosecond", "isoyear",
                        "yearweek", "decade", "century", "millennium"})
#: DuckDB's ``prefix`` and ``suffix`` (of a text), Spark's ``startswith`` and ``endswith``.
_AFFIXES = {"prefix": "startswith", "suffix": "endswith"}


def _duckdb_date_part(node: exp.Expr) -> exp.Expr:
    """``node`` as DuckDB computes it, in Spark, when Spark's function of its name differs.

    Those are the day of the week (also ``weekday``, which is Monday 0 in Spark),
    ``isodow``, DuckDB's EXTRACT and ``date_part`` of those and of the second, and
    ``monthname`` and ``dayname`` (``December`` and ``Sunday`` in DuckDB, ``Dec`` and
    ``Sun`` in Spark; ``date_format`` writes them in English, as Spark's formats always
    do); DuckDB's ``epoch`` (with the second's fraction), ``week``, ``millisecond``,
    ``microsecond``, ``isoyear`` and ``yearweek``, and EXTRACT and ``date_part`` of those and
    of the decade, century and millennium (:data:`incr.compiler.duckdb_calls.PARTS`); and
    ``prefix`` and ``suffix``.  Any other node is returned as it is.
    """
    if isinstance(node, exp.DayOfWeek):
        return _day_of_week(node.this)
    if isinstance(node, exp.DayOfWeekIso):
        return _iso_day(node.this)
    if isinstance(node, exp.TimeToUnix):  # DuckDB's epoch(), with the second's fraction
        return PARTS["EPOCH"](node.this)
    if isinstance(node, exp.Week):  # DuckDB's week() is the ISO week, Spark's weekofyear
        return call("weekofyear", node.this)
    if isinstance(node, (exp.Monthname, exp.Dayname)):
        pattern = "MMMM" if isinstance(node, exp.Monthname) else "EEEE"
        return call("date_format", node.this, exp.Literal.string(pattern))
    unit, x = None, None
    if isinstance(node, exp.Extract):
        unit, x = node.this.name, node.expression
    elif isinstance(node, exp.Anonymous) and len(node.expressions) in (1, 2):
        name, args = node.name.lower(), node.expressions
        if name in _FUNCTIONS and len(args) == 1:
            unit, x = name.upper(), args[0]
        elif name in _AFFIXES and len(args) == 2:
            return call(_AFFIXES[name], *args)
        elif name == "round_even" and len(args) == 2 and integer_literal(args[1]) == 0:
            return call("bround", *args)  # half to even, as DuckDB casts a DOUBLE to an integer
        elif name in ("date_part", "datepart") and len(args) == 2 \
                and isinstance(args[0], exp.Literal) and args[0].is_string:
            unit, x = args[0].name, args[1]
    rewrite = _PARTS.get(unit.upper()) if unit else None
    return rewrite(x) if rewrite is not None and x is not None else node


#: ``substr(s, st, ln)`` as DuckDB takes it, in Spark: DuckDB reads a start of 0 as the
#: place before the first character (so one fewer is taken) and a negative length as the
#: characters before the start; Spark reads 0 as 1 and takes nothing for a negative length.
#: DuckDB's place of the start (from 0), ``a``, is ``st - 1``, or ``length(s) + st`` for a
#: negative one, as Spark's is but for 0; it takes the characters from ``lo``, the lesser of
#: ``a`` and ``a + ln`` (at least 0), to ``hi``, the greater, which Spark takes as its start
#: ``lo + 1`` and length ``hi - lo``.  ``st`` and ``ln`` are read as BIGINT, as DuckDB's are.
_PLACE = "CASE WHEN :st >= 0 THEN :st - 1 ELSE LENGTH(:s) + :st END"
_LOW = "GREATEST(LEAST(:a, :a + :ln), 0)"
#: Spark's start and length of those characters.  Spark takes INTs (ANSI mode fails a batch
#: on a BIGINT beyond them), and a text is shorter than 2^31 - 1 characters: a start or a
#: length beyond is taken as that, with the same characters taken.
_INT_MAX = 2**31 - 1
_SPARK_START = f"CAST(LEAST(:lo, {_INT_MAX - 1}) + 1 AS INT)"
_SPARK_LENGTH = f"CAST(LEAST(GREATEST(GREATEST(:a, :a + :ln) - :lo, 0), {_INT_MAX}) AS INT)"
#: A start without a length, as Spark's INT: beyond it, past either end of any text.
_SPARK_PLACE = f"CAST(LEAST(GREATEST(:st, {-_INT_MAX}), {_INT_MAX}) AS INT)"


def _duckdb_substring(node: exp.Substring) -> exp.Expr:
    """``node`` taking the characters DuckDB takes, in Spark.

    Without a length the engines agree (from 0 or 1, both take the whole text), and so they
    do for a start other than 0 and a length of 0 or more written out: those are left as
    they are, so no plan of them changes, unless a number is beyond Spark's INT (taken as
    the INT nearest, which takes the same characters).  Otherwise the result calls an
    anonymous ``substr``, which this rewrite does not visit again.
    """
    s, st, ln = node.this, node.args.get("start"), node.args.get("length")
    start, length = integer_literal(st), integer_literal(ln)
    if st is None:
        return node
    if ln is None:
        if start is not None and abs(start) <= _INT_MAX:
            return node
        place = (exp.Literal.number(max(min(start, _INT_MAX), -_INT_MAX)) if start is not None
                 else filled(_SPARK_PLACE, st=exp.cast(st.copy(), "BIGINT")))
        return known(exp.Anonymous(this="substr", expressions=[s.copy(), place]), st)
    if (start not in (None, 0) and length is not None and 0 <= length <= _INT_MAX
            and abs(start) <= _INT_MAX):
        return node
    if start is not None and start >= 0 and length is not None:  # a place written out
        lo, hi = sorted((start - 1, start - 1 + length))
        lo = max(lo, 0)
        return exp.Anonymous(this="substr", expressions=[
            s.copy(), exp.Literal.number(min(lo, _INT_MAX - 1) + 1),
            exp.Literal.number(min(max(hi - lo, 0), _INT_MAX))])
    wide = {"s": s, "st": exp.cast(st.copy(), "BIGINT"), "ln": exp.cast(ln.copy(), "BIGINT")}
    wide["a"] = filled(_PLACE, **wide)
    wide["lo"] = filled(_LOW, **wide)
    return known(exp.Anonymous(this="substr", expressions=[
        s.copy(), filled(_SPARK_START, **wide), filled(_SPARK_LENGTH, **wide)]), st, ln)

r"""DuckDB's calls of dates, times and patterns as Spark computes them.

A program's SQL means what DuckDB computes (the oracle runs it as written), and sqlglot
writes some of DuckDB's calls as Spark's functions of the same name, which compute
something else or do not exist.  Each rewrite here is Spark text that takes DuckDB's
values, NULL included; :func:`incr.compiler.dialect.render_expression` applies them to the
compiler's Spark text.

- ``date_diff`` and ``datediff`` count the boundaries of their part between two times
  (one month from 31 January to 1 February); Spark's ``DATEDIFF(MONTH, …)`` counts the
  whole months elapsed (none).
- ``epoch`` keeps the fraction of a second, Spark's ``unix_timestamp`` drops it; Spark
  has no ``millisecond``, ``microsecond``, ``isoyear``, ``yearweek``, ``week``, ``prefix``
  or ``suffix``, and no EXTRACT of the epoch, decade, century or millennium.
- ``date_trunc`` to a decade, century, millennium or ISO year is NULL in Spark.
- ``strftime``'s format is C's; Spark's ``date_format`` takes Java's (:func:`java_format`).
- A DATE plus or minus an INTERVAL (also ``date_add``) is a TIMESTAMP in DuckDB and a DATE
  in Spark, whose ``date_add`` takes no INTERVAL.
- ``concat`` of a number fails in Spark as sqlglot writes it (each argument coalesced to
  ``''``); each is cast to text first.
- ``regexp_replace`` replaces the first match in DuckDB, unless its options say ``g``,
  and every match in Spark; DuckDB's replacement names a group ``\1``, Spark's ``$1``.
- Every pattern (``regexp_matches``, ``regexp_full_match`` and ``~``, ``regexp_extract``,
  ``regexp_extract_all``, ``regexp_replace``) is RE2's under DuckDB's options, and is
  written as a Java pattern of the same matches (:mod:`incr.compiler.patterns`); Spark's
  functions take no options, and ``regexp_full_match`` is none of Spark's.

Times are read in UTC, the zone of incr's Spark sessions and of the oracle.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlglot import exp, parse_one

from incr.compiler.patterns import java_pattern
from incr.errors import CompileError

SPARK = "spark"


def call(name: str, *args: exp.Expr) -> exp.Expr:
    """Spark's function ``name`` of copies of ``args``, as a call no rewrite visits."""
    return exp.Anonymous(this=name, expressions=[a.copy() for a in args])


def integer_literal(node: exp.Expr | None) -> int | None:
    """The value of an integer written out, else None.

    ``-5`` and ``(7)`` count too: Spark reads them as one literal.
    """
    sign = 1
    while isinstance(node, (exp.Neg, exp.Paren)):
        sign = -sign if isinstance(node, exp.Neg) else sign
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit():
        return sign * int(node.name)
    return None


def known(value: exp.Expr, *operands: exp.Expr) -> exp.Expr:
    """``value``, NULL when one of ``operands`` is, as DuckDB's call of them is.

    Spark's GREATEST and LEAST skip a NULL, and its ``printf`` writes ``null``.  Literals
    written out are never NULL, so no check is written for them.
    """
    computed = [o for o in operands
                if not isinstance(o, exp.Literal) and integer_literal(o) is None]
    if not computed:
        return value
    checks = exp.and_(*(exp.Not(this=exp.Is(this=o.copy(), expression=exp.Null()))
                        for o in computed))
    return exp.Case(ifs=[exp.If(this=checks, true=value)])


def filled(template: str, **parts: exp.Expr) -> exp.Expr:
    """``template`` (Spark SQL) with each ``:name`` replaced by a copy of ``parts[name]``."""
    def fill(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder) and node.name in parts:
            return parts[node.name].copy()
        return node
    return parse_one(template, read=SPARK).transform(fill)


def _of(template: str) -> Callable[[exp.Expr], exp.Expr]:
    """A rewrite of one argument ``:x`` into ``template``.

    The result is kept in parentheses, so that it is never a node of a class a rewrite
    would visit again.
    """
    return lambda x: exp.Paren(this=filled(template, x=x))


#: Microseconds since the epoch of a DATE or TIMESTAMP (a DATE's midnight), in UTC.
_MICROS = "unix_micros(CAST(:x AS TIMESTAMP))"
#: DuckDB's ISO year: the year of the Thursday of the ISO week (which starts on Monday).
_ISO_YEAR = "year(date_add(CAST(:x AS DATE), 3 - weekday(:x)))"

#: DuckDB's parts of a date or time Spark lacks, by the unit's name in EXTRACT and
#: ``date_part`` (also the name of DuckDB's function where there is one).
PARTS: dict[str, Callable[[exp.Expr], exp.Expr]] = {
    "EPOCH": _of(f"{_MICROS} / 1000000D"),
    "MILLISECOND": _of(f"pmod({_MICROS}, 60000000) DIV 1000"),
    "MICROSECOND": _of(f"pmod({_MICROS}, 60000000)"),
    "NANOSECOND": _of(f"pmod({_MICROS}, 60000000) * 1000"),
    "DECADE": _of("year(:x) DIV 10"),
    "CENTURY": _of("(year(:x) - 1) DIV 100 + 1"),
    "MILLENNIUM": _of("(year(:x) - 1) DIV 1000 + 1"),
    "ISOYEAR": _of(_ISO_YEAR),
    "YEARWEEK": _of(f"{_ISO_YEAR} * 100 + weekofyear(:x)"),
}
for _unit, _same in (("MILLISECOND", "MILLISECONDS"), ("MICROSECOND", "MICROSECONDS"),
                     ("NANOSECOND", "NANOSECONDS")):
    PARTS[_same] = PARTS[_unit]


#: DuckDB's units of ``date_trunc`` that Spark's does not take (it is NULL there): the
#: first instant of each, as Spark's ``date_trunc`` of a day that starts it (weeks on Monday).
_TRUNCATIONS = {
    "DECADE": _of("date_trunc('YEAR', make_date(year(:x) DIV 10 * 10, 1, 1))"),
    "CENTURY": _of("date_trunc('YEAR', make_date(year(:x) DIV 100 * 100, 1, 1))"),
    "MILLENNIUM": _of("date_trunc('YEAR', make_date(year(:x) DIV 1000 * 1000, 1, 1))"),
    "ISOYEAR": _of(f"date_trunc('WEEK', make_date({_ISO_YEAR}, 1, 4))"),
}


def truncated(node: exp.TimestampTrunc) -> exp.Expr:
    """DuckDB's ``date_trunc`` to a decade, century, millennium or ISO year.

    Spark's does not take those units (:data:`_TRUNCATIONS`); ``node`` itself for any other.
    """
    unit = node.args.get("unit")
    rewrite = _TRUNCATIONS.get(unit.name.upper()) if isinstance(unit, (exp.Var, exp.Literal)) \
        else None
    return rewrite(node.this) if rewrite is not None else node


#: DuckDB's ``strftime`` specifiers and Spark's (Java's) pattern of the same text, in
#: English as both write names; ``%-x`` is ``%x`` without padding.
_STRFTIME = {
    "Y": "yyyy", "y": "yy", "m": "MM", "-m": "M", "d": "dd", "-d": "d", "H": "HH", "-H": "H",
    "I": "hh", "-I": "h", "M": "mm", "-M": "m", "S": "ss", "-S": "s", "j": "DDD", "-j": "D",
    "p": "a", "b": "MMM", "h": "MMM", "B": "MMMM", "a": "EEE", "A": "EEEE", "f": "SSSSSS",
    "g": "SSS",
}
#: What to write for the specifiers Spark writes otherwise or not at all.
_STRFTIME_INSTEAD = {
    "w": "dayofweek(x)", "u": "isodow(x)", "U": "week(x)", "W": "week(x)", "V": "week(x)",
    "G": "isoyear(x)", "z": "nothing: times are UTC", "Z": "nothing: times are UTC",
    "c": "the specifiers it stands for", "x": "the specifiers it stands for",
    "X": "the specifiers it stands for", "n": "%f and '000'", "-y": "%y",
}
_SPECIFIER = re.compile(r"%(-?.)", re.DOTALL)


def java_format(text: str) -> str:
    """Spark's ``date_format`` pattern of DuckDB's ``strftime`` format ``text``.

    sqlglot's own mapping wrote ``%j`` as ``DD`` (two digits), left ``%%``, ``%g`` and
    ``%x`` as text Java reads as letters, and some as letters Spark refuses.  Text between
    specifiers is quoted, so no letter of it is read as a field.

    Raises:
        CompileError: for a specifier Spark writes otherwise or not at all.
    """
    out, literal, at = [], "", 0
    for m in _SPECIFIER.finditer(text):
        literal += text[at:m.start()]
        spec, at = m.group(1), m.end()
        if spec == "%":
            literal += "%"
        elif spec in _STRFTIME:
            out += [_quoted(literal), _STRFTIME[spec]]
            literal = ""
        else:
            instead = _STRFTIME_INSTEAD.get(spec, "one of %Y %m %d %H %M %S …")
            raise CompileError(f"strftime: %{spec} is not supported (Spark writes it otherwise "
                               f"or not at all); write {instead}")
    if text[at:].endswith("%"):
        raise CompileError("strftime: the format ends with a lone %")
    return "".join([*out, _quoted(literal + text[at:])])


def _quoted(literal: str) -> str:
    """``literal`` as Java's pattern of itself: quoted, a quote doubled."""
    return "'" + literal.replace("'", "''") + "'" if literal else ""


def time_format(node: exp.TimeToStr) -> exp.Expr:
    """DuckDB's ``strftime(x, format)`` as Spark's ``date_format`` (:func:`java_format`)."""
    form = node.args.get("format")
    if not (isinstance(form, exp.Literal) and form.is_string):
        raise CompileError("strftime: write its format out as text (incr translates it to "
                           "Spark's when it compiles the view)")
    return call("date_format", node.this, exp.Literal.string(java_format(form.name)))


def _boundaries(template: str) -> Callable[[exp.Expr, exp.Expr], exp.Expr]:
    """The count of a part's boundaries from ``:a`` to ``:b``, a BIGINT as DuckDB's."""
    return lambda a, b: exp.Paren(this=exp.cast(filled(template, a=a, b=b), "BIGINT"))


def _step(micros: int) -> str:
    """Boundaries of a unit of ``micros`` microseconds between ``:a`` and ``:b``.

    The units the epoch holds by each end, each counted down (``pmod``), so that times
    before 1970 count as DuckDB's.
    """
    a, b = _MICROS.replace(":x", ":a"), _MICROS.replace(":x", ":b")
    return f"(({b} - pmod({b}, {micros})) - ({a} - pmod({a}, {micros}))) DIV {micros}"


def _by_year(template: str) -> str:
    """Boundaries of a unit numbered from the year (``template`` of ``:x``)."""
    return f"({template.replace(':x', ':b')}) - ({template.replace(':x', ':a')})"


_DAYS = "datediff(CAST(:b AS DATE), CAST(:a AS DATE))"
#: DuckDB's ``date_diff(part, a, b)`` by its part's names.
_DIFFS: dict[tuple[str, ...], Callable[[exp.Expr, exp.Expr], exp.Expr]] = {
    ("MILLENNIUM", "MILLENNIA", "MILLENIUM"): _boundaries(_by_year("year(:x) DIV 1000")),
    ("CENTURY", "CENTURIES"): _boundaries(_by_year("year(:x) DIV 100")),
    ("DECADE", "DECADES"): _boundaries(_by_year("year(:x) DIV 10")),
    ("YEAR", "YEARS", "Y", "YR", "YRS"): _boundaries(_by_year("year(:x)")),
    ("ISOYEAR",): _boundaries(_by_year(_ISO_YEAR)),
    ("QUARTER", "QUARTERS"): _boundaries(_by_year("year(:x) * 4 + quarter(:x)")),
    ("MONTH", "MONTHS", "MON", "MONS"): _boundaries(_by_year("year(:x) * 12 + month(:x)")),
    ("WEEK", "WEEKS", "W", "YEARWEEK"): _boundaries(f"{_DAYS} DIV 7"),
    ("DAY", "DAYS", "D", "DAYOFMONTH", "DOW", "DAYOFWEEK", "WEEKDAY", "ISODOW", "DOY",
     "DAYOFYEAR"): _boundaries(_DAYS),
    ("HOUR", "HOURS", "H", "HR", "HRS"): _boundaries(_step(3_600_000_000)),
    ("MINUTE", "MINUTES", "M", "MIN", "MINS"): _boundaries(_step(60_000_000)),
    ("SECOND", "SECONDS", "S", "SEC", "SECS"): _boundaries(_step(1_000_000)),
    ("MILLISECOND", "MILLISECONDS", "MS", "MSEC", "MSECS"): _boundaries(_step(1000)),
    ("MICROSECOND", "MICROSECONDS", "US", "USEC", "USECS"): _boundaries(_step(1)),
}
DIFFS = {name: rewrite for names, rewrite in _DIFFS.items() for name in names}


def check(node: exp.Expr) -> None:
    """Raises the error of a call that has no Spark form here, as its rewrite would.

    The front end calls this on every node of a view, so that the
    :class:`~incr.errors.CompileError` names the call where it is written, before any run.
    """
    if isinstance(node, exp.RegexpReplace):
        regexp_replace(node)
    elif isinstance(node, MATCHES):
        matches(node)
    elif isinstance(node, exp.DateDiff):
        date_diff(node)
    elif isinstance(node, exp.TimeToStr):
        time_format(node)
    elif isinstance(node, exp.SimilarTo):
        raise CompileError("SIMILAR TO is not supported: Spark has none; write LIKE, or "
                           "regexp_full_match")
    elif isinstance(node, exp.Glob):
        raise CompileError("GLOB is not supported: Spark has none (and DuckDB's '?' is one "
                           "byte, not one character); write LIKE ('%' for '*', '_' for "
                           "'?'), or regexp_full_match")
    elif isinstance(node, exp.RegexpILike):
        raise CompileError("~* is not DuckDB's; write regexp_matches(text, pattern, 'i')")


def date_diff(node: exp.DateDiff) -> exp.Expr:
    """DuckDB's ``date_diff(part, a, b)``: the part's boundaries from ``a`` to ``b``."""
    unit = node.args.get("unit")
    name = (unit.name if unit is not None else "DAY").upper()
    rewrite = DIFFS.get(name)
    if rewrite is None:
        raise CompileError(f"date_diff of {name.lower()!r} is not supported: use one of "
                           f"year, quarter, month, week, day, hour, minute, second, "
                           f"millisecond or microsecond")
    return rewrite(node.expression, node.this)


def concat(node: exp.Concat) -> exp.Expr:
    """DuckDB's ``concat(a, b, ...)``: each argument as text, a NULL as nothing.

    sqlglot writes ``COALESCE(a, '')`` for each, which Spark's ANSI mode refuses for a
    number (``''`` is no BIGINT); the argument is cast to text first, as DuckDB's is.
    """
    parts = [exp.Coalesce(this=exp.cast(a.copy(), "VARCHAR"), expressions=[exp.Literal.string("")])
             for a in node.expressions]
    return call("concat", *parts)


def date_add(node: exp.DateAdd) -> exp.Expr:
    """DuckDB's ``date_add(x, INTERVAL …)``: ``x + INTERVAL …`` (:func:`shifted`)."""
    if not isinstance(node.expression, exp.Interval):
        return node
    return shifted(exp.Add(this=node.this.copy(), expression=node.expression.copy()))


def shifted(node: exp.Add | exp.Sub) -> exp.Expr:
    """A DATE plus or minus an INTERVAL as DuckDB computes it: a TIMESTAMP.

    In Spark the sum of a DATE and an INTERVAL of days is a DATE.  A TIMESTAMP is cast to
    itself.
    """
    time, interval = node.this, node.expression
    if isinstance(node, exp.Add) and isinstance(time, exp.Interval):
        time, interval = interval, time
    if (not isinstance(interval, exp.Interval) or isinstance(time, exp.Interval)
            or (isinstance(time, exp.Cast) and time.to.is_type(exp.DataType.Type.TIMESTAMPNTZ))):
        return node
    return type(node)(this=exp.cast(time.copy(), exp.DataType.Type.TIMESTAMPNTZ),
                      expression=interval.copy())


#: The calls whose pattern :func:`matches` translates: DuckDB's name of each, and the
#: argument sqlglot keeps its options in.
_PATTERN_CALLS: dict[type[exp.Expr], tuple[str, str]] = {
    exp.RegexpLike: ("regexp_matches", "flag"),
    exp.RegexpFullMatch: ("regexp_full_match", "options"),
    exp.RegexpExtract: ("regexp_extract", "parameters"),
    exp.RegexpExtractAll: ("regexp_extract_all", "parameters"),
}
MATCHES = tuple(_PATTERN_CALLS)


def _written(name: str, *args: exp.Expr | None) -> None:
    """Raises unless each of ``args`` (absent ones aside) is text written out."""
    if any(x is not None and not (isinstance(x, exp.Literal) and x.is_string) for x in args):
        what = "pattern, replacement" if name == "regexp_replace" else "pattern"
        raise CompileError(f"{name}: write its {what} and options out as text (incr "
                           f"translates DuckDB's regular expressions to Spark's when it "
                           f"compiles the view)")


def matches(node: exp.Expr) -> exp.Expr:
    r"""DuckDB's pattern calls but ``regexp_replace`` in Spark (:data:`MATCHES`).

    ``regexp_matches``, ``regexp_full_match`` (and ``~``), ``regexp_extract`` and
    ``regexp_extract_all``: the pattern is RE2's and the options DuckDB's; Spark's ``rlike`` and
    ``regexp_extract`` take a Java pattern and no options, so both become a Java pattern
    of the same matches (:func:`~incr.compiler.patterns.java_pattern`).  A full match is
    the pattern anchored at both ends of the text (``\A(?:…)\z``).  A group
    ``regexp_extract`` takes must be a number written out, of a group the pattern has.
    """
    name, options_arg = _PATTERN_CALLS[type(node)]
    pattern, options = node.expression, node.args.get(options_arg)
    _written(name, pattern, options)
    java = java_pattern(pattern.name, options.name if options is not None else "", call=name)
    if isinstance(node, exp.RegexpLike):
        return call("rlike", node.this, exp.Literal.string(java.text))
    if isinstance(node, exp.RegexpFullMatch):
        return call("rlike", node.this, exp.Literal.string(f"\\A(?:{java.text})\\z"))
    group = node.args.get("group")
    number = 0 if group is None else integer_literal(group)
    if number is None or not 0 <= number <= java.groups:
        raise CompileError(f"{name}: the group must be a number from 0 to {java.groups} "
                           f"(the pattern's groups), written out")
    return call(name, node.this, exp.Literal.string(java.text), exp.Literal.number(number))


def regexp_replace(node: exp.RegexpReplace) -> exp.Expr:
    r"""DuckDB's ``regexp_replace(s, pattern, replacement[, options])`` in Spark.

    Spark's replaces every match; DuckDB's the first unless its options hold ``g``.  The
    first is replaced in Spark by a pattern anchored at the text's start that takes the
    shortest prefix before it (``^([\s\S]*?)(pattern)``) and gives it back (``$1``),
    the replacement's groups counted two further.  The pattern is written as Java reads
    RE2's under the other options (:func:`~incr.compiler.patterns.java_pattern`), and the
    replacement as Java reads it: DuckDB's ``\1`` is ``$1``, ``\\`` a backslash, and
    ``$`` and digits are themselves.  The pattern, the replacement and the options must be
    written out.
    """
    pattern, replacement = node.expression, node.args.get("replacement")
    options = node.args.get("modifiers")
    _written("regexp_replace", pattern, replacement, options)
    flags = options.name if options is not None else ""
    java = java_pattern(pattern.name, flags, call="regexp_replace", every=True).text
    every, text = "g" in flags, pattern.name
    if every and _matches_nothing(re.escape(text) if "l" in flags else text):
        raise CompileError(f"regexp_replace: the pattern {text!r} matches the empty text, and "
                           f"with 'g' Spark replaces an empty match right after another "
                           f"match where DuckDB does not; make it match one character at "
                           f"least (for example 'x+' for 'x*')")
    if not every:
        java = f"^([\\s\\S]*?)({java})"
    rewrite = _java_replacement(replacement.name if replacement is not None else "", every)
    return call("regexp_replace", node.this, exp.Literal.string(java), exp.Literal.string(rewrite))


def regexp_escape(node: exp.Anonymous) -> exp.Expr:
    r"""DuckDB's ``regexp_escape(s)`` (RE2's QuoteMeta), which Spark does not have.

    Every ASCII character but a letter, a digit and ``_`` takes a backslash before it, and
    NUL is written ``\x00``; characters beyond ASCII are kept.
    """
    (text,) = node.expressions
    marked = call("regexp_replace", text, exp.Literal.string(r"([\x{01}-/:-@\[-^`{-\x{7F}])"),
                  exp.Literal.string(r"\\$1"))
    return call("regexp_replace", marked, exp.Literal.string(r"\x{00}"),
                exp.Literal.string(r"\\x00"))


def _matches_nothing(pattern: str) -> bool:
    """Whether ``pattern`` matches the empty text.

    Read by Python's ``re``, whose syntax is RE2's and Java's for all but a few forms; a
    pattern ``re`` cannot read is let through.
    """
    try:
        return re.search(pattern, "") is not None
    except re.error:
        return False


def _java_replacement(rewrite: str, every: bool) -> str:
    r"""DuckDB's (RE2's) replacement ``rewrite`` as Java's.

    Replacing every match, DuckDB's group ``\k`` is Java's ``$k``.  Replacing the first,
    the pattern is ``^(prefix)(pattern)``: the replacement starts with the prefix (``$1``),
    the whole match (``\0``) is ``$2`` and group ``\k`` is ``$(k + 2)``.
    """
    out, shift = ([], 0) if every else (["$1"], 2)
    chars = iter(rewrite)
    for c in chars:
        if c == "\\":
            nxt = next(chars, None)
            if nxt is not None and nxt.isdigit():
                out.append(f"${int(nxt) + shift}")
            elif nxt == "\\":
                out.append("\\\\")
            else:
                raise CompileError(f"regexp_replace: the replacement {rewrite!r} has a "
                                   f"backslash before {nxt!r}; DuckDB reads a backslash only "
                                   f"before a group's digit or another backslash")
        elif c == "$" or c.isdigit():
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)

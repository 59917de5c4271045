"""DuckDB's calls of texts and numbers as Spark computes them, or refused where written.

A program's SQL means what DuckDB computes.  sqlglot writes some of DuckDB's text and
number calls as a Spark function of the same name that computes something else, and some
as a name Spark does not have, so the first batch of the view failed in Spark.  Found by
running several hundred calls over edge values (empty and non-ASCII texts, NULL, zero,
NaN, numbers beyond Spark's INT) in both engines:

- ``left(s, n)`` and ``right(s, n)`` of a negative ``n`` are all but the last (first)
  ``-n`` characters in DuckDB, nothing in Spark; Spark takes an INT.
- ``split_part(s, d, 0)`` is ``''`` in DuckDB and fails in Spark, which takes an INT.
- ``unicode('')`` and ``ord('')`` are -1 in DuckDB (Spark's ``ascii`` is 0); Spark has
  no ``ord`` or ``strlen`` (the bytes of a text: ``octet_length``).
- ``levenshtein`` counts bytes in DuckDB, characters in Spark: each text is compared as
  its UTF-8 bytes, one character each (read back as ISO-8859-1).
- ``isnan(NULL)`` is NULL in DuckDB, false in Spark; Spark has no ``isinf`` or
  ``isfinite``.
- ``a // b`` of integers is NULL for a zero ``b`` in DuckDB (it fails a batch in Spark);
  of a DOUBLE or DECIMAL it is a division (typed, so in
  :mod:`incr.compiler.frontend.spell_by_type`).
- LIKE and ILIKE without ESCAPE read a backslash as itself in DuckDB, as an escape in
  Spark: the pattern's backslashes are doubled.
- ``a ILIKE b`` is ``lower(a) LIKE lower(b)`` in both, each ``lower`` its own (Java's
  final sigma and dotted ``İ``): it is written with DuckDB's ``lower`` (below).
- ``printf`` of a NULL is NULL in DuckDB, ``null`` written out in Spark; a number written
  by ``%f``, ``%e`` or ``%g`` is rounded by C from its binary value in DuckDB, by Java
  from its decimal one in Spark (``printf('%.2f', 2.675)``: 2.67 against 2.68), so those
  are refused.
- ``epoch_us`` is Spark's ``unix_micros`` (of a TIMESTAMP: a DATE or a TIMESTAMP_NTZ is
  cast to one, in UTC); ``nanosecond``, ``century``, ``decade`` and ``millennium`` are
  computed as their parts are (:data:`incr.compiler.duckdb_calls.PARTS`).

Refused, with what to write instead (:func:`refusal`): the calls Spark has no function for
(``gcd``, ``fmod``, the string similarities, ``hash``, ...), ``format`` (DuckDB's ``{}``
placeholders, which sqlglot writes as Java's ``%`` ones), ``time_bucket``, ``age``,
``date_sub`` of three arguments (Spark has the form of two), and
``split_part`` of an empty delimiter written out (DuckDB splits into characters).
"""

from __future__ import annotations

import re

from sqlglot import exp

from incr.compiler.duckdb_calls import call, filled, integer_literal, known

#: DuckDB's functions Spark has no form of here, by the name sqlglot keeps (a call it does
#: not know): why, and what to write instead.
_NONE = "Spark has none"
_NAMED = {
    "gcd": f"{_NONE}; compute it in the source",
    "lcm": f"{_NONE}; compute it in the source",
    "fmod": f"{_NONE}; write a % b, which keeps the dividend's sign as fmod does",
    "even": f"{_NONE}; write CAST(ceil(abs(x) / 2) * 2 * sign(x) AS DOUBLE)",
    "jaro_similarity": f"{_NONE}; compare with levenshtein",
    "damerau_levenshtein": f"{_NONE}; compare with levenshtein",
    "hamming": f"{_NONE}; compare with levenshtein",
    "jaccard": f"{_NONE}; compare with levenshtein",
    "mismatches": f"{_NONE}; compare with levenshtein",
    "era": f"{_NONE}; write CASE WHEN year(x) > 0 THEN 1 ELSE 0 END",
    "julian": f"{_NONE}; write date_diff('day', DATE '2000-01-01', x) + 2451545",
    "hash": "Spark hashes otherwise; group by the values, or by md5() of them",
    "try_strptime": f"{_NONE}; write TRY_CAST(x AS DATE) or TRY_CAST(x AS TIMESTAMP) of ISO text",
    "regexp_split_to_array": f"{_NONE}; write split_part, or regexp_extract_all",
    "list_element": f"{_NONE}; write split_part, or regexp_extract",
    "epoch_ns": f"{_NONE}; write epoch_us(x) * 1000",
    "array_extract": f"{_NONE} of a text; write substr(text, n, 1)",
    "date_sub": ("Spark counts whole parts otherwise; write date_diff(part, start, end), "
                 "which counts the part's boundaries"),
    "age": ("Spark has no interval of years, months and days between two times; write "
            "date_diff of the part you need"),
}
#: The calls of :data:`_NAMED` refused only at some numbers of arguments (Spark has the
#: others: ``date_sub(date, interval)``).
_ARGUMENTS = {"date_sub": (3,), "age": (1, 2)}
#: sqlglot's nodes of DuckDB calls Spark has no form of here: DuckDB's name, why and what
#: to write instead.
_TYPED: dict[type[exp.Expr], tuple[str, str]] = {
    exp.JarowinklerSimilarity: ("jaro_winkler_similarity", f"{_NONE}; compare with levenshtein"),
    exp.Format: ("format", "its {} placeholders are not Spark's format_string's; write concat"),
    exp.DateBin: ("time_bucket", f"{_NONE}; write date_trunc of the part"),
    exp.TimeFromParts: ("make_time", "Spark has no TIME; write make_timestamp"),
}
#: printf's conversions of a number that C and Java round otherwise.
_FLOATING = re.compile(r"%[-+ #0]*\d*(?:\.\d*)?[fFeEgGaA]")
#: Spark's INT, which ``left`` and ``right`` take.
_INT_MAX = 2**31 - 1
#: The characters of a text that ``left`` or ``right`` takes, as DuckDB does, for Spark.
_TAKEN = (f"CAST(CASE WHEN :n >= 0 THEN LEAST(:n, {_INT_MAX}) "
          f"ELSE GREATEST(LENGTH(:s) + :n, 0) END AS INT)")
#: DuckDB's ``split_part`` of a part computed: ``''`` for 0, and for any part past either end.
_PART = (f"CASE WHEN :s IS NULL OR :d IS NULL OR :n IS NULL THEN NULL WHEN :n = 0 THEN '' "
         f"ELSE split_part(:s, :d, CAST(LEAST(GREATEST(:n, {-_INT_MAX}), {_INT_MAX}) AS INT)) END")
#: A text as its UTF-8 bytes, one character each: what DuckDB's ``levenshtein`` compares.
_BYTES = "decode(encode(:s, 'UTF-8'), 'ISO-8859-1')"
_INFINITY = "CAST('Infinity' AS DOUBLE)"
#: For ``upper`` and ``lower``: the characters Java's full case mapping (Spark's) takes
#: otherwise than DuckDB's, and the character of each both engines case alike.  ``ß`` is
#: ``SS`` in Java's upper case, ``ẞ`` in DuckDB's (which Java leaves as it is); ``İ`` is
#: ``i̇`` (two characters) in Java's lower case, ``i`` in DuckDB's; a capital sigma ending a
#: word is the final sigma (U+03C2) in Java's, the small sigma (U+03C3) in DuckDB's everywhere.
_CASED_FIRST: dict[type[exp.Expr], tuple[str, str]] = {
    exp.Upper: ("\u00df", "\u1e9e"),
    exp.Lower: ("\u0130\u03a3", "i\u03c3"),
}


def refusal(node: exp.Expr) -> str | None:
    """Why ``node``, a call of DuckDB's, has no Spark form here, or None when it has one."""
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
        count = len(node.expressions)
        if name in _ARGUMENTS and count in _ARGUMENTS[name]:
            plural = "" if count == 1 else "s"
            return f"{name}() of {count} argument{plural} is not supported: {_NAMED[name]}"
        if name in _NAMED and name not in _ARGUMENTS:
            return f"{name}() is not supported: {_NAMED[name]}"
        if name == "printf":
            return _printf_refusal(node)
        return None
    for kind, (name, instead) in _TYPED.items():
        if isinstance(node, kind):
            return f"{name}() is not supported: {instead}"
    if isinstance(node, exp.SplitPart):
        delimiter = node.args.get("delimiter")
        if isinstance(delimiter, exp.Literal) and delimiter.is_string and delimiter.name == "":
            return ("split_part of an empty delimiter is not supported: DuckDB splits the "
                    "text into characters; write substr(text, n, 1)")
    return None


def _printf_refusal(node: exp.Anonymous) -> str | None:
    """Why a ``printf`` call is refused, or None.

    Refused: a format not written out, or one of a number the engines round otherwise.
    """
    form = node.expressions[0] if node.expressions else None
    if not (isinstance(form, exp.Literal) and form.is_string):
        return "printf: write its format out as text (incr checks its conversions)"
    if _FLOATING.search(form.name):
        return ("printf of %f, %e or %g is not supported: DuckDB rounds the number's binary "
                "value, Spark its decimal one (2.675 is 2.67 against 2.68); write "
                "CAST(CAST(x AS DECIMAL(18, 2)) AS VARCHAR)")
    return None


def as_spark(node: exp.Expr) -> exp.Expr:
    """``node`` as Spark computes DuckDB's value of it, or ``node`` itself (module doc)."""
    if isinstance(node, exp.Anonymous):
        return _named(node)
    if isinstance(node, (exp.Left, exp.Right)):
        return _ends(node)
    if isinstance(node, exp.SplitPart):
        return _split_part(node)
    if isinstance(node, exp.Unicode):
        return _code_point(node.this)
    if isinstance(node, exp.Levenshtein) and set(node.args) <= {"this", "expression"}:
        return call("levenshtein", filled(_BYTES, s=node.this), filled(_BYTES, s=node.expression))
    if isinstance(node, exp.IsNan):
        return known(call("isnan", node.this), node.this)
    if isinstance(node, exp.IsInf):
        return exp.Paren(this=filled(f"abs(:x) = {_INFINITY}", x=node.this))
    if isinstance(node, exp.IntDiv):
        return _integer_division(node)
    if isinstance(node, exp.ILike):
        return _case_blind(node)
    if isinstance(node, exp.Like) and not isinstance(node.parent, exp.Escape):
        return _no_escape(node)
    if isinstance(node, (exp.Upper, exp.Lower)):
        return _cased(node)
    return node


def _cased(node: exp.Upper | exp.Lower) -> exp.Expr:
    """DuckDB's ``upper`` or ``lower`` in Spark (:data:`_CASED_FIRST`).

    The characters Java cases otherwise are written first as the character both engines
    case alike.  ``node`` itself when its text is so written already, so no rewrite visits it again.
    """
    source, target = _CASED_FIRST[type(node)]
    text = node.this
    if isinstance(text, exp.Translate) and text.args.get("from_") == exp.Literal.string(source):
        return node
    translated = exp.Translate(this=text.copy(), from_=exp.Literal.string(source),
                               to=exp.Literal.string(target))
    return type(node)(this=translated)


def _named(node: exp.Anonymous) -> exp.Expr:
    """The calls sqlglot does not know, that Spark has no function of the name of."""
    name, args = node.name.lower(), node.expressions
    if len(args) != 1:
        return _null_printf(node) if name == "printf" else node
    x = args[0]
    if name == "strlen":
        return call("octet_length", x)
    if name == "ord":
        return _code_point(x)
    if name == "isfinite":
        return exp.Paren(this=filled(f"NOT isnan(:x) AND abs(:x) <> {_INFINITY}", x=x))
    if name == "epoch_us":
        return call("unix_micros", exp.cast(x.copy(), "TIMESTAMP"))
    return node


def _code_point(x: exp.Expr) -> exp.Expr:
    """DuckDB's ``unicode(x)``: the first character's code point, -1 for ``''``."""
    return exp.Paren(this=filled("CASE WHEN :x = '' THEN -1 ELSE ascii(:x) END", x=x))


def _null_printf(node: exp.Anonymous) -> exp.Expr:
    """``printf`` NULL when an argument is, as DuckDB's (Spark writes ``null``).

    ``node`` itself when every argument is written out, so no rewrite visits it again.
    """
    spelled = known(call("printf", *node.expressions), *node.expressions)
    return node if isinstance(spelled, exp.Anonymous) else spelled


def _ends(node: exp.Left | exp.Right) -> exp.Expr:
    """DuckDB's ``left`` and ``right``: a negative count takes all but that many."""
    n = node.expression
    count = integer_literal(n)
    if count is not None and 0 <= count <= _INT_MAX:
        return node
    wide = exp.cast(n.copy(), "BIGINT")
    taken = call("left" if isinstance(node, exp.Left) else "right", node.this,
                 filled(_TAKEN, s=node.this, n=wide))
    return known(taken, n)


def _split_part(node: exp.SplitPart) -> exp.Expr:
    """DuckDB's ``split_part``: ``''`` for the part 0, where Spark's fails a batch.

    A part beyond Spark's INT (which Spark's takes) is ``''`` too, as any part past the
    last is.
    """
    part = node.args.get("part_index")
    written = integer_literal(part)
    if part is None or (written not in (None, 0) and abs(written) <= _INT_MAX):
        return node
    parts = {"s": node.this, "d": node.args["delimiter"], "n": exp.cast(part.copy(), "BIGINT")}
    if written is not None:
        return exp.Paren(this=known(exp.Literal.string(""), node.this, node.args["delimiter"]))
    return exp.Paren(this=filled(_PART, **parts))


def _case_blind(node: exp.ILike) -> exp.Expr:
    """DuckDB's ``a ILIKE b``: ``lower(a) LIKE lower(b)``, each ``lower`` DuckDB's (:func:`_cased`).

    Spark's ILIKE lowers both sides too, by Java's mapping: a capital sigma ending a word
    became the final sigma and ``İ`` an ``i`` with a combining dot, so ``'ΟΔΟΣ' ILIKE
    'οδοσ'`` was false.  Under an ESCAPE the LIKE stays bare, its escape applying as before.
    """
    like = exp.Like(**{**node.args, "this": _lowered(node.this),
                       "expression": _lowered(node.expression)})
    if isinstance(node.parent, exp.Escape):
        return like
    spelled = _no_escape(like)
    return spelled if isinstance(spelled, exp.Paren) else exp.Paren(this=spelled)


def _lowered(text: exp.Expr) -> exp.Expr:
    """DuckDB's ``lower(text)`` in Spark; of ASCII text written out, that text lowered here."""
    if isinstance(text, exp.Literal) and text.is_string and text.name.isascii():
        return exp.Literal.string(text.name.lower())
    return _cased(exp.Lower(this=text.copy()))


def _no_escape(node: exp.Like) -> exp.Expr:
    """DuckDB's LIKE (and so ILIKE) without ESCAPE: a backslash is itself.

    Spark's escapes the character after it by default.  Each backslash of the pattern is
    doubled (Spark's escape of itself).  The result is in parentheses, so no rewrite
    doubles it again.
    """
    pattern = node.expression
    if isinstance(pattern, exp.Literal) and pattern.is_string:
        if "\\" not in pattern.name:
            return node
        doubled: exp.Expr = exp.Literal.string(pattern.name.replace("\\", "\\\\"))
    else:
        doubled = filled("replace(:p, '\\\\', '\\\\\\\\')", p=pattern)
    return exp.Paren(this=node.__class__(**{**node.args, "this": node.this.copy(),
                                             "expression": doubled}))


def _integer_division(node: exp.IntDiv) -> exp.Expr:
    """DuckDB's ``a // b`` of integers: NULL for a zero ``b``, where Spark's DIV fails."""
    divisor = node.expression
    if integer_literal(divisor) not in (None, 0):
        return node
    spark = exp.Paren(this=exp.IntDiv(this=node.this.copy(), expression=divisor.copy()))
    zero = exp.EQ(this=divisor.copy(), expression=exp.Literal.number(0))
    return exp.Case(ifs=[exp.If(this=exp.Not(this=zero), true=spark)])

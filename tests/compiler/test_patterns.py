r"""DuckDB's (RE2's) patterns written as Java's (incr.compiler.patterns).

What the Java text matches is held against both engines in
tests/runtime/test_spark_dialect.py; these cases pin the translation itself, and what is
refused, without Spark.
"""

from __future__ import annotations

import pytest
import sqlglot

from incr.compiler.duckdb_calls import regexp_replace
from incr.compiler.patterns import java_pattern, re2_form
from incr.errors import CompileError


@pytest.mark.parametrize(("pattern", "options", "java", "groups"), [
    ("abc", "", "abc", 0),
    # '.' stops at \n alone, '^' and '$' are the text's ends, or \n's under (?m)
    ("a.b", "", r"a[^\n]b", 0),
    ("a.b", "s", r"a[\s\S]b", 0),
    ("a.b", "sn", r"a[^\n]b", 0),  # the last of s and n/m/p wins
    ("^a$", "", r"\Aa\z", 0),
    ("(?m)^a$", "", r"(?:\A|(?<=\n))a(?=\n|\z)", 0),
    ("(?s:.).", "", r"(?:[\s\S])[^\n]", 0),
    # ASCII classes whatever Java's flags, \s without the vertical tab, \v the tab alone
    (r"\s\S\v", "", r"[\t\n\f\r ][^\t\n\f\r ]\x0B", 0),
    (r"\bx", "", r"(?-i:(?<=[0-9A-Za-z_])(?![0-9A-Za-z_])|(?<![0-9A-Za-z_])(?=[0-9A-Za-z_]))x", 0),
    (r"\w", "i", r"(?iu)[0-9A-Za-z_\x{212A}\x{17F}]", 0),
    # POSIX classes; '[', '&&', a first ']' and a brace that repeats nothing as themselves
    ("[[:alpha:][:^digit:]]", "", r"[\p{Alpha}\P{Digit}]", 0),
    ("[[:upper:]]", "i", r"(?iu)[\p{Alpha}\x{212A}\x{17F}]", 0),
    ("[[:^alpha:]]", "i", r"(?iu)[[\P{Alpha}&&[^\x{212A}\x{17F}]]]", 0),
    ("[]a[&&b]", "", r"[\]a\[\&\&b]", 0),
    ("a{,3}b{2,}", "", r"a\{,3\}b{2,}", 0),
    # groups: named ones numbered as RE2 numbers them; flags; RE2's U as lazy quantifiers
    ("(?P<first_one>a)(b)(?:c)", "", "(a)(b)(?:c)", 2),
    ("(?i)a(?-i:b)", "", "(?iu)a(?-i:b)", 0),
    ("(?U)a+b*?c{2}", "", "a+?b*c{2}?", 0),
    # DuckDB's options: case folded beyond ASCII (the last of i and c wins), literal text
    ("é", "i", "(?iu)é", 0),
    ("é", "ic", "é", 0),
    ("a.b*(", "l", r"a\.b\*\(", 0),
    (r"\Qa.b\E+", "", r"a\.b+", 0),
    (r"\p{Greek}\pL\P{Lu}\x{263A}\x41", "", r"\p{IsGreek}\p{L}\P{Lu}\x{263A}\x41", 0),
])
def test_a_pattern_is_written_as_java_reads_re2_s(pattern, options, java, groups):
    got = java_pattern(pattern, options, call="regexp_matches")
    assert (got.text, got.groups) == (java, groups)


@pytest.mark.parametrize(("pattern", "options", "message"), [
    ("a(?=b)", "", "has a group RE2 does not read"),
    ("(?<n>a)", "", "has a group RE2 does not read"),
    (r"(a)\1", "", r"has \1; RE2 has no back-references"),
    ("a*+", "", "repeats a repetition"),
    ("a{2}{3}", "", "repeats a repetition"),
    ("*a", "", "with nothing before it to repeat"),
    ("a{1001}", "", "repeats more than 1000 times"),
    ("a{3,2}", "", "bounds are reversed"),
    (r"\Z", "", r"has \Z, which RE2 does not read"),
    (r"\C", "", "one byte"),
    (r"\pL", "i", "folds case over the class"),
    ("(?x)a", "", "sets the flag 'x'"),
    ("[a", "", "missing ']'"),
    ("(a", "", "missing ')'"),
    ("a)", "", "closes a group it did not open"),
    ("[[:letter:]]", "", "the class [:letter:]"),
    ("a", "g", "regexp_matches takes no option 'g'"),
])
def test_what_re2_refuses_or_java_cannot_read_alike_is_refused(pattern, options, message):
    with pytest.raises(CompileError, match="regexp_matches") as e:
        java_pattern(pattern, options, call="regexp_matches")
    assert message in str(e.value)


def test_regexp_replace_names_its_own_options() -> None:
    node = sqlglot.parse_one("regexp_replace(s, 'a', 'b', 'gx')", read="duckdb")
    with pytest.raises(CompileError, match="regexp_replace takes no option 'x'; its options "
                                           "are 'g' \\(every match\\)"):
        regexp_replace(node)


@pytest.mark.parametrize(("pattern", "options", "re2"), [
    ("^/checkout", "", r"\A/checkout"),
    ("a.b$", "i", r"(?i)a[^\n]b\z"),
    ("a.b", "s", r"a[\s\S]b"),
    (r"[a-c\]]+\d{2,}?|\s", "", r"[a-c\]]+\d{2,}?|[\t\n\f\r ]"),
    ("(?P<n>a)(?i:b)", "", "(a)(?i:b)"),
    ("a.b*(", "l", r"a\.b\*\("),
    # what the compiler writes only for Java: look-around, \p{…}, nested classes
    (r"\bfoo", "", None),
    ("(?m)^x$", "", None),
    ("[[:alpha:]]", "", None),
    (r"[^\S]", "", None),
    (r"\pL", "", None),
])
def test_the_text_re2_reads_alike_is_found_and_the_rest_is_not(pattern, options, re2):
    assert re2_form(java_pattern(pattern, options, call="regexp_matches").text) == re2


@pytest.mark.parametrize("java", [r"(?i)a", "a.b", "^a", "a$", r"\ba", r"[a[b]]", r"[a&&b]",
                                  r"(?<=a)b", r"\p{L}", r"\Qa\E", "[]"])
def test_java_text_the_compiler_does_not_write_is_left_to_spark(java):
    assert re2_form(java) is None
